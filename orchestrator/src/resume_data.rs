//! Whether a resumed run's training data is the data its checkpoint was trained on, checked
//! before any rank starts: by the job's controller once the data is prepared, and already by
//! `shardrun run` and `shardrun submit` when the data as it is now was prepared before, or
//! its files changed since the run recorded them. A run on other data is refused there and
//! left as it was, with its checkpoints; the ranks compare the fingerprint again when they
//! load the checkpoint.

use crate::rerun::CheckpointAt;
use crate::rundir::RunDir;
use shardrun_data::{DataFiles, DataIdentity};
use shardrun_protocol::config::DatasetConfig;
use std::fmt;
use std::path::PathBuf;

/// The refusal: what the checkpoint was trained on, what the data is now, and how they
/// differ.
#[derive(Debug, Clone, PartialEq)]
pub struct DataChanged {
    pub run: PathBuf,
    pub checkpoint: CheckpointAt,
    /// The checkpoint's data fingerprint, and the data's now (`None` when the data as it
    /// is now is not prepared, and its files tell that it changed).
    pub saved: String,
    pub now: Option<String>,
    /// One line per difference (files, tokenizer); empty when the run recorded no list of
    /// its data to compare with.
    pub changes: Vec<String>,
    /// The run is a sweep's point: `--force` does not start it over.
    pub sweep_point: bool,
}

impl fmt::Display for DataChanged {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let run = self.run.display();
        write!(
            f,
            "the training data of {run} changed since its checkpoint of step {} was saved \
             ({}): resumed on it, the run would not see the samples an uninterrupted run sees",
            self.checkpoint.step,
            self.fingerprints()
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
        let start_over = if self.sweep_point {
            format!("delete {run} and run `shardrun sweep` again, which submits the point anew")
        } else {
            "start the run over with --force (this deletes its checkpoints)".to_string()
        };
        write!(
            f,
            "\n  fix: restore the data as it was to continue the run; to train on the data as \
             it is now, {start_over}, or start a new run (another `name`) from these weights \
             with `checkpoint.from: {}`\
             \n  nothing was started: the run keeps its checkpoints",
            self.checkpoint.dir.display()
        )
    }
}

impl DataChanged {
    /// The refusal as one line, for the run's record; `full`: the file with the whole text.
    pub fn in_one_line(&self, full: Option<&std::path::Path>) -> String {
        let see = match full {
            Some(path) => format!("{} says", path.display()),
            None => "the job's output says".to_string(),
        };
        format!(
            "its training data changed since the checkpoint of step {} was saved ({}); {see} \
             what changed and how to go on",
            self.checkpoint.step,
            self.fingerprints()
        )
    }

    /// "data aaaa then, bbbb now", or the checkpoint's alone when the data is not prepared.
    fn fingerprints(&self) -> String {
        match &self.now {
            Some(now) => format!("data {} then, {now} now", self.saved),
            None => format!("data {} then, other files now", self.saved),
        }
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
        now: Some(now.fingerprint.clone()),
        changes,
        sweep_point: is_sweep_point(run),
    }))
}

/// Refuses to resume `run` from `checkpoint` when the data files now (`files`) are not
/// those the checkpoint was trained on, as the run recorded them (`data.json`), before the
/// data is prepared: a job would otherwise wait in the queue and tokenize its data to be
/// refused. What only preparing tells (the tokenizer, a file rewritten keeping its
/// modification time) is left to the preparation, and so is a run that recorded no files.
fn check_files(
    run: &RunDir,
    checkpoint: &CheckpointAt,
    files: &DataFiles,
) -> Result<(), Box<DataChanged>> {
    let Some(saved) = checkpoint.data_fingerprint.as_ref() else {
        return Ok(());
    };
    let Some(recorded) = run
        .read_data_identity()
        .filter(|recorded| recorded.fingerprint == *saved)
    else {
        return Ok(());
    };
    let changes = files.changes_since(&recorded);
    if changes.is_empty() {
        return Ok(());
    }
    Err(Box::new(DataChanged {
        run: run.path().to_path_buf(),
        checkpoint: checkpoint.clone(),
        saved: saved.clone(),
        now: None,
        changes,
        sweep_point: is_sweep_point(run),
    }))
}

fn is_sweep_point(run: &RunDir) -> bool {
    run.read_manifest()
        .is_ok_and(|m| !m.sweep_params.is_empty())
}

/// The data a spec names as it is now, looked at once for any number of finished runs: its
/// identity when it was prepared as it is, else its files (sizes and modification times).
pub struct DataNow {
    identity: Option<DataIdentity>,
    files: Result<DataFiles, String>,
}

impl DataNow {
    pub fn look(config: &DatasetConfig) -> DataNow {
        let files = DataFiles::now(config).map_err(|e| e.to_string());
        let identity = files
            .as_ref()
            .ok()
            .and_then(|f| f.prepared_identity(config).ok().flatten());
        DataNow { identity, files }
    }

    pub fn identity(&self) -> Option<&DataIdentity> {
        self.identity.as_ref()
    }

    /// The refusal a job continuing `run` from `checkpoint` would meet: the data as
    /// prepared now, else its files, are not what the checkpoint was trained on. Files that
    /// do not read are the job's preparation to report.
    pub fn refusal(&self, run: &RunDir, checkpoint: &CheckpointAt) -> Option<Box<DataChanged>> {
        match (&self.identity, &self.files) {
            (Some(now), _) => check(run, checkpoint, now).err(),
            (None, Ok(files)) => check_files(run, checkpoint, files).err(),
            (None, Err(_)) => None,
        }
    }

    /// How the data now differs from what the finished `run` trained on, one line each;
    /// empty when it is the same, or the run recorded nothing to compare with. A finished
    /// run is not resumed, so nothing refuses it: this is what tells that its results are
    /// not of the data as it is now.
    pub fn changes_since_run(&self, run: &RunDir) -> Vec<String> {
        let Some(trained_on) = run.read_data_identity() else {
            return Vec::new();
        };
        match (&self.identity, &self.files) {
            (Some(now), _) => now.changes_since(&trained_on),
            (None, Ok(files)) => files.changes_since(&trained_on),
            (None, Err(e)) => vec![format!("the data cannot be read as the spec names it: {e}")],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(sweep_point: bool) -> DataChanged {
        DataChanged {
            run: PathBuf::from("/runs/sw/sw-1a2b"),
            checkpoint: CheckpointAt {
                step: 6,
                updates: 6,
                dir: PathBuf::from("/runs/sw/sw-1a2b/checkpoints/step-6"),
                data_fingerprint: Some("aaaa".into()),
            },
            saved: "aaaa".into(),
            now: Some("bbbb".into()),
            changes: vec!["/data/a.txt: changed (10 → 12 bytes)".into()],
            sweep_point,
        }
    }

    #[test]
    fn a_refusal_says_how_to_start_over_as_the_run_can_be() {
        let run = refusal(false).to_string();
        assert!(run.contains("start the run over with --force"), "{run}");
        let point = refusal(true).to_string();
        assert!(
            point.contains("delete /runs/sw/sw-1a2b and run `shardrun sweep` again")
                && !point.contains("--force"),
            "{point}"
        );
        assert_eq!(
            refusal(true).in_one_line(Some(std::path::Path::new("/runs/sw/slurm/sw-7_0.err"))),
            "its training data changed since the checkpoint of step 6 was saved (data aaaa \
             then, bbbb now); /runs/sw/slurm/sw-7_0.err says what changed and how to go on"
        );
        let unprepared = DataChanged {
            now: None,
            ..refusal(false)
        };
        assert!(
            unprepared.to_string().starts_with(
                "the training data of /runs/sw/sw-1a2b changed since its checkpoint of step 6 \
                 was saved (data aaaa then, other files now): "
            ),
            "{unprepared}"
        );
    }
}
