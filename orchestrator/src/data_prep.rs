//! Preparing a job's training data before any rank starts: on the login node with
//! `shardrun prepare`, and in the job's controller before it launches the ranks, so one
//! process tokenizes (on every core the allocation gives it) and the ranks only map the
//! cache. Concurrent jobs of a sweep sharing the data wait on the cache's lock instead of
//! tokenizing it again.

use crate::job_controller::logbook::LogBook;
use crate::rerun::newest_checkpoint;
use crate::resume_data;
use crate::rundir::RunDir;
use anyhow::Context;
use shardrun_data::{DataIdentity, Dataset, Observer};
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
    match open_dataset(config, threads)? {
        Some(dataset) => Ok(describe(config, &dataset)),
        None => Ok(vec!["synthetic data: nothing to prepare".into()]),
    }
}

/// Prepares `config`'s data (nothing for synthetic data) and returns what it is made of.
pub fn prepare_identity(config: &TrainConfig) -> anyhow::Result<Option<DataIdentity>> {
    Ok(open_dataset(config, None)?.map(|dataset| dataset.identity().clone()))
}

/// The config's documents, prepared; `None` for synthetic data.
fn open_dataset(config: &TrainConfig, threads: Option<usize>) -> anyhow::Result<Option<Dataset>> {
    let DataConfig::Dataset(data) = &config.data else {
        return Ok(None);
    };
    let vocab_size = config.model.vocab_size();
    let threads = threads.unwrap_or_else(shardrun_data::default_threads);
    let dataset = Dataset::open(data, config.seed, vocab_size, threads, &Console)
        .context("preparing the training data")?;
    // Checked here, once, not by every rank: a cache damaged in place trains as other data
    // (one this call has just written is as its hash says).
    if !dataset.built() {
        dataset
            .verify_content()
            .context("checking the prepared training data")?;
    }
    Ok(Some(dataset))
}

fn describe(config: &TrainConfig, dataset: &Dataset) -> Vec<String> {
    let mut lines = dataset.summary().to_vec();
    lines.push(format!(
        "{} sample(s) per epoch, {} epoch(s) in {} steps of {} samples",
        shardrun_data::dataset::thousands(dataset.samples_per_epoch()),
        epochs_shown(
            (config.steps * config.batch.total_batch_size) as f64
                / dataset.samples_per_epoch() as f64
        ),
        config.steps,
        config.batch.total_batch_size
    ));
    lines.extend(fewer_samples_than_a_step(
        dataset.samples_per_epoch(),
        config.batch.total_batch_size,
    ));
    lines
}

/// Epochs to two decimals, less than a tenth of one to its first two figures (`0.0030`, not
/// `0.00`; `0.014`, not `0.01`).
fn epochs_shown(epochs: f64) -> String {
    let decimals = if epochs > 0.0 && epochs < 0.1 {
        (1 - epochs.log10().floor() as i32) as usize
    } else {
        2
    };
    format!("{epochs:.decimals$}")
}

/// Data that fills less than one optimizer step: every step trains each sample several
/// times over (a tiny file with a long `seq_len`, one mostly padding sequence).
fn fewer_samples_than_a_step(samples: u64, total_batch_size: u64) -> Option<String> {
    (samples < total_batch_size).then(|| {
        format!(
            "warning: the training data makes {samples} sample(s), fewer than one step's \
             total_batch_size of {total_batch_size}: every step trains each of them {:.1} \
             times over; use more data, a shorter seq_len or a smaller total_batch_size",
            total_batch_size as f64 / samples.max(1) as f64
        )
    })
}

/// The controller's step before launching: the data ready and, for a run that resumes, the
/// data its checkpoint was trained on ([`resume_data::DataChanged`] when not); or the reason
/// the job cannot run. Records what the data is made of in the run directory. Whether it
/// tokenized anything (a cache the next attempt finds ready).
pub fn before_launch(run: &RunDir, config: &TrainConfig) -> anyhow::Result<bool> {
    let Some(dataset) = open_dataset(config, None)? else {
        return Ok(false);
    };
    let description = describe(config, &dataset);
    for line in &description {
        outln!("shardrun: {line}");
    }
    let resumed = newest_checkpoint(run, config).filter(|_| config.checkpoint.resume);
    if let Some(checkpoint) = &resumed {
        resume_data::check(run, checkpoint, dataset.identity()).map_err(|e| *e)?;
    }
    run.write_data_identity(dataset.identity())?;
    describe_in_train_log(run, &description)
        .with_context(|| format!("cannot write {}", run.train_log().display()))?;
    Ok(dataset.built())
}

/// `train.log` is what people follow: the data is described there once, by the controller
/// (the ranks leave it to the controller).
fn describe_in_train_log(run: &RunDir, description: &[String]) -> std::io::Result<()> {
    let mut book = LogBook::open(&run.train_log(), &run.logs_dir())?;
    for line in description {
        book.controller_line(line)?;
    }
    book.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_smaller_than_one_step_is_warned_of() {
        let warning = fewer_samples_than_a_step(1, 4).expect("a warning");
        assert!(
            warning.starts_with("warning: the training data makes 1 sample(s)")
                && warning.contains("trains each of them 4.0 times over"),
            "{warning}"
        );
        assert_eq!(fewer_samples_than_a_step(4, 4), None);
    }

    #[test]
    fn a_short_run_of_a_large_corpus_trains_more_than_zero_epochs() {
        assert_eq!(epochs_shown(240.0 / 80_361.0), "0.0030");
        assert_eq!(epochs_shown(0.00012), "0.00012");
        assert_eq!(epochs_shown(0.014), "0.014");
        assert_eq!(epochs_shown(0.01), "0.010");
        assert_eq!(epochs_shown(0.25), "0.25");
        assert_eq!(epochs_shown(3.456), "3.46");
        assert_eq!(epochs_shown(0.0), "0.00");
    }
}
