//! `shardrun submit`, `status` and `cancel` against the project's real single-node Slurm
//! (`slurm/start.sh`). The job bodies come from `resources.setup` lines so these tests do
//! not depend on the training code; `slurm_training.rs` runs the real controller.

use shardrun_e2e::*;
use std::path::Path;
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(60);

/// A tiny valid spec whose job runs `setup` and never reaches the controller when the
/// setup ends with `exit`.
fn spec(name: &str, setup: &[&str]) -> String {
    let lines: String = setup.iter().map(|l| format!("    - {l:?}\n")).collect();
    format!(
        "name: {name}\nresources:\n  tasks_per_node: 1\n  time: \"00:05:00\"\n  setup:\n{lines}training:\n  model: {{ kind: mlp, input_dim: 4, hidden_dim: 8, output_dim: 4 }}\n  steps: 1\n  total_batch_size: 4\n  batch_size_per_device: 4\n"
    )
}

fn state_of(cluster: &SlurmCluster, cwd: &Path, run: &Path) -> String {
    let out = cluster
        .shardrun(cwd, &["status", "--json", &run.to_string_lossy()])
        .expect("status runs");
    assert!(out.status.success(), "status failed: {}", stderr_of(&out));
    states(&stdout_of(&out))
        .first()
        .map(|(_, s)| s.clone())
        .unwrap_or_default()
}

fn wait_state(cluster: &SlurmCluster, cwd: &Path, run: &Path, want: &str) {
    let mut last = String::new();
    let result = wait_for(&format!("{} to be {want}", run.display()), DEADLINE, || {
        last = state_of(cluster, cwd, run);
        (last == want).then_some(())
    });
    if let Err(e) = result {
        panic!("{e}; last state {last}");
    }
}

#[test]
fn rendered_script_runs_and_its_output_file_grows() {
    let cluster = SlurmCluster::start().expect("start the local Slurm cluster");
    let dir = TestDir::new("submit-grows");
    let spec = dir.write(
        "job.yaml",
        &spec(
            "ticker",
            &[
                "for i in 1 2 3 4 5 6; do echo \"tick $i\"; sleep 0.5; done",
                "exit 0",
            ],
        ),
    );
    let Submitted { stdout, job_id } = cluster.submit(dir.path(), &[&spec.to_string_lossy()]);
    let run = dir.join("runs/ticker");
    let log = run.join(format!("ticker-{job_id}.out"));
    assert!(
        stdout.contains(&format!("tail -F {}", log.display())),
        "{stdout}"
    );

    // The output file appears while the job runs and grows line by line.
    let first = wait_for_file(&log, DEADLINE, |t| t.contains("tick 1")).unwrap();
    assert!(
        !first.contains("tick 6"),
        "saw the whole output at once: {first}"
    );
    wait_for_file(&log, DEADLINE, |t| t.contains("tick 6")).unwrap();
    assert!(std::fs::read_to_string(&log)
        .unwrap()
        .starts_with("shardrun: job "));
    wait_state(&cluster, dir.path(), &run, "COMPLETED");
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest["slurm_job_ids"][0], job_id.as_str());
    assert_eq!(
        manifest["state"], "COMPLETED",
        "status writes the ended state back"
    );
}

#[test]
fn status_reports_failed_and_cancelled() {
    let cluster = SlurmCluster::start().expect("start the local Slurm cluster");
    let dir = TestDir::new("submit-states");
    let failing = dir.write("fail.yaml", &spec("fails", &["exit 3"]));
    let sleeping = dir.write("sleep.yaml", &spec("sleeps", &["sleep 300"]));
    for spec in [&failing, &sleeping] {
        cluster.submit(dir.path(), &[&spec.to_string_lossy()]);
    }
    wait_state(&cluster, dir.path(), &dir.join("runs/fails"), "FAILED");

    let run = dir.join("runs/sleeps");
    wait_state(&cluster, dir.path(), &run, "RUNNING");
    // Running, Slurm says no more: how far it has trained does (here: its set-up sleeps).
    let out = cluster
        .shardrun(dir.path(), &["status", &run.to_string_lossy()])
        .unwrap();
    assert!(
        stdout_of(&out).contains("RUNNING") && stdout_of(&out).contains("no step logged yet"),
        "{}",
        stdout_of(&out)
    );
    let out = cluster
        .shardrun(dir.path(), &["cancel", &run.to_string_lossy()])
        .unwrap();
    assert!(out.status.success(), "cancel failed: {}", stderr_of(&out));
    wait_state(&cluster, dir.path(), &run, "CANCELLED");

    // One batched query answers for the whole run root.
    let out = cluster.shardrun(dir.path(), &["status", "--json"]).unwrap();
    let mut all = states(&stdout_of(&out));
    all.sort();
    assert_eq!(
        all,
        vec![
            ("fails".into(), "FAILED".into()),
            ("sleeps".into(), "CANCELLED".into())
        ]
    );
    // Slurm's record of a cancel says nothing more: the detail still says what happened.
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let runs = status["runs"].as_array().unwrap();
    let sleeps = runs.iter().find(|r| r["name"] == "sleeps").unwrap();
    assert!(
        sleeps["detail"]
            .as_str()
            .unwrap_or_default()
            .contains("cancelled"),
        "{status}"
    );
}

/// A set-up line that fails (here a command the node does not have, as `module` is in a
/// shell that never loaded its set-up) ends the job before its controller starts; the error
/// file names the line, and `shardrun status` quotes it, so the user need not go looking.
#[test]
fn a_failing_set_up_line_is_named_by_status() {
    let cluster = SlurmCluster::start().expect("start the local Slurm cluster");
    let dir = TestDir::new("submit-setup-fails");
    let spec = dir.write(
        "job.yaml",
        &spec(
            "setupfails",
            &["echo set-up begins", "no_such_command_here --flag"],
        ),
    );
    let job_id = cluster
        .submit(dir.path(), &[&spec.to_string_lossy()])
        .job_id;
    let run = dir.join("runs/setupfails");
    wait_state(&cluster, dir.path(), &run, "FAILED");
    let err_file = run.join(format!("setupfails-{job_id}.err"));
    let named = "shardrun: a resources.setup line failed (exit 127, not found: module and conda \
                 are defined by login shells, load their set-up first, e.g. source /etc/profile): \
                 no_such_command_here --flag";
    let out = cluster
        .shardrun(dir.path(), &["status", "--json", &run.to_string_lossy()])
        .unwrap();
    let runs = status_runs(&stdout_of(&out));
    let detail = runs[0]["detail"].as_str().unwrap_or_default().to_string();
    assert!(
        detail.contains(&format!("{} ends: {named}", err_file.display())),
        "{detail}\n{}",
        std::fs::read_to_string(&err_file).unwrap_or_default()
    );
    // The set-up lines before it ran; the controller never did.
    let out_file = std::fs::read_to_string(run.join(format!("setupfails-{job_id}.out"))).unwrap();
    assert!(out_file.contains("set-up begins"), "{out_file}");
    assert!(!run.join("train.log").exists());
    // Following its log until it is done ends: the run ended without a log (as `status`
    // recorded), and says how.
    let mut follow = cluster.command(shardrun());
    follow
        .current_dir(dir.path())
        .args(["logs", &run.to_string_lossy(), "-f", "--until-done"]);
    let out = run_with_deadline(&mut follow, Duration::from_secs(60)).unwrap();
    let said = stderr_of(&out);
    assert_eq!(out.status.code(), Some(1), "{}{said}", stdout_of(&out));
    assert!(
        said.contains("has no log: the run ended (FAILED) before any rank started")
            && said.contains(named),
        "{said}"
    );

    // A line that ends the job itself fails no command the ERR trap sees: named all the same.
    let exits = dir.write(
        "exits.yaml",
        &self::spec("setupexits", &["echo set-up begins", "exit 3"]),
    );
    let job_id = cluster
        .submit(dir.path(), &[&exits.to_string_lossy()])
        .job_id;
    let run = dir.join("runs/setupexits");
    // Followed from its submission, before anything recorded its end (no controller ever
    // starts to write it): the follow asks Slurm, and ends when the job has.
    let mut follow = cluster.command(shardrun());
    follow
        .current_dir(dir.path())
        .args(["logs", "-f", &run.to_string_lossy()]);
    let out = run_with_deadline(&mut follow, Duration::from_secs(60)).unwrap();
    let said = format!("{}{}", stdout_of(&out), stderr_of(&out));
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("ended (FAILED)"), "{said}");
    wait_state(&cluster, dir.path(), &run, "FAILED");
    let err_file = run.join(format!("setupexits-{job_id}.err"));
    let out = cluster
        .shardrun(dir.path(), &["status", "--json", &run.to_string_lossy()])
        .unwrap();
    let detail = status_runs(&stdout_of(&out))[0]["detail"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        detail.contains(&format!(
            "{} ends: shardrun: a resources.setup line ended the job (exit 3): exit 3",
            err_file.display()
        )),
        "{detail}\n{}",
        std::fs::read_to_string(&err_file).unwrap_or_default()
    );

    // `exit 0` ends it COMPLETED, as Slurm says, having trained nothing, as status says.
    let done = dir.write(
        "done.yaml",
        &self::spec("setupdone", &["echo set-up begins", "exit 0"]),
    );
    let job_id = cluster
        .submit(dir.path(), &[&done.to_string_lossy()])
        .job_id;
    let run = dir.join("runs/setupdone");
    wait_state(&cluster, dir.path(), &run, "COMPLETED");
    let err_file = run.join(format!("setupdone-{job_id}.err"));
    let out = cluster
        .shardrun(dir.path(), &["status", "--json", &run.to_string_lossy()])
        .unwrap();
    let detail = status_runs(&stdout_of(&out))[0]["detail"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        detail.starts_with("it trained nothing: the job ended before its controller wrote a result")
            && detail.ends_with(&format!(
                "{} ends: shardrun: a resources.setup line ended the job before training (exit 0): exit 0",
                err_file.display()
            )),
        "{detail}\n{}",
        std::fs::read_to_string(&err_file).unwrap_or_default()
    );
}

#[test]
fn sbatch_refusal_shows_its_stderr_and_marks_the_run_failed() {
    let cluster = SlurmCluster::start().expect("start the local Slurm cluster");
    let dir = TestDir::new("submit-refused");
    let text = spec("refused", &["exit 0"]).replace(
        "  tasks_per_node: 1\n",
        "  tasks_per_node: 1\n  partition: no-such-partition\n",
    );
    let spec = dir.write("job.yaml", &text);
    let out = cluster
        .shardrun(dir.path(), &["submit", &spec.to_string_lossy()])
        .unwrap();
    assert!(!out.status.success());
    let stderr = stderr_of(&out);
    assert!(
        stderr.contains("invalid partition"),
        "sbatch's stderr is shown: {stderr}"
    );
    assert!(
        stderr.contains(
            "Fix the cause (the spec, a --set value or the cluster), then run the same \
             `shardrun submit` command again"
        ),
        "says what to do next: {stderr}"
    );
    let run = dir.join("runs/refused");
    let manifest = std::fs::read_to_string(run.join("manifest.json")).unwrap();
    assert!(manifest.contains("\"SUBMIT_FAILED\""), "{manifest}");
    // The run directory is complete, and nothing temporary is left beside it.
    for file in [
        "job.yaml",
        "resolved.json",
        "train_config.json",
        "plan.txt",
        "job.sbatch",
        "secret",
    ] {
        assert!(run.join(file).is_file(), "{file} missing");
    }
    assert_eq!(std::fs::read_dir(dir.join("runs")).unwrap().count(), 1);
}

#[test]
fn a_job_no_node_can_run_is_refused_at_submit_not_left_pending() {
    // Held, slurmctld would take it and keep it pending for ever (BadConstraints).
    let cluster = SlurmCluster::start().expect("start the local Slurm cluster");
    let dir = TestDir::new("submit-no-node");
    let name = format!("toobig-{}", std::process::id());
    let text = spec(&name, &["exit 0"]).replace(
        "  tasks_per_node: 1\n",
        "  tasks_per_node: 1\n  mem: \"900G\"\n",
    );
    let spec = dir.write("job.yaml", &text);
    let out = cluster
        .shardrun(dir.path(), &["submit", &spec.to_string_lossy()])
        .unwrap();
    let stderr = stderr_of(&out);
    assert!(!out.status.success(), "{}{stderr}", stdout_of(&out));
    assert!(
        stderr.contains("Requested node configuration is not available")
            && stderr.contains("sbatch did not accept the job")
            && stderr.contains("why: each node is asked for 921600 MB of memory (resources.mem)"),
        "{stderr}"
    );
    let manifest =
        std::fs::read_to_string(dir.join("runs").join(&name).join("manifest.json")).unwrap();
    assert!(manifest.contains("\"SUBMIT_FAILED\""), "{manifest}");
    let out = cluster
        .command("squeue")
        .args(["-h", "--states=all", "-o", "%j"])
        .output()
        .unwrap();
    let queued = stdout_of(&out);
    assert!(!queued.lines().any(|j| j == name), "no job left: {queued}");
}

#[test]
fn a_job_that_needs_a_drained_node_is_submitted_and_waits_for_it() {
    // `sbatch --test-only` refuses it as it refuses a request no node meets; a plain
    // sbatch queues it until the node is back. The node is this cluster's only one.
    let cluster = SlurmCluster::start_named("maintenance").expect("start the maintenance cluster");
    let scontrol = |state: &str| {
        let out = cluster
            .command("scontrol")
            .args([
                "update",
                &format!("nodename={}", hostname()),
                &format!("state={state}"),
            ])
            .args((state == "drain").then_some("reason=maintenance"))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "scontrol {state}: {}",
            stderr_of(&out)
        );
    };
    scontrol("drain");
    let dir = TestDir::new("submit-drained");
    let drained = dir.write("job.yaml", &spec("drained", &["exit 0"]));
    let out = cluster
        .shardrun(dir.path(), &["submit", &drained.to_string_lossy()])
        .unwrap();
    let stderr = stderr_of(&out);
    // A request the node would not meet even in service is refused all the same.
    let text = spec("toobig", &["exit 0"]).replace(
        "  tasks_per_node: 1\n",
        "  tasks_per_node: 1\n  mem: \"900G\"\n",
    );
    let toobig = dir.write("toobig.yaml", &text);
    let refused = cluster
        .shardrun(dir.path(), &["submit", &toobig.to_string_lossy()])
        .unwrap();
    scontrol("resume");
    assert!(out.status.success(), "{}{stderr}", stdout_of(&out));
    assert!(
        stderr.contains(&format!(
            "which nodes of its partition out of service now would meet ({} (drain)): \
             submitted, so that it waits for them",
            hostname()
        )),
        "{stderr}"
    );
    assert!(
        !refused.status.success()
            && stderr_of(&refused).contains("Requested node configuration is not available"),
        "{}{}",
        stdout_of(&refused),
        stderr_of(&refused)
    );
    // Back in service, the node runs it.
    let run = dir.join("runs/drained");
    wait_state(&cluster, dir.path(), &run, "COMPLETED");
}

#[test]
fn missing_sbatch_is_explained() {
    let dir = TestDir::new("submit-no-sbatch");
    let spec = dir.write("job.yaml", &spec("nosbatch", &["exit 0"]));
    let mut cmd = std::process::Command::new(shardrun());
    cmd.current_dir(dir.path())
        .env("PATH", "/nonexistent")
        .args(["submit", &spec.to_string_lossy()]);
    let out = run_with_deadline(&mut cmd, DEADLINE).unwrap();
    assert!(!out.status.success());
    let stderr = stderr_of(&out);
    assert!(
        stderr.contains("`sbatch` was not found on PATH") && stderr.contains("slurm/start.sh"),
        "{stderr}"
    );
    let manifest = std::fs::read_to_string(dir.join("runs/nosbatch/manifest.json")).unwrap();
    assert!(manifest.contains("\"SUBMIT_FAILED\""), "{manifest}");
}

#[test]
fn a_folder_that_is_not_a_run_is_refused_even_when_forced() {
    let dir = TestDir::new("submit-exists");
    let spec = dir.write("job.yaml", &spec("twice", &["exit 0"]));
    let run = dir.join("runs/twice");
    std::fs::create_dir_all(&run).unwrap();
    std::fs::write(run.join("precious"), "keep me").unwrap();
    let mut cmd = std::process::Command::new(shardrun());
    cmd.current_dir(dir.path())
        .args(["submit", &spec.to_string_lossy()]);
    let out = run_with_deadline(&mut cmd, DEADLINE).unwrap();
    assert!(!out.status.success());
    let stderr = stderr_of(&out);
    assert!(
        stderr.contains("already exists and is not a run directory") && !stderr.contains("--force"),
        "{stderr}"
    );
    // --force replaces run directories only: a folder of the user's is never deleted.
    cmd.arg("--force");
    let out = run_with_deadline(&mut cmd, DEADLINE).unwrap();
    assert!(!out.status.success());
    let stderr = stderr_of(&out);
    assert!(stderr.contains("it holds precious"), "{stderr}");
    assert_eq!(
        std::fs::read_to_string(run.join("precious")).unwrap(),
        "keep me"
    );
}

#[test]
fn dry_run_prints_the_script_and_writes_nothing() {
    let dir = TestDir::new("submit-dry");
    let spec = dir.write("job.yaml", &spec("dry", &["exit 0"]));
    let mut cmd = std::process::Command::new(shardrun());
    cmd.current_dir(dir.path())
        .args(["submit", "--dry-run", &spec.to_string_lossy()]);
    let out = run_with_deadline(&mut cmd, DEADLINE).unwrap();
    assert!(out.status.success(), "{}", stderr_of(&out));
    let script = stdout_of(&out);
    assert!(
        script.starts_with("#!/bin/bash") && script.contains("#SBATCH --signal=B:USR2@"),
        "{script}"
    );
    assert!(script.contains(&format!(
        "exec {} controller --run-dir",
        shardrun().canonicalize().unwrap().display()
    )));
    assert!(!dir.join("runs").exists());
}

/// With slurmctld out of reach (here: a `slurm.conf` naming a port nothing listens on),
/// `status` still lists every run: a job still queued as last recorded, and said so, and a
/// run that ended with its end. It exits 1 with squeue's own error (0 when only runs that
/// ended were asked after, with a note), and writes nothing back: once Slurm answers again,
/// the queued job is as it was.
#[test]
fn a_slurm_that_does_not_answer_leaves_the_runs_as_last_recorded() {
    let cluster = SlurmCluster::start().expect("start the local Slurm cluster");
    let dir = TestDir::new("submit-unanswered");
    let failing = dir.write("fail.yaml", &spec("fails", &["exit 3"]));
    let waiting = dir.write(
        "wait.yaml",
        &spec("waits", &["exit 0"]).replace(
            "  setup:",
            "  extra_sbatch: [\"--begin=now+3600\"]\n  setup:",
        ),
    );
    for spec in [&failing, &waiting] {
        cluster.submit(dir.path(), &[&spec.to_string_lossy()]);
    }
    wait_state(&cluster, dir.path(), &dir.join("runs/fails"), "FAILED");
    let waits = dir.join("runs/waits");
    wait_state(&cluster, dir.path(), &waits, "SUBMITTED");

    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port();
    let conf = std::fs::read_to_string(cluster.slurm_conf()).unwrap();
    let unreachable: String = conf
        .lines()
        .map(|l| match l.starts_with("SlurmctldPort=") {
            true => format!("SlurmctldPort={port}\n"),
            false => format!("{l}\n"),
        })
        .collect();
    let unreachable = dir.write("unreachable.conf", &unreachable);
    let status = |args: &[&str]| {
        let mut cmd = std::process::Command::new(shardrun());
        cmd.current_dir(dir.path())
            .args(args)
            .env("SLURM_CONF", &unreachable);
        run_with_deadline(&mut cmd, DEADLINE).unwrap()
    };

    let out = status(&["status", "--json"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr_of(&out));
    let document: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        document["slurm_error"]
            .as_str()
            .is_some_and(|e| e.contains("Unable to contact slurm controller")),
        "{document}"
    );
    let run = |name: &str| {
        document["runs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("no run {name} in {document}"))
    };
    assert_eq!(run("fails")["state"], "FAILED", "{document}");
    assert_eq!(run("waits")["state"], "SUBMITTED", "{document}");
    assert!(
        run("waits")["detail"]
            .as_str()
            .is_some_and(|d| d.contains("as last recorded: Slurm did not answer")),
        "{document}"
    );

    let out = status(&["status"]);
    assert_eq!(out.status.code(), Some(1));
    let table = stdout_of(&out);
    assert!(
        table.contains("waits") && table.contains("fails"),
        "{table}"
    );
    assert!(
        table.contains("Slurm did not answer: the states of submitted runs are as last recorded"),
        "{table}"
    );
    let stderr = stderr_of(&out);
    assert!(
        stderr.contains("Unable to contact slurm controller")
            && stderr.contains("fix: slurmctld did not answer")
            && stderr.contains("`scontrol ping`"),
        "{stderr}"
    );
    // Nothing can be cancelled: said so, with the job to cancel once Slurm answers.
    let out = status(&["cancel", &waits.to_string_lossy()]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr_of(&out));
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(waits.join("manifest.json")).unwrap())
            .unwrap();
    let waits_job = manifest["slurm_job_ids"][0].as_str().unwrap().to_string();
    assert!(
        stderr_of(&out).contains("nothing was cancelled")
            && stderr_of(&out).contains(&format!("(the jobs recorded: {waits_job} (waits))")),
        "{}",
        stderr_of(&out)
    );

    // With only the run that ended asked after, what is shown stands: exit 0, with a note
    // saying Slurm did not answer (the wait for squeue would otherwise be unexplained).
    let fails = dir.join("runs/fails");
    let out = status(&["status", "--json", &fails.to_string_lossy()]);
    assert!(out.status.success(), "{}", stderr_of(&out));
    let document: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(document["source"], "recorded", "{document}");
    assert_eq!(document["runs"][0]["state"], "FAILED", "{document}");
    assert!(
        document["slurm_error"]
            .as_str()
            .is_some_and(|e| e.contains("Unable to contact slurm controller")),
        "{document}"
    );
    let out = status(&["status", &fails.to_string_lossy()]);
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert!(
        stdout_of(&out).contains("Slurm did not answer: every run had ended, as shown")
            && stderr_of(&out).contains("Unable to contact slurm controller"),
        "{}{}",
        stdout_of(&out),
        stderr_of(&out)
    );

    // A dry run still shows the script and plan, and says the real submit would fail.
    let fresh = dir.write("fresh.yaml", &spec("fresh", &["exit 0"]));
    let out = status(&["submit", "--dry-run", &fresh.to_string_lossy()]);
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert!(
        stdout_of(&out).starts_with("#!/bin/bash")
            && stderr_of(&out).contains("warning: the real submit would fail here")
            && stderr_of(&out).contains("Unable to contact slurm controller"),
        "{}",
        stderr_of(&out)
    );
    // The real one says Slurm was not reached, not that it refused the job.
    let out = status(&["submit", &fresh.to_string_lossy()]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr_of(&out));
    assert!(
        stderr_of(&out).contains("sbatch could not reach slurmctld")
            && stderr_of(&out).contains("marked SUBMIT_FAILED")
            && !stderr_of(&out).contains("did not accept"),
        "{}",
        stderr_of(&out)
    );

    // Nothing was written back: the job still waits, and Slurm says so again.
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(waits.join("manifest.json")).unwrap())
            .unwrap();
    assert_eq!(manifest["state"], "SUBMITTED");
    let out = cluster
        .shardrun(dir.path(), &["status", "--json", &waits.to_string_lossy()])
        .unwrap();
    assert!(out.status.success(), "{}", stderr_of(&out));
    let document: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(document["runs"][0]["state"], "SUBMITTED", "{document}");
    assert!(
        document["runs"][0]["detail"]
            .as_str()
            .unwrap()
            .starts_with("BeginTime: not to start before its begin time (`sbatch --begin`"),
        "{document}"
    );
    // Held by an administrator (root here), it waits for a release, and status says so.
    let held = cluster
        .command("scontrol")
        .args(["hold", &waits_job])
        .output()
        .unwrap();
    assert!(held.status.success(), "{}", stderr_of(&held));
    let out = cluster
        .shardrun(dir.path(), &["status", "--json", &waits.to_string_lossy()])
        .unwrap();
    let document: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        document["runs"][0]["detail"]
            .as_str()
            .unwrap()
            .starts_with(&format!(
                "JobHeldAdmin: held by an administrator (`scontrol hold`): it starts once an \
                 administrator releases it (`scontrol release {waits_job}`)"
            )),
        "{document}"
    );
    let out = cluster
        .shardrun(dir.path(), &["cancel", &waits.to_string_lossy()])
        .unwrap();
    assert!(out.status.success(), "cancel failed: {}", stderr_of(&out));
    wait_state(&cluster, dir.path(), &waits, "CANCELLED");
}

/// Ctrl-C just after sbatch took the held job (sbatch is slow to answer here) waits for the
/// job to be recorded and released, then ends the command as a Ctrl-C does, saying so: the
/// run knows its job, and no held job is left in Slurm that nothing knows of.
#[test]
fn ctrl_c_while_a_job_is_submitted_leaves_it_recorded_and_released() {
    let cluster = SlurmCluster::start().expect("start the local Slurm cluster");
    let dir = TestDir::new("submit-interrupted");
    let spec = dir.write("held.yaml", &spec("held", &["sleep 30"]));
    let real = std::env::split_paths(&std::env::var_os("PATH").unwrap())
        .map(|p| p.join("sbatch"))
        .find(|p| p.is_file())
        .expect("sbatch on PATH");
    let taken = dir.join("sbatch-took-the-job");
    let answer = dir.join("sbatch-may-answer");
    // The held job's sbatch answers once the test has sent its Ctrl-C.
    let wrapper = dir.write(
        "wrapper-bin/sbatch",
        &format!(
            "#!/bin/bash\nif [ \"$1\" != --test-only ]; then\n  out=$({real:?} \"$@\") || exit\n  \
             touch {taken:?}\n  while [ ! -e {answer:?} ]; do sleep 0.05; done\n  \
             echo \"$out\"\n  exit\nfi\nexec {real:?} \"$@\"\n"
        ),
    );
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!(
        "{}:{}",
        dir.join("wrapper-bin").display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut submit = cluster.command(shardrun());
    submit
        .current_dir(dir.path())
        .args(["submit", &spec.to_string_lossy()])
        .env("PATH", path)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    // A Ctrl-C as at a terminal, whatever started the tests: one started in the background
    // of a shell without job control (`cmd &` in a script) has SIGINT ignored, and
    // shardrun keeps a stop signal ignored as it found it (`nohup`).
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut submit, || {
            libc::signal(libc::SIGINT, libc::SIG_DFL);
            Ok(())
        });
    }
    let mut job = GroupChild::spawn(&mut submit).unwrap();
    wait_for("sbatch to take the job", DEADLINE, || {
        taken.exists().then_some(())
    })
    .unwrap();
    // As the terminal does: to the command's process group.
    assert_eq!(
        unsafe { libc::kill(-(job.child.id() as i32), libc::SIGINT) },
        0
    );
    std::fs::write(&answer, "").unwrap();
    let run = dir.join("runs/held");
    let pipes = shardrun_e2e::PipeReader::start(&mut job.child);
    let status = shardrun_e2e::jobs::wait_for_exit(&mut job, &run, DEADLINE);
    let stderr = String::from_utf8_lossy(&pipes.join().1).into_owned();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(libc::SIGINT), "{stderr}");
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("manifest.json")).unwrap()).unwrap();
    let ids = manifest["slurm_job_ids"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(ids.len(), 1, "{manifest}");
    let id = ids[0].as_str().unwrap().to_string();
    assert!(
        stderr.contains(&format!(
            "shardrun: SIGINT came while Slurm job {id} was submitted: it is submitted, \
             recorded and released"
        )),
        "{stderr}"
    );
    let mut squeue = cluster.command("squeue");
    squeue.args(["--noheader", "--jobs", &id, "--format=%r"]);
    let reason = stdout_of(&run_with_deadline(&mut squeue, DEADLINE).unwrap());
    assert!(!reason.contains("JobHeldUser"), "{reason}");
    let mut scancel = cluster.command("scancel");
    scancel.arg(&id);
    run_with_deadline(&mut scancel, DEADLINE).unwrap();
}
