//! One host read per optimizer step, and prefetching that changes nothing but timing: ranks
//! on threads of this process over real sockets, each training with the real engine.
//!
//! On a GPU every host read of a device value stalls the device; the training loop keeps the
//! micro-steps' losses, the gradient norm and the overflow check on the device and reads them
//! once per step. Reads are counted per thread by `shardrun_worker::host`, the only place the
//! training code reads device values (a unit test there checks the sources for any other).

mod common;

use common::*;
use shardrun_protocol::config::{DType, ShardingStrategy, TrainConfig};
use shardrun_worker::fsdp::ProcessGroups;
use shardrun_worker::host;
use shardrun_worker::train::Trainer;
use std::sync::Arc;

/// Trains `config` on its ranks in this process; returns per rank (host reads during
/// training, the losses of every step).
fn train_in_threads(config: &TrainConfig) -> Vec<(u64, Vec<f64>)> {
    tch::set_num_threads(1);
    ranks_in_threads(config.batch.world_size as usize, |_, comms| {
        let groups =
            ProcessGroups::for_strategy(comms, config.fsdp.strategy, config.fsdp.shard_group_size)
                .unwrap();
        let recorder = Arc::new(Recorder::default());
        let mut trainer = Trainer::new(config.clone(), groups, recorder.clone()).unwrap();
        let before = host::reads();
        trainer.run(None).unwrap();
        let reads = host::reads() - before;
        trainer.engine().groups().leave_together().unwrap();
        let losses = recorder.0.lock().unwrap().iter().map(|m| m.loss).collect();
        (reads, losses)
    })
}

fn accumulating(strategy: ShardingStrategy, world: u64, accum: u64) -> TrainConfig {
    let mut c = config(tiny_transformer(), strategy, world);
    c.steps = 5;
    c.batch.grad_accum_steps = accum;
    c.batch.batch_size_per_device = 2;
    c.batch.total_batch_size = 2 * world * accum;
    c
}

#[test]
fn one_host_read_per_optimizer_step() {
    let mut fp16 = accumulating(ShardingStrategy::NoShard, 2, 1);
    fp16.fsdp.mixed_precision.param_dtype = DType::F16;
    let mut hybrid = accumulating(ShardingStrategy::HybridShard, 4, 1);
    hybrid.log_every = 2;
    for (what, config) in [
        (
            "FULL_SHARD, 3 micro-steps, clipping",
            accumulating(ShardingStrategy::FullShard, 2, 3),
        ),
        ("NO_SHARD, fp16 loss scaling", fp16),
        ("HYBRID_SHARD 2x2, metrics every 2 steps", hybrid),
    ] {
        for (rank, (reads, losses)) in train_in_threads(&config).into_iter().enumerate() {
            assert!(losses.iter().all(|l| l.is_finite()), "{what}: {losses:?}");
            assert_eq!(
                reads, config.steps,
                "{what}: rank {rank} read device values {reads} times in {} steps",
                config.steps
            );
        }
    }
}

#[test]
fn prefetch_on_and_off_train_identically() {
    let base = accumulating(ShardingStrategy::FullShard, 2, 2);
    let mut serial = base.clone();
    serial.fsdp.prefetch = false;
    serial.fsdp.max_gathers_in_flight = 1;
    let mut ahead = base;
    ahead.fsdp.prefetch = true;
    ahead.fsdp.max_gathers_in_flight = 3;
    let (a, b) = (train_in_threads(&serial), train_in_threads(&ahead));
    let (a, b) = (&a[0].1, &b[0].1);
    assert_eq!(a.len(), 5);
    for (step, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(
            x.is_finite() && (x - y).abs() <= 1e-6 * x.abs().max(1.0),
            "step {}: {x} without prefetch, {y} with",
            step + 1
        );
    }
}
