//! Re-submitting a cancelled job on the real Slurm: `scancel` (SIGTERM to the batch shell,
//! which is the controller, and to the tasks) has the ranks checkpoint at their next step
//! boundary and stop there, and `shardrun submit` of the same spec submits a new job that
//! resumes from that checkpoint, so that the two jobs together have the losses of an
//! uninterrupted run.
//!
//! Needs the worker built: `cargo build --release -p shardrun -p shardrun-worker`.

use shardrun_e2e::jobs::*;
use shardrun_e2e::*;
use std::time::Duration;

const STEPS: u64 = 1500;
const INTERVAL: u64 = 20;

fn spec() -> String {
    format!(
        "name: rerun\nresources: {{ tasks_per_node: 2, cpus_per_task: 1, time: \"00:10:00\" }}\n\
         training:\n  model: {{ kind: mlp, input_dim: 64, hidden_dim: 256, output_dim: 64 }}\n  \
         steps: {STEPS}\n  total_batch_size: 16\n  batch_size_per_device: 8\n  \
         checkpoint: {{ interval_steps: {INTERVAL}, keep: 2 }}\n"
    )
}

#[test]
fn scancel_then_submit_of_the_same_spec_resumes_with_the_uninterrupted_losses() {
    let cluster = SlurmCluster::start().expect("start the local Slurm cluster");
    let dir = TestDir::new("slurm-rerun");
    let spec = dir.write("rerun.yaml", &spec());
    let spec_arg = spec.to_string_lossy().to_string();

    // The uninterrupted run, locally (the same arithmetic as under Slurm).
    let (out, reference_run) = run_local(
        &dir,
        &spec,
        &["--no-progress"],
        &[],
        Duration::from_secs(300),
    );
    assert!(out.status.success(), "reference run: {}", stderr_of(&out));
    let reference = losses(&reference_run);
    assert_eq!(reference.len() as u64, STEPS);

    let first_job = cluster.submit(dir.path(), &[&spec_arg]).job_id;
    let run = dir.join("runs/rerun");
    let logs = || {
        let mut text = all_logs(&run);
        for entry in std::fs::read_dir(&run).into_iter().flatten().flatten() {
            if entry.path().extension().is_some_and(|e| e == "out") {
                text.push_str(&std::fs::read_to_string(entry.path()).unwrap_or_default());
            }
        }
        text
    };
    // Once training is under way, hold the ranks, so that the job is still running for
    // the checks below and the cancel lands mid-run whatever the load; Slurm sends SIGCONT
    // with its SIGTERM.
    wait_for("the first checkpoint", Duration::from_secs(180), || {
        has_checkpoint(&run).then_some(())
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", logs()));
    assert_eq!(signal_workers(&run, libc::SIGSTOP), 2, "both ranks held");

    // While it runs, submitting again is refused and changes nothing.
    let out = cluster
        .shardrun(dir.path(), &["submit", &spec_arg])
        .unwrap();
    assert!(!out.status.success());
    // Slurm's job, stopped with `shardrun cancel` (Ctrl-C reaches no batch job).
    let stderr = stderr_of(&out);
    assert!(
        stderr.contains(&format!(
            "is still running: Slurm job {first_job} is RUNNING (its controller: pid "
        )) && stderr.contains("or stop it (`shardrun cancel ")
            && !stderr.contains("Ctrl-C"),
        "{stderr}"
    );

    let mut cancel = cluster.command("scancel");
    cancel.arg(&first_job);
    let out = run_with_deadline(&mut cancel, Duration::from_secs(30)).unwrap();
    assert!(out.status.success(), "{}", stderr_of(&out));
    signal_workers(&run, libc::SIGCONT);
    wait_cancelled(&cluster, dir.path(), &run, Duration::from_secs(120))
        .unwrap_or_else(|e| panic!("{e}\n{}", logs()));
    let result = result_json(&run);
    assert_eq!(result["status"], "cancelled", "{result}");
    let stopped_after = result["step"].as_u64().expect("the step it stopped after");
    let log = std::fs::read_to_string(run.join("train.log")).unwrap();
    for rank in 0..2 {
        assert!(
            log.contains(&format!(
                "[rank {rank}] warning: stopping after step {stopped_after}: the job was \
                 cancelled (SIGTERM)"
            )),
            "each rank says it stopped at the agreed step, for the cancel:\n{log}"
        );
    }
    // Slurm's step daemon's words on the cancel, written into a task's stream, are its own.
    assert!(
        !log.lines()
            .any(|l| l.contains("[rank ") && l.contains("] (stderr) slurmstepd")),
        "{log}"
    );
    // Whichever SIGTERM reached the ranks first, theirs or the controller's word, they
    // checkpointed where they stopped: nothing trained is lost.
    assert!(
        run.join(format!("checkpoints/step-{stopped_after}/COMPLETE"))
            .is_file(),
        "a checkpoint of step {stopped_after}:\n{log}"
    );
    // Taken for Slurm's SIGTERM, which a cancel sends as a preemption does: not called a
    // preemption's. (The ranks, held mid-save, may stop at the step an interval checkpoint
    // has just saved: then that one is kept, not written again.)
    assert!(
        (log.contains(&format!("stop checkpoint of step {stopped_after} saved"))
            || log.contains(&format!(
                "stopping after step {stopped_after}, whose checkpoint is saved already"
            )))
            && !log.contains("preemption checkpoint"),
        "{log}"
    );

    // The same command again: a new job that resumes.
    let Submitted {
        stdout,
        job_id: second_job,
    } = cluster.submit(dir.path(), &[&spec_arg]);
    let headline = stdout.lines().next().unwrap_or_default();
    assert!(
        headline.starts_with(&format!("resuming {} at step ", run.display()))
            && headline.contains("was cancelled by SIGTERM after step "),
        "{headline}"
    );
    let resumed_at: u64 = headline
        .split(" at step ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap();
    assert_eq!(resumed_at, stopped_after + 1, "{headline}");
    assert_ne!(second_job, first_job);
    wait_for_file(&run.join("result.json"), Duration::from_secs(600), |t| {
        t.contains("\"succeeded\"")
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", logs()));
    let manifest = std::fs::read_to_string(run.join("manifest.json")).unwrap();
    assert!(
        manifest.contains(&format!("\"{first_job}\""))
            && manifest.contains(&format!("\"{second_job}\"")),
        "the manifest keeps both jobs: {manifest}"
    );
    assert!(
        logs().contains(&format!(
            "resumed from checkpoint {}/checkpoints/step-{}",
            run.display(),
            resumed_at - 1
        )),
        "{}",
        logs()
    );
    assert_same_losses(&losses(&run), &reference, 1e-6, "two Slurm jobs");
    assert_no_panic(&logs(), "the run's logs and Slurm output");
}

/// The controller's own SIGTERM, which `scancel` sends it as it does the ranks, asks them for
/// a checkpoint before Slurm's kill even when their own SIGTERM never comes (here
/// `scancel --batch`, which signals the controller alone): the job ends cancelled at that
/// checkpoint, not requeued, and a spec without a `checkpoint:` block resumes from it.
#[test]
fn a_sigterm_to_the_controller_alone_has_the_ranks_checkpoint_and_ends_cancelled() {
    let cluster = SlurmCluster::start().expect("start the local Slurm cluster");
    let dir = TestDir::new("slurm-cancel-checkpoint");
    let no_checkpoint_block = spec().replace(
        &format!("  checkpoint: {{ interval_steps: {INTERVAL}, keep: 2 }}\n"),
        "",
    );
    assert!(!no_checkpoint_block.contains("checkpoint"));
    let (job, _cancel) = submit_cancelled_on_drop(&cluster, &dir, &no_checkpoint_block);
    let run = dir.join("runs/rerun");
    let log = || std::fs::read_to_string(run.join("train.log")).unwrap_or_default();
    wait_for_steps(&run, 5, "training under way", Duration::from_secs(180));

    let mut cancel = cluster.command("scancel");
    cancel.args(["--batch", "--signal=TERM", &job]);
    let out = run_with_deadline(&mut cancel, Duration::from_secs(30)).unwrap();
    assert!(out.status.success(), "{}", stderr_of(&out));
    wait_for_file(&run.join("result.json"), Duration::from_secs(120), |t| {
        !t.is_empty()
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", log()));
    let result = result_json(&run);
    assert_eq!(result["status"], "cancelled", "{result}\n{}", log());
    assert_eq!(result["requeued"], false, "{result}");
    let step = result["step"].as_u64().expect("the step it stopped after");
    assert!(
        run.join(format!("checkpoints/step-{step}/COMPLETE"))
            .is_file(),
        "a checkpoint of step {step}:\n{}",
        log()
    );
    let message = result["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(&format!("its newest checkpoint is step {step}")),
        "{message}"
    );
    assert!(!log().contains("requeueing Slurm job"), "{}", log());
    assert_no_panic(&log(), "train.log");
}

/// A sweep asked for more steps keeps its finished points' run directories: each continues
/// from its final checkpoint, as `shardrun submit` of one run does, with the losses of a run
/// trained for the longer count at once (the LR is constant, so the schedule is the same).
#[test]
fn a_sweep_asked_for_more_steps_continues_its_finished_points() {
    let cluster = SlurmCluster::start().expect("start the local Slurm cluster");
    let dir = TestDir::new("slurm-sweep-longer");
    let spec = |steps: u64, sweep: bool| {
        format!(
            "name: longer\nresources: {{ tasks_per_node: 2, cpus_per_task: 1, time: \"00:10:00\" }}\n\
             training:\n  model: {{ kind: mlp, input_dim: 16, hidden_dim: 32, output_dim: 16 }}\n  \
             steps: {steps}\n  total_batch_size: 16\n  batch_size_per_device: 8\n  \
             optimizer: {{ lr: 1.0e-3 }}\n  schedule: {{ decay: constant }}\n{}",
            if sweep {
                "sweep:\n  grid:\n    training.optimizer.lr: [1.0e-3]\n"
            } else {
                ""
            }
        )
    };
    let (out, reference_run) = run_local(
        &dir,
        &dir.write("reference.yaml", &spec(30, false)),
        &["--no-progress"],
        &[],
        Duration::from_secs(300),
    );
    assert!(out.status.success(), "reference run: {}", stderr_of(&out));
    let reference = losses(&reference_run);

    let sweep_spec = dir.write("sweep.yaml", &spec(20, true));
    let sweep_arg = sweep_spec.to_string_lossy().into_owned();
    let finished = |what: &str| {
        wait_for(what, Duration::from_secs(300), || {
            let out = cluster
                .shardrun(dir.path(), &["status", "--json", "runs/longer"])
                .ok()?;
            let runs = status_runs(&stdout_of(&out));
            (runs.len() == 1 && runs[0]["state"] == "COMPLETED").then(|| runs[0].clone())
        })
        .unwrap()
    };
    let out = cluster
        .shardrun(dir.path(), &["sweep", &sweep_arg])
        .unwrap();
    assert!(out.status.success(), "{}", stderr_of(&out));
    let point = finished("the 20-step sweep");
    let run = std::path::PathBuf::from(point["run_dir"].as_str().unwrap());

    dir.write("sweep.yaml", &spec(30, true));
    let out = cluster
        .shardrun(dir.path(), &["sweep", &sweep_arg])
        .unwrap();
    let stdout = stdout_of(&out);
    assert!(out.status.success(), "{stdout}{}", stderr_of(&out));
    for line in [
        "1 point(s) keep their run directories",
        "training.steps: 20 → 30 (1 point(s))",
        "submit (was COMPLETED)",
    ] {
        assert!(stdout.contains(line), "missing {line:?} in {stdout}");
    }
    assert!(!stdout.contains("belong to no current point"), "{stdout}");
    // The point's own log says what it continues with, beside its jobs' lines.
    let log = std::fs::read_to_string(run.join("train.log")).unwrap();
    assert!(
        log.contains("[shardrun] changed on resume (`shardrun sweep`): training.steps: 20 → 30"),
        "{log}"
    );
    // The new job removes the first one's result.json when it starts, and writes its own
    // once it has trained step 30.
    wait_for(
        "the 30th step and its result",
        Duration::from_secs(300),
        || {
            let done = losses(&run).contains_key(&30)
                && std::fs::read_to_string(run.join("result.json"))
                    .is_ok_and(|t| t.contains("\"succeeded\""));
            done.then_some(())
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", all_logs(&run)));
    assert_eq!(
        finished("the 30-step sweep")["run_dir"],
        point["run_dir"],
        "the same run directory"
    );
    assert!(
        all_logs(&run).contains(&format!(
            "resumed from checkpoint {}/checkpoints/step-20",
            run.display()
        )),
        "{}",
        all_logs(&run)
    );
    assert_same_losses(&losses(&run), &reference, 1e-6, "20 steps, then 10 more");
}

/// A finished sweep point that does not resume (`checkpoint.resume: false`) is not
/// continued in its directory when the sweep asks for more steps: training from step 1
/// there would overwrite what it finished. The point is new; the finished run stays.
#[test]
fn a_longer_sweep_that_does_not_resume_leaves_its_finished_points_as_they_are() {
    let cluster = SlurmCluster::start().expect("start the local Slurm cluster");
    let dir = TestDir::new("slurm-sweep-no-resume");
    let spec = |steps: u64| {
        format!(
            "name: noresume\nresources: {{ tasks_per_node: 2, cpus_per_task: 1, time: \"00:10:00\" }}\n\
             training:\n  model: {{ kind: mlp, input_dim: 16, hidden_dim: 32, output_dim: 16 }}\n  \
             steps: {steps}\n  total_batch_size: 16\n  batch_size_per_device: 8\n  \
             checkpoint: {{ resume: false }}\n\
             sweep:\n  grid:\n    training.optimizer.lr: [1.0e-3]\n"
        )
    };
    let sweep_spec = dir.write("sweep.yaml", &spec(4));
    let sweep_arg = sweep_spec.to_string_lossy().into_owned();
    let out = cluster
        .shardrun(dir.path(), &["sweep", &sweep_arg])
        .unwrap();
    assert!(out.status.success(), "{}", stderr_of(&out));
    let point = wait_for("the 4-step sweep", Duration::from_secs(300), || {
        let out = cluster
            .shardrun(dir.path(), &["status", "--json", "runs/noresume"])
            .ok()?;
        let runs = status_runs(&stdout_of(&out));
        (runs.len() == 1 && runs[0]["state"] == "COMPLETED").then(|| runs[0].clone())
    })
    .unwrap();
    let run = std::path::PathBuf::from(point["run_dir"].as_str().unwrap());
    let finished = losses(&run);
    assert_eq!(finished.len(), 4, "{}", all_logs(&run));

    dir.write("sweep.yaml", &spec(6));
    let out = cluster
        .shardrun(dir.path(), &["sweep", "--dry-run", &sweep_arg])
        .unwrap();
    let stdout = stdout_of(&out);
    assert!(out.status.success(), "{stdout}{}", stderr_of(&out));
    for line in [
        "1 run(s) in",
        "training.steps: 4 → 6 (1 finished run(s)): their spec says `checkpoint.resume: \
         false`, so their points are new, trained from step 1",
    ] {
        assert!(stdout.contains(line), "missing {line:?} in {stdout}");
    }
    assert!(!stdout.contains("keep their run directories"), "{stdout}");
    assert!(!stdout.contains("submit (was COMPLETED)"), "{stdout}");
    assert_eq!(losses(&run), finished, "the finished run is untouched");
}

#[test]
fn submit_force_refuses_to_delete_a_run_whose_job_is_still_queued() {
    let cluster = SlurmCluster::start().expect("start the local Slurm cluster");
    let dir = TestDir::new("slurm-force-queued");
    // A begin time an hour away keeps the job pending, with no controller to hold the lock.
    let queued = spec().replace(
        "time: \"00:10:00\" }",
        "time: \"00:10:00\", extra_sbatch: [\"--begin=now+1hour\"] }",
    );
    let (job, _cancel) = submit_cancelled_on_drop(&cluster, &dir, &queued);
    let spec_arg = dir.join("rerun.yaml").to_string_lossy().to_string();
    let run = dir.join("runs/rerun");
    let before = std::fs::read(run.join("manifest.json")).unwrap();

    let out = cluster
        .shardrun(dir.path(), &["submit", "--force", &spec_arg])
        .unwrap();
    let stderr = stderr_of(&out);
    assert!(
        !out.status.success(),
        "--force deleted a queued run: {stderr}"
    );
    assert!(
        stderr.contains(&format!("Slurm job {job} is PENDING"))
            && stderr.contains("--force would delete the run under it")
            && stderr.contains("shardrun cancel"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read(run.join("manifest.json")).unwrap(),
        before,
        "the refused --force changed the run"
    );

    let out = cluster
        .shardrun(dir.path(), &["cancel", &run.to_string_lossy()])
        .unwrap();
    assert!(out.status.success(), "cancel failed: {}", stderr_of(&out));
    wait_cancelled(&cluster, dir.path(), &run, Duration::from_secs(60)).unwrap();
    // Once the job is cancelled, --force replaces the run.
    let second = cluster.submit(dir.path(), &["--force", &spec_arg]).job_id;
    let _cancel_second = CancelOnDrop {
        cluster: &cluster,
        job: second,
    };
}

/// Waits until `shardrun status` shows the run `rerun` as CANCELLED: Slurm ended its job.
fn wait_cancelled(
    cluster: &SlurmCluster,
    cwd: &std::path::Path,
    run: &std::path::Path,
    deadline: Duration,
) -> anyhow::Result<()> {
    wait_for("Slurm to end the job", deadline, || {
        let out = cluster
            .shardrun(cwd, &["status", "--json", &run.to_string_lossy()])
            .ok()?;
        (states(&stdout_of(&out)) == vec![("rerun".to_string(), "CANCELLED".to_string())])
            .then_some(())
    })
}

/// Submits `spec` (written as `rerun.yaml`): its Slurm job id, and the guard that cancels it
/// when the test ends.
fn submit_cancelled_on_drop<'a>(
    cluster: &'a SlurmCluster,
    dir: &TestDir,
    spec: &str,
) -> (String, CancelOnDrop<'a>) {
    let spec = dir.write("rerun.yaml", spec);
    let job = cluster
        .submit(dir.path(), &[&spec.to_string_lossy()])
        .job_id;
    let guard = CancelOnDrop {
        cluster,
        job: job.clone(),
    };
    (job, guard)
}

/// Cancels a job that would otherwise wait in the queue after the test, passed or failed.
struct CancelOnDrop<'a> {
    cluster: &'a SlurmCluster,
    job: String,
}

impl Drop for CancelOnDrop<'_> {
    fn drop(&mut self) {
        let mut scancel = self.cluster.command("scancel");
        scancel.arg(&self.job);
        let _ = run_with_deadline(&mut scancel, Duration::from_secs(30));
    }
}
