//! A checkpoint written by N ranks loads on M ranks, on another strategy and on another
//! engine's layout, in both formats; every element is checked.

mod common;

use common::*;
use shardrun_checkpoint::{Checkpoint, StateKind, Verify};

#[test]
fn n_ranks_to_m_ranks_both_directions() {
    for saved_on in 1..=4u64 {
        let tmp = tempfile::tempdir().unwrap();
        let committed = save_sharded(tmp.path(), 7, saved_on, &layout(saved_on), 2);
        let checkpoint = Checkpoint::open(&committed.dir, Verify::Checksums).unwrap();
        for load_on in 1..=5u64 {
            assert_loads_onto(&checkpoint, &layout(load_on), 7);
        }
    }
}

#[test]
fn full_shard_to_hybrid_and_no_shard() {
    // FULL_SHARD on 4 ranks → HYBRID_SHARD with groups of 2 (shards by group index) and
    // NO_SHARD (one shard: the whole unit).
    let tmp = tempfile::tempdir().unwrap();
    let committed = save_sharded(tmp.path(), 2, 4, &layout(4), 2);
    let checkpoint = Checkpoint::open(&committed.dir, Verify::Structure).unwrap();
    assert_loads_onto(&checkpoint, &layout(2), 2);
    assert_loads_onto(&checkpoint, &layout(1), 2);
}

#[test]
fn no_shard_checkpoint_of_three_ranks_is_written_once() {
    let tmp = tempfile::tempdir().unwrap();
    let committed = save_sharded(tmp.path(), 2, 3, &layout(1), 2);
    let shards: Vec<_> = std::fs::read_dir(&committed.dir)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .ends_with(".safetensors")
        })
        .collect();
    assert_eq!(shards.len(), 1, "replicas write no file of their own");
    let checkpoint = Checkpoint::open(&committed.dir, Verify::Checksums).unwrap();
    assert_eq!(
        checkpoint.metadata().ranks.len(),
        3,
        "every rank's RNG is kept"
    );
    assert_loads_onto(&checkpoint, &layout(4), 2);
}

#[test]
fn another_engine_layout_with_alignment_gaps_and_one_unit() {
    let tmp = tempfile::tempdir().unwrap();
    let committed = save_sharded(tmp.path(), 9, 3, &layout(3), 2);
    let checkpoint = Checkpoint::open(&committed.dir, Verify::Checksums).unwrap();
    assert_loads_onto(&checkpoint, &aligned_single_unit_layout(2), 9);

    // And back: the aligned layout's checkpoint loads onto the per-block layout.
    let tmp = tempfile::tempdir().unwrap();
    let committed = save_sharded(tmp.path(), 9, 2, &aligned_single_unit_layout(2), 2);
    let checkpoint = Checkpoint::open(&committed.dir, Verify::Checksums).unwrap();
    assert_loads_onto(&checkpoint, &layout(3), 9);
}

#[test]
fn arbitrary_ranges_read_only_what_they_cover() {
    let tmp = tempfile::tempdir().unwrap();
    let committed = save_sharded(tmp.path(), 1, 3, &layout(3), 2);
    let checkpoint = Checkpoint::open(&committed.dir, Verify::Structure).unwrap();
    let target = &layout(1).units[1];
    let expected = unit_values(target, StateKind::ExpAvg, 1);
    for (start, end) in [(0, 1), (5, 77), (100, 500), (300, target.numel)] {
        let mut out = vec![0u8; (end - start) as usize * 4];
        checkpoint
            .read_unit_range(StateKind::ExpAvg, target, start..end, &mut out)
            .unwrap();
        assert_eq!(
            floats(&out),
            expected[start as usize..end as usize],
            "{start}..{end}"
        );
    }
}

#[test]
fn a_different_model_is_refused_with_the_parameter_named() {
    let tmp = tempfile::tempdir().unwrap();
    let committed = save_sharded(tmp.path(), 1, 2, &layout(2), 2);
    let checkpoint = Checkpoint::open(&committed.dir, Verify::Structure).unwrap();

    let mut wider = layout(2);
    wider.units[0].params[2].shape = vec![4, 2];
    let err = checkpoint.check_compatible(&wider).unwrap_err().to_string();
    assert!(
        err.contains("norm.weight has shape [8] in the checkpoint and [4, 2]"),
        "{err}"
    );

    let mut renamed = layout(2);
    renamed.units[1].params[0].name = "layers.0.attn_norm.weight".into();
    let err = checkpoint
        .check_compatible(&renamed)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("no parameter layers.0.attn_norm.weight"),
        "{err}"
    );
    assert!(err.contains("metadata.json"), "{err}");

    let mut fewer = layout(2);
    fewer.units.pop();
    let err = checkpoint.check_compatible(&fewer).unwrap_err().to_string();
    assert!(
        err.contains("parameters the model lacks: layers.1."),
        "{err}"
    );
}
