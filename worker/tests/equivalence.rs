//! Sharded training equals single-process training: real worker processes over real
//! sockets, compared with the `--reference` run on the final parameters and every step's loss.
//!
//! The global batch (12 samples) is the same for every world size, so one reference run
//! serves all of them. The tiny transformer's unit sizes do not divide by 3 or 4 (padding).

mod common;

use common::*;
use shardrun_protocol::config::{DType, ShardingStrategy, WrapPolicy};

const TOLERANCE: f64 = 1e-5;

fn assert_equal(strategy: ShardingStrategy, worlds: &[u64]) {
    let dir = temp_dir();
    let reference = run_reference(
        dir.path(),
        "reference",
        &config(tiny_transformer(), strategy, 1),
    );
    for &world in worlds {
        let name = format!("{strategy:?}-{world}");
        let sharded = run_sharded(
            dir.path(),
            &name,
            &config(tiny_transformer(), strategy, world),
        );
        let (worst, what) = max_relative_difference(&sharded, &reference);
        assert!(
            worst <= TOLERANCE,
            "{name}: {what} differs from the reference by {worst:e} (relative)"
        );
    }
}

#[test]
fn full_shard_equals_reference_on_1_to_4_ranks() {
    assert_equal(ShardingStrategy::FullShard, &[1, 2, 3, 4]);
}

#[test]
fn shard_grad_op_equals_reference_on_1_to_4_ranks() {
    assert_equal(ShardingStrategy::ShardGradOp, &[1, 2, 3, 4]);
}

#[test]
fn no_shard_equals_reference_on_1_to_4_ranks() {
    assert_equal(ShardingStrategy::NoShard, &[1, 2, 3, 4]);
}

#[test]
fn hybrid_shard_2x2_equals_reference() {
    // Two shard groups of two ranks (shard_group_size 2), replicated across the groups.
    assert_equal(ShardingStrategy::HybridShard, &[4]);
}

#[test]
fn other_wrap_policies_and_the_mlp_equal_reference() {
    let dir = temp_dir();
    let base = config(tiny_transformer(), ShardingStrategy::FullShard, 1);
    let reference = run_reference(dir.path(), "reference", &base);
    for (name, wrap) in [
        ("size", WrapPolicy::SizeBased { min_params: 300 }),
        (
            "names",
            WrapPolicy::ModuleNames {
                patterns: vec!["layers.*.attention".into(), "output".into()],
            },
        ),
    ] {
        let mut cfg = config(tiny_transformer(), ShardingStrategy::FullShard, 3);
        cfg.fsdp.wrap = wrap;
        let sharded = run_sharded(dir.path(), name, &cfg);
        let (worst, what) = max_relative_difference(&sharded, &reference);
        assert!(worst <= TOLERANCE, "{name}: {what} differs by {worst:e}");
    }
    // The MLP of PyTorch's FSDP tutorial (MSE), 3 ranks, size-based units for its two layers.
    let mlp = shardrun_protocol::config::ModelConfig::Mlp {
        input_dim: 13,
        hidden_dim: 29,
        output_dim: 7,
    };
    let reference = run_reference(
        dir.path(),
        "mlp-reference",
        &config(mlp.clone(), ShardingStrategy::FullShard, 1),
    );
    let mut cfg = config(mlp, ShardingStrategy::FullShard, 3);
    cfg.fsdp.wrap = WrapPolicy::SizeBased { min_params: 100 };
    let sharded = run_sharded(dir.path(), "mlp", &cfg);
    let (worst, what) = max_relative_difference(&sharded, &reference);
    assert!(worst <= TOLERANCE, "mlp: {what} differs by {worst:e}");
}

#[test]
fn accumulating_k_micro_batches_equals_one_batch_of_k_times_b() {
    let dir = temp_dir();
    let reference = run_reference(
        dir.path(),
        "reference",
        &config(tiny_transformer(), ShardingStrategy::FullShard, 1),
    );
    // 2 ranks × 3 samples × 2 micro-steps = the reference's one batch of 12. SHARD_GRAD_OP
    // and NO_SHARD skip communication on the first micro-step (no_sync); FULL_SHARD does not.
    for strategy in [
        ShardingStrategy::FullShard,
        ShardingStrategy::ShardGradOp,
        ShardingStrategy::NoShard,
    ] {
        let mut cfg = config(tiny_transformer(), strategy, 2);
        cfg.batch.batch_size_per_device = 3;
        cfg.batch.grad_accum_steps = 2;
        let name = format!("accum-{strategy:?}");
        let sharded = run_sharded(dir.path(), &name, &cfg);
        let (worst, what) = max_relative_difference(&sharded, &reference);
        assert!(worst <= TOLERANCE, "{name}: {what} differs by {worst:e}");
    }
}

#[test]
fn activation_checkpointing_changes_memory_not_numbers() {
    let dir = temp_dir();
    let plain = run_sharded(
        dir.path(),
        "plain",
        &config(tiny_transformer(), ShardingStrategy::FullShard, 2),
    );
    let mut cfg = config(tiny_transformer(), ShardingStrategy::FullShard, 2);
    cfg.fsdp.activation_checkpointing = true;
    let checkpointed = run_sharded(dir.path(), "checkpointed", &cfg);
    let (worst, what) = max_relative_difference(&checkpointed, &plain);
    assert!(worst <= 1e-6, "{what} differs by {worst:e}");
}

#[test]
fn mixed_precision_trains_and_the_fp16_scaler_works() {
    let dir = temp_dir();
    for (name, dtype) in [("bf16", DType::Bf16), ("fp16", DType::F16)] {
        let mut cfg = config(tiny_transformer(), ShardingStrategy::FullShard, 2);
        cfg.steps = 60;
        cfg.optimizer.lr = 3e-2;
        cfg.fsdp.mixed_precision.param_dtype = dtype;
        // fp16 starts from a scale (2^24) whose scaled gradients overflow fp16, so the first
        // steps must be skipped on every rank alike and the scale halved until they fit.
        let env: &[(&str, &str)] = if dtype == DType::F16 {
            &[("SHARDRUN_FP16_INITIAL_SCALE", "16777216")]
        } else {
            &[]
        };
        let run = run_sharded_with_env(dir.path(), name, &cfg, env);
        let first = run.losses[..5].iter().sum::<f64>() / 5.0;
        let last = run.losses[run.losses.len() - 5..].iter().sum::<f64>() / 5.0;
        assert!(
            last < 0.85 * first,
            "{name}: loss went from {first} to {last}"
        );
        let scales: Vec<f64> = run.metrics.iter().filter_map(|m| m.loss_scale).collect();
        if dtype == DType::F16 {
            assert_eq!(
                scales.len(),
                run.metrics.len(),
                "fp16 reports its loss scale every step"
            );
            assert!(
                scales[0] < 16777216.0,
                "the first step overflowed and backed off: {scales:?}"
            );
            assert!(scales.iter().all(|s| *s >= 1.0), "{scales:?}");
            let skipped = run
                .metrics
                .iter()
                .filter(|m| !m.grad_norm.is_finite())
                .count();
            assert!(
                skipped >= 1,
                "some steps were skipped for overflow: {scales:?}"
            );
        } else {
            assert!(scales.is_empty(), "bf16 needs no loss scaling: {scales:?}");
        }
        assert!(
            run.params
                .values()
                .all(|p| p.values.iter().all(|v| v.is_finite())),
            "{name}: non-finite weights"
        );
    }
}

#[test]
fn replicas_average_gradients_in_the_reduce_dtype() {
    let dir = temp_dir();
    for (name, strategy, world) in [
        ("no-shard", ShardingStrategy::NoShard, 2),
        ("hybrid", ShardingStrategy::HybridShard, 4),
    ] {
        let mut cfg = config(tiny_transformer(), strategy, world);
        let fp32 = run_sharded(dir.path(), &format!("{name}-f32"), &cfg);
        cfg.fsdp.mixed_precision.reduce_dtype = DType::Bf16;
        let bf16 = run_sharded(dir.path(), &format!("{name}-bf16"), &cfg);
        let (worst, what) = max_relative_difference(&bf16, &fp32);
        // bf16 on the wire rounds the gradients (8 bits of mantissa): the runs must differ,
        // yet train the same model.
        assert!(worst > 1e-6, "{name}: bf16 reduction changed nothing");
        assert!(worst < 5e-2, "{name}: {what} differs by {worst:e}");
    }
}

/// Two runs that diverged to NaN or infinity are never "equal": the comparison fails naming
/// what went non-finite, whichever side it is on.
#[test]
fn non_finite_values_fail_the_comparison() {
    use shardrun_worker::params_file::NamedValues;
    let run = |loss: f64, value: f32| RunResult {
        losses: vec![1.0, loss],
        metrics: Vec::new(),
        evals: Vec::new(),
        params: [(
            "layers.0.w".to_string(),
            NamedValues {
                shape: vec![2],
                values: vec![0.5, value],
            },
        )]
        .into(),
    };
    let fails = |a: RunResult, b: RunResult| {
        std::panic::catch_unwind(|| max_relative_difference(&a, &b))
            .expect_err("a non-finite value must fail the comparison")
            .downcast::<String>()
            .map(|m| *m)
            .unwrap_or_default()
    };
    assert_eq!(
        max_relative_difference(&run(2.0, 1.0), &run(2.0, 1.0)).0,
        0.0
    );
    assert!(fails(run(f64::NAN, 1.0), run(2.0, 1.0)).contains("loss at step 2"));
    assert!(fails(run(2.0, 1.0), run(f64::INFINITY, 1.0)).contains("loss at step 2"));
    assert!(fails(run(2.0, f32::NAN), run(2.0, 1.0)).contains("parameter layers.0.w element 1"));
    assert!(fails(run(2.0, 1.0), run(2.0, f32::NEG_INFINITY)).contains("parameter layers.0.w"));
}
