//! `shardrun metrics <run or sweep dir>`: the latest metrics of one run, or of every run
//! under a directory (a sweep), as a table.

use crate::controller::console::group_thousands;
use crate::metrics_file;
use anyhow::bail;
use shardrun_protocol::TrainConfig;
use std::path::{Path, PathBuf};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// A run directory, or a directory of run directories (a sweep).
    pub path: PathBuf,
}

pub fn execute(args: Args) -> anyhow::Result<()> {
    let runs = find_runs(&args.path)?;
    if runs.is_empty() {
        bail!(
            "no run directories under {} (a run directory holds train_config.json); start one \
             with `shardrun run job.yaml` or `shardrun submit job.yaml`",
            args.path.display()
        );
    }
    let header = [
        "run",
        "status",
        "step",
        "loss",
        "lr",
        "grad norm",
        "eval loss",
        "ppl",
        "tokens/s",
        "MFU",
        "peak mem",
    ];
    let rows: Vec<Vec<String>> = runs.iter().map(|run| row(run)).collect();
    print!("{}", table(&header, &rows));
    Ok(())
}

fn find_runs(path: &Path) -> anyhow::Result<Vec<PathBuf>> {
    if !path.is_dir() {
        bail!(
            "{} is not a directory; pass a run directory or a sweep directory",
            path.display()
        );
    }
    if path.join("train_config.json").is_file() {
        return Ok(vec![path.to_path_buf()]);
    }
    let mut runs: Vec<PathBuf> = std::fs::read_dir(path)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("train_config.json").is_file())
        .collect();
    runs.sort();
    Ok(runs)
}

fn row(run: &Path) -> Vec<String> {
    let name = run
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let total = std::fs::read_to_string(run.join("train_config.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<TrainConfig>(&t).ok())
        .map(|c| c.steps);
    let status = std::fs::read_to_string(run.join("result.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .and_then(|v| v["status"].as_str().map(str::to_string))
        .unwrap_or_else(|| {
            if run.join("train.log").exists() {
                "running".into()
            } else {
                "not started".into()
            }
        });
    let metrics = run.join("metrics.jsonl");
    let latest = metrics_file::read_main_rank(&metrics)
        .ok()
        .and_then(|m| m.last().cloned());
    let eval = metrics_file::read_evals(&metrics)
        .ok()
        .and_then(|e| e.last().cloned());
    let dash = || "-".to_string();
    let (eval_loss, perplexity) = match &eval {
        Some(e) => (
            format!("{:.4}", e.eval_loss),
            format!("{:.2}", e.eval_perplexity),
        ),
        None => (dash(), dash()),
    };
    match latest {
        None => vec![
            name,
            status,
            dash(),
            dash(),
            dash(),
            dash(),
            eval_loss,
            perplexity,
            dash(),
            dash(),
            dash(),
        ],
        Some(m) => vec![
            name,
            status,
            match total {
                Some(t) => format!("{}/{t}", m.step),
                None => m.step.to_string(),
            },
            format!("{:.4}", m.loss),
            format!("{:.2e}", m.lr),
            format!("{:.3}", m.grad_norm),
            eval_loss,
            perplexity,
            group_thousands(m.tokens_per_s),
            m.mfu
                .map(|x| format!("{:.1}%", x * 100.0))
                .unwrap_or_else(dash),
            format!("{:.0} MiB", m.peak_memory_bytes as f64 / 1048576.0),
        ],
    }
}

/// Left-aligned first two columns, right-aligned numbers.
fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let mut out = String::new();
        for (i, (cell, w)) in cells.iter().zip(&widths).enumerate() {
            if i > 0 {
                out.push_str("  ");
            }
            if i < 2 {
                out.push_str(&format!("{cell:<w$}"));
            } else {
                out.push_str(&format!("{cell:>w$}"));
            }
        }
        out.trim_end().to_string() + "\n"
    };
    let mut out = line(header.iter().map(|h| h.to_string()).collect());
    for row in rows {
        out.push_str(&line(row.clone()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_table() {
        let t = table(
            &["run", "status", "loss"],
            &[
                vec!["a".into(), "ok".into(), "1.5".into()],
                vec!["long-name".into(), "failed".into(), "10.25".into()],
            ],
        );
        assert_eq!(
            t,
            "run        status   loss\na          ok        1.5\nlong-name  failed  10.25\n"
        );
    }
}
