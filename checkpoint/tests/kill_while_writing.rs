//! A real writer process SIGKILLed in the middle of a save (inside a tensor write, between
//! files, at each commit stage): the previous checkpoint stays valid and is what resume
//! picks; the next save of the same step succeeds.
//!
//! The writer is this test binary itself, re-run for its ignored `child_writer` with
//! `CKPT_CHILD_ROOT` set: it saves step 20 on 2 ranks (sequentially), printing a marker before
//! each part; with `CKPT_CHILD_PAUSE` equal to a marker it stops there until killed. Ignored,
//! so it is never counted as a test of its own.

mod common;

use common::*;
use shardrun_checkpoint::{
    clean_stale, commit_observed, find_latest, write_rank_report, CommitStage, Layout, SaveTarget,
    ShardWriter, StateKind, UnitLayout, Verify,
};
use shardrun_protocol::config::{CheckpointFormat, ShardingStrategy};
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Big enough that writing a unit takes a while (4 units × 3 kinds × 16 MiB per rank).
fn big_layout() -> Layout {
    let units = (0..4)
        .map(|u| {
            UnitLayout::packed(
                format!("layers.{u}"),
                [(format!("layers.{u}.w"), vec![2048, 4096])],
                2,
            )
            .unwrap()
        })
        .collect();
    Layout::new(units).unwrap()
}

fn marker(name: &str) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "MARK {name}").unwrap();
    out.flush().unwrap();
    if std::env::var("CKPT_CHILD_PAUSE").as_deref() == Ok(name) {
        std::thread::sleep(Duration::from_secs(120));
    }
}

/// The writer process (started by the tests below, never on its own).
#[test]
#[ignore = "the writer process the kill tests start; it needs CKPT_CHILD_ROOT"]
fn child_writer() {
    let root = std::env::var("CKPT_CHILD_ROOT")
        .expect("child_writer is the kill tests' writer process: run them, not it");
    let layout = big_layout();
    let target = SaveTarget::new(&root, 20, 2);
    target.prepare().unwrap();
    marker("prepared");
    for rank in 0..2 {
        let mut writer = ShardWriter::create(&target, &layout, rank).unwrap();
        for (u, unit) in layout.units.iter().enumerate() {
            marker(&format!("rank-{rank}-unit-{u}"));
            let shard = bytes(&vec![rank as f32 + u as f32; unit.shard_size as usize]);
            writer.write_unit(u, &shard, &shard, &shard).unwrap();
        }
        let file = writer.finish().unwrap();
        marker(&format!("rank-{rank}-report"));
        write_rank_report(&target, rank, rng(rank, 20), vec![file]).unwrap();
    }
    marker("commit");
    let request = request(
        CheckpointFormat::Sharded,
        &layout,
        ShardingStrategy::FullShard,
        20,
        1,
    );
    commit_observed(&target, &request, CommitStage::Prune, &mut |stage| {
        marker(&format!("{stage:?}"))
    })
    .unwrap();
    marker("done");
}

/// Start the writer, wait for `pause_at` (or `delay` after it for a kill mid-write), SIGKILL.
fn kill_writer_at(root: &std::path::Path, pause_at: &str, delay: Option<Duration>) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_writer",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("CKPT_CHILD_ROOT", root)
        .env(
            "CKPT_CHILD_PAUSE",
            if delay.is_some() { "" } else { pause_at },
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Read on a thread, so that a writer that stops printing fails the test at the deadline
    // instead of blocking it.
    let stdout = child.stdout.take().unwrap();
    let (lines, markers) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    let reached = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match markers.recv_timeout(left) {
            // libtest may print "test child_writer ... " on the same line as the first marker.
            Ok(line) if line.ends_with(&format!("MARK {pause_at}")) => break Ok(()),
            Ok(_) => continue,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                break Err(format!("the writer did not reach {pause_at} within 60 s"))
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                break Err(format!("the writer ended before reaching {pause_at}"))
            }
        }
    };
    // The delay is the stimulus (how far into the next unit's write the kill lands), not a
    // wait for anything.
    if let (Ok(()), Some(delay)) = (&reached, delay) {
        std::thread::sleep(delay);
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    if let Err(why) = reached {
        panic!("{why}");
    }
}

fn check_after_kill(root: &std::path::Path, expected: &[u64], point: &str) {
    let found = find_latest(root, Verify::Checksums).unwrap();
    let step = found.checkpoint.as_ref().map(|c| c.step());
    assert!(
        step.is_some_and(|s| expected.contains(&s)),
        "killed at {point}: resumes from {step:?}, expected one of {expected:?}; skipped: {:?}",
        found.fallback_messages()
    );
    if step == Some(10) {
        assert_loads_onto(found.checkpoint.as_ref().unwrap(), &layout(3), 10);
    }
    // The next run cleans up and saves the same step.
    clean_stale(root).unwrap();
    save_sharded(root, 20, 2, &layout(2), 2);
    let found = find_latest(root, Verify::Checksums).unwrap();
    assert_eq!(found.checkpoint.map(|c| c.step()), Some(20), "{point}");
}

#[test]
fn sigkill_at_each_point_of_a_save() {
    let points: Vec<(String, &[u64])> = [
        ("prepared", &[10u64][..]),
        ("rank-0-unit-2", &[10]),
        ("rank-1-unit-0", &[10]),
        ("rank-1-report", &[10]),
        ("commit", &[10]),
        ("Metadata", &[10]),
        ("Complete", &[10]),
        ("Rename", &[20]),
        ("Latest", &[20]),
    ]
    .into_iter()
    .map(|(p, e)| (p.to_string(), e))
    .collect();
    for (point, expected) in points {
        let tmp = tempfile::tempdir().unwrap();
        save_sharded(tmp.path(), 10, 2, &layout(2), 2);
        kill_writer_at(tmp.path(), &point, None);
        if expected == [20] {
            // The big layout's step 20 is complete: check that it really is the new one.
            let found = find_latest(tmp.path(), Verify::Checksums).unwrap();
            let checkpoint = found.checkpoint.unwrap();
            let unit = &checkpoint.layout().units[3];
            let mut out = vec![0u8; 8];
            checkpoint
                .read_unit_range(StateKind::Param, unit, unit.numel - 2..unit.numel, &mut out)
                .unwrap();
            assert_eq!(floats(&out), [4.0, 4.0], "rank 1's shard of unit 3");
            // Its layout is another model's; cleaning up means starting that folder anew.
            std::fs::remove_dir_all(checkpoint.dir()).unwrap();
            save_sharded(tmp.path(), 10, 2, &layout(2), 2);
            check_after_kill(tmp.path(), &[10], &point);
        } else {
            check_after_kill(tmp.path(), expected, &point);
        }
    }
}

#[test]
fn sigkill_mid_tensor_write() {
    let mut mid_write = 0;
    for delay_ms in [1, 5, 20, 60] {
        let tmp = tempfile::tempdir().unwrap();
        save_sharded(tmp.path(), 10, 2, &layout(2), 2);
        kill_writer_at(
            tmp.path(),
            "rank-0-unit-1",
            Some(Duration::from_millis(delay_ms)),
        );
        // Usually still writing; on a fast disk it may have committed (then step 20 is whole).
        let found = find_latest(tmp.path(), Verify::Checksums).unwrap();
        assert!(found.skipped.is_empty(), "{:?}", found.fallback_messages());
        let step = found.checkpoint.map(|c| c.step()).unwrap();
        if step == 20 {
            continue;
        }
        mid_write += 1;
        check_after_kill(tmp.path(), &[10], &format!("{delay_ms} ms into a unit"));
    }
    // At 1 ms a save of four units is never done: at least that kill was one mid-write.
    assert!(
        mid_write > 0,
        "every kill came after the save was committed"
    );
}
