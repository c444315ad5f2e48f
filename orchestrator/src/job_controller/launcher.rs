//! Starting and stopping the worker processes: N child processes in local mode, one `srun`
//! step with one task per rank under Slurm. Their raw stdout and stderr are read line by
//! line into the run's logs (srun's `--label` says which rank a line is from).
//!
//! No orphans: every child runs in its own process group, which the controller signals as
//! a whole, and local children get `PR_SET_PDEATHSIG` so they die with the controller even
//! if it is SIGKILLed.

use super::clock;
use super::job::ProcId;
use super::outcome::ExitInfo;
use super::priority;
use super::writer::Record;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::Command;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// Longest raw output line kept whole; longer ones are split (bounded memory).
const MAX_RAW_LINE: usize = 16 * 1024;

#[derive(Debug, Clone, PartialEq)]
pub enum LaunchMode {
    /// `nproc` child processes; `gpus`: rank i gets `gpus[i]` as its `CUDA_VISIBLE_DEVICES`
    /// (one GPU per rank; None for CPU runs). `forced`: the command that started them had
    /// `--force`, so the same command again would start the run over.
    Local {
        gpus: Option<Vec<String>>,
        forced: bool,
    },
    /// One `srun` step inside the current allocation; `gpus_per_node` as the sbatch script
    /// asked (`--gres=gpu:N`), 0 for CPU ranks. `sweep_point`: the run is a point of a
    /// sweep, which `shardrun sweep` submits again (`shardrun submit` refuses it).
    Slurm {
        nodes: u64,
        gpus_per_node: u64,
        sweep_point: bool,
    },
}

impl LaunchMode {
    /// What carries the stopped run in `run_dir` on, as messages advise it. A Slurm job is
    /// submitted again by its run directory, whose `job.yaml` keeps any `--set` it was
    /// submitted with (the spec alone may ask for other steps).
    pub fn run_again(&self, run_dir: &Path) -> String {
        match self {
            LaunchMode::Local { forced: false, .. } => "run the same command again".to_string(),
            LaunchMode::Local { forced: true, .. } => {
                format!("run `shardrun run {}`", crate::output::pasteable(run_dir))
            }
            LaunchMode::Slurm {
                sweep_point: false, ..
            } => format!(
                "submit it again (`shardrun submit {}`)",
                crate::output::pasteable(run_dir)
            ),
            LaunchMode::Slurm {
                sweep_point: true, ..
            } => "run `shardrun sweep` on the sweep's spec again (it skips finished points)"
                .to_string(),
        }
    }
}

#[derive(Debug, Clone)]
pub struct LaunchSpec {
    pub worker_bin: PathBuf,
    pub world_size: u64,
    /// Environment common to every rank.
    pub env: Vec<(String, String)>,
    pub mode: LaunchMode,
}

#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// The worker binary (local mode, for `rank`) or `srun` could not be executed.
    #[error("cannot execute {program}: {source}; {fix}")]
    Spawn {
        rank: Option<u64>,
        program: String,
        source: std::io::Error,
        fix: String,
    },
    #[error("{0}")]
    Invalid(String),
}

impl LaunchError {
    /// The rank whose process could not be started, where one is to blame.
    pub fn rank(&self) -> Option<u64> {
        match self {
            LaunchError::Spawn { rank, .. } => *rank,
            LaunchError::Invalid(_) => None,
        }
    }
}

/// What [`Launcher::launch`] started, and why it stopped short if it did.
pub struct Launched {
    pub launcher: Launcher,
    /// The processes that started, each with its rank where known.
    pub procs: Vec<ProcRank>,
    /// Why the rest could not be started. The processes above still run: the job stops
    /// them as it stops for any failure.
    pub failed: Option<LaunchError>,
}

/// A launched process and its rank, where known (local mode).
pub type ProcRank = (ProcId, Option<u64>);

/// What the launcher reports to the event loop.
pub type ExitSender = mpsc::UnboundedSender<(ProcId, ExitInfo)>;

pub struct Launcher {
    /// Process-group ids of processes not yet reaped. Removed before the exit is reported,
    /// so a reaped (and maybe reused) pid is never signalled.
    alive: Arc<Mutex<HashMap<ProcId, i32>>>,
    pipes: Vec<JoinHandle<()>>,
    /// What srun's own lines said of the job, read as they pass to train.log.
    srun_said: Arc<Mutex<SrunSaid>>,
}

/// What srun said of the job's tasks and nodes: under srun the controller sees a rank's
/// connection end, not its process's exit, nor the node it lost.
#[derive(Debug, Clone, Default)]
pub struct SrunSaid {
    /// Each rank's end (`srun: error: node1: task 3: Killed`).
    pub task_ends: HashMap<u64, ExitInfo>,
    /// The nodes Slurm lost under the job (`srun: error: Node failure on node2`), in the
    /// order srun named them.
    pub lost_nodes: Vec<String>,
}

impl Launcher {
    /// Starts the processes, up to the first that cannot be started.
    pub fn launch(spec: &LaunchSpec, exits: ExitSender, records: mpsc::Sender<Record>) -> Launched {
        let mut launcher = Launcher {
            alive: Arc::default(),
            pipes: Vec::new(),
            srun_said: Arc::default(),
        };
        let mut procs = Vec::new();
        let failed = launcher.start_all(spec, &exits, &records, &mut procs).err();
        Launched {
            launcher,
            procs,
            failed,
        }
    }

    /// Starts every process of `spec`, adding each to `procs` as it starts.
    fn start_all(
        &mut self,
        spec: &LaunchSpec,
        exits: &ExitSender,
        records: &mpsc::Sender<Record>,
        procs: &mut Vec<ProcRank>,
    ) -> Result<(), LaunchError> {
        match &spec.mode {
            LaunchMode::Local { gpus, .. } => {
                if let Some(gpus) = gpus {
                    if (gpus.len() as u64) < spec.world_size {
                        return Err(LaunchError::Invalid(format!(
                            "{} ranks but {} GPU(s): one GPU per rank",
                            spec.world_size,
                            gpus.len()
                        )));
                    }
                }
                for rank in 0..spec.world_size {
                    let mut cmd = Command::new(&spec.worker_bin);
                    cmd.envs(spec.env.iter().map(|(k, v)| (k, v)))
                        .env(shardrun_protocol::env::RANK, rank.to_string())
                        .env(
                            shardrun_protocol::env::WORLD_SIZE,
                            spec.world_size.to_string(),
                        )
                        .env(shardrun_protocol::env::LOCAL_RANK, rank.to_string());
                    if let Some(gpus) = gpus {
                        cmd.env("CUDA_VISIBLE_DEVICES", &gpus[rank as usize]);
                    }
                    // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
                    unsafe {
                        cmd.pre_exec(|| {
                            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                            Ok(())
                        });
                    }
                    self.start(rank, cmd, Labels::Rank(rank), exits, records)
                        .map_err(|source| {
                            let (program, fix) =
                                crate::binaries::unusable_worker_bin(&spec.worker_bin);
                            LaunchError::Spawn {
                                rank: Some(rank),
                                program,
                                source,
                                fix,
                            }
                        })?;
                    procs.push((rank, Some(rank)));
                }
            }
            LaunchMode::Slurm {
                nodes,
                gpus_per_node,
                ..
            } => {
                let nodes = (*nodes).max(1);
                if !spec.world_size.is_multiple_of(nodes) {
                    return Err(LaunchError::Invalid(format!(
                        "world size {} does not divide over {nodes} nodes; request a multiple of \
                         the node count",
                        spec.world_size
                    )));
                }
                let mut cmd = Command::new("srun");
                cmd.args(srun_args(spec.world_size, nodes, *gpus_per_node))
                    .arg(&spec.worker_bin)
                    .envs(spec.env.iter().map(|(k, v)| (k, v)));
                self.start(0, cmd, Labels::Srun, exits, records)
                    .map_err(|source| LaunchError::Spawn {
                        rank: None,
                        program: "`srun`".into(),
                        source,
                        fix: "the controller launches its ranks with srun inside a Slurm \
                              allocation (the sbatch script of `shardrun submit`); on a machine \
                              without Slurm, use `shardrun run`"
                            .into(),
                    })?;
                procs.push((0, None));
            }
        }
        Ok(())
    }

    fn start(
        &mut self,
        proc: ProcId,
        mut cmd: Command,
        labels: Labels,
        exits: &ExitSender,
        records: &mpsc::Sender<Record>,
    ) -> std::io::Result<()> {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        // SAFETY: one syscall, async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                priority::restore_normal();
                Ok(())
            });
        }
        let mut child = cmd.spawn()?;
        let pid = child.id().map(|p| p as i32).unwrap_or(0);
        self.alive
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(proc, pid);
        if let Some(out) = child.stdout.take() {
            self.pipes.push(tokio::spawn(forward_lines(
                out,
                labels,
                false,
                records.clone(),
                self.srun_said.clone(),
            )));
        }
        if let Some(err) = child.stderr.take() {
            self.pipes.push(tokio::spawn(forward_lines(
                err,
                labels,
                true,
                records.clone(),
                self.srun_said.clone(),
            )));
        }
        let alive = self.alive.clone();
        let exits = exits.clone();
        tokio::spawn(async move {
            let exit = match child.wait().await {
                Ok(status) => ExitInfo::from_status(status),
                Err(_) => ExitInfo::Code(-1),
            };
            alive
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&proc);
            let _ = exits.send((proc, exit));
        });
        Ok(())
    }

    /// Signals the process group of every process still running.
    pub fn signal_all(&self, signal: i32) {
        signal_groups(&self.alive, signal);
    }

    /// A handle that can signal the processes from elsewhere (the stop escalation).
    pub fn signaller(&self) -> impl Fn(i32) + Send + Sync + 'static {
        let alive = self.alive.clone();
        move |signal| signal_groups(&alive, signal)
    }

    /// Waits (at most `timeout`) until every output pipe reached end of file, so the last
    /// lines of dead processes are in the logs. Returns what srun said of the job: how its
    /// tasks ended, and the nodes Slurm lost.
    pub async fn drain_output(self, timeout: std::time::Duration) -> SrunSaid {
        let all = futures::future::join_all(self.pipes);
        let _ = tokio::time::timeout(timeout, all).await;
        let said = self.srun_said.lock().unwrap_or_else(|e| e.into_inner());
        said.clone()
    }
}

fn signal_groups(alive: &Mutex<HashMap<ProcId, i32>>, signal: i32) {
    for &pgid in alive.lock().unwrap_or_else(|e| e.into_inner()).values() {
        if pgid > 0 {
            // SAFETY: plain syscall on a process group we created and have not reaped.
            unsafe {
                libc::killpg(pgid, signal);
            }
        }
    }
}

/// `srun` arguments for one task per rank, spread evenly, labelled output, the step killed
/// as a whole when one task fails, and the controller's environment (the workers' variables,
/// `NCCL_*`) passed to every task even where the job was submitted with `--export=NONE`.
///
/// GPUs are asked for the way the sbatch script asks (`--gres=gpu:N` per node): every task
/// of a node sees the node's GPUs, and each worker takes the one at its `SLURM_LOCALID`, as
/// torchrun's ranks do; NCCL sees every GPU of the node for its topology. (Not
/// `--gpu-bind=none`: Slurm 22.05 then leaves `CUDA_VISIBLE_DEVICES` unset, and a rank on a
/// node without device cgroups would count GPUs of other jobs.)
///
/// Ranks are placed node by node (`--distribution=block`), so HYBRID_SHARD's shard groups,
/// consecutive ranks, are nodes. They are not bound to cores (`--cpu-bind=none`): srun of
/// Slurm 22.05 to 23.02 does not take `--cpus-per-task` from sbatch, so a site that binds
/// tasks would pin each rank, with all its threads, to one core; asking it again on srun
/// would imply `--exact` there, which limits the step to the CPUs (and per-CPU memory) it
/// names rather than the allocation's.
pub fn srun_args(world_size: u64, nodes: u64, gpus_per_node: u64) -> Vec<String> {
    let mut args = vec![
        format!("--ntasks={world_size}"),
        format!("--nodes={nodes}"),
        format!("--ntasks-per-node={}", world_size / nodes.max(1)),
        "--distribution=block".to_string(),
        "--cpu-bind=none".to_string(),
        "--kill-on-bad-exit=1".to_string(),
        "--label".to_string(),
        "--job-name=shardrun-worker".to_string(),
        "--export=ALL".to_string(),
    ];
    if gpus_per_node > 0 {
        args.push(format!("--gres=gpu:{gpus_per_node}"));
    }
    args
}

#[derive(Debug, Clone, Copy)]
enum Labels {
    /// Every line is this rank's.
    Rank(u64),
    /// srun `--label`: `"  3: text"` is rank 3's, anything else is srun's own.
    Srun,
}

/// srun's line about tasks that ended (`srun: error: node1: task 3: Killed`, `tasks 0-1,4:
/// Exited with exit code 2`): their ranks, and how, as the exit status would say it.
pub fn parse_srun_task_end(line: &str) -> Option<(Vec<u64>, ExitInfo)> {
    let rest = line.strip_prefix("srun: error: ")?;
    let (_, rest) = rest.split_once(": task")?;
    let (list, what) = rest.trim_start_matches('s').trim_start().split_once(": ")?;
    let mut ranks = Vec::new();
    for part in list.split(',') {
        match part.split_once('-') {
            Some((a, b)) => ranks.extend(a.trim().parse::<u64>().ok()?..=b.trim().parse().ok()?),
            None => ranks.push(part.trim().parse().ok()?),
        }
    }
    if let Some(code) = what.strip_prefix("Exited with exit code ") {
        return Some((ranks, ExitInfo::Code(code.trim().parse().ok()?)));
    }
    // strsignal's words, as srun writes them.
    const SIGNALS: [(&str, i32); 9] = [
        ("Hangup", 1),
        ("Interrupt", 2),
        ("Illegal instruction", 4),
        ("Aborted", 6),
        ("Bus error", 7),
        ("Floating point exception", 8),
        ("Killed", 9),
        ("Segmentation fault", 11),
        ("Terminated", 15),
    ];
    let (_, signal) = SIGNALS.iter().find(|(words, _)| what.starts_with(words))?;
    Some((ranks, ExitInfo::Signal(*signal)))
}

/// The node of srun's `srun: error: Node failure on node2`: Slurm lost it, and the job's
/// ranks there with it.
pub fn parse_node_failure(line: &str) -> Option<&str> {
    line.strip_prefix("srun: error: Node failure on ")
        .map(str::trim)
        .filter(|node| !node.is_empty() && !node.contains(char::is_whitespace))
}

/// What to say of the nodes Slurm lost under a job that failed or was requeued for it, after
/// how it ended: where to read why, and how to keep the next attempts off them. `None` when
/// none was lost.
pub fn lost_nodes_advice(lost: &[String]) -> Option<String> {
    let it = match lost.len() {
        0 => return None,
        1 => "it",
        _ => "them",
    };
    Some(format!(
        "`sinfo -R` says why Slurm lost {}, and `resources.extra_sbatch: \
         [\"--exclude={}\"]` keeps jobs off {it}",
        lost.join(", "),
        lost.join(",")
    ))
}

/// What shardrun knows of one of srun's own lines that reads worse than it is, or says less
/// than a user needs (a node lost), to say next to it in train.log; `end`: the line's
/// tasks' end, as [`parse_srun_task_end`] read it.
pub fn srun_line_explained(line: &str, end: Option<&ExitInfo>) -> Option<&'static str> {
    if line.contains("cluster configuration lacks support for cpu binding") {
        // `--cpu-bind=none` on a cluster without task/affinity.
        return Some("harmless: the ranks are not bound to cores, as shardrun asks");
    }
    if parse_node_failure(line).is_some() {
        // Its ranks are gone; Slurm ends the job, and requeues it where the cluster does.
        return Some(
            "Slurm lost that node (down, rebooted or unreachable), and its ranks with it: \
             `sinfo -R` says why; keep the job off it with `resources.extra_sbatch: [\"--exclude=<node>\"]`",
        );
    }
    match end? {
        ExitInfo::Code(code) if shardrun_protocol::messages::is_stop_status(*code) => Some(
            "the status of ranks that stopped as asked (at a step boundary, or before the \
                 job started), not a failure",
        ),
        _ => None,
    }
}

/// Whether a task's line is Slurm's step daemon's (`slurmstepd-n1: error: *** STEP 6.0 ON n1
/// CANCELLED AT ... ***`), which it writes into the stream of the task it stops.
pub fn from_slurmstepd(text: &str) -> bool {
    text.split_once(": ")
        .is_some_and(|(who, _)| who == "slurmstepd" || who.starts_with("slurmstepd-"))
}

/// Splits `"  3: text"` into (3, "text").
pub fn parse_srun_label(line: &str) -> Option<(u64, &str)> {
    let (label, rest) = line.split_once(": ")?;
    let rank = label.trim_start().parse().ok()?;
    Some((rank, rest))
}

async fn forward_lines(
    pipe: impl AsyncRead + Unpin,
    labels: Labels,
    stderr: bool,
    records: mpsc::Sender<Record>,
    srun_said: Arc<Mutex<SrunSaid>>,
) {
    let mut reader = BufReader::with_capacity(64 * 1024, pipe);
    let mut line = Vec::new();
    loop {
        line.clear();
        // Read one line, but never more than MAX_RAW_LINE bytes of it at once.
        let read = {
            let mut limited = (&mut reader).take(MAX_RAW_LINE as u64);
            limited.read_until(b'\n', &mut line).await
        };
        match read {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let text = String::from_utf8_lossy(&line);
        let text = text.trim_end_matches(['\n', '\r']);
        let (rank, text) = match labels {
            Labels::Rank(rank) => (Some(rank), text),
            Labels::Srun => match parse_srun_label(text) {
                // Slurm's step daemon writes into a task's stream: its line, not the rank's.
                Some((_, rest)) if from_slurmstepd(rest) => (None, rest),
                Some((rank, rest)) => (Some(rank), rest),
                None => (None, text),
            },
        };
        let mut text = text.to_string();
        if let (Labels::Srun, None) = (labels, rank) {
            let mut said = srun_said.lock().unwrap_or_else(|e| e.into_inner());
            let end = parse_srun_task_end(&text).map(|(ranks, end)| {
                for rank in ranks {
                    said.task_ends.entry(rank).or_insert(end);
                }
                end
            });
            if let Some(node) = parse_node_failure(&text) {
                if !said.lost_nodes.iter().any(|lost| lost == node) {
                    said.lost_nodes.push(node.to_string());
                }
            }
            drop(said);
            if let Some(note) = srun_line_explained(&text, end.as_ref()) {
                text.push_str(&format!(" [shardrun: {note}]"));
            }
        }
        let record = Record::Raw {
            rank,
            stderr,
            text,
            time: clock::now(),
        };
        if records.send(record).await.is_err() {
            return;
        }
    }
}

use tokio::io::AsyncReadExt as _;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lost_nodes_are_advised_on_by_name() {
        assert_eq!(lost_nodes_advice(&[]), None);
        assert_eq!(
            lost_nodes_advice(&["gpu-17".into()]).unwrap(),
            "`sinfo -R` says why Slurm lost gpu-17, and `resources.extra_sbatch: \
             [\"--exclude=gpu-17\"]` keeps jobs off it"
        );
        assert!(lost_nodes_advice(&["a1".into(), "b2".into()])
            .unwrap()
            .ends_with(
            "lost a1, b2, and `resources.extra_sbatch: [\"--exclude=a1,b2\"]` keeps jobs off them"
        ));
    }

    #[test]
    fn the_step_daemons_lines_are_told_from_the_ranks() {
        let line =
            "0: slurmstepd-vm: error: *** STEP 6.0 ON vm CANCELLED AT 2026-12-02T02:10:11 ***";
        let (rank, rest) = parse_srun_label(line).unwrap();
        assert_eq!(rank, 0);
        assert!(from_slurmstepd(rest));
        assert!(from_slurmstepd(
            "slurmstepd: error: *** JOB 41 CANCELLED ***"
        ));
        assert!(!from_slurmstepd("step 3/10 | loss 2.1"));
        assert!(!from_slurmstepd("slurmstepdx: a rank's own words"));
    }

    #[test]
    fn srun_says_how_its_tasks_ended() {
        assert_eq!(
            parse_srun_task_end("srun: error: node1: task 3: Killed"),
            Some((vec![3], ExitInfo::Signal(9)))
        );
        assert_eq!(
            parse_srun_task_end("srun: error: n2: tasks 0-1,4: Exited with exit code 2"),
            Some((vec![0, 1, 4], ExitInfo::Code(2)))
        );
        assert_eq!(
            parse_srun_task_end("srun: error: n2: task 0: Segmentation fault (core dumped)"),
            Some((vec![0], ExitInfo::Signal(11)))
        );
        assert_eq!(parse_srun_task_end("srun: error: Timed out waiting"), None);
        assert_eq!(parse_srun_task_end(" 3: task 1: Killed"), None);
    }

    #[test]
    fn srun_labels() {
        assert_eq!(
            parse_srun_label(" 3: loss 2.0: ok"),
            Some((3, "loss 2.0: ok"))
        );
        assert_eq!(parse_srun_label("12: x"), Some((12, "x")));
        assert_eq!(parse_srun_label("srun: error: node1: task 1: Killed"), None);
    }

    #[test]
    fn srun_lines_that_read_worse_than_they_are_are_explained() {
        // As the launcher reads them: the tasks' end parsed first.
        let srun_line_explained = |line: &str| {
            let end = parse_srun_task_end(line).map(|(_, end)| end);
            srun_line_explained(line, end.as_ref())
        };
        let stopped = srun_line_explained("srun: error: vm: tasks 0-1: Exited with exit code 3");
        assert!(stopped.is_some_and(|n| n.contains("stopped as asked (at a step boundary")));
        assert!(
            srun_line_explained("srun: error: vm: task 1: Exited with exit code 143").is_some()
        );
        assert!(
            srun_line_explained("srun: cluster configuration lacks support for cpu binding")
                .is_some_and(|n| n.starts_with("harmless"))
        );
        // The node is named in srun's line; what to do about it, next to it.
        assert!(srun_line_explained("srun: error: Node failure on vm-n2")
            .is_some_and(|n| n.starts_with("Slurm lost that node") && n.contains("--exclude")));
        assert_eq!(
            parse_node_failure("srun: error: Node failure on vm-n2"),
            Some("vm-n2")
        );
        assert_eq!(parse_node_failure("srun: error: vm: task 0: Killed"), None);
        for failure in [
            "srun: error: vm: task 1: Exited with exit code 1",
            "srun: error: vm: task 0: Killed",
            "srun: error: Unable to create step for job 5: Invalid generic resource (gres) specification",
        ] {
            assert_eq!(srun_line_explained(failure), None, "{failure}");
        }
    }

    #[test]
    fn srun_spreads_tasks_over_nodes() {
        let args = srun_args(8, 2, 4);
        for arg in [
            "--ntasks-per-node=4",
            "--distribution=block",
            "--cpu-bind=none",
            "--gres=gpu:4",
            "--kill-on-bad-exit=1",
            "--export=ALL",
        ] {
            assert!(args.contains(&arg.to_string()), "{arg} in {args:?}");
        }
        let cpu = srun_args(2, 1, 0);
        assert!(!cpu.iter().any(|a| a.contains("gpu")));
    }
}
