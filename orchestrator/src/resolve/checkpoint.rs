//! Checkpoints: where, how often, how many, which format, resume or start from.

use super::{defaults, ResolveError, Section};
use shardrun_protocol::config::{CheckpointConfig, CheckpointFormat};
use std::cmp::Ordering;
use std::path::{Path, PathBuf};

pub fn resolve_checkpoint(s: &Section) -> Result<CheckpointConfig, ResolveError> {
    let t = &s.spec().training;
    // Checkpoints "off" means no periodic saves. The ranks still save at the end and on
    // preemption into the run directory, and a re-run or requeue resumes from there: opting
    // out of resuming takes `checkpoint: { resume: false }`.
    let Some(c) = &t.checkpoint else {
        return Ok(CheckpointConfig {
            dir: None,
            interval_steps: None,
            interval_minutes: None,
            keep: defaults::CHECKPOINT_KEEP,
            format: CheckpointFormat::Sharded,
            resume: true,
            from: None,
        });
    };
    if c.interval_steps == Some(0) {
        return Err(s.err(
            "training.checkpoint.interval_steps",
            "interval of 0 steps",
            "use 1 or more, or remove it",
        ));
    }
    if c.interval_minutes
        .is_some_and(|m| m.partial_cmp(&0.0) != Some(Ordering::Greater))
    {
        return Err(s.err(
            "training.checkpoint.interval_minutes",
            "interval must be positive",
            "use e.g. `interval_minutes: 30`",
        ));
    }
    if c.keep == Some(0) {
        return Err(s.err(
            "training.checkpoint.keep",
            "keeping 0 checkpoints deletes each one as it is written",
            "keep at least 1",
        ));
    }
    if let Some(dir) = &c.dir {
        if let Some(why) = cannot_hold_checkpoints(dir) {
            return Err(s.err(
                "training.checkpoint.dir",
                why,
                "name a folder this job can write (a relative one is made in the run \
                 directory), or leave `dir` out for checkpoints/ in the run directory",
            ));
        }
    }
    // Relative to the spec file, like the spec's other inputs, and made absolute: workers
    // run in the run directory.
    let from = match &c.from {
        Some(path) => {
            let dir = s.spec_relative(path);
            if !dir.is_dir() {
                return Err(s.err(
                    "training.checkpoint.from",
                    if dir.exists() {
                        format!("{} is a file, not a folder", dir.display())
                    } else {
                        format!("{} does not exist", dir.display())
                    },
                    "give a checkpoint folder (step-<N>/), the folder that holds them, or a Hugging Face model folder; a relative path is relative to the spec file",
                ));
            }
            Some(dir)
        }
        None => None,
    };
    let interval_steps = match (c.interval_steps, c.interval_minutes) {
        // Neither given: one checkpoint at the end.
        (None, None) => Some(t.steps),
        (steps, _) => steps,
    };
    Ok(CheckpointConfig {
        dir: Some(
            c.dir
                .clone()
                .unwrap_or_else(|| PathBuf::from(defaults::CHECKPOINT_DIR)),
        ),
        interval_steps,
        interval_minutes: c.interval_minutes,
        keep: c.keep.unwrap_or(defaults::CHECKPOINT_KEEP),
        format: c.format.unwrap_or(CheckpointFormat::Sharded),
        resume: c.resume.unwrap_or(true),
        from,
    })
}

/// Why `dir` cannot be a checkpoint folder, as far as is seen from here without writing:
/// no path, a file, or a folder (or the nearest one above, where it would be made) that
/// cannot be written. A relative folder is made in the run directory, checked as it is
/// created.
fn cannot_hold_checkpoints(dir: &Path) -> Option<String> {
    if dir.as_os_str().is_empty() {
        return Some(
            "`dir` is empty: the checkpoints would go into the run directory's own files".into(),
        );
    }
    if dir.is_relative() {
        return None;
    }
    let existing = dir.ancestors().find(|a| a.symlink_metadata().is_ok())?;
    if !existing.is_dir() {
        return Some(if existing == dir {
            format!("{} is a file, not a folder", dir.display())
        } else {
            format!(
                "{} is a file, so {} cannot be made under it",
                existing.display(),
                dir.display()
            )
        });
    }
    let writable = std::ffi::CString::new(existing.as_os_str().as_encoded_bytes()).is_ok_and(|c| {
        // SAFETY: a query of a NUL-terminated path that outlives the call.
        unsafe { libc::access(c.as_ptr(), libc::W_OK | libc::X_OK) == 0 }
    });
    (!writable).then(|| {
        if existing == dir {
            format!("{} cannot be written by this user", dir.display())
        } else {
            format!(
                "{} cannot be made: {} cannot be written by this user",
                dir.display(),
                existing.display()
            )
        }
    })
}

#[cfg(test)]
mod tests {
    use crate::resolve::{resolve, Overrides};
    use crate::spec::parse;
    use std::path::Path;

    fn checkpoint(block: &str) -> shardrun_protocol::config::CheckpointConfig {
        let yaml = format!(
            "name: t\ntraining:\n  model: {{ kind: mlp, input_dim: 4, hidden_dim: 8, output_dim: 4 }}\n  steps: 10\n  total_batch_size: 4\n  batch_size_per_device: 4\n{block}"
        );
        let loaded = parse(&yaml, Path::new("job.yaml")).unwrap();
        resolve(&loaded, &Overrides::default())
            .unwrap()
            .train
            .checkpoint
    }

    #[test]
    fn a_checkpoint_folder_that_cannot_be_made_is_refused_before_the_run() {
        let refused = |dir: &str| {
            let yaml = format!(
                "name: t\ntraining:\n  model: {{ kind: mlp, input_dim: 4, hidden_dim: 8, output_dim: 4 }}\n  steps: 10\n  total_batch_size: 4\n  batch_size_per_device: 4\n  checkpoint: {{ dir: {dir} }}\n"
            );
            let loaded = parse(&yaml, Path::new("job.yaml")).unwrap();
            match resolve(&loaded, &Overrides::default()) {
                Err(crate::resolve::ResolveError::Invalid(e)) => {
                    assert_eq!(e.field, "training.checkpoint.dir", "{e}");
                    e.why
                }
                Ok(_) => String::new(),
            }
        };
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("file");
        std::fs::write(&file, "").unwrap();
        assert_eq!(
            refused(&file.join("ckpt").display().to_string()),
            format!(
                "{} is a file, so {} cannot be made under it",
                file.display(),
                file.join("ckpt").display()
            )
        );
        assert_eq!(refused("/dev/null"), "/dev/null is a file, not a folder");
        assert!(refused("\"\"").starts_with("`dir` is empty"));
        // A folder to be made under one that can be written, and one in the run directory.
        assert_eq!(refused(&tmp.path().join("a/b").display().to_string()), "");
        assert_eq!(refused("ckpt"), "");
    }

    #[test]
    fn one_resume_rule_with_or_without_a_block() {
        // Off: no folder, no periodic saves, but a re-run or requeue resumes.
        let off = checkpoint("");
        assert_eq!(
            (off.dir, off.interval_steps, off.resume),
            (None, None, true)
        );
        let on = checkpoint("  checkpoint: { interval_steps: 5 }\n");
        assert_eq!(
            (on.dir.as_deref(), on.interval_steps, on.resume),
            (Some(Path::new("checkpoints")), Some(5), true)
        );
        // The only way out.
        assert!(!checkpoint("  checkpoint: { resume: false }\n").resume);
    }
}
