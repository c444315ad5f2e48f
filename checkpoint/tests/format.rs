//! What a save leaves on disk and what opening it gives back.

mod common;

use common::*;
use shardrun_checkpoint::naming::{COMPLETE_FILE, LATEST_FILE, METADATA_FILE};
use shardrun_checkpoint::{
    find_latest, prune, Checkpoint, FileRole, StateKind, Verify, FORMAT_VERSION,
};
use shardrun_protocol::config::CheckpointFormat;

fn names(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn sharded_save_writes_one_file_per_rank_and_seals_it() {
    let tmp = tempfile::tempdir().unwrap();
    let layout = layout(2);
    let committed = save_sharded(tmp.path(), 10, 2, &layout, 3);
    assert_eq!(committed.dir, tmp.path().join("step-10"));
    assert_eq!(
        names(&committed.dir),
        [
            "COMPLETE",
            "metadata.json",
            "rank-0-of-2.safetensors",
            "rank-1-of-2.safetensors"
        ]
    );
    assert_eq!(names(tmp.path()), ["latest", "step-10"]);
    assert_eq!(
        std::fs::read_to_string(tmp.path().join(LATEST_FILE)).unwrap(),
        "step-10\n"
    );

    let checkpoint = Checkpoint::open(&committed.dir, Verify::Checksums).unwrap();
    let meta = checkpoint.metadata();
    assert_eq!(meta.format_version, FORMAT_VERSION);
    assert_eq!(
        (meta.step, meta.world_size, meta.shard_group_size),
        (10, 2, 2)
    );
    assert_eq!(meta.format, CheckpointFormat::Sharded);
    assert_eq!(meta.trainer, trainer(10));
    assert_eq!(meta.layout, layout);
    assert_eq!(checkpoint.rng_for(1, 2), Some(rng(1, 10).as_slice()));
    assert_eq!(
        checkpoint.rng_for(1, 3),
        None,
        "no per-rank RNG across world sizes"
    );
    assert!(meta.file(FileRole::Shard { index: 1 }).is_some());
    assert_loads_onto(&checkpoint, &layout, 10);
}

#[test]
fn the_shard_file_is_plain_safetensors() {
    let tmp = tempfile::tempdir().unwrap();
    let layout = layout(2);
    let committed = save_sharded(tmp.path(), 3, 2, &layout, 3);
    let bytes = std::fs::read(committed.dir.join("rank-1-of-2.safetensors")).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let unit = &layout.units[1];
    let tensor = file.tensor("units.1.exp_avg_sq").unwrap();
    assert_eq!(tensor.shape(), [unit.shard_size as usize]);
    let range = unit.shard_range(1);
    assert_eq!(
        floats(tensor.data()),
        unit_values(unit, StateKind::ExpAvgSq, 3)[range.start as usize..range.end as usize]
    );
}

#[test]
fn metadata_records_layout_and_checksums_in_readable_json() {
    let tmp = tempfile::tempdir().unwrap();
    let committed = save_sharded(tmp.path(), 5, 2, &layout(2), 3);
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(committed.dir.join(METADATA_FILE)).unwrap()).unwrap();
    let unit = &json["layout"]["units"][1];
    assert_eq!(unit["params"][2]["name"], "layers.0.attention.wq.weight");
    assert_eq!(unit["params"][2]["shape"], serde_json::json!([8, 8]));
    assert_eq!(unit["params"][2]["offset"], 16);
    assert_eq!(json["files"][0]["sha256"].as_str().unwrap().len(), 64);
    assert_eq!(json["strategy"], "FULL_SHARD");
    let marker = std::fs::read_to_string(committed.dir.join(COMPLETE_FILE)).unwrap();
    assert!(marker.contains("step 5\n"), "{marker}");
}

#[test]
fn full_save_has_pytorch_names_and_shapes() {
    let tmp = tempfile::tempdir().unwrap();
    let layout = layout(1);
    let committed = save_full(tmp.path(), 4, 2, &layout, 3);
    assert_eq!(
        names(&committed.dir),
        [
            "COMPLETE",
            "metadata.json",
            "model.safetensors",
            "optimizer.safetensors"
        ]
    );
    let model = std::fs::read(committed.dir.join("model.safetensors")).unwrap();
    let model = safetensors::SafeTensors::deserialize(&model).unwrap();
    assert_eq!(model.len(), layout.params().count());
    let wq = model.tensor("layers.1.attention.wq.weight").unwrap();
    assert_eq!(wq.shape(), [8, 8]);
    let expected: Vec<f32> = (0..64)
        .map(|i| value("layers.1.attention.wq.weight", StateKind::Param, i, 4))
        .collect();
    assert_eq!(floats(wq.data()), expected);
    let optimizer = std::fs::read(committed.dir.join("optimizer.safetensors")).unwrap();
    let optimizer = safetensors::SafeTensors::deserialize(&optimizer).unwrap();
    assert_eq!(optimizer.tensor("norm.bias.exp_avg").unwrap().shape(), [8]);
    assert_eq!(optimizer.len(), 2 * layout.params().count());

    let checkpoint = Checkpoint::open(&committed.dir, Verify::Checksums).unwrap();
    assert_loads_onto(&checkpoint, &common::layout(3), 4);
}

#[test]
fn keeps_the_newest_k_and_never_the_one_just_written() {
    let tmp = tempfile::tempdir().unwrap();
    let layout = layout(2);
    for step in [10, 20, 30, 40] {
        save_sharded(tmp.path(), step, 2, &layout, 2);
    }
    assert_eq!(names(tmp.path()), ["latest", "step-30", "step-40"]);
    // A checkpoint older than the ones present (fine-tuning into a used folder) survives
    // its own pruning.
    save_sharded(tmp.path(), 5, 2, &layout, 2);
    assert_eq!(names(tmp.path()), ["latest", "step-40", "step-5"]);
    assert_eq!(prune(tmp.path(), 40, 1, None).unwrap().removed.len(), 1);
    assert_eq!(names(tmp.path()), ["latest", "step-40"]);
    let latest = find_latest(tmp.path(), Verify::Checksums).unwrap();
    assert_eq!(latest.checkpoint.unwrap().step(), 40);
}

/// A run that diverged at step 25 keeps step-20, its newest checkpoint from before, past
/// `keep`: the newer ones hold weights that are not finite.
#[test]
fn a_diverged_run_keeps_its_newest_checkpoint_from_before_the_divergence() {
    let tmp = tempfile::tempdir().unwrap();
    let layout = layout(2);
    for step in [10, 20, 30, 40] {
        save_sharded(tmp.path(), step, 2, &layout, 2);
    }
    assert_eq!(names(tmp.path()), ["latest", "step-30", "step-40"]);
    save_sharded(tmp.path(), 20, 2, &layout, 2);
    let pruned = prune(tmp.path(), 40, 1, Some(25)).unwrap();
    assert_eq!(names(tmp.path()), ["latest", "step-20", "step-40"]);
    assert_eq!(
        pruned.kept_from_before_divergence,
        Some(tmp.path().join("step-20"))
    );
    // Within `keep`, it is kept anyway, and not said to be kept past it.
    let pruned = prune(tmp.path(), 40, 2, Some(25)).unwrap();
    assert_eq!(pruned.kept_from_before_divergence, None);
    assert_eq!(names(tmp.path()), ["latest", "step-20", "step-40"]);
    // Diverged before every checkpoint: nothing to keep but what `keep` says.
    prune(tmp.path(), 40, 1, Some(5)).unwrap();
    assert_eq!(names(tmp.path()), ["latest", "step-40"]);
}

#[test]
fn an_older_checkpoint_that_cannot_be_removed_is_left_and_said_not_an_error() {
    let tmp = tempfile::tempdir().unwrap();
    let layout = layout(2);
    save_sharded(tmp.path(), 10, 2, &layout, 1);
    // What removing cannot take away, as root sees it: a file where a checkpoint folder is
    // named, which `remove_dir_all` refuses (moved aside first, it stays there).
    std::fs::write(tmp.path().join("step-5"), "not a folder").unwrap();
    let pruned = prune(tmp.path(), 10, 1, None).unwrap();
    assert!(pruned.removed.is_empty(), "{pruned:?}");
    assert_eq!(pruned.left.len(), 1, "{pruned:?}");
    let said = pruned.left[0].to_string();
    assert!(
        said.contains("step-5") && said.contains("cannot remove an older checkpoint"),
        "{said}"
    );
    // The one just committed is the run's all the same; what stays was moved out of the
    // way of resumes first.
    save_sharded(tmp.path(), 20, 2, &layout, 1);
    assert_eq!(names(tmp.path()), ["latest", "step-20", "step-5.pruned"]);
    // Nor does it stop the next start.
    assert!(shardrun_checkpoint::clean_stale(tmp.path())
        .unwrap()
        .is_empty());
}

#[test]
fn a_missing_folder_means_no_checkpoint_yet() {
    let tmp = tempfile::tempdir().unwrap();
    let found = find_latest(&tmp.path().join("nothing"), Verify::Checksums).unwrap();
    assert!(found.checkpoint.is_none() && found.skipped.is_empty());
    let err =
        shardrun_checkpoint::resolve(&tmp.path().join("nothing"), Verify::Checksums).unwrap_err();
    assert!(err.to_string().contains("no such folder"), "{err}");
}
