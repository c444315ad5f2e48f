//! How a model's parameters form FSDP units, from parameter names and sizes alone (no
//! libtorch), so the plan and the worker agree on the units: the worker shards and gathers
//! them, the plan sizes their memory and warns about wrapping that saves none.
//!
//! Modules are the prefixes of parameter names (`layers.0.attention` owns
//! `layers.0.attention.wq.weight`). A policy claims modules innermost first, like PyTorch's
//! recursive wrapping. Whatever no policy claims forms one unit per segment that reads it
//! first, named after the segment: the embeddings and the head get units of their own (as
//! torchtitan's `fully_shard` on `tok_embeddings` and on `norm` + `output`), instead of one
//! root unit that would stay gathered from the first segment's forward to the end of
//! backward.
//!
//! Tied weights (an output head reading the embedding's parameter) stay in the unit of the
//! segment that reads them first: that unit is read by the first and the last segment. The
//! engine gathers it for each, frees it in between (FULL_SHARD) and reduce-scatters its
//! gradient after each use, adding the results into the one gradient shard.

use crate::config::WrapPolicy;
use std::collections::BTreeSet;

/// One graph-cut piece of forward, as each architecture describes it (`shardrun_models`).
pub use shardrun_models::SegmentSpec;

/// One unit: a name (its module path, or the segment it belongs to) and its parameters as
/// indices into the model's parameter list, in model order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitPlan {
    pub name: String,
    pub params: Vec<usize>,
}

/// Parameters no segment reads (none in a well-formed model) end up in this unit.
pub const UNREAD: &str = "unread";

/// Splits the model's parameters, given as `(name, elements)` in model order, into units;
/// units are ordered by their first parameter (model order, which is forward order).
pub fn plan_units(
    params: &[(String, u64)],
    segments: &[SegmentSpec],
    policy: &WrapPolicy,
) -> Vec<UnitPlan> {
    let mut owner: Vec<bool> = vec![false; params.len()];
    let mut units: Vec<UnitPlan> = Vec::new();
    let mut claim = |name: &str, members: Vec<usize>, owner: &mut Vec<bool>| {
        let members: Vec<usize> = members.into_iter().filter(|&i| !owner[i]).collect();
        if members.is_empty() {
            return;
        }
        for &i in &members {
            owner[i] = true;
        }
        units.push(UnitPlan {
            name: name.to_string(),
            params: members,
        });
    };
    let index_of = |name: &str| params.iter().position(|p| p.0 == name);
    match policy {
        // Every segment's own parameters are a unit (below), blocks included.
        WrapPolicy::Block => {}
        WrapPolicy::SizeBased { min_params } => {
            for module in modules_innermost_first(params) {
                let members: Vec<usize> = members_of(params, &module)
                    .into_iter()
                    .filter(|&i| !owner[i])
                    .collect();
                let count: u64 = members.iter().map(|&i| params[i].1).sum();
                if count >= *min_params {
                    claim(&module, members, &mut owner);
                }
            }
        }
        WrapPolicy::ModuleNames { patterns } => {
            for module in modules_innermost_first(params) {
                if patterns.iter().any(|p| glob_match(p, &module)) {
                    claim(&module, members_of(params, &module), &mut owner);
                }
            }
        }
    }
    for segment in segments {
        let members = segment.params.iter().filter_map(|n| index_of(n)).collect();
        claim(&segment.name, members, &mut owner);
    }
    let rest: Vec<usize> = (0..params.len()).filter(|&i| !owner[i]).collect();
    claim(UNREAD, rest, &mut owner);
    units.sort_by_key(|u| u.params[0]);
    units
}

/// For each segment, the units it reads (indices into `units`, ascending).
pub fn segment_units(
    params: &[(String, u64)],
    segments: &[SegmentSpec],
    units: &[UnitPlan],
) -> Vec<Vec<usize>> {
    let mut unit_of = vec![usize::MAX; params.len()];
    for (u, unit) in units.iter().enumerate() {
        for &i in &unit.params {
            unit_of[i] = u;
        }
    }
    segments
        .iter()
        .map(|segment| {
            let used: BTreeSet<usize> = segment
                .params
                .iter()
                .filter_map(|n| params.iter().position(|p| &p.0 == n))
                .map(|i| unit_of[i])
                .collect();
            used.into_iter().collect()
        })
        .collect()
}

/// Segments that read more than one unit of their own (units no other segment reads): the
/// wrapping is finer than the segments, and since a segment's units are gathered together
/// for its forward and its backward, the finer units save no memory. `(segment, units)`.
pub fn segments_split_finer(
    params: &[(String, u64)],
    segments: &[SegmentSpec],
    units: &[UnitPlan],
) -> Vec<(String, Vec<String>)> {
    let reads = segment_units(params, segments, units);
    let mut readers = vec![0usize; units.len()];
    for used in &reads {
        for &u in used {
            readers[u] += 1;
        }
    }
    segments
        .iter()
        .zip(&reads)
        .filter_map(|(segment, used)| {
            let own: Vec<String> = used
                .iter()
                .filter(|&&u| readers[u] == 1)
                .map(|&u| units[u].name.clone())
                .collect();
            (own.len() > 1).then(|| (segment.name.clone(), own))
        })
        .collect()
}

/// Every module path that owns parameters (directly or below), deepest first, then in
/// model order.
fn modules_innermost_first(params: &[(String, u64)]) -> Vec<String> {
    let mut modules: Vec<(usize, usize, String)> = Vec::new();
    for (index, module) in modules_in_model_order(params).into_iter().enumerate() {
        modules.push((module.split('.').count(), index, module));
    }
    modules.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    modules.into_iter().map(|(_, _, m)| m).collect()
}

/// The dotted paths of the modules holding `params` (every prefix of a parameter's name),
/// in the order they are first met, outer before inner.
pub fn modules_in_model_order(params: &[(String, u64)]) -> Vec<String> {
    let mut seen = BTreeSet::new();
    let mut modules = Vec::new();
    for (name, _) in params {
        let parts: Vec<&str> = name.split('.').collect();
        for depth in 1..parts.len() {
            let module = parts[..depth].join(".");
            if seen.insert(module.clone()) {
                modules.push(module);
            }
        }
    }
    modules
}

/// The pattern probably meant by a `module_names` pattern that matches no module: the same
/// pattern below a prefix of up to three components that makes it match (PyTorch's
/// Hugging Face models put their layers in `model.`: `layers.*.self_attn` is meant as
/// `model.layers.*.self_attn`).
pub fn prefixed_pattern(modules: &[String], pattern: &str) -> Option<String> {
    (1..=3).find_map(|depth| {
        modules.iter().find_map(|module| {
            let parts: Vec<&str> = module.split('.').collect();
            if parts.len() <= depth || !glob_match(pattern, &parts[depth..].join(".")) {
                return None;
            }
            Some(format!("{}.{pattern}", parts[..depth].join(".")))
        })
    })
}

fn members_of(params: &[(String, u64)], module: &str) -> Vec<usize> {
    let prefix = format!("{module}.");
    (0..params.len())
        .filter(|&i| params[i].0.starts_with(&prefix))
        .collect()
}

/// `*` matches one path component or part of one (never a `.`); everything else literally.
pub fn glob_match(pattern: &str, path: &str) -> bool {
    fn go(p: &[u8], s: &[u8]) -> bool {
        match p.split_first() {
            None => s.is_empty(),
            Some((b'*', rest)) => {
                let mut i = 0;
                loop {
                    if go(rest, &s[i..]) {
                        return true;
                    }
                    if i == s.len() || s[i] == b'.' {
                        return false;
                    }
                    i += 1;
                }
            }
            Some((c, rest)) => s.first() == Some(c) && go(rest, &s[1..]),
        }
    }
    go(pattern.as_bytes(), path.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pattern_missing_the_models_prefix_is_given_with_it() {
        let params: Vec<(String, u64)> = [
            "model.embed_tokens.weight",
            "model.layers.0.self_attn.q_proj.weight",
            "model.layers.0.mlp.up_proj.weight",
            "lm_head.weight",
        ]
        .iter()
        .map(|n| (n.to_string(), 4))
        .collect();
        let modules = modules_in_model_order(&params);
        assert_eq!(
            &modules[..4],
            [
                "model",
                "model.embed_tokens",
                "model.layers",
                "model.layers.0"
            ]
        );
        assert_eq!(
            prefixed_pattern(&modules, "layers.*.self_attn").as_deref(),
            Some("model.layers.*.self_attn")
        );
        assert_eq!(
            prefixed_pattern(&modules, "self_attn").as_deref(),
            Some("model.layers.0.self_attn")
        );
        assert_eq!(prefixed_pattern(&modules, "attention"), None);
    }

    /// An embedding, two blocks of two linears, a head; `tied`: the head reads the
    /// embedding's weight instead of an output weight of its own.
    fn model(tied: bool) -> (Vec<(String, u64)>, Vec<SegmentSpec>) {
        let mut params = vec![("embed.weight".to_string(), 40)];
        for i in 0..2 {
            for (w, n) in [
                ("attn.weight", 16),
                ("mlp.up.weight", 64),
                ("mlp.down.weight", 64),
            ] {
                params.push((format!("layers.{i}.{w}"), n));
            }
        }
        params.push(("norm.weight".into(), 4));
        if !tied {
            params.push(("output.weight".into(), 40));
        }
        let block = |i: usize| SegmentSpec {
            name: format!("layers.{i}"),
            params: params
                .iter()
                .filter(|p| p.0.starts_with(&format!("layers.{i}.")))
                .map(|p| p.0.clone())
                .collect(),
            is_block: true,
        };
        let head = if tied {
            "embed.weight"
        } else {
            "output.weight"
        };
        let segments = vec![
            SegmentSpec {
                name: "embeddings".into(),
                params: vec!["embed.weight".into()],
                is_block: false,
            },
            block(0),
            block(1),
            SegmentSpec {
                name: "head".into(),
                params: vec!["norm.weight".into(), head.into()],
                is_block: false,
            },
        ];
        (params, segments)
    }

    fn names(units: &[UnitPlan]) -> Vec<&str> {
        units.iter().map(|u| u.name.as_str()).collect()
    }

    #[test]
    fn block_policy_gives_the_embeddings_each_block_and_the_head_a_unit() {
        let (params, segments) = model(false);
        let units = plan_units(&params, &segments, &WrapPolicy::Block);
        assert_eq!(
            names(&units),
            vec!["embeddings", "layers.0", "layers.1", "head"]
        );
        assert_eq!(units[3].params, vec![7, 8]);
        assert!(segments_split_finer(&params, &segments, &units).is_empty());
    }

    #[test]
    fn a_tied_weight_stays_in_the_first_readers_unit() {
        let (params, segments) = model(true);
        let units = plan_units(&params, &segments, &WrapPolicy::Block);
        assert_eq!(
            names(&units),
            vec!["embeddings", "layers.0", "layers.1", "head"]
        );
        assert_eq!(
            units[3].params,
            vec![7],
            "the head unit holds only the norm"
        );
        let reads = segment_units(&params, &segments, &units);
        assert_eq!(
            reads[3],
            vec![0, 3],
            "the head reads the embedding unit too"
        );
        assert!(segments_split_finer(&params, &segments, &units).is_empty());
    }

    #[test]
    fn module_name_patterns_match_whole_components() {
        assert!(glob_match("layers.*", "layers.10"));
        assert!(!glob_match("layers.*", "layers.1.attention"));
        assert!(glob_match("layers.*.mlp", "layers.1.mlp"));
        let (params, segments) = model(false);
        let policy = WrapPolicy::ModuleNames {
            patterns: vec!["layers.*.mlp".into()],
        };
        let units = plan_units(&params, &segments, &policy);
        assert_eq!(
            names(&units),
            vec![
                "embeddings",
                "layers.0",
                "layers.0.mlp",
                "layers.1",
                "layers.1.mlp",
                "head"
            ]
        );
        // Each block reads its attention (leftover) unit and its MLP unit.
        let finer = segments_split_finer(&params, &segments, &units);
        assert_eq!(
            finer,
            vec![
                (
                    "layers.0".to_string(),
                    vec!["layers.0".to_string(), "layers.0.mlp".to_string()]
                ),
                (
                    "layers.1".to_string(),
                    vec!["layers.1".to_string(), "layers.1.mlp".to_string()]
                ),
            ]
        );
    }

    #[test]
    fn size_based_claims_innermost_modules_first() {
        let (params, segments) = model(false);
        // mlp.up and mlp.down have 64 each: claimed before their parent `mlp` (128).
        let units = plan_units(
            &params,
            &segments,
            &WrapPolicy::SizeBased { min_params: 60 },
        );
        assert_eq!(
            names(&units),
            vec![
                "embeddings",
                "layers.0",
                "layers.0.mlp.up",
                "layers.0.mlp.down",
                "layers.1",
                "layers.1.mlp.up",
                "layers.1.mlp.down",
                "head"
            ]
        );
        // Above every module's size nothing is claimed: one unit per segment.
        let units = plan_units(
            &params,
            &segments,
            &WrapPolicy::SizeBased { min_params: 1000 },
        );
        assert_eq!(
            names(&units),
            vec!["embeddings", "layers.0", "layers.1", "head"]
        );
    }

    #[test]
    fn parameters_no_segment_reads_get_a_unit_of_their_own() {
        let (mut params, segments) = model(false);
        params.push(("spare.weight".into(), 3));
        let units = plan_units(&params, &segments, &WrapPolicy::Block);
        assert_eq!(units.last().map(|u| u.name.as_str()), Some(UNREAD));
    }
}
