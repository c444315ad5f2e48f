//! Re-running a local run with the real worker: the same command again continues it.
//!
//! A run stopped after its first checkpoint (Ctrl-C's SIGINT or SIGTERM to `shardrun run`,
//! or one rank SIGKILLed) is run again with the same command: it resumes at the step after
//! its newest checkpoint, says so on its first line, and the losses of the two halves
//! together are the losses of an uninterrupted run of the same spec. Neither half panics.
//! A finished run run again trains nothing; with more steps it continues (saying how a
//! decaying LR schedule is re-shaped); a changed spec is refused field by field; --force
//! starts over.
//!
//! Needs the binaries built: `cargo build --release -p shardrun -p shardrun-worker`.

use shardrun_e2e::jobs::*;
use shardrun_e2e::*;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Output;
use std::sync::OnceLock;
use std::time::Duration;

const STEPS: u64 = 1500;
const INTERVAL: u64 = 20;
const DEADLINE: Duration = Duration::from_secs(300);

/// A small MLP on 2 CPU ranks: milliseconds per step, a checkpoint every 20 steps.
fn spec(name: &str) -> String {
    format!(
        "name: {name}\nresources: {{ tasks_per_node: 2, cpus_per_task: 1, time: \"00:10:00\" }}\n\
         training:\n  model: {{ kind: mlp, input_dim: 64, hidden_dim: 256, output_dim: 64 }}\n  \
         steps: {STEPS}\n  total_batch_size: 16\n  batch_size_per_device: 8\n  \
         checkpoint: {{ interval_steps: {INTERVAL}, keep: 2 }}\n"
    )
}

/// The uninterrupted run's losses, computed once for every test of this file.
fn reference() -> &'static BTreeMap<u64, f64> {
    static REFERENCE: OnceLock<BTreeMap<u64, f64>> = OnceLock::new();
    REFERENCE.get_or_init(|| {
        let dir = TestDir::new("rerun-reference");
        let spec = dir.write("job.yaml", &spec("reference"));
        let (out, run) = run_local(&dir, &spec, &["--no-progress"], &[], DEADLINE);
        assert!(out.status.success(), "reference run: {}", stderr_of(&out));
        let losses = losses(&run);
        assert_eq!(
            losses.len() as u64,
            STEPS,
            "the reference logged every step"
        );
        losses
    })
}

/// Starts `shardrun run`, waits for its first checkpoint, then holds the ranks (SIGSTOP) so
/// that `interrupt` lands mid-run whatever the machine's load, lets them go, and waits for
/// the end. Returns the first half's output.
fn interrupted(dir: &TestDir, spec: &Path, interrupt: impl FnOnce(u32, &Path)) -> Output {
    let (mut job, run) = spawn_local_run(dir, spec, &["--no-progress"], &[], |_| {});
    // Read the pipes all along: a full pipe would block the run.
    let pipes = PipeReader::start(&mut job.child);
    wait_for("the first checkpoint", DEADLINE, || {
        has_checkpoint(&run).then_some(())
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", all_logs(&run)));
    assert_eq!(signal_workers(&run, libc::SIGSTOP), 2, "both ranks held");
    interrupt(job.child.id(), &run);
    signal_workers(&run, libc::SIGCONT);
    let status = wait_for_exit(&mut job, &run, DEADLINE);
    let (stdout, stderr) = pipes.join();
    Output {
        status,
        stdout,
        stderr,
    }
}

/// The second half: the same command again. Checks its first line names the step after the
/// newest checkpoint, that the run resumed there, that its summary says so, and that the
/// whole run has the uninterrupted run's losses, with no panic in either half.
fn resumed_to_the_end(dir: &TestDir, spec: &Path, first: &Output, why: &str) {
    let run = dir.join("run");
    let first_text = format!("{}{}", stdout_of(first), stderr_of(first));
    let steps_before = metric_steps(&run, 0);
    let (second, _) = run_local(dir, spec, &["--no-progress"], &[], DEADLINE);
    let stdout = stdout_of(&second);
    assert!(
        second.status.success(),
        "the re-run failed:\n{stdout}\n{}",
        stderr_of(&second)
    );
    let headline = stdout.lines().next().unwrap_or_default();
    assert!(
        headline.starts_with(&format!("resuming {} at step ", run.display())),
        "the first line says it resumes: {headline}"
    );
    assert!(
        headline.contains(why),
        "the first line says why it stopped ({why}): {headline}"
    );
    let resumed_at: u64 = headline
        .split(" at step ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no step in {headline}"));
    let checkpoint = resumed_at - 1;
    assert!(
        headline.contains(&format!("from its checkpoint of step {checkpoint} (")),
        "{headline}"
    );
    assert!(
        checkpoint >= INTERVAL && checkpoint.is_multiple_of(INTERVAL),
        "resumed from an interval checkpoint: {headline}"
    );
    assert!(
        steps_before
            .last()
            .is_some_and(|&last| last >= checkpoint && last < STEPS),
        "the first half stopped mid-run after the checkpoint: {steps_before:?}"
    );
    // metrics.jsonl marks where the second half picks up, before its first record: readers
    // drop what the first half logged after the checkpoint.
    let records: Vec<serde_json::Value> = std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect();
    let marks: Vec<usize> = (0..records.len())
        .filter(|&i| records[i].get("resumed_at_step").is_some())
        .collect();
    assert_eq!(marks.len(), 1, "one resume, one mark");
    assert_eq!(records[marks[0]]["resumed_at_step"], checkpoint);
    let logged_after = records[marks[0] + 1..]
        .iter()
        .find_map(|r| r["step"].as_u64());
    assert_eq!(logged_after, Some(resumed_at), "the mark comes first");
    // The second half's records follow the first half's, from the step after the checkpoint.
    let after = metric_steps(&run, 0)[steps_before.len()..].to_vec();
    assert_eq!(after, (resumed_at..=STEPS).collect::<Vec<_>>());
    assert_same_losses(&losses(&run), reference(), 1e-6, "first half + second half");
    // The summary is of this attempt, and says so: its first loss is not the run's.
    assert!(
        stdout.contains(&format!(
            "(2 rank(s), steps {resumed_at}-{STEPS} (resumed at step {checkpoint}))"
        )) && stdout.contains(&format!("Loss at step {resumed_at}: ")),
        "{stdout}"
    );
    assert!(!stdout.contains("Initial loss"), "{stdout}");
    assert_no_panic(&first_text, "the first half's output");
    assert_no_panic(
        &format!("{stdout}{}", stderr_of(&second)),
        "the second half's output",
    );
    assert_no_panic(&all_logs(&run), "the run's logs");
}

#[test]
fn ctrl_c_then_the_same_command_resumes_after_the_last_checkpoint() {
    let dir = TestDir::new("rerun-sigint");
    let spec = dir.write("job.yaml", &spec("sigint"));
    let first = interrupted(&dir, &spec, |pid, _| unsafe {
        libc::kill(pid as i32, libc::SIGINT);
    });
    let stdout = stdout_of(&first);
    assert_eq!(
        first.status.code(),
        Some(130),
        "{stdout}{}",
        stderr_of(&first)
    );
    // One line per rank, and one from the controller naming the step and the checkpoint.
    assert_each_rank_stopped_once(&dir.join("run"), 2, "SIGINT");
    let last = stdout.lines().last().unwrap_or_default();
    assert!(
        last.contains("was cancelled by SIGINT after step ")
            && last.contains("its newest checkpoint is step ")
            && last.contains("run the same command again to resume"),
        "{stdout}"
    );
    assert!(!stdout.contains("FSDP training complete"), "{stdout}");
    assert!(
        !stderr_of(&first).contains("error:"),
        "a cancel is not an error: {}",
        stderr_of(&first)
    );
    resumed_to_the_end(&dir, &spec, &first, "was cancelled by SIGINT after step ");
}

#[test]
fn sigterm_then_the_same_command_resumes_after_the_last_checkpoint() {
    let dir = TestDir::new("rerun-sigterm");
    let spec = dir.write("job.yaml", &spec("sigterm"));
    let first = interrupted(&dir, &spec, |pid, _| unsafe {
        libc::kill(pid as i32, libc::SIGTERM);
    });
    assert_eq!(
        first.status.code(),
        Some(143),
        "{}{}",
        stdout_of(&first),
        stderr_of(&first)
    );
    assert_eq!(result_json(&dir.join("run"))["status"], "cancelled");
    resumed_to_the_end(&dir, &spec, &first, "was cancelled by SIGTERM after step ");
}

#[test]
fn a_killed_rank_then_the_same_command_resumes_from_the_last_checkpoint() {
    let dir = TestDir::new("rerun-sigkill");
    let spec = dir.write("job.yaml", &spec("sigkill"));
    let first = interrupted(&dir, &spec, |_, run| {
        let pid = worker_pid(run, 1).expect("rank 1's pid");
        unsafe { libc::kill(pid, libc::SIGKILL) };
    });
    assert_eq!(
        first.status.code(),
        Some(1),
        "{}{}",
        stdout_of(&first),
        stderr_of(&first)
    );
    assert_eq!(result_json(&dir.join("run"))["status"], "failed");
    resumed_to_the_end(&dir, &spec, &first, "failed: rank 1 on ");
}

/// A spec whose LR does not depend on `steps`, so that training longer continues exactly
/// like a run that was longer from the start.
fn constant_lr_spec(name: &str, steps: u64) -> String {
    format!(
        "name: {name}\nresources: {{ tasks_per_node: 2, cpus_per_task: 1 }}\n\
         training:\n  model: {{ kind: mlp, input_dim: 16, hidden_dim: 32, output_dim: 16 }}\n  \
         steps: {steps}\n  total_batch_size: 8\n  batch_size_per_device: 4\n  \
         schedule: {{ decay: constant }}\n"
    )
}

#[test]
fn a_finished_run_is_left_alone_trained_longer_on_request_refused_when_changed_and_forced_anew() {
    let dir = TestDir::new("rerun-finished");
    let spec = dir.write("job.yaml", &constant_lr_spec("finished", 30));
    let run = dir.join("run");
    let (out, _) = run_local(&dir, &spec, &["--no-progress"], &[], DEADLINE);
    let stdout = stdout_of(&out);
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert!(stdout.contains("FSDP training complete"));
    // The final checkpoint is one line, of rank 0, saying what kind it is.
    let saved: Vec<&str> = stdout
        .lines()
        .filter(|l| l.contains("checkpoint of step 30"))
        .collect();
    assert_eq!(saved.len(), 1, "{stdout}");
    assert!(
        saved[0].starts_with(&format!(
            "[rank 0] final checkpoint of step 30 saved to {}/checkpoints/step-30 in ",
            run.display()
        )),
        "{stdout}"
    );
    let files = |names: &[&str]| -> Vec<Vec<u8>> {
        names
            .iter()
            .map(|n| std::fs::read(run.join(n)).unwrap_or_else(|e| panic!("{n}: {e}")))
            .collect()
    };
    let kept = ["metrics.jsonl", "train.log", "job.yaml", "manifest.json"];
    let before = files(&kept);

    // The same command again: nothing to do, exit 0, nothing touched.
    let (out, _) = run_local(&dir, &spec, &["--no-progress"], &[], DEADLINE);
    let stdout = stdout_of(&out);
    assert!(out.status.success(), "{stdout}{}", stderr_of(&out));
    assert!(
        stdout.lines().next().is_some_and(|l| l
            == format!(
                "{} is finished: it trained all 30 steps; nothing to do",
                run.display()
            )),
        "{stdout}"
    );
    assert!(
        stdout.contains("--set training.steps="),
        "says how to train longer: {stdout}"
    );
    assert_eq!(files(&kept), before, "a finished run is not touched");

    // A changed spec is refused, naming every changed field, touching nothing.
    let (out, _) = run_local(
        &dir,
        &spec,
        &[
            "--set",
            "training.optimizer.lr=0.01",
            "--set",
            "training.seed=3",
        ],
        &[],
        DEADLINE,
    );
    let stderr = stderr_of(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("holds a run started with a different spec"),
        "{stderr}"
    );
    assert!(
        stderr.contains("  training.optimizer.lr: 0.0003 → 0.01\n"),
        "{stderr}"
    );
    assert!(stderr.contains("  training.seed: 0 → 3\n"), "{stderr}");
    assert!(stderr.contains("--force"), "{stderr}");
    assert_eq!(files(&kept), before, "a refused re-run touches nothing");

    // Train it longer: continues from the last checkpoint (step 30) to the new end, exactly
    // like a run of 45 steps from the start.
    let (out, _) = run_local(
        &dir,
        &spec,
        &["--no-progress", "--set", "training.steps=45"],
        &[],
        DEADLINE,
    );
    let stdout = stdout_of(&out);
    assert!(out.status.success(), "{stdout}{}", stderr_of(&out));
    let mut lines = stdout.lines();
    assert_eq!(
        lines.next().unwrap_or_default(),
        format!(
            "resuming {} at step 31 from its checkpoint of step 30 ({}/checkpoints/step-30): \
             it finished its 30 steps, and the spec now asks for 45",
            run.display(),
            run.display()
        )
    );
    assert_eq!(
        lines.next().unwrap_or_default(),
        "  changed on resume: training.steps: 30 → 45"
    );
    // Rank 0 says where it resumed from; the change was listed above, and it changes
    // nothing a resume may not, so nothing more is said about it.
    let resumed: Vec<&str> = stdout
        .lines()
        .filter(|l| l.contains("resumed from checkpoint"))
        .collect();
    assert_eq!(
        resumed,
        [format!(
            "[rank 0] resumed from checkpoint {}/checkpoints/step-30 (step 30, saved by 2 \
             rank(s) with FULL_SHARD)",
            run.display()
        )],
        "{stdout}"
    );
    assert_eq!(metric_steps(&run, 0), (1..=45).collect::<Vec<_>>());
    let job_yaml = std::fs::read_to_string(run.join("job.yaml")).unwrap();
    assert!(
        job_yaml.contains("--set training.steps=45") && job_yaml.contains("steps: 45"),
        "{job_yaml}"
    );
    let resolved = std::fs::read_to_string(run.join("resolved.json")).unwrap();
    assert!(resolved.contains("\"training.steps=45\""), "{resolved}");

    let other = TestDir::new("rerun-longer-reference");
    let long_spec = other.write("job.yaml", &constant_lr_spec("longer", 45));
    let (out, reference_run) = run_local(&other, &long_spec, &["--no-progress"], &[], DEADLINE);
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert_same_losses(
        &losses(&run),
        &losses(&reference_run),
        1e-6,
        "30 steps, then 15 more",
    );

    // --force deletes the run, says what it deleted, and starts at step 1.
    let (out, _) = run_local(&dir, &spec, &["--no-progress", "--force"], &[], DEADLINE);
    let stdout = stdout_of(&out);
    assert!(out.status.success(), "{stdout}{}", stderr_of(&out));
    let first = stdout.lines().next().unwrap_or_default();
    assert!(
        first.starts_with(&format!("--force: deleted {} (", run.display()))
            && first.contains("2 checkpoint(s) (step 30, step 45)")
            && first.contains("metrics up to step 45")
            && first.ends_with("starting over at step 1"),
        "{first}"
    );
    assert_eq!(metric_steps(&run, 0), (1..=30).collect::<Vec<_>>());
    assert_no_panic(&all_logs(&run), "the run's logs");

    // Trained longer, it fails before the end; the spec, which asks for the 30 steps it
    // trained, says there is nothing to do, and how to continue the longer job.
    let failing = [("SHARDRUN_INJECT_FAILURE", "1:35".to_string())];
    let (out, _) = run_local(
        &dir,
        &spec,
        &["--no-progress", "--set", "training.steps=40"],
        &failing,
        DEADLINE,
    );
    assert!(!out.status.success(), "{}", stdout_of(&out));
    let (out, _) = run_local(&dir, &spec, &["--no-progress"], &[], DEADLINE);
    let stdout = stdout_of(&out);
    assert!(out.status.success(), "{stdout}{}", stderr_of(&out));
    assert_eq!(
        stdout.lines().take(2).collect::<Vec<_>>(),
        [
            format!(
                "{} has trained the 30 steps the spec asks for: nothing to do",
                run.display()
            ),
            format!(
                "  its own job asks for 40 steps, and it ended FAILED before them: to continue \
                 it to step 40, give its directory instead of the spec (`shardrun run {}`)",
                run.display()
            )
        ],
        "{stdout}"
    );
}

/// Flips the last byte of `rank`'s shard of the checkpoint of `step` (of 2 ranks): damaged in
/// place, its size kept, which only its checksum tells.
fn damage_in_place(run: &std::path::Path, step: u64, rank: u64) {
    let file = run.join(format!(
        "checkpoints/step-{step}/rank-{rank}-of-2.safetensors"
    ));
    let mut bytes = std::fs::read(&file).unwrap();
    *bytes.last_mut().unwrap() ^= 0x01;
    std::fs::write(&file, bytes).unwrap();
}

/// A re-run announces the checkpoint the ranks will load: a small checkpoint whose file was
/// damaged in place (its size kept) is skipped by its checksums before the first line says
/// where the run resumes; every checkpoint damaged, the re-run is refused.
#[test]
fn a_checkpoint_damaged_in_place_is_not_the_one_a_rerun_announces() {
    let dir = TestDir::new("rerun-damaged");
    let spec = dir.write(
        "job.yaml",
        &(constant_lr_spec("damaged", 6) + "  checkpoint: { interval_steps: 3 }\n"),
    );
    let (out, run) = run_local(&dir, &spec, &["--no-progress"], &[], DEADLINE);
    assert!(out.status.success(), "{}", stderr_of(&out));
    let flip = |step: u64| damage_in_place(&run, step, 0);
    flip(6);
    let (out, _) = run_local(
        &dir,
        &spec,
        &["--no-progress", "--set", "training.steps=9"],
        &[],
        DEADLINE,
    );
    let stdout = stdout_of(&out);
    assert!(out.status.success(), "{stdout}{}", stderr_of(&out));
    // ... and says why it is not the newer one.
    let mut lines = stdout.lines();
    assert!(
        lines.next().is_some_and(|l| l.starts_with(&format!(
            "resuming {} at step 4 from its checkpoint of step 3 ",
            run.display()
        ))) && lines.next().is_some_and(|l| l
            .starts_with("  passed over: the newer step-6, damaged: ")
            && l.contains("sha256 is ")),
        "{stdout}"
    );
    // Steps 4 to 6 train again, their records after the first ones.
    assert_eq!(metric_steps(&run, 0), [1, 2, 3, 4, 5, 6, 4, 5, 6, 7, 8, 9]);

    // Now every checkpoint it has is damaged: refused, nothing started over.
    for step in [6, 9] {
        if run.join(format!("checkpoints/step-{step}")).exists() {
            flip(step);
        }
    }
    let (out, _) = run_local(
        &dir,
        &spec,
        &["--no-progress", "--set", "training.steps=12"],
        &[],
        DEADLINE,
    );
    let stderr = stderr_of(&out);
    assert_eq!(out.status.code(), Some(1), "{}{stderr}", stdout_of(&out));
    assert!(
        stderr.contains("no checkpoint of this run loads") && stderr.contains("sha256 is "),
        "{stderr}"
    );
}

/// A checkpoint that cannot be read (a shard without read permission, the re-run made
/// without root's bypass of file permissions) is not known to be damaged: the re-run is
/// refused with what to do, and nothing is set aside or trained again.
#[test]
fn an_unreadable_checkpoint_is_refused_not_passed_over() {
    use std::os::unix::fs::PermissionsExt;
    let dir = TestDir::new("rerun-unreadable");
    let spec = dir.write(
        "job.yaml",
        &(constant_lr_spec("unreadable", 6) + "  checkpoint: { interval_steps: 3 }\n"),
    );
    let (out, run) = run_local(&dir, &spec, &["--no-progress"], &[], DEADLINE);
    assert!(out.status.success(), "{}", stderr_of(&out));
    let shard = run.join("checkpoints/step-6/rank-0-of-2.safetensors");
    std::fs::set_permissions(&shard, std::fs::Permissions::from_mode(0o000)).unwrap();
    // Root reads any file: the re-run goes without the capabilities that let it.
    let mut cmd = without_root_read_bypass(shardrun());
    cmd.current_dir(dir.path())
        .arg("run")
        .arg(&spec)
        .arg("--run-dir")
        .arg(&run)
        .args(["--no-progress", "--set", "training.steps=9"]);
    let out = run_with_deadline(&mut cmd, DEADLINE)
        .expect("the re-run (as root it needs setpriv, from util-linux, to drop its bypass)");
    let stderr = stderr_of(&out);
    assert_eq!(out.status.code(), Some(1), "{}{stderr}", stdout_of(&out));
    let step_6 = run.join("checkpoints/step-6");
    for expected in [
        format!("{}: cannot open: Permission denied", shard.display()),
        "not known to be damaged".to_string(),
        format!("mv {} {}.damaged", step_6.display(), step_6.display()),
    ] {
        assert!(
            stderr.contains(&expected),
            "{expected:?} missing from:\n{stderr}"
        );
    }
    assert!(step_6.is_dir() && !run.join("checkpoints/step-6.damaged").exists());
    assert_eq!(metric_steps(&run, 0), [1, 2, 3, 4, 5, 6]);
}

/// Two newer checkpoints damaged: both named under the first line, and why the newest is.
#[test]
fn newer_damaged_checkpoints_passed_over_are_named_together() {
    let dir = TestDir::new("rerun-damaged-two");
    let spec = dir.write(
        "job.yaml",
        &(constant_lr_spec("damaged-two", 6) + "  checkpoint: { interval_steps: 2, keep: 3 }\n"),
    );
    let (out, run) = run_local(&dir, &spec, &["--no-progress"], &[], DEADLINE);
    assert!(out.status.success(), "{}", stderr_of(&out));
    for step in [4, 6] {
        damage_in_place(&run, step, 1);
    }
    let (out, _) = run_local(
        &dir,
        &spec,
        &["--no-progress", "--set", "training.steps=8"],
        &[],
        DEADLINE,
    );
    let stdout = stdout_of(&out);
    assert!(out.status.success(), "{stdout}{}", stderr_of(&out));
    let mut lines = stdout.lines();
    assert!(
        lines.next().is_some_and(|l| l.starts_with(&format!(
            "resuming {} at step 3 from its checkpoint of step 2 ",
            run.display()
        ))) && lines.next().is_some_and(|l| l.starts_with(&format!(
            "  passed over: the newer step-6, step-4, damaged (step-6: {}/checkpoints/step-6/rank-1-of-2.safetensors: sha256 is ",
            run.display()
        ))),
        "{stdout}"
    );
    assert_eq!(metric_steps(&run, 0), [1, 2, 3, 4, 5, 6, 3, 4, 5, 6, 7, 8]);
}

/// A run started from another run's checkpoint (`checkpoint.from`) whose model does not fit
/// it fails naming that checkpoint, not the new run's own empty checkpoint folder.
#[test]
fn a_checkpoint_from_another_run_that_does_not_fit_is_named_where_it_is() {
    let dir = TestDir::new("rerun-from-mismatch");
    let spec = dir.write("source.yaml", &constant_lr_spec("source", 3));
    let (out, source) = run_local(&dir, &spec, &["--no-progress"], &[], DEADLINE);
    assert!(out.status.success(), "{}", stderr_of(&out));
    let wider = constant_lr_spec("tuned", 3).replace("hidden_dim: 32", "hidden_dim: 48")
        + &format!(
            "  checkpoint: {{ from: {} }}\n",
            source.join("checkpoints").display()
        );
    let tuned = TestDir::new("rerun-from-mismatch-tuned");
    let spec = tuned.write("tuned.yaml", &wider);
    let (out, _) = run_local(&tuned, &spec, &["--no-progress"], &[], DEADLINE);
    let all = format!("{}{}", stdout_of(&out), stderr_of(&out));
    assert!(!out.status.success(), "{all}");
    assert!(
        all.contains(&format!(
            "restoring from {}",
            source.join("checkpoints/step-3").display()
        )) && all.contains("does not fit this model"),
        "{all}"
    );
}

#[test]
fn training_a_cosine_run_longer_says_how_its_lr_jumps() {
    let dir = TestDir::new("rerun-cosine");
    let spec = constant_lr_spec("cosine", 10).replace("decay: constant", "decay: cosine");
    let spec = dir.write("job.yaml", &spec);
    let (out, run) = run_local(&dir, &spec, &["--no-progress"], &[], DEADLINE);
    assert!(out.status.success(), "{}", stderr_of(&out));
    let (out, _) = run_local(
        &dir,
        &spec,
        &["--no-progress", "--set", "training.steps=15"],
        &[],
        DEADLINE,
    );
    let stdout = stdout_of(&out);
    assert!(out.status.success(), "{stdout}{}", stderr_of(&out));
    // The LR each step trained at, as the ranks logged it.
    let lr = step_values(&run, "lr");
    let (last, resumed) = (lr[&10], lr[&11]);
    assert!(resumed > 2.0 * last, "the LR jumps: {lr:?}");
    assert_eq!(
        stdout.lines().nth(1).unwrap_or_default(),
        format!(
            "  changed on resume: training.steps: 10 → 15; the cosine LR schedule is re-shaped \
             to 15 steps: step 11 trains at LR {resumed:.3e}, up from the {last:.3e} the 10-step \
             schedule ended at"
        )
    );
    // Said in the run's log too, where `tail -f` (or a Slurm job's reader) sees it.
    let log = std::fs::read_to_string(run.join("train.log")).unwrap();
    assert!(
        log.lines().any(|l| l.ends_with(&format!(
            " [shardrun] {}",
            stdout.lines().nth(1).unwrap_or_default().trim_start()
        ))),
        "{log}"
    );
}

/// A finished run of `steps` steps of [`constant_lr_spec`] named `name`: its spec and its
/// run directory.
fn finished_run(dir: &TestDir, name: &str, steps: u64) -> (std::path::PathBuf, std::path::PathBuf) {
    let spec = dir.write("job.yaml", &constant_lr_spec(name, steps));
    let (out, run) = run_local(dir, &spec, &["--no-progress"], &[], DEADLINE);
    assert!(out.status.success(), "{}", stderr_of(&out));
    (spec, run)
}

/// A finished run whose spec says `checkpoint.resume: false` says how to train it longer
/// (its checkpoint is there, unused), and lifting `resume: false` continues it.
#[test]
fn a_finished_run_that_does_not_resume_says_how_to_go_on_and_lifting_it_continues() {
    let dir = TestDir::new("rerun-no-resume");
    let text = constant_lr_spec("noresume", 4) + "  checkpoint: { resume: false }\n";
    let spec = dir.write("job.yaml", &text);
    let (out, run) = run_local(&dir, &spec, &["--no-progress"], &[], DEADLINE);
    assert!(out.status.success(), "{}", stderr_of(&out));

    let (out, _) = run_local(&dir, &spec, &["--no-progress"], &[], DEADLINE);
    let stdout = stdout_of(&out);
    assert!(
        out.status.success()
            && stdout.contains(
                "its spec says `checkpoint.resume: false`, so it does not continue: to train it longer from its checkpoint of step 4, remove `resume: false` and add `--set training.steps=<more than 4>`"
            )
            && !stdout.contains("it continues from its last checkpoint"),
        "{stdout}"
    );
    let longer = ["--no-progress", "--set", "training.steps=6"];
    let (out, _) = run_local(&dir, &spec, &longer, &[], DEADLINE);
    let stderr = stderr_of(&out);
    assert!(
        !out.status.success()
            && stderr.contains(
                "fix: add --force to delete it and start over, or remove `resume: false` to continue it from its last checkpoint, of step 4"
            ),
        "{stderr}"
    );
    // As the fix says: `checkpoint.resume` is safe to change on resume.
    let lifted = [&longer[..], &["--set", "training.checkpoint.resume=true"]].concat();
    let (out, _) = run_local(&dir, &spec, &lifted, &[], DEADLINE);
    let stdout = stdout_of(&out);
    assert!(
        out.status.success()
            && stdout.contains("at step 5 from its checkpoint of step 4")
            && stdout.contains("changed on resume: training.checkpoint.resume: false → true"),
        "{stdout}{}",
        stderr_of(&out)
    );
    let steps: Vec<u64> = step_records(&run)
        .iter()
        .filter_map(|r| r["step"].as_u64())
        .collect();
    assert_eq!(steps, (1..=6).collect::<Vec<_>>());
}

/// A run directory copied elsewhere (an archive) or moved (to other storage) keeps its own
/// checkpoints: its export takes them, not those a new run of the old path saves, and a
/// moved run continues where it is, with no spec change to refuse.
#[test]
fn a_copied_or_moved_run_directory_keeps_its_own_checkpoints() {
    let dir = TestDir::new("rerun-moved");
    let (spec, run) = finished_run(&dir, "moved", 6);
    let archive = dir.join("archive");
    let copied = std::process::Command::new("cp")
        .arg("-a")
        .arg(&run)
        .arg(&archive)
        .status()
        .unwrap();
    assert!(copied.success());
    // The old path trains a new run, of 4 steps.
    let (out, _) = run_local(
        &dir,
        &spec,
        &["--no-progress", "--force", "--set", "training.steps=4"],
        &[],
        DEADLINE,
    );
    assert!(out.status.success(), "{}", stderr_of(&out));

    let archived = archive.to_string_lossy().into_owned();
    let out = shardrun_in(dir.path(), &["export", &archived], DEADLINE);
    let stdout = stdout_of(&out);
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert!(
        stdout.starts_with(&format!(
            "Exported step 6 (2 ranks, FULL_SHARD, 1,072 parameters) from {}/checkpoints/step-6",
            archive.display()
        )),
        "{stdout}"
    );
    // Nor without its manifest (deleted or emptied in the copy), which says where the run
    // was made: the folder's own checkpoints still, not the old path's.
    let manifest = archive.join("manifest.json");
    let kept = std::fs::read(&manifest).unwrap();
    for (case, damage) in [("emptied", Some("{}")), ("deleted", None)] {
        match damage {
            Some(text) => std::fs::write(&manifest, text).unwrap(),
            None => std::fs::remove_file(&manifest).unwrap(),
        }
        let out_dir = dir
            .join(format!("export-{case}"))
            .to_string_lossy()
            .into_owned();
        let out = shardrun_in(
            dir.path(),
            &["export", &archived, "--out", &out_dir],
            DEADLINE,
        );
        let stdout = stdout_of(&out);
        assert!(out.status.success(), "{case}: {}", stderr_of(&out));
        assert!(
            stdout.starts_with(&format!(
                "Exported step 6 (2 ranks, FULL_SHARD, 1,072 parameters) from {}/checkpoints/step-6",
                archive.display()
            )),
            "{case}: {stdout}"
        );
    }
    std::fs::write(&manifest, kept).unwrap();

    let moved = dir.join("elsewhere/moved");
    std::fs::create_dir_all(moved.parent().unwrap()).unwrap();
    std::fs::rename(&archive, &moved).unwrap();
    let moved_arg = moved.to_string_lossy().into_owned();
    let out = shardrun_in(
        dir.path(),
        &[
            "run",
            &moved_arg,
            "--no-progress",
            "--set",
            "training.steps=8",
        ],
        DEADLINE,
    );
    let stdout = stdout_of(&out);
    assert!(out.status.success(), "{stdout}{}", stderr_of(&out));
    assert!(
        stdout.starts_with(&format!(
            "resuming {} at step 7 from its checkpoint of step 6 ({}/checkpoints/step-6)",
            moved.display(),
            moved.display()
        )),
        "{stdout}"
    );
    assert!(moved.join("checkpoints/step-8/COMPLETE").exists());
    assert!(run.join("checkpoints/step-4/COMPLETE").exists());
    assert!(!run.join("checkpoints/step-8").exists());
}

/// A run directory whose manifest was damaged (truncated) does not hide the others from
/// `status`, which names it after the table and exits 1, and `--force`, which its error
/// offers, starts it over.
#[test]
fn a_damaged_manifest_is_named_by_status_and_forced_anew() {
    let dir = TestDir::new("rerun-manifest");
    dir.write("job.yaml", &constant_lr_spec("manifest", 2));
    let run = |name: &str, extra: &[&str]| {
        let path = dir
            .join(format!("runs/{name}"))
            .to_string_lossy()
            .into_owned();
        let mut args = vec!["run", "job.yaml", "--run-dir", &path, "--no-progress"];
        args.extend(extra);
        let out = shardrun_in(dir.path(), &args, DEADLINE);
        assert!(out.status.success(), "{}", stderr_of(&out));
    };
    run("kept", &[]);
    run("damaged", &[]);
    let manifest = dir.join("runs/damaged/manifest.json");
    let text = std::fs::read(&manifest).unwrap();
    std::fs::write(&manifest, &text[..text.len() / 2]).unwrap();

    let out = shardrun_in(dir.path(), &["status", "runs"], DEADLINE);
    assert_eq!(out.status.code(), Some(1));
    let (table, stderr) = (stdout_of(&out), stderr_of(&out));
    assert!(
        table.contains("runs/kept") && table.contains("COMPLETED"),
        "{table}"
    );
    assert!(!table.contains("runs/damaged"), "{table}");
    assert!(
        stderr.contains("1 run directory is not shown:")
            && stderr.contains("damaged/manifest.json is not valid")
            && stderr.contains("restore it from a copy if there is one")
            && stderr.contains("else start the run over with --force"),
        "{stderr}"
    );
    // What the message says still reads the run.
    for command in ["logs", "metrics"] {
        let out = shardrun_in(dir.path(), &[command, "runs/damaged"], DEADLINE);
        assert!(out.status.success(), "{command}: {}", stderr_of(&out));
    }
    // ... and a new run starts from its weights as the message says.
    assert!(
        stderr.contains(
            "damaged/checkpoints/step-<N>` (with the default `checkpoint.dir`) starts from them"
        ),
        "{stderr}"
    );
    let weights = dir.join("runs/damaged/checkpoints/step-2");
    let from = format!("training.checkpoint.from={}", weights.display());
    run("from-weights", &["--set", &from]);

    run("damaged", &["--force"]);
    let out = shardrun_in(dir.path(), &["status", "--json", "runs"], DEADLINE);
    assert!(out.status.success(), "{}", stderr_of(&out));
    let states = states(&stdout_of(&out));
    assert_eq!(states.len(), 3, "{states:?}");
    assert!(
        states.iter().all(|(_, state)| state == "COMPLETED"),
        "{states:?}"
    );
}

/// While one `shardrun run` gets an existing run directory ready (its starting lock held, as
/// until its controller holds the run), another is refused before it writes anything: two
/// re-runs started together cannot both rewrite the spec.
#[test]
fn a_rerun_while_another_is_starting_the_run_is_refused_untouched() {
    use std::os::fd::AsRawFd;
    let dir = TestDir::new("rerun-starting");
    let (spec, run) = finished_run(&dir, "starting", 2);
    let lock = std::fs::File::create(run.join("starting.lock")).unwrap();
    assert_eq!(
        unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) },
        0
    );
    let recorded = |name: &str| std::fs::read(run.join(name)).unwrap();
    let before = [recorded("job.yaml"), recorded("train_config.json")];
    let longer = ["--no-progress", "--set", "training.steps=4"];
    let (out, _) = run_local(&dir, &spec, &longer, &[], DEADLINE);
    let stderr = stderr_of(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "another shardrun is starting the run directory {} (",
            run.display()
        )) && stderr.contains("at this moment; nothing was changed"),
        "{stderr}"
    );
    assert_eq!(
        [recorded("job.yaml"), recorded("train_config.json")],
        before
    );
    drop(lock);
    let (out, _) = run_local(&dir, &spec, &longer, &[], DEADLINE);
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert!(run.join("checkpoints/step-4/COMPLETE").exists());
}

/// `plan --json`'s `train` is the `train_config.json` the run directory records, for the
/// spec and for the run directory, so that ranks started by hand with it save where the run
/// would.
#[test]
fn plan_json_gives_the_train_config_the_run_records() {
    let dir = TestDir::new("rerun-plan");
    let spec = dir.write("job.yaml", &constant_lr_spec("planned", 2));
    let every_step = "training.checkpoint.interval_steps=1";
    let (out, run) = run_local(
        &dir,
        &spec,
        &["--no-progress", "--set", every_step],
        &[],
        DEADLINE,
    );
    assert!(out.status.success(), "{}", stderr_of(&out));
    let recorded: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run.join("train_config.json")).unwrap()).unwrap();
    assert_eq!(
        recorded["checkpoint"]["dir"],
        run.join("checkpoints").to_string_lossy().as_ref()
    );
    let run_arg = run.to_string_lossy().into_owned();
    let out = shardrun_in(dir.path(), &["plan", "--json", &run_arg], DEADLINE);
    let planned: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(planned["train"], recorded);
    let out = shardrun_in(
        dir.path(),
        &["plan", "--json", "job.yaml", "--set", every_step],
        DEADLINE,
    );
    let planned: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        planned["train"]["checkpoint"]["dir"],
        dir.join("runs/planned/checkpoints")
            .to_string_lossy()
            .as_ref()
    );
}
