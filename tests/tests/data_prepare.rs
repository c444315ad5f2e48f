//! Real data through the real binaries: `shardrun prepare` run by several processes at once
//! tokenizes once; `shardrun run` on text with a validation split trains, evaluates and
//! reports the validation loss everywhere people look (metrics.jsonl, the console, the
//! summary, `shardrun metrics`); bad data fails the job before any rank starts, naming the
//! record, and leaves no cache behind; a run resumed on changed data is refused before any
//! rank starts, naming the change, and keeps its state and checkpoints; with whole
//! documents, a document longer than a sequence is refused, or truncated when asked.

use shardrun_e2e::jobs::*;
use shardrun_e2e::*;
use std::time::Duration;

/// A tiny transformer on `files` read as text with the byte tokenizer.
fn text_spec(name: &str, files: &str, extra: &str) -> String {
    format!(
        "name: {name}\nresources:\n  tasks_per_node: 2\n  time: \"00:05:00\"\ntraining:\n  \
         model: {{ kind: transformer, vocab_size: 257, dim: 16, n_layers: 1, n_heads: 2, max_seq_len: 32 }}\n  \
         data:\n    kind: text\n    files: [{files}]\n    split: line\n    tokenizer: {{ kind: bytes }}\n{extra}  \
         steps: 6\n  total_batch_size: 8\n  batch_size_per_device: 4\n"
    )
}

/// Some real text: the lines of the GNU GPL every Debian machine has.
fn corpus(dir: &TestDir) -> std::path::PathBuf {
    let text = std::fs::read_to_string("/usr/share/common-licenses/GPL-3")
        .expect("/usr/share/common-licenses/GPL-3 is missing (Debian's base-files has it)");
    dir.write("data/gpl.txt", &text)
}

const DEADLINE: Duration = Duration::from_secs(180);

fn shardrun_in(dir: &TestDir, args: &[&str]) -> std::process::Output {
    shardrun_e2e::shardrun_in(dir.path(), args, DEADLINE)
}

#[test]
fn concurrent_prepares_tokenize_once() {
    let dir = TestDir::new("data-prepare");
    corpus(&dir);
    let spec = dir.write("job.yaml", &text_spec("prep", "data/*.txt", ""));
    let spec = spec.to_string_lossy().to_string();
    let children: Vec<_> = (0..3)
        .map(|_| {
            std::thread::spawn({
                let (spec, path) = (spec.clone(), dir.path().to_path_buf());
                move || shardrun_e2e::shardrun_in(&path, &["prepare", &spec], DEADLINE)
            })
        })
        .collect();
    let outputs: Vec<_> = children.into_iter().map(|c| c.join().unwrap()).collect();
    for out in &outputs {
        assert!(out.status.success(), "{}", stderr_of(out));
        assert!(
            stdout_of(out).contains("training data: "),
            "{}",
            stdout_of(out)
        );
    }
    let tokenized = outputs
        .iter()
        .filter(|o| stdout_of(o).contains("preparing training data"))
        .count();
    assert_eq!(tokenized, 1, "exactly one process tokenizes");
    let cache: Vec<_> = std::fs::read_dir(dir.join("runs/data-cache"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| !n.ends_with(".lock"))
        .collect();
    assert_eq!(cache.len(), 1, "{cache:?}");

    // Nothing changed: the next one only reads the cache.
    let again = shardrun_in(&dir, &["prepare", &spec]);
    assert!(
        stdout_of(&again).contains("(cached: "),
        "{}",
        stdout_of(&again)
    );
}

#[test]
fn an_edit_of_the_data_leaves_an_outdated_cache_folder_that_prepare_names_and_removes() {
    let dir = TestDir::new("data-outdated");
    let text = corpus(&dir);
    let spec = dir.write("job.yaml", &text_spec("outdated", "data/*.txt", ""));
    let spec = spec.to_string_lossy().to_string();
    let cache_folders = || -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir.join("runs/data-cache"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| !n.starts_with('.'))
            .collect();
        names.sort();
        names
    };
    let first = shardrun_in(&dir, &["prepare", &spec]);
    assert!(first.status.success(), "{}", stderr_of(&first));
    assert!(
        !stdout_of(&first).contains("data cache:"),
        "{}",
        stdout_of(&first)
    );
    let before = cache_folders();

    // An edit: the next preparation tokenizes into a new folder; the old one is named.
    let mut edited = std::fs::read_to_string(&text).unwrap();
    edited.push_str("One more line.\n");
    std::fs::write(&text, edited).unwrap();
    let second = shardrun_in(&dir, &["prepare", &spec]);
    assert!(second.status.success(), "{}", stderr_of(&second));
    let said = stdout_of(&second);
    assert!(
        said.contains("data cache: 1 folder(s) in ")
            && said.contains("gpl.txt: changed, ")
            && said.contains("--remove-outdated` removes them"),
        "{said}"
    );
    let after = cache_folders();
    assert_eq!(after.len(), 2, "{after:?}");

    let removal = shardrun_in(&dir, &["prepare", &spec, "--remove-outdated"]);
    assert!(removal.status.success(), "{}", stderr_of(&removal));
    let said = stdout_of(&removal);
    assert!(
        said.contains(&format!(
            "removed {}",
            dir.join("runs/data-cache").join(&before[0]).display()
        )) && said.contains("removed 1 outdated folder(s)"),
        "{said}"
    );
    let left = cache_folders();
    assert_eq!(left.len(), 1, "{left:?}");
    assert_ne!(left, before, "the folder of the edited data stays");
    let lock = dir
        .join("runs/data-cache")
        .join(format!(".{}.lock", before[0]));
    assert!(!lock.exists(), "{} is left", lock.display());
    let again = shardrun_in(&dir, &["prepare", &spec]);
    let said = stdout_of(&again);
    assert!(
        said.contains("(cached: ") && !said.contains("data cache:"),
        "{said}"
    );
}

#[test]
fn a_run_on_text_reports_its_validation_loss() {
    let dir = TestDir::new("data-run");
    corpus(&dir);
    let spec = dir.write(
        "job.yaml",
        &text_spec(
            "textrun",
            "data/*.txt",
            "    validation: { fraction: 0.1, every_steps: 3 }\n",
        ),
    );
    // The plan says what is evaluated, and when.
    let out = shardrun_in(&dir, &["plan", "job.yaml"]);
    assert!(
        stdout_of(&out).contains(
            "; validation on 10% of the documents held out, every 3 steps and after the last\n"
        ),
        "{}",
        stdout_of(&out)
    );
    let (out, run) = run_local(
        &dir,
        &spec,
        &["--no-progress"],
        &[],
        Duration::from_secs(240),
    );
    let stdout = stdout_of(&out);
    assert!(out.status.success(), "{stdout}\n{}", stderr_of(&out));
    // The controller prepared the data before the ranks started.
    let prepared = stdout
        .find("shardrun: training data: ")
        .expect("data summary");
    let joined = stdout.find("all 2 ranks registered").expect("ranks joined");
    assert!(prepared < joined, "{stdout}");
    assert!(stdout.contains("validation loss "), "{stdout}");

    let metrics = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    let evals: Vec<serde_json::Value> = metrics
        .lines()
        .filter(|l| l.contains("\"eval_loss\""))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        evals
            .iter()
            .map(|e| e["step"].as_u64().unwrap())
            .collect::<Vec<_>>(),
        vec![3, 6]
    );
    for e in &evals {
        let (loss, ppl) = (
            e["eval_loss"].as_f64().unwrap(),
            e["eval_perplexity"].as_f64().unwrap(),
        );
        assert!(
            loss.is_finite() && (ppl - loss.exp()).abs() < 1e-6 * ppl,
            "{e}"
        );
    }
    let log = std::fs::read_to_string(run.join("train.log")).unwrap();
    assert!(log.contains("eval after step 6 | loss"), "{log}");
    // The controller describes the data in the log once; no rank repeats it.
    let described: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("training data: "))
        .collect();
    assert!(
        described.len() == 1 && described[0].contains("[controller] training data: "),
        "{log}"
    );
    assert_eq!(stdout.matches("training data: ").count(), 1, "{stdout}");
    // And which tokenizer made its ids.
    assert!(
        log.contains("[controller] tokenizer: UTF-8 bytes (ids 0-255, end of document 256)"),
        "{log}"
    );
    assert!(
        log.contains("epoch 1 of the training data at step 1"),
        "{log}"
    );

    let table = shardrun_in(&dir, &["metrics", &run.to_string_lossy()]);
    let table = stdout_of(&table);
    let last = evals[1]["eval_loss"].as_f64().unwrap();
    assert!(table.contains("eval loss"), "{table}");
    assert!(table.contains(&format!("{last:.4}")), "{table}");

    // How often it evaluates may change on resume: it trains on from its checkpoint.
    let (out, _) = run_local(
        &dir,
        &spec,
        &[
            "--no-progress",
            "--set",
            "training.steps=8",
            "--set",
            "training.data.validation.every_steps=4",
        ],
        &[],
        Duration::from_secs(240),
    );
    let stdout = stdout_of(&out);
    assert!(out.status.success(), "{stdout}\n{}", stderr_of(&out));
    assert!(
        stdout.contains("training.data.validation.every_steps: 3 → 4"),
        "{stdout}"
    );
    let steps: Vec<u64> = std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .filter(|l| l.contains("\"eval_loss\""))
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["step"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert_eq!(steps, [3, 6, 8], "after step 8, the last");
}

#[test]
fn bad_data_fails_the_job_before_any_rank_starts() {
    let dir = TestDir::new("data-bad");
    dir.write(
        "data/d.jsonl",
        "{\"text\": \"fine\"}\n{\"text\": 3}\n{\"text\": \"never read\"}\n",
    );
    let spec = text_spec("bad", "data/d.jsonl", "")
        .replace("kind: text", "kind: jsonl")
        .replace("    split: line\n", "");
    let spec = dir.write("job.yaml", &spec);
    let (out, run) = run_local(
        &dir,
        &spec,
        &["--no-progress"],
        &[],
        Duration::from_secs(120),
    );
    assert!(!out.status.success());
    let stderr = stderr_of(&out);
    let file = dir.join("data/d.jsonl");
    assert!(
        stderr.contains(&format!(
            "{}:2: field `text` is a number, not a string; fix or remove it, or set `data.on_bad_record: skip`",
            file.display()
        )),
        "{stderr}"
    );
    assert!(!run.join("train.log").exists(), "no rank was started");
    let manifest = std::fs::read_to_string(run.join("manifest.json")).unwrap();
    assert!(manifest.contains("\"FAILED\""), "{manifest}");
    // `shardrun logs` has no log to show: it says how the run ended instead.
    let logs = shardrun_in(&dir, &["logs", &run.display().to_string()]);
    let said = stderr_of(&logs);
    assert!(!logs.status.success(), "{said}");
    assert!(
        said.contains(&format!(
            "{} has no log: the run ended (FAILED) before any rank started",
            run.display()
        )) && said.contains("field `text` is a number, not a string"),
        "{said}"
    );
    // Followed, it ends at once with the same words: no log will ever come.
    let logs = shardrun_in(&dir, &["logs", "-f", &run.display().to_string()]);
    let followed = stderr_of(&logs);
    assert!(!logs.status.success(), "{followed}");
    assert!(
        followed.contains(&format!(
            "{} has no log: the run ended (FAILED) before any rank started",
            run.display()
        )),
        "{followed}"
    );
    // A rank the run does not have is named as such, not as a log yet to come.
    let logs = shardrun_in(&dir, &["logs", &run.display().to_string(), "--rank", "2"]);
    let said = stderr_of(&logs);
    assert!(
        !logs.status.success()
            && said.contains(&format!(
                "{} has 2 rank(s), 0 to 1: there is no rank 2",
                run.display()
            )),
        "{said}"
    );
    let cache: Vec<_> = std::fs::read_dir(dir.join("runs/data-cache"))
        .map(|entries| {
            entries
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .filter(|n| !n.ends_with(".lock"))
                .collect()
        })
        .unwrap_or_default();
    assert!(cache.is_empty(), "nothing half-written: {cache:?}");
}

#[test]
fn documents_longer_than_a_sequence_are_refused_or_truncated_when_asked() {
    let dir = TestDir::new("data-truncate");
    let gpl = corpus(&dir);
    let whole = "    packing: whole_documents\n";
    let refused = dir.write("refused.yaml", &text_spec("refused", "data/*.txt", whole));
    let out = shardrun_in(&dir, &["prepare", &refused.to_string_lossy()]);
    let stderr = stderr_of(&out);
    assert!(!out.status.success(), "{stderr}");
    // The GPL's first line over 32 bytes (its end-of-document token counts too).
    let (line, text) = std::fs::read_to_string(&gpl)
        .unwrap()
        .lines()
        .enumerate()
        .find(|(_, l)| l.len() + 1 > 32 && !l.trim().is_empty())
        .map(|(i, l)| (i + 1, l.to_string()))
        .unwrap();
    assert!(
        stderr.contains(&format!(
            "{}:{line}: a document of {} tokens does not fit a sequence of 32",
            gpl.display(),
            text.len() + 1
        )) && stderr.contains("set `data.truncate: true` to keep its first 32 tokens"),
        "{stderr}"
    );

    let spec = dir.write(
        "job.yaml",
        &text_spec(
            "truncated",
            "data/*.txt",
            // The FSDP line makes the plan warn: the run's log keeps the plan's warnings.
            &format!("{whole}    truncate: true\n  fsdp: {{ shard_group_size: 2 }}\n"),
        ),
    );
    let (out, run) = run_local(
        &dir,
        &spec,
        &["--no-progress"],
        &[],
        Duration::from_secs(240),
    );
    let stdout = stdout_of(&out);
    assert!(out.status.success(), "{stdout}\n{}", stderr_of(&out));
    let said = "document(s) longer than seq_len 32 cut to their first 32 tokens (data.truncate): ";
    let first = format!(
        "(the first: {}:{line}, {} tokens)",
        gpl.display(),
        text.len() + 1
    );
    assert!(stdout.contains(said) && stdout.contains(&first), "{stdout}");
    let log = std::fs::read_to_string(run.join("train.log")).unwrap();
    assert_eq!(
        log.matches(said).count(),
        1,
        "the controller says it once: {log}"
    );
    let warned = "warning: `training.fsdp.shard_group_size` only applies to HYBRID_SHARD; ignored";
    assert_eq!(log.matches(warned).count(), 1, "{log}");
    let metrics = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    let losses: Vec<f64> = metrics
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter_map(|m| m["loss"].as_f64())
        .collect();
    assert_eq!(losses.len(), 6, "{metrics}");
    assert!(losses.iter().all(|l| l.is_finite()), "{losses:?}");
}

#[test]
fn a_run_directory_reads_its_spec_paths_relative_to_the_spec_it_was_made_from() {
    // The spec and its data live in specs/; the run in runs/. `shardrun plan <run dir>` and
    // `shardrun run <run dir>` read the run's job.yaml, whose `data/*.txt` still means
    // specs/data/*.txt.
    let dir = TestDir::new("data-spec-dir");
    let text = std::fs::read_to_string(corpus(&dir)).unwrap();
    dir.write("specs/data/gpl.txt", &text);
    let extra = "  checkpoint: { interval_steps: 3 }\n";
    dir.write("specs/job.yaml", &text_spec("moved", "data/*.txt", extra));
    let out = shardrun_in(&dir, &["run", "specs/job.yaml", "--no-progress"]);
    assert!(out.status.success(), "{}", stderr_of(&out));

    let out = shardrun_in(&dir, &["plan", "runs/moved"]);
    assert!(out.status.success(), "{}", stderr_of(&out));
    let out = shardrun_in(
        &dir,
        &[
            "run",
            "runs/moved",
            "--set",
            "training.steps=8",
            "--no-progress",
        ],
    );
    let stdout = stdout_of(&out);
    assert!(out.status.success(), "{stdout}{}", stderr_of(&out));
    assert!(stdout.starts_with("resuming"), "{stdout}");
    assert_eq!(
        metric_steps(&dir.join("runs/moved"), 0),
        (1..=8).collect::<Vec<_>>()
    );

    // The data cache the runs share sits in the run root and is not listed as a run.
    let out = shardrun_in(&dir, &["metrics", "runs"]);
    let stdout = stdout_of(&out);
    assert!(out.status.success(), "{stdout}{}", stderr_of(&out));
    assert!(
        stdout.contains("moved") && !stdout.contains("data-cache") && !stdout.contains("text-"),
        "{stdout}"
    );

    // Continued from another folder, whose runs/ is not this run's root: the run keeps the
    // data cache it was made with instead of looking changed.
    let run_arg = dir.join("runs/moved").to_string_lossy().into_owned();
    let out = shardrun_e2e::shardrun_in(
        &dir.join("specs"),
        &[
            "run",
            &run_arg,
            "--set",
            "training.steps=10",
            "--no-progress",
        ],
        DEADLINE,
    );
    let stdout = stdout_of(&out);
    assert!(out.status.success(), "{stdout}{}", stderr_of(&out));
    assert!(stdout.starts_with("resuming"), "{stdout}");
    assert!(
        !dir.join("specs/runs").exists(),
        "no cache made beside the spec"
    );
}

#[test]
fn resuming_on_changed_data_is_refused_before_any_rank_starts_and_the_run_is_kept() {
    let dir = TestDir::new("data-changed");
    let original = std::fs::read_to_string(corpus(&dir)).unwrap();
    let file = dir.join("data/gpl.txt");
    let extra = "  checkpoint: { interval_steps: 3 }\n";
    dir.write("job.yaml", &text_spec("changed", "data/*.txt", extra));
    let out = shardrun_in(&dir, &["run", "job.yaml", "--no-progress"]);
    assert!(out.status.success(), "{}", stderr_of(&out));
    let run = dir.join("runs/changed");
    let manifest = || std::fs::read_to_string(run.join("manifest.json")).unwrap();
    assert!(manifest().contains("\"COMPLETED\""), "{}", manifest());
    let more = |steps: &str| {
        shardrun_in(
            &dir,
            &[
                "run",
                "runs/changed",
                "--set",
                &format!("training.steps={steps}"),
                "--no-progress",
            ],
        )
    };

    // The data changes; asked for more steps, the run refuses from its files alone, before
    // preparing it or rewriting anything (its recorded job, its verdict).
    let trained_on = dir.modified("data/gpl.txt");
    let added = "one more line\n";
    dir.write("data/gpl.txt", &format!("{original}{added}"));
    let kept = [
        "job.yaml",
        "train_config.json",
        "resolved.json",
        "result.json",
    ]
    .map(|file| (file, std::fs::read(run.join(file)).unwrap()));
    let out = more("9");
    let (stdout, stderr) = (stdout_of(&out), stderr_of(&out));
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    let refusal = format!(
        "the training data of {} changed since its checkpoint of step 6 was saved",
        run.display()
    );
    assert!(stderr.contains(&refusal), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "\n  {}: changed ({} → {} bytes)\n",
            file.display(),
            original.len(),
            original.len() + added.len()
        )),
        "names what changed: {stderr}"
    );
    assert!(
        stderr.contains("--force")
            && stderr.contains(&format!(
                "checkpoint.from: {}",
                run.join("checkpoints/step-6").display()
            )),
        "says what to do: {stderr}"
    );
    assert!(stderr.contains(" then, other files now)"), "{stderr}");
    assert!(
        stdout.is_empty(),
        "nothing prepared, no rank started: {stdout}"
    );
    for (file, bytes) in &kept {
        assert!(
            std::fs::read(run.join(file)).unwrap() == *bytes,
            "a refused re-run leaves {file} as it was"
        );
    }
    let status = stdout_of(&shardrun_in(&dir, &["status", "runs/changed"]));
    assert!(
        status.contains("COMPLETED") && status.contains("training finished"),
        "{status}"
    );
    for step in [3, 6] {
        assert!(run
            .join(format!("checkpoints/step-{step}/COMPLETE"))
            .exists());
    }

    // With the changed data prepared, the re-run refuses at once from its tokens.
    let out = shardrun_in(&dir, &["prepare", "job.yaml"]);
    assert!(out.status.success(), "{}", stderr_of(&out));
    let out = more("12");
    let (stdout, stderr) = (stdout_of(&out), stderr_of(&out));
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    assert!(
        stderr.contains(&refusal) && !stderr.contains("other files now"),
        "{stderr}"
    );
    assert!(
        stdout.is_empty(),
        "refused before the job started: {stdout}"
    );

    // Changed where only its tokens tell (the same size and time): the run prepares the new
    // data first, then refuses before any rank starts.
    let unseen = original.replacen("GNU", "gnu", 1);
    assert_ne!(unseen, original);
    dir.rewrite_keeping_time("data/gpl.txt", &unseen, trained_on);
    let out = more("9");
    let (stdout, stderr) = (stdout_of(&out), stderr_of(&out));
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    assert!(
        stderr.contains(&refusal)
            && stderr.contains(&format!(
                "{}: changed (same size, {} bytes, other contents)",
                file.display(),
                original.len()
            )),
        "{stderr}"
    );
    assert!(
        stdout.starts_with("shardrun: preparing training data") && !stdout.contains("resuming"),
        "{stdout}"
    );
    assert!(
        !stdout.contains("ranks registered"),
        "no rank started: {stdout}"
    );
    assert!(!stderr.contains("[rank "), "no rank started: {stderr}");
    for (file, bytes) in &kept {
        assert!(
            std::fs::read(run.join(file)).unwrap() == *bytes,
            "a refused re-run leaves {file} as it was"
        );
    }
    assert!(manifest().contains("\"COMPLETED\""), "{}", manifest());

    // The data restored, the run continues from its checkpoint.
    dir.write("data/gpl.txt", &original);
    let out = more("9");
    let stdout = stdout_of(&out);
    assert!(out.status.success(), "{stdout}{}", stderr_of(&out));
    // Its file has a new time but the bytes the first cache was made from: that cache's
    // tokens are taken (nothing is tokenized), compared, then resumed on.
    assert!(
        stdout.starts_with("shardrun: training data: the files hold the bytes")
            && stdout.contains("nothing is tokenized")
            && stdout.contains(&format!("\nresuming {} at step 7", run.display())),
        "{stdout}"
    );
    assert_eq!(metric_steps(&run, 0), (1..=9).collect::<Vec<_>>());
}

/// A finished run run again is not resumed, so nothing refuses its changed data: the
/// "nothing to do" says that the data it trained on differs from the data as it is now,
/// naming the file, before the data is prepared again and after; written back as it was,
/// the data is the same again.
#[test]
fn a_finished_run_run_again_says_its_data_changed_since_it_trained() {
    let dir = TestDir::new("data-changed-finished");
    let original = std::fs::read_to_string(corpus(&dir)).unwrap();
    let file = dir.join("data/gpl.txt");
    dir.write("job.yaml", &text_spec("finished", "data/*.txt", ""));
    let out = shardrun_in(&dir, &["run", "job.yaml", "--no-progress"]);
    assert!(out.status.success(), "{}", stderr_of(&out));
    let run = dir.join("runs/finished");
    let again = || {
        let out = shardrun_in(&dir, &["run", "job.yaml", "--no-progress"]);
        let stdout = stdout_of(&out);
        assert!(out.status.success(), "{stdout}{}", stderr_of(&out));
        assert!(
            stdout.starts_with(&format!("{} is finished", run.display())),
            "{stdout}"
        );
        stdout
    };
    assert!(!again().contains("differs"));

    let added = "one more line\n";
    dir.write("data/gpl.txt", &format!("{original}{added}"));
    let changed = format!(
        "\n  the data it trained on differs from the data as it is now:\n    {}: changed ({} → {} bytes)\n",
        file.display(),
        original.len(),
        original.len() + added.len()
    );
    let stdout = again();
    assert!(stdout.contains(&changed), "{stdout}");
    assert!(stdout.contains("add --force"), "{stdout}");
    let prepared = shardrun_in(&dir, &["prepare", "job.yaml"]);
    assert!(prepared.status.success(), "{}", stderr_of(&prepared));
    let stdout = again();
    assert!(stdout.contains(&changed), "prepared: {stdout}");

    dir.write("data/gpl.txt", &original);
    let stdout = again();
    assert!(!stdout.contains("differs"), "restored: {stdout}");
    assert_eq!(metric_steps(&run, 0), (1..=6).collect::<Vec<_>>());
}

/// A group's shared data cache, prepared by one user: another user, who cannot write it,
/// uses it after a `chmod` of the data (which changes the files' status-change time, so the
/// cache key) by reading the folder of the same bytes where it is; data that really changed
/// is refused naming whose the cache is and what to do. As `nobody`: root writes anywhere.
#[test]
fn another_user_reads_a_shared_cache_they_cannot_write_after_a_chmod_of_the_data() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    let dir = TestDir::new("data-shared-cache");
    let text = corpus(&dir);
    let spec = dir.write("job.yaml", &text_spec("shared", "data/*.txt", ""));
    let spec = spec.to_string_lossy().to_string();
    let prepared = shardrun_in(&dir, &["prepare", &spec]);
    assert!(prepared.status.success(), "{}", stderr_of(&prepared));
    let cache = dir.join("runs/data-cache");
    let folders = || std::fs::read_dir(&cache).unwrap().count();
    let before = folders();

    // The owner opens the project to the group: every file's status-change time moves.
    let binary = dir.join("bin/shardrun");
    std::fs::create_dir(dir.join("bin")).unwrap();
    std::fs::copy(shardrun_e2e::shardrun(), &binary).unwrap();
    let status = std::process::Command::new("chmod")
        .args(["-R", "go+rX,go-w"])
        .arg(dir.path())
        .status()
        .unwrap();
    assert!(status.success());
    let as_nobody = || {
        let mut command = std::process::Command::new(&binary);
        command
            .uid(65534)
            .gid(65534)
            .current_dir(dir.path())
            .args(["prepare", &spec]);
        shardrun_e2e::run_with_deadline(&mut command, DEADLINE).unwrap()
    };
    let read = as_nobody();
    assert!(read.status.success(), "{}", stderr_of(&read));
    let said = stdout_of(&read);
    assert!(
        said.contains("only their times changed") && said.contains("used where they are"),
        "{said}"
    );
    assert!(!said.contains("preparing"), "{said}");
    assert_eq!(folders(), before, "nothing is written into the cache");

    // An edit: nothing of the cache holds it, and this user cannot add it.
    let mut edited = std::fs::read_to_string(&text).unwrap();
    edited.push_str("One more line.\n");
    std::fs::write(&text, edited).unwrap();
    let refused = as_nobody();
    assert!(!refused.status.success());
    let said = stderr_of(&refused);
    let mode = std::fs::metadata(&cache).unwrap().permissions().mode() & 0o7777;
    assert!(
        said.contains(&format!(
            "this user (nobody) cannot write the data cache {}, which is root's (mode {mode:o})",
            cache.display()
        )) && said.contains("ask root to run `shardrun prepare`")
            && said.contains("`data.cache_dir`"),
        "{said}"
    );
    assert_eq!(folders(), before);
}

/// Ctrl-C while `shardrun prepare` tokenizes: the cache folder it was building is removed
/// (not left hidden until the next preparation), it says so and ends as SIGINT would; the
/// same command then prepares the data. The process is stopped (SIGSTOP) once its build
/// folder appears, so that the SIGINT lands mid-build however fast the machine.
#[test]
fn ctrl_c_while_prepare_tokenizes_removes_the_folder_it_was_building() {
    use std::os::unix::process::ExitStatusExt;
    let dir = TestDir::new("data-prepare-interrupted");
    let text = std::fs::read_to_string("/usr/share/common-licenses/GPL-3").unwrap();
    // 35 MB: over a second of tokenizing on a fast machine.
    dir.write("data/big.txt", &text.repeat(1000));
    let spec = dir.write("job.yaml", &text_spec("interrupted", "data/*.txt", ""));
    let spec = spec.to_string_lossy().to_string();
    let cache = dir.join("runs/data-cache");
    let mut prepare = std::process::Command::new(shardrun_e2e::shardrun());
    prepare
        .current_dir(dir.path())
        .args(["prepare", &spec])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut job = GroupChild::spawn(&mut prepare).unwrap();
    let building = wait_for("the cache folder being built", DEADLINE, || {
        std::fs::read_dir(&cache).ok()?.flatten().find_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.contains(".tmp-").then(|| e.path())
        })
    })
    .unwrap();
    let pid = job.child.id() as i32;
    // SAFETY: signals to the child this test started.
    unsafe {
        assert_eq!(libc::kill(pid, libc::SIGSTOP), 0);
        assert_eq!(libc::kill(pid, libc::SIGINT), 0);
        assert_eq!(libc::kill(pid, libc::SIGCONT), 0);
    }
    let pipes = PipeReader::start(&mut job.child);
    let status = wait_for_exit(&mut job, dir.path(), DEADLINE);
    let stderr = String::from_utf8_lossy(&pipes.join().1).into_owned();
    assert_eq!(status.code(), Some(130), "{status:?} {stderr}");
    assert_eq!(status.signal(), None, "it ends by itself: {stderr}");
    assert!(
        stderr.contains(&format!(
            "shardrun: SIGINT: preparing the data stopped; the cache folder it was building is \
             removed ({})",
            building.display()
        )),
        "{stderr}"
    );
    let left: Vec<_> = std::fs::read_dir(&cache)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| !n.ends_with(".lock"))
        .collect();
    assert!(left.is_empty(), "left in the cache: {left:?}");

    let again = shardrun_in(&dir, &["prepare", &spec]);
    assert!(again.status.success(), "{}", stderr_of(&again));
    assert!(
        stdout_of(&again).contains("553,000 document(s)"),
        "{}",
        stdout_of(&again)
    );
}

/// Ctrl-C while the controller prepares the data (here: waiting for another process that
/// holds the cache's lock) cancels the run at once and says so, and the run's state says
/// it was cancelled, not killed; the same command then runs it.
#[test]
fn ctrl_c_while_the_data_is_prepared_cancels_the_run_and_says_so() {
    let dir = TestDir::new("prep-cancel");
    let (spec, held) = waiting_for_the_data(&dir, "prep-cancel", "");
    let PreparingRun {
        mut job,
        run,
        lines,
        lock,
    } = held;
    unsafe { libc::kill(job.child.id() as i32, libc::SIGINT) };
    let status = wait_for_exit(&mut job, &run, DEADLINE);
    let rest: Vec<String> = lines.iter().collect();
    assert_eq!(status.code(), Some(130), "{rest:?}");
    assert!(
        rest.iter().any(|l| l.contains(
            "cancelled by SIGINT while its data was being prepared, before any rank started"
        )),
        "{rest:?}"
    );

    let run_arg = run.display().to_string();
    let out = shardrun_in(&dir, &["status", "--json", &run_arg]);
    let runs = status_runs(&stdout_of(&out));
    assert_eq!(runs[0]["state"], "CANCELLED", "{}", stdout_of(&out));

    drop(lock);
    let spec_arg = spec.to_string_lossy().to_string();
    let again = shardrun_in(&dir, &["run", &spec_arg]);
    assert!(again.status.success(), "{}", stderr_of(&again));
    assert!(
        stdout_of(&again).contains("training finished"),
        "{}",
        stdout_of(&again)
    );
}

/// A preemption notice (SIGUSR2, as Slurm sends `signal_seconds` before the time limit)
/// while the controller prepares the data is kept, not the end of the process: once the
/// data is ready the run ends PREEMPTED without starting a rank (nothing trained, nothing
/// to save); the same command trains it.
#[test]
fn a_preemption_notice_while_the_data_is_prepared_preempts_the_run_before_any_rank_starts() {
    let dir = TestDir::new("prep-preempt");
    let (spec, held) = waiting_for_the_data(
        &dir,
        "prep-preempt",
        "  checkpoint: { interval_steps: 3 }\n",
    );
    let PreparingRun {
        mut job,
        run,
        lines,
        lock,
    } = held;
    unsafe { libc::kill(job.child.id() as i32, libc::SIGUSR2) };
    let noticed = loop {
        match lines.recv_timeout(DEADLINE) {
            Ok(line)
                if line.contains(
                    "SIGUSR2 (a preemption or time-limit notice) while the data is prepared: no rank will be started",
                ) =>
            {
                break true
            }
            Ok(_) => {}
            Err(_) => break false,
        }
    };
    assert!(noticed, "the notice was not taken");
    drop(lock);
    let status = wait_for_exit(&mut job, &run, DEADLINE);
    let rest: Vec<String> = lines.iter().collect();
    assert_eq!(status.code(), Some(0), "{rest:?}");
    assert!(
        rest.iter().any(|l| l.contains(
            "SIGUSR2 (a preemption or time-limit notice) before the ranks were launched (during \
             the set-up or while the data was prepared): no rank is started"
        )),
        "{rest:?}"
    );
    assert!(
        !rest.iter().any(|l| l.contains("registered")),
        "a rank started: {rest:?}"
    );
    let run_arg = run.display().to_string();
    let out = shardrun_in(&dir, &["status", "--json", &run_arg]);
    let runs = status_runs(&stdout_of(&out));
    assert_eq!(runs[0]["state"], "PREEMPTED", "{}", stdout_of(&out));

    // Started again and stopped while its data is prepared: the first attempt's verdict
    // (preempted) went when this attempt began, so nothing says it still holds.
    let (_, held) = waiting_for_the_data(
        &dir,
        "prep-preempt",
        "  checkpoint: { interval_steps: 3 }\n",
    );
    let PreparingRun { mut job, lock, .. } = held;
    unsafe { libc::kill(job.child.id() as i32, libc::SIGINT) };
    assert_eq!(wait_for_exit(&mut job, &run, DEADLINE).code(), Some(130));
    drop(lock);
    assert!(!run.join("result.json").exists());
    let out = shardrun_in(&dir, &["status", "--json", &run_arg]);
    let runs = status_runs(&stdout_of(&out));
    assert_eq!(runs[0]["state"], "CANCELLED", "{}", stdout_of(&out));
    let detail = runs[0]["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains("by SIGINT while its data was being prepared")
            && !detail.contains("preempted"),
        "{detail}"
    );

    let spec_arg = spec.to_string_lossy().to_string();
    let again = shardrun_in(&dir, &["run", &spec_arg, "--run-dir", &run_arg]);
    let stdout = stdout_of(&again);
    assert!(again.status.success(), "{stdout}{}", stderr_of(&again));
    // Stopped before its first step, it had nothing to save.
    assert!(
        stdout.starts_with(&format!(
            "starting {} again from step 1 (it has no checkpoint yet): it was cancelled",
            run.display()
        )),
        "{stdout}"
    );
    assert!(stdout.contains("training finished"), "{stdout}");
}

/// A local run of `name` on text (`extra`: lines of its `training:`), started while another
/// process holds the lock of the cache its data goes into: it waits, before any rank starts.
struct PreparingRun {
    job: GroupChild,
    run: std::path::PathBuf,
    /// Its stdout, line by line, from the first line after it said it waits.
    lines: std::sync::mpsc::Receiver<String>,
    lock: Vec<std::fs::File>,
}

fn waiting_for_the_data(
    dir: &TestDir,
    name: &str,
    extra: &str,
) -> (std::path::PathBuf, PreparingRun) {
    use std::io::BufRead;
    corpus(dir);
    let spec = dir.write("job.yaml", &text_spec(name, "data/*.txt", extra));
    let spec_arg = spec.to_string_lossy().to_string();
    let prepared = shardrun_in(dir, &["prepare", &spec_arg]);
    assert!(prepared.status.success(), "{}", stderr_of(&prepared));
    // Another process building the same cache: its folder gone, its lock held.
    let cache_dir = dir.join("runs/data-cache");
    let built: Vec<_> = std::fs::read_dir(&cache_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| !n.starts_with('.'))
        .collect();
    assert!(!built.is_empty(), "nothing prepared");
    // Every cache the run could read (one, unless an earlier attempt built another).
    let lock: Vec<std::fs::File> = built
        .iter()
        .map(|name| {
            std::fs::remove_dir_all(cache_dir.join(name)).unwrap();
            let lock = std::fs::File::create(cache_dir.join(format!(".{name}.lock"))).unwrap();
            lock.lock().unwrap();
            lock
        })
        .collect();

    let (mut job, run) = spawn_local_run(dir, &spec, &[], &[], |_| {});
    let stdout = job.child.stdout.take().unwrap();
    let (lines_tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut said = Vec::new();
    let waiting = loop {
        match lines.recv_timeout(DEADLINE) {
            Ok(line) if line.contains("waiting for another process") => break true,
            Ok(line) => said.push(line),
            Err(_) => break false,
        }
    };
    assert!(waiting, "the run never waited for the lock: {said:?}");
    let run_state = PreparingRun {
        job,
        run,
        lines,
        lock,
    };
    (spec, run_state)
}
