//! Sharded → full export: PyTorch names and shapes, the trainer state carried over, and the
//! result loads back (resharded) like any checkpoint.

mod common;

use common::*;
use shardrun_checkpoint::{export_full, Checkpoint, FileRole, StateKind, Verify};
use shardrun_protocol::config::CheckpointFormat;

#[test]
fn export_of_a_three_rank_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let saved = save_sharded(&tmp.path().join("checkpoints"), 30, 3, &layout(3), 2);
    let source = Checkpoint::open(&saved.dir, Verify::Checksums).unwrap();
    let out = tmp.path().join("export");
    let exported = export_full(&source, &out).unwrap();
    assert_eq!(exported.params_not_finite, 0);
    let committed = exported.committed;
    assert_eq!(committed.dir, out.join("step-30"));

    let full = Checkpoint::open(&committed.dir, Verify::Checksums).unwrap();
    let meta = full.metadata();
    assert_eq!(meta.format, CheckpointFormat::Full);
    assert_eq!((meta.step, meta.world_size), (30, 3));
    assert_eq!(meta.trainer, trainer(30));
    assert_eq!(meta.ranks, source.metadata().ranks);
    assert!(meta.file(FileRole::Model).is_some() && meta.file(FileRole::Optimizer).is_some());

    let model = std::fs::read(committed.dir.join("model.safetensors")).unwrap();
    let model = safetensors::SafeTensors::deserialize(&model).unwrap();
    for (_, p) in layout(1).params() {
        let tensor = model.tensor(&p.name).unwrap();
        assert_eq!(
            tensor.shape().iter().map(|&d| d as u64).collect::<Vec<_>>(),
            p.shape
        );
        let expected: Vec<f32> = (0..p.numel)
            .map(|i| value(&p.name, StateKind::Param, i, 30))
            .collect();
        assert_eq!(floats(tensor.data()), expected, "{}", p.name);
    }
    // And back onto 2 ranks, from the full files.
    assert_loads_onto(&full, &layout(2), 30);
}

#[test]
fn exports_of_several_steps_share_a_folder_with_no_latest() {
    let tmp = tempfile::tempdir().unwrap();
    let checkpoints = tmp.path().join("checkpoints");
    let out = tmp.path().join("export");
    // What an interrupted export of an earlier step left.
    write_sharded_parts(&out, 5, 3, &layout(3));
    let mut pruned = Vec::new();
    for step in [10, 20] {
        let saved = save_sharded(&checkpoints, step, 3, &layout(3), 1);
        let source = Checkpoint::open(&saved.dir, Verify::Checksums).unwrap();
        pruned.extend(export_full(&source, &out).unwrap().committed.pruned.removed);
    }
    assert_eq!(pruned, [out.join("step-5.partial")]);
    let mut left: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    // Every export stays, and no `latest` makes the folder look like a run's checkpoints.
    assert_eq!(left, ["step-10", "step-20"]);
    for step in [10, 20] {
        let full = Checkpoint::open(&out.join(format!("step-{step}")), Verify::Checksums);
        assert_eq!(full.unwrap().step(), step);
    }
}

#[test]
fn an_export_of_a_step_already_exported_is_refused_and_a_failed_one_leaves_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let saved = save_sharded(&tmp.path().join("checkpoints"), 30, 3, &layout(3), 2);
    let source = Checkpoint::open(&saved.dir, Verify::Checksums).unwrap();
    let out = tmp.path().join("export");
    let first = export_full(&source, &out).unwrap().committed;
    let model = std::fs::read(first.dir.join("model.safetensors")).unwrap();
    let err = export_full(&source, &out).unwrap_err().to_string();
    assert!(
        err.contains("step-30: already exists: remove it or choose another --out"),
        "{err}"
    );
    assert_eq!(
        std::fs::read(first.dir.join("model.safetensors")).unwrap(),
        model
    );

    // The source's shard cut short after it was opened: the export fails half-way.
    let shard = saved.dir.join("rank-1-of-3.safetensors");
    let len = std::fs::metadata(&shard).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&shard)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    let elsewhere = tmp.path().join("elsewhere");
    assert!(export_full(&source, &elsewhere).is_err());
    let left: Vec<_> = std::fs::read_dir(&elsewhere)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "{left:?}");
}
