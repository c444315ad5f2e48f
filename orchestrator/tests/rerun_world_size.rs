//! Running a local run again on another number of ranks (`--nproc`): its total batch cannot
//! change on resume, so a world size the batch does not split on is answered with the world
//! sizes it does split on, and a world size that works is named as `--nproc`, not as
//! resource keys the user never changed.
//!
//! The ranks are `false`: each run fails at once, leaving a run directory to run again.

mod common;
use common::{shardrun_with, spec_dir, text};
use std::path::Path;
use std::process::Output;

const SPEC: &str = "name: t
resources: { tasks_per_node: 2 }
training:
  model: { kind: mlp, input_dim: 4, hidden_dim: 8, output_dim: 4 }
  steps: 2
  total_batch_size: 8
  batch_size_per_device: 1
";

/// The ranks are `false`: they exit at once, failing the run.
fn shardrun(dir: &Path, args: &[&str]) -> Output {
    shardrun_with(dir, args, &[("SHARDRUN_WORKER_BIN", "false")])
}

#[test]
fn another_world_size_on_resume_is_answered_with_the_ones_the_batch_splits_on() {
    let dir = spec_dir("job.yaml", SPEC);
    // A new run may change its total batch: the nearest totals are the way out.
    let out = shardrun(dir.path(), &["plan", "job.yaml", "--nproc", "3"]);
    assert!(
        text(&out)
            .contains("fix: set `total_batch_size` to a multiple of 1 × 3 = 3: nearest 6 or 9"),
        "{}",
        text(&out)
    );
    let out = shardrun(dir.path(), &["run", "job.yaml"]);
    assert!(
        text(&out).contains("died with exit code 1"),
        "{}",
        text(&out)
    );
    assert!(dir.path().join("runs/t/manifest.json").is_file());

    let out = shardrun(dir.path(), &["run", "job.yaml", "--nproc", "3"]);
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "\
error: job.yaml:6:3: field `training.total_batch_size`: total batch 8 does not split into per-device batches of 1 on 3 ranks (--nproc; 8 / 3 is not a whole number of accumulation steps)
  |
6 |   total_batch_size: 8
  |   ^^^^^^^^^^^^^^^^
  fix: a resumed run keeps its total batch (it decides what a step computes): run it on 1, 2, 4 or 8 ranks (--nproc): those split the total batch of 8 into whole per-device batches of 1; or start it over with --force
"
    );
    let out = shardrun(dir.path(), &["run", "job.yaml", "--nproc", "4"]);
    let shown = text(&out);
    assert!(
        shown.contains("  changed on resume: world size: 2 → 4 (--nproc 4)\n")
            && !shown.contains("tasks_per_node"),
        "{shown}"
    );
    // Back to the spec's resources: the world size follows them again.
    let out = shardrun(dir.path(), &["run", "job.yaml"]);
    let shown = text(&out);
    assert!(
        shown.contains("  changed on resume: world size: 4 → 2 (was --nproc 4)\n")
            && !shown.contains("tasks_per_node"),
        "{shown}"
    );
}

#[test]
fn a_larger_per_device_batch_lists_what_a_smaller_one_adds() {
    let dir = spec_dir(
        "job.yaml",
        &SPEC.replace("batch_size_per_device: 1", "batch_size_per_device: 2"),
    );
    shardrun(dir.path(), &["run", "job.yaml"]);
    let out = shardrun(dir.path(), &["run", "job.yaml", "--nproc", "8"]);
    let shown = text(&out);
    assert!(
        shown.contains(
            "fix: a resumed run keeps its total batch (it decides what a step computes): run it \
             on 1, 2 or 4 ranks (--nproc): those split the total batch of 8 into whole \
             per-device batches of 2; or keep 8 ranks with `batch_size_per_device: 1`; or start \
             it over with --force"
        ),
        "{shown}"
    );
}
