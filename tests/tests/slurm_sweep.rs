//! `shardrun sweep` against the real single-node Slurm: one job array runs every point, and
//! re-running after a change submits only the changed point.

use shardrun_e2e::*;
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(90);

fn sweep_spec(seeds: &str) -> String {
    format!(
        "name: grid\nresources:\n  tasks_per_node: 1\n  time: \"00:05:00\"\n  setup:\n    - 'echo \"task $SLURM_ARRAY_TASK_ID\" > ran.txt'\n    - exit 0\ntraining:\n  model: {{ kind: mlp, input_dim: 4, hidden_dim: 8, output_dim: 4 }}\n  steps: 1\n  total_batch_size: 4\n  batch_size_per_device: 4\nsweep:\n  grid:\n    training.seed: {seeds}\n    training.optimizer.lr: [1.0e-3, 1.0e-4]\n  throttle: 2\n"
    )
}

fn all_completed(cluster: &SlurmCluster, dir: &TestDir, expected: usize) -> Vec<(String, String)> {
    let sweep_dir = dir.join("runs/grid");
    wait_for("every point to complete", DEADLINE, || {
        let out = cluster
            .shardrun(
                dir.path(),
                &["status", "--json", &sweep_dir.to_string_lossy()],
            )
            .ok()?;
        let s = states(&stdout_of(&out));
        (s.len() == expected && s.iter().all(|(_, state)| state == "COMPLETED")).then_some(s)
    })
    .unwrap()
}

#[test]
fn array_runs_every_point_and_a_rerun_submits_only_the_changed_one() {
    let cluster = SlurmCluster::start().expect("start the local Slurm cluster");
    let dir = TestDir::new("sweep");
    let spec = dir.write("sweep.yaml", &sweep_spec("[1, 2]"));
    let spec_arg = spec.to_string_lossy().into_owned();

    let out = cluster
        .shardrun(dir.path(), &["sweep", "--dry-run", &spec_arg])
        .unwrap();
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert_eq!(stdout_of(&out).matches("submit (new)").count(), 4);
    assert!(!dir.join("runs").exists(), "dry run writes nothing");

    let out = cluster.shardrun(dir.path(), &["sweep", &spec_arg]).unwrap();
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert!(
        stdout_of(&out).contains("Submitted 4 point(s) as Slurm job array"),
        "{}",
        stdout_of(&out)
    );
    let first = all_completed(&cluster, &dir, 4);
    // Every point ran in its own run directory, as its own array task.
    let mut tasks = Vec::new();
    for (name, _) in &first {
        let ran =
            std::fs::read_to_string(dir.join("runs/grid").join(name).join("ran.txt")).unwrap();
        tasks.push(ran.trim().to_string());
    }
    tasks.sort();
    assert_eq!(tasks, ["task 0", "task 1", "task 2", "task 3"]);

    // Same spec again: nothing to do.
    let out = cluster.shardrun(dir.path(), &["sweep", &spec_arg]).unwrap();
    assert!(
        stdout_of(&out).contains("Nothing to submit"),
        "{}",
        stdout_of(&out)
    );
    assert_eq!(stdout_of(&out).matches("skip (COMPLETED)").count(), 4);

    // Change one seed: two points (seed 2 × both lrs) change, the other two are skipped.
    dir.write("sweep.yaml", &sweep_spec("[1, 3]"));
    let out = cluster.shardrun(dir.path(), &["sweep", &spec_arg]).unwrap();
    let stdout = stdout_of(&out);
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert_eq!(stdout.matches("skip (COMPLETED)").count(), 2, "{stdout}");
    assert_eq!(stdout.matches("submit (new)").count(), 2, "{stdout}");
    assert!(stdout.contains("Submitted 2 point(s)"), "{stdout}");
    let after = all_completed(&cluster, &dir, 6);
    assert_eq!(after.len(), 6, "old points stay, new ones added");
}

#[test]
fn failed_points_are_resubmitted() {
    let cluster = SlurmCluster::start().expect("start the local Slurm cluster");
    let dir = TestDir::new("sweep-retry");
    // The point with seed 2 fails the first time only (its run directory remembers).
    let text = sweep_spec("[1, 2]").replace(
        "    - exit 0\n",
        "    - 'if [ \"$(grep -o seed.:.2 train_config.json)\" ] && [ ! -e tried ]; then touch tried; exit 5; fi'\n    - exit 0\n",
    );
    let spec = dir.write("sweep.yaml", &text);
    let spec_arg = spec.to_string_lossy().into_owned();
    let out = cluster.shardrun(dir.path(), &["sweep", &spec_arg]).unwrap();
    assert!(out.status.success(), "{}", stderr_of(&out));
    let sweep_dir = dir.join("runs/grid");
    let ended = wait_for("every point to end", DEADLINE, || {
        let out = cluster
            .shardrun(
                dir.path(),
                &["status", "--json", &sweep_dir.to_string_lossy()],
            )
            .ok()?;
        let s = states(&stdout_of(&out));
        (s.len() == 4 && s.iter().all(|(_, st)| st == "COMPLETED" || st == "FAILED")).then_some(s)
    })
    .unwrap();
    assert_eq!(
        ended.iter().filter(|(_, s)| s == "FAILED").count(),
        2,
        "{ended:?}"
    );
    let out = cluster.shardrun(dir.path(), &["sweep", &spec_arg]).unwrap();
    let stdout = stdout_of(&out);
    assert_eq!(stdout.matches("submit (was FAILED)").count(), 2, "{stdout}");
    assert_eq!(stdout.matches("skip (COMPLETED)").count(), 2, "{stdout}");
    all_completed(&cluster, &dir, 4);
}
