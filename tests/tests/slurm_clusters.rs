//! The test clusters' life cycle: `slurm/stop.sh` stops every daemon `slurm/start.sh`
//! started (slurmdbd and MariaDB included), and `slurm/test-clusters.sh check`, which
//! `scripts/test.sh` runs when it exits, fails while a daemon of a listed cluster is alive and
//! looks at no other cluster.

use shardrun_e2e::*;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// Live processes that belong to the cluster in `dir`, read from `/proc`: (pid, program).
/// A process belongs to it when its command line names a file under `dir`, or its
/// `SLURM_CONF` is the cluster's.
fn daemons_of(dir: &Path) -> Vec<(i32, String)> {
    let prefix = format!("{}/", dir.display());
    let conf = format!("SLURM_CONF={}/etc/slurm.conf", dir.display());
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("read /proc").flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let read = |file: &str| std::fs::read(entry.path().join(file)).unwrap_or_default();
        let comm = String::from_utf8_lossy(&read("comm")).trim().to_string();
        if ![
            "munged",
            "slurmctld",
            "slurmscriptd",
            "slurmd",
            "slurmstepd",
            "slurmdbd",
            "mariadbd",
        ]
        .contains(&comm.as_str())
        {
            continue;
        }
        let cmdline = read("cmdline");
        let environ = read("environ");
        let mine = cmdline
            .split(|&b| b == 0)
            .any(|arg| String::from_utf8_lossy(arg).contains(&prefix))
            || environ.split(|&b| b == 0).any(|kv| kv == conf.as_bytes());
        if mine {
            found.push((pid, comm));
        }
    }
    found.sort();
    found
}

fn alive(pid: i32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// `slurm/<script> <args>` with `env`, its output, and whether it succeeded.
fn slurm_script(script: &str, args: &[&str], env: &[(&str, String)]) -> (bool, String) {
    let mut cmd = Command::new(repo_root().join("slurm").join(script));
    cmd.args(args)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())));
    let out = run_with_deadline(&mut cmd, Duration::from_secs(300)).expect("script finished");
    (
        out.status.success(),
        format!("{}{}", stdout_of(&out), stderr_of(&out)),
    )
}

/// The port the list gives cluster `name` (`slurm/test-clusters.sh list`).
fn listed_port(name: &str) -> String {
    let (ok, out) = slurm_script("test-clusters.sh", &["list"], &[]);
    assert!(ok, "{out}");
    out.lines()
        .find_map(|l| {
            let fields: Vec<&str> = l.split_whitespace().collect();
            (fields.first() == Some(&name)).then(|| fields[2].to_string())
        })
        .unwrap_or_else(|| panic!("no cluster {name} in the list: {out}"))
}

#[test]
fn stop_ends_every_daemon_of_the_accounting_cluster() {
    let cluster = SlurmCluster::start_with_accounting()
        .expect("start the local Slurm cluster with accounting");
    let before = daemons_of(&cluster.state_dir);
    let programs: Vec<&str> = before.iter().map(|(_, p)| p.as_str()).collect();
    for program in ["munged", "mariadbd", "slurmdbd", "slurmctld", "slurmd"] {
        assert!(
            programs.contains(&program),
            "{program} of {} is not running: {before:?}",
            cluster.state_dir.display()
        );
    }

    let env = [
        (
            "SHARDRUN_SLURM_DIR",
            cluster.state_dir.display().to_string(),
        ),
        ("SHARDRUN_SLURM_PORT", listed_port("accounting")),
    ];
    let (ok, out) = slurm_script("stop.sh", &[], &env);
    assert!(ok, "stop.sh failed:\n{out}");
    for (pid, program) in &before {
        assert!(!alive(*pid), "{program} ({pid}) outlived stop.sh:\n{out}");
        if ["mariadbd", "slurmdbd", "slurmctld", "slurmd", "munged"].contains(&program.as_str()) {
            assert!(
                out.contains(&format!("{program} ({pid}) stopped")),
                "stop.sh does not say it stopped {program} ({pid}):\n{out}"
            );
        }
    }
    assert!(!out.contains("not running"), "{out}");
    assert_eq!(daemons_of(&cluster.state_dir), vec![]);
}

#[test]
fn the_check_fails_while_a_listed_cluster_runs_and_stop_needs_no_pid_file() {
    let cluster = SlurmCluster::start_named("lifecycle").expect("start the lifecycle cluster");
    let dir = TestDir::new("clusters");
    // A list of this cluster alone: the check must not look at the others.
    let list = dir.write(
        "clusters.txt",
        &format!(
            "# one cluster\nlifecycle {} {}\n",
            cluster.state_dir.display(),
            listed_port("lifecycle")
        ),
    );
    let env = [("SHARDRUN_TEST_CLUSTERS", list.display().to_string())];
    let running = daemons_of(&cluster.state_dir);
    let slurmd = running
        .iter()
        .find(|(_, p)| p == "slurmd")
        .map(|(pid, _)| *pid)
        .unwrap_or_else(|| panic!("no slurmd in {running:?}"));

    let (ok, out) = slurm_script("test-clusters.sh", &["check"], &env);
    assert!(!ok, "the check passed with the cluster running:\n{out}");
    for (pid, program) in &running {
        assert!(
            out.contains(&format!("{pid} {program}")),
            "the check does not name {program} ({pid}):\n{out}"
        );
    }

    // A daemon whose pid file is lost is still this cluster's, and stop.sh still stops it.
    std::fs::remove_file(cluster.state_dir.join("pids/slurmd.pid")).expect("remove the pid file");
    let (ok, out) = slurm_script("test-clusters.sh", &["stop"], &env);
    assert!(ok, "stop failed:\n{out}");
    assert!(!alive(slurmd), "slurmd ({slurmd}) outlived stop:\n{out}");
    assert!(
        out.contains(&format!("slurmd ({slurmd}) had no pid file")),
        "{out}"
    );
    for (pid, program) in &running {
        assert!(!alive(*pid), "{program} ({pid}) outlived stop:\n{out}");
    }
    let (ok, out) = slurm_script("test-clusters.sh", &["check"], &env);
    assert!(ok, "the check failed after stop:\n{out}");
}
