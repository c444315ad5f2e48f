//! Wiring: sockets, processes, signals and timers feed [`JobMachine`]; its actions are carried
//! out here. No decision is made in this file that [`super::job`] could make.

use super::collective_lag::CollectiveCounts;
use super::console::Console;
use super::job::{Action, ConnId, Event, JobMachine};
use super::launcher::{self, LaunchMode, LaunchSpec, Launched, Launcher};
use super::notice::Notice;
use super::outcome::{CancelledBy, FailureCause, Outcome};
use super::rank_variables::RankVariables;
use super::server::{self, ServerEvent, ServerOptions};
use super::stop_signal::{ControllerSignal, HandedOver, Signals, StopSignal};
use super::writer::{self, ControllerLog, Echo, Record, WriterFiles};
use super::{clock, open_files, priority, secret, ControllerError};
use crate::events_file::RunEvent;
use crate::metrics_file::divergence_remedies;
use crate::rundir::RunLock;
use serde::Serialize;
use shardrun_protocol::config::CheckpointConfig;
use shardrun_protocol::messages::ToWorker;
use shardrun_protocol::{env, TrainConfig};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::task::AbortHandle;
use tracing::Instrument;

/// Files of the run directory the controller reads and writes.
#[derive(Debug, Clone)]
pub struct RunPaths {
    pub run_dir: PathBuf,
    pub train_config: PathBuf,
    pub secret: PathBuf,
    pub controller_addr: PathBuf,
    pub train_log: PathBuf,
    pub logs_dir: PathBuf,
    pub metrics: PathBuf,
    pub events: PathBuf,
    pub result: PathBuf,
    /// How many times the job was requeued after preemption.
    pub requeue_count: PathBuf,
}

/// Seconds after ranks are asked to stop (a cancel, a preemption or time-limit notice) at
/// which those still going are named, with the rank the others wait for if there is one.
const STOP_OVERDUE_AFTER: [u64; 3] = [10, 30, 60];
/// A rank that entered fewer collectives than the others and none for this long when the
/// stop is overdue is the one they wait for (a healthy rank enters several a second; its
/// last count reaches the controller up to a heartbeat late).
const STOP_LAG_STILL_FOR: Duration = Duration::from_secs(5);

#[derive(Debug, Clone)]
pub struct Timeouts {
    /// All ranks must have registered this long after launch.
    pub rendezvous: Duration,
    /// A registered rank silent for this long is considered hung.
    pub heartbeat: Duration,
    /// A rank heartbeating at the same step for this long is not making progress.
    pub progress: Option<Duration>,
    /// After Shutdown for a failure, ranks get this long to exit before SIGTERM.
    pub shutdown_grace: Duration,
    /// After Shutdown for a cancel, ranks get this long to reach their next step boundary
    /// and exit before SIGTERM.
    pub step_boundary: Duration,
    /// After SIGTERM, this long before SIGKILL.
    pub kill_grace: Duration,
    /// After the last process exited, how long open connections may still deliver data.
    pub drain: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            rendezvous: Duration::from_secs(600),
            heartbeat: Duration::from_secs(60),
            progress: Some(Duration::from_secs(1800)),
            shutdown_grace: Duration::from_secs(2),
            step_boundary: Duration::from_secs(60),
            kill_grace: Duration::from_secs(3),
            // Only spent when a dead process's connection still has queued data to read.
            drain: Duration::from_secs(5),
        }
    }
}

#[derive(Debug, Clone)]
pub struct ControllerOptions {
    pub paths: RunPaths,
    pub launch: LaunchMode,
    pub worker_bin: PathBuf,
    pub timeouts: Timeouts,
    pub echo: Echo,
    /// Draw a progress bar when stdout is a terminal (local mode).
    pub progress_bar: bool,
    /// Requeues allowed after preemption (Slurm only).
    pub max_requeues: u32,
    /// Variables set for every rank (`resources.env`, and `NCCL_*` of the submitting shell).
    pub rank_variables: RankVariables,
    /// The plan's warnings (`shardrun plan` printed them; the run's log keeps them).
    pub plan_warnings: Vec<String>,
    /// This attempt prepared (tokenized) the run's data, which the next attempt finds ready:
    /// progress, whatever the checkpoints say (see `time_limit_without_progress`).
    pub prepared_data: bool,
}

/// What the command needs to report and exit with.
#[derive(Debug)]
pub struct RunReport {
    pub outcome: Outcome,
    pub exit_code: i32,
    /// One line for the user.
    pub message: String,
    /// What the command prints on stderr as the error it ends with, when the job ended in
    /// one (a failure: the message, the failed rank's last lines, where the logs are). The
    /// controller wrote it to train.log only, so that it is printed once.
    pub error: Option<String>,
    /// Why the run's end is not in its run directory (`result.json` could not be written),
    /// and what to do: said on stderr after the report, whatever the outcome.
    pub unrecorded: Option<String>,
}

/// `result.json`.
#[derive(Serialize)]
struct ResultFile<'a> {
    #[serde(flatten)]
    outcome: &'a Outcome,
    exit_code: i32,
    /// How the run ended, in a few words (`"was cancelled by SIGINT after step 150"`); a
    /// re-run quotes it.
    ended: &'a str,
    /// The newest checkpoint the run left.
    checkpoint: Option<CheckpointLeft>,
    /// The last step the run trained, as far as the controller knows (the ranks' heartbeats
    /// and step records, a checkpoint every rank committed), whatever its end.
    last_step: Option<u64>,
    message: &'a str,
    /// Last lines of the failed rank, when one failed.
    last_lines: &'a [String],
    requeued: bool,
    world_size: u64,
    config_hash: &'a str,
    started_at: String,
    ended_at: String,
    duration_s: f64,
}

/// The controller's runtime. Made before the data is prepared, so that its signal handlers
/// ([`Signals`]) are in place from the start to the end.
pub fn runtime() -> Result<tokio::runtime::Runtime, ControllerError> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .on_thread_start(priority::yield_to_training)
        .enable_all()
        .build()
        .map_err(ControllerError::Runtime)
}

/// Runs a whole job on `runtime`; blocks until it is over. `signals`: the handlers installed
/// on it. `lock`: the run directory's, which the caller took before it set the run going;
/// released once the result is written.
pub fn run(
    runtime: &tokio::runtime::Runtime,
    signals: Signals,
    opts: ControllerOptions,
    lock: RunLock,
) -> Result<RunReport, ControllerError> {
    // Not before: the data is prepared on this thread, with nothing to yield to yet.
    priority::yield_to_training();
    // Every diagnostic of this controller names its run and Slurm job.
    let span = tracing::info_span!(
        "job",
        run = %opts.paths.run_dir.display(),
        slurm_job = this_slurm_job().as_deref().unwrap_or("-"),
    );
    runtime.block_on(run_async(signals, opts, lock).instrument(span))
}

async fn run_async(
    signals: Signals,
    opts: ControllerOptions,
    lock: RunLock,
) -> Result<RunReport, ControllerError> {
    let HandedOver {
        signals,
        preempted_before_launch,
    } = signals.hand_over();
    let started = clock::now();
    let paths = &opts.paths;
    let file_err = |what, path: &Path| {
        let path = path.to_path_buf();
        move |source| ControllerError::File { what, path, source }
    };
    let config_text = std::fs::read_to_string(&paths.train_config)
        .map_err(file_err("read the training config", &paths.train_config))?;
    let config: TrainConfig =
        serde_json::from_str(&config_text).map_err(|source| ControllerError::Config {
            path: paths.train_config.clone(),
            source,
        })?;
    let world_size = config.batch.world_size;
    let config_hash = config.config_hash();
    // (The previous attempt's result.json went when the run started: see
    // `commands::controller::supervise`.)
    let secret = secret::load_or_create(&paths.secret)
        .map_err(file_err("create the secret", &paths.secret))?;

    // Under Slurm the ranks may be on other nodes: listen everywhere, advertise the hostname.
    let (bind, advertise_host) = match opts.launch {
        LaunchMode::Local { .. } => ("127.0.0.1:0", "127.0.0.1".to_string()),
        LaunchMode::Slurm { .. } => ("0.0.0.0:0", shardrun_protocol::host::hostname()),
    };
    let listener = TcpListener::bind(bind)
        .await
        .map_err(|source| ControllerError::Bind {
            addr: bind.to_string(),
            source,
        })?;
    let port = listener
        .local_addr()
        .map_err(|source| ControllerError::Bind {
            addr: bind.to_string(),
            source,
        })?
        .port();
    let addr = format!("{advertise_host}:{port}");
    tracing::debug!(bind, advertised = %addr, "listening for the ranks");
    crate::rundir::replace_file(&paths.controller_addr, format!("{addr}\n").as_bytes())
        .map_err(file_err("write", &paths.controller_addr))?;

    let files = WriterFiles {
        train_log: paths.train_log.clone(),
        logs_dir: paths.logs_dir.clone(),
        metrics: paths.metrics.clone(),
        events: paths.events.clone(),
        world_size,
    };
    let console = Console::new(config.steps, opts.progress_bar);
    let writer::Writer {
        records,
        thread: writer,
        failed: run_dir_failed,
    } = writer::spawn(&files, console, opts.echo)
        .map_err(file_err("open the logs in", &paths.run_dir))?;
    // A run that resumes stops with a checkpoint when its records cannot be written; one
    // that would start over (`checkpoint.resume: false`) trains on, unrecorded, to its end.
    let run_dir_failed = config.checkpoint.resume.then_some(run_dir_failed);
    let log = ControllerLog(&records);
    log.say(format!(
        "job {:?}: {world_size} rank(s), config {config_hash}, controller at {addr}, run directory {}",
        config.name,
        paths.run_dir.display()
    ))
    .await;
    let slurm_job_id = this_slurm_job();
    log.note(RunEvent::Started {
        world_size,
        slurm_job_id: slurm_job_id.clone(),
    })
    .await;
    for warning in &opts.plan_warnings {
        log.log_only(format!("warning: {warning}")).await;
    }
    if let Some(warning) = open_files::ensure(open_files::needed(world_size)) {
        log.say(format!("warning: {warning}")).await;
    }

    // What this attempt starts from: one stopped by its time limit without saving past it
    // is not requeued (see `time_limit_without_progress`).
    let checkpoint_root = config.checkpoint.root(Some(&paths.run_dir));
    let checkpoint_at_start = checkpoint_root
        .as_deref()
        .map(newest_checkpoint)
        .and_then(|newest| newest.checkpoint().map(|c| c.step));
    let (outcome, steps_done, lost_nodes) = if preempted_before_launch {
        // Nothing has trained in this job yet, so nothing is to be saved: the time left before
        // the kill is better spent on the requeue than on starting ranks only to stop them.
        let notice = Notice::of_this_job().await;
        log.say(format!(
            "{} before the ranks were launched (during the set-up or while the data was \
             prepared): no rank is started",
            notice.announced()
        ))
        .await;
        log.note(RunEvent::PreemptRequested { notice }).await;
        (Outcome::Preempted { notice }, None, Vec::new())
    } else {
        let ranks = Ranks {
            opts: &opts,
            listener,
            secret: &secret,
            addr: &addr,
            world_size,
            config_hash: &config_hash,
            steps: config.steps,
            records: &records,
            run_dir_failed,
        };
        ranks.launch_and_watch(signals).await
    };
    let outcome = requeued_by_slurm(outcome, slurm_job_id.is_some()).await;

    let mut last_lines = Vec::new();
    if let (false, Some(root)) = (matches!(outcome, Outcome::Succeeded), &checkpoint_root) {
        // Every rank has exited: a save cut short (a full disk, a kill) is nobody's to
        // finish, and its space is better given back now than at the next start.
        match shardrun_checkpoint::clean_stale(root) {
            Ok(removed) => {
                for path in removed {
                    log.say(shardrun_checkpoint::naming::removed_line(&path))
                        .await;
                }
            }
            Err(e) => tracing::warn!(error = %e, "could not remove unfinished saves"),
        }
    }
    let newest = checkpoint_root
        .as_deref()
        .map_or(Newest::Nothing, newest_checkpoint);
    let checkpoint = newest.checkpoint();
    // Heartbeats come about once a second, steps faster: a rank that went silent may have
    // completed steps since its last one, and a checkpoint every rank committed says so.
    // (One of an earlier attempt counts only when this one resumed from it.)
    let steps_done = match config.checkpoint.resume {
        true => steps_done.max(checkpoint.map(|c| c.step)),
        false => steps_done,
    };
    // So may ranks that checkpointed for a cancel and ended without naming their step.
    let outcome = match outcome {
        Outcome::Cancelled { by, step } if config.checkpoint.resume => Outcome::Cancelled {
            by,
            step: step.max(checkpoint.map(|c| c.step)),
        },
        outcome => outcome,
    };
    let how_it_ended = ended_in_words(&outcome, checkpoint, &lost_nodes);
    let mut message = match &outcome {
        Outcome::Succeeded => {
            // Every step is in metrics.jsonl before it is read back.
            let (reply, flushed) = tokio::sync::oneshot::channel();
            let _ = records.send(Record::Flush(reply)).await;
            let _ = flushed.await;
            finished_message(
                &paths.metrics,
                checkpoint_root.as_deref(),
                &divergence_remedies(config.optimizer.grad_clip),
            )
        }
        Outcome::Failed(f) => f.describe(),
        Outcome::Cancelled { .. } => {
            // A run that diverged and went on (`on_divergence: continue`) is not resumed by
            // a re-run or a sweep, whatever stopped it: the line says why and what to do.
            let (reply, flushed) = tokio::sync::oneshot::channel();
            let _ = records.send(Record::Flush(reply)).await;
            let _ = flushed.await;
            let divergence = crate::metrics_file::read(&paths.metrics)
                .unwrap_or_default()
                .diverged_from();
            match divergence {
                Some(d) if config.checkpoint.resume => format!(
                    "the run {how_it_ended}{}; {} from step {}, and a run that diverged is \
                     not resumed: {}",
                    checkpoint_left(&newest, &config.checkpoint),
                    d.what(),
                    d.step,
                    diverged_resume_line(
                        d.step,
                        &newest,
                        &divergence_remedies(config.optimizer.grad_clip),
                        &opts.launch
                    )
                ),
                _ => cancelled_message(
                    &how_it_ended,
                    &newest,
                    &config.checkpoint,
                    &opts.launch,
                    &opts.paths.run_dir,
                ),
            }
        }
        Outcome::Preempted { .. } => format!(
            "the run {how_it_ended}{}",
            checkpoint_left(&newest, &config.checkpoint)
        ),
    };
    // What to do about nodes Slurm lost: after a failure's cause here, after what the job
    // requeued does below.
    let lost_nodes_advice = launcher::lost_nodes_advice(&lost_nodes);
    if let (Some(advice), Outcome::Failed(_)) = (&lost_nodes_advice, &outcome) {
        message = format!("{message}; {advice}");
    }
    let mut failure_report = None;
    if let Outcome::Failed(f) = &outcome {
        // A rank that could not be started has no lines to show.
        let rank = f
            .rank
            .filter(|_| !matches!(f.cause, FailureCause::Launch { .. }));
        if let Some(rank) = rank {
            let (reply, answer) = tokio::sync::oneshot::channel();
            let _ = records.send(Record::Recent { rank, reply }).await;
            last_lines = answer.await.unwrap_or_default();
        }
        let mut report = format!("job failed: {message}");
        if let Some(rank) = rank {
            if last_lines.is_empty() {
                report.push_str(&format!("\nrank {rank} wrote no log lines"));
            } else {
                report.push_str(&format!("\nlast lines of rank {rank}:"));
                for line in &last_lines {
                    report.push_str(&format!("\n  | {line}"));
                }
            }
        }
        report.push_str(&format!(
            "\nfull logs: {} and {}",
            paths.train_log.display(),
            paths.logs_dir.display()
        ));
        let resume = match &f.cause {
            FailureCause::Diverged { step, .. } => {
                let remedies = divergence_remedies(config.optimizer.grad_clip);
                diverged_resume_line(*step, &newest, &remedies, &opts.launch)
            }
            _ => failed_resume_line(
                steps_done,
                &newest,
                &config.checkpoint,
                &opts.launch,
                &opts.paths.run_dir,
            ),
        };
        report.push_str(&format!("\n{resume}"));
        log.log_only(report.clone()).await;
        failure_report = Some((report, resume));
    }

    log.note(match &outcome {
        Outcome::Succeeded => RunEvent::Finished { step: config.steps },
        Outcome::Failed(f) => RunEvent::Failed {
            step: steps_done,
            reason: f.describe(),
        },
        Outcome::Cancelled { by, step } => RunEvent::Stopped {
            step: *step,
            by: by.to_string(),
        },
        Outcome::Preempted { notice } => RunEvent::Preempted {
            step: checkpoint.map(|c| c.step),
            notice: *notice,
        },
    })
    .await;
    let mut exit_code = outcome.exit_code();
    // The Slurm job to requeue, and the message as it was before it said so (should
    // `scontrol requeue` fail).
    let mut requeue = None;
    let slurm_requeued = outcome
        == Outcome::Preempted {
            notice: Notice::SlurmRequeue,
        };
    // What the job queued again does: resume from the checkpoint, or start over without one.
    let resumes = match &newest {
        Newest::Checkpoint(_) => "which resumes from it",
        Newest::Unreadable(_) => {
            "which resumes from it once it reads (its ranks refuse it until then)"
        }
        Newest::Nothing => "which starts the run over (it has no checkpoint)",
    };
    if slurm_requeued {
        message = format!("{message}; Slurm queues the job again, {resumes}");
        if let Some(advice) = &lost_nodes_advice {
            message = format!("{message}; {advice}");
        }
    } else if let Outcome::Preempted { notice } = outcome {
        match this_slurm_job() {
            Some(_)
                if !opts.prepared_data
                    && time_limit_without_progress(notice, checkpoint_at_start, &newest) =>
            {
                exit_code = 1;
                message = format!(
                    "{message}; not requeued: the notice of its time limit came before it \
                     saved a step past {}, and another attempt would spend its time the same \
                     way ({}), using up its requeues: {}, then {} to {}",
                    match checkpoint_at_start {
                        Some(step) => format!("the checkpoint it started from (step {step})"),
                        None => "the start".to_string(),
                    },
                    match preempted_before_launch {
                        true => "the set-up lines, with its data prepared already",
                        false => "starting the ranks, loading the model",
                    },
                    super::notice::more_time_to_train(),
                    opts.launch.run_again(&opts.paths.run_dir),
                    match checkpoint_at_start {
                        Some(_) => "resume",
                        None => "start it",
                    }
                );
            }
            Some(job_id) => {
                let done = read_count(&paths.requeue_count);
                tracing::info!(
                    slurm_job = job_id,
                    done,
                    allowed = opts.max_requeues,
                    requeue = done < opts.max_requeues,
                    "preempted: requeue decision"
                );
                let counted = (done < opts.max_requeues).then(|| {
                    crate::rundir::replace_file(
                        &paths.requeue_count,
                        format!("{}\n", done + 1).as_bytes(),
                    )
                    .map_err(file_err("write", &paths.requeue_count))
                });
                if let Some(Err(e)) = counted {
                    // Requeued uncounted, a job could come back forever.
                    exit_code = 1;
                    message = format!(
                        "{message}; its job is not requeued, as the requeue cannot be counted \
                         ({e}): {} to resume from its last checkpoint",
                        opts.launch.run_again(&opts.paths.run_dir)
                    );
                } else if counted.is_some() {
                    let preempted_message = message.clone();
                    message = format!(
                        "{message}; requeueing Slurm job {job_id} ({} of {} requeues), \
                         {resumes}",
                        done + 1,
                        opts.max_requeues
                    );
                    log.note(RunEvent::Requeued {
                        step: checkpoint.map(|c| c.step),
                        slurm_job_id: job_id.clone(),
                        requeue: done + 1,
                        max_requeues: opts.max_requeues,
                    })
                    .await;
                    requeue = Some((job_id, preempted_message, done));
                } else if opts.max_requeues == 0 {
                    // Asked for: the run ends preempted, as it would outside Slurm.
                    message = format!(
                        "{message}; its job is not requeued (`preemption.requeue: false`, or \
                         `max_requeues: 0`): {} to resume from its last checkpoint",
                        opts.launch.run_again(&opts.paths.run_dir)
                    );
                } else {
                    exit_code = 1;
                    message = format!(
                        "{message}; no requeue left ({} used): {} to resume from its last \
                         checkpoint",
                        opts.max_requeues,
                        opts.launch.run_again(&opts.paths.run_dir)
                    );
                }
            }
            None => {
                message = format!(
                    "{message}; {}",
                    how_to_resume(&opts.launch, &opts.paths.run_dir)
                )
            }
        }
    }
    if matches!(outcome, Outcome::Preempted { .. }) && exit_code != 0 {
        // Not requeued: the run's events end in its failure, as its state does.
        log.note(RunEvent::Failed {
            step: checkpoint.map(|c| c.step),
            reason: message.clone(),
        })
        .await;
    }
    // A job that ends in an error is reported by the command, on stderr: once, there.
    let failure_resume = failure_report.as_ref().map(|(_, resume)| resume.clone());
    let mut error = (exit_code != 0 && !matches!(outcome, Outcome::Cancelled { .. })).then(|| {
        failure_report
            .map(|(report, _)| report)
            .unwrap_or_else(|| message.clone())
    });
    match (&error, &failure_resume) {
        // The failure report, in the log already, said it.
        (Some(_), Some(_)) => {}
        (Some(_), None) => log.log_only(message.clone()).await,
        (None, _) => log.say(message.clone()).await,
    }

    let ended = clock::now();
    let write_result = |message: &str, exit_code: i32, requeued: bool| {
        let result = ResultFile {
            outcome: &outcome,
            exit_code,
            ended: &how_it_ended,
            checkpoint: checkpoint.cloned(),
            last_step: steps_done,
            message,
            last_lines: &last_lines,
            requeued,
            world_size,
            config_hash: &config_hash,
            started_at: clock::format_utc(started),
            ended_at: clock::format_utc(ended),
            duration_s: ended - started,
        };
        let mut value = serde_json::to_value(&result).unwrap_or_default();
        // A notice not followed by a requeue (none left, none worth it, one Slurm refused)
        // ends the run: failed, as Slurm and `status` say, for the notice it names.
        if matches!(outcome, Outcome::Preempted { .. }) && exit_code != 0 {
            value["status"] = "failed".into();
        }
        let json = serde_json::to_vec_pretty(&value).unwrap_or_default();
        crate::rundir::replace_file(&paths.result, &json).map_err(file_err("write", &paths.result))
    };
    // A run directory that cannot be written (a full disk) loses the record, not the
    // report: what happened to the ranks is said as ever, then that it is not on disk.
    let unrecorded_because = |e: ControllerError| {
        format!(
            "{END_NOT_RECORDED} ({e})\n  fix: free space in (or make writable) {}, \
             then {}: it resumes the run from its newest checkpoint, or finds it finished",
            paths.run_dir.display(),
            opts.launch.run_again(&opts.paths.run_dir)
        )
    };
    let mut unrecorded = write_result(&message, exit_code, requeue.is_some() || slurm_requeued)
        .err()
        .map(unrecorded_because);
    if let Some(resume) = failure_resume {
        // result.json keeps the cause; the run's state (`shardrun status`) says how to go on.
        message = format!("{message}; {resume}");
    }

    if let Some((job_id, preempted_message, requeues_before)) = requeue {
        // Requeueing kills this batch script: everything must be on disk before.
        let (reply, flushed) = tokio::sync::oneshot::channel();
        let _ = records.send(Record::Flush(reply)).await;
        let _ = flushed.await;
        if let Err(why) = requeue_slurm_job(&job_id) {
            // Still here: the job was not requeued, and the run's files must say so. The
            // requeue it did not get is not counted against the job's allowance (where the
            // count can be written back: else it counts, and the result says why below).
            let _ = crate::rundir::replace_file(
                &paths.requeue_count,
                format!("{requeues_before}\n").as_bytes(),
            );
            exit_code = 1;
            message = format!(
                "{preempted_message}; `scontrol requeue {job_id}` {why}, so the job was not \
                 requeued: {} to resume from its last checkpoint",
                opts.launch.run_again(&opts.paths.run_dir)
            );
            log.log_only(message.clone()).await;
            log.note(RunEvent::Failed {
                step: checkpoint.as_ref().map(|c| c.step),
                reason: message.clone(),
            })
            .await;
            error = Some(message.clone());
            unrecorded = write_result(&message, exit_code, false)
                .err()
                .map(unrecorded_because);
        }
    }
    let _ = records.send(Record::Stop).await;
    let _ = tokio::task::spawn_blocking(move || writer.join()).await;
    drop(lock);
    Ok(RunReport {
        outcome,
        exit_code,
        unrecorded,
        message,
        error,
    })
}

/// What launching and supervising the ranks needs from the job.
struct Ranks<'a> {
    opts: &'a ControllerOptions,
    listener: TcpListener,
    secret: &'a str,
    addr: &'a str,
    world_size: u64,
    config_hash: &'a str,
    /// The optimizer steps the job trains.
    steps: u64,
    records: &'a mpsc::Sender<Record>,
    /// The run directory's first failed write, when the job stops for one.
    run_dir_failed: Option<tokio::sync::oneshot::Receiver<String>>,
}

impl Ranks<'_> {
    /// Serves the rendezvous, launches the ranks and feeds everything that happens to them
    /// (and `signals`) to the job machine until the job is over; says how it ended, the
    /// steps all ranks completed, and the nodes srun said Slurm lost.
    async fn launch_and_watch(
        self,
        signals: mpsc::UnboundedReceiver<ControllerSignal>,
    ) -> (Outcome, Option<u64>, Vec<String>) {
        let Ranks {
            opts,
            listener,
            secret,
            addr,
            world_size,
            config_hash,
            steps,
            records,
            mut run_dir_failed,
        } = self;
        let paths = &opts.paths;
        let log = ControllerLog(records);
        let (events_tx, mut events) = mpsc::unbounded_channel::<ServerEvent>();
        let server_opts = ServerOptions {
            secret: secret.to_string(),
            handshake_timeout: shardrun_protocol::connection::HANDSHAKE_TIMEOUT,
            heartbeat_timeout: opts.timeouts.heartbeat,
            progress_timeout: opts.timeouts.progress,
            counts: CollectiveCounts::default(),
        };
        let counts = server_opts.counts.clone();
        let server = tokio::spawn(
            server::serve(listener, server_opts, events_tx.clone(), records.clone())
                .in_current_span(),
        );
        spawn_signal_forwarders(signals, events_tx.clone());

        for line in opts.rank_variables.lines() {
            log.say(line).await;
        }
        let spec = LaunchSpec {
            worker_bin: opts.worker_bin.clone(),
            world_size,
            env: opts
                .rank_variables
                .vars
                .iter()
                .cloned()
                .chain([
                    (env::CONTROLLER_ADDR.into(), addr.to_string()),
                    (env::SECRET_FILE.into(), paths.secret.display().to_string()),
                    (
                        env::CONFIG_FILE.into(),
                        paths.train_config.display().to_string(),
                    ),
                    (env::RUN_DIR.into(), paths.run_dir.display().to_string()),
                ])
                .collect(),
            mode: opts.launch.clone(),
        };
        let (exit_tx, mut exits) = mpsc::unbounded_channel();
        tracing::debug!(mode = ?spec.mode, worker = %spec.worker_bin.display(), world_size, "launching the ranks");
        // The step as Slurm is asked for it, for whoever reads why a step would not start.
        if let LaunchMode::Slurm {
            nodes,
            gpus_per_node,
            ..
        } = &spec.mode
        {
            let args = super::launcher::srun_args(world_size, (*nodes).max(1), *gpus_per_node);
            log.say(format!(
                "starting the ranks: srun {} {}",
                args.join(" "),
                spec.worker_bin.display()
            ))
            .await;
        }
        let Launched {
            launcher,
            procs,
            failed,
        } = Launcher::launch(&spec, exit_tx, records.clone());
        let signal_all = std::sync::Arc::new(launcher.signaller());

        let mut state =
            JobMachine::new(world_size, config_hash.to_string()).with_total_steps(steps);
        if matches!(spec.mode, LaunchMode::Slurm { .. }) {
            state = state.with_slurm_notices();
        }
        let mut conns: HashMap<ConnId, (mpsc::UnboundedSender<ToWorker>, AbortHandle)> =
            HashMap::new();
        let mut rejections = RejectionLog::default();
        // A process that cannot be started fails the job like a rank that dies: the ones that
        // did start are stopped, and the result says why.
        let mut pending = state.handle(match failed {
            None => Event::Launched { procs },
            Some(e) => Event::LaunchFailed {
                started: procs,
                rank: e.rank(),
                problem: e.to_string(),
            },
        });
        {
            let events_tx = events_tx.clone();
            let after = opts.timeouts.rendezvous;
            let several_nodes = matches!(spec.mode, LaunchMode::Slurm { nodes, .. } if nodes > 1);
            tokio::spawn(async move {
                tokio::time::sleep(after).await;
                let nodes = if several_nodes {
                    tokio::task::spawn_blocking(allocation_nodes)
                        .await
                        .unwrap_or_default()
                } else {
                    Vec::new()
                };
                let _ = events_tx.send(ServerEvent::Job(Event::RendezvousTimeout {
                    waited_secs: after.as_secs(),
                    nodes,
                }));
            });
        }

        let outcome = 'job: loop {
            for action in pending.drain(..) {
                tracing::debug!(?action, "carrying out");
                match action {
                    Action::Send { conn, msg } => {
                        if let Some((tx, _)) = conns.get(&conn) {
                            let _ = tx.send(msg);
                        }
                    }
                    Action::Close { conn } => {
                        if let Some((_, abort)) = conns.remove(&conn) {
                            abort.abort();
                        }
                    }
                    Action::Say(text) => log.say(text).await,
                    Action::Record(event) => log.note(event).await,
                    // The job machine has said which ranks it kills, and why.
                    Action::StopProcesses { force: true } => signal_all(libc::SIGKILL),
                    Action::StopProcesses { force: false } | Action::StopAtStepBoundary => {
                        let signal_all = signal_all.clone();
                        let t = opts.timeouts.clone();
                        let grace = if matches!(action, Action::StopAtStepBoundary) {
                            t.step_boundary
                        } else {
                            t.shutdown_grace
                        };
                        let events_tx = events_tx.clone();
                        tokio::spawn(async move {
                            tokio::time::sleep(grace).await;
                            let _ = events_tx.send(ServerEvent::Job(Event::Escalated));
                            signal_all(libc::SIGTERM);
                            tokio::time::sleep(t.kill_grace).await;
                            signal_all(libc::SIGKILL);
                        });
                    }
                    Action::WatchStopping => {
                        // A rank that never reaches the step boundary (hung in a collective, in
                        // I/O) is named while the job still has time: under Slurm the time
                        // limit's SIGKILL comes KillWait (30 s by default) after its SIGTERM.
                        let events_tx = events_tx.clone();
                        let counts = counts.clone();
                        tokio::spawn(async move {
                            let start = tokio::time::Instant::now();
                            for waited in STOP_OVERDUE_AFTER {
                                tokio::time::sleep_until(start + Duration::from_secs(waited)).await;
                                let lag = counts.lag(std::time::Instant::now(), STOP_LAG_STILL_FOR);
                                let overdue = Event::StopOverdue {
                                    waited_secs: waited,
                                    lag,
                                };
                                if events_tx.send(ServerEvent::Job(overdue)).is_err() {
                                    return;
                                }
                            }
                        });
                    }
                    Action::StartDrainTimer => {
                        let events_tx = events_tx.clone();
                        let after = opts.timeouts.drain;
                        tokio::spawn(async move {
                            tokio::time::sleep(after).await;
                            let _ = events_tx.send(ServerEvent::Job(Event::DrainTimeout));
                        });
                    }
                    Action::Finish(outcome) => break 'job outcome,
                }
            }
            let event = tokio::select! {
                // Events first: an `Escalated` must be seen before the exits it causes.
                biased;
                Some(ev) = events.recv() => ev,
                Some((proc, exit)) = exits.recv() => ServerEvent::Job(Event::ProcessExited { proc, exit }),
                why = async { run_dir_failed.as_mut().expect("guarded").await },
                    if run_dir_failed.is_some() =>
                {
                    run_dir_failed = None;
                    match why {
                        Ok(why) => ServerEvent::Job(Event::RunDirectoryUnwritable { why }),
                        Err(_) => continue 'job,
                    }
                }
            };
            match event {
                ServerEvent::Connected {
                    conn,
                    to_worker,
                    abort,
                } => {
                    conns.insert(conn, (to_worker, abort));
                }
                ServerEvent::Rejected { peer, reason } => {
                    tracing::debug!(%peer, reason, "refused a connection");
                    if let Some(text) = rejections.note(peer, &reason) {
                        log.say(text).await;
                    }
                }
                ServerEvent::Job(event) => {
                    match &event {
                        // Every heartbeat that advances: only when tracing everything.
                        Event::Progress { .. } => tracing::trace!(?event, "event"),
                        _ => tracing::debug!(?event, "event"),
                    }
                    if let Event::Disconnected { conn, .. } = &event {
                        conns.remove(conn);
                    }
                    pending = state.handle(event);
                }
            }
        };

        if let Some(text) = rejections.unreported() {
            log.say(text).await;
        }
        // A failed write the loop ended before reading is said all the same.
        if let Some(Ok(why)) = run_dir_failed.as_mut().map(|failed| failed.try_recv()) {
            log.say(format!(
                "cannot write the run directory's logs ({why}; is the disk full?): the end of \
                 the run is not fully recorded"
            ))
            .await;
        }
        // Every process has exited; their last output lines come before the verdict. Not
        // so when Slurm requeues the job: srun outlives this controller's KillWait, and the
        // ranks have said all there is (see `JobMachine::check_done`).
        server.abort();
        let drain = match outcome {
            Outcome::Preempted {
                notice: Notice::SlurmRequeue,
            } => SLURM_REQUEUE_DRAIN,
            _ => opts.timeouts.drain,
        };
        let srun_said = launcher.drain_output(drain).await;
        signal_all(libc::SIGKILL); // nothing should be left; make sure of it
        for (_, abort) in conns.values() {
            abort.abort();
        }
        let mut outcome = outcome;
        if let Outcome::Failed(failure) = &mut outcome {
            // Under srun a rank's death is seen as its connection ending: srun says how.
            let end = failure.rank.and_then(|r| srun_said.task_ends.get(&r));
            if let (None, Some(end)) = (failure.exit, end) {
                failure.exit = Some(*end);
            }
        }
        let outcome = cancelled_by_slurm(outcome, &state).await;
        (outcome, state.steps_done(), srun_said.lost_nodes)
    }
}

/// How long the ranks' last output lines may take to arrive once Slurm requeues the job:
/// the run's end must be on disk within KillWait (30 s by default, as little as 5 s).
const SLURM_REQUEUE_DRAIN: Duration = Duration::from_millis(500);

/// The nodes of this Slurm job's allocation (`scontrol show hostnames`, which expands
/// `SLURM_JOB_NODELIST`); empty when they cannot be had.
fn allocation_nodes() -> Vec<String> {
    let Ok(list) = std::env::var("SLURM_JOB_NODELIST") else {
        return Vec::new();
    };
    std::process::Command::new("scontrol")
        .args(["show", "hostnames", &list])
        .output()
        .ok()
        .filter(|out| out.status.success())
        .map(|out| {
            String::from_utf8_lossy(&out.stdout)
                .split_whitespace()
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// `scancel` signals the batch script and the ranks at once, so the job may end on what the
/// ranks said before the controller's own SIGTERM was heard (it asks Slurm first whether the
/// job is being requeued): taken for preempted (a starting rank killed, or ranks that
/// checkpointed for their own SIGTERM and stopped), or failed (srun's step ended by the
/// cancel). A job Slurm is ending itself (`squeue` says COMPLETING or CANCELLED while its
/// batch script still runs; a preempted job is RUNNING until it is killed) was cancelled:
/// said so, and not requeued.
async fn cancelled_by_slurm(outcome: Outcome, state: &JobMachine) -> Outcome {
    let by_the_cancel = match &outcome {
        Outcome::Preempted { .. } => !state.notice_received(),
        Outcome::Failed(failure) => {
            state.cancel_received().is_some()
                && matches!(
                    failure.cause,
                    FailureCause::Exited
                        | FailureCause::ExitedWithoutFinishing
                        | FailureCause::ConnectionLost { .. }
                )
        }
        _ => false,
    };
    if by_the_cancel && Notice::ended_by_slurm().await {
        Outcome::Cancelled {
            by: CancelledBy::Signal(state.cancel_received().unwrap_or(StopSignal::Terminate)),
            step: state.steps_done(),
        }
    } else {
        outcome
    }
}

/// The Slurm job this controller runs as, named as `squeue` and the run's manifest name it:
/// `<array>_<task>` for a task of a job array. Each task has a SLURM_JOB_ID of its own, and
/// one of them (the last to start) has the array's id, which `scontrol requeue` takes for
/// every task of the array.
fn this_slurm_job() -> Option<String> {
    let var = |name| std::env::var(name).ok().filter(|v| !v.is_empty());
    slurm_job_named(
        var("SLURM_JOB_ID"),
        var("SLURM_ARRAY_JOB_ID"),
        var("SLURM_ARRAY_TASK_ID"),
    )
}

fn slurm_job_named(
    job: Option<String>,
    array: Option<String>,
    task: Option<String>,
) -> Option<String> {
    match (array, task) {
        (Some(array), Some(task)) => Some(format!("{array}_{task}")),
        _ => job,
    }
}

/// Asks Slurm to requeue `job_id`; on success Slurm ends this batch script. The error says
/// why it could not be done.
fn requeue_slurm_job(job_id: &str) -> Result<(), String> {
    let output = std::process::Command::new("scontrol")
        .args(["requeue", job_id])
        .stdin(std::process::Stdio::null())
        .output();
    tracing::info!(slurm_job = job_id, ?output, "scontrol requeue");
    match output {
        Ok(out) if out.status.success() => Ok(()),
        Ok(out) => {
            let said = String::from_utf8_lossy(&out.stderr);
            let said = said.trim();
            Err(if said.is_empty() {
                format!("failed ({})", out.status)
            } else {
                format!("failed ({}: {said})", out.status)
            })
        }
        Err(e) => Err(format!("could not be run ({e})")),
    }
}

/// The newest checkpoint a run left, as `result.json` records it.
#[derive(Debug, Clone, Serialize)]
struct CheckpointLeft {
    step: u64,
    path: PathBuf,
}

/// Whether an attempt stopped by its time limit saved nothing past the checkpoint it started
/// from: requeued, the next attempt would spend its time the same way (the set-up lines,
/// starting the ranks, loading the model) and stop at the same place, until the requeues are
/// used up. A preemption is another matter: the next attempt may run to its time limit. So
/// is an attempt that prepared the data (the caller asks): the next finds it ready. A newest
/// checkpoint that cannot be read says nothing either way: requeued, the job says it resumes
/// from it once it reads.
fn time_limit_without_progress(notice: Notice, at_start: Option<u64>, at_end: &Newest) -> bool {
    let at_end = match at_end {
        Newest::Checkpoint(c) => Some(c.step),
        Newest::Nothing => None,
        Newest::Unreadable(_) => return false,
    };
    notice == Notice::TimeLimit && at_end <= at_start
}

/// What a stopped run has to resume from, as its words at the end tell it.
#[derive(Debug)]
enum Newest {
    Checkpoint(CheckpointLeft),
    /// No checkpoint committed, or only damaged ones (the ranks pass them over).
    Nothing,
    /// The newest checkpoint cannot be read (permissions, the file system), and why: not
    /// known to be damaged, it is neither resumed from nor passed over until it reads.
    Unreadable(String),
}

impl Newest {
    fn checkpoint(&self) -> Option<&CheckpointLeft> {
        match self {
            Newest::Checkpoint(c) => Some(c),
            Newest::Nothing | Newest::Unreadable(_) => None,
        }
    }
}

/// Checked by its seal and sizes only: the controller does not read the whole checkpoint.
fn newest_checkpoint(root: &Path) -> Newest {
    use shardrun_checkpoint::{find_latest_readable, CheckpointError, Verify};
    match find_latest_readable(root, Verify::Structure) {
        Ok(found) => match found.checkpoint {
            Some(c) => Newest::Checkpoint(CheckpointLeft {
                step: c.step(),
                path: c.dir().to_path_buf(),
            }),
            None => Newest::Nothing,
        },
        Err(CheckpointError::Unreadable {
            checkpoint, cause, ..
        }) => Newest::Unreadable(format!("{}: {cause}", checkpoint.display())),
        Err(e) => Newest::Unreadable(e.to_string()),
    }
}

/// Slurm requeueing the job (`scontrol requeue`, a failed node) sends SIGTERM to the batch
/// script and to the ranks: whichever arrived first (a stop, a checkpoint), the job is queued
/// again by Slurm, neither cancelled nor for the controller to requeue. The controller's own
/// SIGTERM was asked about when it came (the signal forwarder): here only a rank's that came
/// first, or the ranks' checkpoint.
async fn requeued_by_slurm(outcome: Outcome, under_slurm: bool) -> Outcome {
    let by_sigterm = match &outcome {
        // The controller's own too: Slurm may not have answered in time when it came.
        Outcome::Cancelled {
            by: by @ (CancelledBy::Rank { .. } | CancelledBy::Signal(_)),
            ..
        } => by.signal() == Some(StopSignal::Terminate),
        Outcome::Preempted { notice } => *notice != Notice::SlurmRequeue,
        _ => false,
    };
    if under_slurm && by_sigterm && Notice::requeued_by_slurm().await {
        Outcome::Preempted {
            notice: Notice::SlurmRequeue,
        }
    } else {
        outcome
    }
}

/// How the run ended, in a few words that follow "the run" / "it"; with the nodes Slurm
/// lost under it (`lost_nodes`, as srun named them) when it failed or was requeued.
fn ended_in_words(
    outcome: &Outcome,
    checkpoint: Option<&CheckpointLeft>,
    lost_nodes: &[String],
) -> String {
    let lost = match lost_nodes {
        [] => String::new(),
        [node] => format!(" (Slurm lost node {node})"),
        nodes => format!(" (Slurm lost nodes {})", nodes.join(", ")),
    };
    match outcome {
        Outcome::Succeeded => "finished".into(),
        Outcome::Failed(f) => format!("failed: {}{lost}", f.describe()),
        Outcome::Cancelled { by, step } => match step {
            Some(step) => format!("was cancelled by {by} after step {step}"),
            None => format!("was cancelled by {by}"),
        },
        Outcome::Preempted { notice } => match checkpoint {
            Some(c) => format!("{} after step {}{lost}", notice.ended(), c.step),
            None => format!("{}{lost}", notice.ended()),
        },
    }
}

/// `"; its newest checkpoint is step 100 (...)"`: what a stopped run has to resume from.
fn checkpoint_left(newest: &Newest, saves: &CheckpointConfig) -> String {
    match (newest, saves.resume) {
        (_, false) => "; it does not resume (`checkpoint.resume: false`)".to_string(),
        (Newest::Checkpoint(c), true) => format!(
            "; its newest checkpoint is step {} ({})",
            c.step,
            c.path.display()
        ),
        (Newest::Unreadable(why), true) => format!(
            "; its newest checkpoint cannot be read ({why}): not known to be damaged, it is \
             resumed from once it reads"
        ),
        (Newest::Nothing, true) => "; it has no checkpoint yet".to_string(),
    }
}

/// The last line of a failed run's report: where it stopped, and what running it again
/// does once the cause is fixed.
fn failed_resume_line(
    steps_done: Option<u64>,
    newest: &Newest,
    saves: &CheckpointConfig,
    launch: &LaunchMode,
    run_dir: &Path,
) -> String {
    let stopped = match steps_done {
        Some(step) if step > 0 => format!("the run stopped after step {step}"),
        _ => "the run stopped before it trained a step".to_string(),
    };
    let again = launch.run_again(run_dir);
    match (newest, saves.resume) {
        (_, false) => format!("{stopped}{}", checkpoint_left(newest, saves)),
        (Newest::Checkpoint(_), true) => format!(
            "{stopped}{}: once the cause is fixed, {again} to resume from it",
            checkpoint_left(newest, saves)
        ),
        (Newest::Unreadable(why), true) => format!(
            "{stopped}; its newest checkpoint cannot be read ({why}): once it reads and the \
             cause is fixed, {again} to resume from it"
        ),
        (Newest::Nothing, true) => format!(
            "{stopped} and has no checkpoint: once the cause is fixed, {again} to start it over"
        ),
    }
}

/// The last line of a run stopped where it diverged at `step`: its newest checkpoint is from
/// before (none is saved of weights that diverged), and resuming from it would train
/// the same steps into the same divergence, which is why re-runs refuse it.
fn diverged_resume_line(step: u64, newest: &Newest, remedies: &str, launch: &LaunchMode) -> String {
    // A sweep point's values are the sweep's: trained again as it was, it diverges again.
    let over = match launch {
        LaunchMode::Slurm {
            sweep_point: true, ..
        } => format!(
            "to try it with {remedies}, change the sweep's spec and run `shardrun sweep` again \
             (changed values are new points; deleting its directory would train it again as \
             it was)"
        ),
        _ => format!("add --force to start it over, with {remedies}"),
    };
    if let Newest::Unreadable(why) = newest {
        return format!(
            "its newest checkpoint cannot be read ({why}), and resumed from one saved before \
             it diverged it would diverge again at the same step: {over}"
        );
    }
    match newest.checkpoint().filter(|c| c.step < step) {
        Some(c) => format!(
            "its newest checkpoint, step {} ({}), is from before it diverged (its weights are \
             finite, not necessarily good), and resumed from there it would diverge again at \
             the same step: {over}",
            c.step,
            c.path.display()
        ),
        None => format!("it has no checkpoint from before it diverged: {over}"),
    }
}

/// The last line of a cancelled run: where it stopped, what it left, and what running it
/// again does. A cancel saves nothing, so a spec without periodic saves (no `checkpoint:`
/// section) has nothing to resume from: it starts over, and the line says so and how to
/// keep the progress next time.
fn cancelled_message(
    how_it_ended: &str,
    newest: &Newest,
    saves: &CheckpointConfig,
    launch: &LaunchMode,
    run_dir: &Path,
) -> String {
    if matches!(newest, Newest::Nothing) && saves.resume {
        let again = match launch {
            LaunchMode::Local { .. } => "running it again",
            LaunchMode::Slurm {
                sweep_point: false, ..
            } => "submitting it again",
            LaunchMode::Slurm {
                sweep_point: true, ..
            } => "`shardrun sweep` of its spec",
        };
        if !saves.saves_periodically() {
            return format!(
                "the run {how_it_ended}; its spec saves no checkpoints (it has no \
                 `checkpoint:` section), so {again} starts over at step 1; to resume after a \
                 stop, add one (e.g. `checkpoint: {{ interval_steps: 100 }}`)"
            );
        }
        return format!(
            "the run {how_it_ended} before its first checkpoint, so {again} starts over at \
             step 1"
        );
    }
    let left = checkpoint_left(newest, saves);
    if saves.resume {
        format!(
            "the run {how_it_ended}{left}; {}",
            how_to_resume(launch, run_dir)
        )
    } else {
        format!("the run {how_it_ended}{left}")
    }
}

fn how_to_resume(launch: &LaunchMode, run_dir: &Path) -> String {
    let again = format!("{} to resume", launch.run_again(run_dir));
    match (launch, std::env::current_dir()) {
        (LaunchMode::Local { forced: true, .. }, _) => {
            format!("{again} (not the same command again: its --force starts over)")
        }
        // The same spec run from another folder is another run (`run_root` is relative to
        // where `shardrun run` runs): say where, and the command that works from anywhere.
        (LaunchMode::Local { forced: false, .. }, Ok(here)) => format!(
            "{again} (in {}), or `shardrun run {}` from anywhere",
            here.display(),
            crate::output::pasteable(run_dir)
        ),
        _ => again,
    }
}

/// Turns SIGTERM / SIGINT / SIGHUP into cancellation and SIGUSR2 into preemption. The
/// handlers ([`Signals`]) only record a signal; the job machine acts.
///
/// SIGHUP is a closed terminal or ssh session: without a handler it would kill the
/// controller, leaving no result.json (see [`super::stop_signal::handled`] for `nohup`).
fn spawn_signal_forwarders(
    mut signals: mpsc::UnboundedReceiver<ControllerSignal>,
    events: mpsc::UnboundedSender<ServerEvent>,
) {
    tokio::spawn(async move {
        while let Some(signal) = signals.recv().await {
            tracing::debug!(?signal, "signal received");
            let event = match signal {
                // Slurm requeueing the job sends SIGTERM: the ranks (which Slurm signals too)
                // checkpoint, and the job is queued again by Slurm itself.
                ControllerSignal::Stop(StopSignal::Terminate)
                    if Notice::requeued_by_slurm().await =>
                {
                    Event::Preempt(Notice::SlurmRequeue)
                }
                ControllerSignal::Stop(signal) => Event::Cancel { signal },
                // One squeue call tells a preemption from the time limit.
                ControllerSignal::Preempt => Event::Preempt(Notice::of_this_job().await),
            };
            if events.send(ServerEvent::Job(event)).is_err() {
                return;
            }
        }
    });
}

/// Logs refused connections without letting a flood of them fill train.log: the first few
/// one by one, then a count at most every ten seconds.
#[derive(Default)]
struct RejectionLog {
    total: u64,
    unreported: u64,
    last_report: Option<std::time::Instant>,
}

impl RejectionLog {
    const INDIVIDUAL: u64 = 5;
    const EVERY: Duration = Duration::from_secs(10);

    fn note(&mut self, peer: std::net::SocketAddr, reason: &str) -> Option<String> {
        self.total += 1;
        if self.total <= Self::INDIVIDUAL {
            return Some(format!("refused a connection from {peer}: {reason}"));
        }
        self.unreported += 1;
        let due = self.last_report.is_none_or(|t| t.elapsed() >= Self::EVERY);
        if !due {
            return None;
        }
        self.last_report = Some(std::time::Instant::now());
        let n = std::mem::take(&mut self.unreported);
        Some(format!(
            "refused {n} more connection(s) ({} in all; latest from {peer}: {reason})",
            self.total
        ))
    }

    /// The refusals not yet counted in the log, said once the job ends: a flood that
    /// stopped between two counts is told in full.
    fn unreported(&self) -> Option<String> {
        (self.unreported > 0).then(|| {
            format!(
                "refused {} more connection(s) after the last count ({} in all)",
                self.unreported, self.total
            )
        })
    }
}

fn read_count(path: &Path) -> u32 {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// What a controller says when it cannot write the run's end (`result.json`), which
/// `status` looks for in a Slurm job's error file.
pub const END_NOT_RECORDED: &str = "the run's end is not recorded";

/// "training finished", and whether the loss or gradients went NaN or infinite, or the loss
/// blew up, on the way
/// ([`crate::step_record::StepRecord::diverged`]): a diverged run
/// trains to its last step (as PyTorch does), and its end must not read as a good one. The
/// newest checkpoint from before the divergence (in `checkpoint_root`), which the ranks keep
/// whatever `keep` says, is named: its weights are the last finite ones.
fn finished_message(
    metrics: &std::path::Path,
    checkpoint_root: Option<&Path>,
    remedies: &str,
) -> String {
    let metrics = crate::metrics_file::read(metrics).unwrap_or_default();
    // From the step that re-runs and sweeps refuse to continue past, so all say one step.
    let divergence = metrics.diverged_from();
    let steps = metrics.steps;
    let diverged: Vec<u64> = steps
        .iter()
        .filter(|r| divergence.is_some_and(|d| r.step >= d.step) && r.diverged())
        .map(|r| r.step)
        .collect();
    // A loss not finite, or blown up, at step 1 comes before any update: no learning rate
    // made it.
    let from_the_start = divergence.is_some_and(|d| d.step == 1)
        && steps
            .first()
            .is_some_and(|r| r.step == 1 && (!r.loss.is_finite() || r.loss_blew_up));
    let mut message = match divergence {
        None => "training finished".to_string(),
        Some(d) if from_the_start && d.blew_up => format!(
            "training finished, but {} from step 1, before any update, in {} of {} logged \
             steps: the weights it starts from score far worse than guessing (weights that do \
             not fit the model's config, or data tokenized for another model?), not the \
             learning rate",
            d.what(),
            diverged.len(),
            steps.len()
        ),
        Some(_) if from_the_start => format!(
            "training finished, but its loss was not finite (NaN or inf) from step 1, before \
             any update, in {} of {} logged steps: the weights it starts from (the model \
             folder) or the data hold a value that is not finite, not the learning rate",
            diverged.len(),
            steps.len()
        ),
        Some(d) => {
            let before = checkpoint_root.and_then(|root| {
                shardrun_checkpoint::naming::newest_complete_folder_before(root, d.step)
            });
            let first = d.step;
            let what = if d.blew_up {
                format!(
                    "{} from step {first}, and {} of {} logged steps show it diverged",
                    d.what(),
                    diverged.len(),
                    steps.len()
                )
            } else {
                format!(
                    "the loss or the gradients were not finite (NaN or inf) in {} of {} logged \
                     steps, from step {first}",
                    diverged.len(),
                    steps.len()
                )
            };
            format!(
                "training finished, but diverged: {what}; train it with {remedies}{}",
                match before {
                    Some(path) => format!(
                        "; the newest checkpoint from before, {}, holds {}",
                        path.display(),
                        if d.blew_up {
                            "the weights from before it blew up"
                        } else {
                            "the last finite weights"
                        }
                    ),
                    None => String::new(),
                }
            )
        }
    };
    let skipped = steps.iter().filter(|r| r.skipped_update()).count();
    if skipped > 0 {
        // Not divergence, but steps that trained nothing: a run that skips most of them has
        // a loss scale that cannot find a range the gradients fit in.
        message.push_str(&format!(
            "; the fp16 loss scaler skipped the update of {skipped} of {} logged steps (their \
             gradients overflowed){}",
            steps.len(),
            if skipped * 10 > steps.len() {
                ": so many that bf16 (float32's range) may suit this model better"
            } else {
                ""
            }
        ));
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;
    use shardrun_protocol::messages::StepMetrics;

    #[test]
    fn a_run_stopped_where_it_diverged_is_started_over_as_its_launch_allows() {
        let checkpoint = CheckpointLeft {
            step: 10,
            path: "/runs/r/checkpoints/step-10".into(),
        };
        let local = LaunchMode::Local {
            gpus: None,
            forced: false,
        };
        let checkpoint = Newest::Checkpoint(checkpoint);
        let line = diverged_resume_line(12, &checkpoint, &divergence_remedies(None), &local);
        assert!(
            line.starts_with("its newest checkpoint, step 10 (/runs/r/checkpoints/step-10), is from before it diverged")
                && line.ends_with("add --force to start it over, with a lower LR, gradient clipping (`optimizer.grad_clip`) or a longer warm-up"),
            "{line}"
        );
        // `shardrun submit --force` refuses a sweep's point: the sweep starts it over.
        let point = LaunchMode::Slurm {
            nodes: 1,
            gpus_per_node: 0,
            sweep_point: true,
        };
        let line = diverged_resume_line(
            12,
            &Newest::Nothing,
            &divergence_remedies(Some(1.0)),
            &point,
        );
        assert_eq!(
            line,
            "it has no checkpoint from before it diverged: to try it with a lower LR, \
             tighter gradient clipping (`optimizer.grad_clip` is 1) or a longer warm-up, change \
             the sweep's spec and run `shardrun sweep` again (changed values are new points; \
             deleting its directory would train it again as it was)"
        );
        // One that cannot be read is not said to be missing.
        let unreadable = Newest::Unreadable("step-10: Permission denied".into());
        let line = diverged_resume_line(12, &unreadable, &divergence_remedies(None), &local);
        assert!(
            line.starts_with("its newest checkpoint cannot be read (step-10: Permission denied)")
                && line.ends_with("add --force to start it over, with a lower LR, gradient clipping (`optimizer.grad_clip`) or a longer warm-up"),
            "{line}"
        );
    }

    /// The message of a finished run whose metrics.jsonl holds steps 1 to `steps`, each
    /// rank 0's record `step_of(step)` folded.
    fn finished_of(steps: u64, step_of: impl Fn(u64) -> StepMetrics) -> String {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("metrics.jsonl");
        let lines: Vec<String> = (1..=steps)
            .map(|step| {
                let record = crate::step_record::StepRecord::fold(&[step_of(step)], 0.0);
                serde_json::to_string(&record).unwrap()
            })
            .collect();
        std::fs::write(&path, lines.join("\n") + "\n").unwrap();
        finished_message(&path, None, &divergence_remedies(None))
    }

    /// A finished fp16 run of `steps` steps, each with `loss`, the updates of `skipped`
    /// skipped by the loss scaler.
    fn finished_with(loss: f64, skipped: &[u64], steps: u64) -> String {
        finished_of(steps, |step| StepMetrics {
            step,
            loss,
            grad_norm: if skipped.contains(&step) {
                f64::INFINITY
            } else {
                0.5
            },
            loss_scale: Some(1024.0),
            ..Default::default()
        })
    }

    #[test]
    fn only_a_time_limit_that_left_no_step_saved_is_not_requeued() {
        use Notice::*;
        let at = |step| {
            Newest::Checkpoint(CheckpointLeft {
                step,
                path: format!("/runs/r/checkpoints/step-{step}").into(),
            })
        };
        // No step saved past the start: the next attempt would do the same.
        assert!(time_limit_without_progress(TimeLimit, Some(40), &at(40)));
        assert!(time_limit_without_progress(
            TimeLimit,
            None,
            &Newest::Nothing
        ));
        // Steps saved: the next attempt goes on from further along.
        assert!(!time_limit_without_progress(TimeLimit, Some(40), &at(41)));
        assert!(!time_limit_without_progress(TimeLimit, None, &at(3)));
        // A newest checkpoint that cannot be read may well be past the start.
        let unreadable = Newest::Unreadable("step-41: Permission denied".into());
        assert!(!time_limit_without_progress(
            TimeLimit,
            Some(40),
            &unreadable
        ));
        // A preemption (or a signal of unknown cause) says nothing about the next attempt.
        for notice in [Preemption, Signal, SlurmRequeue] {
            assert!(!time_limit_without_progress(notice, Some(40), &at(40)));
        }
    }

    #[test]
    fn a_loss_not_finite_from_step_1_is_not_blamed_on_the_learning_rate() {
        let message = finished_with(f64::NAN, &[], 4);
        assert!(
            message.contains("from step 1, before any update, in 4 of 4 logged steps")
                && message.contains("the model folder")
                && !message.contains("lower the LR"),
            "{message}"
        );
    }

    /// A finished fp32 run of `steps` steps whose loss blew up (finite) from step `from` on.
    fn finished_blown_up(from: u64, steps: u64) -> String {
        finished_of(steps, |step| StepMetrics {
            step,
            loss: if step >= from { 4.2e5 } else { 5.0 },
            grad_norm: 0.5,
            loss_blew_up: step >= from,
            ..Default::default()
        })
    }

    #[test]
    fn a_loss_blown_up_while_finite_is_divergence_from_its_first_such_step() {
        assert_eq!(
            finished_blown_up(3, 5),
            "training finished, but diverged: its loss blew up (past 10 times a uniform \
             guess's) from step 3, and 3 of 5 logged steps show it diverged; train it with a \
             lower LR, gradient clipping (`optimizer.grad_clip`) or a longer warm-up"
        );
        // From step 1, before any update: the weights it starts from, not the learning rate.
        let message = finished_blown_up(1, 4);
        assert!(
            message.starts_with(
                "training finished, but its loss blew up (past 10 times a uniform guess's) \
                 from step 1, before any update, in 4 of 4 logged steps"
            ) && message.contains("data tokenized for another model?")
                && !message.contains("lower LR"),
            "{message}"
        );
    }

    #[test]
    fn a_finished_run_says_how_many_updates_the_fp16_loss_scaler_skipped() {
        let message = |skipped: &[u64], steps: u64| finished_with(2.0, skipped, steps);
        assert_eq!(message(&[], 20), "training finished");
        assert_eq!(
            message(&[1], 20),
            "training finished; the fp16 loss scaler skipped the update of 1 of 20 logged steps \
             (their gradients overflowed)"
        );
        let most = message(&[1, 2, 3, 5, 6, 8, 9], 10);
        assert!(
            most.starts_with(
                "training finished; the fp16 loss scaler skipped the update of 7 of 10"
            ) && most.ends_with("so many that bf16 (float32's range) may suit this model better"),
            "{most}"
        );
    }

    #[test]
    fn a_task_of_a_job_array_is_named_by_array_and_task() {
        let some = |s: &str| Some(s.to_string());
        // Task 1 of array 55 may run with SLURM_JOB_ID 55 itself: requeueing "55" would
        // requeue every task.
        assert_eq!(
            slurm_job_named(some("55"), some("55"), some("1")),
            some("55_1")
        );
        assert_eq!(
            slurm_job_named(some("71"), some("70"), some("0")),
            some("70_0")
        );
        assert_eq!(slurm_job_named(some("48"), None, None), some("48"));
        assert_eq!(slurm_job_named(None, None, None), None);
    }

    #[test]
    fn a_cancelled_run_says_what_running_it_again_does() {
        let local = LaunchMode::Local {
            gpus: None,
            forced: false,
        };
        let saves = |interval_steps, resume| CheckpointConfig {
            dir: None,
            interval_steps,
            interval_minutes: None,
            keep: 2,
            format: shardrun_protocol::config::CheckpointFormat::Sharded,
            resume,
            from: None,
        };
        let ended = "was cancelled by SIGTERM after step 566";
        let run_dir = Path::new("/runs/r");
        // No `checkpoint:` section: nothing saved, nothing to resume from.
        assert_eq!(
            cancelled_message(ended, &Newest::Nothing, &saves(None, true), &local, run_dir),
            "the run was cancelled by SIGTERM after step 566; its spec saves no checkpoints (it \
             has no `checkpoint:` section), so running it again starts over at step 1; to \
             resume after a stop, add one (e.g. `checkpoint: { interval_steps: 100 }`)"
        );
        // Periodic saves: the next run resumes, from its checkpoint when it has one.
        assert_eq!(
            cancelled_message(
                ended,
                &Newest::Nothing,
                &saves(Some(1000), true),
                &local,
                run_dir
            ),
            "the run was cancelled by SIGTERM after step 566 before its first checkpoint, so \
             running it again starts over at step 1"
        );
        let step_500 = Newest::Checkpoint(CheckpointLeft {
            step: 500,
            path: "/r/checkpoints/step-500".into(),
        });
        assert_eq!(
            cancelled_message(ended, &step_500, &saves(Some(100), true), &local, run_dir),
            format!(
                "the run was cancelled by SIGTERM after step 566; its newest checkpoint is step \
                 500 (/r/checkpoints/step-500); run the same command again to resume (in {}), \
                 or `shardrun run /runs/r` from anywhere",
                std::env::current_dir().unwrap().display()
            )
        );
        // Started with --force: the same command again would start over.
        let forced = LaunchMode::Local {
            gpus: None,
            forced: true,
        };
        assert_eq!(
            cancelled_message(ended, &step_500, &saves(Some(100), true), &forced, run_dir),
            "the run was cancelled by SIGTERM after step 566; its newest checkpoint is step 500 \
             (/r/checkpoints/step-500); run `shardrun run /runs/r` to resume (not the same \
             command again: its --force starts over)"
        );
        // A sweep point is submitted again by `shardrun sweep`; `shardrun submit` refuses it.
        let slurm = |sweep_point| LaunchMode::Slurm {
            nodes: 1,
            gpus_per_node: 0,
            sweep_point,
        };
        let resumes = |launch: &LaunchMode| {
            cancelled_message(ended, &step_500, &saves(Some(100), true), launch, run_dir)
        };
        // Submitted again by its run directory, which keeps the `--set` values it was run with.
        assert!(resumes(&slurm(false))
            .ends_with("; submit it again (`shardrun submit /runs/r`) to resume"));
        assert!(resumes(&slurm(true)).ends_with(
            "; run `shardrun sweep` on the sweep's spec again (it skips finished points) to resume"
        ));
        assert_eq!(
            cancelled_message(
                ended,
                &Newest::Nothing,
                &saves(None, false),
                &local,
                run_dir
            ),
            "the run was cancelled by SIGTERM after step 566; it does not resume \
             (`checkpoint.resume: false`)"
        );
    }

    /// A newest checkpoint that cannot be read (here its metadata, read by a thread without
    /// root's bypass of file permissions) is said so: it is neither "no checkpoint" (a re-run
    /// would not start over) nor one to resume from until it reads.
    #[test]
    fn a_checkpoint_that_cannot_be_read_is_not_taken_for_none() {
        use shardrun_checkpoint::naming::{COMPLETE_FILE, METADATA_FILE};
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let step = tmp.path().join("step-4");
        std::fs::create_dir(&step).unwrap();
        std::fs::write(step.join(COMPLETE_FILE), "").unwrap();
        let metadata = step.join(METADATA_FILE);
        std::fs::write(&metadata, "{}").unwrap();
        std::fs::set_permissions(&metadata, std::fs::Permissions::from_mode(0o000)).unwrap();
        let root = tmp.path().to_path_buf();
        let newest = std::thread::spawn(move || {
            // The file system user of this thread alone; root's CAP_DAC_OVERRIDE goes with it.
            // SAFETY: plain system calls on this thread's own credentials.
            unsafe { libc::setfsuid(65534) };
            let now = unsafe { libc::setfsuid(u32::MAX) };
            assert_ne!(now, 0, "this thread still reads files as root");
            newest_checkpoint(&root)
        })
        .join()
        .unwrap();
        let Newest::Unreadable(why) = &newest else {
            panic!("an unreadable checkpoint read as {newest:?}");
        };
        assert!(
            why.starts_with(&step.display().to_string())
                && why.contains("metadata.json")
                && why.contains("Permission denied"),
            "{why}"
        );

        let saves = CheckpointConfig {
            dir: None,
            interval_steps: Some(2),
            interval_minutes: None,
            keep: 2,
            format: shardrun_protocol::config::CheckpointFormat::Sharded,
            resume: true,
            from: None,
        };
        let local = LaunchMode::Local {
            gpus: None,
            forced: false,
        };
        let run_dir = Path::new("/runs/r");
        let why = "/runs/r/checkpoints/step-4: cannot open: Permission denied";
        let newest = Newest::Unreadable(why.into());
        assert_eq!(
            failed_resume_line(Some(5), &newest, &saves, &local, run_dir),
            format!(
                "the run stopped after step 5; its newest checkpoint cannot be read ({why}): \
                 once it reads and the cause is fixed, {} to resume from it",
                local.run_again(run_dir)
            )
        );
        let cancelled = cancelled_message(
            "was cancelled by SIGTERM after step 5",
            &newest,
            &saves,
            &local,
            run_dir,
        );
        assert!(
            cancelled.starts_with(&format!(
                "the run was cancelled by SIGTERM after step 5; its newest checkpoint cannot be \
                 read ({why}): not known to be damaged, it is resumed from once it reads; run \
                 the same command again to resume"
            )),
            "{cancelled}"
        );
        assert!(!cancelled.contains("starts over"), "{cancelled}");
    }

    #[test]
    fn rejections_are_summarised() {
        let mut log = RejectionLog::default();
        let peer: std::net::SocketAddr = "127.0.0.1:1".parse().unwrap();
        assert_eq!(log.unreported(), None);
        let printed = (0..1000).filter_map(|_| log.note(peer, "garbage")).count();
        assert_eq!(printed, RejectionLog::INDIVIDUAL as usize + 1);
        // The first past the few is counted at once; the rest when the job ends.
        assert_eq!(
            log.unreported().as_deref(),
            Some("refused 994 more connection(s) after the last count (1000 in all)")
        );
    }
}
