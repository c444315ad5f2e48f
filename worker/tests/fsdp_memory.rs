//! What the FSDP engine holds beyond the shards, measured inside it: N engines in one process,
//! one thread per rank, over the real CPU ring (real sockets). Each engine counts the bytes of
//! gathered parameters and of unsharded gradients it has alive, and keeps the peaks.
//!
//! * unsharded gradients stay a few units' worth (each unit's is freed when its reduce-scatter
//!   completes), never the whole model's;
//! * the embeddings and the head are units of their own, gathered only around their segments;
//! * a tied embedding/output weight gets the gradient of both uses, equal to autograd's on
//!   the whole model, with the same memory bounds;
//! * `max_gathers_in_flight` bounds the gathered units, the running segment's included;
//! * wrapping finer than a block still gathers the whole block (what the docs say).

mod common;
use shardrun_models::source::ParamSource;
use shardrun_models::{Builder, TiedParam};
use shardrun_protocol::config::ModelConfig;
use shardrun_protocol::config::{ShardingStrategy, WrapPolicy};
use shardrun_worker::collectives::Comms;
use shardrun_worker::data::Batch;
use shardrun_worker::fsdp::{EngineOptions, FsdpEngine, MemoryStats, ProcessGroups};
use shardrun_worker::model::{
    self, Init, Model, ModelDescription, ParamKind, ParamSpec, Params, SegmentSpec,
};
use std::collections::HashMap;
use tch::{Device, Kind, Tensor};

const SEED: u64 = 11;

/// A language model whose output head reads the embedding's weight (`tie_word_embeddings`):
/// `h = E[tokens]`, blocks `h + tanh(W h + b)`, `logits = (h * g) Eᵀ`, cross-entropy.
struct TiedLm {
    vocab: i64,
    layers: i64,
    description: ModelDescription,
}

impl TiedLm {
    fn new(vocab: i64, dim: i64, layers: i64) -> Self {
        let bound = Init::Uniform(1.0 / (dim as f64).sqrt());
        let root = Builder::root();
        let embed = root.embedding("embed", vocab, dim, Init::normal(0.5));
        let mut segments = vec![SegmentSpec {
            name: "embeddings".into(),
            params: vec![embed.name.clone()],
            is_block: false,
        }];
        let mut params = vec![embed];
        for i in 0..layers {
            let block = root
                .pp(&format!("layers.{i}"))
                .linear("proj", dim, dim, true, bound, bound);
            segments.push(SegmentSpec {
                name: format!("layers.{i}"),
                params: block.iter().map(|s| s.name.clone()).collect(),
                is_block: true,
            });
            params.extend(block);
        }
        params.push(ParamSpec::new(
            "norm.weight",
            vec![dim],
            Init::Uniform(1.0),
            ParamKind::Norm,
        ));
        segments.push(SegmentSpec {
            name: "head".into(),
            params: vec!["norm.weight".into(), "embed.weight".into()],
            is_block: false,
        });
        TiedLm {
            vocab,
            layers,
            description: ModelDescription {
                params,
                segments,
                tied: vec![TiedParam {
                    alias: "head.weight".into(),
                    param: "embed.weight".into(),
                }],
                output_weight: None,
                attention_flops_per_token_per_position: 0,
            },
        }
    }

    fn logits(&self, p: &Params, x: &Tensor) -> Tensor {
        let h = x * p.get("norm.weight");
        h.matmul(&p.get("embed.weight").tr()).view([-1, self.vocab])
    }
}

impl Model for TiedLm {
    fn description(&self) -> &ModelDescription {
        &self.description
    }

    fn forward_segment(&self, index: usize, p: &Params, x: &Tensor, batch: &Batch) -> Tensor {
        let last = self.layers as usize + 1;
        match index {
            0 => Tensor::embedding(p.get("embed.weight"), x, -1, false, false),
            i if i == last => self
                .logits(p, x)
                .cross_entropy_for_logits(&batch.targets.reshape([-1])),
            i => {
                let p = p.pp(&format!("layers.{}", i - 1));
                x + x
                    .linear(p.get("proj.weight"), Some(p.get("proj.bias")))
                    .tanh()
            }
        }
    }

    fn output(&self, p: &Params, x: &Tensor, _batch: &Batch) -> Tensor {
        self.logits(p, x)
    }

    fn input_kind(&self) -> Kind {
        Kind::Int64
    }
}

fn transformer(n_layers: u64) -> Box<dyn Model> {
    model::build(
        &ModelConfig::Transformer {
            vocab_size: 16,
            dim: 32,
            n_layers,
            n_heads: 2,
            max_seq_len: 8,
        },
        Kind::Float,
    )
}

/// `samples` sequences of `seq` token ids below `vocab`, next-token targets; deterministic.
fn token_batch(vocab: i64, samples: i64, seq: i64) -> Batch {
    let ids: Vec<i64> = (0..samples * (seq + 1))
        .map(|i| (i * 7 + i / 3) % vocab)
        .collect();
    let all = Tensor::from_slice(&ids).view([samples, seq + 1]);
    Batch::new(
        all.narrow(1, 0, seq).contiguous(),
        all.narrow(1, 1, seq).contiguous(),
    )
}

#[derive(Clone)]
struct Setup {
    strategy: ShardingStrategy,
    wrap: WrapPolicy,
    prefetch: bool,
    max_gathers_in_flight: usize,
}

impl Setup {
    fn new(strategy: ShardingStrategy) -> Self {
        Setup {
            strategy,
            wrap: WrapPolicy::Block,
            prefetch: true,
            max_gathers_in_flight: 2,
        }
    }
}

/// What one rank saw over one optimizer step's forward and backward.
struct RankResult {
    stats: MemoryStats,
    /// Padded elements of each unit, with its name.
    units: Vec<(String, i64)>,
    shard_count: i64,
    loss: f64,
    grads: Vec<(String, Vec<f32>)>,
}

/// A ring of `world` CPU communicators, one per thread, each running `body` on its rank.
fn on_ranks<T: Send + 'static>(
    world: usize,
    body: impl Fn(Comms) -> T + Send + Sync + 'static,
) -> Vec<T> {
    tch::set_num_threads(1);
    if world == 1 {
        return vec![body(Comms::single_process())];
    }
    common::ranks_in_threads(world, |_, comms| body(comms))
}

/// One forward/backward of `batch` (split evenly over the ranks) with `sync`, on `world`
/// ranks; the model comes from `make` on each rank.
fn step(
    world: usize,
    setup: &Setup,
    make: impl Fn() -> Box<dyn Model> + Send + Sync + 'static,
    batch: &Batch,
) -> Vec<RankResult> {
    let per_rank = batch.inputs.size()[0] / world as i64;
    let parts: Vec<(Vec<i64>, Vec<i64>, Vec<i64>)> = (0..world as i64)
        .map(|r| {
            let take = |t: &Tensor| t.narrow(0, r * per_rank, per_rank).contiguous();
            let (inputs, targets) = (take(&batch.inputs), take(&batch.targets));
            (
                inputs.size(),
                Vec::<i64>::try_from(inputs.view([-1])).unwrap(),
                Vec::<i64>::try_from(targets.view([-1])).unwrap(),
            )
        })
        .collect();
    let setup = setup.clone();
    on_ranks(world, move |comms| {
        let rank = comms.control.rank();
        let groups =
            ProcessGroups::for_strategy(comms, setup.strategy, None).expect("process groups");
        let options = EngineOptions {
            strategy: setup.strategy,
            param_kind: Kind::Float,
            reduce_kind: Kind::Float,
            activation_checkpointing: false,
            prefetch: setup.prefetch,
            max_gathers_in_flight: setup.max_gathers_in_flight,
            loss_chunk_tokens: None,
            device: Device::Cpu,
        };
        let mut engine = FsdpEngine::new(
            make(),
            &setup.wrap,
            &ParamSource::Init { seed: SEED },
            groups,
            options,
        )
        .expect("engine");
        let (shape, inputs, targets) = &parts[rank];
        let batch = Batch::new(
            Tensor::from_slice(inputs).view(shape.as_slice()),
            Tensor::from_slice(targets).view(shape.as_slice()),
        );
        let loss = engine.forward_backward(&batch, 1.0, true).expect("step");
        let stats = engine.memory_stats();
        let grads = engine
            .full_gradients()
            .expect("gradients")
            .into_iter()
            .map(|(name, t)| (name, Vec::<f32>::try_from(t.view([-1])).unwrap()))
            .collect();
        let layouts = engine.layouts();
        RankResult {
            stats,
            units: layouts
                .iter()
                .map(|l| (l.unit.clone(), l.padded_numel))
                .collect(),
            shard_count: layouts[0].shard_count,
            loss: loss.double_value(&[]),
            grads,
        }
    })
}

/// Gradients of the mean loss over the whole batch, by autograd on the unsharded model.
fn autograd_gradients(model: &dyn Model, batch: &Batch) -> Vec<(String, Vec<f32>)> {
    let specs = model.params();
    let params = model::full_parameters(model, &ParamSource::Init { seed: SEED }, Device::Cpu)
        .expect("initial values");
    let loss = model::forward(model, &Params::new(&params), batch);
    loss.backward();
    specs
        .iter()
        .map(|s| {
            let g = params[&s.name].grad();
            (s.name.clone(), Vec::<f32>::try_from(g.view([-1])).unwrap())
        })
        .collect()
}

/// Largest |a - b| over the largest |b| of each parameter; NaN or inf anywhere fails.
fn assert_gradients_equal(got: &[(String, Vec<f32>)], want: &[(String, Vec<f32>)], what: &str) {
    let want: HashMap<&str, &Vec<f32>> = want.iter().map(|(n, v)| (n.as_str(), v)).collect();
    assert_eq!(got.len(), want.len(), "{what}: parameter count");
    for (name, g) in got {
        let w = want[name.as_str()];
        assert!(
            g.iter().chain(w.iter()).all(|v| v.is_finite()),
            "{what}: {name} has a non-finite gradient"
        );
        let scale = w.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-12);
        let worst = g
            .iter()
            .zip(w.iter())
            .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(
            worst / scale <= 1e-5,
            "{what}: gradient of {name} differs from autograd's by {:e} (relative)",
            worst / scale
        );
    }
}

fn f32_bytes(elements: i64) -> u64 {
    elements as u64 * 4
}

/// The most unsharded gradient memory the engine may hold: the unit whose backward just ran
/// plus one reduce-scatter in flight (input and output), for the two largest units.
fn unsharded_grad_bound(r: &RankResult) -> u64 {
    let mut sizes: Vec<i64> = r.units.iter().map(|u| u.1).collect();
    sizes.sort_unstable_by(|a, b| b.cmp(a));
    let two = sizes[0] + sizes.get(1).copied().unwrap_or(0);
    f32_bytes(two) + f32_bytes(two / r.shard_count)
}

fn whole_model_grad_bytes(r: &RankResult) -> u64 {
    f32_bytes(r.units.iter().map(|u| u.1).sum())
}

#[test]
fn unsharded_gradients_stay_a_few_units_not_the_whole_model() {
    let batch = token_batch(16, 4, 8);
    for strategy in [ShardingStrategy::FullShard, ShardingStrategy::ShardGradOp] {
        let results = step(2, &Setup::new(strategy), || transformer(16), &batch);
        for (rank, r) in results.iter().enumerate() {
            let (peak, bound, whole) = (
                r.stats.unsharded_grad_bytes,
                unsharded_grad_bound(r),
                whole_model_grad_bytes(r),
            );
            eprintln!(
                "{strategy:?} rank {rank}: unsharded gradients peak {peak} B, bound {bound} B, \
                 whole model {whole} B"
            );
            assert!(
                whole > 3 * bound,
                "the model is too small to tell the difference"
            );
            assert!(
                peak > 0 && peak <= bound,
                "{strategy:?} rank {rank}: {peak} B of unsharded gradients alive at once; a \
                 unit's backward plus one reduce-scatter in flight is {bound} B, the whole \
                 model's gradient {whole} B"
            );
        }
    }
}

#[test]
fn embeddings_and_head_are_gathered_only_around_their_segments() {
    // Without prefetch, FULL_SHARD holds exactly the running segment's units: never the
    // embeddings and the head while a block computes.
    let mut setup = Setup::new(ShardingStrategy::FullShard);
    setup.prefetch = false;
    let results = step(2, &setup, || transformer(4), &token_batch(16, 4, 8));
    for r in &results {
        let names: Vec<&str> = r.units.iter().map(|u| u.0.as_str()).collect();
        assert_eq!(
            names,
            vec![
                "embeddings",
                "layers.0",
                "layers.1",
                "layers.2",
                "layers.3",
                "head"
            ]
        );
        let largest = r.units.iter().map(|u| u.1).max().unwrap();
        assert_eq!(r.stats.gathered_units, 1, "{:?}", r.stats);
        assert_eq!(r.stats.gathered_bytes, f32_bytes(largest), "{:?}", r.stats);
    }
}

#[test]
fn tied_embedding_and_head_get_both_gradients_with_bounded_memory() {
    let make = || -> Box<dyn Model> { Box::new(TiedLm::new(24, 32, 6)) };
    let batch = token_batch(24, 6, 5);
    let want = autograd_gradients(make().as_ref(), &batch);
    for (world, strategy) in [
        (1, ShardingStrategy::FullShard),
        (2, ShardingStrategy::FullShard),
        (3, ShardingStrategy::FullShard),
        (3, ShardingStrategy::ShardGradOp),
        (2, ShardingStrategy::NoShard),
    ] {
        let what = format!("{strategy:?} on {world} rank(s)");
        let results = step(world, &Setup::new(strategy), make, &batch);
        let r = &results[0];
        let names: Vec<&str> = r.units.iter().map(|u| u.0.as_str()).collect();
        assert_eq!(names[0], "embeddings", "{what}");
        assert_eq!(names[names.len() - 1], "head", "{what}");
        assert!(
            !r.grads.is_empty() && r.loss.is_finite(),
            "{what}: loss {}",
            r.loss
        );
        assert_gradients_equal(&r.grads, &want, &what);
        if world > 1 && strategy == ShardingStrategy::FullShard {
            // The head reads two units (its own and the embedding's): the limit of 2 holds.
            assert_eq!(r.stats.gathered_units, 2, "{what}: {:?}", r.stats);
            assert!(
                r.stats.unsharded_grad_bytes <= unsharded_grad_bound(r),
                "{what}: {:?}, bound {}",
                r.stats,
                unsharded_grad_bound(r)
            );
        }
    }
}

#[test]
fn max_gathers_in_flight_bounds_the_gathered_units() {
    let batch = token_batch(16, 2, 8);
    for limit in 1..=3 {
        let mut setup = Setup::new(ShardingStrategy::FullShard);
        setup.max_gathers_in_flight = limit;
        let results = step(2, &setup, || transformer(6), &batch);
        for r in &results {
            eprintln!("max_gathers_in_flight {limit}: {:?}", r.stats);
            assert_eq!(
                r.stats.gathered_units, limit,
                "max_gathers_in_flight {limit}: {:?}",
                r.stats
            );
        }
    }
}

#[test]
fn wrapping_finer_than_a_block_still_gathers_the_whole_block() {
    // Units inside a block are gathered together for the block's forward and backward (the
    // docs and the plan's warning say so): the peak is a whole block's parameters either way.
    let batch = token_batch(16, 2, 8);
    let peak = |wrap: WrapPolicy| {
        let setup = Setup {
            strategy: ShardingStrategy::FullShard,
            wrap,
            prefetch: false,
            max_gathers_in_flight: 1,
        };
        let results = step(2, &setup, || transformer(3), &batch);
        (results[0].stats, results[0].units.len())
    };
    let (block, block_units) = peak(WrapPolicy::Block);
    let (finer, finer_units) = peak(WrapPolicy::ModuleNames {
        patterns: vec!["layers.*.attention".into(), "layers.*.feed_forward".into()],
    });
    eprintln!("block: {block:?} ({block_units} units); finer: {finer:?} ({finer_units} units)");
    assert!(finer_units > block_units);
    assert_eq!(block.gathered_units, 1);
    assert_eq!(
        finer.gathered_units, 3,
        "attention, feed_forward and the norms"
    );
    // The same parameters, padded per unit to a multiple of 2 elements.
    let padding = 2 * 3 * 4;
    assert!(
        finer.gathered_bytes + padding >= block.gathered_bytes,
        "finer wrapping gathered {} B at most, a block is {} B",
        finer.gathered_bytes,
        block.gathered_bytes
    );
}
