//! Local mode end to end: `shardrun run` with real worker processes over real sockets, then
//! the commands that read the run back (`logs`, `metrics`, `plot`).

use shardrun_e2e::jobs::*;
use shardrun_e2e::*;
use std::process::Command;
use std::time::Duration;

#[test]
fn two_rank_training_writes_logs_metrics_and_plots() {
    let dir = TestDir::new("local-run");
    let steps = 6;
    let spec = dir.write("tiny.yaml", &tiny_mlp_spec("tiny", steps, 2));
    let (out, run) = run_local(
        &dir,
        &spec,
        &["--nproc", "2"],
        &[],
        Duration::from_secs(120),
    );
    let stdout = stdout_of(&out);
    assert!(
        out.status.success(),
        "stdout:\n{stdout}\nstderr:\n{}",
        stderr_of(&out)
    );
    assert!(stdout.contains("training finished"), "{stdout}");

    let log = std::fs::read_to_string(run.join("train.log")).unwrap();
    for rank in 0..2 {
        assert!(
            log.contains(&format!("[rank {rank}] rank {rank} of 2 joined")),
            "{log}"
        );
        let own = std::fs::read_to_string(run.join(format!("logs/rank-{rank}.log"))).unwrap();
        assert!(own.contains(&format!("rank {rank} of 2 joined")), "{own}");
    }
    assert_eq!(metric_steps(&run, 0), (1..=steps).collect::<Vec<_>>());
    assert_eq!(result_json(&run)["status"], "succeeded");

    let plot = |args: &[&str]| {
        let out = shardrun_in(dir.path(), args, Duration::from_secs(30));
        assert!(out.status.success(), "{}", stderr_of(&out));
        stdout_of(&out)
    };
    let run_arg = run.to_string_lossy().to_string();
    // The script for the run directory is the one `submit` would write to run there.
    let render = plot(&["render", &run_arg]);
    let dry_run = shardrun_in(
        dir.path(),
        &["submit", &run_arg, "--dry-run"],
        Duration::from_secs(30),
    );
    assert!(dry_run.status.success(), "{}", stderr_of(&dry_run));
    assert_eq!(render, stdout_of(&dry_run));
    // Submitted for real, the finished run would be left alone: the dry run says so.
    assert!(
        stderr_of(&dry_run).contains(&format!(
            "dry run: would submit nothing: {run_arg} is finished: it trained all {steps} steps"
        )),
        "{}",
        stderr_of(&dry_run)
    );
    assert!(
        render.contains(&format!("#SBATCH --output={run_arg}/")),
        "{render}"
    );
    plot(&["plot", &run_arg]);
    let svg = std::fs::read_to_string(run.join("metrics.svg")).unwrap();
    assert!(
        svg.contains("<svg") && svg.contains("polyline"),
        "an SVG with curves"
    );
    // PNG text needs the TrueType font set-up installs: without it this fails, saying so.
    let png = dir.join("curves.png");
    let png_arg = png.to_string_lossy().to_string();
    plot(&["plot", &run_arg, "-o", &png_arg]);
    let picture = shardrun_e2e::figure::read_png(&std::fs::read(&png).unwrap()).unwrap();
    assert!(picture.width >= 1000 && picture.height >= 700);
    assert!(
        picture.count([255, 255, 255]) < picture.rgb.len(),
        "something is drawn"
    );

    let table = plot(&["metrics", &dir.path().to_string_lossy()]);
    assert!(
        table.contains(&format!("{steps}/{steps}")) && table.contains("succeeded"),
        "{table}"
    );
    let logs = plot(&["logs", &run_arg]);
    assert_eq!(logs, log);
    // `-n 3`, as tail: the last three lines.
    let last: Vec<&str> = log.lines().rev().take(3).collect();
    let tail = plot(&["logs", &run_arg, "-n", "3"]);
    assert_eq!(tail.lines().rev().collect::<Vec<_>>(), last, "{tail}");
}

#[test]
fn raw_output_and_reported_lines_of_every_rank_arrive() {
    let dir = TestDir::new("local-raw");
    let spec = dir.write("tiny.yaml", &tiny_mlp_spec("raw", 5, 3));
    let envs = [
        ("SHARDRUN_WORKER_BIN", simrank()),
        ("SIMRANK_RAW", "true".to_string()),
    ];
    let (out, run) = run_local(
        &dir,
        &spec,
        &["--nproc", "3"],
        &envs,
        Duration::from_secs(60),
    );
    assert!(
        out.status.success(),
        "{}{}",
        stdout_of(&out),
        stderr_of(&out)
    );
    let log = std::fs::read_to_string(run.join("train.log")).unwrap();
    for rank in 0..3 {
        for step in 1..=5 {
            assert!(
                log.contains(&format!("[rank {rank}] rank {rank} step {step} line 0")),
                "{log}"
            );
            let raw = format!("[rank {rank}] (stdout) raw stdout of rank {rank} at step {step}");
            assert!(log.contains(&raw), "{log}");
        }
        assert_eq!(metric_steps(&run, rank), (1..=5).collect::<Vec<_>>());
    }
}

#[test]
fn worker_that_cannot_reach_the_controller_names_the_address() {
    let dir = TestDir::new("unreachable");
    let spec = dir.write("tiny.yaml", &tiny_mlp_spec("lost", 2, 1));
    let spec = spec.to_str().expect("a UTF-8 path");
    let plan = shardrun_in(
        dir.path(),
        &["plan", "--json", spec],
        Duration::from_secs(30),
    );
    let resolved: serde_json::Value = serde_json::from_str(&stdout_of(&plan)).unwrap();
    let config = dir.write("train_config.json", &resolved["train"].to_string());
    // A port that was free a moment ago: nobody listens there.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    for bin in ["shardrun-worker", "shardrun-simrank"] {
        let out = run_with_deadline(
            Command::new(binary(bin))
                .env("SHARDRUN_CONTROLLER", &addr)
                .env("SHARDRUN_SECRET", "x")
                .env("SHARDRUN_CONNECT_TIMEOUT", "1")
                .env("SHARDRUN_CONFIG", &config)
                .env("SHARDRUN_RANK", "0")
                .env("SHARDRUN_WORLD_SIZE", "1"),
            Duration::from_secs(30),
        )
        .unwrap();
        let err = stderr_of(&out);
        assert!(!out.status.success());
        assert!(
            err.contains(&format!("cannot reach the shardrun controller at {addr}")),
            "{bin}: {err}"
        );
    }
}

#[test]
fn lines_reach_train_log_while_the_rank_is_still_quiet() {
    // Workers let the kernel coalesce their reports (Nagle). The last lines written before a
    // long quiet stretch (a slow step, a hang) must still reach train.log during it, not
    // wait for the rank's next write.
    let dir = TestDir::new("local-quiet");
    let spec = dir.write("tiny.yaml", &tiny_mlp_spec("quiet", 2, 2));
    let envs = [
        ("SHARDRUN_WORKER_BIN", simrank()),
        ("SIMRANK_LINES_PER_STEP", "50".to_string()),
        // Each rank logs step 1's lines at once, then sleeps 6 s before step 2.
        ("SIMRANK_STEP_MS", "6000".to_string()),
    ];
    let (mut job, run) = spawn_local_run(&dir, &spec, &["--nproc", "2"], &envs, |cmd| {
        cmd.stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
    });
    let last_of_step_1 = |rank: u64| format!("[rank {rank}] rank {rank} step 1 line 49");
    let log = wait_for_file(&run.join("train.log"), Duration::from_secs(60), |log| {
        log.contains(&last_of_step_1(0)) && log.contains(&last_of_step_1(1))
    })
    .unwrap();
    assert!(
        !log.contains("step 2 line 0"),
        "step 1's last lines arrived only with step 2's:\n{log}"
    );
    let status = wait_for_exit(&mut job, &run, Duration::from_secs(60));
    assert!(status.success(), "{status:?}");
}

/// A batch whose examples were all truncated before their completion has no target token:
/// its step is logged with a warning and a loss of 0, and the summary's first loss is that
/// of the first step that had targets, said so, not the 0; a run without any has none.
#[test]
fn a_step_without_target_tokens_is_not_the_summarys_first_loss() {
    let dir = TestDir::new("no-target-step");
    // In file order: the first example's prompt fills the 16 tokens its completion would
    // follow; the second fits.
    dir.write(
        "pairs.jsonl",
        &format!(
            "{{\"prompt\": \"{}\", \"completion\": \"lost\"}}\n{{\"prompt\": \"Q: \", \"completion\": \"A.\"}}\n",
            "p".repeat(40)
        ),
    );
    let spec = dir.write(
        "pairs.yaml",
        "name: pairs\nresources:\n  tasks_per_node: 1\n  cpus_per_task: 1\ntraining:\n  \
         model: { kind: llama, vocab_size: 257, dim: 16, n_layers: 1, n_heads: 2, ffn_dim: 32 }\n  \
         data: { kind: jsonl, files: [pairs.jsonl], prompt_field: prompt, completion_field: completion, \
         tokenizer: { kind: bytes }, seq_len: 16, packing: whole_documents, truncate: true, shuffle: false }\n  \
         steps: 2\n  total_batch_size: 1\n  batch_size_per_device: 1\n",
    );
    let (out, run) = run_local(&dir, &spec, &[], &[], Duration::from_secs(120));
    let stdout = stdout_of(&out);
    assert!(out.status.success(), "{stdout}\n{}", stderr_of(&out));
    let log = std::fs::read_to_string(run.join("train.log")).unwrap();
    assert!(
        log.contains("warning: step 1: no target tokens in the whole batch"),
        "{log}"
    );
    assert!(log.contains("step 1/2 | loss - |"), "{log}");
    // The record holds 0 (with no trained tokens); the table shows no loss for it.
    let losses = losses(&run);
    assert_eq!(losses[&1], 0.0, "{losses:?}");
    assert!(losses[&2] > 1.0 && losses[&2].is_finite(), "{losses:?}");
    let loss = losses[&2];
    assert!(
        log.contains(&format!(
            "Loss at step 2 (the first with target tokens): {loss:.4}\nFinal loss:   {loss:.4}\n"
        )) && log.contains(&format!("loss {loss:.4} -> {loss:.4}")),
        "{log}"
    );

    // A run whose only step had no target token has no loss to sum up, not a NaN one.
    let one_step = ["--force", "--set", "training.steps=1"];
    let (out, run) = run_local(&dir, &spec, &one_step, &[], Duration::from_secs(120));
    assert!(out.status.success(), "{}", stderr_of(&out));
    let log = std::fs::read_to_string(run.join("train.log")).unwrap();
    assert!(
        log.contains("\nLoss: none, no step had target tokens (see the warnings above)\n")
            && log.contains(", no loss (no step had target tokens), model state"),
        "{log}"
    );
    assert!(!log.contains("NaN"), "{log}");
}

/// NO_SHARD with a bf16 param_dtype keeps a bf16 copy of every parameter beside the fp32
/// state: the summary reports what the step lines do (the most held at a step's end), not
/// what is left once the final checkpoint has freed the copy, and says it saves nothing.
#[test]
fn the_summary_reports_the_model_state_the_steps_held() {
    let dir = TestDir::new("no-shard-bf16");
    let spec = dir.write(
        "noshard.yaml",
        "name: noshard\nresources: { tasks_per_node: 2, cpus_per_task: 1 }\ntraining:\n  \
         model: { kind: llama, vocab_size: 2000, dim: 64, n_layers: 4, n_heads: 4, n_kv_heads: 2, ffn_dim: 172 }\n  \
         data: { kind: synthetic, seq_len: 16 }\n  steps: 2\n  total_batch_size: 2\n  \
         batch_size_per_device: 1\n  \
         fsdp: { strategy: NO_SHARD, mixed_precision: { param_dtype: bf16, reduce_dtype: f32 } }\n  \
         checkpoint: { interval_steps: 2 }\n",
    );
    let (out, run) = run_local(&dir, &spec, &[], &[], Duration::from_secs(120));
    assert!(out.status.success(), "{}", stderr_of(&out));
    let log = std::fs::read_to_string(run.join("train.log")).unwrap();
    let after = |text: &str, mark: &str| -> String {
        let start = text
            .find(mark)
            .unwrap_or_else(|| panic!("no {mark:?} in:\n{text}"))
            + mark.len();
        text[start..].split(' ').next().unwrap().to_string()
    };
    let step_line = log
        .lines()
        .find(|l| l.contains("step 2/2 |"))
        .unwrap_or_else(|| panic!("no step 2 line:\n{log}"));
    let stepped = after(step_line, "| state ");
    let summed_up = after(&log, "Model state per rank: ");
    assert_eq!(summed_up, stepped, "{log}");
    let fp32: f64 = after(&log, "MiB (vs ").parse().unwrap();
    assert!(stepped.parse::<f64>().unwrap() > fp32, "{log}");
    assert!(
        log.contains("Model state savings: none (12.5% more than unsharded)"),
        "{log}"
    );
}
