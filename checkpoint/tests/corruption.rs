//! Truncated, corrupted or mismatched files: opening fails with the file named, and resume
//! falls back to the previous checkpoint, saying so.

mod common;

use common::*;
use shardrun_checkpoint::{find_latest, resolve, Checkpoint, CheckpointError, Verify};
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Copy)]
enum Damage {
    Truncate,
    FlipHeaderByte,
    FlipLastByte,
    Delete,
}

fn damage(path: &Path, how: Damage) {
    let mut bytes = std::fs::read(path).unwrap();
    match how {
        Damage::Truncate => bytes.truncate(bytes.len() * 2 / 3),
        Damage::FlipHeaderByte => bytes[12] ^= 0x20,
        Damage::FlipLastByte => *bytes.last_mut().unwrap() ^= 0x01,
        Damage::Delete => return std::fs::remove_file(path).unwrap(),
    }
    std::fs::write(path, bytes).unwrap();
}

/// Two checkpoints (steps 10 and 20); the newest one's `file` damaged.
fn two_checkpoints(format_full: bool, file: &str, how: Damage) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    for step in [10, 20] {
        if format_full {
            save_full(tmp.path(), step, 2, &layout(1), 3);
        } else {
            save_sharded(tmp.path(), step, 2, &layout(2), 3);
        }
    }
    let path = tmp.path().join("step-20").join(file);
    damage(&path, how);
    (tmp, path)
}

fn assert_falls_back(root: &Path, damaged: &Path) -> String {
    let found = find_latest(root, Verify::Checksums).unwrap();
    let checkpoint = found.checkpoint.as_ref().expect("falls back to step 10");
    assert_eq!(checkpoint.step(), 10);
    assert_loads_onto(checkpoint, &layout(2), 10);
    let messages = found.fallback_messages();
    assert_eq!(messages.len(), 1);
    assert!(
        messages[0].contains(&damaged.display().to_string()),
        "{}",
        messages[0]
    );
    assert!(
        messages[0].contains("falling back to") && messages[0].contains("step-10"),
        "{}",
        messages[0]
    );
    messages[0].clone()
}

#[test]
fn every_kind_of_file_damaged_every_way_is_caught_and_named() {
    let cases: &[(bool, &str)] = &[
        (false, "rank-0-of-2.safetensors"),
        (false, "rank-1-of-2.safetensors"),
        (false, "metadata.json"),
        (false, "COMPLETE"),
        (true, "model.safetensors"),
        (true, "optimizer.safetensors"),
        (true, "metadata.json"),
    ];
    for &(full, file) in cases {
        for how in [
            Damage::Truncate,
            Damage::FlipHeaderByte,
            Damage::FlipLastByte,
            Damage::Delete,
        ] {
            let (tmp, damaged) = two_checkpoints(full, file, how);
            let err = Checkpoint::open(&tmp.path().join("step-20"), Verify::Checksums).unwrap_err();
            let text = err.to_string();
            // A missing COMPLETE is an incomplete checkpoint: the folder is named.
            let named = if matches!((file, how), ("COMPLETE", Damage::Delete)) {
                damaged.parent().unwrap().to_path_buf()
            } else {
                damaged.clone()
            };
            assert!(
                text.contains(&named.display().to_string()),
                "{file} {how:?}: the error does not name it: {text}"
            );
            assert_falls_back(tmp.path(), &named);
        }
    }
}

#[test]
fn errors_say_what_happened() {
    let (tmp, _) = two_checkpoints(false, "rank-1-of-2.safetensors", Damage::FlipLastByte);
    let err = Checkpoint::open(&tmp.path().join("step-20"), Verify::Checksums).unwrap_err();
    assert!(
        matches!(err, CheckpointError::ChecksumMismatch { .. }),
        "{err}"
    );
    assert!(
        err.to_string().contains(", the metadata says ")
            && err.to_string().contains("the file is corrupted"),
        "{err}"
    );
    // metadata.json's own hash is the one COMPLETE seals, and said so.
    let (tmp, _) = two_checkpoints(false, "metadata.json", Damage::FlipLastByte);
    let err = Checkpoint::open(&tmp.path().join("step-20"), Verify::Structure).unwrap_err();
    assert!(
        err.to_string().contains("metadata.json: sha256 is ")
            && err.to_string().contains(", COMPLETE says "),
        "{err}"
    );

    let (tmp, _) = two_checkpoints(false, "rank-0-of-2.safetensors", Damage::Truncate);
    let err = Checkpoint::open(&tmp.path().join("step-20"), Verify::Structure).unwrap_err();
    assert!(matches!(err, CheckpointError::SizeMismatch { .. }), "{err}");
    assert!(err.to_string().contains("truncated"), "{err}");
}

#[test]
fn structure_check_alone_catches_truncation_but_not_flipped_data() {
    // Why resume verifies checksums: a flipped data byte keeps sizes and headers intact.
    let (tmp, _) = two_checkpoints(false, "rank-1-of-2.safetensors", Damage::FlipLastByte);
    assert!(Checkpoint::open(&tmp.path().join("step-20"), Verify::Structure).is_ok());
    assert!(Checkpoint::open(&tmp.path().join("step-20"), Verify::Checksums).is_err());
}

#[test]
fn a_newer_format_version_is_refused_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let committed = save_sharded(tmp.path(), 1, 1, &layout(1), 3);
    let path = committed.dir.join("metadata.json");
    let text = std::fs::read_to_string(&path)
        .unwrap()
        .replace("\"format_version\": 1", "\"format_version\": 99");
    std::fs::write(&path, text.as_bytes()).unwrap();
    // Re-seal so that only the version is wrong.
    std::fs::write(
        committed.dir.join("COMPLETE"),
        shardrun_checkpoint::metadata::complete_marker(1, text.as_bytes()),
    )
    .unwrap();
    let err = Checkpoint::open(&committed.dir, Verify::Checksums).unwrap_err();
    assert!(
        matches!(err, CheckpointError::UnsupportedVersion { found: 99, .. }),
        "{err}"
    );
}

#[test]
fn nothing_valid_left_is_an_error_for_explicit_paths_and_a_fresh_start_for_resume() {
    let tmp = tempfile::tempdir().unwrap();
    let committed = save_sharded(tmp.path(), 1, 2, &layout(2), 3);
    damage(
        &committed.dir.join("rank-0-of-2.safetensors"),
        Damage::FlipLastByte,
    );
    let found = find_latest(tmp.path(), Verify::Checksums).unwrap();
    assert!(found.checkpoint.is_none());
    assert!(
        found.fallback_messages()[0].contains("no older checkpoint"),
        "{:?}",
        found.fallback_messages()
    );
    let err = resolve(tmp.path(), Verify::Checksums)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("every checkpoint is damaged") && err.contains("rank-0-of-2.safetensors"),
        "{err}"
    );
}

#[test]
fn when_every_checkpoint_is_damaged_each_is_named_and_none_is_said_to_be_missing() {
    let (tmp, _) = two_checkpoints(false, "rank-0-of-2.safetensors", Damage::FlipLastByte);
    damage(
        &tmp.path().join("step-10/rank-1-of-2.safetensors"),
        Damage::Truncate,
    );
    let found = find_latest(tmp.path(), Verify::Checksums).unwrap();
    assert!(found.checkpoint.is_none());
    assert_eq!(found.skipped_names(), "step-20, step-10");
    let messages = found.fallback_messages();
    assert_eq!(messages.len(), 2);
    for (message, folder) in messages.iter().zip(["step-20", "step-10"]) {
        // Not "no older checkpoint" while an older one, damaged too, is there.
        assert!(
            message.contains(folder) && message.ends_with("; no checkpoint of this run loads"),
            "{message}"
        );
    }
}

/// A checkpoint whose files cannot be read (a shard nobody may read, looked at by a thread
/// without root's bypass of file permissions) is not known to be damaged: resume refuses,
/// naming it and what to do, instead of passing over it to train its steps again.
#[test]
fn an_unreadable_checkpoint_is_refused_not_passed_over() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    for step in [10, 20] {
        save_sharded(tmp.path(), step, 2, &layout(2), 3);
    }
    // Every folder open to all, so only the one shard is closed.
    let open = |path: &Path, mode: u32| {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap()
    };
    open(tmp.path(), 0o755);
    for step in ["step-10", "step-20"] {
        open(&tmp.path().join(step), 0o755);
    }
    let shard = tmp.path().join("step-20").join("rank-1-of-2.safetensors");
    assert!(shard.is_file());
    open(&shard, 0o000);
    let resume_as_another_user = || {
        let root = tmp.path().to_path_buf();
        std::thread::spawn(move || {
            // The file system user of this thread alone; root's CAP_DAC_OVERRIDE goes with it.
            // SAFETY: plain system calls on this thread's own credentials.
            unsafe { libc::setfsuid(65534) };
            let now = unsafe { libc::setfsuid(u32::MAX) };
            assert_ne!(now, 0, "this thread still reads files as root");
            find_latest(&root, Verify::Checksums).map(|found| found.checkpoint.map(|c| c.step()))
        })
        .join()
        .unwrap()
    };
    let err = resume_as_another_user().expect_err("resumed past a checkpoint it could not read");
    assert!(err.is_unreadable(), "{err:?}");
    let text = err.to_string();
    let step_20 = tmp.path().join("step-20");
    for expected in [
        step_20.display().to_string(),
        "rank-1-of-2.safetensors".to_string(),
        "Permission denied".to_string(),
        "not known to be damaged".to_string(),
        format!(
            "move it aside to use the checkpoint before it: mv {} {}.damaged",
            step_20.display(),
            step_20.display()
        ),
    ] {
        assert!(
            text.contains(&expected),
            "{expected:?} missing from: {text}"
        );
    }
    // A folder that cannot be looked into is not an unfinished save.
    open(&shard, 0o644);
    open(&step_20, 0o000);
    let err = resume_as_another_user().expect_err("resumed past a folder it could not read");
    let text = err.to_string();
    assert!(
        err.is_unreadable() && text.contains("COMPLETE") && text.contains("Permission denied"),
        "{text}"
    );
    open(&step_20, 0o755);
    assert_eq!(resume_as_another_user().unwrap(), Some(20));
    // A file where a checkpoint folder should be is read and found wrong: passed over.
    std::fs::write(tmp.path().join("step-30"), "not a folder").unwrap();
    let found = find_latest(tmp.path(), Verify::Checksums).unwrap();
    assert_eq!(found.checkpoint.map(|c| c.step()), Some(20));
    assert_eq!(found.skipped.len(), 1, "{:?}", found.skipped);
    std::fs::remove_file(tmp.path().join("step-30")).unwrap();
    // Damage is still passed over as before: a checkpoint read and found wrong.
    damage(&shard, Damage::Truncate);
    assert_falls_back(tmp.path(), &shard);
}
