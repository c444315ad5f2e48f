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
    let committed = export_full(&source, &out).unwrap();
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
