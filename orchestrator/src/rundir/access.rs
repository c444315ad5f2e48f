//! Whether this user can run a run directory that exists: write its folder and its logs,
//! read its secret. Shared project folders hold other people's runs; starting one of them
//! would rewrite its spec files and clear its result before the controller, failing on the
//! owner-only secret, stopped, leaving a finished run marked failed. Asked before anything is
//! written.

use shardrun_protocol::users::{current_uid, may as allowed};
pub use shardrun_protocol::users::{owner_and_mode, this_user, user_name};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// A file of the run directory this user cannot use as a run needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unusable {
    pub file: PathBuf,
    /// `"read"` or `"write"`.
    pub needs: &'static str,
    /// The file's owner, by name where the system has one.
    pub owner: String,
    /// Its permission bits (`0o644`).
    pub mode: u32,
    /// Whether it is this user's own (made read-only, or on a read-only file system).
    pub own: bool,
}

impl std::fmt::Display for Unusable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.own {
            return write!(
                f,
                "{} cannot be {} (it is this user's, mode {:o}: made read-only, or on a \
                 read-only file system?)",
                self.file.display(),
                if self.needs == "read" {
                    "read"
                } else {
                    "written"
                },
                self.mode
            );
        }
        write!(
            f,
            "this user ({}) cannot {} {}, which is {}'s (mode {:o})",
            user_name(current_uid()),
            self.needs,
            self.file.display(),
            self.owner,
            self.mode
        )
    }
}

/// A run directory this user cannot run: refused before any of its files is touched.
#[derive(Debug)]
pub struct NotUsable {
    pub run_dir: PathBuf,
    pub unusable: Unusable,
}

impl std::error::Error for NotUsable {}

impl std::fmt::Display for NotUsable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let fix = if self.unusable.own {
            "make it writable again (`chmod -R u+w` on the run directory), or copy the run \
             directory where it can be written and run that"
                .to_string()
        } else {
            format!(
                "ask {} to run it, or start a run of your own beside it: give it another \
                 `name` (or --run-dir)",
                self.unusable.owner
            )
        };
        write!(
            f,
            "{} cannot be run by this user: {}\n  fix: {fix}",
            self.run_dir.display(),
            self.unusable
        )
    }
}

/// Refuses the run directory at `run_dir` (when it is one) unless this user can run it.
pub fn check_usable(run_dir: &Path) -> Result<(), NotUsable> {
    if super::RunDir::open(run_dir).is_err() {
        return Ok(());
    }
    match first_unusable(run_dir) {
        Some(unusable) => Err(NotUsable {
            run_dir: run_dir.to_path_buf(),
            unusable,
        }),
        None => Ok(()),
    }
}

/// The first file of the run directory at `run_dir` that this user cannot use as a run of
/// it would: the folder and the folders and logs the controller and ranks write into, and
/// the secret every rank reads. `None` when all of them can be.
pub fn first_unusable(run_dir: &Path) -> Option<Unusable> {
    first_unusable_by(run_dir, allowed)
}

/// [`first_unusable`] with `allowed` saying whether a file may be used so (`access(2)`'s
/// `how`).
fn first_unusable_by(
    run_dir: &Path,
    allowed: impl Fn(&Path, libc::c_int) -> bool,
) -> Option<Unusable> {
    const WRITE: libc::c_int = libc::W_OK;
    const ENTER_AND_WRITE: libc::c_int = libc::W_OK | libc::X_OK;
    let needed: [(&str, libc::c_int); 8] = [
        ("", ENTER_AND_WRITE),
        ("secret", libc::R_OK),
        ("logs", ENTER_AND_WRITE),
        ("checkpoints", ENTER_AND_WRITE),
        ("train.log", WRITE),
        ("metrics.jsonl", WRITE),
        ("events.jsonl", WRITE),
        ("manifest.json", WRITE),
    ];
    needed.into_iter().find_map(|(name, how)| {
        let file = if name.is_empty() {
            run_dir.to_path_buf()
        } else {
            run_dir.join(name)
        };
        // What is not there yet is made by whoever may write the folder; a file where a
        // folder belongs is for the run's own error to name.
        let meta = std::fs::metadata(&file).ok()?;
        if how == ENTER_AND_WRITE && !meta.is_dir() {
            return None;
        }
        (!allowed(&file, how)).then(|| Unusable {
            needs: if how == libc::R_OK { "read" } else { "write" },
            owner: user_name(meta.uid()),
            mode: meta.mode() & 0o7777,
            own: meta.uid() == current_uid(),
            file,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn the_first_file_a_run_needs_and_this_user_cannot_use_is_named_with_its_owner() {
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("secret");
        std::fs::write(&secret, "x").unwrap();
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::write(dir.path().join("metrics.jsonl"), "").unwrap();
        // Another user's run: the secret is its owner's alone, the logs read-only to others.
        let others = |path: &Path, how: libc::c_int| {
            !(path.ends_with("secret") || (how & libc::W_OK != 0 && path.is_file()))
        };
        let unusable = first_unusable_by(dir.path(), others).unwrap();
        assert_eq!(
            unusable,
            Unusable {
                file: secret.clone(),
                needs: "read",
                owner: this_user(),
                mode: 0o600,
                own: true,
            }
        );
        // As another user's run would be said.
        let theirs = Unusable {
            own: false,
            owner: "alice".into(),
            ..unusable.clone()
        };
        assert!(
            theirs.to_string().ends_with(&format!(
                "cannot read {}, which is alice's (mode 600)",
                secret.display()
            )),
            "{theirs}"
        );
        let refused = NotUsable {
            run_dir: dir.path().to_path_buf(),
            unusable: theirs,
        };
        assert!(
            refused.to_string().ends_with(
                "fix: ask alice to run it, or start a run of your own beside it: give it \
                 another `name` (or --run-dir)"
            ),
            "{refused}"
        );
        // One's own run made read-only: its mode, not another user, is the cause.
        let own = NotUsable {
            run_dir: dir.path().to_path_buf(),
            unusable,
        };
        assert!(
            own.to_string().contains(&format!(
                "{} cannot be read (it is this user's, mode 600: made read-only, or on a \
                 read-only file system?)\n  fix: make it writable again",
                secret.display()
            )),
            "{own}"
        );
        // A log it would append to; files not there yet (`logs/`, `checkpoints/`) are made.
        let readable_secret = |path: &Path, how| path.ends_with("secret") || others(path, how);
        let unusable = first_unusable_by(dir.path(), readable_secret).unwrap();
        assert_eq!(unusable.file, dir.path().join("metrics.jsonl"));
        assert_eq!(unusable.needs, "write");
        // A file where a folder belongs is not this check's to name (the run says what it
        // cannot open there).
        std::fs::write(dir.path().join("logs"), "not a folder").unwrap();
        let no_logs = |path: &Path, _| !path.ends_with("logs");
        assert_eq!(first_unusable_by(dir.path(), no_logs), None);
        // A folder it cannot write comes first.
        let no_folder = |path: &Path, _| path != dir.path();
        assert_eq!(
            first_unusable_by(dir.path(), no_folder).unwrap().file,
            dir.path()
        );
    }

    #[test]
    fn a_run_directory_of_this_users_own_is_usable() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("secret"), "x").unwrap();
        std::fs::create_dir(dir.path().join("logs")).unwrap();
        assert_eq!(first_unusable(dir.path()), None);
    }
}
