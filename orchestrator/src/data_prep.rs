//! Preparing a job's training data before any rank starts: on the login node with
//! `shardrun prepare`, and in the job's controller before it launches the ranks, so one
//! process tokenizes (on every core the allocation gives it) and the ranks only map the
//! cache. Concurrent jobs of a sweep sharing the data wait on the cache's lock instead of
//! tokenizing it again.

use anyhow::Context;
use shardrun_data::{Dataset, Observer};
use shardrun_protocol::config::DataConfig;
use shardrun_protocol::TrainConfig;

/// The console: `shardrun: ` lines on stdout (the job's output file under Slurm), and a
/// progress bar on stderr when it is a terminal.
struct Console;

impl Observer for Console {
    fn line(&self, text: &str) {
        outln!("shardrun: {text}");
    }
    fn wants_bar(&self) -> bool {
        true
    }
}

/// Prepares `config`'s data (nothing for synthetic data) and returns the description of what
/// the ranks will read.
pub fn prepare_data(config: &TrainConfig, threads: Option<usize>) -> anyhow::Result<Vec<String>> {
    let DataConfig::Dataset(data) = &config.data else {
        return Ok(vec!["synthetic data: nothing to prepare".into()]);
    };
    let vocab_size = config.model.vocab_size();
    let threads = threads.unwrap_or_else(shardrun_data::default_threads);
    let dataset = Dataset::open(data, config.seed, vocab_size, threads, &Console)
        .context("preparing the training data")?;
    let mut lines = dataset.summary().to_vec();
    lines.push(format!(
        "{} sample(s) per epoch, {:.2} epoch(s) in {} steps of {} samples",
        shardrun_data::dataset::thousands(dataset.samples_per_epoch()),
        (config.steps * config.batch.total_batch_size) as f64 / dataset.samples_per_epoch() as f64,
        config.steps,
        config.batch.total_batch_size
    ));
    Ok(lines)
}

/// The controller's step before launching: the data ready, or the reason the job cannot run.
pub fn before_launch(config: &TrainConfig) -> anyhow::Result<()> {
    if matches!(config.data, DataConfig::Synthetic { .. }) {
        return Ok(());
    }
    for line in prepare_data(config, None)? {
        outln!("shardrun: {line}");
    }
    Ok(())
}
