//! A model-shaped layout with known values, and saves made the way ranks make them, so
//! tests can write checkpoints and check every element read back.
#![allow(dead_code)]

use shardrun_checkpoint::{
    commit_until, write_rank_report, CommitKind, CommitRequest, CommitStage, Committed,
    DataPosition, FullWriter, Layout, SaveTarget, SchedulerState, ShardWriter, StateDtypes,
    StateKind, TrainerState, UnitLayout,
};
use shardrun_protocol::config::{CheckpointFormat, DType, ShardingStrategy};
use std::path::Path;

/// A unit's name and its parameters' names and shapes.
pub type UnitParams = (String, Vec<(String, Vec<u64>)>);

/// Parameters of the FSDP2-example transformer (dim 8, vocab 32, 2 layers), grouped into
/// units the way the block wrap policy does: one per block, and the rest in the root.
pub fn transformer_units() -> Vec<UnitParams> {
    let (dim, vocab, seq) = (8u64, 32u64, 16u64);
    let mut units = vec![(
        "root".to_string(),
        vec![
            ("tok_embeddings.weight".to_string(), vec![vocab, dim]),
            ("pos_embeddings.weight".to_string(), vec![seq, dim]),
            ("norm.weight".to_string(), vec![dim]),
            ("norm.bias".to_string(), vec![dim]),
            ("output.weight".to_string(), vec![vocab, dim]),
        ],
    )];
    for layer in 0..2 {
        let p = |name: &str, shape: Vec<u64>| (format!("layers.{layer}.{name}"), shape);
        units.push((
            format!("layers.{layer}"),
            vec![
                p("attention_norm.weight", vec![dim]),
                p("attention_norm.bias", vec![dim]),
                p("attention.wq.weight", vec![dim, dim]),
                p("attention.wk.weight", vec![dim, dim]),
                p("attention.wv.weight", vec![dim, dim]),
                p("attention.wo.weight", vec![dim, dim]),
                p("ffn_norm.weight", vec![dim]),
                p("ffn_norm.bias", vec![dim]),
                p("feed_forward.w1.weight", vec![4 * dim, dim]),
                p("feed_forward.w1.bias", vec![4 * dim]),
                p("feed_forward.w2.weight", vec![dim, 4 * dim]),
                p("feed_forward.w2.bias", vec![dim]),
            ],
        ));
    }
    units
}

/// Packed layout with `shards` shards per unit.
pub fn layout(shards: u64) -> Layout {
    let units = transformer_units()
        .into_iter()
        .map(|(name, params)| UnitLayout::packed(name, params, shards).unwrap())
        .collect();
    Layout::new(units).unwrap()
}

/// Another engine's layout of the same model: everything in one unit, every parameter
/// aligned to 16 elements (gaps between them).
pub fn aligned_single_unit_layout(shards: u64) -> Layout {
    let mut offset = 0;
    let params = transformer_units()
        .into_iter()
        .flat_map(|(_, params)| params)
        .map(|(name, shape)| {
            let numel: u64 = shape.iter().product();
            let slot = shardrun_checkpoint::ParamSlot {
                name,
                shape,
                offset,
                numel,
            };
            offset = (offset + numel).next_multiple_of(16);
            slot
        })
        .collect();
    Layout::new(vec![UnitLayout::with_offsets(
        "model", params, offset, shards,
    )
    .unwrap()])
    .unwrap()
}

/// The value of element `i` of parameter `name`'s `kind` at training step `step`: distinct
/// for every parameter, element, kind and step.
pub fn value(name: &str, kind: StateKind, i: u64, step: u64) -> f32 {
    let mut h: u64 = 1469598103934665603;
    for b in name.bytes().chain(kind.as_str().bytes()) {
        h = (h ^ b as u64).wrapping_mul(1099511628211);
    }
    let x = h
        .wrapping_add(i.wrapping_mul(2654435761))
        .wrapping_add(step * 97)
        % 1_000_003;
    x as f32 / 1000.0 - 500.0
}

/// The padded flat buffer of `unit` (zeros where no parameter is).
pub fn unit_values(unit: &UnitLayout, kind: StateKind, step: u64) -> Vec<f32> {
    let mut flat = vec![0f32; unit.padded_numel as usize];
    for p in &unit.params {
        for i in 0..p.numel {
            flat[(p.offset + i) as usize] = value(&p.name, kind, i, step);
        }
    }
    flat
}

pub fn bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

pub fn floats(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

pub fn trainer(step: u64) -> TrainerState {
    TrainerState {
        optimizer_step: step,
        scheduler: SchedulerState {
            step,
            last_lr: 1e-3 / (step + 1) as f64,
        },
        data: DataPosition {
            samples_done: step * 16,
            micro_batches_done: step * 2,
            epoch: None,
            data_fingerprint: None,
        },
        seed: 7,
        loss_scale: None,
        diverged_at: None,
    }
}

pub fn rng(rank: u64, step: u64) -> Vec<u8> {
    (0..16).map(|i| (rank * 31 + step * 7 + i) as u8).collect()
}

pub fn request(
    format: CheckpointFormat,
    layout: &Layout,
    strategy: ShardingStrategy,
    step: u64,
    keep: usize,
) -> CommitRequest {
    CommitRequest {
        format,
        strategy,
        shard_group_size: layout.shard_count(),
        dtypes: StateDtypes::fp32_state(DType::F32),
        layout: layout.clone(),
        trainer: trainer(step),
        config_hash: "0123456789abcdef".into(),
        config: None,
        kind: CommitKind::Checkpoint { keep },
    }
}

/// Every rank's part of a sharded save of `layout` on `world` ranks (ranks below the shard
/// count write shards), without the commit.
pub fn write_sharded_parts(root: &Path, step: u64, world: u64, layout: &Layout) -> SaveTarget {
    let target = SaveTarget::new(root, step, world);
    target.prepare().unwrap();
    for rank in 0..world {
        let mut files = Vec::new();
        if rank < layout.shard_count() {
            let mut writer = ShardWriter::create(&target, layout, rank).unwrap();
            for (u, unit) in layout.units.iter().enumerate() {
                let range = unit.shard_range(rank);
                let shard = |kind| {
                    bytes(&unit_values(unit, kind, step)[range.start as usize..range.end as usize])
                };
                writer
                    .write_unit(
                        u,
                        &shard(StateKind::Param),
                        &shard(StateKind::ExpAvg),
                        &shard(StateKind::ExpAvgSq),
                    )
                    .unwrap();
            }
            files.push(writer.finish().unwrap());
        }
        write_rank_report(&target, rank, rng(rank, step), files).unwrap();
    }
    target
}

pub fn save_sharded(root: &Path, step: u64, world: u64, layout: &Layout, keep: usize) -> Committed {
    save_sharded_until(root, step, world, layout, keep, CommitStage::Prune)
}

pub fn save_sharded_until(
    root: &Path,
    step: u64,
    world: u64,
    layout: &Layout,
    keep: usize,
    last: CommitStage,
) -> Committed {
    let target = write_sharded_parts(root, step, world, layout);
    let strategy = if layout.shard_count() == world {
        ShardingStrategy::FullShard
    } else {
        ShardingStrategy::HybridShard
    };
    commit_until(
        &target,
        &request(CheckpointFormat::Sharded, layout, strategy, step, keep),
        last,
    )
    .unwrap()
}

/// A full save of `layout` by rank 0 of `world` ranks.
pub fn save_full(root: &Path, step: u64, world: u64, layout: &Layout, keep: usize) -> Committed {
    let target = SaveTarget::new(root, step, world);
    target.prepare().unwrap();
    let mut writer = FullWriter::create(&target, layout).unwrap();
    for (u, unit) in layout.units.iter().enumerate() {
        let flat = |kind| bytes(&unit_values(unit, kind, step));
        writer
            .write_unit(
                u,
                &flat(StateKind::Param),
                &flat(StateKind::ExpAvg),
                &flat(StateKind::ExpAvgSq),
            )
            .unwrap();
    }
    let mut files = Some(writer.finish().unwrap());
    for rank in 0..world {
        let mine = if rank == 0 {
            files.take().unwrap()
        } else {
            Vec::new()
        };
        write_rank_report(&target, rank, rng(rank, step), mine).unwrap();
    }
    let request = request(
        CheckpointFormat::Full,
        layout,
        ShardingStrategy::FullShard,
        step,
        keep,
    );
    shardrun_checkpoint::commit(&target, &request).unwrap()
}

/// Check that `checkpoint` loaded onto `target` gives every rank exactly the values of
/// `step` (padding zero), for all three kinds.
pub fn assert_loads_onto(checkpoint: &shardrun_checkpoint::Checkpoint, target: &Layout, step: u64) {
    checkpoint.check_compatible(target).unwrap();
    for unit in &target.units {
        for kind in StateKind::ALL {
            let expected = unit_values(unit, kind, step);
            for shard in 0..unit.shard_count() {
                let mut out = vec![0u8; unit.shard_size as usize * 4];
                checkpoint.read_shard(kind, unit, shard, &mut out).unwrap();
                let range = unit.shard_range(shard);
                assert_eq!(
                    floats(&out),
                    expected[range.start as usize..range.end as usize],
                    "unit {} shard {shard} {kind:?}",
                    unit.name
                );
            }
        }
    }
}
