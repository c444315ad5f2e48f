//! Whether a resumed run's training data is the data its checkpoint was trained on, checked
//! before any rank starts: by the job's controller once the data is prepared, and already by
//! `shardrun run` and `shardrun submit` when the data as it is now was prepared before. A
//! run on other data is refused there and left as it was, with its checkpoints; the ranks
//! compare the fingerprint again when they load the checkpoint.

use crate::rerun::CheckpointAt;
use crate::rundir::RunDir;
use shardrun_data::DataIdentity;
use std::fmt;
use std::path::PathBuf;

/// The refusal: what the checkpoint was trained on, what the data is now, and how they
/// differ.
#[derive(Debug, Clone, PartialEq)]
pub struct DataChanged {
    pub run: PathBuf,
    pub checkpoint: CheckpointAt,
    /// The checkpoint's data fingerprint, and the data's now.
    pub saved: String,
    pub now: String,
    /// One line per difference (files, tokenizer); empty when the run recorded no list of
    /// its data to compare with.
    pub changes: Vec<String>,
}

impl fmt::Display for DataChanged {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let run = self.run.display();
        write!(
            f,
            "the training data of {run} changed since its checkpoint of step {} was saved \
             (data {} then, {} now): resumed on it, the run would not see the samples an \
             uninterrupted run sees",
            self.checkpoint.step, self.saved, self.now
        )?;
        if self.changes.is_empty() {
            write!(
                f,
                "\n  (the run recorded no list of its data files to compare: other files, \
                 contents or tokenizer files)"
            )?;
        }
        for change in &self.changes {
            write!(f, "\n  {change}")?;
        }
        write!(
            f,
            "\n  fix: restore the data as it was to continue the run; to train on the data as \
             it is now, start the run over with --force (this deletes its checkpoints), or start \
             a new run (another `name`) from these weights with `checkpoint.from: {}`\
             \n  nothing was started: the run keeps its checkpoints and its state",
            self.checkpoint.dir.display()
        )
    }
}

impl DataChanged {
    /// The refusal as one line, for the run's record (the full text is in the job's output).
    pub fn in_one_line(&self) -> String {
        format!(
            "its training data changed since the checkpoint of step {} was saved (data {} then, {} now); the job's output file says what changed and how to go on",
            self.checkpoint.step, self.saved, self.now
        )
    }
}

impl std::error::Error for DataChanged {}

/// Refuses to resume `run` from `checkpoint` on the data `now` when the checkpoint recorded
/// another data fingerprint (checkpoints of synthetic data, and older ones, record none).
pub fn check(
    run: &RunDir,
    checkpoint: &CheckpointAt,
    now: &DataIdentity,
) -> Result<(), Box<DataChanged>> {
    let Some(saved) = checkpoint.data_fingerprint.as_ref() else {
        return Ok(());
    };
    if *saved == now.fingerprint {
        return Ok(());
    }
    // What the run recorded of its data, if it describes the checkpoint's data.
    let changes = run
        .read_data_identity()
        .filter(|recorded| recorded.fingerprint == *saved)
        .map(|recorded| now.changes_since(&recorded))
        .unwrap_or_default();
    Err(Box::new(DataChanged {
        run: run.path().to_path_buf(),
        checkpoint: checkpoint.clone(),
        saved: saved.clone(),
        now: now.fingerprint.clone(),
        changes,
    }))
}
