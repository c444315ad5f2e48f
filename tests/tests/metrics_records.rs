//! metrics.jsonl at scale and what reads it, through the real binaries: one record per
//! logged step folding every rank's report (checked against the ranks' own records in
//! `logs/rank-N.metrics.jsonl`), `metrics --json`, `metrics --stragglers --json` (judging
//! only the steps of the current world size after a resume on another) and `status --json`
//! carrying what their tables show, completions, and the exit codes scripts rely on.

use shardrun_e2e::jobs::*;
use shardrun_e2e::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

fn shardrun_in(dir: &Path, args: &[&str]) -> std::process::Output {
    shardrun_e2e::shardrun_in(dir, args, Duration::from_secs(60))
}

fn json_lines(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect()
}

#[test]
fn four_ranks_make_one_record_per_logged_step_with_the_slowest_rank_and_the_largest_peak() {
    let dir = TestDir::new("metrics-records");
    let ranks = 4u64;
    let mut text = tiny_mlp_spec("four", 9, ranks);
    text.push_str("  log_every: 2\n");
    let spec = dir.write("four.yaml", &text);
    // Rank 2 holds 128 MiB more from step 3: the largest peak, not rank 0's.
    let (out, run) = run_local(
        &dir,
        &spec,
        &["--nproc", "4", "--no-progress"],
        &[("SHARDRUN_INJECT_FAILURE", "2:3:hold".to_string())],
        Duration::from_secs(180),
    );
    assert!(out.status.success(), "{}", stderr_of(&out));

    // The ranks' own records: the ground truth the job's records fold.
    let mut own: BTreeMap<u64, Vec<serde_json::Value>> = BTreeMap::new();
    for rank in 0..ranks {
        for record in json_lines(&run.join(format!("logs/rank-{rank}.metrics.jsonl"))) {
            assert_eq!(record["rank"], rank);
            own.entry(record["step"].as_u64().unwrap())
                .or_default()
                .push(record);
        }
    }
    let logged: Vec<u64> = own.keys().copied().collect();
    assert_eq!(
        logged,
        [2, 4, 6, 8, 9],
        "every log_every steps, and the last"
    );
    let job = json_lines(&run.join("metrics.jsonl"));
    assert_eq!(
        job.iter()
            .map(|r| r["step"].as_u64().unwrap())
            .collect::<Vec<_>>(),
        logged,
        "one record per logged step"
    );
    for record in &job {
        let step = record["step"].as_u64().unwrap();
        let reports = &own[&step];
        assert_eq!(reports.len() as u64, ranks);
        assert_eq!(record["ranks"], ranks);
        assert!(record.get("rank").is_none(), "no rank of its own: {record}");
        let f = |r: &serde_json::Value, key: &str| r[key].as_f64().unwrap();
        let times: Vec<f64> = reports.iter().map(|r| f(r, "step_time_s")).collect();
        let max = times.iter().cloned().fold(f64::MIN, f64::max);
        let min = times.iter().cloned().fold(f64::MAX, f64::min);
        assert_eq!(f(record, "step_time_max_s"), max, "{record}");
        assert_eq!(f(record, "step_time_min_s"), min, "{record}");
        let mut sorted = times.clone();
        sorted.sort_by(f64::total_cmp);
        assert_eq!(
            f(record, "step_time_median_s"),
            (sorted[1] + sorted[2]) / 2.0
        );
        // CPU ranks: the slowest is the busiest (its step less its wait for the others).
        let mut busy: Vec<f64> = reports.iter().map(|r| f(r, "busy_time_s")).collect();
        let busiest = busy.iter().cloned().fold(f64::MIN, f64::max);
        assert!(
            times.iter().zip(&busy).all(|(t, b)| (0.0..=*t).contains(b)),
            "busy within the step: {reports:?}"
        );
        let slowest = reports
            .iter()
            .find(|r| f(r, "busy_time_s") == busiest)
            .unwrap();
        assert_eq!(record["slowest_rank"], slowest["rank"], "{record}");
        busy.sort_by(f64::total_cmp);
        assert_eq!(f(record, "busy_time_max_s"), busiest, "{record}");
        assert_eq!(f(record, "busy_time_median_s"), (busy[1] + busy[2]) / 2.0);
        let peak = reports
            .iter()
            .map(|r| r["peak_memory_bytes"].as_u64().unwrap())
            .max()
            .unwrap();
        assert_eq!(record["peak_memory_max_bytes"], peak, "{record}");
        let holder = &record["peak_memory_max_rank"];
        assert!(
            reports
                .iter()
                .any(|r| &r["rank"] == holder && r["peak_memory_bytes"] == peak),
            "{record}"
        );
        // The global values every rank agreed on.
        for key in ["loss", "lr", "grad_norm"] {
            assert!(
                reports.iter().all(|r| r[key] == record[key]),
                "{key}: {record}"
            );
        }
    }

    // The summary rank 0 prints speaks for every rank: no rank's peak above it.
    let peak_of = |rank: u64| {
        own.values()
            .flatten()
            .filter(|r| r["rank"] == rank)
            .map(|r| r["peak_memory_bytes"].as_u64().unwrap())
            .max()
            .unwrap()
    };
    let highest = peak_of(2);
    assert!(
        highest > peak_of(0) + (100 << 20),
        "rank 2 holds more: {highest} vs rank 0's {}",
        peak_of(0)
    );
    let log = std::fs::read_to_string(run.join("train.log")).unwrap();
    let summary_mib: f64 = log
        .lines()
        .find_map(|l| l.split("Peak memory per rank (highest): ").nth(1))
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no peak in the summary:\n{log}"));
    assert!(
        summary_mib >= (highest as f64 / 1048576.0).round(),
        "summary {summary_mib} MiB, a rank reported {highest} bytes"
    );

    // `metrics --json` carries what the table shows.
    let root = dir.path();
    let run_arg = run.to_string_lossy().to_string();
    let out = shardrun_in(root, &["metrics", "--json", &run_arg]);
    assert!(out.status.success(), "{}", stderr_of(&out));
    let doc: serde_json::Value = serde_json::from_str(&stdout_of(&out)).unwrap();
    assert_eq!(doc["version"], 1);
    let entry = &doc["runs"][0];
    let latest = &entry["latest"];
    assert_eq!(latest, &{
        let mut last = job.last().unwrap().clone();
        last["mfu"] = serde_json::Value::Null;
        for key in [
            "trained_tokens_per_s",
            "peak_reserved_max_bytes",
            "device_used_max_bytes",
            "device_total_bytes",
            "loss_scale",
            "epoch",
        ] {
            last[key] = serde_json::Value::Null;
        }
        last["loss_blew_up"] = serde_json::Value::Bool(false);
        last
    });
    let out = shardrun_in(root, &["metrics", &run_arg]);
    let table = stdout_of(&out);
    let lines: Vec<&str> = table.lines().collect();
    let header: Vec<&str> = lines[0]
        .split("  ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect();
    let row: Vec<&str> = lines[1]
        .split("  ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect();
    let cell = |name: &str| row[header.iter().position(|h| *h == name).unwrap()];
    let num = |key: &str| latest[key].as_f64().unwrap();
    assert_eq!(cell("run"), entry["name"]);
    assert_eq!(cell("status"), entry["status"]);
    assert_eq!(
        cell("step"),
        format!("{}/{}", latest["step"], entry["total_steps"])
    );
    assert_eq!(cell("loss"), format!("{:.4}", num("loss")));
    assert_eq!(cell("lr now"), format!("{:.2e}", num("lr")));
    assert_eq!(cell("grad norm"), format!("{:.3}", num("grad_norm")));
    assert_eq!(cell("MFU"), "-");
    assert!(latest["mfu"].is_null());
    assert_eq!(
        cell("peak mem"),
        format!("{:.0} MiB", num("peak_memory_max_bytes") / 1048576.0)
    );
    assert!(latest["tokens_per_s"].as_f64().unwrap() > 0.0);
    assert!(latest["step_time_median_s"].as_f64().unwrap() > 0.0);
    // The rates are the run's over its steps but the first (step 1: the ranks' start), from
    // metrics.jsonl's records: its tokens over the time those steps took (each step's time
    // is its tokens over its rate), and the slowest rank's step time averaged. Every second
    // step is logged: step 1 is not among them.
    assert_eq!(job[0]["step"], 2);
    let steady = &job[..];
    let rate = |r: &serde_json::Value| r["tokens_per_s"].as_f64().unwrap();
    let tokens_per_s = steady.len() as f64 / steady.iter().map(|r| 1.0 / rate(r)).sum::<f64>();
    let step_time = steady
        .iter()
        .map(|r| r["step_time_max_s"].as_f64().unwrap())
        .sum::<f64>()
        / steady.len() as f64;
    let mean = &entry["mean"];
    assert_eq!(mean["steps"], steady.len(), "{mean}");
    assert!(
        (mean["tokens_per_s"].as_f64().unwrap() / tokens_per_s - 1.0).abs() < 1e-9
            && (mean["step_time_s"].as_f64().unwrap() / step_time - 1.0).abs() < 1e-9,
        "{mean} against {tokens_per_s} tokens/s, {step_time} s a step"
    );
    // Digits grouped by thousands, as the table writes numbers for people.
    let digits = (tokens_per_s.round() as u64).to_string();
    let grouped: Vec<String> = digits
        .as_bytes()
        .rchunks(3)
        .rev()
        .map(|chunk| String::from_utf8_lossy(chunk).into_owned())
        .collect();
    assert_eq!(cell("tokens/s"), grouped.join(","));
    assert_eq!(
        cell("step time"),
        if step_time < 1.0 {
            format!("{:.1} ms", step_time * 1000.0)
        } else {
            format!("{step_time:.2} s")
        }
    );

    // The straggler view reads the same records.
    let out = shardrun_in(root, &["metrics", "--stragglers", "--json", &run_arg]);
    assert!(out.status.success(), "{}", stderr_of(&out));
    let doc: serde_json::Value = serde_json::from_str(&stdout_of(&out)).unwrap();
    let report = &doc["runs"][0];
    assert_eq!(
        (report["steps"].as_u64(), report["ranks"].as_u64()),
        (Some(5), Some(4))
    );
    let counted: u64 = report["slowest_ranks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["times"].as_u64().unwrap())
        .sum();
    // Every second step logged: step 1, the ranks' warm-up, is not among them.
    assert_eq!(report["first_step"], 2, "{report}");
    assert_eq!(
        report["warm_ups_not_judged"],
        serde_json::json!([]),
        "{report}"
    );
    assert_eq!(counted, 5, "every step has one slowest rank");
    let text = stdout_of(&shardrun_in(root, &["metrics", "--stragglers", &run_arg]));
    assert!(text.contains("slowest rank vs median rank"), "{text}");

    // `status --json` of a local run: no Slurm asked, every field of the table.
    let out = shardrun_in(root, &["status", "--json", &run_arg]);
    assert!(out.status.success(), "{}", stderr_of(&out));
    let runs = status_runs(&stdout_of(&out));
    assert_eq!(runs.len(), 1);
    let r = &runs[0];
    assert_eq!(
        (r["name"].as_str(), r["state"].as_str()),
        (Some("four"), Some("COMPLETED"))
    );
    assert!(r["job_id"].is_null() && r["array"].is_null() && r["diverged"].is_null());
    assert_eq!(Path::new(r["run_dir"].as_str().unwrap()), run);
    let table = stdout_of(&shardrun_in(root, &["status", &run_arg]));
    let row = table.lines().nth(1).unwrap();
    assert!(
        row.starts_with("four") && row.contains("COMPLETED"),
        "{table}"
    );
    assert!(row.contains(r["detail"].as_str().unwrap()), "{table}");
}

#[test]
fn exit_codes_and_completions() {
    let dir = TestDir::new("exit-codes");
    let root = dir.path();
    let missing = dir.join("no-such-run");
    let missing = missing.to_string_lossy();
    for args in [
        vec!["metrics", &*missing],
        vec!["metrics", "--json", &*missing],
        vec!["status", "--json", &*missing],
        vec!["plot", &*missing],
    ] {
        let out = shardrun_in(root, &args);
        assert_eq!(out.status.code(), Some(4), "{args:?}: {}", stderr_of(&out));
        assert!(
            stderr_of(&out).contains("no run directories"),
            "{}",
            stderr_of(&out)
        );
        assert_eq!(stdout_of(&out), "", "no document when there is nothing");
    }
    let out = shardrun_in(root, &["metrics", "--no-such-flag", "x"]);
    assert_eq!(out.status.code(), Some(2), "usage errors are 2");

    for shell in ["bash", "zsh", "fish"] {
        let out = shardrun_in(root, &["completions", shell]);
        assert!(out.status.success(), "{}", stderr_of(&out));
        let script = stdout_of(&out);
        for word in [
            "plot",
            "metrics",
            "status",
            "completions",
            "stragglers",
            "log-loss",
        ] {
            assert!(script.contains(word), "{shell} completions lack {word}");
        }
        let path = dir.write(&format!("completions.{shell}"), &script);
        if shell == "bash" {
            // The script is valid bash: bash parses it without running it.
            let check = Command::new("bash").arg("-n").arg(&path).output().unwrap();
            assert!(
                check.status.success(),
                "{}",
                String::from_utf8_lossy(&check.stderr)
            );
        }
    }
    let zsh = stdout_of(&shardrun_in(root, &["completions", "zsh"]));
    assert!(zsh.starts_with("#compdef shardrun"), "{zsh}");
    let fish = stdout_of(&shardrun_in(root, &["completions", "fish"]));
    assert!(fish.contains("complete -c shardrun"), "{fish}");
}

/// A 2-rank run of `steps` steps with a learning rate no model survives (the loss
/// overflows within a few steps), checkpointed every step and keeping one, plus `extra`
/// lines of `training`: its output, run directory and spec.
fn diverging_run(dir: &TestDir, steps: u64, extra: &str) -> (Output, PathBuf, PathBuf) {
    let mut text = tiny_mlp_spec("diverging", steps, 2);
    text.push_str("  optimizer: { lr: 1.0e+30 }\n");
    text.push_str("  checkpoint: { interval_steps: 1, keep: 1 }\n");
    text.push_str(extra);
    let spec = dir.write("diverging.yaml", &text);
    let (out, run) = run_local(
        dir,
        &spec,
        &["--nproc", "2", "--no-progress"],
        &[],
        Duration::from_secs(120),
    );
    (out, run, spec)
}

/// Runs the diverged run of `spec` again with `args`: refused, saying `why` and that
/// `--force` starts it over, and nothing trained.
fn refused_as_diverged(dir: &TestDir, spec: &Path, args: &[&str], why: &str) {
    let metrics = dir.join("run").join("metrics.jsonl");
    let before = json_lines(&metrics);
    let (out, _) = run_local(dir, spec, args, &[], Duration::from_secs(60));
    let stderr = stderr_of(&out);
    assert_ne!(out.status.code(), Some(0), "{}{stderr}", stdout_of(&out));
    assert!(
        stderr.contains(why) && stderr.contains("fix: add --force"),
        "{stderr}"
    );
    assert_eq!(
        json_lines(&metrics),
        before,
        "the refused run trained nothing"
    );
}

/// The checkpoint folders a run keeps (`step-N`), sorted.
fn checkpoints_left(run: &Path) -> Vec<String> {
    let mut left: Vec<String> = std::fs::read_dir(run.join("checkpoints"))
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("step-"))
        .collect();
    left.sort();
    left
}

#[test]
fn a_diverged_run_keeps_reporting_its_non_finite_loss_and_says_so() {
    // A learning rate no model survives: the loss overflows within a few steps. The records
    // must still reach the controller (JSON has no NaN) and the run end normally.
    let dir = TestDir::new("metrics-diverged");
    let (out, run, spec) = diverging_run(&dir, 8, "");
    let stdout = stdout_of(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", stderr_of(&out));
    let records = json_lines(&run.join("metrics.jsonl"));
    let steps: Vec<u64> = records.iter().filter_map(|r| r["step"].as_u64()).collect();
    assert_eq!(steps, (1..=8).collect::<Vec<_>>(), "{records:?}");
    assert!(
        records.last().is_some_and(|r| r["loss"].is_null()),
        "the last loss is not a number: {records:?}"
    );
    let log = std::fs::read_to_string(run.join("train.log")).unwrap();
    assert!(log.contains("training diverged"), "{log}");
    // Its end does not read as a good one: the verdict and status say it diverged, and from
    // which step (the first whose loss or gradient norm is null in metrics.jsonl: fp32 has
    // no loss scaler to skip a step).
    let first = records
        .iter()
        .find(|r| r["step"].is_u64() && (r["loss"].is_null() || r["grad_norm"].is_null()))
        .map(|r| r["step"].as_u64().unwrap())
        .unwrap();
    let verdict: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run.join("result.json")).unwrap()).unwrap();
    let message = verdict["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with(
            "training finished, but diverged: the loss or the gradients were not finite"
        ) && message.contains(&format!("from step {first};")),
        "{verdict}"
    );
    // Past `keep: 1`, the newest checkpoint from before the divergence stays: the newer
    // ones hold weights that are not finite.
    assert_eq!(
        checkpoints_left(&run),
        [format!("step-{}", first - 1), "step-8".to_string()],
        "{log}"
    );
    assert!(
        message.contains(&format!("checkpoints/step-{}", first - 1)),
        "the verdict names it: {message}"
    );
    let out = shardrun_in(dir.path(), &["status", &run.to_string_lossy()]);
    assert!(
        stdout_of(&out).contains("training finished, but diverged"),
        "{}",
        stdout_of(&out)
    );
    let out = shardrun_in(dir.path(), &["status", "--json", &run.to_string_lossy()]);
    let runs = status_runs(&stdout_of(&out));
    assert_eq!(runs[0]["state"], "COMPLETED", "{runs:?}");
    assert_eq!(runs[0]["diverged"]["step"], first, "{runs:?}");
    assert_eq!(
        runs[0]["diverged"]["what"], "its loss or gradients were not finite (NaN or inf)",
        "{runs:?}"
    );
    // Asking for more steps does not continue it: its last checkpoint holds diverged weights.
    refused_as_diverged(
        &dir,
        &spec,
        &["--no-progress", "--set", "training.steps=12"],
        &format!(
            "diverged: its loss or gradients were not finite (NaN or inf) from step {first}, and its newest checkpoint, of step 8,"
        ),
    );
    // As many steps again: finished, and the way on is to start over, not to train longer.
    let (out, _) = run_local(
        &dir,
        &spec,
        &["--no-progress"],
        &[],
        Duration::from_secs(60),
    );
    let stdout = stdout_of(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", stderr_of(&out));
    assert!(
        stdout.contains(&format!(
            "it diverged: its loss or gradients were not finite (NaN or inf) from step {first}"
        )) && stdout.contains("to start it over: add --force")
            && !stdout.contains("to train it longer"),
        "{stdout}"
    );
}

/// A run that diverged and went on (the default `on_divergence`), then was cancelled: the
/// line it ends with does not tell to resume it, which a re-run refuses, but why not and
/// what to do instead.
#[test]
fn a_diverged_run_cancelled_later_is_not_told_to_resume() {
    let dir = TestDir::new("metrics-diverged-cancelled");
    let mut text = tiny_mlp_spec("diverged-cancelled", 10_000_000, 2);
    text.push_str("  optimizer: { lr: 1.0e+30 }\n  log_every: 1\n");
    text.push_str("  checkpoint: { interval_steps: 1000000, keep: 1 }\n");
    let spec = dir.write("diverging.yaml", &text);
    let (mut job, run) =
        spawn_local_run(&dir, &spec, &["--nproc", "2", "--no-progress"], &[], |_| {});
    let metrics = run.join("metrics.jsonl");
    let diverged_at = wait_for("a step that diverged", Duration::from_secs(120), || {
        std::fs::read_to_string(&metrics)
            .ok()?
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find(|r| r["step"].is_u64() && (r["loss"].is_null() || r["grad_norm"].is_null()))
            .map(|r| r["step"].as_u64().unwrap())
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", all_logs(&run)));
    unsafe { libc::kill(job.child.id() as i32, libc::SIGTERM) };
    let (status, stdout) = finish(&mut job, &run, Duration::from_secs(60));
    assert_eq!(status.code(), Some(128 + libc::SIGTERM), "{stdout}");
    let verdict = result_json(&run);
    assert_eq!(verdict["status"], "cancelled", "{verdict}");
    let message = verdict["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with("the run was cancelled by SIGTERM after step ")
            && message.contains(&format!(
                "; its loss or gradients were not finite (NaN or inf) from step {diverged_at}, \
                 and a run that diverged is not resumed: it has no checkpoint from before it \
                 diverged: add --force to start it over, with "
            ))
            && !message.contains("to resume"),
        "{message}"
    );
    // What it says is what a re-run does.
    refused_as_diverged(
        &dir,
        &spec,
        &["--nproc", "2", "--no-progress"],
        &format!(
            "diverged: its loss or gradients were not finite (NaN or inf) from step {diverged_at}"
        ),
    );
}

#[test]
fn a_run_that_stops_on_divergence_fails_there_and_is_not_resumed_into_it() {
    // The learning rate no model survives, with `on_divergence: stop`: the ranks stop after
    // the first step that is not finite, with no checkpoint of it, and the job fails.
    let dir = TestDir::new("metrics-stop-on-divergence");
    // The step it stops at is recorded even between `log_every` steps.
    let (out, run, spec) = diverging_run(&dir, 40, "  log_every: 1000\n  on_divergence: stop\n");
    let stderr = stderr_of(&out);
    assert_eq!(out.status.code(), Some(1), "{}{stderr}", stdout_of(&out));
    let records = json_lines(&run.join("metrics.jsonl"));
    let last = records.last().expect("the step it stopped at is recorded");
    let at = last["step"].as_u64().unwrap();
    assert!(
        (2..40).contains(&at) && (last["loss"].is_null() || last["grad_norm"].is_null()),
        "{records:?}"
    );
    // Every record before it is of a finite step: it stopped at the first.
    assert!(
        records[..records.len() - 1]
            .iter()
            .all(|r| r["loss"].is_number() && r["grad_norm"].is_number()),
        "{records:?}"
    );
    let verdict: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run.join("result.json")).unwrap()).unwrap();
    assert_eq!(verdict["status"], "failed", "{verdict}");
    assert_eq!(verdict["cause"]["kind"], "diverged", "{verdict}");
    assert_eq!(verdict["cause"]["step"], at, "{verdict}");
    // Every rank stopped there; no checkpoint holds weights that are not finite.
    let log = std::fs::read_to_string(run.join("train.log")).unwrap();
    assert!(
        log.contains("stopping here, as `training.on_divergence: stop` asks"),
        "{log}"
    );
    assert_eq!(
        checkpoints_left(&run),
        [format!("step-{}", at - 1)],
        "{log}"
    );
    assert!(
        stderr.contains(&format!("stopped after step {at}, where training diverged"))
            && stderr.contains(&format!("its newest checkpoint, step {}", at - 1))
            && stderr.contains("add --force to start it over")
            // Where it stopped is said once, by the failure itself.
            && stderr.matches(&format!("after step {at}")).count() == 1,
        "{stderr}"
    );
    let out = shardrun_in(dir.path(), &["status", &run.to_string_lossy()]);
    assert!(stdout_of(&out).contains("FAILED"), "{}", stdout_of(&out));
    // Resumed from the checkpoint before, it would diverge at the same step again: refused.
    refused_as_diverged(
        &dir,
        &spec,
        &["--nproc", "2", "--no-progress"],
        &format!(
            "diverged: its loss or gradients were not finite (NaN or inf) from step {at}, and resumed from its newest checkpoint, of step {}, it would train the same steps into the same divergence",
            at - 1
        ),
    );
}

#[test]
fn a_language_model_whose_loss_blows_up_while_finite_stops_there_and_exports_say_so() {
    // A learning rate of 1000 on a small transformer: its loss leaps from ~ln(256) to
    // millions at step 2 and overflows only steps later. Past ten times a uniform guess's
    // (10 ln 256 = 55.5), the weights are gone already: `on_divergence: stop` stops there.
    let dir = TestDir::new("metrics-blown-up");
    let spec = dir.write(
        "blown.yaml",
        "name: blown\nresources: { tasks_per_node: 2, cpus_per_task: 1 }\ntraining:\n  \
         model: { kind: transformer, vocab_size: 256, dim: 32, n_layers: 2, n_heads: 2, max_seq_len: 32 }\n  \
         data: { kind: synthetic, seq_len: 32 }\n  steps: 12\n  total_batch_size: 4\n  \
         batch_size_per_device: 2\n  optimizer: { lr: 1000.0 }\n  schedule: { warmup_steps: 0 }\n  \
         checkpoint: { interval_steps: 1, keep: 1 }\n  on_divergence: stop\n",
    );
    let (out, run) = run_local(
        &dir,
        &spec,
        &["--no-progress"],
        &[],
        Duration::from_secs(120),
    );
    let stderr = stderr_of(&out);
    assert_eq!(out.status.code(), Some(1), "{}{stderr}", stdout_of(&out));
    let records = json_lines(&run.join("metrics.jsonl"));
    let last = records.last().expect("the step it stopped at is recorded");
    let at = last["step"].as_u64().unwrap();
    let loss = last["loss"].as_f64().expect("a finite loss");
    assert!(
        at >= 2 && loss > 10.0 * 256f64.ln() && last["loss_blew_up"] == true,
        "{records:?}"
    );
    // Every step before it is a calm one: it stopped at the first that blew up.
    assert!(
        records[..records.len() - 1].iter().all(
            |r| r["loss"].as_f64().is_some_and(|l| l < 10.0) && r.get("loss_blew_up").is_none()
        ),
        "{records:?}"
    );
    let verdict: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run.join("result.json")).unwrap()).unwrap();
    assert_eq!(
        (&verdict["cause"]["kind"], &verdict["cause"]["step"]),
        (&serde_json::json!("diverged"), &serde_json::json!(at)),
        "{verdict}"
    );
    let log = std::fs::read_to_string(run.join("train.log")).unwrap();
    assert!(
        log.contains(&format!(
            "step {at}: the loss is {loss:.4e}, past 55.5, 10 times a uniform guess's"
        )) && log.contains("stopping here, as `training.on_divergence: stop` asks"),
        "{log}"
    );
    // Said once, by rank 0, for all: every rank decided it from the same loss.
    assert_eq!(
        log.matches(&format!("warning: step {at}: ")).count(),
        1,
        "{log}"
    );
    assert_eq!(
        checkpoints_left(&run),
        [format!("step-{}", at - 1)],
        "{log}"
    );
    refused_as_diverged(
        &dir,
        &spec,
        &["--no-progress"],
        &format!(
            "diverged: its loss blew up (past 10 times a uniform guess's) from step {at}, and resumed from its newest checkpoint, of step {}",
            at - 1
        ),
    );
    // A lower LR is a change it cannot take on resume, and undoing it would not continue the
    // run either: the refusal says so, and that --force starts it over with the change.
    let (out, _) = run_local(
        &dir,
        &spec,
        &["--no-progress", "--set", "training.optimizer.lr=1e-3"],
        &[],
        Duration::from_secs(60),
    );
    let stderr = stderr_of(&out);
    assert!(
        !out.status.success()
            && stderr.contains("training.optimizer.lr: 1000.0 → 0.001")
            && stderr.contains(&format!(
                "fix: it diverged (its loss blew up (past 10 times a uniform guess's) from step {at}), so it does not continue even with these changes undone: add --force"
            )),
        "{stderr}"
    );
    // Its checkpoint from before exports without a word; trained on to the end, its newest
    // checkpoint's weights are finite but the diverged run's, and exporting it says so.
    let export = |path: &Path, to: &str| {
        let to = dir.join(to);
        let out = shardrun_in(
            dir.path(),
            &[
                "export",
                &path.to_string_lossy(),
                "--out",
                &to.to_string_lossy(),
            ],
        );
        assert!(out.status.success(), "{}", stderr_of(&out));
        stderr_of(&out)
    };
    let before = run.join("checkpoints").join(format!("step-{}", at - 1));
    assert!(!export(&run, "stopped").contains("warning"));
    let (out, _) = run_local(
        &dir,
        &spec,
        &[
            "--no-progress",
            "--force",
            "--set",
            "training.on_divergence=continue",
        ],
        &[],
        Duration::from_secs(120),
    );
    assert!(out.status.success(), "{}", stderr_of(&out));
    let warning = export(&run, "trained-on");
    assert!(
        warning.contains(&format!(
            "diverged: its loss blew up (past 10 times a uniform guess's) from step {at}, and this checkpoint is of step 12"
        )) && warning.contains(&format!("fix: export the newest checkpoint from before: `shardrun export {}`", before.display())),
        "{warning}"
    );
    assert!(!export(&before, "before").contains("warning"));

    // With no checkpoint from before, what to do is train it again otherwise: with --force
    // here; a sweep point by its sweep's spec (a --force there would train it as it was).
    std::fs::remove_dir_all(&before).unwrap();
    let remedies = "a lower LR, gradient clipping (`optimizer.grad_clip`) or a longer warm-up";
    let warning = export(&run, "no-before");
    assert!(
        warning.contains(&format!(
            "fix: it has no checkpoint from before: start it over (`--force`) with {remedies}"
        )),
        "{warning}"
    );
    let manifest_path = run.join("manifest.json");
    let mut manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&manifest_path).unwrap()).unwrap();
    manifest["sweep_params"] = serde_json::json!({"training.optimizer.lr": 1000.0});
    std::fs::write(&manifest_path, manifest.to_string()).unwrap();
    let warning = export(&run, "sweep-point");
    assert!(
        warning.contains(&format!(
            "fix: it has no checkpoint from before: to try it with {remedies}, change the \
             sweep's spec and run `shardrun sweep` again (changed values are new points)"
        )),
        "{warning}"
    );
}

/// A rank slowed on purpose (100 ms more a step) is named: the others wait for it in every
/// step's collectives, so their busy time, not their step time, tells them apart.
#[test]
fn a_rank_slowed_in_every_step_is_named_the_straggler() {
    let dir = TestDir::new("metrics-straggler");
    let spec = dir.write("slow.yaml", &tiny_mlp_spec("slow", 12, 3));
    let (out, run) = run_local(
        &dir,
        &spec,
        &["--nproc", "3", "--no-progress"],
        &[("SHARDRUN_INJECT_FAILURE", "1:1:slow".to_string())],
        Duration::from_secs(180),
    );
    assert!(out.status.success(), "{}", stderr_of(&out));
    // Every rank's step is as long: ranks leave a step together.
    let own = |rank: u64| json_lines(&run.join(format!("logs/rank-{rank}.metrics.jsonl")));
    let slowed = own(1);
    for record in &slowed {
        assert!(record["step_time_s"].as_f64().unwrap() >= 0.1, "{record}");
        assert!(record["busy_time_s"].as_f64().unwrap() >= 0.1, "{record}");
    }
    let run_arg = run.to_string_lossy().into_owned();
    let out = shardrun_in(dir.path(), &["metrics", "--stragglers", "--json", &run_arg]);
    assert!(out.status.success(), "{}", stderr_of(&out));
    let doc: serde_json::Value = serde_json::from_str(&stdout_of(&out)).unwrap();
    let report = &doc["runs"][0];
    assert_eq!(report["judged_by"], "busy_time", "{report}");
    let first = &report["slowest_ranks"][0];
    assert_eq!(first["rank"], 1, "{report}");
    assert!(first["share"].as_f64().unwrap() >= 0.9, "{report}");
    assert_eq!(report["worst"]["rank"], 1, "{report}");
    // The first step's time holds the ranks' start: not judged.
    assert_eq!(
        report["warm_ups_not_judged"],
        serde_json::json!([1]),
        "{report}"
    );
    assert_ne!(report["worst"]["step"], 1, "{report}");
    let text = stdout_of(&shardrun_in(
        dir.path(),
        &["metrics", "--stragglers", &run_arg],
    ));
    assert!(
        text.contains("ranks compared by busy time: each rank's step less its wait for the others"),
        "{text}"
    );
    assert!(
        text.contains("warm-up step(s) not judged (the first of each attempt): 1\n"),
        "{text}"
    );
    // A line that is no record is said, as `metrics` and `plot` say it.
    let metrics = run.join("metrics.jsonl");
    let mut text = std::fs::read_to_string(&metrics).unwrap();
    text.insert_str(0, "not a record\n");
    std::fs::write(&metrics, text).unwrap();
    let out = shardrun_in(dir.path(), &["metrics", "--stragglers", &run_arg]);
    assert!(
        stderr_of(&out).contains("line 1 is not a metrics record"),
        "{}",
        stderr_of(&out)
    );
}

#[test]
fn stragglers_of_a_run_resumed_on_fewer_ranks_judge_only_the_current_ranks() {
    let dir = TestDir::new("metrics-stragglers-resumed");
    let spec = dir.write("two.yaml", &tiny_mlp_spec("two", 10, 2));
    let deadline = Duration::from_secs(120);
    let (out, run) = run_local(&dir, &spec, &["--no-progress"], &[], deadline);
    assert!(out.status.success(), "{}", stderr_of(&out));
    let (out, _) = run_local(
        &dir,
        &spec,
        &[
            "--no-progress",
            "--nproc",
            "1",
            "--set",
            "training.steps=20",
        ],
        &[],
        deadline,
    );
    assert!(out.status.success(), "{}", stderr_of(&out));
    let run_arg = run.to_string_lossy();

    let out = shardrun_in(dir.path(), &["metrics", "--stragglers", "--json", &run_arg]);
    assert!(out.status.success(), "{}", stderr_of(&out));
    let doc: serde_json::Value = serde_json::from_str(&stdout_of(&out)).unwrap();
    let report = &doc["runs"][0];
    assert_eq!(
        (
            report["steps"].as_u64(),
            report["ranks"].as_u64(),
            report["first_step"].as_u64()
        ),
        (Some(10), Some(1), Some(11)),
        "{report}"
    );
    assert_eq!(
        report["slowest_ranks"],
        serde_json::json!([]),
        "one rank has no stragglers, whatever the two before did: {report}"
    );
    assert_eq!(
        report["earlier"],
        serde_json::json!([{"first_step": 1, "last_step": 10, "ranks": 2}]),
        "{report}"
    );
    let text = stdout_of(&shardrun_in(
        dir.path(),
        &["metrics", "--stragglers", &run_arg],
    ));
    assert!(
        text.starts_with("run: 10 step records, 1 rank(s), from step 11\n  steps 1-10 ran on 2 rank(s): not judged"),
        "{text}"
    );
    assert!(text.contains("nothing to compare"), "{text}");
}
