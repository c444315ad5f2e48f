//! The variables every rank gets (`resources.env` and the submitting shell's `NCCL_*`) travel
//! through `resolved.json`, which a dry run does not write: `submit --dry-run` and `plan`
//! show them, so NCCL settings can be checked before the job is submitted; credentials by
//! their length only.

mod common;
use common::{shardrun_with, stderr, text};

const SPEC: &str = "name: envs\nresources:\n  tasks_per_node: 2\n  env:\n    NCCL_IB_HCA: mlx5_0\n    GREETING: hello world\n    HF_TOKEN: hf_abcdefghij\ntraining:\n  model: { kind: mlp, input_dim: 16, hidden_dim: 32, output_dim: 16 }\n  steps: 1\n  total_batch_size: 4\n  batch_size_per_device: 2\n";

const LINE: &str = "  rank env       GREETING=\"hello world\" HF_TOKEN=<hidden, 13 characters> \
    NCCL_IB_HCA=mlx5_0 (resources.env; every rank gets them)\n  \
    shell env      NCCL_SOCKET_IFNAME=eth0 (this shell's NCCL_*; every rank gets them unless \
    the job's set-up sets them otherwise)\n";

#[test]
fn a_dry_run_and_the_plan_show_the_environment_of_every_rank() {
    let dir = common::spec_dir("job.yaml", SPEC);
    // The spec's value wins over the shell's.
    let shell = [("NCCL_SOCKET_IFNAME", "eth0"), ("NCCL_IB_HCA", "mlx5_9")];
    let out = shardrun_with(dir.path(), &["submit", "job.yaml", "--dry-run"], &shell);
    assert!(out.status.success(), "{}", text(&out));
    assert!(stderr(&out).contains(LINE), "{}", stderr(&out));
    assert!(
        !dir.path().join("runs").exists(),
        "a dry run writes nothing"
    );
    let out = shardrun_with(dir.path(), &["plan", "job.yaml"], &shell);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains(LINE), "{}", text(&out));
    assert!(!text(&out).contains("hf_abc"), "{}", text(&out));
}
