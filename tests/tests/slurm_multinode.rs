//! Two Slurm nodes with separate network stacks (this host and a network + UTS namespace
//! behind a veth pair, `slurm/start.sh --nodes 2`): a job spanning both finds the controller
//! through the batch host's name, its ranks reach each other's collective listeners across
//! the nodes, a rank dying on the far node fails the job naming that rank and node, and the
//! far node lost under a job is named in the verdict of the job Slurm requeues.

use shardrun_e2e::jobs::*;
use shardrun_e2e::*;
use std::path::Path;
use std::sync::RwLock;
use std::time::Duration;

/// Taken for writing by a test that takes a node down (every job of the cluster would lose
/// it), for reading by the others.
static NODES: RwLock<()> = RwLock::new(());

/// The tiny MLP on 2 nodes × `per_node` ranks; `fsdp` is the `training.fsdp` mapping.
fn two_node_spec(name: &str, steps: u64, per_node: u64, fsdp: &str) -> String {
    format!(
        "name: {name}\nresources:\n  nodes: 2\n  tasks_per_node: {per_node}\n  cpus_per_task: 1\n  \
         time: \"00:05:00\"\ntraining:\n  model: {{ kind: mlp, input_dim: 16, hidden_dim: 32, \
         output_dim: 16 }}\n  steps: {steps}\n  total_batch_size: {}\n  batch_size_per_device: 4\n  \
         fsdp: {fsdp}\n",
        8 * per_node
    )
}

/// Submits `spec` (with `envs` for the job), waits for its result.json.
fn submit_and_wait(
    cluster: &SlurmCluster,
    dir: &TestDir,
    name: &str,
    spec: &Path,
    envs: &[(&str, String)],
) -> (String, String) {
    let job_id = cluster
        .submit_with_env(dir.path(), &[&spec.to_string_lossy()], envs)
        .job_id;
    let run = dir.join(format!("runs/{name}"));
    let result = wait_for_file(&run.join("result.json"), Duration::from_secs(300), |t| {
        t.ends_with('}')
    });
    let slurm_out =
        std::fs::read_to_string(run.join(format!("{name}-{job_id}.out"))).unwrap_or_default();
    let result = result.unwrap_or_else(|e| panic!("{e}\nSlurm output:\n{slurm_out}"));
    let log = std::fs::read_to_string(run.join("train.log")).unwrap_or_default();
    (result, log)
}

#[test]
fn training_spans_two_nodes_and_a_rank_dying_on_the_far_node_is_named() {
    let _nodes = NODES.read().unwrap_or_else(|e| e.into_inner());
    let cluster = SlurmCluster::start_two_nodes().expect("start the two-node Slurm cluster");
    let (near, far) = (hostname(), format!("{}-n2", hostname()));

    let dir = TestDir::new("slurm-2n");
    let spec = dir.write(
        "train.yaml",
        &two_node_spec("twonode", 5, 1, "{ strategy: FULL_SHARD }"),
    );
    let (result, log) = submit_and_wait(&cluster, &dir, "twonode", &spec, &[]);
    assert!(result.contains("\"succeeded\""), "{result}\n{log}");
    assert!(
        log.contains(&format!("rank 0 of 2 joined on {near} ")),
        "{log}"
    );
    assert!(
        log.contains(&format!("rank 1 of 2 joined on {far} ")),
        "{log}"
    );
    assert!(
        log.contains(&format!("registered on 2 host(s) ({near}, {far})")),
        "{log}"
    );
    let run = dir.join("runs/twonode");
    assert_eq!(metric_steps(&run, 0), (1..=5).collect::<Vec<_>>());

    // Rank 1 (on the far node) SIGKILLs itself at step 3: srun's end or the dropped
    // connection reaches the controller on this node, which names the rank and its node.
    let spec = dir.write(
        "die.yaml",
        &two_node_spec("farkill", 1000, 1, "{ strategy: FULL_SHARD }"),
    );
    let envs = [
        ("SHARDRUN_WORKER_BIN", simrank()),
        ("SIMRANK_STEP_MS", "50".to_string()),
        ("SIMRANK_DIE_RANK", "1".to_string()),
        ("SIMRANK_DIE_AT_STEP", "3".to_string()),
    ];
    let (result, log) = submit_and_wait(&cluster, &dir, "farkill", &spec, &envs);
    let parsed: serde_json::Value = serde_json::from_str(&result).unwrap();
    assert_eq!(
        (parsed["status"].as_str(), parsed["rank"].as_u64()),
        (Some("failed"), Some(1)),
        "{result}\n{log}"
    );
    assert!(result.contains(&far), "the far node is named: {result}");
    // How it died, as srun tells it ("task 1: Killed"): the controller saw only the
    // connection end.
    assert_eq!(parsed["exit"], serde_json::json!({"signal": 9}), "{result}");
    assert!(
        parsed["message"]
            .as_str()
            .is_some_and(|m| m.contains("died with signal 9 (SIGKILL)")),
        "{result}"
    );
    for step in 1..=3 {
        let line = format!("[rank 1] rank 1 step {step} line 0");
        assert!(log.contains(&line), "missing {line}:\n{log}");
    }
}

#[test]
fn hybrid_shard_shards_within_a_node_and_replicates_across_nodes() {
    let _nodes = NODES.read().unwrap_or_else(|e| e.into_inner());
    let cluster = SlurmCluster::start_two_nodes().expect("start the two-node Slurm cluster");
    let (near, far) = (hostname(), format!("{}-n2", hostname()));
    let dir = TestDir::new("slurm-2n-hybrid");
    // 2 nodes × 2 ranks: shard groups of 2 (the ranks per node), replicated across nodes.
    let spec = dir.write(
        "hybrid.yaml",
        &two_node_spec("hybrid", 5, 2, "{ strategy: HYBRID_SHARD }"),
    );
    let (result, log) = submit_and_wait(&cluster, &dir, "hybrid", &spec, &[]);
    assert!(result.contains("\"succeeded\""), "{result}\n{log}");
    for (rank, host) in [(0, &near), (1, &near), (2, &far), (3, &far)] {
        assert!(
            log.contains(&format!("rank {rank} of 4 joined on {host} ")),
            "rank {rank} on {host}:\n{log}"
        );
    }
    assert!(log.contains("HYBRID_SHARD"), "{log}");
    let run = dir.join("runs/hybrid");
    assert_eq!(metric_steps(&run, 0), (1..=5).collect::<Vec<_>>());
}

/// The far node goes down mid-run (`scontrol update state=down`, as slurmctld marks a node
/// that stops answering): srun says "Node failure on <node>", Slurm requeues the job, and
/// the verdict that `shardrun status` shows names the node, with how to keep jobs off it.
#[test]
fn a_node_lost_under_a_job_is_named_in_the_verdict_of_its_requeue() {
    let _nodes = NODES.write().unwrap_or_else(|e| e.into_inner());
    let cluster = SlurmCluster::start_two_nodes().expect("start the two-node Slurm cluster");
    let far = format!("{}-n2", hostname());
    let dir = TestDir::new("slurm-2n-node-lost");
    let spec = dir.write(
        "lost.yaml",
        "name: lost\nresources:\n  nodes: 2\n  tasks_per_node: 1\n  cpus_per_task: 1\n  \
         time: \"00:05:00\"\ntraining:\n  model: { kind: mlp, input_dim: 256, hidden_dim: 1024, \
         output_dim: 256 }\n  steps: 100000\n  total_batch_size: 64\n  batch_size_per_device: 32\n  \
         checkpoint: { interval_steps: 50 }\n",
    );
    let job_id = cluster
        .submit(dir.path(), &[&spec.to_string_lossy()])
        .job_id;
    let run = dir.join("runs/lost");
    let log = || std::fs::read_to_string(run.join("train.log")).unwrap_or_default();
    wait_for_steps(&run, 60, "the job to train", Duration::from_secs(120));

    let mut down = cluster.command("scontrol");
    down.args([
        "update",
        &format!("nodename={far}"),
        "state=down",
        "reason=lost in a test",
    ]);
    let out = run_with_deadline(&mut down, Duration::from_secs(30)).unwrap();
    assert!(out.status.success(), "{}", stderr_of(&out));
    let result = wait_for_file(&run.join("result.json"), Duration::from_secs(120), |t| {
        t.ends_with('}')
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", log()));
    let verdict: serde_json::Value = serde_json::from_str(&result).unwrap();
    let ended = verdict["ended"].as_str().unwrap_or_default();
    let message = verdict["message"].as_str().unwrap_or_default();
    assert_eq!(verdict["notice"], "slurm_requeue", "{result}\n{}", log());
    assert!(
        ended.starts_with("was requeued by Slurm after step ")
            && ended.ends_with(&format!(" (Slurm lost node {far})")),
        "{result}"
    );
    assert!(
        message.ends_with(&format!(
            "; Slurm queues the job again, which resumes from it; `sinfo -R` says why Slurm \
             lost {far}, and `resources.extra_sbatch: [\"--exclude={far}\"]` keeps jobs off it"
        )),
        "{result}"
    );
    let status = cluster
        .shardrun(dir.path(), &["status", "runs/lost"])
        .unwrap();
    let status = String::from_utf8_lossy(&status.stdout);
    assert!(
        status.contains(&format!("(Slurm lost node {far})")),
        "{status}"
    );

    // The requeued job is not waited for; the node is back (ReturnToService=2) before the
    // other tests run.
    let mut cancel = cluster.command("scancel");
    cancel.arg(&job_id);
    assert!(run_with_deadline(&mut cancel, Duration::from_secs(30))
        .unwrap()
        .status
        .success());
    let mut resume = cluster.command("scontrol");
    resume.args(["update", &format!("nodename={far}"), "state=resume"]);
    let _ = run_with_deadline(&mut resume, Duration::from_secs(30));
    wait_for("the far node back", Duration::from_secs(120), || {
        let mut sinfo = cluster.command("sinfo");
        sinfo.args(["--noheader", "--Node", "--nodes", &far, "--format=%T"]);
        let out = run_with_deadline(&mut sinfo, Duration::from_secs(30)).ok()?;
        (String::from_utf8_lossy(&out.stdout).trim() == "idle").then_some(())
    })
    .unwrap();
}
