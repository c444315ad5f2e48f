//! A sweep on a cluster whose accounting enforces a per-user `MaxSubmitJobs`
//! (`slurm/start.sh --with-accounting`, `AccountingStorageEnforce=associations,limits`):
//! `shardrun sweep` reads the limit through `sacctmgr`, queues only what fits, and the next
//! sweeps submit the rest once room frees up. slurmctld itself rejecting an array one task
//! over the limit is the ground truth that the limit is real. On a cluster whose
//! `MaxJobCount` is small, the sweep queues what slurmctld accepts: fewer than the limit.

use shardrun_e2e::*;
use std::time::Duration;

const LIMIT: usize = 12;

fn sacctmgr(cluster: &SlurmCluster, setting: &str) {
    let out = cluster
        .command("sacctmgr")
        .args(["-i", "modify", "user", "root", "set", setting])
        .output()
        .expect("sacctmgr runs");
    assert!(
        out.status.success(),
        "sacctmgr {setting}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Puts the association back as it was, however the test ends.
struct ResetLimit<'a>(&'a SlurmCluster);

impl Drop for ResetLimit<'_> {
    fn drop(&mut self) {
        sacctmgr(self.0, "MaxSubmitJobs=-1");
    }
}

fn spec() -> String {
    "name: limited\nresources:\n  tasks_per_node: 1\n  time: \"00:05:00\"\n  setup:\n    - 'echo ran >> ran.txt'\n    - exit 0\ntraining:\n  model: { kind: mlp, input_dim: 4, hidden_dim: 8, output_dim: 4 }\n  steps: 1\n  total_batch_size: 4\n  batch_size_per_device: 4\nsweep:\n  grid:\n    training.seed: [1, 2, 3, 4, 5]\n    training.optimizer.lr: [1.0e-3, 1.0e-4, 1.0e-5, 1.0e-6, 1.0e-7]\n".to_string()
}

/// Points of the sweep folder and their states, once none is pending or running.
fn settled(cluster: &SlurmCluster, dir: &TestDir) -> Vec<(String, String)> {
    let sweep_dir = dir.join("runs/limited");
    wait_for(
        "the submitted points to end",
        Duration::from_secs(180),
        || {
            let out = cluster
                .shardrun(
                    dir.path(),
                    &["status", "--json", &sweep_dir.to_string_lossy()],
                )
                .ok()?;
            let s = states(&stdout_of(&out));
            s.iter().all(|(_, st)| st == "COMPLETED").then_some(s)
        },
    )
    .unwrap()
}

#[test]
fn a_sweep_queues_no_more_than_max_submit_jobs_and_the_next_sweeps_submit_the_rest() {
    let cluster = SlurmCluster::start_with_accounting()
        .expect("start the local Slurm cluster with accounting");
    let dir = TestDir::new("sweep-limits");
    wait_for(
        "root's earlier jobs on this cluster to end",
        Duration::from_secs(120),
        || {
            let out = cluster
                .command("squeue")
                .args(["-h", "-u", "root", "-t", "PD,R,CG,S"])
                .output()
                .ok()?;
            (out.status.success() && out.stdout.is_empty()).then_some(())
        },
    )
    .unwrap();
    sacctmgr(&cluster, &format!("MaxSubmitJobs={LIMIT}"));
    let _reset = ResetLimit(&cluster);
    // slurmctld learns the new limit from slurmdbd: wait until it rejects LIMIT + 1 tasks.
    let probe = dir.write("probe.sh", "#!/bin/bash\ntrue\n");
    wait_for(
        "slurmctld to enforce MaxSubmitJobs",
        Duration::from_secs(60),
        || {
            let out = cluster
                .command("sbatch")
                .args(["--parsable", "--hold", "-o", "/dev/null"])
                .arg(format!("--array=0-{LIMIT}"))
                .arg(&probe)
                .output()
                .ok()?;
            if out.status.success() {
                let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
                let _ = cluster.command("scancel").arg(id).output();
                return None;
            }
            String::from_utf8_lossy(&out.stderr)
                .contains("AssocMaxSubmitJobLimit")
                .then_some(())
        },
    )
    .unwrap();

    let spec = dir.write("sweep.yaml", &spec());
    let spec_arg = spec.to_string_lossy().into_owned();
    let out = cluster
        .shardrun(dir.path(), &["sweep", "--dry-run", &spec_arg])
        .unwrap();
    let stdout = stdout_of(&out);
    assert!(out.status.success(), "{stdout}{}", stderr_of(&out));
    assert!(
        stdout.contains(&format!(
            "room for {LIMIT} more queued jobs: MaxSubmitJobs of user root, account root (sacctmgr) is {LIMIT}, 0 in use"
        )),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!(
            "would submit {LIMIT} point(s) as 1 job array(s), skip 0, leave 13 waiting"
        )),
        "{stdout}"
    );

    // 25 points under a limit of 12: 12, then 12, then 1, each sweep after the last ended
    // (a throttle above an array's size changes nothing else, and the hint repeats it).
    let mut ran = 0;
    for expected in [LIMIT, LIMIT, 1] {
        let args = ["sweep", &spec_arg, "--throttle", "20"];
        let out = cluster.shardrun(dir.path(), &args).unwrap();
        let stdout = stdout_of(&out);
        assert!(out.status.success(), "{stdout}{}", stderr_of(&out));
        if ran + expected < 25 {
            assert!(
                stdout.contains(&format!(
                    "run `shardrun sweep {spec_arg} --throttle 20` again when some have ended"
                )),
                "{stdout}"
            );
        }
        assert!(
            stdout.contains(&format!("Submitted {expected} point(s) as 1 job array(s)")),
            "{stdout}"
        );
        assert_eq!(
            stdout.matches("wait (no room now)").count(),
            25 - ran - expected,
            "{stdout}"
        );
        ran += expected;
        assert_eq!(settled(&cluster, &dir).len(), ran);
    }
    let out = cluster.shardrun(dir.path(), &["sweep", &spec_arg]).unwrap();
    assert!(
        stdout_of(&out).contains("Nothing to submit"),
        "{}",
        stdout_of(&out)
    );
    for entry in std::fs::read_dir(dir.join("runs/limited"))
        .unwrap()
        .flatten()
    {
        if entry.path().join("manifest.json").is_file() {
            let ran = std::fs::read_to_string(entry.path().join("ran.txt")).unwrap();
            assert_eq!(
                ran.lines().count(),
                1,
                "{} ran once",
                entry.path().display()
            );
        }
    }
}

#[test]
fn a_sweep_under_max_job_count_queues_what_slurmctld_accepts() {
    // slurmctld refuses a submission that would bring the jobs it holds to MaxJobCount (12
    // here): filling the limit exactly would have the whole array refused.
    let cluster = SlurmCluster::start_named("job-count").expect("start the MaxJobCount=12 cluster");
    let dir = TestDir::new("sweep-job-count");
    let spec = dir.write("sweep.yaml", &spec());
    let spec_arg = spec.to_string_lossy().into_owned();
    // Jobs of an earlier run of this test are held for MinJobAge (5 s), then purged.
    let dry_run = wait_for("slurmctld to hold no job", Duration::from_secs(180), || {
        let out = cluster
            .shardrun(dir.path(), &["sweep", "--dry-run", &spec_arg])
            .ok()?;
        let stdout = stdout_of(&out);
        assert!(out.status.success(), "{stdout}{}", stderr_of(&out));
        let limit = stdout.lines().find(|l| l.contains("MaxJobCount"));
        limit?.ends_with(", 0 in use").then_some(stdout)
    })
    .unwrap();
    // An override decides the points: the hint and the recorded spec repeat it.
    let out = cluster
        .shardrun(
            dir.path(),
            &["sweep", &spec_arg, "--set", "training.steps=2"],
        )
        .unwrap();
    let stdout = stdout_of(&out);
    assert!(out.status.success(), "{stdout}{}", stderr_of(&out));
    assert!(
        stdout.contains("Submitted 11 point(s) as 1 job array(s)"),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!(
            "run `shardrun sweep {spec_arg} --set training.steps=2` again when some have ended"
        )),
        "{stdout}"
    );
    let recorded: Vec<String> = std::fs::read_dir(dir.join("runs/limited/arrays"))
        .unwrap()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "yaml"))
        .map(|e| std::fs::read_to_string(e.path()).unwrap())
        .collect();
    assert!(
        matches!(recorded.as_slice(), [spec] if spec.starts_with(&format!("# {spec_arg} with --set training.steps=2"))
            && spec.contains("steps: 2")),
        "{recorded:?}"
    );
    assert!(
        dry_run.contains(
            "room for 11 more queued jobs: MaxJobCount, every user's jobs slurmctld holds \
             (scontrol show config) is 12 (a job is accepted while fewer are held), 0 in use"
        ),
        "{dry_run}"
    );
}
