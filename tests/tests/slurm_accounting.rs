//! With slurmdbd + MariaDB (`slurm/start.sh --with-accounting`), `shardrun status` answers
//! from `sacct` for jobs slurmctld has forgotten (this cluster forgets ended jobs after
//! `MinJobAge=5` seconds).

use shardrun_e2e::*;
use std::time::Duration;

fn spec(name: &str, setup: &str) -> String {
    format!(
        "name: {name}\nresources:\n  tasks_per_node: 1\n  time: \"00:05:00\"\n  setup:\n    - {setup:?}\ntraining:\n  model: {{ kind: mlp, input_dim: 4, hidden_dim: 8, output_dim: 4 }}\n  steps: 1\n  total_batch_size: 4\n  batch_size_per_device: 4\n"
    )
}

#[test]
fn status_answers_from_sacct() {
    let cluster = SlurmCluster::start_with_accounting()
        .expect("start the local Slurm cluster with accounting");
    let dir = TestDir::new("accounting");
    for (name, setup) in [("ok", "exit 0"), ("bad", "exit 3"), ("slow", "sleep 300")] {
        let spec = dir.write(&format!("{name}.yaml"), &spec(name, setup));
        cluster.submit(dir.path(), &[&spec.to_string_lossy()]);
    }
    let slow = dir.join("runs/slow");
    wait_for("the slow job to run", Duration::from_secs(60), || {
        let out = cluster
            .shardrun(dir.path(), &["status", "--json", &slow.to_string_lossy()])
            .ok()?;
        states(&stdout_of(&out))
            .iter()
            .any(|(_, s)| s == "RUNNING")
            .then_some(())
    })
    .unwrap();
    let out = cluster
        .shardrun(dir.path(), &["cancel", &slow.to_string_lossy()])
        .unwrap();
    assert!(out.status.success(), "{}", stderr_of(&out));

    // Wait until slurmctld has purged the ended jobs, so only sacct can answer.
    wait_for(
        "slurmctld to forget the ended jobs",
        Duration::from_secs(120),
        || {
            let out = cluster
                .command("squeue")
                .args(["-h", "--states=all", "-o", "%j"])
                .output()
                .ok()?;
            let names = String::from_utf8_lossy(&out.stdout).into_owned();
            let gone = out.status.success()
                && !names
                    .lines()
                    .any(|n| ["ok", "bad", "slow"].contains(&n.trim()));
            gone.then_some(())
        },
    )
    .unwrap();
    let want = vec![
        ("bad".to_string(), "FAILED".to_string()),
        ("ok".into(), "COMPLETED".into()),
        ("slow".into(), "CANCELLED".into()),
    ];
    let mut last = (Vec::new(), String::new());
    let seen = wait_for(
        "sacct to report every job ended",
        Duration::from_secs(60),
        || {
            let out = cluster.shardrun(dir.path(), &["status", "--json"]).ok()?;
            let mut s = states(&stdout_of(&out));
            s.sort();
            last = (s.clone(), stderr_of(&out));
            (s == want).then_some(stdout_of(&out))
        },
    );
    let document = seen.unwrap_or_else(|e| panic!("{e}: last {last:?}"));
    let parsed: serde_json::Value = serde_json::from_str(&document).unwrap();
    assert_eq!(parsed["source"], "squeue+sacct", "{document}");
    // A cancel during a set-up line is no set-up line ending the job: its error file says
    // nothing of one (bash runs the EXIT trap on SIGTERM, with the last line's status).
    for entry in std::fs::read_dir(&slow).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "err") {
            let said = std::fs::read_to_string(&path).unwrap();
            assert!(!said.contains("resources.setup line"), "{said}");
        }
    }
    // A run brought from another cluster, its job one neither squeue nor sacct here knows
    // (nor its result.json, which is of another job): the state shown is the run's own, and
    // the note says so rather than naming the commands that knew nothing of it.
    let moved = dir.join("runs/moved");
    std::fs::create_dir_all(&moved).unwrap();
    for entry in std::fs::read_dir(dir.join("runs/ok")).unwrap() {
        let entry = entry.unwrap();
        if entry.file_type().unwrap().is_file() {
            std::fs::copy(entry.path(), moved.join(entry.file_name())).unwrap();
        }
    }
    let manifest_path = moved.join("manifest.json");
    let mut manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&manifest_path).unwrap()).unwrap();
    manifest["state"] = "RUNNING".into();
    manifest["slurm_job_ids"] = serde_json::json!(["987654"]);
    std::fs::write(&manifest_path, manifest.to_string()).unwrap();
    let out = cluster
        .shardrun(dir.path(), &["status", "runs/moved"])
        .unwrap();
    let table = stdout_of(&out);
    assert!(
        table.contains("FAILED")
            && table.contains("Slurm no longer knows the job")
            && table.contains(
                "(Slurm knows none of these runs' jobs: states as the runs recorded them)"
            )
            && !table.contains("squeue"),
        "{table}"
    );
}
