//! What a model is made of, without any tensor library: its parameters (name, shape, how they
//! are initialised, what kind of parameter they are) and the segments forward is cut into.
//!
//! Parameter count, FLOPs per token, weight-decay groups and the FSDP units are all computed
//! from this list; nothing restates the architecture in a second formula.

use serde::{Deserialize, Serialize};

/// What a parameter is: decides its weight-decay group and whether it counts as compute.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ParamKind {
    /// A matrix multiplied with the activations (an `nn.Linear`'s weight).
    Weight,
    /// An additive bias.
    Bias,
    /// The scale or shift of a normalisation layer (LayerNorm, RMSNorm).
    Norm,
    /// A lookup table (token or position embeddings).
    Embedding,
}

impl ParamKind {
    pub const ALL: [ParamKind; 4] = [
        ParamKind::Weight,
        ParamKind::Bias,
        ParamKind::Norm,
        ParamKind::Embedding,
    ];
}

/// How a parameter starts when training from scratch. Every value is a function of
/// (seed, parameter name, element index) only: see [`crate::init`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Init {
    /// `U(-bound, bound)`: PyTorch's `nn.Linear` default for weight and bias
    /// (kaiming_uniform with a = √5 gives bound 1/√fan_in).
    Uniform(f64),
    /// `N(0, std²)`, with one row left at zero: an embedding's padding row, as `transformers`
    /// initialises `nn.Embedding(padding_idx=...)`.
    Normal {
        std: f64,
        zero_row: Option<u64>,
    },
    Ones,
    Zeros,
}

impl Init {
    pub fn normal(std: f64) -> Init {
        Init::Normal {
            std,
            zero_row: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct ParamSpec {
    /// Module path as PyTorch names it, e.g. `model.layers.0.self_attn.q_proj.weight`.
    pub name: String,
    pub shape: Vec<i64>,
    pub init: Init,
    pub kind: ParamKind,
}

impl ParamSpec {
    pub fn new(name: impl Into<String>, shape: Vec<i64>, init: Init, kind: ParamKind) -> Self {
        ParamSpec {
            name: name.into(),
            shape,
            init,
            kind,
        }
    }

    pub fn numel(&self) -> i64 {
        self.shape.iter().product()
    }

    /// The module this parameter belongs to (`model.layers.0.self_attn.q_proj`).
    pub fn module_path(&self) -> &str {
        self.name.rsplit_once('.').map_or("", |(module, _)| module)
    }
}

/// One graph-cut piece of forward: the activations crossing its boundary are one tensor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentSpec {
    pub name: String,
    /// Names of the parameters this segment reads.
    pub params: Vec<String>,
    /// A repeated block: activation checkpointing applies to these.
    pub is_block: bool,
}

/// A parameter that forward also uses under another name: a tied output head reads the
/// token embedding as its weight.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TiedParam {
    /// The name a separate parameter would have (`lm_head.weight`); checkpoints of untied
    /// models carry it, tied folders do not.
    pub alias: String,
    /// The parameter it is (`model.embed_tokens.weight`).
    pub param: String,
}

/// Builds parameter lists with module prefixes, so names fall out of the structure
/// (`b.pp("model").pp("layers.0").linear("self_attn.q_proj", ...)`).
#[derive(Debug, Clone, Default)]
pub struct Builder {
    prefix: String,
}

impl Builder {
    pub fn root() -> Self {
        Builder::default()
    }

    pub fn path(&self, name: &str) -> String {
        if self.prefix.is_empty() {
            name.to_string()
        } else {
            format!("{}.{name}", self.prefix)
        }
    }

    pub fn pp(&self, prefix: &str) -> Builder {
        Builder {
            prefix: self.path(prefix),
        }
    }

    /// `nn.Linear(in_dim, out_dim)`: `weight` (out, in) and an optional `bias` (out).
    pub fn linear(
        &self,
        name: &str,
        in_dim: i64,
        out_dim: i64,
        bias: bool,
        weight_init: Init,
        bias_init: Init,
    ) -> Vec<ParamSpec> {
        let p = self.pp(name);
        let mut specs = vec![ParamSpec::new(
            p.path("weight"),
            vec![out_dim, in_dim],
            weight_init,
            ParamKind::Weight,
        )];
        if bias {
            specs.push(ParamSpec::new(
                p.path("bias"),
                vec![out_dim],
                bias_init,
                ParamKind::Bias,
            ));
        }
        specs
    }

    /// A normalisation layer's `weight` (ones), and `bias` (zeros) when it has one.
    pub fn norm(&self, name: &str, dim: i64, bias: bool) -> Vec<ParamSpec> {
        let p = self.pp(name);
        let mut specs = vec![ParamSpec::new(
            p.path("weight"),
            vec![dim],
            Init::Ones,
            ParamKind::Norm,
        )];
        if bias {
            specs.push(ParamSpec::new(
                p.path("bias"),
                vec![dim],
                Init::Zeros,
                ParamKind::Norm,
            ));
        }
        specs
    }

    /// `nn.Embedding(rows, dim)`'s `weight`.
    pub fn embedding(&self, name: &str, rows: i64, dim: i64, init: Init) -> ParamSpec {
        ParamSpec::new(
            self.pp(name).path("weight"),
            vec![rows, dim],
            init,
            ParamKind::Embedding,
        )
    }
}

/// Everything the orchestrator and the worker need to know about a model except how to run
/// it: parameters in PyTorch's `named_parameters()` order, forward's segments, tied names and
/// the attention FLOPs that no parameter accounts for.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelDescription {
    pub params: Vec<ParamSpec>,
    pub segments: Vec<SegmentSpec>,
    pub tied: Vec<TiedParam>,
    /// The output layer's weight, which the loss multiplies the last hidden states by a
    /// chunk of tokens at a time (a language model's head, or the token embedding tied to
    /// it); `None` where the last segment itself gives the loss.
    pub output_weight: Option<String>,
    /// FLOPs per token per position of context for forward + backward of the attention
    /// scores and their weighted sum: torchtitan's `12 · layers · heads · head_dim`.
    pub attention_flops_per_token_per_position: u64,
}

impl ModelDescription {
    pub fn num_params(&self) -> u64 {
        self.params.iter().map(|p| p.numel() as u64).sum()
    }

    pub fn param(&self, name: &str) -> Option<&ParamSpec> {
        self.params.iter().find(|p| p.name == name)
    }

    /// FLOPs per token for one forward and backward (torchtitan's `6·N + 12·l·h·q·t`): 6 per
    /// element of every parameter used in a matrix product (embedding lookups are not; a
    /// tied embedding is, once, as the output head) plus the attention term at `seq_len`.
    pub fn flops_per_token(&self, seq_len: u64) -> f64 {
        let matmul: u64 = self
            .params
            .iter()
            .filter(|p| p.kind != ParamKind::Embedding)
            .map(|p| p.numel() as u64)
            .sum();
        let tied: u64 = self
            .tied
            .iter()
            .filter_map(|t| self.param(&t.param))
            .map(|p| p.numel() as u64)
            .sum();
        6.0 * (matmul + tied) as f64
            + (self.attention_flops_per_token_per_position * seq_len) as f64
    }

    /// Checks that every segment reads declared parameters, every parameter is read and the
    /// last segment reads the output layer's weight.
    pub fn validate(&self) -> Result<(), String> {
        let mut seen = std::collections::HashSet::new();
        for p in &self.params {
            if !seen.insert(p.name.as_str()) {
                return Err(format!("parameter {} is declared twice", p.name));
            }
            if p.shape.iter().any(|&d| d <= 0) {
                return Err(format!("parameter {} has shape {:?}", p.name, p.shape));
            }
        }
        let mut read = std::collections::HashSet::new();
        for s in &self.segments {
            for name in &s.params {
                if !seen.contains(name.as_str()) {
                    return Err(format!(
                        "segment {} reads undeclared parameter {name}",
                        s.name
                    ));
                }
                read.insert(name.as_str());
            }
        }
        if let Some(p) = self.params.iter().find(|p| !read.contains(p.name.as_str())) {
            return Err(format!("no segment reads parameter {}", p.name));
        }
        // The loss runs in the last segment, with the output layer.
        match (&self.output_weight, self.segments.last()) {
            (Some(name), Some(last)) if !last.params.contains(name) => Err(format!(
                "the output layer's weight {name} is not read by the last segment, {}",
                last.name
            )),
            _ => Ok(()),
        }
    }
}
