//! Auto-wrap policies: which parameters form which FSDP unit. The rules live in
//! [`shardrun_protocol::units`] (the plan uses them too); this applies them to a model.

use crate::model::{ParamSpec, SegmentSpec};
use shardrun_protocol::config::WrapPolicy;
pub use shardrun_protocol::units::UnitPlan;

/// Splits the model's parameters into units, ordered by their first parameter.
pub fn plan_units(
    params: &[ParamSpec],
    segments: &[SegmentSpec],
    policy: &WrapPolicy,
) -> Vec<UnitPlan> {
    let sizes: Vec<(String, u64)> = params
        .iter()
        .map(|p| (p.name.clone(), p.numel() as u64))
        .collect();
    shardrun_protocol::units::plan_units(&sizes, segments, policy)
}

#[cfg(test)]
mod tests {
    use super::*;
    use shardrun_models::transformer::TransformerSizes;
    use shardrun_models::ModelDescription;

    fn tiny() -> ModelDescription {
        TransformerSizes {
            vocab_size: 11,
            dim: 8,
            n_layers: 2,
            n_heads: 2,
            max_seq_len: 4,
        }
        .describe()
    }

    fn names(units: &[UnitPlan]) -> Vec<&str> {
        units.iter().map(|u| u.name.as_str()).collect()
    }

    #[test]
    fn block_policy_is_torchtitans_embeddings_blocks_and_head() {
        let m = tiny();
        let p = m.params.clone();
        let units = plan_units(&p, &m.segments, &WrapPolicy::Block);
        assert_eq!(
            names(&units),
            vec!["embeddings", "layers.0", "layers.1", "head"]
        );
        let members =
            |u: &UnitPlan| -> Vec<&str> { u.params.iter().map(|&i| p[i].name.as_str()).collect() };
        assert_eq!(
            members(&units[0]),
            vec!["tok_embeddings.weight", "pos_embeddings.weight"]
        );
        assert_eq!(
            members(&units[3]),
            vec!["norm.weight", "norm.bias", "output.weight"]
        );
    }

    #[test]
    fn size_based_claims_innermost_modules_first() {
        let m = tiny();
        // w1/w2 of dim 8: 8*32+32 = 288 and 32*8+8 = 264 parameters; the attention
        // projections have 64 each; tok_embeddings 88. The norms are left to their block.
        let policy = WrapPolicy::SizeBased { min_params: 250 };
        let units = plan_units(&m.params.clone(), &m.segments, &policy);
        assert_eq!(
            names(&units),
            vec![
                "embeddings",
                "layers.0",
                "layers.0.attention",
                "layers.0.feed_forward.w1",
                "layers.0.feed_forward.w2",
                "layers.1",
                "layers.1.attention",
                "layers.1.feed_forward.w1",
                "layers.1.feed_forward.w2",
                "head",
            ]
        );
    }
}
