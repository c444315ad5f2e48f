//! Auto-wrap policies: which parameters form which FSDP unit.
//!
//! Modules are the prefixes of parameter names (`layers.0.attention` owns
//! `layers.0.attention.wq.weight`). Policies claim modules innermost first, like PyTorch's
//! recursive wrapping; whatever no unit claims goes to the root unit.

use crate::model::{ParamSpec, SegmentSpec};
use shardrun_protocol::config::WrapPolicy;
use std::collections::BTreeSet;

/// One unit: a name (its module path, or `root`) and its parameters as indices into the
/// model's parameter list, in model order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitPlan {
    pub name: String,
    pub params: Vec<usize>,
}

pub const ROOT: &str = "root";

/// Splits the model's parameters into units; units are ordered by their first parameter
/// (model order, which is forward order).
pub fn plan_units(
    params: &[ParamSpec],
    segments: &[SegmentSpec],
    policy: &WrapPolicy,
) -> Vec<UnitPlan> {
    let mut owner: Vec<Option<usize>> = vec![None; params.len()];
    let mut units: Vec<UnitPlan> = Vec::new();
    let mut claim = |module: &str, members: Vec<usize>, owner: &mut Vec<Option<usize>>| {
        let members: Vec<usize> = members
            .into_iter()
            .filter(|&i| owner[i].is_none())
            .collect();
        if members.is_empty() {
            return;
        }
        for &i in &members {
            owner[i] = Some(units.len());
        }
        units.push(UnitPlan {
            name: module.to_string(),
            params: members,
        });
    };
    let index_of = |name: &str| params.iter().position(|p| p.name == name);
    match policy {
        WrapPolicy::Block => {
            for segment in segments.iter().filter(|s| s.is_block) {
                let members = segment.params.iter().filter_map(|n| index_of(n)).collect();
                claim(&segment.name, members, &mut owner);
            }
        }
        WrapPolicy::SizeBased { min_params } => {
            for module in modules_innermost_first(params) {
                let members: Vec<usize> = members_of(params, &module)
                    .into_iter()
                    .filter(|&i| owner[i].is_none())
                    .collect();
                let count: i64 = members.iter().map(|&i| params[i].numel()).sum();
                if count as u64 >= *min_params {
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
    let rest: Vec<usize> = (0..params.len()).filter(|&i| owner[i].is_none()).collect();
    claim(ROOT, rest, &mut owner);
    units.sort_by_key(|u| u.params[0]);
    units
}

/// Every module path that owns parameters (directly or below), deepest first, then in
/// model order.
fn modules_innermost_first(params: &[ParamSpec]) -> Vec<String> {
    let mut seen = BTreeSet::new();
    let mut modules: Vec<(usize, usize, String)> = Vec::new();
    for (index, p) in params.iter().enumerate() {
        let parts: Vec<&str> = p.name.split('.').collect();
        for depth in 1..parts.len() {
            let module = parts[..depth].join(".");
            if seen.insert(module.clone()) {
                modules.push((depth, index, module));
            }
        }
    }
    modules.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    modules.into_iter().map(|(_, _, m)| m).collect()
}

fn members_of(params: &[ParamSpec], module: &str) -> Vec<usize> {
    let prefix = format!("{module}.");
    (0..params.len())
        .filter(|&i| params[i].name.starts_with(&prefix))
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
    use shardrun_models::transformer::Transformer;
    use shardrun_models::ModelDescription;

    fn tiny() -> ModelDescription {
        Transformer {
            vocab_size: 11,
            dim: 8,
            n_layers: 2,
            n_heads: 2,
            max_seq_len: 4,
        }
        .describe()
    }

    fn names(m: &ModelDescription, units: &[UnitPlan]) -> Vec<String> {
        let _ = m;
        units.iter().map(|u| u.name.clone()).collect()
    }

    #[test]
    fn block_policy_is_one_unit_per_block_plus_root() {
        let m = tiny();
        let units = plan_units(&m.params, &m.segments, &WrapPolicy::Block);
        assert_eq!(names(&m, &units), vec!["root", "layers.0", "layers.1"]);
        let root = &units[0];
        let p = &m.params;
        let root_names: Vec<&str> = root.params.iter().map(|&i| p[i].name.as_str()).collect();
        assert_eq!(
            root_names,
            vec![
                "tok_embeddings.weight",
                "pos_embeddings.weight",
                "norm.weight",
                "norm.bias",
                "output.weight"
            ]
        );
    }

    #[test]
    fn module_name_patterns_match_whole_components() {
        assert!(glob_match("layers.*", "layers.10"));
        assert!(!glob_match("layers.*", "layers.1.attention"));
        assert!(glob_match("layers.*.feed_forward", "layers.1.feed_forward"));
        let m = tiny();
        let policy = WrapPolicy::ModuleNames {
            patterns: vec!["layers.*.feed_forward".into()],
        };
        let units = plan_units(&m.params, &m.segments, &policy);
        assert_eq!(
            names(&m, &units),
            vec!["root", "layers.0.feed_forward", "layers.1.feed_forward"]
        );
    }

    #[test]
    fn size_based_claims_innermost_modules_first() {
        let m = tiny();
        // w1/w2 of dim 8: 8*32+32 = 288 and 32*8+8 = 264 parameters; the attention
        // projections have 64 each; tok_embeddings 88.
        let policy = WrapPolicy::SizeBased { min_params: 250 };
        let units = plan_units(&m.params, &m.segments, &policy);
        assert_eq!(
            names(&m, &units),
            vec![
                "root",
                "layers.0.attention",
                "layers.0.feed_forward.w1",
                "layers.0.feed_forward.w2",
                "layers.1.attention",
                "layers.1.feed_forward.w1",
                "layers.1.feed_forward.w2",
            ]
        );
    }
}
