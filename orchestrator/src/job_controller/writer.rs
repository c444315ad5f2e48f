//! The one thread that writes a run's files and the console. Connections and output pipes
//! hand it [`Record`]s through a bounded queue (so a flood of lines slows the senders down
//! instead of growing memory); it writes everything queued, then flushes once the queue is
//! empty, which keeps `tail -f` current without a system call per line under load.
//! Besides the logs it writes the metrics files ([`MetricsLog`]) and `events.jsonl`.

use super::console::Console;
use super::logbook::{LogBook, Source};
use super::metrics_log::MetricsLog;
use crate::events_file::{EventRecord, RunEvent};
use shardrun_protocol::messages::{EvalMetrics, LogLevel, LogLine, StepMetrics, TrainSummary};
use shardrun_protocol::mib;
use std::path::PathBuf;
use tokio::sync::{mpsc, oneshot};

/// Records queued at most before senders wait. With lines capped at
/// [`super::server::MAX_LOG_LINE`] this bounds the queue's memory.
pub const QUEUE_CAPACITY: usize = 4096;

pub enum Record {
    /// Reported lines of one rank, in order.
    Logs {
        rank: u64,
        lines: Vec<LogLine>,
    },
    /// Raw output of a worker process (`rank` unknown for the launcher's own lines).
    Raw {
        rank: Option<u64>,
        stderr: bool,
        text: String,
        time: f64,
    },
    Metrics(StepMetrics),
    Eval(EvalMetrics),
    Summary {
        rank: u64,
        summary: TrainSummary,
    },
    Checkpoint {
        rank: u64,
        step: u64,
        path: String,
    },
    /// Rank `rank` (rank 0) loaded the checkpoint of `step` and trains on from it.
    Resumed {
        rank: u64,
        step: u64,
        path: String,
    },
    /// Something that happened to the run, for `events.jsonl`.
    Event(RunEvent),
    /// The controller's own message: train.log and the console.
    Controller(String),
    /// The controller's own message for train.log only: the command prints it itself, on
    /// stderr, as the error it ends with.
    ControllerToLog(String),
    /// The last lines of a rank, for a failure report (after everything queued before).
    Recent {
        rank: u64,
        reply: oneshot::Sender<Vec<String>>,
    },
    /// Answered once everything queued before is on disk.
    Flush(oneshot::Sender<()>),
    /// Write everything queued before, then end the thread.
    Stop,
}

/// What the controller itself writes through the writer: its own lines and the run's events.
#[derive(Clone, Copy)]
pub struct ControllerLog<'a>(pub &'a mpsc::Sender<Record>);

impl ControllerLog<'_> {
    /// A line for train.log and stdout.
    pub async fn say(self, text: String) {
        let _ = self.0.send(Record::Controller(text)).await;
    }

    /// A line for train.log only (the command prints it, as its error).
    pub async fn log_only(self, text: String) {
        let _ = self.0.send(Record::ControllerToLog(text)).await;
    }

    /// Something that happened to the run, for its events record.
    pub async fn note(self, event: RunEvent) {
        let _ = self.0.send(Record::Event(event)).await;
    }
}

/// Which ranks' lines also go to the console (train.log always has all of them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Echo {
    /// Rank 0's lines, plus warnings, errors and raw stderr of every rank.
    Rank0,
    All,
    /// Only controller messages and progress.
    None,
}

pub struct WriterFiles {
    pub train_log: PathBuf,
    pub logs_dir: PathBuf,
    pub metrics: PathBuf,
    pub events: PathBuf,
    /// Ranks reporting each step (a step's record waits for all of them).
    pub world_size: u64,
}

/// The writer thread, as [`spawn`] starts it.
pub struct Writer {
    pub records: mpsc::Sender<Record>,
    pub thread: std::thread::JoinHandle<()>,
    /// The error of the first write that failed (`"No space left on device (os error 28)"`):
    /// the job cannot go on recorded.
    pub failed: oneshot::Receiver<String>,
}

pub fn spawn(files: &WriterFiles, mut console: Console, echo: Echo) -> std::io::Result<Writer> {
    let mut book = LogBook::open(&files.train_log, &files.logs_dir)?;
    let mut metrics = MetricsLog::open(&files.metrics, &files.logs_dir, files.world_size)?;
    let mut events = EventsLog::open(&files.events)?;
    let run_dir = files
        .train_log
        .parent()
        .unwrap_or(std::path::Path::new("."))
        .to_path_buf();
    let (tx, mut rx) = mpsc::channel::<Record>(QUEUE_CAPACITY);
    let (failed_tx, failed) = oneshot::channel();
    let thread = std::thread::Builder::new()
        .name("run-dir-writer".into())
        .spawn(move || {
            let mut on_failure = Some(failed_tx);
            let mut said = false;
            while let Some(first) = rx.blocking_recv() {
                let mut next = Some(first);
                let mut result = Ok(());
                let mut stop = false;
                while let Some(record) = next.take() {
                    if matches!(record, Record::Stop) {
                        stop = true;
                        if let Err(e) = metrics.finish(super::clock::now()) {
                            result = Err(e);
                        }
                        break;
                    }
                    let mut files = Files {
                        book: &mut book,
                        metrics: &mut metrics,
                        events: &mut events,
                    };
                    if let Err(e) = write(&mut files, &mut console, echo, record) {
                        result = Err(e);
                    }
                    next = rx.try_recv().ok();
                }
                let flushed = book
                    .flush()
                    .and_then(|()| metrics.flush())
                    .and_then(|()| events.flush());
                if let Err(e) = result.and(flushed) {
                    // Said once: by the job's controller, with what it does about it, while
                    // it listens; else here. Only a disk that takes nothing more stops the
                    // job: a passing error (an NFS timeout) is said here, and training goes on.
                    let to_controller = on_failure
                        .take_if(|_| no_room(&e))
                        .is_some_and(|tell| tell.send(e.to_string()).is_ok());
                    if !std::mem::replace(&mut said, true) && !to_controller {
                        console.line(&format!(
                            "shardrun: cannot write the run directory's logs in {} ({e}); is \
                             the disk full?",
                            run_dir.display()
                        ));
                    }
                }
                if stop {
                    break;
                }
            }
            console.finish();
        })?;
    Ok(Writer {
        records: tx,
        thread,
        failed,
    })
}

/// Whether `e` says the run directory takes nothing more: full, over quota, past a size
/// limit, read-only, or no longer this user's to write.
fn no_room(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOSPC | libc::EDQUOT | libc::EFBIG | libc::EROFS | libc::EACCES | libc::EPERM)
    )
}

/// The files the writer thread holds open.
struct Files<'a> {
    book: &'a mut LogBook,
    metrics: &'a mut MetricsLog,
    events: &'a mut EventsLog,
}

fn write(
    files: &mut Files,
    console: &mut Console,
    echo: Echo,
    record: Record,
) -> std::io::Result<()> {
    let Files {
        book,
        metrics,
        events,
    } = files;
    match record {
        Record::Logs { rank, lines } => {
            for line in lines {
                let body = book.rank_line(
                    Some(rank),
                    Source::Reported(line.level),
                    line.time,
                    &line.text,
                );
                let loud = matches!(line.level, LogLevel::Warn | LogLevel::Error);
                if echoes(echo, rank, loud) {
                    console.line(&format!("[rank {rank}] {body}"));
                }
            }
        }
        Record::Raw {
            rank,
            stderr,
            text,
            time,
        } => {
            let source = if stderr {
                Source::Stderr
            } else {
                Source::Stdout
            };
            let body = book.rank_line(rank, source, time, &text);
            match rank {
                Some(rank) if echoes(echo, rank, stderr) => {
                    console.line(&format!("[rank {rank}] {body}"))
                }
                None if echo != Echo::None => console.line(&format!("[launcher] {body}")),
                _ => {}
            }
        }
        // The console goes on when the files cannot take a record (a full disk): the
        // error is told once the record is shown.
        Record::Metrics(m) => {
            let written = metrics.rank_record(&m, super::clock::now());
            // Without a bar, rank 0's own step lines are already echoed when echo is on: a
            // summary line per step would repeat each of them.
            if m.rank == 0 && (console.has_bar() || echo == Echo::None) {
                console.progress(&m);
            }
            written?;
        }
        Record::Eval(e) => {
            let written = metrics.record(&e);
            // Rank 0 logs its own eval line: the console shows this one only in its place.
            if !echoes(echo, 0, false) {
                console.line(&super::console::format_eval(&e));
            }
            written?;
        }
        Record::Summary { rank, summary } => {
            let eval = match (summary.eval_loss, summary.eval_perplexity) {
                (Some(loss), Some(ppl)) => {
                    format!(", validation loss {loss:.4} (perplexity {ppl:.2})")
                }
                _ => String::new(),
            };
            let text = format!(
                "summary: {} on {}, {}, {}, model state {:.1} MiB/rank \
                 (unsharded {:.1} MiB), peak memory {}, {:.0} tokens/s{eval}",
                summary.strategy,
                crate::resolve::ranks_words(summary.world_size),
                summary.steps_words(),
                summary.losses_words(),
                mib(summary.model_state_bytes_per_rank),
                mib(summary.unsharded_model_state_bytes),
                summary.peak_memory_words(),
                summary.mean_tokens_per_s
            );
            controller_noted_line(book, console, rank, &text)?;
        }
        Record::Checkpoint { rank, step, path } => {
            // The rank logged its own line (the kind of checkpoint, time, size) for train.log:
            // the console shows this one only in its place.
            if !echoes(echo, rank, false) {
                console.line(&format!(
                    "{} checkpoint of step {step} saved to {path}",
                    super::clock::format_time_of_day(super::clock::now())
                ));
            }
            events.record(RunEvent::Checkpoint { step, path })?;
        }
        Record::Resumed {
            rank: _,
            step,
            path,
        } => {
            // Rank 0 has logged its own line about it; this is for the record. Its mark in
            // metrics.jsonl comes before anything this attempt logs (rank 0 sends this
            // first), so readers drop what the earlier attempt logged after `step`.
            metrics.resumed_at(step)?;
            events.record(RunEvent::Resumed { step, path })?;
        }
        Record::Event(mut event) => {
            // The controller's own idea of the step comes from heartbeats, seconds apart;
            // the metrics say where the ranks were.
            if let RunEvent::Failed { step, .. } = &mut event {
                *step = (*step).max(metrics.last_step_of_all());
            }
            events.record(event)?
        }
        Record::Controller(text) => {
            // Shown even when the log cannot take it (a full disk: the line may say so).
            let written = book.controller_line(&text);
            console.line(&format!("shardrun: {text}"));
            written?;
        }
        Record::ControllerToLog(text) => book.controller_line(&text)?,
        Record::Recent { rank, reply } => {
            let _ = reply.send(book.recent(rank));
        }
        Record::Flush(reply) => {
            book.flush()?;
            metrics.flush()?;
            events.flush()?;
            let _ = reply.send(());
        }
        Record::Stop => {}
    }
    Ok(())
}

/// A line the controller writes on a rank's behalf from a structured message (the
/// summary): logged as that rank's info line and always echoed.
fn controller_noted_line(
    book: &mut LogBook,
    console: &Console,
    rank: u64,
    text: &str,
) -> std::io::Result<()> {
    book.rank_line(
        Some(rank),
        Source::Reported(LogLevel::Info),
        super::clock::now(),
        text,
    );
    console.line(&format!("[rank {rank}] {text}"));
    Ok(())
}

fn echoes(echo: Echo, rank: u64, loud: bool) -> bool {
    match echo {
        Echo::All => true,
        Echo::Rank0 => rank == 0 || loud,
        Echo::None => false,
    }
}

/// `events.jsonl` (see [`crate::events_file`]), appended to.
struct EventsLog {
    file: std::io::BufWriter<std::fs::File>,
}

impl EventsLog {
    fn open(path: &std::path::Path) -> std::io::Result<EventsLog> {
        let file = crate::rundir::line_files::append_lines(path)?;
        Ok(EventsLog {
            file: std::io::BufWriter::new(file),
        })
    }

    fn record(&mut self, event: RunEvent) -> std::io::Result<()> {
        use std::io::Write;
        let record = EventRecord {
            time: super::clock::now(),
            event,
        };
        serde_json::to_writer(&mut self.file, &record)?;
        self.file.write_all(b"\n")
    }

    fn flush(&mut self) -> std::io::Result<()> {
        use std::io::Write;
        self.file.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the console shows for rank 0's eval and checkpoint lines and their records, with
    /// `echo` and with or without a progress bar; and train.log.
    fn shown(echo: Echo, bar: bool) -> (Vec<String>, String) {
        let dir = tempfile::tempdir().unwrap();
        let files = WriterFiles {
            train_log: dir.path().join("train.log"),
            logs_dir: dir.path().join("logs"),
            metrics: dir.path().join("metrics.jsonl"),
            events: dir.path().join("events.jsonl"),
            world_size: 2,
        };
        let mut book = LogBook::open(&files.train_log, &files.logs_dir).unwrap();
        let mut metrics = MetricsLog::open(&files.metrics, &files.logs_dir, 2).unwrap();
        let mut events = EventsLog::open(&files.events).unwrap();
        let mut console = Console::capturing(40, bar);
        let own_line = |text: &str| Record::Logs {
            rank: 0,
            lines: vec![LogLine {
                level: LogLevel::Info,
                time: 0.0,
                text: text.into(),
            }],
        };
        let records = [
            own_line("eval after step 20 | loss 3.2744 | perplexity 26.43 | 4096 tokens | 0.10 s"),
            Record::Eval(EvalMetrics {
                rank: 0,
                step: 20,
                eval_loss: 3.2744,
                eval_perplexity: 26.43,
                eval_tokens: 4096,
                eval_time_s: 0.1,
            }),
            own_line("interval checkpoint of step 20 saved to /r/checkpoints/step-20 in 0.02 s (1 MB, 50 MB/s)"),
            Record::Checkpoint {
                rank: 0,
                step: 20,
                path: "/r/checkpoints/step-20".into(),
            },
        ];
        for record in records {
            let mut files = Files {
                book: &mut book,
                metrics: &mut metrics,
                events: &mut events,
            };
            write(&mut files, &mut console, echo, record).unwrap();
        }
        book.flush().unwrap();
        (
            console.captured(),
            std::fs::read_to_string(&files.train_log).unwrap(),
        )
    }

    #[test]
    fn only_a_disk_that_takes_nothing_more_stops_the_job() {
        let error = |code| std::io::Error::from_raw_os_error(code);
        for code in [
            libc::ENOSPC,
            libc::EDQUOT,
            libc::EFBIG,
            libc::EROFS,
            libc::EACCES,
        ] {
            assert!(no_room(&error(code)), "{}", error(code));
        }
        for code in [libc::EIO, libc::ETIMEDOUT, libc::EINTR] {
            assert!(!no_room(&error(code)), "{}", error(code));
        }
    }

    #[test]
    fn an_eval_and_a_checkpoint_are_one_line_each_on_the_console() {
        for echo in [Echo::Rank0, Echo::All, Echo::None] {
            for bar in [false, true] {
                let (console, log) = shown(echo, bar);
                let count = |what: &str| console.iter().filter(|l| l.contains(what)).count();
                assert_eq!(
                    count("eval after step 20"),
                    1,
                    "{echo:?} {bar}: {console:?}"
                );
                assert_eq!(
                    count("checkpoint of step 20 saved to /r/checkpoints/step-20"),
                    1,
                    "{echo:?} {bar}: {console:?}"
                );
                assert_eq!(console.len(), 2, "{echo:?} {bar}: {console:?}");
                // train.log has the rank's own lines, once.
                assert_eq!(log.lines().count(), 2, "{log}");
                assert!(
                    log.contains("[rank 0] interval checkpoint of step 20 saved to"),
                    "{log}"
                );
            }
        }
        // Where rank 0's lines are echoed, they are the ones shown.
        let (console, _) = shown(Echo::Rank0, true);
        assert_eq!(
            console,
            [
                "[rank 0] eval after step 20 | loss 3.2744 | perplexity 26.43 | 4096 tokens | 0.10 s",
                "[rank 0] interval checkpoint of step 20 saved to /r/checkpoints/step-20 in 0.02 s (1 MB, 50 MB/s)",
            ]
        );
    }
}
