//! Two job configs compared field by field (JSON paths such as `optimizer.lr`), and the
//! fields a resumed job may change: where, how fast and for how long it trains, not what it
//! computes. `shardrun` refuses other changes before a resume; the worker names any it
//! finds when it loads a checkpoint.

use serde_json::Value;
use std::collections::BTreeMap;

/// [`crate::TrainConfig`] fields a resumed job may change. The checkpoint reshards to any
/// world size, strategy and wrap policy; the LR schedule follows `steps`; the rest is
/// scheduling and bookkeeping.
pub const RESUMABLE: &[&str] = &[
    "name",
    "steps",
    "batch.world_size",
    "batch.batch_size_per_device",
    "batch.grad_accum_steps",
    "checkpoint.interval_steps",
    "checkpoint.interval_minutes",
    "checkpoint.keep",
    "checkpoint.format",
    "checkpoint.resume",
    "log_every",
    "on_divergence",
    "threads_per_rank",
    "device",
    // How the state is sharded and gathered, not what is computed: checkpoints load under
    // any strategy and wrap policy.
    "fsdp.strategy",
    "fsdp.wrap",
    "fsdp.shard_group_size",
    "fsdp.prefetch",
    "fsdp.max_gathers_in_flight",
    "fsdp.activation_checkpointing",
    "fsdp.loss_chunk_tokens",
    // How often and how much is evaluated; what is held out is the data's identity.
    "data.validation.every_steps",
    "data.validation.max_batches",
];

/// Whether `path` is one of `prefixes` or lies under one (`fsdp.prefetch` under `fsdp`).
pub fn under(path: &str, prefixes: &[&str]) -> bool {
    prefixes.iter().any(|p| {
        path == *p
            || path
                .strip_prefix(p)
                .is_some_and(|rest| rest.starts_with('.'))
    })
}

/// Every leaf of `value` by its dotted path; objects are walked, anything else (lists
/// included) is one value.
fn flatten(value: &Value) -> BTreeMap<String, Value> {
    fn walk(prefix: &str, value: &Value, out: &mut BTreeMap<String, Value>) {
        match value {
            Value::Object(map) => {
                for (key, v) in map {
                    let path = if prefix.is_empty() {
                        key.clone()
                    } else {
                        format!("{prefix}.{key}")
                    };
                    walk(&path, v, out);
                }
            }
            other => {
                out.insert(prefix.to_string(), other.clone());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk("", value, &mut out);
    out
}

/// The fields whose values differ between `was` and `now` (a field only one has counts,
/// as null on the other side), sorted: (path, was, now).
pub fn differences(was: &Value, now: &Value) -> Vec<(String, Value, Value)> {
    let (was, now) = (flatten(was), flatten(now));
    let mut paths: Vec<&String> = was.keys().chain(now.keys()).collect();
    paths.sort();
    paths.dedup();
    paths
        .into_iter()
        .filter_map(|path| {
            let a = was.get(path).cloned().unwrap_or(Value::Null);
            let b = now.get(path).cloned().unwrap_or(Value::Null);
            (a != b).then(|| (path.clone(), a, b))
        })
        .collect()
}

/// A value as a person reads it: strings unquoted, null as "(not set)".
pub fn shown(value: &Value) -> String {
    match value {
        Value::Null => "(not set)".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn differences_are_leaves_by_path_with_missing_ones_as_null() {
        let was = json!({"optimizer": {"lr": 0.0003, "betas": [0.9, 0.95]}, "steps": 10});
        let now = json!({"optimizer": {"lr": 0.01, "betas": [0.9, 0.95]}, "steps": 10, "seed": 1});
        let found = differences(&was, &now);
        assert_eq!(
            found,
            [
                ("optimizer.lr".to_string(), json!(0.0003), json!(0.01)),
                ("seed".to_string(), Value::Null, json!(1)),
            ]
        );
        assert_eq!(shown(&Value::Null), "(not set)");
        assert!(under("fsdp.prefetch", RESUMABLE));
        assert!(under("checkpoint.keep", RESUMABLE));
        assert!(under("data.validation.every_steps", RESUMABLE));
        assert!(!under("data.validation.held_out", RESUMABLE));
        assert!(!under("checkpoint.dir", RESUMABLE));
        assert!(!under("fsdpx", &["fsdp"]));
    }
}
