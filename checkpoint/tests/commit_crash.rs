//! A job killed at any point of a save: the previous checkpoint stays valid and is what
//! resume picks, until the new one is complete; leftovers are cleaned.

mod common;

use common::*;
use shardrun_checkpoint::{
    clean_stale, commit, find_latest, CommitStage, SaveTarget, ShardWriter, Verify,
};
use shardrun_protocol::config::{CheckpointFormat, ShardingStrategy};

fn resumes_from(root: &std::path::Path) -> Option<u64> {
    let found = find_latest(root, Verify::Checksums).unwrap();
    assert!(found.skipped.is_empty(), "{:?}", found.fallback_messages());
    found.checkpoint.map(|c| c.step())
}

#[test]
fn killed_while_ranks_write() {
    let tmp = tempfile::tempdir().unwrap();
    let layout = layout(2);
    save_sharded(tmp.path(), 10, 2, &layout, 3);

    // Rank 0 wrote half of its file, rank 1 nothing.
    let target = SaveTarget::new(tmp.path(), 20, 2);
    target.prepare().unwrap();
    let mut writer = ShardWriter::create(&target, &layout, 0).unwrap();
    let unit = &layout.units[0];
    let shard = bytes(&vec![1.0; unit.shard_size as usize]);
    writer.write_unit(0, &shard, &shard, &shard).unwrap();
    drop(writer);
    assert_eq!(resumes_from(tmp.path()), Some(10));

    // All files written, no commit.
    write_sharded_parts(tmp.path(), 20, 2, &layout);
    assert_eq!(resumes_from(tmp.path()), Some(10));

    let removed = clean_stale(tmp.path()).unwrap();
    assert_eq!(removed, [tmp.path().join("step-20.partial")]);
}

#[test]
fn killed_at_every_commit_stage() {
    let layout = layout(2);
    for (stage, expected) in [
        (CommitStage::Metadata, 10),
        (CommitStage::Complete, 10),
        (CommitStage::Rename, 20),
        (CommitStage::Latest, 20),
        (CommitStage::Prune, 20),
    ] {
        let tmp = tempfile::tempdir().unwrap();
        save_sharded(tmp.path(), 10, 2, &layout, 1);
        save_sharded_until(tmp.path(), 20, 2, &layout, 1, stage);
        assert_eq!(
            resumes_from(tmp.path()),
            Some(expected),
            "killed after {stage:?}"
        );
        if stage < CommitStage::Latest {
            assert_eq!(
                std::fs::read_to_string(tmp.path().join("latest")).unwrap(),
                "step-10\n"
            );
        }

        // The next run cleans up, resumes and saves the same step again.
        clean_stale(tmp.path()).unwrap();
        save_sharded(tmp.path(), 20, 2, &layout, 1);
        assert_eq!(
            resumes_from(tmp.path()),
            Some(20),
            "re-save after {stage:?}"
        );
        let left: Vec<String> = std::fs::read_dir(tmp.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(
            left.len() == 2 && left.contains(&"step-20".into()),
            "{left:?}"
        );
    }
}

#[test]
fn a_corrupt_checkpoint_of_the_same_step_is_replaced() {
    // Resume fell back from a damaged step-20 to step-10 and training reached step 20 again.
    let tmp = tempfile::tempdir().unwrap();
    let layout = layout(2);
    save_sharded(tmp.path(), 10, 2, &layout, 3);
    let old = save_sharded(tmp.path(), 20, 2, &layout, 3);
    std::fs::write(old.dir.join("rank-1-of-2.safetensors"), b"garbage").unwrap();
    assert_eq!(
        find_latest(tmp.path(), Verify::Checksums)
            .unwrap()
            .checkpoint
            .unwrap()
            .step(),
        10
    );
    save_sharded(tmp.path(), 20, 2, &layout, 3);
    assert_eq!(resumes_from(tmp.path()), Some(20));
}

#[test]
fn a_rank_that_did_not_finish_blocks_the_commit_and_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let layout = layout(2);
    let target = write_sharded_parts(tmp.path(), 20, 2, &layout);
    std::fs::remove_file(target.partial_dir().join("rank-1-of-2.json")).unwrap();
    let request = request(
        CheckpointFormat::Sharded,
        &layout,
        ShardingStrategy::FullShard,
        20,
        3,
    );
    let err = commit(&target, &request).unwrap_err().to_string();
    assert!(
        err.contains("rank-1-of-2.json") && err.contains("rank 1 did not finish"),
        "{err}"
    );
    assert_eq!(resumes_from(tmp.path()), None);

    // A shard file cut short after its writer reported it.
    let target = write_sharded_parts(tmp.path(), 30, 2, &layout);
    let shard = target.partial_dir().join("rank-0-of-2.safetensors");
    let len = std::fs::metadata(&shard).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&shard)
        .unwrap()
        .set_len(len - 4)
        .unwrap();
    let err = commit(&target, &request).unwrap_err().to_string();
    assert!(
        err.contains("rank-0-of-2.safetensors") && err.contains("truncated"),
        "{err}"
    );
}

/// Pruning renames an old checkpoint out of the way before its files go, so a removal cut
/// short (a kill) leaves `step-<N>.pruned`, which no resume opens and the next start removes,
/// never a `step-<N>` missing some of its files. One whose removal is refused before any
/// file went (its owner made it read-only; pruned here by a thread without root's bypass
/// of file permissions) is still whole and takes its name back.
#[test]
fn a_removal_cut_short_leaves_no_checkpoint_missing_files() {
    use std::os::unix::fs::PermissionsExt;
    let mode = |path: &std::path::Path, mode: u32| {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap()
    };
    let as_another_user = |work: Box<dyn FnOnce() + Send>| {
        std::thread::spawn(move || {
            // SAFETY: plain system calls on this thread's own credentials.
            unsafe { libc::setfsuid(65534) };
            work()
        })
        .join()
        .unwrap()
    };
    let tmp = tempfile::tempdir().unwrap();
    let layout = layout(2);
    for step in [10, 20] {
        save_sharded(tmp.path(), step, 2, &layout, 3);
    }
    // The folder of checkpoints open to all; step-10's files may not go.
    mode(tmp.path(), 0o777);
    let step_10 = tmp.path().join("step-10");
    mode(&step_10, 0o555);
    let root = tmp.path().to_path_buf();
    let (said, got) = std::sync::mpsc::channel();
    as_another_user(Box::new(move || {
        let pruned = shardrun_checkpoint::prune(&root, 20, 1, None).unwrap();
        said.send((pruned.removed, pruned.left)).unwrap();
    }));
    let (removed, left) = got.recv().unwrap();
    assert!(removed.is_empty(), "{removed:?}");
    let left: Vec<String> = left.iter().map(|e| e.to_string()).collect();
    assert!(
        left.len() == 1 && left[0].starts_with(&format!("{}: cannot remove", step_10.display())),
        "{left:?}"
    );
    assert!(step_10.join("COMPLETE").is_file());
    assert!(!tmp.path().join("step-10.pruned").exists());
    mode(&step_10, 0o755);

    // Cut short after some of its files went: the folder is not a checkpoint any more.
    let aside = tmp.path().join("step-10.pruned");
    std::fs::rename(&step_10, &aside).unwrap();
    std::fs::remove_file(aside.join("rank-0-of-2.safetensors")).unwrap();
    assert_eq!(resumes_from(tmp.path()), Some(20));
    // One that cannot be removed either does not stop the next start.
    mode(&aside, 0o555);
    let root = tmp.path().to_path_buf();
    as_another_user(Box::new(move || {
        assert_eq!(
            clean_stale(&root).unwrap(),
            Vec::<std::path::PathBuf>::new()
        );
    }));
    mode(&aside, 0o755);
    let removed = clean_stale(tmp.path()).unwrap();
    assert_eq!(removed, std::slice::from_ref(&aside));
    assert_eq!(
        shardrun_checkpoint::naming::left_by(&aside),
        "a removal of an old checkpoint that did not finish"
    );
    assert_eq!(resumes_from(tmp.path()), Some(20));
}
