//! The CPU collectives across real processes over real sockets: N ranks of
//! `shardrun-collective-bench` meet through the standalone rendezvous and run every
//! collective with exact expected values; a rank killed mid-collective makes all the others
//! fail, naming it, within a bounded time.

mod common;

use common::free_port;
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_shardrun-collective-bench");
/// A hang detector, not a performance assertion: far above what any run here takes.
const CHECK_DEADLINE: Duration = Duration::from_secs(240);
const DEAD_PEER_DEADLINE: Duration = Duration::from_secs(20);

/// Kills the ranks that are still running when a test ends, passed or not.
struct Ranks(Vec<Child>);

impl Drop for Ranks {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn spawn(world: usize, args: &[&str]) -> Ranks {
    spawn_with_timeout(world, 60, args)
}

fn spawn_with_timeout(world: usize, timeout_s: u64, args: &[&str]) -> Ranks {
    let port = free_port().to_string();
    let children = (0..world)
        .map(|rank| {
            let mut cmd = Command::new(BIN);
            // Launcher variables of an enclosing job would take precedence over ours.
            for var in [
                "SLURM_PROCID",
                "SLURM_NTASKS",
                "SLURM_LOCALID",
                "SHARDRUN_RANK",
                "SHARDRUN_WORLD_SIZE",
            ] {
                cmd.env_remove(var);
            }
            cmd.env("RANK", rank.to_string())
                .env("WORLD_SIZE", world.to_string())
                .env("LOCAL_RANK", rank.to_string())
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", &port)
                .args(["--timeout-s", &timeout_s.to_string()])
                .args(args)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("start shardrun-collective-bench")
        })
        .collect();
    Ranks(children)
}

fn read_all(stream: Option<&mut impl Read>) -> String {
    let mut text = String::new();
    if let Some(s) = stream {
        let _ = s.read_to_string(&mut text);
    }
    text
}

/// Waits for every rank to exit; returns (exit code, stdout, stderr) per rank.
fn wait_all(ranks: &mut Ranks, deadline: Duration) -> Vec<(Option<i32>, String, String)> {
    let start = Instant::now();
    let mut results = vec![];
    for (rank, child) in ranks.0.iter_mut().enumerate() {
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                let out = read_all(child.stdout.as_mut());
                let err = read_all(child.stderr.as_mut());
                results.push((status.code(), out, err));
                break;
            }
            assert!(
                start.elapsed() < deadline,
                "rank {rank} still running after {deadline:?}: hang"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    results
}

fn check_world(world: usize) {
    let mut ranks = spawn(world, &["check"]);
    let results = wait_all(&mut ranks, CHECK_DEADLINE);
    for (rank, (code, out, err)) in results.iter().enumerate() {
        assert_eq!(
            *code,
            Some(0),
            "rank {rank} of {world} failed:\n{out}\n{err}"
        );
        assert!(out.contains("check passed"), "rank {rank}: {out}");
    }
}

#[test]
fn every_collective_is_exact_on_one_rank() {
    check_world(1);
}

#[test]
fn every_collective_is_exact_on_two_ranks() {
    check_world(2);
}

#[test]
fn every_collective_is_exact_on_three_ranks() {
    check_world(3);
}

#[test]
fn every_collective_is_exact_on_four_ranks_with_hybrid_groups() {
    check_world(4);
}

/// Nine ranks: the values each rank adds reach past 256, where bf16 stops holding every
/// integer (eight GPUs of a node, and one more).
#[test]
fn every_collective_is_exact_on_nine_ranks() {
    check_world(9);
}

/// Starts `world` ranks looping over all-reduces and waits until every one of them has
/// finished one and entered the next: from then on each is inside the loop's collectives,
/// which cannot complete without all of them.
fn soaking(world: usize, timeout_s: u64) -> Ranks {
    let mut ranks = spawn_with_timeout(world, timeout_s, &["soak"]);
    let (ready_tx, ready_rx) = mpsc::channel();
    for (rank, child) in ranks.0.iter_mut().enumerate() {
        let stdout = child.stdout.take().unwrap();
        let tx = ready_tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if line == "inside" {
                    let _ = tx.send(rank);
                }
            }
        });
    }
    for _ in 0..world {
        ready_rx
            .recv_timeout(CHECK_DEADLINE)
            .expect("every rank enters its second all-reduce");
    }
    ranks
}

/// Kills `victim` in the middle of collectives; every other rank must exit with an error
/// naming it.
fn killed_rank_is_named_by_all_others(world: usize, victim: usize) {
    let mut ranks = soaking(world, 60);
    ranks.0[victim].kill().unwrap();
    let killed_at = Instant::now();
    let results = wait_all(&mut ranks, DEAD_PEER_DEADLINE);
    let elapsed = killed_at.elapsed();
    for (rank, (code, _, err)) in results.iter().enumerate() {
        if rank == victim {
            continue;
        }
        assert_eq!(
            *code,
            Some(1),
            "rank {rank} should fail after rank {victim} died: {err}"
        );
        assert!(
            err.contains(&format!("peer rank {victim} ")),
            "rank {rank} should name rank {victim} as the failed peer: {err}"
        );
    }
    eprintln!("all ranks failed {elapsed:?} after rank {victim} was killed");
}

#[test]
fn killed_rank_fails_every_other_rank_of_four() {
    killed_rank_is_named_by_all_others(4, 2);
}

#[test]
fn killed_rank_zero_fails_every_other_rank_of_three() {
    killed_rank_is_named_by_all_others(3, 0);
}

/// A rank that stops responding without closing its sockets (SIGSTOP) is caught by the
/// collective timeout: no rank hangs, and every other rank fails with a timeout or with the
/// abort a timed-out neighbour sent. Which rank a timeout names is whom that rank was waiting
/// on, and whose timer fires first depends on scheduling (rank 3 can time out on rank 2,
/// which is itself waiting on the stopped rank 1), so the ring cannot always name the stuck
/// rank; in a job the controller does, from the heartbeats a stopped process no longer sends
/// (`job_controller::job` tests `heartbeat_loss_and_reported_errors_fail_the_job`).
#[test]
fn stopped_rank_times_out_every_other_rank() {
    let (world, victim) = (4, 1);
    let mut ranks = soaking(world, 5);
    // SAFETY: signalling a child process this test started and still owns.
    let rc = unsafe { libc::kill(ranks.0[victim].id() as libc::pid_t, libc::SIGSTOP) };
    assert_eq!(rc, 0);
    let others: Vec<usize> = (0..world).filter(|&r| r != victim).collect();
    let start = Instant::now();
    for &rank in &others {
        let child = &mut ranks.0[rank];
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "rank {rank} hangs"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        let err = read_all(child.stderr.as_mut());
        assert_eq!(status.code(), Some(1), "rank {rank}: {err}");
        assert!(
            err.contains("timed out") || err.contains("peer rank"),
            "rank {rank} should fail with a timeout or a peer's abort: {err}"
        );
    }
}
