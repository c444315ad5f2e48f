//! Loading at scale: on a 4-rank job, each rank reads only its own shards of a ~500 MB fp32
//! folder (made by `transformers`), so the memory loading adds to a rank is about its shard
//! (a quarter of the folder) plus one mapped chunk, never the whole model.

mod common;
mod hf_common;

use common::{config, temp_dir, WORKER};
use hf_common::*;
use shardrun_protocol::config::{DataConfig, ShardingStrategy};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const MIB: f64 = 1024.0 * 1024.0;

/// `resident memory X MiB before, peak Y MiB while loading` from a rank's log.
fn loading_memory(log: &str) -> Option<(f64, f64)> {
    let line = log.lines().find(|l| l.contains("while loading"))?;
    let number_before = |marker: &str| -> Option<f64> {
        let head = &line[..line.find(marker)?];
        head.rsplit(' ').next()?.parse().ok()
    };
    Some((
        number_before(" MiB before")?,
        number_before(" MiB while loading")?,
    ))
}

#[test]
fn four_ranks_load_a_500_mb_folder_holding_only_their_shards() {
    let work = temp_dir();
    let dir = work.path().join("big");
    let made: serde_json::Value = serde_json::from_str(
        run_script(&["make-big", "--out", dir.to_str().unwrap(), "--mb", "500"])
            .lines()
            .last()
            .unwrap(),
    )
    .unwrap();
    let folder_mib = made["bytes"].as_f64().unwrap() / MIB;
    assert!(folder_mib > 450.0, "{made}");

    let world = 4;
    let mut cfg = config(hf_model(&dir), ShardingStrategy::FullShard, world);
    cfg.steps = 1;
    cfg.data = DataConfig::Synthetic { seq_len: 8 };
    cfg.batch.total_batch_size = world;
    cfg.batch.batch_size_per_device = 1;
    let config_path = work.path().join("big.json");
    std::fs::write(&config_path, serde_json::to_string(&cfg).unwrap()).unwrap();
    let port = common::free_port();
    let logs: Vec<_> = (0..world)
        .map(|r| work.path().join(format!("rank{r}.log")))
        .collect();
    let mut ranks: Vec<_> = (0..world)
        .map(|rank| {
            Command::new(WORKER)
                .arg("--config")
                .arg(&config_path)
                .env("RANK", rank.to_string())
                .env("WORLD_SIZE", world.to_string())
                .env("LOCAL_RANK", rank.to_string())
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", port.to_string())
                .env_remove("SHARDRUN_CONTROLLER")
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&logs[rank as usize]).unwrap())
                .spawn()
                .unwrap()
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(600);
    for (rank, child) in ranks.iter_mut().enumerate() {
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            assert!(Instant::now() < deadline, "rank {rank} still running");
            std::thread::sleep(Duration::from_millis(50));
        };
        let log = std::fs::read_to_string(&logs[rank]).unwrap();
        assert!(status.success(), "rank {rank} failed:\n{log}");
    }
    for (rank, path) in logs.iter().enumerate() {
        let log = std::fs::read_to_string(path).unwrap();
        let (before, peak) = loading_memory(&log)
            .unwrap_or_else(|| panic!("rank {rank} logged no loading memory:\n{log}"));
        let added = peak - before;
        eprintln!(
            "rank {rank}: loading added {added:.0} MiB ({:.2} of the {folder_mib:.0} MiB folder; its shard is {:.0} MiB)",
            added / folder_mib,
            folder_mib / world as f64
        );
        // A whole tensor's copy (the embedding alone is 125 MiB) would break this.
        assert!(
            added < 0.4 * folder_mib,
            "rank {rank}: loading added {added:.0} MiB for a {folder_mib:.0} MiB folder"
        );
    }
}
