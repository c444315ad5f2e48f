//! GPU jobs where the GPUs are not usable, on this machine and on the project's real Slurm
//! (whose node has two fake GPUs through gres, as character devices no CUDA can use):
//! * `shardrun run --device cuda`, or of a spec with `gpus_per_node`, refuses more ranks than
//!   the machine has GPUs (here: any), with one error naming the machine and what asked for
//!   CUDA, before creating anything;
//! * a submitted GPU job gets its GPUs from Slurm (`--gres=gpu:<type>:N` in the script, N of
//!   them for the step), every rank finds them unusable, and the controller fails the job
//!   once, naming the node and what the rank was given, before training; a type the cluster
//!   does not have is refused at submission.

use shardrun_e2e::jobs::*;
use shardrun_e2e::*;
use std::path::Path;
use std::time::Duration;

#[test]
fn local_runs_refuse_more_ranks_than_gpus_naming_the_machine() {
    let dir = TestDir::new("gpu-local");
    let spec = dir.write("tiny.yaml", &tiny_mlp_spec("gpulocal", 5, 2));
    let gpus = std::fs::read_dir("/proc/driver/nvidia/gpus").map_or(0, |d| d.count());
    let ranks = (gpus + 1).to_string();
    let (out, run) = run_local(
        &dir,
        &spec,
        &["--device", "cuda", "--nproc", &ranks],
        &[],
        Duration::from_secs(60),
    );
    let stderr = stderr_of(&out);
    assert_ne!(out.status.code(), Some(0), "{stderr}");
    let host = hostname();
    let expected = if gpus == 0 {
        format!("--device cuda asks for CUDA, but this machine ({host}) has no GPU")
    } else {
        format!(
            "{ranks} ranks on CUDA (--device cuda), but this machine ({host}) has {gpus} GPU(s)"
        )
    };
    assert_eq!(stderr.matches(&expected).count(), 1, "{stderr}");
    assert!(stderr.contains("--device cpu"), "{stderr}");
    assert!(!run.exists(), "nothing is created for a refused run");
}

#[test]
fn a_local_run_of_a_gpu_spec_names_the_field_that_asks_for_cuda() {
    let dir = TestDir::new("gpu-spec-local");
    let spec = dir.write("gpu.yaml", &gpu_spec("gpuspec"));
    // No GPU is visible, whatever the machine has.
    let (out, run) = run_local(
        &dir,
        &spec,
        &[],
        &[("CUDA_VISIBLE_DEVICES", String::new())],
        Duration::from_secs(60),
    );
    let stderr = stderr_of(&out);
    assert_ne!(out.status.code(), Some(0), "{stderr}");
    let expected = format!(
        "`resources.gpus_per_node: 2` in {} asks for CUDA, but this machine ({}) has no GPU",
        spec.display(),
        hostname()
    );
    assert_eq!(stderr.matches(&expected).count(), 1, "{stderr}");
    assert!(!stderr.contains("device: cuda"), "{stderr}");
    assert!(stderr.contains("--device cpu"), "{stderr}");
    assert!(!run.exists(), "nothing is created for a refused run");
}

fn gpu_spec(name: &str) -> String {
    format!(
        "name: {name}\nresources:\n  nodes: 1\n  gpus_per_node: 2\n  cpus_per_task: 1\n  \
         time: \"00:05:00\"\ntraining:\n  model: {{ kind: mlp, input_dim: 16, hidden_dim: 32, \
         output_dim: 16 }}\n  steps: 5\n  total_batch_size: 8\n  batch_size_per_device: 4\n"
    )
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

#[test]
fn a_slurm_gpu_job_without_usable_gpus_fails_once_naming_the_node() {
    let cluster = SlurmCluster::start().expect("start the local Slurm cluster");
    let dir = TestDir::new("gpu-slurm");
    // The node's fake GPUs are of type `fake`; no node has an H100.
    let typed = |name: &str, kind: &str| {
        let kind = format!("  gpu_type: {kind}\n  cpus_per_task");
        gpu_spec(name).replace("  cpus_per_task", &kind)
    };
    let h100 = dir.write("h100.yaml", &typed("gpuh100", "h100"));
    let refused = cluster
        .shardrun(dir.path(), &["submit", &h100.to_string_lossy()])
        .unwrap();
    assert!(
        !refused.status.success()
            && stderr_of(&refused).contains("Requested node configuration is not available"),
        "{}{}",
        stdout_of(&refused),
        stderr_of(&refused)
    );
    // What Slurm does not say: which ask no node meets, from what sinfo lists.
    assert!(
        stderr_of(&refused).contains(
            "why: each node is asked for 2 GPU(s) of type h100 (resources.gpus_per_node): \
             no node of partition debug (the default) has more than 0"
        ),
        "{}",
        stderr_of(&refused)
    );
    // A dry run asks Slurm too, and says what the real submit would meet.
    let dry_run = |spec: &Path| {
        let out = cluster
            .shardrun(
                dir.path(),
                &["submit", "--dry-run", &spec.to_string_lossy()],
            )
            .unwrap();
        assert!(out.status.success(), "{}", stderr_of(&out));
        stderr_of(&out)
    };
    let said = dry_run(&h100);
    assert!(
        said.contains("warning: the real submit would fail here")
            && said.contains("Requested node configuration is not available")
            && said.contains("why: each node is asked for 2 GPU(s) of type h100"),
        "{said}"
    );
    let spec = dir.write("gpu.yaml", &typed("gpujob", "fake"));
    let said = dry_run(&spec);
    assert!(
        said.contains("dry run: Slurm would take the job (Job ")
            && said.contains("in partition debug)"),
        "{said}"
    );
    let job_id = cluster
        .submit(dir.path(), &[&spec.to_string_lossy()])
        .job_id;
    let run = dir.join("runs/gpujob");
    let script = read(&run.join("job.sbatch"));
    assert!(script.contains("\n#SBATCH --gres=gpu:fake:2\n"), "{script}");
    let result = wait_for_file(&run.join("result.json"), Duration::from_secs(240), |t| {
        t.ends_with('}')
    });
    let slurm_out = read(&run.join(format!("gpujob-{job_id}.out")));
    let slurm_err = read(&run.join(format!("gpujob-{job_id}.err")));
    let result =
        result.unwrap_or_else(|e| panic!("{e}\nstdout:\n{slurm_out}\nstderr:\n{slurm_err}"));
    let json: serde_json::Value = serde_json::from_str(&result).unwrap();
    assert_eq!(json["status"], "failed", "{result}");
    assert_eq!(
        json["cause"]["kind"], "device",
        "{result}\n{slurm_out}\n{slurm_err}"
    );
    let message = json["message"].as_str().unwrap_or_default();
    let host = hostname();
    assert!(
        message.contains(&format!("node {host}: the job trains on CUDA, but"))
            && message.contains("cannot use its device"),
        "{message}"
    );
    // Slurm gave the step both GPUs of the node, and every task sees both.
    assert!(message.contains("CUDA_VISIBLE_DEVICES=0,1"), "{message}");
    // One rank named, by the controller (as it happened and in the verdict); the other
    // rank, with the same problem, says nothing.
    let rank = json["rank"].as_u64().expect("a rank is named");
    let log = read(&run.join("train.log"));
    // The step as it was asked of Slurm, as the script's comment says it.
    let step = log
        .lines()
        .find_map(|l| l.split_once("starting the ranks: srun "))
        .map(|(_, args)| args.rsplit_once(' ').map_or(args, |(args, _worker)| args))
        .unwrap_or_else(|| panic!("no srun line:\n{log}"));
    assert!(
        step.contains("--ntasks=2 --nodes=1") && step.ends_with("--gres=gpu:2"),
        "{step}"
    );
    assert!(
        script.contains(&format!("#   srun {step} shardrun-worker\n")),
        "{script}"
    );
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("the job trains on CUDA, but"))
        .collect();
    assert!(!lines.is_empty(), "{log}");
    for line in &lines {
        assert!(
            line.contains(&format!("rank {rank} on {host}"))
                && line.contains("cannot use its device"),
            "{log}"
        );
    }
    assert!(!log.contains("step 1/"), "no training step ran:\n{log}");
}
