//! `shardrun logs <run> [-f] [--rank N]`: print a run's merged train.log (or one rank's log),
//! optionally following it as it grows, like `tail -f`.

use anyhow::{bail, Context};
use std::io::{Read, Seek, SeekFrom};
use std::path::PathBuf;
use std::time::{Duration, Instant};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Run directory.
    pub run: PathBuf,
    /// Keep printing new lines as they are written (Ctrl-C to stop); a log not written yet
    /// is waited for.
    #[arg(long, short)]
    pub follow: bool,
    /// Only this rank's log (`logs/rank-N.log`).
    #[arg(long)]
    pub rank: Option<u64>,
    /// With -f (required): stop following once the run has ended, as `shardrun status`
    /// tells it (not queued, running, or requeued after a preemption), after its last lines.
    #[arg(long, requires = "follow")]
    pub until_done: bool,
}

pub fn execute(args: Args) -> anyhow::Result<()> {
    if !args.run.is_dir() {
        bail!(
            "no run directory at {}; list runs with `shardrun status`",
            args.run.display()
        );
    }
    if crate::rundir::RunDir::open(&args.run).is_err() {
        refuse_a_folder_of_runs(&args)?;
    }
    if let Some(rank) = args.rank {
        let ranks = crate::rundir::RunDir::open(&args.run)
            .and_then(|run| run.read_train_config())
            .map(|config| config.batch.world_size)
            .ok();
        if let Some(ranks) = ranks.filter(|&n| rank >= n) {
            bail!(
                "{} has {ranks} rank(s), 0 to {}: there is no rank {rank}",
                args.run.display(),
                ranks.saturating_sub(1)
            );
        }
    }
    let path = match args.rank {
        Some(rank) => args.run.join("logs").join(format!("rank-{rank}.log")),
        None => args.run.join("train.log"),
    };
    let mut offset = 0u64;
    let mut ended: Option<crate::slurm::RunStatus> = None;
    let mut next_look = Instant::now();
    loop {
        match std::fs::File::open(&path) {
            Ok(mut file) => {
                file.seek(SeekFrom::Start(offset))
                    .with_context(|| format!("cannot read {}", path.display()))?;
                let mut buf = Vec::new();
                file.read_to_end(&mut buf)
                    .with_context(|| format!("cannot read {}", path.display()))?;
                // Print whole lines only; a partial last line waits for its end.
                let upto = if args.follow {
                    buf.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1)
                } else {
                    buf.len()
                };
                crate::output::write_stdout_bytes(&buf[..upto]);
                offset += upto as u64;
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && args.follow => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if let Some(why) = ended_before_its_log(&args) {
                    bail!("{why}");
                }
                return Err(e).with_context(|| {
                    format!(
                        "cannot read {} (has the job started yet? see `shardrun status {}`)",
                        path.display(),
                        args.run.display()
                    )
                });
            }
            Err(e) => {
                return Err(e).with_context(|| {
                    format!(
                        "cannot read {} (has the job started yet? see `shardrun status {}`)",
                        path.display(),
                        args.run.display()
                    )
                })
            }
        }
        // Nobody reads any more (`shardrun logs -f run | head`): following is over.
        if !args.follow || crate::output::stdout_closed() {
            return Ok(());
        }
        if let Some(status) = &ended {
            // The pass after the end caught the last lines.
            if offset == 0 {
                let detail = match status.detail.as_str() {
                    "" => String::new(),
                    detail => format!(": {detail}"),
                };
                outln!(
                    "{} ended ({}) before anything was logged{detail}",
                    args.run.display(),
                    status.state,
                );
            }
            return Ok(());
        }
        if args.until_done && Instant::now() >= next_look {
            next_look = Instant::now() + LOOK_EVERY;
            ended = ended_status(&args.run);
            if ended.is_some() {
                continue;
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// How often `--until-done` asks whether the run has ended (for a Slurm job, one query of
/// Slurm, as `shardrun status` makes).
const LOOK_EVERY: Duration = Duration::from_secs(2);

/// The run's status once it has ended as `shardrun status` tells it: a job that failed before
/// its controller wrote anything, or that was cancelled while it waited, has ended too, and
/// a preempted run whose requeued job waits to run again has not.
fn ended_status(run: &std::path::Path) -> Option<crate::slurm::RunStatus> {
    let run = crate::rundir::RunDir::open(run).ok()?;
    let (statuses, _) = crate::slurm::refresh(std::slice::from_ref(&run)).ok()?;
    statuses
        .into_iter()
        .next()
        .filter(|s| s.state.is_terminal())
}

/// A run that ended before its controller wrote any log (its data failed to prepare, its
/// spec or model folder was refused): what its manifest says of its end, in place of a
/// missing file.
fn ended_before_its_log(args: &Args) -> Option<String> {
    let manifest = crate::rundir::RunDir::open(&args.run)
        .ok()?
        .read_manifest()
        .ok()?;
    let error = manifest.error.filter(|_| manifest.state.is_terminal())?;
    let state = manifest.state;
    Some(format!(
        "{run} has no log: the run ended ({state}) before any rank started, so nothing was \
         logged; it ended with: {error}\n  see also: `shardrun status {run}`",
        run = args.run.display()
    ))
}

/// A sweep's folder (or a run root) holds runs but is not one: name them, so the user can
/// pick one, instead of looking for a train.log that is not there.
fn refuse_a_folder_of_runs(args: &Args) -> anyhow::Result<()> {
    const SHOWN: usize = 10;
    let runs = crate::slurm::find_runs(&args.run);
    let Some(first) = runs.first() else {
        return Ok(());
    };
    let mut list: Vec<String> = runs
        .iter()
        .take(SHOWN)
        .map(|run| format!("  {}", run.path().display()))
        .collect();
    if runs.len() > SHOWN {
        list.push(format!(
            "  ... and {} more (`shardrun status {}` lists them all)",
            runs.len() - SHOWN,
            args.run.display()
        ));
    }
    // The same command, for one of them.
    let mut flags = String::new();
    if args.follow {
        flags.push_str(" -f");
    }
    if let Some(rank) = args.rank {
        flags.push_str(&format!(" --rank {rank}"));
    }
    if args.until_done {
        flags.push_str(" --until-done");
    }
    bail!(
        "{} holds {} run(s) (a sweep's points, or a folder of runs), not one run:\n{}\n  fix: name \
         one of them: `shardrun logs{flags} {}`",
        args.run.display(),
        runs.len(),
        list.join("\n"),
        first.path().display()
    )
}
