//! `shardrun sweep` against the real Slurm: sweeps split into job arrays within the
//! cluster's limits (`MaxArraySize=10` on the `small-arrays` cluster), re-runs that submit only
//! what changed or failed, and submissions cut short (an array rejected, sbatch or shardrun
//! killed) that the next sweep finishes with every point run exactly once. Slurm's own view
//! (`squeue`) is the ground truth for what was submitted.

use shardrun_e2e::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(180);

/// A sweep of `seeds` x `lrs` whose points each append one line to `ran.txt` in their run
/// directory and end before training (`exit 0`), so a point that ran twice shows.
fn sweep_spec(name: &str, seeds: &str, lrs: &str, extra: &str) -> String {
    format!(
        "name: {name}\n{extra}resources:\n  tasks_per_node: 1\n  time: \"00:05:00\"\n  setup:\n    - 'echo \"task $SLURM_ARRAY_TASK_ID of $SLURM_ARRAY_JOB_ID\" >> ran.txt'\n    - exit 0\ntraining:\n  model: {{ kind: mlp, input_dim: 4, hidden_dim: 8, output_dim: 4 }}\n  steps: 1\n  total_batch_size: 4\n  batch_size_per_device: 4\nsweep:\n  grid:\n    training.seed: {seeds}\n    training.optimizer.lr: {lrs}\n"
    )
}

/// A sweep name of this test run alone: squeue still lists the jobs of earlier runs (ended
/// jobs stay for `MinJobAge`), and tests find their arrays by job name.
fn unique(name: &str) -> String {
    format!("{name}-{}", std::process::id())
}

const FIVE_LRS: &str = "[1.0e-3, 1.0e-4, 1.0e-5, 1.0e-6, 1.0e-7]";

/// `shardrun status --json <sweep dir>` as (name, state), once every one of `expected` points
/// satisfies `done`.
fn wait_for_points(
    cluster: &SlurmCluster,
    dir: &TestDir,
    sweep_dir: &Path,
    expected: usize,
    done: impl Fn(&str) -> bool,
) -> Vec<(String, String)> {
    let mut last = Vec::new();
    wait_for("every point to end", DEADLINE, || {
        let out = cluster
            .shardrun(
                dir.path(),
                &["status", "--json", &sweep_dir.to_string_lossy()],
            )
            .ok()?;
        last = states(&stdout_of(&out));
        (last.len() == expected && last.iter().all(|(_, s)| done(s))).then(|| last.clone())
    })
    .unwrap_or_else(|e| panic!("{e}; last status: {last:?}"))
}

fn all_completed(cluster: &SlurmCluster, dir: &TestDir, sweep_dir: &Path, expected: usize) {
    wait_for_points(cluster, dir, sweep_dir, expected, |s| s == "COMPLETED");
}

/// Every point's run directory: how many times it ran (lines of `ran.txt`) and the Slurm job
/// ids its manifest records.
fn runs_of(sweep_dir: &Path) -> BTreeMap<String, (usize, Vec<String>)> {
    let mut runs = BTreeMap::new();
    for entry in std::fs::read_dir(sweep_dir).unwrap().flatten() {
        let manifest = entry.path().join("manifest.json");
        let Ok(text) = std::fs::read_to_string(&manifest) else {
            continue;
        };
        let manifest: serde_json::Value = serde_json::from_str(&text).unwrap();
        let ids = manifest["slurm_job_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_string())
            .collect();
        let ran = std::fs::read_to_string(entry.path().join("ran.txt"))
            .map(|t| t.lines().count())
            .unwrap_or(0);
        runs.insert(entry.file_name().to_string_lossy().into_owned(), (ran, ids));
    }
    runs
}

/// Slurm's own record of the sweep's arrays: array job id -> (comment, task count, whether
/// every task was cancelled), for the jobs named `name` (every task, pending or ended).
fn slurm_arrays(cluster: &SlurmCluster, name: &str) -> BTreeMap<u64, (String, usize, bool)> {
    let out = cluster
        .command("squeue")
        .args(["-h", "-r", "--states=all", "-n", name, "-o", "%F|%T|%k"])
        .output()
        .expect("squeue runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut arrays: BTreeMap<u64, (String, usize, bool)> = BTreeMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let fields: Vec<&str> = line.splitn(3, '|').collect();
        let entry = arrays
            .entry(fields[0].parse().unwrap())
            .or_insert_with(|| (fields[2].to_string(), 0, true));
        entry.1 += 1;
        entry.2 &= fields[1] == "CANCELLED";
    }
    arrays
}

fn task_counts(arrays: &BTreeMap<u64, (String, usize, bool)>) -> Vec<usize> {
    arrays.values().map(|(_, n, _)| *n).collect()
}

/// The sbatch calls that submit: not `sbatch --test-only`, which checks a job before it
/// is submitted held.
const SUBMITS: &str = "[ \"$1\" != --test-only ]";

/// A `program` first on PATH (in `dir/wrapper-bin`) that, on the `nth` of its calls for
/// which the shell test `when` holds, runs `action` (a shell snippet; `$real` is Slurm's own
/// program); every other call is Slurm's program itself. Returns the PATH to use.
fn wrap(dir: &TestDir, program: &str, when: &str, nth: usize, action: &str) -> String {
    let real = std::env::split_paths(&std::env::var_os("PATH").unwrap())
        .map(|p| p.join(program))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{program} on PATH"));
    let bin = dir.join("wrapper-bin");
    let count = dir.join(format!("{program}-calls"));
    let script = format!(
        "#!/bin/bash\nreal={real:?}\nif {when}; then\n  n=$(( $(cat {count:?} 2>/dev/null || echo 0) + 1 ))\n  echo $n > {count:?}\n  if [ $n = {nth} ]; then\n{action}\n  fi\nfi\nexec \"$real\" \"$@\"\n",
        real = real.display().to_string(),
        count = count.display().to_string(),
    );
    let path = dir.write(&format!("wrapper-bin/{program}"), &script);
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

/// The tasks of the sweep's arrays that did not end cancelled, per array (Slurm's view).
fn arrays_run(cluster: &SlurmCluster, name: &str) -> Vec<usize> {
    slurm_arrays(cluster, name)
        .values()
        .filter(|(_, _, cancelled)| !cancelled)
        .map(|(_, n, _)| *n)
        .collect()
}

#[test]
fn twenty_five_points_run_as_three_arrays_past_max_array_size() {
    let cluster = SlurmCluster::start_small_arrays().expect("start the MaxArraySize=10 cluster");
    let dir = TestDir::new("sweep-arrays");
    let name = unique("grid25");
    let spec = dir.write(
        "sweep.yaml",
        &sweep_spec(&name, "[1, 2, 3, 4, 5]", FIVE_LRS, ""),
    );
    let spec_arg = spec.to_string_lossy().into_owned();
    let sweep_dir = dir.join("runs").join(&name);

    let out = cluster
        .shardrun(dir.path(), &["sweep", "--dry-run", &spec_arg])
        .unwrap();
    let stdout = stdout_of(&out);
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert_eq!(stdout.matches("submit (new)").count(), 25, "{stdout}");
    assert!(
        stdout.contains("arrays of at most 10 tasks: MaxArraySize=10 (scontrol show config)"),
        "{stdout}"
    );
    for line in [
        "would submit 25 point(s) as 3 job array(s)",
        "array 1/3: 10 point(s), --array=0-9",
        "array 2/3: 10 point(s), --array=0-9",
        "array 3/3: 5 point(s), --array=0-4",
        // Each array's sbatch command and script, as sbatch would get them.
        "# array 1/3: submitted held, then released, as (each submission tags it anew)\n# sbatch --parsable --hold --comment=",
        "#SBATCH --array=0-4\n",
    ] {
        assert!(stdout.contains(line), "missing {line:?} in {stdout}");
    }
    assert_eq!(
        stdout.matches("#SBATCH --array=0-9\n").count(),
        2,
        "{stdout}"
    );
    // Slurm is asked whether it would take the first array (`sbatch --test-only`).
    let said = stderr_of(&out);
    assert!(
        said.contains("dry run: Slurm would take array 1/3 (Job "),
        "{said}"
    );
    assert!(!dir.join("runs").exists(), "a dry run writes nothing");

    let out = cluster.shardrun(dir.path(), &["sweep", &spec_arg]).unwrap();
    let stdout = stdout_of(&out);
    assert!(out.status.success(), "{stdout}{}", stderr_of(&out));
    assert!(
        stdout.contains("Submitted 25 point(s) as 3 job array(s)"),
        "{stdout}"
    );
    assert_eq!(
        task_counts(&slurm_arrays(&cluster, &name)),
        [10, 10, 5],
        "Slurm holds three arrays of 10, 10 and 5 tasks"
    );
    all_completed(&cluster, &dir, &sweep_dir, 25);
    let runs = runs_of(&sweep_dir);
    assert_eq!(runs.len(), 25);

    // `shardrun logs` of the sweep's folder names its points, with their values, rather
    // than a missing log.
    let out = cluster
        .shardrun(
            dir.path(),
            &["logs", "--rank", "1", &sweep_dir.to_string_lossy()],
        )
        .unwrap();
    let stderr = stderr_of(&out);
    assert!(!out.status.success(), "{stderr}");
    // Listed by their values, as status lists them: the lowest LR and seed first.
    let listed = stderr
        .lines()
        .find(|l| l.ends_with("(lr=1e-7, seed=1)"))
        .and_then(|l| l.trim().split("  (").next())
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| panic!("{stderr}"));
    assert!(
        stderr.contains("holds 25 run(s)")
            && stderr.lines().nth(1).is_some_and(|l| {
                l.starts_with(&format!("  {}  (", listed.display())) && l.ends_with(')')
            })
            && runs.contains_key(listed.file_name().unwrap().to_str().unwrap())
            && stderr.contains("... and 15 more")
            && stderr.contains(&format!(
                "fix: name one of them: `shardrun logs --rank 1 {}`",
                listed.display()
            )),
        "{stderr}"
    );
    assert!(
        runs.values().all(|(ran, ids)| *ran == 1 && ids.len() == 1),
        "every point ran once, submitted once: {runs:?}"
    );

    // `shardrun status` lists all 25 and which array each is in.
    let out = cluster
        .shardrun(dir.path(), &["status", &sweep_dir.to_string_lossy()])
        .unwrap();
    let table = stdout_of(&out);
    assert!(
        table.starts_with("RUN") && table.contains("ARRAY"),
        "{table}"
    );
    assert_eq!(table.matches(" 1/3 ").count(), 10, "{table}");
    assert_eq!(table.matches(" 2/3 ").count(), 10, "{table}");
    assert_eq!(table.matches(" 3/3 ").count(), 5, "{table}");

    // A point's folder is not a spec: `submit` says what submits it again, and how its
    // values train as a job of their own with the command asked for.
    let first = runs.keys().next().unwrap();
    let point = sweep_dir.join(first);
    let out = cluster
        .shardrun(dir.path(), &["submit", &point.to_string_lossy()])
        .unwrap();
    let stderr = stderr_of(&out);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("is a point of a sweep (")
            && stderr.contains("fix: `shardrun sweep <the sweep's spec>` submits it again")
            && stderr.contains("`shardrun submit <the sweep's spec> --set sweep=null")
            && stderr.contains(&format!("--set name={first}")),
        "{stderr}"
    );

    // The same spec again submits nothing.
    let out = cluster.shardrun(dir.path(), &["sweep", &spec_arg]).unwrap();
    let stdout = stdout_of(&out);
    assert!(stdout.contains("Nothing to submit"), "{stdout}");
    assert_eq!(stdout.matches("skip (COMPLETED)").count(), 25, "{stdout}");
    assert_eq!(slurm_arrays(&cluster, &name).len(), 3, "no new array");

    // One grid value edited (seed 5 -> 6): exactly its 5 points are submitted.
    dir.write(
        "sweep.yaml",
        &sweep_spec(&name, "[1, 2, 3, 4, 6]", FIVE_LRS, ""),
    );
    let out = cluster.shardrun(dir.path(), &["sweep", &spec_arg]).unwrap();
    let stdout = stdout_of(&out);
    assert!(out.status.success(), "{stdout}{}", stderr_of(&out));
    assert_eq!(stdout.matches("skip (COMPLETED)").count(), 20, "{stdout}");
    assert_eq!(stdout.matches("submit (new)").count(), 5, "{stdout}");
    assert!(stdout.contains(" seed=6"), "{stdout}");
    assert!(
        stdout.contains("Submitted 5 point(s) as 1 job array(s)"),
        "{stdout}"
    );
    assert!(
        stdout.contains("5 run(s) in")
            && stdout.contains("belong to no current point")
            && stdout.contains(
                "5 run(s) have swept values the sweep no longer gives (lr=1e-7, seed=5; \
                 lr=1e-6, seed=5; lr=1e-5, seed=5; lr=1e-4, seed=5; 1 more)"
            ),
        "{stdout}"
    );
    // One array: the command to follow it names its job id.
    let job_id = stdout
        .lines()
        .find_map(|line| line.trim().strip_prefix("array 1/1  Slurm job "))
        .and_then(|rest| rest.split_whitespace().next())
        .expect("the array's job id");
    assert!(
        stdout.contains(&format!("/slurm/{name}-{job_id}_<task>.out")),
        "{stdout}"
    );
    let arrays = slurm_arrays(&cluster, &name);
    assert_eq!(task_counts(&arrays), [10, 10, 5, 5]);
    all_completed(&cluster, &dir, &sweep_dir, 30);
    let runs = runs_of(&sweep_dir);
    assert!(
        runs.values().all(|(ran, ids)| *ran == 1 && ids.len() == 1),
        "{runs:?}"
    );
    // The 5 runs of seed 5 are left from the spec before: the tables mark them.
    let sweep_arg = sweep_dir.to_string_lossy().to_string();
    for command in ["status", "metrics"] {
        let out = cluster
            .shardrun(dir.path(), &[command, &sweep_arg])
            .unwrap();
        let table = stdout_of(&out);
        let marked: Vec<Vec<&str>> = table
            .lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .filter(|words| words.get(1) == Some(&"*"))
            .collect();
        // Each marked row: name, mark, lr, seed.
        assert!(
            marked.len() == 5 && marked.iter().all(|words| words[3] == "5"),
            "{command}: {table}"
        );
        assert!(
            table.contains("* left from an earlier version of the sweep's spec"),
            "{command}: {table}"
        );
    }
    let out = cluster
        .shardrun(dir.path(), &["status", "--json", &sweep_arg])
        .unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let superseded: Vec<&serde_json::Value> = doc["runs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["superseded"] == true)
        .collect();
    assert!(
        superseded.len() == 5
            && superseded
                .iter()
                .all(|r| r["sweep_params"]["training.seed"] == 5),
        "{doc}"
    );

    // A value outside the grid that a resumed run may take: the points keep their run
    // directories, finished (they are not asked to train longer).
    let logged = sweep_spec(&name, "[1, 2, 3, 4, 6]", FIVE_LRS, "")
        .replace("  steps: 1\n", "  steps: 1\n  log_every: 7\n");
    dir.write("sweep.yaml", &logged);
    let out = cluster
        .shardrun(dir.path(), &["sweep", "--dry-run", &spec_arg])
        .unwrap();
    let stdout = stdout_of(&out);
    assert!(
        stdout.contains("25 point(s) keep their run directories")
            && stdout.contains("training.log_every: 1 → 7 (25 point(s))")
            && stdout.matches("skip (COMPLETED)").count() == 25
            && stdout.contains("5 run(s) in"),
        "{stdout}"
    );
    // One that changes what they compute as well: every point is new, and the dry run
    // says why.
    dir.write(
        "sweep.yaml",
        &logged.replace(
            "  log_every: 7\n",
            "  log_every: 7\n  optimizer: { weight_decay: 0.1 }\n",
        ),
    );
    let out = cluster
        .shardrun(dir.path(), &["sweep", "--dry-run", &spec_arg])
        .unwrap();
    let stdout = stdout_of(&out);
    assert!(
        stdout.contains("30 run(s) in")
            && stdout.contains(
                "training.optimizer.weight_decay: 0.01 → 0.1 (25 run(s)): their points are new"
            )
            && !stdout.contains("training.log_every: 1 → 7 (25 run(s))")
            && stdout.matches("submit (new)").count() == 25,
        "{stdout}"
    );
}

/// A planning warning of some points (as `shardrun plan` of one would show it) is said
/// once before they are submitted, with how many it concerns.
#[test]
fn a_sweep_says_each_planning_warning_once_with_the_points_it_concerns() {
    let cluster = SlurmCluster::start().expect("start the local Slurm cluster");
    let dir = TestDir::new("sweep-warnings");
    let name = unique("grid-warn");
    let spec = dir.write(
        "sweep.yaml",
        &(sweep_spec(&name, "[1, 2]", FIVE_LRS, "")
            + "    training.fsdp.strategy: [FULL_SHARD, HYBRID_SHARD]\n"),
    );
    let out = cluster
        .shardrun(dir.path(), &["sweep", "--dry-run", &spec.to_string_lossy()])
        .unwrap();
    let stderr = stderr_of(&out);
    assert!(out.status.success(), "{}{stderr}", stdout_of(&out));
    let warning = "warning: HYBRID_SHARD with one shard group of the one rank has no replicas";
    assert_eq!(stderr.matches(warning).count(), 1, "{stderr}");
    assert!(
        stderr.contains("(10 of the 20 points to submit, such as ")
            && stderr.contains("strategy=HYBRID_SHARD"),
        "{stderr}"
    );
}

#[test]
fn the_throttle_holds_across_the_arrays_of_a_sweep() {
    let cluster = SlurmCluster::start_small_arrays().expect("start the MaxArraySize=10 cluster");
    let dir = TestDir::new("sweep-throttle");
    let name = unique("grid-thr");
    // 10 points in arrays of at most 4 (the spec's own limit, below the cluster's 10), at
    // most 2 tasks at once; each task notes when it started and ended.
    let spec = dir.write(
        "sweep.yaml",
        &(sweep_spec(
            &name,
            "[1, 2]",
            FIVE_LRS,
            "",
        )
        .replace(
            "    - exit 0\n",
            "    - 'echo \"start $(date +%s.%N)\" >> times.txt; sleep 2; echo \"end $(date +%s.%N)\" >> times.txt'\n    - exit 0\n",
        )
        + "  throttle: 2\n  limits:\n    max_array_size: 4\n"),
    );
    let spec_arg = spec.to_string_lossy().into_owned();
    let sweep_dir = dir.join("runs").join(&name);
    // The dry run shows each array's sbatch command: the later ones after the one before.
    let out = cluster
        .shardrun(dir.path(), &["sweep", "--dry-run", &spec_arg])
        .unwrap();
    let stdout = stdout_of(&out);
    assert!(out.status.success(), "{stdout}{}", stderr_of(&out));
    let commands: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("# sbatch "))
        .collect();
    assert_eq!(commands.len(), 3, "{stdout}");
    assert!(!commands[0].contains("--dependency"), "{stdout}");
    for (k, command) in commands.iter().enumerate().skip(1) {
        assert!(
            command.contains(&format!("--dependency=afterany:<job id of array {k}>")),
            "{stdout}"
        );
    }
    let out = cluster.shardrun(dir.path(), &["sweep", &spec_arg]).unwrap();
    let stdout = stdout_of(&out);
    assert!(out.status.success(), "{stdout}{}", stderr_of(&out));
    assert!(
        stdout.contains("arrays of at most 4 tasks: sweep.limits.max_array_size=4 (job spec)"),
        "{stdout}"
    );
    assert!(
        stdout.contains("Submitted 10 point(s) as 3 job array(s)"),
        "{stdout}"
    );
    all_completed(&cluster, &dir, &sweep_dir, 10);
    // Every task's [start, end] lies inside the time Slurm ran it, so more than 2 measured
    // at once means more than 2 ran at once.
    let mut events = Vec::new();
    for entry in std::fs::read_dir(&sweep_dir).unwrap().flatten() {
        let Ok(times) = std::fs::read_to_string(entry.path().join("times.txt")) else {
            continue;
        };
        for line in times.lines() {
            let (what, at) = line.split_once(' ').unwrap();
            events.push((at.parse::<f64>().unwrap(), what == "start"));
        }
    }
    assert_eq!(events.len(), 20, "every task started and ended once");
    // At equal times an end comes first: those two tasks did not overlap.
    events.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let (mut running, mut most) = (0, 0);
    for (_, start) in &events {
        running += if *start { 1 } else { -1 };
        most = most.max(running);
    }
    assert!(
        most <= 2,
        "{most} tasks of the sweep ran at once: {events:?}"
    );
    assert_eq!(task_counts(&slurm_arrays(&cluster, &name)), [4, 4, 2]);
}

#[test]
fn a_rejected_array_is_retried_by_the_next_sweep_exactly_once() {
    let cluster = SlurmCluster::start_small_arrays().expect("start the MaxArraySize=10 cluster");
    let dir = TestDir::new("sweep-rejected");
    let name = unique("grid-rej");
    // A partition of this test alone, drained between the first and the second array: Slurm
    // itself rejects the second one.
    let partition = format!("reject{}", std::process::id());
    let scontrol = |args: &[&str]| {
        let out = cluster.command("scontrol").args(args).output().unwrap();
        assert!(
            out.status.success(),
            "scontrol {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    scontrol(&[
        "create",
        &format!("PartitionName={partition}"),
        "Nodes=ALL",
        "State=UP",
    ]);
    struct DeletePartition<'a>(&'a SlurmCluster, String);
    impl Drop for DeletePartition<'_> {
        fn drop(&mut self) {
            let _ = self
                .0
                .command("scontrol")
                .args(["delete", &format!("PartitionName={}", self.1)])
                .output();
        }
    }
    let _cleanup = DeletePartition(&cluster, partition.clone());

    let spec = dir.write(
        "sweep.yaml",
        &sweep_spec(&name, "[1, 2, 3, 4, 5]", FIVE_LRS, "").replace(
            "resources:\n",
            &format!("resources:\n  partition: {partition}\n"),
        ),
    );
    let spec_arg = spec.to_string_lossy().into_owned();
    let sweep_dir = dir.join("runs").join(&name);
    let path = wrap(
        &dir,
        "sbatch",
        SUBMITS,
        2,
        &format!("scontrol update PartitionName={partition} State=DRAIN"),
    );
    let out = cluster
        .shardrun_with_env(dir.path(), &["sweep", &spec_arg], &[("PATH", path)])
        .unwrap();
    let (stdout, stderr) = (stdout_of(&out), stderr_of(&out));
    assert!(!out.status.success(), "{stdout}{stderr}");
    assert!(
        stderr.contains("array 2/3 (10 point(s)) was not accepted"),
        "{stderr}"
    );
    assert!(
        stderr.contains("Required partition not available"),
        "Slurm's own reason: {stderr}"
    );
    assert_eq!(task_counts(&slurm_arrays(&cluster, &name)), [10]);

    // Status shows the rejected array's points, with the array they were in; array 3 was
    // never tried, so its points have no run directory yet.
    let out = cluster
        .shardrun(
            dir.path(),
            &["status", "--json", &sweep_dir.to_string_lossy()],
        )
        .unwrap();
    let lines: Vec<serde_json::Value> = status_runs(&stdout_of(&out));
    assert_eq!(lines.len(), 20, "{lines:?}");
    let failed: Vec<&serde_json::Value> = lines
        .iter()
        .filter(|l| l["state"] == "SUBMIT_FAILED")
        .collect();
    assert_eq!(failed.len(), 10, "{lines:?}");
    assert!(failed.iter().all(|l| l["array"]["index"] == 2
        && l["array"]["count"] == 3
        && l["detail"]
            .as_str()
            .unwrap()
            .contains("Required partition not available")));

    scontrol(&["update", &format!("PartitionName={partition}"), "State=UP"]);
    let out = cluster.shardrun(dir.path(), &["sweep", &spec_arg]).unwrap();
    let stdout = stdout_of(&out);
    assert!(out.status.success(), "{stdout}{}", stderr_of(&out));
    assert_eq!(
        stdout.matches("submit (was SUBMIT_FAILED)").count(),
        10,
        "{stdout}"
    );
    assert_eq!(stdout.matches("submit (new)").count(), 5, "{stdout}");
    assert!(
        stdout.contains("Submitted 15 point(s) as 2 job array(s)"),
        "{stdout}"
    );
    all_completed(&cluster, &dir, &sweep_dir, 25);
    let runs = runs_of(&sweep_dir);
    assert!(
        runs.values().all(|(ran, _)| *ran == 1),
        "every point ran once: {runs:?}"
    );
    let submissions: Vec<usize> = runs.values().map(|(_, ids)| ids.len()).collect();
    assert_eq!(
        submissions.iter().filter(|n| **n == 1).count(),
        25,
        "each point has the one job id it ran as (a rejected array has none): {runs:?}"
    );
    assert_eq!(task_counts(&slurm_arrays(&cluster, &name)), [10, 10, 5]);
    let out = cluster.shardrun(dir.path(), &["sweep", &spec_arg]).unwrap();
    assert!(
        stdout_of(&out).contains("Nothing to submit"),
        "{}",
        stdout_of(&out)
    );
}

#[test]
fn a_sweep_killed_right_after_sbatch_is_finished_by_the_next_one() {
    let cluster = SlurmCluster::start_small_arrays().expect("start the MaxArraySize=10 cluster");
    let dir = TestDir::new("sweep-killed");
    let name = unique("grid-kill");
    let spec = dir.write(
        "sweep.yaml",
        &sweep_spec(&name, "[1, 2, 3, 4, 5]", FIVE_LRS, ""),
    );
    let spec_arg = spec.to_string_lossy().into_owned();
    let sweep_dir = dir.join("runs").join(&name);
    // The second sbatch reaches slurmctld, then shardrun dies before it hears the job id.
    let path = wrap(
        &dir,
        "sbatch",
        SUBMITS,
        2,
        "\"$real\" \"$@\"; kill -9 $PPID; exit 1",
    );
    let out = cluster
        .shardrun_with_env(dir.path(), &["sweep", &spec_arg], &[("PATH", path)])
        .unwrap();
    assert!(!out.status.success(), "shardrun was killed");
    assert_eq!(task_counts(&slurm_arrays(&cluster, &name)), [10, 10]);
    let held = cluster
        .command("squeue")
        .args(["-h", "-n", &name, "-t", "PD", "-o", "%F|%r"])
        .output()
        .unwrap();
    let held = String::from_utf8_lossy(&held.stdout).into_owned();
    assert!(held.contains("JobHeldUser"), "array 2 waits held: {held}");

    let out = cluster.shardrun(dir.path(), &["sweep", &spec_arg]).unwrap();
    let stdout = stdout_of(&out);
    assert!(out.status.success(), "{stdout}{}", stderr_of(&out));
    assert!(
        stdout.contains("of an interrupted `shardrun sweep` was held with its points not written: cancelled, its 10 point(s) are decided again"),
        "{stdout}"
    );
    assert_eq!(stdout.matches("submit (new)").count(), 15, "{stdout}");
    assert!(
        stdout.contains("Submitted 15 point(s) as 2 job array(s)"),
        "{stdout}"
    );
    all_completed(&cluster, &dir, &sweep_dir, 25);
    let runs = runs_of(&sweep_dir);
    assert!(
        runs.values().all(|(ran, ids)| *ran == 1 && ids.len() == 1),
        "nothing ran twice, nothing was lost: {runs:?}"
    );
    assert_eq!(
        arrays_run(&cluster, &name),
        [10, 10, 5],
        "the held array was cancelled before it ran"
    );
    assert!(
        std::fs::read_dir(&sweep_dir).unwrap().all(|e| !e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .contains(".tmp-")),
        "no half-written point left"
    );
}

#[test]
fn a_sweep_killed_before_releasing_an_array_is_finished_by_the_next_one() {
    let cluster = SlurmCluster::start_small_arrays().expect("start the MaxArraySize=10 cluster");
    let dir = TestDir::new("sweep-killed-release");
    let name = unique("grid-rel");
    let spec = dir.write(
        "sweep.yaml",
        &sweep_spec(&name, "[1, 2, 3, 4, 5]", FIVE_LRS, ""),
    );
    let spec_arg = spec.to_string_lossy().into_owned();
    let sweep_dir = dir.join("runs").join(&name);
    // Array 2's points are written with its job ids; shardrun is interrupted (Ctrl-C)
    // before releasing it, and says how to finish.
    let path = wrap(
        &dir,
        "scontrol",
        "[ \"$1\" = release ]",
        2,
        "kill -INT $PPID; exit 1",
    );
    let out = cluster
        .shardrun_with_env(dir.path(), &["sweep", &spec_arg], &[("PATH", path)])
        .unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGINT),
        "ended by the signal"
    );
    assert!(
        stderr_of(&out).ends_with(&format!(
            "shardrun: SIGINT: the sweep stopped; the arrays it submitted stand; `shardrun \
             sweep {spec_arg}` looks up what it left (an array held or not yet recorded) and \
             submits the rest\n"
        )),
        "{}",
        stderr_of(&out)
    );

    let out = cluster.shardrun(dir.path(), &["sweep", &spec_arg]).unwrap();
    let stdout = stdout_of(&out);
    assert!(out.status.success(), "{stdout}{}", stderr_of(&out));
    assert!(
        stdout
            .contains("of an interrupted `shardrun sweep` was accepted and recorded: released now"),
        "{stdout}"
    );
    assert_eq!(stdout.matches("submit (new)").count(), 5, "{stdout}");
    assert!(
        stdout.contains("Submitted 5 point(s) as 1 job array(s)"),
        "{stdout}"
    );
    all_completed(&cluster, &dir, &sweep_dir, 25);
    let runs = runs_of(&sweep_dir);
    assert!(
        runs.values().all(|(ran, ids)| *ran == 1 && ids.len() == 1),
        "nothing ran twice, nothing was lost: {runs:?}"
    );
    assert_eq!(task_counts(&slurm_arrays(&cluster, &name)), [10, 10, 5]);
}

#[test]
fn sbatch_killed_after_slurm_took_the_array_loses_nothing() {
    let cluster = SlurmCluster::start_small_arrays().expect("start the MaxArraySize=10 cluster");
    let dir = TestDir::new("sweep-sbatch-killed");
    let name = unique("grid-sb");
    let spec = dir.write("sweep.yaml", &sweep_spec(&name, "[1, 2, 3]", FIVE_LRS, ""));
    let spec_arg = spec.to_string_lossy().into_owned();
    // The first sbatch dies by a signal after slurmctld accepted its array.
    let path = wrap(&dir, "sbatch", SUBMITS, 1, "\"$real\" \"$@\"; kill -9 $$");
    let out = cluster
        .shardrun_with_env(dir.path(), &["sweep", &spec_arg], &[("PATH", path)])
        .unwrap();
    let stdout = stdout_of(&out);
    assert!(out.status.success(), "{stdout}{}", stderr_of(&out));
    assert!(stdout.contains("but Slurm has array 1/2"), "{stdout}");
    assert!(
        stdout.contains("Submitted 15 point(s) as 2 job array(s)"),
        "{stdout}"
    );
    all_completed(&cluster, &dir, &dir.join("runs").join(&name), 15);
    let runs = runs_of(&dir.join("runs").join(&name));
    assert!(
        runs.values().all(|(ran, ids)| *ran == 1 && ids.len() == 1),
        "{runs:?}"
    );
    assert_eq!(task_counts(&slurm_arrays(&cluster, &name)), [10, 5]);
}

#[test]
fn a_run_root_with_a_space_and_a_quote() {
    let cluster = SlurmCluster::start().expect("start the local Slurm cluster");
    let dir = TestDir::new("sweep-quoted");
    let spec = dir.write(
        "sweep.yaml",
        &sweep_spec(
            "grid",
            "[1, 2]",
            "[1.0e-3, 1.0e-4]",
            "run_root: \"runs/it's a root\"\n",
        ),
    );
    // `--set` changes every point, as the file would.
    let out = cluster
        .shardrun(
            dir.path(),
            &[
                "sweep",
                &spec.to_string_lossy(),
                "--set",
                "training.steps=3",
            ],
        )
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        stdout_of(&out),
        stderr_of(&out)
    );
    let sweep_dir = dir.join("runs/it's a root/grid");
    all_completed(&cluster, &dir, &sweep_dir, 4);
    let runs = runs_of(&sweep_dir);
    assert_eq!(runs.len(), 4);
    assert!(runs.values().all(|(ran, _)| *ran == 1), "{runs:?}");
    for point in runs.keys() {
        let read = |file: &str| -> serde_json::Value {
            serde_json::from_str(
                &std::fs::read_to_string(sweep_dir.join(point).join(file)).unwrap(),
            )
            .unwrap()
        };
        assert_eq!(read("train_config.json")["steps"], 3, "{point}");
        assert_eq!(
            read("resolved.json")["overrides"],
            serde_json::json!(["training.steps=3"]),
            "{point}"
        );
    }
    // Slurm wrote each task's output where the script said, which names the task as squeue
    // and the point's manifest do.
    let logs = std::fs::read_dir(sweep_dir.join("slurm")).unwrap().count();
    assert_eq!(logs, 8, "an .out and an .err per task");
    for (_, ids) in runs.values() {
        let id = &ids[0];
        let out = std::fs::read_dir(sweep_dir.join("slurm"))
            .unwrap()
            .flatten()
            .find(|e| {
                e.file_name()
                    .to_string_lossy()
                    .ends_with(&format!("-{id}.out"))
            })
            .unwrap_or_else(|| panic!("no output file of task {id}"));
        let text = std::fs::read_to_string(out.path()).unwrap();
        assert!(
            text.starts_with(&format!("shardrun: job {id} on ")),
            "{text}"
        );
    }
}

#[test]
fn failed_points_are_resubmitted() {
    let cluster = SlurmCluster::start().expect("start the local Slurm cluster");
    let dir = TestDir::new("sweep-retry");
    // The points with seed 2 fail the first time only (their run directory remembers).
    let text = sweep_spec("grid", "[1, 2]", "[1.0e-3, 1.0e-4]", "").replace(
        "    - exit 0\n",
        "    - 'if [ \"$(grep -o seed.:.2 train_config.json)\" ] && [ ! -e tried ]; then touch tried; exit 5; fi'\n    - exit 0\n",
    );
    let spec = dir.write("sweep.yaml", &text);
    let spec_arg = spec.to_string_lossy().into_owned();
    let out = cluster.shardrun(dir.path(), &["sweep", &spec_arg]).unwrap();
    assert!(out.status.success(), "{}", stderr_of(&out));
    let sweep_dir = dir.join("runs/grid");
    let ended = wait_for_points(&cluster, &dir, &sweep_dir, 4, |s| {
        s == "COMPLETED" || s == "FAILED"
    });
    assert_eq!(
        ended.iter().filter(|(_, s)| s == "FAILED").count(),
        2,
        "{ended:?}"
    );
    let out = cluster.shardrun(dir.path(), &["sweep", &spec_arg]).unwrap();
    let stdout = stdout_of(&out);
    assert_eq!(stdout.matches("submit (was FAILED)").count(), 2, "{stdout}");
    assert_eq!(stdout.matches("skip (COMPLETED)").count(), 2, "{stdout}");
    all_completed(&cluster, &dir, &sweep_dir, 4);

    // A point's directory holds no spec: `plan` shows the plan it recorded and ran.
    let point = std::fs::read_dir(&sweep_dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.join("resolved.json").is_file())
        .expect("a point directory");
    let point_arg = point.to_string_lossy().into_owned();
    let recorded: serde_json::Value =
        serde_json::from_slice(&std::fs::read(point.join("resolved.json")).unwrap()).unwrap();
    let lr = recorded["train"]["optimizer"]["lr"].as_f64().unwrap();
    let out = cluster.shardrun(dir.path(), &["plan", &point_arg]).unwrap();
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert!(
        [format!("AdamW lr {lr} "), format!("AdamW lr {lr:e} ")]
            .iter()
            .any(|said| stdout_of(&out).contains(said)),
        "{}",
        stdout_of(&out)
    );
    let out = cluster
        .shardrun(
            dir.path(),
            &["plan", &point_arg, "--set", "training.steps=9"],
        )
        .unwrap();
    assert!(!out.status.success());
    assert!(
        stderr_of(&out).contains("is a sweep point"),
        "{}",
        stderr_of(&out)
    );

    // Files deleted or damaged by hand: a point without its resolved job is still a
    // finished run to skip; one without a manifest that reads is not a run, so it is left
    // out, saying which and why, and the others are decided as usual (no array is submitted
    // only to fail on it, and the damaged manifest stops nothing).
    let mut points: Vec<_> = std::fs::read_dir(&sweep_dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("manifest.json").is_file())
        .collect();
    points.sort();
    std::fs::remove_file(points[0].join("resolved.json")).unwrap();
    std::fs::remove_file(points[1].join("manifest.json")).unwrap();
    std::fs::write(points[2].join("manifest.json"), "{\"version\": 1, \"na").unwrap();
    let out = cluster.shardrun(dir.path(), &["sweep", &spec_arg]).unwrap();
    let stdout = stdout_of(&out);
    assert!(out.status.success(), "{stdout}{}", stderr_of(&out));
    assert_eq!(stdout.matches("skip (COMPLETED)").count(), 2, "{stdout}");
    assert_eq!(
        stdout.matches("skip (folder not a run)").count(),
        2,
        "{stdout}"
    );
    let said = |point: &Path, why: &str| {
        stdout.contains(&format!(
            "2 point(s) have a folder that is not a run directory to read, so they are not \
             submitted (their jobs would fail on it, and their arrays' other points with \
             them). The first, {}: {why}",
            point.display()
        ))
    };
    assert!(
        (said(&points[1], "it has no manifest.json.")
            || said(&points[2], "its manifest.json does not read ("))
            && stdout.contains("Nothing to submit"),
        "{stdout}"
    );
}

/// Points cancelled while their array tasks wait are CANCELLED: Slurm keeps no record of an
/// array task cancelled while pending (neither squeue nor scontrol knows it), and without
/// accounting nothing else says how it ended; a point that never started is no failure.
#[test]
fn points_cancelled_while_queued_are_cancelled_not_failed() {
    let cluster = SlurmCluster::start().expect("start the local Slurm cluster");
    let dir = TestDir::new("sweep-cancel-queued");
    let name = unique("queued");
    // The tasks may start in an hour: they wait (BeginTime) until cancelled.
    let text = sweep_spec(&name, "[1, 2]", "[1.0e-3]", "").replace(
        "resources:\n",
        "resources:\n  extra_sbatch: [\"--begin=now+3600\"]\n",
    );
    let spec = dir.write("sweep.yaml", &text);
    let spec_arg = spec.to_string_lossy().into_owned();
    let out = cluster.shardrun(dir.path(), &["sweep", &spec_arg]).unwrap();
    assert!(out.status.success(), "{}", stderr_of(&out));
    let sweep_dir = dir.join("runs").join(&name);
    let sweep_arg = sweep_dir.to_string_lossy().into_owned();
    wait_for_points(&cluster, &dir, &sweep_dir, 2, |s| s == "SUBMITTED");
    // A change the queued points may take: they keep their directories, and their jobs go
    // on as submitted until the sweep next submits them.
    let logged = text.replace("  steps: 1\n", "  steps: 1\n  log_every: 7\n");
    let changed = dir.write("changed.yaml", &logged);
    let out = cluster
        .shardrun(
            dir.path(),
            &["sweep", "--dry-run", &changed.to_string_lossy()],
        )
        .unwrap();
    let stdout = stdout_of(&out);
    assert!(
        stdout.contains("2 point(s) keep their run directories")
            && stdout.contains("2 of them are queued or running: their jobs go on as submitted")
            && stdout.matches("skip (SUBMITTED)").count() == 2,
        "{stdout}"
    );
    // A change that makes every point new, under a throttle: the new array waits for the
    // one still queued, and the sweep says those runs are still going.
    let queued_array = runs_of(&sweep_dir)
        .values()
        .flat_map(|(_, ids)| ids.clone())
        .next()
        .map(|id| id.split('_').next().unwrap().to_string())
        .expect("a job id of the queued points");
    let renewed = dir.write(
        "renewed.yaml",
        &text.replace("hidden_dim: 8", "hidden_dim: 16"),
    );
    let out = cluster
        .shardrun(
            dir.path(),
            &[
                "sweep",
                "--dry-run",
                "--throttle",
                "1",
                &renewed.to_string_lossy(),
            ],
        )
        .unwrap();
    let stdout = stdout_of(&out);
    assert!(
        stdout.contains(
            "2 run(s) of an earlier version of this sweep's spec are still queued or running \
             (the throttle holds"
        ) && stdout.lines().any(|l| l.starts_with("# sbatch ")
            && l.contains(&format!("--dependency=afterany:{queued_array}"))),
        "{stdout}"
    );
    let out = cluster
        .shardrun(dir.path(), &["cancel", &sweep_arg])
        .unwrap();
    assert!(out.status.success(), "{}", stderr_of(&out));
    // The array's tasks as Slurm writes them, not one id each.
    assert!(
        stdout_of(&out).starts_with(&format!("Cancelled Slurm job(s) {queued_array}_[0-1];")),
        "{}",
        stdout_of(&out)
    );
    wait_for_points(&cluster, &dir, &sweep_dir, 2, |s| s == "CANCELLED");
    let out = cluster
        .shardrun(dir.path(), &["status", &sweep_arg])
        .unwrap();
    let table = stdout_of(&out);
    assert_eq!(
        table.matches("without having started").count(),
        2,
        "{table}"
    );
    let out = cluster
        .shardrun(dir.path(), &["sweep", "--dry-run", &spec_arg])
        .unwrap();
    let stdout = stdout_of(&out);
    assert_eq!(
        stdout.matches("submit (was CANCELLED)").count(),
        2,
        "{stdout}"
    );
}

/// A point cancelled after a checkpoint past the steps the sweep then asks for has nothing
/// left to train: the sweep skips it and says why, rather than submit a job that would end it
/// "finished" at a step past its schedule.
#[test]
fn a_point_stopped_past_the_steps_now_asked_for_is_not_resubmitted() {
    let cluster = SlurmCluster::start().expect("start the local Slurm cluster");
    let dir = TestDir::new("sweep-past");
    let name = unique("past");
    let text = |steps: u64| {
        format!(
            "{}  checkpoint: {{ interval_steps: 20 }}\nsweep:\n  grid:\n    training.seed: [1]\n",
            shardrun_e2e::jobs::tiny_mlp_spec(&name, steps, 1)
        )
    };
    let spec = dir.write("sweep.yaml", &text(1_000_000));
    let spec_arg = spec.to_string_lossy().into_owned();
    let out = cluster.shardrun(dir.path(), &["sweep", &spec_arg]).unwrap();
    assert!(out.status.success(), "{}", stderr_of(&out));
    let sweep_dir = dir.join("runs").join(&name);
    // Any checkpoint: the older ones are deleted as newer ones are saved.
    let checkpointed = |point: std::path::PathBuf| {
        std::fs::read_dir(point.join("checkpoints"))
            .into_iter()
            .flatten()
            .flatten()
            .any(|c| c.path().join("COMPLETE").exists())
    };
    wait_for("a checkpoint", DEADLINE, || {
        std::fs::read_dir(&sweep_dir)
            .ok()?
            .flatten()
            .any(|p| checkpointed(p.path()))
            .then_some(())
    })
    .unwrap();
    let out = cluster
        .shardrun(dir.path(), &["cancel", &sweep_dir.to_string_lossy()])
        .unwrap();
    assert!(out.status.success(), "{}", stderr_of(&out));
    wait_for_points(&cluster, &dir, &sweep_dir, 1, |s| s == "CANCELLED");

    dir.write("sweep.yaml", &text(10));
    let out = cluster
        .shardrun(dir.path(), &["sweep", &spec_arg, "--dry-run"])
        .unwrap();
    let stdout = stdout_of(&out);
    assert!(out.status.success(), "{stdout}{}", stderr_of(&out));
    assert!(stdout.contains("skip (CANCELLED at step "), "{stdout}");
    assert!(
        stdout.contains("1 point(s) that did not finish have a checkpoint at or past the steps"),
        "{stdout}"
    );
    let out = cluster.shardrun(dir.path(), &["sweep", &spec_arg]).unwrap();
    let stdout = stdout_of(&out);
    assert!(out.status.success(), "{stdout}{}", stderr_of(&out));
    assert!(stdout.contains("Nothing to submit"), "{stdout}");
}

/// A finished point asked for more steps whose newest checkpoint cannot be read (its
/// metadata without read permission, the sweep made without root's bypass of file
/// permissions) keeps its directory and is held back with the cause and the fix: not
/// submitted only for its ranks to refuse it, nor trained again from step 1 in a new
/// directory. Once it reads, the next sweep continues it where it stopped.
#[test]
fn a_point_whose_checkpoint_cannot_be_read_is_held_back_not_started_over() {
    use std::os::unix::fs::PermissionsExt;
    let cluster = SlurmCluster::start().expect("start the local Slurm cluster");
    let dir = TestDir::new("sweep-unreadable");
    let name = unique("unreadable");
    let text = |steps: u64| {
        format!(
            "{}  checkpoint: {{ interval_steps: 2 }}\nsweep:\n  grid:\n    training.seed: [1]\n",
            shardrun_e2e::jobs::tiny_mlp_spec(&name, steps, 1)
        )
    };
    let spec = dir.write("sweep.yaml", &text(4));
    let spec_arg = spec.to_string_lossy().into_owned();
    let out = cluster.shardrun(dir.path(), &["sweep", &spec_arg]).unwrap();
    assert!(out.status.success(), "{}", stderr_of(&out));
    let sweep_dir = dir.join("runs").join(&name);
    all_completed(&cluster, &dir, &sweep_dir, 1);
    let point_dirs = || -> Vec<PathBuf> {
        let mut dirs: Vec<PathBuf> = std::fs::read_dir(&sweep_dir)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.join("manifest.json").exists())
            .collect();
        dirs.sort();
        dirs
    };
    let points = point_dirs();
    assert_eq!(points.len(), 1, "{points:?}");
    let point = &points[0];
    let metadata = point.join("checkpoints/step-4/metadata.json");
    let mode = |mode| std::fs::set_permissions(&metadata, std::fs::Permissions::from_mode(mode));
    mode(0o000).unwrap();

    dir.write("sweep.yaml", &text(8));
    // Root reads any file: the sweep goes without the capabilities that let it.
    let mut cmd = without_root_read_bypass(shardrun());
    cmd.env("SLURM_CONF", cluster.slurm_conf())
        .current_dir(dir.path())
        .args(["sweep", &spec_arg]);
    let out = run_with_deadline(&mut cmd, Duration::from_secs(60))
        .expect("the sweep (as root it needs setpriv, from util-linux, to drop its bypass)");
    let stdout = stdout_of(&out);
    assert!(out.status.success(), "{stdout}{}", stderr_of(&out));
    for expected in [
        "skip (checkpoint unreadable)",
        "1 point(s) to continue have a newest checkpoint that cannot be read",
        &format!("{}: cannot read: Permission denied", metadata.display()),
        "not known to be damaged",
        "Nothing to submit",
    ] {
        assert!(
            stdout.contains(expected),
            "{expected:?} missing from:\n{stdout}"
        );
    }
    assert_eq!(
        point_dirs(),
        points,
        "the sweep made a directory to start over in"
    );

    mode(0o644).unwrap();
    let out = cluster.shardrun(dir.path(), &["sweep", &spec_arg]).unwrap();
    let stdout = stdout_of(&out);
    assert!(out.status.success(), "{stdout}{}", stderr_of(&out));
    assert!(stdout.contains("submit (was COMPLETED)"), "{stdout}");
    all_completed(&cluster, &dir, &sweep_dir, 1);
    assert_eq!(point_dirs(), points);
    let steps: Vec<u64> = shardrun_e2e::jobs::step_records(point)
        .iter()
        .filter_map(|r| r["step"].as_u64())
        .collect();
    assert_eq!(
        steps,
        (1..=8).collect::<Vec<u64>>(),
        "continued from step 4"
    );
}

#[test]
fn a_diverged_point_is_not_continued_when_the_sweep_asks_for_more_steps() {
    let cluster = SlurmCluster::start().expect("start the local Slurm cluster");
    let dir = TestDir::new("sweep-diverged");
    let name = unique("diverged");
    // One learning rate trains; the other overflows the loss within a few steps.
    let text = |steps: u64| {
        format!(
            "{}sweep:\n  grid:\n    training.optimizer.lr: [1.0e-3, 1.0e+30]\n",
            shardrun_e2e::jobs::tiny_mlp_spec(&name, steps, 1)
        )
    };
    let spec = dir.write("sweep.yaml", &text(6));
    let spec_arg = spec.to_string_lossy().into_owned();
    let out = cluster.shardrun(dir.path(), &["sweep", &spec_arg]).unwrap();
    assert!(out.status.success(), "{}", stderr_of(&out));
    let sweep_dir = dir.join("runs").join(&name);
    all_completed(&cluster, &dir, &sweep_dir, 2);
    // Each point's (step, loss is null) records, the diverged point's first.
    let points = || -> Vec<Vec<(u64, bool)>> {
        let mut points: Vec<Vec<(u64, bool)>> = std::fs::read_dir(&sweep_dir)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|point| point.join("metrics.jsonl").exists())
            .map(|point| {
                shardrun_e2e::jobs::step_records(&point)
                    .iter()
                    .filter_map(|r| {
                        let diverged = r["loss"].is_null() || r["grad_norm"].is_null();
                        Some((r["step"].as_u64()?, diverged))
                    })
                    .collect()
            })
            .collect();
        points.sort_by_key(|steps: &Vec<(u64, bool)>| !steps.iter().any(|(_, null)| *null));
        points
    };
    let before = points();
    assert_eq!(before.len(), 2, "{before:?}");
    let first = before[0]
        .iter()
        .find(|(_, null)| *null)
        .map(|(step, _)| *step)
        .unwrap_or_else(|| panic!("no point's loss went non-finite: {before:?}"));
    assert!(!before[1].iter().any(|(_, null)| *null), "{before:?}");

    // The same sweep again: both finished, and the one that diverged on the way is said so,
    // not skipped as if its final loss were a result.
    let out = cluster
        .shardrun(dir.path(), &["sweep", "--dry-run", &spec_arg])
        .unwrap();
    let stdout = stdout_of(&out);
    assert!(out.status.success(), "{stdout}{}", stderr_of(&out));
    assert!(
        stdout.contains(&format!("skip (COMPLETED, diverged at step {first})"))
            && stdout.matches("skip (COMPLETED)").count() == 1
            && stdout.contains("1 finished point(s) diverged on the way"),
        "{stdout}"
    );

    dir.write("sweep.yaml", &text(9));
    let out = cluster.shardrun(dir.path(), &["sweep", &spec_arg]).unwrap();
    let stdout = stdout_of(&out);
    assert!(out.status.success(), "{stdout}{}", stderr_of(&out));
    assert!(
        stdout.contains(&format!("skip (diverged at step {first})")),
        "{stdout}"
    );
    assert!(stdout.contains("submit (was COMPLETED)"), "{stdout}");
    // The points' keys line up after decisions of any length.
    let key_columns: std::collections::BTreeSet<usize> = stdout
        .lines()
        .filter(|l| l.starts_with("skip (") || l.starts_with("submit ("))
        .map(|l| {
            let after = l.find(')').unwrap() + 1;
            after + l[after..].len() - l[after..].trim_start().len()
        })
        .collect();
    assert_eq!(key_columns.len(), 1, "{stdout}");
    assert!(
        stdout.contains(
            "1 point(s) diverged (their loss or gradients went NaN or inf, or the loss blew up): continuing would train on from diverged weights"
        ),
        "{stdout}"
    );
    // Both points take the longer schedule, but the diverged one is said not to go on.
    assert!(
        stdout.contains("2 point(s) keep their run directories")
            && stdout.contains("  1 point(s) continue on a re-shaped LR schedule")
            && stdout.contains("  1 of them are not submitted (said below)"),
        "{stdout}"
    );
    all_completed(&cluster, &dir, &sweep_dir, 2);
    let out = cluster
        .shardrun(
            dir.path(),
            &["metrics", "--json", &sweep_dir.to_string_lossy()],
        )
        .unwrap();
    let json: serde_json::Value = serde_json::from_str(&stdout_of(&out)).unwrap();
    let mut diverged_from: Vec<serde_json::Value> = json["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["diverged_from"].clone())
        .collect();
    diverged_from.sort_by_key(|v| v.is_null());
    assert_eq!(
        diverged_from,
        [serde_json::json!(first), serde_json::Value::Null]
    );
    let out = cluster
        .shardrun(dir.path(), &["metrics", &sweep_dir.to_string_lossy()])
        .unwrap();
    let table = stdout_of(&out);
    assert!(
        table
            .lines()
            .any(|l| l.contains("1e30") && l.contains(" diverged "))
            && table
                .lines()
                .any(|l| l.contains("1e-3") && l.contains(" succeeded ")),
        "{table}"
    );
    let after = points();
    assert_eq!(
        after[0], before[0],
        "the diverged point trained nothing more"
    );
    assert_eq!(
        after[1].last().map(|(step, _)| *step),
        Some(9),
        "the good point went on: {after:?}"
    );

    // Ended FAILED (as a lost node leaves it) with their checkpoints deleted, both points
    // have nothing to resume. Started over, the diverged one would diverge at the same step
    // again: it stays skipped. The other trains again from step 1, which the sweep says.
    let (diverged_dir, good_dir): (Vec<PathBuf>, Vec<PathBuf>) = std::fs::read_dir(&sweep_dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("metrics.jsonl").exists())
        .partition(|p| {
            let records = shardrun_e2e::jobs::step_records(p);
            records.iter().any(|r| r["loss"].is_null())
        });
    assert_eq!((diverged_dir.len(), good_dir.len()), (1, 1));
    for point in diverged_dir.iter().chain(&good_dir) {
        std::fs::remove_dir_all(point.join("checkpoints")).unwrap();
        let manifest = point.join("manifest.json");
        let text_of = std::fs::read_to_string(&manifest).unwrap();
        assert!(text_of.contains("\"state\": \"COMPLETED\""), "{text_of}");
        std::fs::write(
            &manifest,
            text_of.replace("\"state\": \"COMPLETED\"", "\"state\": \"FAILED\""),
        )
        .unwrap();
    }
    let out = cluster
        .shardrun(dir.path(), &["sweep", "--dry-run", &spec_arg])
        .unwrap();
    let stdout = stdout_of(&out);
    assert!(
        stdout.contains(&format!("skip (diverged at step {first})"))
            && stdout.contains("submit (was FAILED, anew)")
            && stdout.contains(&format!(
                "1 point(s) to submit again logged steps but have no checkpoint to resume from \
                 (`anew`): they train again from step 1, their metrics replaced. The first, {}",
                good_dir[0].display()
            )),
        "{stdout}"
    );
}
