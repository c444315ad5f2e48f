//! Checkpoint throughput against the disk's own sequential write speed.
//!
//! ```text
//! cargo run --release -p shardrun-checkpoint --example checkpoint_bench -- \
//!     [--dir DIR] [--ranks N] [--mb-per-rank MB] [--units U] [--repeat R]
//! ```
//!
//! 1. `dd` writes the same number of bytes as one rank, with `conv=fdatasync` (what a
//!    checkpoint pays: data on disk) and `oflag=direct`;
//! 2. N threads write a sharded checkpoint as N ranks do (each its own file, fsync), rank 0
//!    commits; MB/s per rank = that rank's bytes / its time;
//! 3. every rank loads its shards back (same world), then as N+1 ranks (resharded), then the
//!    full sha256 verification rank 0 does before a resume.
//!
//! Reads come from the page cache unless it can be dropped (root); the report says which.

use shardrun_checkpoint::{
    commit, write_rank_report, Checkpoint, CommitKind, CommitRequest, DataPosition, Layout,
    SaveTarget, SchedulerState, ShardWriter, StateDtypes, StateKind, TrainerState, UnitLayout,
    Verify,
};
use shardrun_protocol::config::{CheckpointFormat, DType, ShardingStrategy};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

struct Options {
    dir: PathBuf,
    ranks: u64,
    mb_per_rank: u64,
    units: u64,
    repeat: u64,
}

fn parse() -> Result<Options, String> {
    let mut o = Options {
        dir: std::env::temp_dir().join("shardrun-checkpoint-bench"),
        ranks: 2,
        mb_per_rank: 512,
        units: 8,
        repeat: 3,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or(format!("{flag} needs a value"))?;
        let number = || {
            value
                .parse::<u64>()
                .map_err(|_| format!("{flag} {value}: not a number"))
        };
        match flag.as_str() {
            "--dir" => o.dir = PathBuf::from(&value),
            "--ranks" => o.ranks = number()?.max(1),
            "--mb-per-rank" => o.mb_per_rank = number()?.max(1),
            "--units" => o.units = number()?.max(1),
            "--repeat" => o.repeat = number()?.max(1),
            _ => return Err(format!("unknown option {flag}")),
        }
    }
    Ok(o)
}

/// One rank holds params + two moments: `mb_per_rank` MB over all three.
fn layout(o: &Options, shards: u64) -> Layout {
    let unit_numel = o.mb_per_rank * 1_000_000 / 12 * o.ranks / o.units;
    let rows = 1024;
    let units = (0..o.units)
        .map(|u| {
            let name = format!("layers.{u}.weight");
            UnitLayout::packed(
                format!("layers.{u}"),
                [(name, vec![rows, unit_numel / rows])],
                shards,
            )
            .unwrap()
        })
        .collect();
    Layout::new(units).unwrap()
}

/// `dd` of `mb` MB with `flags`; MB/s as dd reports it.
fn dd(dir: &Path, mb: u64, flags: &str) -> Result<f64, String> {
    let file = dir.join("dd.bin");
    let out = Command::new("dd")
        .arg("if=/dev/zero")
        .arg(format!("of={}", file.display()))
        .arg("bs=4M")
        .arg(format!("count={}", mb.div_ceil(4)))
        .arg(flags)
        .output()
        .map_err(|e| format!("cannot run dd: {e}"))?;
    let _ = std::fs::remove_file(&file);
    let text = String::from_utf8_lossy(&out.stderr).into_owned();
    let last = text.lines().last().unwrap_or_default();
    // "... bytes (...) copied, 1.23 s, 456 MB/s"
    let seconds: f64 = last
        .split(", ")
        .find_map(|p| p.strip_suffix(" s"))
        .and_then(|s| s.parse().ok())
        .ok_or(format!("cannot read dd's output: {text}"))?;
    let bytes: f64 = last
        .split(' ')
        .next()
        .and_then(|s| s.parse().ok())
        .ok_or(format!("cannot read dd's output: {text}"))?;
    Ok(bytes / 1e6 / seconds)
}

fn drop_page_cache() -> bool {
    Command::new("sync").status().is_ok_and(|s| s.success())
        && std::fs::write("/proc/sys/vm/drop_caches", "3").is_ok()
}

fn main() {
    let o = match parse() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(2);
        }
    };
    // The disk is shared and its speed drifts: dd and the checkpoint alternate, and the
    // medians are compared.
    let mut runs = Vec::new();
    for _ in 0..o.repeat {
        match run(&o) {
            Ok(figures) => runs.push(figures),
            Err(e) => {
                eprintln!("error: {e}");
                std::process::exit(1);
            }
        }
    }
    let median = |f: fn(&Figures) -> f64| {
        let mut v: Vec<f64> = runs.iter().map(f).collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (dd, rank, all) = (
        median(|f| f.dd_sync),
        median(|f| f.write_slowest_rank),
        median(|f| f.write_all),
    );
    println!(
        "median of {}: dd fdatasync {dd:.0} MB/s; write {rank:.0} MB/s per rank, {all:.0} MB/s all ranks = {:.0}% of dd; load {:.0} MB/s per rank; save {:.2} s",
        runs.len(),
        100.0 * all / dd,
        median(|f| f.load_rank),
        median(|f| f.save_s),
    );
}

struct Figures {
    dd_sync: f64,
    write_slowest_rank: f64,
    write_all: f64,
    load_rank: f64,
    save_s: f64,
}

fn run(o: &Options) -> Result<Figures, Box<dyn std::error::Error>> {
    let _ = std::fs::remove_dir_all(&o.dir);
    std::fs::create_dir_all(&o.dir)?;
    let layout = layout(o, o.ranks);
    let shard_bytes: u64 = layout.units.iter().map(|u| u.shard_size * 12).sum();
    let mb = shard_bytes / 1_000_000;
    println!(
        "checkpoint benchmark: {} ranks, {} MB per rank, {} units, in {}",
        o.ranks,
        mb,
        o.units,
        o.dir.display()
    );

    let dd_sync = dd(&o.dir, mb, "conv=fdatasync")?;
    let dd_direct = dd(&o.dir, mb, "oflag=direct").unwrap_or(f64::NAN);
    println!("dd sequential write, {mb} MB: {dd_sync:.0} MB/s (conv=fdatasync), {dd_direct:.0} MB/s (oflag=direct)");

    // Shard contents made once per rank, outside the timed part (the engine has them).
    let shards: Vec<Vec<Vec<u8>>> = (0..o.ranks)
        .map(|r| {
            layout
                .units
                .iter()
                .map(|u| {
                    (0..u.shard_size)
                        .flat_map(|i| ((i ^ r) as f32 * 1e-3).to_le_bytes())
                        .collect()
                })
                .collect()
        })
        .collect();

    let root = o.dir.join("checkpoints");
    let target = SaveTarget::new(&root, 100, o.ranks);
    let started = Instant::now();
    target.prepare()?;
    let per_rank: Vec<f64> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..o.ranks)
            .map(|rank| {
                let (target, layout, shards) = (&target, &layout, &shards[rank as usize]);
                scope.spawn(
                    move || -> Result<f64, shardrun_checkpoint::CheckpointError> {
                        let t = Instant::now();
                        let mut writer = ShardWriter::create(target, layout, rank)?;
                        for (u, shard) in shards.iter().enumerate() {
                            writer.write_unit(u, shard, shard, shard)?;
                        }
                        let file = writer.finish()?;
                        write_rank_report(target, rank, Vec::new(), vec![file])?;
                        Ok(t.elapsed().as_secs_f64())
                    },
                )
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("writer thread"))
            .collect::<Result<_, _>>()
    })?;
    let written = Instant::now();
    commit(
        &target,
        &CommitRequest {
            format: CheckpointFormat::Sharded,
            strategy: ShardingStrategy::FullShard,
            shard_group_size: o.ranks,
            dtypes: StateDtypes::fp32_state(DType::F32),
            layout: layout.clone(),
            trainer: TrainerState {
                optimizer_step: 100,
                scheduler: SchedulerState {
                    step: 100,
                    last_lr: 1e-3,
                },
                data: DataPosition {
                    samples_done: 0,
                    micro_batches_done: 0,
                    epoch: None,
                    data_fingerprint: None,
                },
                seed: 0,
                loss_scale: None,
                diverged_at: None,
            },
            config_hash: String::new(),
            config: None,
            kind: CommitKind::Checkpoint { keep: 1 },
        },
    )?;
    let total = started.elapsed().as_secs_f64();
    let commit_s = written.elapsed().as_secs_f64();
    let mbs: Vec<f64> = per_rank
        .iter()
        .map(|s| shard_bytes as f64 / 1e6 / s)
        .collect();
    let slowest = mbs.iter().cloned().fold(f64::INFINITY, f64::min);
    println!(
        "write: per rank {} MB/s (slowest {:.0} MB/s = {:.0}% of dd fdatasync); all ranks {:.0} MB/s; save {:.2} s of which commit {:.3} s",
        mbs.iter().map(|m| format!("{m:.0}")).collect::<Vec<_>>().join(" / "),
        slowest,
        100.0 * slowest / dd_sync,
        (shard_bytes * o.ranks) as f64 / 1e6 / total,
        total,
        commit_s
    );

    let dir = root.join("step-100");
    let cold = drop_page_cache();
    let load = |target: &Layout, ranks: u64| -> Result<(f64, f64), Box<dyn std::error::Error>> {
        let t = Instant::now();
        let checkpoint = Checkpoint::open(&dir, Verify::Structure)?;
        let times: Vec<f64> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..ranks)
                .map(|rank| {
                    let (checkpoint, target) = (&checkpoint, target);
                    scope.spawn(
                        move || -> Result<f64, shardrun_checkpoint::CheckpointError> {
                            let t = Instant::now();
                            for unit in &target.units {
                                let mut out = vec![0u8; unit.shard_size as usize * 4];
                                for kind in StateKind::ALL {
                                    checkpoint.read_shard(kind, unit, rank, &mut out)?;
                                }
                            }
                            Ok(t.elapsed().as_secs_f64())
                        },
                    )
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("reader thread"))
                .collect::<Result<_, _>>()
        })?;
        let bytes_per_rank: u64 = target.units.iter().map(|u| u.shard_size * 12).sum();
        let slowest = times.iter().cloned().fold(0.0, f64::max);
        Ok((
            bytes_per_rank as f64 / 1e6 / slowest,
            t.elapsed().as_secs_f64(),
        ))
    };
    let (same, same_s) = load(&layout, o.ranks)?;
    if cold {
        drop_page_cache();
    }
    let resharded_layout = self::layout(o, o.ranks + 1);
    let (reshard, reshard_s) = load(&resharded_layout, o.ranks + 1)?;
    if cold {
        drop_page_cache();
    }
    let t = Instant::now();
    Checkpoint::open(&dir, Verify::Checksums)?;
    let verify_s = t.elapsed().as_secs_f64();
    println!(
        "load ({}): {same:.0} MB/s per rank on {} ranks ({same_s:.2} s); resharded onto {} ranks {reshard:.0} MB/s per rank ({reshard_s:.2} s); sha256 verification of all files {:.0} MB/s ({verify_s:.2} s)",
        if cold { "page cache dropped" } else { "page cache warm: could not drop it" },
        o.ranks,
        o.ranks + 1,
        (shard_bytes * o.ranks) as f64 / 1e6 / verify_s,
    );
    std::fs::remove_dir_all(&o.dir)?;
    Ok(Figures {
        dd_sync,
        write_slowest_rank: slowest,
        write_all: (shard_bytes * o.ranks) as f64 / 1e6 / total,
        load_rank: same,
        save_s: total,
    })
}
