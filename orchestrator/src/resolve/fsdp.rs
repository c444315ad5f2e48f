//! FSDP: strategy, wrapping, mixed precision, prefetching, HYBRID_SHARD's groups.

use super::memory::ModelLayout;
use super::ranks::Ranks;
use super::{defaults, yaml_name, ResolveError, Section};
use shardrun_protocol::config::{
    DType, FsdpConfig, MixedPrecision, ModelConfig, ShardingStrategy, WrapPolicy,
};
use shardrun_protocol::units::{
    glob_match, modules_in_model_order, prefixed_pattern, segments_split_finer,
};

pub fn resolve_fsdp(
    s: &Section,
    ranks: &Ranks,
    model: &ModelConfig,
    warnings: &mut Vec<String>,
) -> Result<FsdpConfig, ResolveError> {
    let f = &s.spec().training.fsdp;
    let world_size = ranks.world_size;
    let strategy = f.strategy.unwrap_or(ShardingStrategy::FullShard);
    let param_dtype = f.mixed_precision.param_dtype.unwrap_or(DType::F32);
    let shard_group_size = match strategy {
        ShardingStrategy::HybridShard => {
            let group = f.shard_group_size.unwrap_or(ranks.ntasks_per_node);
            if group == 0 {
                return Err(s.err(
                    "training.fsdp.shard_group_size",
                    "a shard group of 0 ranks holds no shard",
                    format!(
                        "use a divisor of {world_size}, usually the ranks per node ({}), or \
                         leave it out (the ranks per node)",
                        ranks.ntasks_per_node
                    ),
                ));
            }
            if !world_size.is_multiple_of(group) {
                return Err(s.err(
                    "training.fsdp.shard_group_size",
                    format!(
                        "shard groups of {group} ranks do not divide the world size {world_size}"
                    ),
                    format!(
                        "use a divisor of {world_size}, usually the ranks per node ({})",
                        ranks.ntasks_per_node
                    ),
                ));
            }
            let per_node = ranks.ntasks_per_node;
            if group == 1 && world_size > 1 {
                // One rank a node (the default group) is the usual way into this.
                warnings.push(format!(
                    "HYBRID_SHARD with shard groups of 1 rank shards nothing: every rank holds \
                     the whole model, as NO_SHARD does, and saves no memory{}; use FULL_SHARD \
                     to shard over all {world_size} ranks",
                    if f.shard_group_size.is_none() {
                        format!(" (a group is the ranks of a node, here {per_node})")
                    } else {
                        String::new()
                    }
                ));
            } else if group == world_size {
                let per_node = if per_node > 1 && per_node < world_size {
                    format!(", or use shard groups of the ranks per node, {per_node}, to keep the all-gathers within a node")
                } else {
                    String::new()
                };
                warnings.push(format!(
                    "HYBRID_SHARD with one shard group of {} has no replicas: it trains as \
                     FULL_SHARD does (say FULL_SHARD{per_node})",
                    super::all_ranks_words(world_size)
                ));
            } else if ranks.nodes > 1
                && !(per_node.is_multiple_of(group) || group.is_multiple_of(per_node))
            {
                warnings.push(format!(
                    "HYBRID_SHARD's shard groups of {group} ranks are not whole nodes of \
                     {per_node} ranks nor parts of one: some groups span two nodes, so their \
                     all-gathers and reduce-scatters cross the network; use {per_node} or a \
                     divisor or multiple of it"
                ));
            }
            Some(group)
        }
        _ => {
            if f.shard_group_size.is_some() {
                warnings.push(
                    "`training.fsdp.shard_group_size` only applies to HYBRID_SHARD; ignored".into(),
                );
            }
            None
        }
    };
    let max_gathers = f
        .max_gathers_in_flight
        .unwrap_or(defaults::MAX_GATHERS_IN_FLIGHT);
    if max_gathers == 0 {
        return Err(s.err(
            "training.fsdp.max_gathers_in_flight",
            "0 gathers in flight would never compute",
            "use 1 or more (default 2)",
        ));
    }
    let wrap = f.wrap.clone().unwrap_or(match model {
        ModelConfig::Transformer { .. } | ModelConfig::Llama(_) => WrapPolicy::Block,
        // The MLP has no blocks: each linear layer is its own unit.
        ModelConfig::Mlp { .. } => WrapPolicy::ModuleNames {
            patterns: vec!["layer1".into(), "layer2".into()],
        },
    });
    if f.loss_chunk_tokens == Some(0) {
        return Err(s.err(
            "training.fsdp.loss_chunk_tokens",
            "a chunk of 0 tokens would never compute the loss",
            "use 1 or more, or leave it out (as many tokens as fill 1 GiB of fp32 logits)",
        ));
    }
    if f.loss_chunk_tokens.is_some() && model.vocab_size().is_none() {
        warnings.push(
            "`training.fsdp.loss_chunk_tokens` only applies to language models; ignored".into(),
        );
    }
    let loss_chunk_tokens = f.loss_chunk_tokens;
    let activation_checkpointing = f.activation_checkpointing.unwrap_or(false);
    let reduce_dtype = f.mixed_precision.reduce_dtype.unwrap_or(param_dtype);
    if reduce_dtype == DType::F16 && param_dtype != DType::F16 {
        // The loss scaler comes with fp16 parameters, as in PyTorch's FSDP: gradients
        // reduced in fp16 without it may overflow to inf or round small values to 0.
        warnings.push(format!(
            "`training.fsdp.mixed_precision.reduce_dtype: f16` with {} parameters has no loss \
             scaling (only f16 parameters get one): gradients past 65504 become inf and the \
             smallest round to 0; reduce in {}",
            yaml_name(&param_dtype),
            match param_dtype {
                DType::F32 => "f32 (leave `reduce_dtype` out)",
                _ => "bf16 or f32",
            }
        ));
    }
    Ok(FsdpConfig {
        strategy,
        wrap,
        mixed_precision: MixedPrecision {
            param_dtype,
            reduce_dtype,
            // Buffers (the rotary frequencies) stay fp32 unless asked: PyTorch's FSDP casts
            // buffers only when `buffer_dtype` is set.
            buffer_dtype: f.mixed_precision.buffer_dtype.unwrap_or(DType::F32),
        },
        activation_checkpointing,
        prefetch: f.prefetch.unwrap_or(true),
        max_gathers_in_flight: max_gathers,
        shard_group_size,
        loss_chunk_tokens,
    })
}

/// Every `module_names` pattern must match a module of the model: one that matches nothing
/// would leave the wrapping to the segments without a word.
pub(super) fn check_wrap_patterns(
    s: &Section,
    layout: &ModelLayout,
    wrap: &WrapPolicy,
) -> Result<(), ResolveError> {
    let WrapPolicy::ModuleNames { patterns } = wrap else {
        return Ok(());
    };
    let modules = modules_in_model_order(&layout.sizes);
    for (i, pattern) in patterns.iter().enumerate() {
        if modules.iter().any(|m| glob_match(pattern, m)) {
            continue;
        }
        let meant =
            prefixed_pattern(&modules, pattern).or_else(|| misspelt_pattern(&modules, pattern));
        let fix = match meant {
            Some(meant) => format!("did you mean `{meant}`?"),
            None => format!(
                "write a module's whole dotted path, `*` standing for one component; the \
                 model's modules include {}",
                modules
                    .iter()
                    .take(6)
                    .map(|m| format!("`{m}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
        return Err(s.err(
            &format!("training.fsdp.wrap.patterns[{i}]"),
            format!("`{pattern}` matches no module of the model"),
            fix,
        ));
    }
    Ok(())
}

/// The module pattern a misspelt one was meant as (`model.layer.*` for `model.layers.*`), as
/// a misspelt key's: the closest of the model's modules with their layer numbers written
/// `*`, compared whole or below a prefix of up to three components (as [`prefixed_pattern`]
/// adds one).
fn misspelt_pattern(modules: &[String], pattern: &str) -> Option<String> {
    // (what the pattern is compared with, the pattern it stands for)
    let mut candidates: Vec<(String, String)> = Vec::new();
    for module in modules {
        let parts: Vec<&str> = module
            .split('.')
            .map(|c| match c.bytes().all(|b| b.is_ascii_digit()) {
                true => "*",
                false => c,
            })
            .collect();
        for depth in 0..parts.len().min(4) {
            candidates.push((parts[depth..].join("."), parts.join(".")));
        }
    }
    let compared: Vec<&str> = candidates.iter().map(|(tail, _)| tail.as_str()).collect();
    let close = crate::spec::did_you_mean(pattern, &compared)?;
    candidates
        .iter()
        .find(|(tail, _)| tail == close)
        .map(|(_, meant)| meant.clone())
}

/// Options that are valid but do not save the memory people expect: wrapping finer than the
/// model's segments (a segment's units are gathered together for its forward and backward),
/// and activation checkpointing on a model without blocks (it recomputes blocks only).
pub(super) fn warn_about_memory_options(
    model: &ModelConfig,
    layout: &ModelLayout,
    fsdp: &FsdpConfig,
    warnings: &mut Vec<String>,
) {
    let segments = &layout.segments;
    let split = segments_split_finer(&layout.sizes, segments, &layout.units);
    if let Some((segment, units)) = split.first() {
        warnings.push(format!(
            "`training.fsdp.wrap` splits {} of the model's segments into several units ({segment}: {}): a segment's units are gathered together for its forward and its backward, so units finer than a segment save no memory, they only split the communication; use `{{kind: block}}` for one unit per segment",
            split.len(),
            units.join(", ")
        ));
    }
    if fsdp.activation_checkpointing && !segments.iter().any(|s| s.is_block) {
        let kind = serde_json::to_value(model)
            .ok()
            .and_then(|v| v["kind"].as_str().map(str::to_string))
            .unwrap_or_default();
        warnings.push(format!(
            "`training.fsdp.activation_checkpointing` recomputes transformer blocks, and the {kind} model has none: it changes nothing"
        ));
    }
}
