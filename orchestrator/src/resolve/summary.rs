//! The plan as people read it (`shardrun plan`, `plan.txt`).

use super::memory::DocumentAttention;
use super::{yaml_name, ResolvedJob, GIB};
use shardrun_protocol::config::{DataConfig, DeviceKind, HeldOut, LrDecay, OnDivergence, Packing};
use shardrun_protocol::TrainConfig;
use std::fmt::Write as _;

/// What the ranks read, and what a sequence's tokens attend to.
fn data_summary(train: &TrainConfig) -> String {
    let DataConfig::Dataset(d) = &train.data else {
        return "synthetic".into();
    };
    let packing = match (d.packing, d.document_mask) {
        (Packing::Stream, false) => {
            "documents back to back, cut every seq_len, attending across their ends"
        }
        (Packing::Stream, true) => {
            "documents back to back, cut every seq_len, each attending only to itself (document_mask)"
        }
        (Packing::WholeDocuments, true) => {
            "whole documents best-fit into sequences, each attending only to itself (document_mask)"
        }
        (Packing::WholeDocuments, false) => {
            "whole documents best-fit into sequences, attending to those before them (document_mask: false)"
        }
    };
    let through = match DocumentAttention::of(train) {
        None => String::new(),
        Some(DocumentAttention::Dense { mask_bytes }) => {
            format!(" through a dense mask ({} a micro-batch)", size(mask_bytes))
        }
        Some(DocumentAttention::FlashVarlen { mask_bytes }) => format!(
            " through flash attention's variable-length kernel (GPUs of compute capability 8.0 \
             or more; older ones take a dense mask of {} a micro-batch)",
            size(mask_bytes)
        ),
    };
    let truncated = if d.truncate {
        ", the longer ones truncated to seq_len"
    } else {
        ""
    };
    let validation = match &d.validation {
        None => String::new(),
        Some(v) => {
            let held_out = match &v.held_out {
                HeldOut::Fraction { fraction } => {
                    let percent = (fraction * 1e4).round() / 100.0;
                    format!("{percent}% of the documents held out")
                }
                HeldOut::Files { files } => format!("{} file pattern(s)", files.len()),
            };
            let every = match v.every_steps {
                Some(steps) => format!("every {steps} steps and after the last"),
                None => "after the last step".to_string(),
            };
            let at_most = v
                .max_batches
                .map(|b| format!(", at most {b} batches"))
                .unwrap_or_default();
            format!("; validation on {held_out}, {every}{at_most}")
        }
    };
    format!(
        "{} from {} file pattern(s), seq_len {}, {packing}{through}{truncated}{validation}",
        d.source.kind_name(),
        d.source.files().len(),
        d.seq_len
    )
}

/// `128 KiB`, `16 MiB`, `1.5 GiB`: a small mask is not "0 MiB".
fn size(bytes: u64) -> String {
    if bytes as f64 >= GIB {
        format!("{:.1} GiB", bytes as f64 / GIB)
    } else if bytes >= 1 << 20 {
        format!("{:.0} MiB", shardrun_protocol::mib(bytes))
    } else {
        format!("{:.0} KiB", bytes as f64 / 1024.0)
    }
}

impl ResolvedJob {
    /// The plan as people read it (`shardrun plan`, `plan.txt`).
    pub fn summary(&self) -> String {
        let mut out = String::new();
        let s = &self.slurm;
        let t = &self.train;
        let b = &t.batch;
        let _ = writeln!(out, "job {}", self.name);
        let ranks = if s.gpus_per_node > 0 {
            format!("{} GPU(s)", s.gpus_per_node)
        } else {
            format!("{} CPU rank(s)", s.ntasks_per_node)
        };
        let _ = writeln!(
            out,
            "  ranks          {} = {} node(s) × {ranks}, {} CPU(s) per rank, device {}",
            self.world_size,
            s.nodes,
            s.cpus_per_task,
            yaml_name(&t.device)
        );
        let _ = writeln!(
            out,
            "  batch          {} total = {} per device × {} ranks × {} accumulation step(s)",
            b.total_batch_size, b.batch_size_per_device, b.world_size, b.grad_accum_steps
        );
        // The MLP's samples are vectors, not token sequences.
        let unit = if t.model.vocab_size().is_some() {
            "tokens"
        } else {
            "samples"
        };
        let per_step = format!("{unit}/step");
        let _ = writeln!(out, "  {per_step:<15}{}", self.tokens_per_step);
        let _ = writeln!(
            out,
            "  steps          {} ({} {unit} in all){}",
            t.steps,
            self.tokens_per_step * t.steps,
            match (t.on_divergence, t.model.blown_up_loss()) {
                (OnDivergence::Continue, _) => String::new(),
                (OnDivergence::Stop, None) => {
                    "; stops at the first whose loss or gradients are not finite".to_string()
                }
                (OnDivergence::Stop, Some(limit)) => format!(
                    "; stops at the first whose loss or gradients are not finite, or whose \
                     loss blows up past {limit:.1} ({} times a uniform guess's)",
                    shardrun_models::BLOWN_UP_FACTOR
                ),
            }
        );
        let _ = writeln!(
            out,
            "  model          {}: {} parameters",
            t.model.summary(),
            self.memory.num_params
        );
        let _ = writeln!(out, "  data           {}", data_summary(t));
        // HYBRID_SHARD's groups: sharded within, replicated across.
        let groups = match t.fsdp.shard_group_size {
            Some(group) if group > 0 => format!(
                " (shard groups of {group} rank(s), {} replica(s))",
                self.world_size / group
            ),
            _ => String::new(),
        };
        let _ = writeln!(out, "  fsdp           {}{groups}, wrap {}, params {} / reduce {}, activation checkpointing {}, prefetch {}{}", yaml_name(&t.fsdp.strategy), yaml_name(&t.fsdp.wrap), yaml_name(&t.fsdp.mixed_precision.param_dtype), yaml_name(&t.fsdp.mixed_precision.reduce_dtype), t.fsdp.activation_checkpointing, t.fsdp.prefetch, loss_chunks(t));
        let _ = writeln!(
            out,
            "  optimizer      AdamW lr {} betas ({}, {}) eps {} weight decay {} (none on {}), {}, warmup {} then {}",
            short_number(t.optimizer.lr),
            t.optimizer.beta1,
            t.optimizer.beta2,
            short_number(t.optimizer.eps),
            short_number(t.optimizer.weight_decay),
            if t.optimizer.no_weight_decay.is_empty() {
                "no parameter kind".to_string()
            } else {
                t.optimizer
                    .no_weight_decay
                    .iter()
                    .map(yaml_name)
                    .collect::<Vec<_>>()
                    .join(", ")
            },
            // Said either way: the Trainer clips at 1.0 unasked, shardrun only when asked.
            match t.optimizer.grad_clip {
                Some(clip) => format!("gradients clipped to norm {}", short_number(clip)),
                None => "no gradient clipping".to_string(),
            },
            t.schedule.warmup_steps,
            match t.schedule.decay {
                LrDecay::Constant => "constant".to_string(),
                decay => format!("{} to ×{}", yaml_name(&decay), t.schedule.min_lr_ratio),
            }
        );
        let _ = writeln!(
            out,
            "  memory/rank    peak per rank = state + gathered parameters + gradient buffers + activations, at the peak ({}activation checkpointing):",
            if t.fsdp.activation_checkpointing { "" } else { "no " }
        );
        for m in &self.memory.per_strategy {
            let mark = if m.strategy == self.memory.strategy {
                "  <- chosen"
            } else {
                ""
            };
            let (unit, scale) = if m.peak as f64 >= GIB {
                ("GiB", GIB)
            } else {
                ("MiB", (1u64 << 20) as f64)
            };
            let p = &m.at_peak;
            let x = |bytes: u64| bytes as f64 / scale;
            let _ = writeln!(
                out,
                "    {:<14} {:>8.2} {unit} = {:.2} state + {:.2} gathered + {:.2} gradients + {:.2} activations{mark}",
                yaml_name(&m.strategy),
                x(m.peak),
                x(p.state),
                x(p.gathered),
                x(p.gradients),
                x(p.activations),
            );
        }
        if let Some(usable) = self.memory.usable_gpu_bytes() {
            let _ = writeln!(
                out,
                "    GPU memory     {:>8.2} GiB, {:.2} GiB for the job after CUDA and NCCL",
                self.memory.gpu_memory_bytes.unwrap_or(0) as f64 / GIB,
                usable as f64 / GIB
            );
        } else if t.device == DeviceKind::Cuda {
            let _ = writeln!(
                out,
                "    GPU memory     not given (`resources.gpu_memory_gb`): the fit is not checked"
            );
        }
        let _ = writeln!(
            out,
            "  checkpoints    {}",
            match &t.checkpoint.dir {
                Some(dir) => {
                    let every: Vec<String> = t
                        .checkpoint
                        .interval_steps
                        .map(|s| format!("{s} steps"))
                        .into_iter()
                        .chain(t.checkpoint.interval_minutes.map(|m| format!("{m} min")))
                        .collect();
                    format!(
                        "{}{} every {}, keep {}{}; {}",
                        dir.display(),
                        if dir.is_relative() {
                            " (in the run directory)"
                        } else {
                            ""
                        },
                        every.join(" or "),
                        t.checkpoint.keep,
                        if t.checkpoint.resume {
                            ""
                        } else {
                            "; never resumes (resume: false)"
                        },
                        checkpoint_disk(self.memory.num_params, t.checkpoint.keep)
                    )
                }
                None if t.checkpoint.resume => {
                    "no periodic saves; the final and preemption checkpoints go to the run \
                     directory, and a re-run or requeue resumes from them"
                        .into()
                }
                None => "off; never resumes (resume: false)".into(),
            }
        );
        if let Some(from) = &t.checkpoint.from {
            // One checkpoint (or a Hugging Face folder), or a folder of them.
            let one = from.join("COMPLETE").is_file() || from.join("config.json").is_file();
            let _ = writeln!(
                out,
                "  starts from    the weights of {}{} (a fresh optimizer and LR schedule), {}",
                if one { "" } else { "the newest checkpoint in " },
                from.display(),
                match t.checkpoint.resume {
                    true => "while the run has no checkpoint of its own to resume",
                    false => "at every start (resume: false)",
                }
            );
        }
        // The job's own count: a job that does not requeue is allowed none.
        let requeue = match self.preemption.requeue {
            true => format!("true (max {})", self.preemption.max_requeues),
            false => "false".to_string(),
        };
        // A job without a time limit hears USR2 only when it is preempted.
        let notice = match (&s.time, s.time_limit_seconds) {
            (Some(_), None) => "USR2 on preemption (no time limit)".to_string(),
            _ => format!("USR2 {} s before the limit", self.preemption.signal_seconds),
        };
        let _ = writeln!(
            out,
            "  slurm          time {}, partition {}, {notice}, requeue {requeue}",
            s.time.as_deref().unwrap_or("(partition default)"),
            s.partition.as_deref().unwrap_or("(default)"),
        );
        // They reach the ranks through resolved.json, not the script: shown here so they
        // can be checked before the job is submitted.
        let (shell, spec): (Vec<_>, Vec<_>) = s
            .env
            .iter()
            .cloned()
            .partition(|(name, _)| s.from_shell.contains(name));
        if !spec.is_empty() {
            let _ = writeln!(
                out,
                "  rank env       {} (resources.env; every rank gets them)",
                shown_variables(&spec)
            );
        }
        if !shell.is_empty() {
            let _ = writeln!(
                out,
                "  shell env      {} (this shell's NCCL_*; every rank gets them unless the \
                 job's set-up sets them otherwise)",
                shown_variables(&shell)
            );
        }
        for w in &self.warnings {
            let _ = writeln!(out, "warning: {w}");
        }
        out
    }
}

/// `NAME=value ...` as [`shown_value`] shows each.
/// A setting as written in a spec: `3e-4` rather than `0.0003`, and `1e-12` rather than a
/// row of zeros.
fn short_number(x: f64) -> String {
    if x != 0.0 && (x.abs() < 1e-3 || x.abs() >= 1e6) {
        format!("{x:e}")
    } else {
        x.to_string()
    }
}

pub(crate) fn shown_variables(vars: &[(String, String)]) -> String {
    let shown: Vec<String> = vars
        .iter()
        .map(|(name, value)| format!("{name}={}", shown_value(name, value)))
        .collect();
    shown.join(" ")
}

/// A variable's value as it reads in one line: quoted and escaped when it is empty or holds
/// spaces, quotes or control characters; a credential hidden (plans are pasted where others
/// read them): the whole value when the name says it is one, the password of a URL.
pub(crate) fn shown_value(name: &str, value: &str) -> String {
    if is_credential(name) {
        return format!("<hidden, {} characters>", value.chars().count());
    }
    let value = without_url_password(value);
    let plain = !value.is_empty()
        && value
            .chars()
            .all(|c| c.is_ascii_graphic() && c != '"' && c != '\'' && c != '\\');
    if plain {
        value
    } else {
        format!("{value:?}")
    }
}

/// Names with a word like `TOKEN`, `SECRET`, `PASSWORD` or `KEY` between underscores:
/// `HF_TOKEN`, `WANDB_API_KEY`, `AWS_SECRET_ACCESS_KEY`, not `TOKENIZERS_PARALLELISM`.
fn is_credential(name: &str) -> bool {
    const WORDS: [&str; 8] = [
        "TOKEN",
        "SECRET",
        "PASSWORD",
        "PASSWD",
        "KEY",
        "APIKEY",
        "CREDENTIALS",
        "AUTH",
    ];
    name.to_ascii_uppercase()
        .split(|c: char| !c.is_ascii_alphanumeric())
        .any(|word| WORDS.contains(&word))
}

/// `http://user:secret@proxy:3128` as `http://user:<hidden>@proxy:3128`.
fn without_url_password(value: &str) -> String {
    let Some(scheme_end) = value.find("://").map(|i| i + 3) else {
        return value.to_string();
    };
    let rest = &value[scheme_end..];
    let authority = &rest[..rest.find('/').unwrap_or(rest.len())];
    let Some(at) = authority.rfind('@') else {
        return value.to_string();
    };
    let Some(colon) = authority[..at].find(':') else {
        return value.to_string();
    };
    format!(
        "{}{}<hidden>{}",
        &value[..scheme_end],
        &authority[..=colon],
        &value[scheme_end + at..]
    )
}

/// How the loss splits a micro-batch, where it does: `, the loss in chunks of 128 of a
/// micro-batch's 1024 tokens` (the memory plan counts one chunk's logits).
fn loss_chunks(t: &TrainConfig) -> String {
    let tokens = t.tokens_per_micro_batch();
    match t.loss_chunk_tokens() {
        Some(chunk) if chunk < tokens => {
            format!(", the loss in chunks of {chunk} of a micro-batch's {tokens} tokens")
        }
        _ => String::new(),
    }
}

/// The disk a run's checkpoints take: fp32 weights and AdamW's two moments, 12 bytes a
/// parameter each, `keep` of them and the next one being written.
fn checkpoint_disk(num_params: u64, keep: usize) -> String {
    let each = num_params * 12;
    format!(
        "{} each (fp32 weights and AdamW moments), up to {} on disk while the next is written",
        size(each),
        size(each * (keep as u64 + 1))
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkpoints_take_twelve_bytes_a_parameter_each() {
        // Llama 3 8B: 8,030,261,248 parameters, 96.4 GB a checkpoint.
        assert_eq!(
            checkpoint_disk(8_030_261_248, 2),
            "89.7 GiB each (fp32 weights and AdamW moments), up to 269.2 GiB on disk while the \
             next is written"
        );
        assert!(checkpoint_disk(1_000_000, 1).starts_with("11 MiB each"));
    }

    /// A fine-tune of another run's checkpoint says where its weights come from.
    #[test]
    fn the_plan_names_the_checkpoint_a_run_starts_from() {
        let loaded = crate::spec::parse(
            include_str!("../../../examples/demo.yaml"),
            std::path::Path::new("demo.yaml"),
        )
        .unwrap();
        let mut job =
            crate::resolve::resolve(&loaded, &crate::resolve::Overrides::default()).unwrap();
        assert!(!job.summary().contains("starts from"));
        let dir = tempfile::tempdir().unwrap();
        let step = dir.path().join("step-60");
        std::fs::create_dir(&step).unwrap();
        std::fs::write(step.join("COMPLETE"), "").unwrap();
        job.train.checkpoint.from = Some(step.clone());
        assert!(
            job.summary().contains(&format!(
                "\n  starts from    the weights of {} (a fresh optimizer and LR schedule), while \
                 the run has no checkpoint of its own to resume\n",
                step.display()
            )),
            "{}",
            job.summary()
        );
        job.train.checkpoint.from = Some(dir.path().to_path_buf());
        job.train.checkpoint.resume = false;
        assert!(
            job.summary().contains(&format!(
                "the weights of the newest checkpoint in {} (a fresh optimizer and LR schedule), \
                 at every start (resume: false)\n",
                dir.path().display()
            )),
            "{}",
            job.summary()
        );
    }

    #[test]
    fn sizes_keep_a_figure_however_small() {
        assert_eq!(size(2 * 128 * 128 * 4), "128 KiB");
        assert_eq!(size(3 << 20), "3 MiB");
        assert_eq!(size(3 << 29), "1.5 GiB");
    }

    #[test]
    fn credentials_are_hidden_and_nothing_else() {
        let hidden = "<hidden, 3 characters>";
        for (name, shown) in [
            ("HF_TOKEN", hidden),
            ("WANDB_API_KEY", hidden),
            ("AWS_SECRET_ACCESS_KEY", hidden),
            ("DB_PASSWORD", hidden),
            ("TOKENIZERS_PARALLELISM", "abc"),
            ("MAX_TOKENS", "abc"),
            ("NCCL_IB_HCA", "abc"),
            ("KEYBOARD", "abc"),
        ] {
            assert_eq!(shown_value(name, "abc"), shown, "{name}");
        }
        assert_eq!(
            shown_value("HTTPS_PROXY", "http://me:s3cret@proxy:3128/x"),
            "http://me:<hidden>@proxy:3128/x"
        );
        assert_eq!(
            shown_value("HTTPS_PROXY", "http://proxy:3128"),
            "http://proxy:3128"
        );
    }
}
