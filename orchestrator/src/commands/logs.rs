//! `shardrun logs <run> [-f] [--rank N]`: print a run's merged train.log (or one rank's log),
//! optionally following it as it grows, like `tail -f`.

use anyhow::{bail, Context};
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Run directory.
    pub run: PathBuf,
    /// Keep printing new lines as they are written (Ctrl-C to stop); a log or run directory
    /// not written yet is waited for, and a log started anew is printed from its beginning.
    #[arg(long, short)]
    pub follow: bool,
    /// Only this rank's log (`logs/rank-N.log`).
    #[arg(long)]
    pub rank: Option<u64>,
    /// Start with only the last N lines of the log as it is (as `tail -n`); default: all of
    /// it. A log started anew while followed is printed whole.
    #[arg(long, short = 'n', value_name = "N")]
    pub lines: Option<usize>,
    /// With -f (required): stop following once the run has ended, as `shardrun status`
    /// tells it (not queued, running, or requeued after a preemption), after its last lines;
    /// exit 0 if it completed, 1 if it ended otherwise.
    #[arg(long, requires = "follow")]
    pub until_done: bool,
}

pub fn execute(args: Args) -> anyhow::Result<()> {
    if args.follow && !args.run.is_dir() {
        // Started with the run (`shardrun run job.yaml & shardrun logs -f runs/job`).
        errln!(
            "waiting for {} to appear (no run directory there yet; Ctrl-C to stop)",
            args.run.display()
        );
        while !args.run.is_dir() {
            if crate::output::stdout_closed() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
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
    // A run directory appears whole (its manifest first): a folder without one is not a run
    // to wait for, unless it holds the log itself (a copy of one).
    if crate::rundir::RunDir::open(&args.run).is_err() && !path.exists() {
        bail!(
            "{} is not a run directory (no manifest.json), and holds no {}\n  fix: give a run \
             directory, as `shardrun submit` and `shardrun run` print it; `shardrun status` \
             lists those under runs/ (`shardrun status <folder>` under another)",
            args.run.display(),
            path.strip_prefix(&args.run).unwrap_or(&path).display()
        );
    }
    let mut log = FollowedFile::new(path.clone());
    let mut ended: Option<crate::slurm::RunStatus> = None;
    let mut next_look = Instant::now();
    let mut first_read = true;
    let mut said_waiting = false;
    loop {
        // Whether the log is not there (yet): a run may end without ever writing it.
        let mut missing = false;
        match log.read_new(args.follow) {
            Ok(new) => {
                if new.started_anew {
                    errln!(
                        "--- {} was started anew (the run started over); from its beginning:",
                        path.display()
                    );
                }
                let bytes = match args.lines {
                    Some(n) if first_read => last_lines(&new.bytes, n),
                    _ => &new.bytes[..],
                };
                first_read = false;
                crate::output::write_stdout_bytes(bytes);
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && args.follow => {
                // A run that ended without it never writes it: following it would show
                // nothing for ever. Its manifest may say so; else Slurm is asked below.
                missing = true;
                if let Some(why) = ended_before_its_log(&args) {
                    bail!("{why}");
                }
                if !said_waiting {
                    said_waiting = true;
                    errln!(
                        "waiting for {} to appear: nothing is logged before the job starts \
                         (`shardrun status {}` says where it is; Ctrl-C to stop)",
                        path.display(),
                        crate::output::pasteable(&args.run)
                    );
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if let Some(why) = ended_before_its_log(&args) {
                    bail!("{why}");
                }
                return Err(e).with_context(|| {
                    format!(
                        "cannot read {} (has the job started yet? see `shardrun status {}`)",
                        path.display(),
                        crate::output::pasteable(&args.run)
                    )
                });
            }
            Err(e) => {
                return Err(e).with_context(|| {
                    format!(
                        "cannot read {} (has the job started yet? see `shardrun status {}`)",
                        path.display(),
                        crate::output::pasteable(&args.run)
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
            let detail = match status.detail.as_str() {
                "" => String::new(),
                detail => format!(": {detail}"),
            };
            if log.offset == 0 {
                outln!(
                    "{} ended ({}) before anything was logged{detail}",
                    args.run.display(),
                    status.state,
                );
            } else if status.state != crate::rundir::RunState::Completed {
                errln!("{} ended ({}){detail}", args.run.display(), status.state);
            }
            // `shardrun logs -f --until-done run && next-step` goes on after a run that
            // completed only.
            return match status.state {
                crate::rundir::RunState::Completed => Ok(()),
                _ => Err(crate::exit::AlreadySaid(crate::exit::EXIT_FAILURE).into()),
            };
        }
        if (args.until_done || missing) && Instant::now() >= next_look {
            next_look = Instant::now() + LOOK_EVERY;
            ended = ended_status(&args.run);
            if ended.is_some() {
                continue;
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The last `n` lines of `text` (all of it when it has fewer); a last line without its
/// newline counts as one.
fn last_lines(text: &[u8], n: usize) -> &[u8] {
    let body = text.strip_suffix(b"\n").unwrap_or(text);
    let start = body
        .iter()
        .enumerate()
        .rev()
        .filter(|(_, &b)| b == b'\n')
        .nth(n.saturating_sub(1))
        .map_or(0, |(i, _)| i + 1);
    if n == 0 {
        &text[text.len()..]
    } else {
        &text[start..]
    }
}

/// A log read as it grows; a new file in its place (a run started over) or a shorter one is
/// read again from its beginning, as `tail -F` does.
struct FollowedFile {
    path: PathBuf,
    /// How far it has been read.
    offset: u64,
    /// The file read so far (device, inode).
    reading: Option<(u64, u64)>,
}

/// What [`FollowedFile::read_new`] found.
struct NewBytes {
    bytes: Vec<u8>,
    /// The file was replaced or cut since the last read: `bytes` are from its beginning.
    started_anew: bool,
}

impl FollowedFile {
    fn new(path: PathBuf) -> FollowedFile {
        FollowedFile {
            path,
            offset: 0,
            reading: None,
        }
    }

    /// What was written since the last read; `whole_lines`: up to the last line's end only
    /// (a partial last line waits for its end).
    fn read_new(&mut self, whole_lines: bool) -> std::io::Result<NewBytes> {
        let mut file = std::fs::File::open(&self.path)?;
        let meta = file.metadata()?;
        let identity = (meta.dev(), meta.ino());
        let started_anew =
            self.reading.is_some_and(|was| was != identity) || meta.len() < self.offset;
        if started_anew {
            self.offset = 0;
        }
        self.reading = Some(identity);
        file.seek(SeekFrom::Start(self.offset))?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        if whole_lines {
            bytes.truncate(bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1));
        }
        self.offset += bytes.len() as u64;
        Ok(NewBytes {
            bytes,
            started_anew,
        })
    }
}

/// How often `--until-done`, or a follow of a log not written yet, asks whether the run has
/// ended (for a Slurm job, one query of Slurm, as `shardrun status` makes).
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
    let state = manifest.state;
    if !state.is_terminal() {
        return None;
    }
    let with = manifest
        .error
        .map(|error| format!("; it ended with: {error}"))
        .unwrap_or_default();
    let run = args.run.display();
    let word = crate::output::pasteable(&args.run);
    // The run logged, but not this rank.
    let said = match args.rank {
        Some(rank) if args.run.join("train.log").exists() => format!(
            "{run} has no log of rank {rank}: the run ended ({state}) before rank {rank} \
             logged anything{with}"
        ),
        _ => format!(
            "{run} has no log: the run ended ({state}) before any rank started, so nothing \
             was logged{with}"
        ),
    };
    Some(format!("{said}\n  see also: `shardrun status {word}`"))
}

/// A sweep's folder (or a run root) holds runs but is not one: name them, so the user can
/// pick one, instead of looking for a train.log that is not there.
fn refuse_a_folder_of_runs(args: &Args) -> anyhow::Result<()> {
    const SHOWN: usize = 10;
    let runs = crate::slurm::find_runs(&args.run);
    if runs.is_empty() {
        return Ok(());
    }
    // A sweep's points by the values they were given, in the order of its status and
    // metrics tables.
    let mut points: Vec<_> = runs
        .iter()
        .map(|run| {
            let params = run
                .read_manifest()
                .map(|m| m.sweep_params)
                .unwrap_or_default();
            (run, params)
        })
        .collect();
    let columns = crate::sweeps::labels::ParamColumns::given(points.iter().map(|(_, p)| p));
    columns.sort(&mut points, |(run, _)| run.path(), |(_, params)| params);
    let mut list: Vec<String> = points
        .iter()
        .take(SHOWN)
        .map(|(run, params)| match params.is_empty() {
            true => format!("  {}", run.path().display()),
            false => format!("  {}  ({})", run.path().display(), columns.label(params)),
        })
        .collect();
    if runs.len() > SHOWN {
        list.push(format!(
            "  ... and {} more (`shardrun status {}` lists them all)",
            runs.len() - SHOWN,
            crate::output::pasteable(&args.run)
        ));
    }
    // The same command, for one of them: a point of the spec last swept there, not one left
    // from an earlier version of it.
    let mut current = crate::sweeps::journal::CurrentPoints::default();
    let example = points
        .iter()
        .find(|(run, _)| !current.superseded(run.path()))
        .unwrap_or(&points[0])
        .0;
    let mut flags = String::new();
    if args.follow {
        flags.push_str(" -f");
    }
    if let Some(rank) = args.rank {
        flags.push_str(&format!(" --rank {rank}"));
    }
    if let Some(n) = args.lines {
        flags.push_str(&format!(" -n {n}"));
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
        example.path().display()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sweeps_folder_is_refused_naming_its_points_by_value() {
        let dir = tempfile::tempdir().unwrap();
        crate::sweeps::point_dirs::written_points(
            dir.path(),
            include_str!("../../../examples/sweep.yaml"),
        );
        let args = Args {
            run: dir.path().to_path_buf(),
            follow: true,
            rank: None,
            lines: None,
            until_done: false,
        };
        let text = refuse_a_folder_of_runs(&args).unwrap_err().to_string();
        // Their values, in order as the status and metrics tables list them.
        let labels: Vec<&str> = text
            .lines()
            .filter_map(|l| {
                l.strip_suffix(')')?
                    .rsplit_once("  (")
                    .map(|(_, label)| label)
            })
            .collect();
        assert_eq!(labels.len(), 10, "{text}");
        let mut sorted = labels.clone();
        sorted.sort_by_key(|label| {
            label
                .split(", ")
                .map(|kv| kv.split_once('=').unwrap().1.parse::<f64>().unwrap())
                .map(|v| (v * 1e6) as u64)
                .collect::<Vec<_>>()
        });
        assert_eq!(labels, sorted, "{text}");
        // The command it offers is for the first point listed.
        let first = text
            .lines()
            .nth(1)
            .unwrap()
            .trim()
            .split("  (")
            .next()
            .unwrap();
        assert!(
            text.ends_with(&format!("`shardrun logs -f {first}`")),
            "{text}"
        );
        // The first listed left from an earlier version of the sweep's spec: the command
        // offered is for the next one, a point of the spec last swept.
        let second = text
            .lines()
            .nth(2)
            .unwrap()
            .trim()
            .split("  (")
            .next()
            .unwrap();
        let current: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name().into_string().unwrap())
            .filter(|name| !first.ends_with(&format!("/{name}")))
            .collect();
        std::fs::create_dir_all(dir.path().join("arrays")).unwrap();
        crate::sweeps::journal::Journal::new(dir.path())
            .write_current_points(current.iter().map(String::as_str))
            .unwrap();
        let text = refuse_a_folder_of_runs(&args).unwrap_err().to_string();
        assert!(
            text.ends_with(&format!("`shardrun logs -f {second}`")),
            "{text}"
        );
    }

    #[test]
    fn the_last_lines_are_those_tail_prints() {
        let text = b"one\ntwo\nthree\n";
        assert_eq!(last_lines(text, 2), b"two\nthree\n");
        assert_eq!(last_lines(text, 3), text);
        assert_eq!(last_lines(text, 10), text);
        assert_eq!(last_lines(text, 0), b"");
        assert_eq!(last_lines(b"one\ntwo", 1), b"two");
        assert_eq!(last_lines(b"", 5), b"");
    }

    #[test]
    fn a_followed_log_replaced_or_cut_is_read_again_from_its_beginning() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("train.log");
        let mut log = FollowedFile::new(path.clone());
        let read = |log: &mut FollowedFile| {
            let new = log.read_new(true).unwrap();
            (String::from_utf8(new.bytes).unwrap(), new.started_anew)
        };
        std::fs::write(&path, "a\nb\nc").unwrap();
        assert_eq!(read(&mut log), ("a\nb\n".into(), false));
        std::fs::write(&path, "a\nb\nc\n").unwrap();
        assert_eq!(read(&mut log), ("c\n".into(), false));
        // A run started over: a new, longer file in its place, read whole, not from the old
        // file's offset (which would start in the middle of a line).
        let replacement = dir.path().join("new.log");
        std::fs::write(&replacement, "first\nsecond\nthird\n").unwrap();
        std::fs::rename(&replacement, &path).unwrap();
        assert_eq!(read(&mut log), ("first\nsecond\nthird\n".into(), true));
        // The same file cut short and written again.
        std::fs::write(&path, "again\n").unwrap();
        assert_eq!(read(&mut log), ("again\n".into(), true));
        assert_eq!(read(&mut log), (String::new(), false));
    }
}
