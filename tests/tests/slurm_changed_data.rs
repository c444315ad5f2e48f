//! A run whose training data files changed since its checkpoint (added to, resized, modified)
//! is refused by `shardrun submit` before anything is queued, and a sweep does not submit
//! such a point. A change only preparing tells (a file rewritten keeping its size and
//! modification time) reaches the allocation: the job prepares the new data there and
//! refuses to start any rank. The run keeps how it had ended, and `shardrun status` says
//! which job refused and why, where Slurm's own record says only that the job exited 1.

use shardrun_e2e::*;
use std::time::Duration;

/// A tiny transformer on the lines of the GNU GPL (every Debian machine has it), read with
/// the byte tokenizer, checkpointed every 3 steps.
const SPEC: &str = "name: changed\nresources:\n  tasks_per_node: 2\n  cpus_per_task: 1\n  time: \"00:05:00\"\ntraining:\n  model: { kind: transformer, vocab_size: 257, dim: 16, n_layers: 1, n_heads: 2, max_seq_len: 32 }\n  data:\n    kind: text\n    files: [data/gpl.txt]\n    split: line\n    tokenizer: { kind: bytes }\n  checkpoint: { interval_steps: 3 }\n  steps: 6\n  total_batch_size: 8\n  batch_size_per_device: 4\n";

/// The cluster, a test folder, and the text of `data/gpl.txt` written into it.
fn cluster_and_data(name: &str) -> (SlurmCluster, TestDir, String) {
    let cluster = SlurmCluster::start().expect("start the local Slurm cluster");
    let dir = TestDir::new(name);
    let gpl = std::fs::read_to_string("/usr/share/common-licenses/GPL-3")
        .expect("/usr/share/common-licenses/GPL-3 is missing (Debian's base-files has it)");
    dir.write("data/gpl.txt", &gpl);
    (cluster, dir, gpl)
}

/// Rewrites `data/gpl.txt` with other contents of the same size, modified at `modified`,
/// the time the run recorded: its files look the same, and only its tokens tell.
fn change_unseen(dir: &TestDir, gpl: &str, modified: std::time::SystemTime) {
    let changed = gpl.replacen("GNU", "gnu", 1);
    assert_ne!(changed, gpl);
    dir.rewrite_keeping_time("data/gpl.txt", &changed, modified);
}

/// The run's state and detail once its latest job has ended.
fn ended(cluster: &SlurmCluster, dir: &TestDir, run: &str) -> serde_json::Value {
    wait_for("the job to end", Duration::from_secs(300), || {
        let out = cluster
            .shardrun(dir.path(), &["status", "--json", run])
            .ok()?;
        status_runs(&stdout_of(&out))
            .into_iter()
            .find(|r| !matches!(r["state"].as_str(), Some("SUBMITTED" | "RUNNING")))
    })
    .unwrap()
}

#[test]
fn a_job_refused_for_changed_data_is_named_in_the_status_of_the_run_it_left_as_it_was() {
    let (cluster, dir, gpl) = cluster_and_data("slurm-changed-data");
    dir.write("job.yaml", SPEC);
    cluster.submit(dir.path(), &["job.yaml"]);
    let run = dir.join("runs/changed");
    let first = ended(&cluster, &dir, "runs/changed");
    assert_eq!(first["state"], "COMPLETED", "{first}");

    // A line is added: submitting the run to train 3 more steps is refused at once, naming
    // the file, and nothing is queued.
    let trained_on = dir.modified("data/gpl.txt");
    let grown = format!("{gpl}one more line\n");
    dir.write("data/gpl.txt", &grown);
    let manifest = std::fs::read_to_string(run.join("manifest.json")).unwrap();
    let out = cluster
        .shardrun(
            dir.path(),
            &["submit", "runs/changed", "--set", "training.steps=9"],
        )
        .unwrap();
    let stderr = stderr_of(&out);
    assert!(!out.status.success(), "{}{stderr}", stdout_of(&out));
    assert!(
        submitted_job_id(&stdout_of(&out)).is_none(),
        "{}",
        stdout_of(&out)
    );
    for said in [
        "changed since its checkpoint of step 6 was saved (data ".to_string(),
        " then, other files now)".to_string(),
        format!(
            "{}: changed ({} → {} bytes)",
            dir.join("data/gpl.txt").display(),
            gpl.len(),
            grown.len()
        ),
        "nothing was started: the run keeps its checkpoints".to_string(),
    ] {
        assert!(stderr.contains(&said), "missing {said:?} in {stderr}");
    }
    assert_eq!(
        std::fs::read_to_string(run.join("manifest.json")).unwrap(),
        manifest,
        "the run is as it was"
    );

    // Contents that change keeping the file's size and time: the job is accepted (the new
    // data is not prepared yet) and refuses inside the allocation.
    change_unseen(&dir, &gpl, trained_on);
    let job_id = cluster
        .submit(dir.path(), &["runs/changed", "--set", "training.steps=9"])
        .job_id;
    let refused = ended(&cluster, &dir, "runs/changed");
    assert_eq!(refused["state"], "COMPLETED", "{refused}");
    let detail = refused["detail"].as_str().unwrap_or_default();
    assert!(
        detail.starts_with(&format!(
            "Slurm job {job_id} refused to start: its training data changed since the \
             checkpoint of step 6 was saved"
        )),
        "{refused}"
    );
    assert!(
        detail.contains(" then, ") && !detail.contains("  "),
        "{refused}"
    );
    // The record points at the file with the whole refusal.
    let err_file = run.join(format!("changed-{job_id}.err"));
    assert!(
        detail.contains(&format!("{} says what changed", err_file.display())),
        "{refused}"
    );
    // The job's output has the whole refusal: what changed and how to go on.
    let output =
        std::fs::read_to_string(run.join(format!("changed-{job_id}.err"))).unwrap_or_default();
    assert!(
        output.contains("data/gpl.txt: changed") && output.contains("--force"),
        "{output}"
    );
    assert!(run.join("checkpoints/step-6/COMPLETE").exists());
    assert!(!run.join("checkpoints/step-9").exists());
}

#[test]
fn a_sweep_does_not_retry_a_point_whose_data_changed_since_its_checkpoint() {
    let (cluster, dir, gpl) = cluster_and_data("slurm-changed-sweep");
    let spec = SPEC.replace("name: changed", "name: swept")
        + "sweep:\n  grid:\n    training.optimizer.lr: [1.0e-3]\n";
    dir.write("job.yaml", &spec);
    // Rank 1 fails at step 5: the point ends FAILED after its checkpoint of step 3.
    let failing = [("SHARDRUN_INJECT_FAILURE", "1:5".to_string())];
    let out = cluster
        .shardrun_with_env(dir.path(), &["sweep", "job.yaml"], &failing)
        .unwrap();
    assert!(out.status.success(), "{}", stderr_of(&out));
    let failed = ended(&cluster, &dir, "runs/swept");
    assert_eq!(failed["state"], "FAILED", "{failed}");
    let point = std::path::PathBuf::from(failed["run_dir"].as_str().unwrap());
    assert!(point.join("checkpoints/step-3/COMPLETE").exists());
    let jobs_before = std::fs::read_to_string(point.join("manifest.json")).unwrap();

    // The data changes: its files tell the sweep that the point's job would refuse, and so
    // does the data once prepared.
    dir.write("data/gpl.txt", &format!("{gpl}one more line\n"));
    for prepared in [false, true] {
        if prepared {
            let out = cluster
                .shardrun(dir.path(), &["prepare", "job.yaml", "--set", "sweep=null"])
                .unwrap();
            assert!(out.status.success(), "{}", stderr_of(&out));
        }
        let out = cluster
            .shardrun(dir.path(), &["sweep", "job.yaml"])
            .unwrap();
        let stdout = stdout_of(&out);
        assert!(out.status.success(), "{stdout}{}", stderr_of(&out));
        for line in [
            "skip (data changed)",
            "1 point(s) to retry were trained on other data than the data as it is now",
            "data/gpl.txt: changed (",
            &format!("delete {} and run `shardrun sweep` again", point.display()),
            "Nothing to submit",
        ] {
            assert!(stdout.contains(line), "missing {line:?} in {stdout}");
        }
        // Unprepared, the files tell; prepared, its tokens.
        assert_eq!(
            stdout.contains("then, other files now"),
            !prepared,
            "{stdout}"
        );
    }
    assert_eq!(
        std::fs::read_to_string(point.join("manifest.json")).unwrap(),
        jobs_before,
        "the point was not submitted again"
    );
}

/// A finished point is skipped, so nothing refuses its changed data: the sweep says that
/// finished points trained on data that differs from the data as it is now, naming the file,
/// though the new data is not prepared yet.
#[test]
fn a_sweep_says_which_finished_points_trained_on_data_that_changed_since() {
    let (cluster, dir, gpl) = cluster_and_data("slurm-changed-finished");
    let spec = SPEC.replace("name: changed", "name: done")
        + "sweep:\n  grid:\n    training.optimizer.lr: [1.0e-3]\n";
    dir.write("job.yaml", &spec);
    let out = cluster
        .shardrun(dir.path(), &["sweep", "job.yaml"])
        .unwrap();
    assert!(out.status.success(), "{}", stderr_of(&out));
    let finished = ended(&cluster, &dir, "runs/done");
    assert_eq!(finished["state"], "COMPLETED", "{finished}");
    let point = std::path::PathBuf::from(finished["run_dir"].as_str().unwrap());

    let sweep = || {
        let out = cluster
            .shardrun(dir.path(), &["sweep", "job.yaml"])
            .unwrap();
        let stdout = stdout_of(&out);
        assert!(out.status.success(), "{stdout}{}", stderr_of(&out));
        assert!(stdout.contains("Nothing to submit"), "{stdout}");
        stdout
    };
    assert!(!sweep().contains("differs"));
    let added = "one more line\n";
    dir.write("data/gpl.txt", &format!("{gpl}{added}"));
    let stdout = sweep();
    for line in [
        "skip (COMPLETED)".to_string(),
        format!(
            "1 finished point(s) trained on data that differs from the data as it is now: \
             they are skipped and keep the results of the data they trained on. To train a \
             point on the data as it is now, delete its directory and run `shardrun sweep` \
             again. The first, {}:",
            point.display()
        ),
        format!(
            "  {}: changed ({} → {} bytes)",
            dir.join("data/gpl.txt").display(),
            gpl.len(),
            gpl.len() + added.len()
        ),
    ] {
        assert!(stdout.contains(&line), "missing {line:?} in {stdout}");
    }
}

/// A finished point asked to train longer whose job then refused to start (its data had
/// changed) keeps the longer job recorded but trained no step of it: once the data is as it
/// was, the sweep submits it again and it continues from its final checkpoint, rather than
/// skipping it as finished.
#[test]
fn a_longer_point_refused_for_changed_data_trains_on_once_the_data_is_restored() {
    use shardrun_e2e::jobs::{all_logs, metric_steps};
    let (cluster, dir, gpl) = cluster_and_data("slurm-changed-longer");
    let spec = |steps: u64| {
        SPEC.replace("name: changed", "name: longer")
            .replace("  steps: 6\n", &format!("  steps: {steps}\n"))
            + "sweep:\n  grid:\n    training.optimizer.lr: [1.0e-3]\n"
    };
    let sweep = |steps: u64| {
        dir.write("job.yaml", &spec(steps));
        let out = cluster
            .shardrun(dir.path(), &["sweep", "job.yaml"])
            .unwrap();
        let stdout = stdout_of(&out);
        assert!(out.status.success(), "{stdout}{}", stderr_of(&out));
        stdout
    };
    sweep(6);
    let finished = ended(&cluster, &dir, "runs/longer");
    assert_eq!(finished["state"], "COMPLETED", "{finished}");
    let point = std::path::PathBuf::from(finished["run_dir"].as_str().unwrap());

    // Changed where only preparing tells, and not prepared: the sweep submits the longer
    // point, whose job refuses.
    let trained_on = dir.modified("data/gpl.txt");
    change_unseen(&dir, &gpl, trained_on);
    let stdout = sweep(9);
    assert!(stdout.contains("submit (was COMPLETED)"), "{stdout}");
    // The LR decays over `training.steps`: the points continue on a longer schedule.
    assert!(
        stdout.contains(
            "1 point(s) continue on a re-shaped LR schedule; the first: the cosine LR \
             schedule is re-shaped to 9 steps: step 7 trains at LR "
        ),
        "{stdout}"
    );
    let refused = ended(&cluster, &dir, "runs/longer");
    assert!(
        refused["detail"]
            .as_str()
            .is_some_and(|d| d.contains("refused to start: its training data changed")),
        "{refused}"
    );
    assert_eq!(metric_steps(&point, 0), (1..=6).collect::<Vec<_>>());

    dir.write("data/gpl.txt", &gpl);
    let stdout = sweep(9);
    assert!(stdout.contains("submit (was COMPLETED)"), "{stdout}");
    let done = wait_for("the 9th step", Duration::from_secs(300), || {
        let out = cluster
            .shardrun(dir.path(), &["status", "--json", "runs/longer"])
            .ok()?;
        status_runs(&stdout_of(&out))
            .into_iter()
            .find(|r| r["state"] == "COMPLETED" && metric_steps(&point, 0).len() == 9)
    });
    done.unwrap_or_else(|e| panic!("{e}\n{}", all_logs(&point)));
    assert!(
        all_logs(&point).contains(&format!(
            "resumed from checkpoint {}/checkpoints/step-6",
            point.display()
        )),
        "{}",
        all_logs(&point)
    );
}
