//! `shardrun status [runs/ | run dir | sweep dir]`: one batched Slurm query for all runs.

use crate::slurm::{self, QuerySource};
use anyhow::Context;
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Run directories, sweep folders or run roots (default `runs`).
    pub paths: Vec<PathBuf>,
    /// Print one JSON object per run instead of a table.
    #[arg(long)]
    pub json: bool,
}

pub fn execute(args: Args) -> anyhow::Result<()> {
    let paths = if args.paths.is_empty() {
        vec![PathBuf::from(crate::plan::defaults::RUN_ROOT)]
    } else {
        args.paths
    };
    let mut runs = Vec::new();
    for path in &paths {
        let found = slurm::find_runs(path);
        if found.is_empty() {
            anyhow::bail!("no run directories at {}\n  fix: pass a run directory or run root, or create a run with `shardrun submit job.yaml`", path.display());
        }
        runs.extend(found);
    }
    let (statuses, source) =
        slurm::refresh(&runs).context("querying Slurm for the runs' states")?;
    match source {
        Some(QuerySource::Squeue) => eprintln!("(states from squeue)"),
        Some(QuerySource::SqueueSacct) => {
            eprintln!("(states from squeue, and sacct for ended jobs)")
        }
        Some(QuerySource::SqueueScontrol) => eprintln!(
            "(states from squeue/scontrol: accounting is not enabled, sacct is not available)"
        ),
        None => {}
    }
    if args.json {
        for s in &statuses {
            let line = serde_json::json!({
                "name": s.name,
                "state": s.state,
                "job_id": s.job_id,
                "slurm_state": s.slurm.as_ref().map(|r| r.state.to_string()),
                "detail": s.detail,
                "run_dir": s.run.path(),
                "array": s.array,
            });
            println!("{line}");
        }
        return Ok(());
    }
    let name_width = statuses
        .iter()
        .map(|s| s.name.len())
        .max()
        .unwrap_or(4)
        .max(4);
    // Sweep points: which of the sweep's job arrays each is in (`<k>/<n>`).
    let arrays: Vec<String> = statuses
        .iter()
        .map(|s| {
            s.array
                .as_ref()
                .map(|a| format!("{}/{}", a.index, a.count))
                .unwrap_or_else(|| "-".into())
        })
        .collect();
    let array_width = if statuses.iter().any(|s| s.array.is_some()) {
        arrays.iter().map(String::len).max().unwrap_or(0).max(5) + 2
    } else {
        0
    };
    let array_column = |text: &str| {
        if array_width == 0 {
            String::new()
        } else {
            format!("{text:<array_width$}")
        }
    };
    println!(
        "{:<name_width$}  {:<13}  {:<10}  {}DETAIL / RUN DIRECTORY",
        "RUN",
        "STATE",
        "JOB",
        array_column("ARRAY")
    );
    for (s, array) in statuses.iter().zip(&arrays) {
        let state = serde_json::to_value(s.state)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default();
        println!(
            "{:<name_width$}  {:<13}  {:<10}  {}{}",
            s.name,
            state,
            s.job_id.as_deref().unwrap_or("-"),
            array_column(array),
            s.run.path().display()
        );
        if !s.detail.is_empty() {
            println!(
                "{:<name_width$}  {:<13}  {:<10}  {}{}",
                "",
                "",
                "",
                array_column(""),
                s.detail
            );
        }
    }
    Ok(())
}
