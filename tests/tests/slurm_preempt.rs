//! Preemption on the real Slurm, controller side: `scancel --signal=USR2 --batch` reaches
//! the controller (the batch shell `exec`s it), every rank is asked to stop at a step
//! boundary, the controller requeues the job with `scontrol requeue`, and the requeued job
//! runs in the same run directory to completion. The ranks are simulated (they acknowledge
//! the preemption like the trainer does, without a checkpoint to write).

use shardrun_e2e::jobs::*;
use shardrun_e2e::*;
use std::collections::BTreeMap;
use std::time::Duration;

/// Submits the simulated ranks' job `name` (spec text `spec`, written as `tiny.yaml`):
/// its Slurm job id and run directory.
fn submit_simulated(
    cluster: &SlurmCluster,
    dir: &TestDir,
    name: &str,
    spec: &str,
) -> (String, std::path::PathBuf) {
    let spec = dir.write("tiny.yaml", spec);
    // sbatch exports the submitting environment down to the srun tasks.
    let envs = [
        ("SHARDRUN_WORKER_BIN", simrank()),
        ("SIMRANK_STEP_MS", "40".to_string()),
    ];
    let job_id = cluster
        .submit_with_env(dir.path(), &[&spec.to_string_lossy()], &envs)
        .job_id;
    (job_id, dir.join("runs").join(name))
}

/// Submits job `name` (spec text `spec`, two ranks) whose ranks are processes that never get
/// as far as the trainer's signal handlers (`sleep`), and waits until both run: its job id
/// and run directory. Each leaves a file named after its rank before it becomes `sleep`; the
/// Slurm step alone is listed before its tasks exist, and a signal sent then reaches none.
fn submit_ranks_that_never_start(
    cluster: &SlurmCluster,
    dir: &TestDir,
    name: &str,
    spec: &str,
) -> (String, std::path::PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let started = dir.join("started");
    std::fs::create_dir_all(&started).unwrap();
    let starting = dir.write(
        "starting.sh",
        &format!(
            "#!/bin/sh\ntouch '{}'/\"rank-$SLURM_PROCID\"\nexec sleep 300\n",
            started.display()
        ),
    );
    std::fs::set_permissions(&starting, std::fs::Permissions::from_mode(0o755)).unwrap();
    let spec = dir.write("tiny.yaml", spec);
    let worker = [("SHARDRUN_WORKER_BIN", starting.display().to_string())];
    let job_id = cluster
        .submit_with_env(dir.path(), &[&spec.to_string_lossy()], &worker)
        .job_id;
    let run = dir.join("runs").join(name);
    wait_for("both ranks to run", Duration::from_secs(120), || {
        (started.join("rank-0").exists() && started.join("rank-1").exists()).then_some(())
    })
    .unwrap_or_else(|e| {
        let log = std::fs::read_to_string(run.join("train.log")).unwrap_or_default();
        panic!("{e}\n{log}")
    });
    (job_id, run)
}

/// Submits the simulated ranks' job `name` (spec text `spec`), lets it train a few steps
/// and sends USR2 to its batch script, as Slurm does `signal_seconds` before the time limit
/// (`to_ranks`: to its ranks instead, as `scancel --signal=USR2` without `--batch` does).
/// Returns the job id and the run directory.
fn trained_then_usr2(
    cluster: &SlurmCluster,
    dir: &TestDir,
    name: &str,
    spec: &str,
    to_ranks: bool,
) -> (String, std::path::PathBuf) {
    let (job_id, run) = submit_simulated(cluster, dir, name, spec);
    wait_for_steps(
        &run,
        5,
        "the first attempt to train",
        Duration::from_secs(120),
    );
    match to_ranks {
        true => slurm(cluster, "scancel", &["--signal=USR2", &job_id]),
        false => slurm(cluster, "scancel", &["--signal=USR2", "--batch", &job_id]),
    }
    (job_id, run)
}

/// `shardrun status --json RUN`, read; `None` when it does not answer in JSON.
fn status_json(cluster: &SlurmCluster, dir: &TestDir, run: &str) -> Option<serde_json::Value> {
    let out = cluster
        .shardrun(dir.path(), &["status", "--json", run])
        .ok()?;
    serde_json::from_slice(&out.stdout).ok()
}

/// Runs a Slurm command (`scancel`, `scontrol`) on the cluster; it must succeed.
fn slurm(cluster: &SlurmCluster, program: &str, args: &[&str]) {
    let mut command = cluster.command(program);
    command.args(args);
    let out = run_with_deadline(&mut command, Duration::from_secs(30)).unwrap();
    assert!(
        out.status.success(),
        "{program} {}: {}",
        args.join(" "),
        stderr_of(&out)
    );
}

/// [`trained_then_usr2`] with `steps` steps, then waits until the first attempt has ended
/// requeued (its manifest says PREEMPTED). Returns the job id and the run directory.
fn preempted_and_requeued(
    cluster: &SlurmCluster,
    dir: &TestDir,
    name: &str,
    steps: u64,
) -> (String, std::path::PathBuf) {
    let (job_id, run) =
        trained_then_usr2(cluster, dir, name, &tiny_mlp_spec(name, steps, 2), false);

    let log = || std::fs::read_to_string(run.join("train.log")).unwrap_or_default();
    wait_for_file(&run.join("requeue_count"), Duration::from_secs(60), |t| {
        t.trim() == "1"
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", log()));
    wait_for_file(&run.join("manifest.json"), Duration::from_secs(60), |t| {
        t.contains("\"PREEMPTED\"")
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", log()));
    (job_id, run)
}

#[test]
fn usr2_requeues_the_job_which_then_completes() {
    let cluster = SlurmCluster::start().expect("start the local Slurm cluster");
    let dir = TestDir::new("slurm-preempt");
    let (job_id, run) = preempted_and_requeued(&cluster, &dir, "preempt", 150);
    let spec = dir.join("tiny.yaml");
    let log = || std::fs::read_to_string(run.join("train.log")).unwrap_or_default();

    // The first attempt has ended (its manifest says PREEMPTED) and its job is queued again:
    // status says so, and the same spec submitted again is refused, not submitted twice.
    let status = cluster
        .shardrun(dir.path(), &["status", "--json", &run.to_string_lossy()])
        .unwrap();
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    let state = &status["runs"][0]["state"];
    assert!(
        state == "SUBMITTED" || state == "RUNNING",
        "the requeued job is Slurm's again: {status}"
    );
    assert!(status["runs"][0]["slurm_state"].is_string(), "{status}");
    // What the attempt before advised (submit it again) no longer holds: it is queued.
    let detail = status["runs"][0]["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains("the attempt before was preempted") && !detail.contains("submit it"),
        "{status}"
    );
    let again = cluster
        .shardrun(dir.path(), &["submit", &spec.to_string_lossy()])
        .unwrap();
    assert!(!again.status.success(), "{}", stdout_of(&again));
    assert!(
        stderr_of(&again).contains(&format!("Slurm job {job_id} is ")),
        "refused while Slurm holds the requeued job: {}",
        stderr_of(&again)
    );

    // Following the log until the run is done waits out the requeued job, which Slurm holds
    // back before it runs again (seen: up to ~3 min here), and ends with the run.
    let mut follow = cluster.command(shardrun());
    follow
        .current_dir(dir.path())
        .args(["logs", &run.to_string_lossy(), "-f", "--until-done"]);
    let out = run_with_deadline(&mut follow, Duration::from_secs(600)).unwrap();
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert!(
        stdout_of(&out).contains("training finished"),
        "{}",
        stdout_of(&out)
    );
    let result = std::fs::read_to_string(run.join("result.json")).unwrap_or_default();
    assert!(result.contains("\"succeeded\""), "{result}\n{}", log());
    let log = log();
    for rank in 0..2 {
        assert!(
            log.contains(&format!("[rank {rank}] preempted at step")),
            "{log}"
        );
    }
    // `scancel --signal=USR2` long before the time limit is a preemption's notice.
    assert!(
        log.contains("preemption notice (SIGUSR2): the workers checkpoint"),
        "{log}"
    );
    assert!(log.contains("requeueing Slurm job"), "{log}");
    assert!(log.contains("training finished"), "{log}");
}

/// A requeued job waiting to run again is the run's: `shardrun cancel` cancels it, and the
/// run is CANCELLED.
#[test]
fn cancel_stops_a_requeued_job_waiting_in_the_queue() {
    let cluster = SlurmCluster::start().expect("start the local Slurm cluster");
    let dir = TestDir::new("slurm-preempt-cancel");
    let (job_id, run) = preempted_and_requeued(&cluster, &dir, "requeued", 1500);
    let run_arg = run.to_string_lossy().into_owned();
    let out = cluster.shardrun(dir.path(), &["cancel", &run_arg]).unwrap();
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert!(
        stdout_of(&out).contains(&format!("Cancelled Slurm job(s) {job_id};")),
        "{}",
        stdout_of(&out)
    );
    let ended = wait_for(
        "Slurm to end the requeued job",
        Duration::from_secs(60),
        || {
            let status = status_json(&cluster, &dir, &run_arg)?;
            let state = status["runs"][0]["state"].clone();
            (state != "SUBMITTED" && state != "RUNNING").then_some(status)
        },
    )
    .unwrap();
    assert_eq!(ended["runs"][0]["state"], "CANCELLED", "{ended}");
    // The attempt before's "requeueing Slurm job" is told as that attempt's, not as news.
    let detail = ended["runs"][0]["detail"].as_str().unwrap_or_default();
    assert!(
        detail.starts_with(&format!(
            "cancelled (`shardrun cancel`) before its requeued Slurm job {job_id} ran again; \
             submitting it again (`shardrun submit {run_arg}`) "
        )) && detail.contains("the attempt before was preempted")
            && !detail.contains("requeueing"),
        "{ended}"
    );
    // A later look, Slurm still listing the job CANCELLED, keeps who cancelled it.
    let again = status_json(&cluster, &dir, &run_arg).unwrap();
    assert_eq!(
        again["runs"][0]["detail"], ended["runs"][0]["detail"],
        "{again}"
    );

    // Submitted again, the run resumes; preempted again, its job waits once more, and what
    // it says is of that attempt, not of the cancelled one before the submission.
    let spec = std::fs::read_to_string(dir.join("tiny.yaml")).unwrap();
    let (again, _) = submit_simulated(&cluster, &dir, "requeued", &spec);
    let trained_before = metric_steps(&run, 0).len();
    wait_for_steps(
        &run,
        trained_before + 5,
        "the new attempt to train",
        Duration::from_secs(120),
    );
    slurm(&cluster, "scancel", &["--signal=USR2", "--batch", &again]);
    // A new job counts its requeues afresh.
    wait_for_file(&run.join("requeue_count"), Duration::from_secs(60), |t| {
        t.trim() == "1"
    })
    .unwrap();
    let waiting = wait_for("the job to wait again", Duration::from_secs(60), || {
        let status = status_json(&cluster, &dir, &run_arg)?;
        (status["runs"][0]["state"] == "SUBMITTED").then_some(status)
    })
    .unwrap();
    let detail = waiting["runs"][0]["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains("the attempt before was preempted") && !detail.contains("CANCELLED"),
        "{waiting}"
    );
    // Cancelled by scancel this time, with no controller to say so: the run is CANCELLED
    // all the same, and says how to go on.
    slurm(&cluster, "scancel", &[&again]);
    let ended = wait_for(
        "Slurm to end the requeued job",
        Duration::from_secs(60),
        || {
            let status = status_json(&cluster, &dir, &run_arg)?;
            (status["runs"][0]["state"] != "SUBMITTED").then_some(status)
        },
    )
    .unwrap();
    assert_eq!(ended["runs"][0]["state"], "CANCELLED", "{ended}");
    let detail = ended["runs"][0]["detail"].as_str().unwrap_or_default();
    assert!(
        detail.starts_with(&format!(
            "cancelled before its requeued Slurm job {again} ran again; \
             submitting it again (`shardrun submit {run_arg}`) starts it over (it has no \
             checkpoint); the attempt before was preempted"
        )),
        "{ended}"
    );
}

/// A finished run whose job an admin requeued (`scontrol requeue`) has nothing to lose:
/// `shardrun cancel` cancels the queued job, and the run stays COMPLETED.
#[test]
fn cancel_of_a_finished_runs_requeued_job_leaves_the_run_finished() {
    let cluster = SlurmCluster::start().expect("start the local Slurm cluster");
    let dir = TestDir::new("slurm-finished-requeued");
    let spec = dir.write("tiny.yaml", &tiny_mlp_spec("finished", 3, 2));
    let job_id = cluster
        .submit(dir.path(), &[&spec.to_string_lossy()])
        .job_id;
    let run = dir.join("runs/finished");
    let run_arg = run.to_string_lossy().into_owned();
    let state = |cluster: &SlurmCluster| -> Option<serde_json::Value> {
        let status = status_json(cluster, &dir, &run_arg)?;
        Some(status["runs"][0].clone())
    };
    wait_for("the run to finish", Duration::from_secs(120), || {
        state(&cluster).filter(|s| s["state"] == "COMPLETED")
    })
    .unwrap();
    // The job leaves COMPLETING (its epilog) before Slurm takes a requeue.
    let mut requeue = cluster.command("scontrol");
    requeue.args(["requeue", &job_id]);
    wait_for("scontrol requeue", Duration::from_secs(60), || {
        let out = run_with_deadline(&mut requeue, Duration::from_secs(30)).ok()?;
        out.status.success().then_some(())
    })
    .unwrap();

    let out = cluster.shardrun(dir.path(), &["cancel", &run_arg]).unwrap();
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert!(
        stdout_of(&out).contains(&format!("Cancelled Slurm job(s) {job_id};")),
        "{}",
        stdout_of(&out)
    );
    let ended = wait_for(
        "Slurm to end the requeued job",
        Duration::from_secs(60),
        || state(&cluster).filter(|s| s["state"] != "SUBMITTED" && s["state"] != "RUNNING"),
    )
    .unwrap();
    assert_eq!(ended["state"], "COMPLETED", "{ended}");
    let manifest = std::fs::read_to_string(run.join("manifest.json")).unwrap();
    assert!(manifest.contains("\"COMPLETED\""), "{manifest}");
}

/// A job that does not requeue (`preemption.requeue: false`, `--no-requeue`) is not asked
/// to: USR2 stops the ranks at a step boundary and the run ends PREEMPTED, exit 0, saying
/// how to go on, where `scontrol requeue` (refused by Slurm) would have failed it.
/// USR2 sent to the ranks (`scancel --signal=USR2` without `--batch`) is the same notice as
/// to the batch script: a checkpoint, not ranks killed by the signal's default action.
#[test]
fn usr2_to_the_ranks_of_a_job_that_does_not_requeue_ends_it_preempted() {
    let cluster = SlurmCluster::start().expect("start the local Slurm cluster");
    let dir = TestDir::new("slurm-no-requeue");
    let spec = tiny_mlp_spec("norequeue", 1500, 2) + "preemption: { requeue: false }\n";
    let (_, run) = trained_then_usr2(&cluster, &dir, "norequeue", &spec, true);

    let log = || std::fs::read_to_string(run.join("train.log")).unwrap_or_default();
    let result = wait_for_file(&run.join("result.json"), Duration::from_secs(120), |t| {
        t.contains("\"preempted\"")
    });
    let result = result.unwrap_or_else(|e| panic!("{e}\n{}", log()));
    assert!(
        result.contains("\"exit_code\": 0") || result.contains("\"exit_code\":0"),
        "{result}"
    );
    assert!(result.contains("its job is not requeued"), "{result}");
    assert!(!run.join("requeue_count").exists());
    assert!(!log().contains("requeueing Slurm job"), "{}", log());
    assert!(result.contains("the run was preempted"), "{result}");
    // The controller records the run's state once result.json is written.
    wait_for_file(&run.join("manifest.json"), Duration::from_secs(60), |t| {
        t.contains("\"PREEMPTED\"")
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", log()));
}

/// A preempted run whose `scontrol requeue` is refused (here: the Slurm job it names does
/// not exist) was not requeued, and its files say so: exit 1, the refusal on stderr once,
/// `result.json` not requeued, a `failed` event, the reason in train.log, no requeue
/// counted.
#[test]
fn a_refused_requeue_fails_the_run_and_says_why() {
    let cluster = SlurmCluster::start().expect("start the local Slurm cluster");
    let dir = TestDir::new("slurm-requeue-refused");
    let stderr_path = dir.join("stderr.txt");
    let stderr = std::fs::File::create(&stderr_path).unwrap();
    let (mut job, run) = start_long_run(&dir, "refused", |cmd| {
        cmd.env("SLURM_CONF", cluster.slurm_conf())
            .env("SLURM_JOB_ID", "999999")
            .stdout(std::process::Stdio::piped())
            .stderr(stderr);
    });
    unsafe { libc::kill(job.child.id() as i32, libc::SIGUSR2) };
    let (status, stdout) = finish(&mut job, &run, Duration::from_secs(60));
    let stderr = std::fs::read_to_string(&stderr_path).unwrap();
    assert_eq!(status.code(), Some(1), "{stdout}\n{stderr}");
    assert_eq!(
        stderr.matches("scontrol requeue 999999").count(),
        1,
        "{stderr}"
    );
    assert!(
        stderr.contains("was not requeued: run the same command again to resume"),
        "{stderr}"
    );
    assert!(!stderr.contains("requeueing Slurm job"), "{stderr}");

    let result = result_json(&run);
    assert_eq!(result["requeued"], false, "{result}");
    assert_eq!(result["exit_code"], 1, "{result}");
    assert!(
        result["message"]
            .as_str()
            .unwrap()
            .contains("was not requeued"),
        "{result}"
    );
    let events = std::fs::read_to_string(run.join("events.jsonl")).unwrap();
    let last = events.lines().last().unwrap();
    assert!(last.contains("\"event\":\"failed\""), "{events}");
    let log = std::fs::read_to_string(run.join("train.log")).unwrap();
    assert!(
        log.contains("was not requeued: run the same command again to resume"),
        "{log}"
    );
    // The refused requeue is not counted against the job's allowance.
    let count = std::fs::read_to_string(run.join("requeue_count")).unwrap();
    assert_eq!(count.trim(), "0", "{count}");
}

/// A sweep's points are the tasks of one job array, and one task runs with the array's own
/// job id as its SLURM_JOB_ID: USR2 to that task requeues that point alone, and the point
/// beside it trains on to its end, untouched.
#[test]
fn usr2_to_a_sweep_point_requeues_that_point_alone() {
    let cluster = SlurmCluster::start().expect("start the local Slurm cluster");
    let dir = TestDir::new("slurm-preempt-sweep");
    let name = format!("psweep-{}", std::process::id());
    let spec = format!(
        "{}sweep:\n  grid:\n    training.seed: [1, 2]\n",
        tiny_mlp_spec(&name, 400, 1)
    );
    let spec = dir.write("sweep.yaml", &spec);
    let simulated = [
        ("SHARDRUN_WORKER_BIN", simrank()),
        ("SIMRANK_STEP_MS", "40".to_string()),
    ];
    let out = cluster
        .shardrun_with_env(dir.path(), &["sweep", &spec.to_string_lossy()], &simulated)
        .unwrap();
    assert!(out.status.success(), "{}", stderr_of(&out));

    let sweep_dir = dir.join("runs").join(&name);
    // Each point's run directory, by the array task it runs as (`<array>_<task>`), as
    // `shardrun status` lists them.
    let points = || -> BTreeMap<String, std::path::PathBuf> {
        let out = cluster
            .shardrun(
                dir.path(),
                &["status", "--json", &sweep_dir.to_string_lossy()],
            )
            .unwrap();
        status_runs(&stdout_of(&out))
            .iter()
            .filter_map(|run| {
                let job = run["job_id"].as_str()?.to_string();
                Some((job, run["run_dir"].as_str()?.into()))
            })
            .collect()
    };
    let points = wait_for("both points to train", Duration::from_secs(120), || {
        let points = points();
        (points.len() == 2 && points.values().all(|run| metric_steps(run, 0).len() >= 5))
            .then_some(points)
    })
    .unwrap();
    // The task that carries the array's own job id.
    let mut squeue = cluster.command("squeue");
    squeue.args(["-h", "-r", "-n", &name, "-o", "%i %A %F"]);
    let out = run_with_deadline(&mut squeue, Duration::from_secs(30)).unwrap();
    let listed = stdout_of(&out);
    let task = listed
        .lines()
        .filter_map(|l| {
            let mut fields = l.split_whitespace();
            Some((fields.next()?, fields.next()?, fields.next()?))
        })
        .find(|(_, job, array)| job == array)
        .map(|(task, _, _)| task.to_string())
        .unwrap_or_else(|| panic!("no task runs as its array's job id: {listed}"));
    let preempted = points[&task].clone();
    let other = points
        .iter()
        .find(|(t, _)| **t != task)
        .map(|(_, run)| run.clone())
        .unwrap();

    slurm(&cluster, "scancel", &["--signal=USR2", "--batch", &task]);

    let log =
        |run: &std::path::Path| std::fs::read_to_string(run.join("train.log")).unwrap_or_default();
    wait_for_file(
        &preempted.join("manifest.json"),
        Duration::from_secs(60),
        |t| t.contains("\"PREEMPTED\""),
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", log(&preempted)));
    assert!(
        log(&preempted).contains(&format!("requeueing Slurm job {task} (1 of ")),
        "{}",
        log(&preempted)
    );
    let result = wait_for_file(&other.join("result.json"), Duration::from_secs(120), |t| {
        t.contains("\"succeeded\"") || t.contains("\"cancelled\"")
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", log(&other)));
    assert!(
        result.contains("\"succeeded\""),
        "{result}\n{}",
        log(&other)
    );
    assert_eq!(
        metric_steps(&other, 0),
        (1..=400).collect::<Vec<_>>(),
        "the other point trained once, straight through"
    );
}

/// Submits `text` (a spec whose first attempt's set-up waits for the test), sends the batch
/// script SIGUSR2 during that set-up, and lets the set-up end once its shell has taken it:
/// the job's id and run directory.
fn notice_during_the_set_up(
    cluster: &SlurmCluster,
    dir: &TestDir,
    name: &str,
    text: &str,
) -> (String, std::path::PathBuf) {
    // The first attempt's set-up (it runs in the run directory) lasts until the test has
    // sent the notice (a minute at most); a requeued attempt's is quick.
    let text = text.replace(
        "resources:\n",
        "resources:\n  setup:\n    - '[ -e attempted ] || { touch attempted in-setup; \
         for i in $(seq 600); do [ -e notice-sent ] && break; sleep 0.1; done; }'\n",
    );
    let (job_id, run) = submit_simulated(cluster, dir, name, &text);
    wait_for("the set-up to start", Duration::from_secs(60), || {
        run.join("in-setup").exists().then_some(())
    })
    .unwrap();
    let out = run_with_deadline(
        cluster
            .command("scancel")
            .args(["--signal=USR2", "--batch", &job_id]),
        Duration::from_secs(30),
    )
    .unwrap();
    assert!(out.status.success(), "{}", stderr_of(&out));
    // The set-up ends once its shell has taken the notice (it says so in the job's .err).
    let err_suffix = format!("-{job_id}.err");
    wait_for(
        "the set-up's shell to take the notice",
        Duration::from_secs(60),
        || {
            std::fs::read_dir(&run)
                .ok()?
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().ends_with(&err_suffix))
                .any(|e| {
                    std::fs::read_to_string(e.path()).is_ok_and(|t| {
                        t.contains("SIGUSR2 (preemption or the time limit near) during the set-up")
                    })
                })
                .then_some(())
        },
    )
    .unwrap();
    std::fs::write(run.join("notice-sent"), "").unwrap();
    (job_id, run)
}

#[test]
fn usr2_during_the_set_up_requeues_the_job_without_starting_ranks() {
    let cluster = SlurmCluster::start().expect("start the local Slurm cluster");
    let dir = TestDir::new("slurm-preempt-setup");
    let name = "setup-notice";
    // 5 minutes, the notice 2 before the limit: a notice now is a preemption.
    let (_, run) = notice_during_the_set_up(&cluster, &dir, name, &tiny_mlp_spec(name, 3, 1));
    // Once the set-up is done, the controller takes the notice over: no rank, a requeue.
    // (Slurm holds a requeued job back for minutes; the run's resume is tested above.)
    let log = || std::fs::read_to_string(run.join("train.log")).unwrap_or_default();
    wait_for_file(&run.join("requeue_count"), Duration::from_secs(60), |t| {
        t.trim() == "1"
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", log()));
    wait_for_file(&run.join("manifest.json"), Duration::from_secs(60), |t| {
        t.contains("\"PREEMPTED\"")
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", log()));
    let log = log();
    assert!(
        log.contains(
            "preemption notice (SIGUSR2) before the ranks were launched (during the set-up"
        ) && !log.contains("[rank 0]"),
        "{log}"
    );
    let out = cluster
        .shardrun(dir.path(), &["cancel", &run.to_string_lossy()])
        .unwrap();
    assert!(out.status.success(), "{}", stderr_of(&out));
}

/// The notice of the time limit during the set-up, with the data ready already: another
/// attempt would run the same set-up into the same notice, so the job is not requeued; it
/// fails, saying why and what to change.
#[test]
fn a_time_limit_notice_during_the_set_up_fails_the_job_rather_than_requeue_it() {
    let cluster = SlurmCluster::start().expect("start the local Slurm cluster");
    let dir = TestDir::new("slurm-timelimit-setup");
    let name = "setup-time-limit";
    // 5 minutes, the notice 250 s before the limit: a notice now is the time limit's.
    let spec = tiny_mlp_spec(name, 3, 1) + "preemption: { signal_seconds: 250 }\n";
    let (job_id, run) = notice_during_the_set_up(&cluster, &dir, name, &spec);
    let log = || std::fs::read_to_string(run.join("train.log")).unwrap_or_default();
    wait_for_file(&run.join("result.json"), Duration::from_secs(60), |t| {
        !t.is_empty()
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", log()));
    let result = result_json(&run);
    assert_eq!(
        (&result["status"], &result["notice"], &result["requeued"]),
        (&"failed".into(), &"time_limit".into(), &false.into()),
        "{result}\n{}",
        log()
    );
    let message = result["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with("the run stopped before its time limit; it has no checkpoint yet; not requeued: the notice of its time limit came before it saved a step past the start, and another attempt would spend its time the same way (the set-up lines, with its data prepared already)")
            && message.contains("give the job more time (`resources.time`) or take the notice later (a smaller `preemption.signal_seconds` than 250, leaving the checkpoint time to be written)")
            && message.ends_with(" to start it"),
        "{message}"
    );
    assert!(!run.join("requeue_count").exists(), "{}", log());
    cluster.wait_until_gone(&job_id, Duration::from_secs(60));
    let out = cluster
        .shardrun(dir.path(), &["status", "--json", &run.to_string_lossy()])
        .unwrap();
    assert!(
        stdout_of(&out).contains("\"state\": \"FAILED\""),
        "{}",
        stdout_of(&out)
    );
    // The run's events end in its failure, as its state does.
    let events = std::fs::read_to_string(run.join("events.jsonl")).unwrap();
    let last: serde_json::Value =
        serde_json::from_str(events.lines().last().unwrap_or_default()).unwrap();
    assert_eq!(last["event"], "failed", "{events}");
}

/// Slurm's SIGTERM to the ranks (a preemption's grace time; `scancel --signal=TERM` without
/// `--batch` sends the same) kills a rank that is still starting, before its handlers are
/// installed: here a worker that never gets that far. The job ends preempted, as the notice
/// it was, not failed.
#[test]
fn a_rank_terminated_while_it_starts_ends_the_job_preempted_not_failed() {
    let cluster = SlurmCluster::start().expect("start the local Slurm cluster");
    let dir = TestDir::new("slurm-term-at-start");
    let spec = tiny_mlp_spec("starting", 10, 2) + "preemption: { requeue: false }\n";
    let (job_id, run) = submit_ranks_that_never_start(&cluster, &dir, "starting", &spec);
    let log = || std::fs::read_to_string(run.join("train.log")).unwrap_or_default();
    // The ranks' step runs: signal it alone.
    slurm(&cluster, "scancel", &["--signal=TERM", &job_id]);

    wait_for_file(&run.join("result.json"), Duration::from_secs(120), |t| {
        !t.is_empty()
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", log()));
    let result = result_json(&run);
    assert_eq!(result["status"], "preempted", "{result}\n{}", log());
    assert!(
        log().contains("before it could take the notice"),
        "{}",
        log()
    );
    cluster.wait_until_gone(&job_id, Duration::from_secs(60));
}

/// `scontrol requeue` (as Slurm does for a failed node) stops the job with SIGTERM and queues
/// it again: the run takes it as a notice, not a cancel, and says the job is queued, not to
/// submit it again. Real workers under srun: Slurm kills the batch script KillWait (5 s
/// here) after its SIGTERM, while srun waits two seconds longer for its step, so the end
/// must be recorded without waiting for srun or for a cancel's word that never comes.
#[test]
fn scontrol_requeue_is_taken_as_a_notice_not_a_cancel() {
    let cluster = SlurmCluster::start().expect("start the local Slurm cluster");
    let dir = TestDir::new("slurm-scontrol-requeue");
    let spec = tiny_mlp_spec("requeued", 100_000_000, 2) + "  log_every: 100\n";
    let spec = dir.write("requeued.yaml", &spec);
    let job_id = cluster
        .submit(dir.path(), &[&spec.to_string_lossy()])
        .job_id;
    let run = dir.join("runs/requeued");
    wait_for_steps(
        &run,
        5,
        "the first attempt to train",
        Duration::from_secs(120),
    );
    slurm(&cluster, "scontrol", &["requeue", &job_id]);

    let log = || std::fs::read_to_string(run.join("train.log")).unwrap_or_default();
    wait_for_file(&run.join("result.json"), Duration::from_secs(120), |t| {
        !t.is_empty()
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", log()));
    let result = result_json(&run);
    assert_eq!(
        (&result["status"], &result["notice"], &result["requeued"]),
        (&"preempted".into(), &"slurm_requeue".into(), &true.into()),
        "{result}\n{}",
        log()
    );
    let message = result["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("Slurm queues the job again") && !message.contains("submit it"),
        "{message}"
    );
    // Slurm's own requeue is not one of the job's `max_requeues`.
    assert!(!run.join("requeue_count").exists());
    let out = cluster
        .shardrun(dir.path(), &["metrics", &run.to_string_lossy()])
        .unwrap();
    assert!(stdout_of(&out).contains("queued"), "{}", stdout_of(&out));
    // The checkpoint the ranks wrote for it is the one the queued job resumes from.
    let step = result["checkpoint"]["step"].as_u64().expect("a checkpoint");
    assert!(
        run.join(format!("checkpoints/step-{step}/COMPLETE"))
            .is_file(),
        "{result}"
    );
    let run_arg = run.to_string_lossy().into_owned();
    let out = cluster.shardrun(dir.path(), &["cancel", &run_arg]).unwrap();
    assert!(out.status.success(), "{}", stderr_of(&out));
    // Its end counts Slurm's requeue apart from the controller's own.
    let ended = wait_for("the queued job to end", Duration::from_secs(60), || {
        let status = status_json(&cluster, &dir, &run_arg)?;
        let state = status["runs"][0]["state"].clone();
        (state != "SUBMITTED" && state != "RUNNING").then_some(status)
    })
    .unwrap();
    let said = &ended["runs"][0];
    assert_eq!(
        (&said["requeues"], &said["requeued_by_slurm"]),
        (&0.into(), &1.into()),
        "{ended}"
    );
    assert!(
        said["detail"]
            .as_str()
            .unwrap_or_default()
            .ends_with("; its jobs were requeued 1 time(s) by Slurm"),
        "{ended}"
    );
}

/// A controller killed outright (SIGKILL, as the OOM killer does) writes nothing more:
/// Slurm calls that a JobLaunchFailure, but `status` says the controller stopped after it
/// started, and that submitting the run again resumes it.
#[test]
fn a_controller_killed_outright_is_named_by_status_not_as_a_launch_failure() {
    let cluster = SlurmCluster::start().expect("start the local Slurm cluster");
    let dir = TestDir::new("slurm-controller-killed");
    let spec = tiny_mlp_spec("killed", 100_000, 2);
    let (_, run) = submit_simulated(&cluster, &dir, "killed", &spec);
    wait_for_steps(&run, 3, "the ranks to train", Duration::from_secs(120));
    // While it runs, status says how far it is and, at its pace (steps of about 40 ms), how
    // long it has left: most of the 100,000 steps, tens of minutes.
    let out = cluster
        .shardrun(dir.path(), &["status", &run.to_string_lossy()])
        .unwrap();
    let table = stdout_of(&out);
    let detail = table
        .lines()
        .find(|l| l.contains("RUNNING"))
        .and_then(|l| l.split_once(" at step "))
        .map(|(_, detail)| detail.to_string())
        .unwrap_or_else(|| panic!("{table}"));
    assert!(
        detail.contains(" of 100000, about ")
            && detail.contains("m")
            && detail.trim_end().ends_with(" steps/s)"),
        "{table}"
    );
    let holder = std::fs::read_to_string(run.join("controller.lock")).unwrap();
    let pid: i32 = holder
        .trim()
        .strip_prefix("pid ")
        .and_then(|rest| rest.split_once(' '))
        .and_then(|(pid, _)| pid.parse().ok())
        .unwrap_or_else(|| panic!("no pid in {holder:?}"));
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);

    let run_arg = run.to_string_lossy().into_owned();
    // A status that cannot write the run's manifest (a full disk, a run another user reads;
    // here a file size limit of 0, which fails writes even for root) shows the end it works
    // out all the same, and says it is not recorded.
    let unrecorded_status = || {
        cluster
            .command("sh")
            .current_dir(dir.path())
            .args(["-c", "trap '' XFSZ; ulimit -f 0; exec \"$0\" \"$@\""])
            .arg(shardrun())
            .args(["status", "--json", &run_arg])
            .output()
            .unwrap()
    };
    let mut detail = String::new();
    let mut said = String::new();
    let ended = wait_for("status to say FAILED", Duration::from_secs(120), || {
        let out = unrecorded_status();
        said = stderr_of(&out);
        assert!(out.status.success(), "{said}");
        let runs = status_runs(&stdout_of(&out));
        let first = runs.first()?;
        detail = first["detail"].as_str().unwrap_or_default().to_string();
        (first["state"] == "FAILED").then_some(())
    });
    ended.unwrap_or_else(|e| panic!("{e}: {detail}"));
    assert!(
        said.contains(
            "warning: the end of 1 run(s) is shown but not recorded in their run directories"
        ),
        "{said}"
    );
    let manifest = || -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(run.join("manifest.json")).unwrap()).unwrap()
    };
    assert_eq!(manifest()["state"], "RUNNING");
    let out = cluster
        .shardrun(dir.path(), &["status", "--json", &run_arg])
        .unwrap();
    assert_eq!(status_runs(&stdout_of(&out))[0]["detail"], detail);
    assert_eq!(manifest()["state"], "FAILED", "recorded once it can be");
    assert!(
        detail.contains("its controller stopped after it started without writing a result")
            && detail.contains("`shardrun submit` the run again"),
        "{detail}"
    );
    assert!(
        !detail.contains("the job ended before its controller wrote a result"),
        "said once: {detail}"
    );
    assert!(!detail.contains("JobLaunchFailure"), "{detail}");
}

/// `scancel` signals the batch script and the ranks at once: ranks that SIGTERM ends while
/// they start are not taken for a preemption to requeue, whichever the controller hears of
/// first. The run ends cancelled and its job is not queued again.
#[test]
fn scancel_while_the_ranks_start_cancels_the_job_not_requeues_it() {
    let cluster = SlurmCluster::start().expect("start the local Slurm cluster");
    let dir = TestDir::new("slurm-scancel-at-start");
    let spec = tiny_mlp_spec("cancelled", 10, 2);
    let (job_id, run) = submit_ranks_that_never_start(&cluster, &dir, "cancelled", &spec);
    let log = || std::fs::read_to_string(run.join("train.log")).unwrap_or_default();
    slurm(&cluster, "scancel", &[&job_id]);

    wait_for_file(&run.join("result.json"), Duration::from_secs(120), |t| {
        !t.is_empty()
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", log()));
    let result = result_json(&run);
    assert_eq!(result["status"], "cancelled", "{result}\n{}", log());
    assert_eq!(result["requeued"], false, "{result}");
    assert!(!log().contains("requeueing Slurm job"), "{}", log());
}
