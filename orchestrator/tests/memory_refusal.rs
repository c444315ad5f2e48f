//! A job whose planned peak memory per rank exceeds its GPUs' is refused by every command
//! that would start it (`plan`, `submit`, `run`), naming the field and the way out, and goes
//! ahead with `--force`. A language model's loss counts one chunk of its logits.

mod common;
use common::{shardrun, spec_dir, text};

/// Two 1.5 GiB GPUs for an MLP of 67 M parameters: about 1 GiB of FULL_SHARD state per rank
/// alone, and the plan keeps 1 GiB of each GPU for CUDA and NCCL.
const SPEC: &str = "name: too-big\nresources:\n  gpus_per_node: 2\n  gpu_memory_gb: 1.5\ntraining:\n  model: { kind: mlp, input_dim: 4096, hidden_dim: 8192, output_dim: 4096 }\n  steps: 1\n  total_batch_size: 4\n  batch_size_per_device: 2\n";

#[test]
fn plan_submit_and_run_refuse_a_job_that_does_not_fit_unless_forced() {
    let dir = spec_dir("job.yaml", SPEC);
    for args in [
        &["plan", "job.yaml"][..],
        &["submit", "job.yaml"],
        &["submit", "job.yaml", "--dry-run"],
        &["run", "job.yaml"],
    ] {
        let out = shardrun(dir.path(), args);
        let text = text(&out);
        assert!(!out.status.success(), "{args:?} went ahead:\n{text}");
        assert!(
            text.contains("job.yaml:4:")
                && text.contains("resources.gpu_memory_gb")
                && text.contains("exceeds the 0.5 GiB a GPU has for the job")
                && text.contains("--force"),
            "{args:?}:\n{text}"
        );
        assert!(
            !dir.path().join("runs").exists(),
            "{args:?} wrote a run directory"
        );
    }
    // The ways out named are those the job does not take already and that would help: in
    // fp32 not more GPUs (what is not sharded alone exceeds the GPU), and never a smaller
    // batch or activation checkpointing (the MLP's activations are next to nothing).
    let plan = |more: &[&str]| {
        text(&shardrun(
            dir.path(),
            &[&["plan", "job.yaml"][..], more].concat(),
        ))
    };
    let shown = plan(&[]);
    assert!(
        shown.contains("fix: use bf16 parameters; or pass --force"),
        "{shown}"
    );
    // In bf16 what is not sharded fits: more GPUs shrink the rest.
    let bf16 = [
        "--set",
        "training.fsdp={mixed_precision: {param_dtype: bf16}}",
    ];
    let shown = plan(&bf16);
    assert!(
        shown.contains("fix: use more GPUs; or pass --force"),
        "{shown}"
    );
    // A GPU smaller than what is not sharded: only GPUs with more memory.
    let small = ["--set", "resources.gpu_memory_gb=1.2"];
    let shown = plan(&[&bf16[..], &small].concat());
    assert!(
        shown.contains("fix: use GPUs with more memory; or pass --force"),
        "{shown}"
    );
    let out = shardrun(dir.path(), &["plan", "job.yaml", "--force"]);
    let text = text(&out);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("warning: peak memory per rank") && text.contains("planned anyway"),
        "{text}"
    );
    let out = shardrun(dir.path(), &["submit", "job.yaml", "--force", "--dry-run"]);
    assert!(out.status.success(), "{}", self::text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("#SBATCH"));
}

/// A Llama with Llama 3's 128,256-token vocabulary and 8,192 tokens a micro-batch, whose
/// fp32 logits alone would be 3.9 GiB: the loss computes them a chunk of tokens at a time and
/// the plan counts one chunk. The default chunk (2,092 tokens, 1 GiB of logits) fits GPUs of
/// 4 GiB; the whole micro-batch in one chunk does not.
#[test]
fn the_plan_counts_one_chunk_of_the_loss() {
    let spec = |fsdp: &str| {
        format!(
            "name: wide-vocabulary\nresources:\n  gpus_per_node: 2\n  gpu_memory_gb: 4\n\
             training:\n  model: {{ kind: llama, vocab_size: 128256, dim: 256, n_layers: 2, \
             n_heads: 4, n_kv_heads: 2, ffn_dim: 688 }}\n  data: {{ kind: synthetic, seq_len: \
             4096 }}\n  steps: 1\n  total_batch_size: 4\n  batch_size_per_device: 2\n{fsdp}"
        )
    };
    let dir = spec_dir("job.yaml", &spec(""));
    let out = shardrun(dir.path(), &["plan", "job.yaml"]);
    let shown = text(&out);
    assert!(out.status.success(), "{shown}");
    assert!(
        shown.contains("the loss in chunks of 2092 of a micro-batch's 8192 tokens"),
        "{shown}"
    );
    std::fs::write(
        dir.path().join("job.yaml"),
        spec("  fsdp: { loss_chunk_tokens: 8192 }\n"),
    )
    .unwrap();
    let out = shardrun(dir.path(), &["plan", "job.yaml"]);
    let shown = text(&out);
    assert!(!out.status.success(), "{shown}");
    assert!(
        shown.contains("exceeds the 3.0 GiB a GPU has for the job"),
        "{shown}"
    );
}
