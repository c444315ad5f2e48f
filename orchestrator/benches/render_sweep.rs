//! Benchmark: plan and render a 10,000-point sweep (100 learning rates × 100 seeds).
//!
//!   cargo bench -p shardrun --bench render_sweep
//!
//! Prints the time to parse the spec, expand and resolve every point (defaults, batch split,
//! memory estimate, point key), and render each point's sbatch script plus the array script.
//! Target: under 1 s on the project's 2-core machine.

use shardrun::sbatch::{render_sbatch, ScriptTarget};
use shardrun::{spec, sweeps};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn spec_text(lrs: usize, seeds: usize) -> String {
    let mut text = String::from(include_str!("../../examples/demo.yaml"));
    text.push_str("sweep:\n  grid:\n    training.optimizer.lr: [");
    for i in 0..lrs {
        let _ = write!(
            text,
            "{}{:e}",
            if i > 0 { ", " } else { "" },
            1e-4 * (1.0 + i as f64 / 10.0)
        );
    }
    text.push_str("]\n    training.seed: [");
    for i in 0..seeds {
        let _ = write!(text, "{}{i}", if i > 0 { ", " } else { "" });
    }
    text.push_str("]\n  throttle: 64\n");
    text
}

fn main() {
    let text = spec_text(100, 100);
    let exe = Path::new("/opt/shardrun/bin/shardrun");
    let root = PathBuf::from("/scratch/runs/demo");
    let mut totals = Vec::new();
    for round in 0..5 {
        let start = Instant::now();
        let loaded = spec::parse(&text, Path::new("bench.yaml")).expect("bench spec parses");
        let parsed = start.elapsed();
        let points = sweeps::expand(&loaded, &shardrun::resolve::Overrides::submitting())
            .expect("bench sweep expands");
        let planned = start.elapsed();
        let mut bytes = 0;
        for point in &points {
            let target = ScriptTarget::Single {
                run_dir: root.join(&point.name),
            };
            bytes += render_sbatch(&point.job, &target, exe)
                .expect("renders")
                .len();
        }
        let array = ScriptTarget::Array {
            points_file: root.join("arrays/points.txt"),
            log_dir: root.join("slurm"),
            tasks: points.len(),
            throttle: Some(64),
        };
        bytes += render_sbatch(&points[0].job, &array, exe)
            .expect("renders")
            .len();
        let total = start.elapsed();
        assert_eq!(points.len(), 10_000);
        println!(
            "round {round}: {} points: parse {:.1} ms, plan {:.1} ms, render {:.1} ms ({} KiB of scripts), total {:.1} ms",
            points.len(),
            ms(parsed),
            ms(planned - parsed),
            ms(total - planned),
            bytes / 1024,
            ms(total)
        );
        totals.push(total);
    }
    totals.sort();
    println!("10,000-point sweep planned and rendered: best {:.1} ms, median {:.1} ms (target < 1000 ms)", ms(totals[0]), ms(totals[totals.len() / 2]));
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
