//! Where a worker's log lines and metrics go. The training loop only sees [`Reporter`]; the
//! controller client implements it over TCP, [`StdoutReporter`] serves standalone runs
//! (torchrun-style launches and tests).

use shardrun_protocol::messages::{EvalMetrics, LogLevel, StepMetrics, TrainSummary};
use std::io::Write;
use std::path::PathBuf;
use std::sync::Mutex;

pub trait Reporter: Send + Sync {
    /// One log line. Must have reached the OS (socket or pipe) when this returns, so a crash
    /// right after loses nothing.
    fn log(&self, level: LogLevel, text: &str);
    fn metrics(&self, metrics: &StepMetrics);
    /// Rank 0 committed the checkpoint of `step` at `path`, and logged a line saying so:
    /// recorded in the run's events under a controller.
    fn checkpoint_saved(&self, step: u64, path: &str);
    fn summary(&self, summary: &TrainSummary);
    /// One evaluation on the validation data (rank 0 reports it).
    fn eval(&self, metrics: &EvalMetrics) {
        self.log(
            LogLevel::Info,
            &format!(
                "eval after step {}: loss {:.4}",
                metrics.step, metrics.eval_loss
            ),
        );
    }
    /// Training continues from the checkpoint of `step` at `path` (rank 0, once): recorded
    /// in the run's events under a controller.
    fn resumed(&self, _step: u64, _path: &str) {}
    /// True once the controller asked for preemption (checkpoint at the next step boundary,
    /// then exit cleanly). Ranks must agree on it collectively before acting.
    fn preempt_requested(&self) -> bool;
    /// `step` optimizer steps are done (heartbeats carry it, so the controller sees a rank
    /// that keeps beating but stops making progress).
    fn step_done(&self, _step: u64) {}
    /// Whether the job's log already describes the training data: a controller prepares
    /// it and says what it is before any rank starts, so the ranks need not say it again.
    fn data_described(&self) -> bool {
        false
    }
}

/// Data preparation's messages into a rank's log: rank 0 tells, every rank warns.
pub struct ReporterObserver<'a> {
    reporter: &'a dyn Reporter,
    rank: u64,
}

impl<'a> ReporterObserver<'a> {
    pub fn new(reporter: &'a dyn Reporter, rank: u64) -> Self {
        ReporterObserver { reporter, rank }
    }
}

impl shardrun_data::Observer for ReporterObserver<'_> {
    fn line(&self, text: &str) {
        if let Some(warning) = text.strip_prefix("warning: ") {
            self.reporter.log(LogLevel::Warn, warning);
        } else if self.rank == 0 {
            self.reporter.log(LogLevel::Info, text);
        }
    }
}

/// Standalone runs: log lines to stderr as `[rank R] text`, metrics as JSON lines appended to
/// `metrics_file` when given.
pub struct StdoutReporter {
    rank: u64,
    metrics_file: Option<Mutex<std::fs::File>>,
}

impl StdoutReporter {
    pub fn new(rank: u64, metrics_file: Option<PathBuf>) -> std::io::Result<Self> {
        let metrics_file = metrics_file
            .map(|path| {
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
            })
            .transpose()?
            .map(Mutex::new);
        Ok(StdoutReporter { rank, metrics_file })
    }
}

impl StdoutReporter {
    /// One line of the metrics file, when there is one.
    fn append(&self, line: &str) {
        if let Some(file) = &self.metrics_file {
            let mut file = file.lock().unwrap_or_else(|e| e.into_inner());
            let _ = writeln!(file, "{line}");
        }
    }
}

impl Reporter for StdoutReporter {
    fn log(&self, level: LogLevel, text: &str) {
        let tag = match level {
            LogLevel::Debug => "debug: ",
            LogLevel::Info => "",
            LogLevel::Warn => "warning: ",
            LogLevel::Error => "error: ",
        };
        let mut err = std::io::stderr().lock();
        let _ = writeln!(err, "[rank {}] {tag}{text}", self.rank);
    }

    fn metrics(&self, metrics: &StepMetrics) {
        self.append(&serde_json::to_string(metrics).expect("metrics serialize"));
    }

    fn eval(&self, metrics: &EvalMetrics) {
        self.append(&serde_json::to_string(metrics).expect("metrics serialize"));
    }

    // The checkpointer's own line says it, with the kind, time and size.
    fn checkpoint_saved(&self, _step: u64, _path: &str) {}

    fn summary(&self, summary: &TrainSummary) {
        let text = serde_json::to_string(summary).expect("summary serializes");
        self.log(LogLevel::Info, &format!("summary {text}"));
    }

    fn preempt_requested(&self) -> bool {
        false
    }
}
