//! A sweep folder read back after its points trained on the real Slurm: `status --json` and
//! `metrics --json` carry every point with its parameters and what the tables show, the
//! tables name each point by its values (a column per swept parameter after its name), and
//! `shardrun plot <sweep folder>` overlays every point's loss (legend by the same values)
//! over a final-loss-by-parameter panel, in SVG and PNG, nothing drawn outside its panel.

use shardrun_e2e::figure::{read_png, read_svg};
use shardrun_e2e::*;
use std::process::Command;
use std::time::Duration;

#[test]
fn a_trained_two_parameter_sweep_reports_and_plots_every_point() {
    let cluster = SlurmCluster::start().expect("start the local Slurm cluster");
    let dir = TestDir::new("sweep-reports");
    let name = format!("reports-{}", std::process::id());
    let spec = dir.write(
        "sweep.yaml",
        &format!(
            "name: {name}\nresources:\n  tasks_per_node: 1\n  time: \"00:05:00\"\ntraining:\n  \
             model: {{ kind: mlp, input_dim: 8, hidden_dim: 16, output_dim: 8 }}\n  steps: 6\n  \
             total_batch_size: 4\n  batch_size_per_device: 4\nsweep:\n  grid:\n    \
             training.optimizer.lr: [1.0e-2, 1.0e-3, 1.0e-4]\n    training.seed: [0, 1]\n"
        ),
    );
    let out = cluster
        .shardrun(dir.path(), &["sweep", &spec.to_string_lossy()])
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        stdout_of(&out),
        stderr_of(&out)
    );
    let sweep_dir = dir.join("runs").join(&name);
    let sweep_arg = sweep_dir.to_string_lossy().to_string();

    let mut last = String::new();
    let document = wait_for("every point to complete", Duration::from_secs(300), || {
        let out = cluster
            .shardrun(dir.path(), &["status", "--json", &sweep_arg])
            .ok()?;
        last = stdout_of(&out);
        let runs = status_runs(&last);
        (runs.len() == 6 && runs.iter().all(|r| r["state"] == "COMPLETED")).then(|| last.clone())
    })
    .unwrap_or_else(|e| panic!("{e}; last status: {last}"));

    // status --json: one document, every point with its job, array and parameters.
    let doc: serde_json::Value = serde_json::from_str(&document).unwrap();
    assert_eq!(doc["version"], 1);
    // Ended runs answer from their manifests (null), others from Slurm.
    assert!(
        doc["source"].is_null() || doc["source"].as_str().unwrap().starts_with("squeue"),
        "{doc}"
    );
    let runs = doc["runs"].as_array().unwrap();
    // In the order of their values, as the table lists them (their folders' names are hashes).
    let grid: Vec<(String, u64)> = runs
        .iter()
        .map(|r| {
            let params = &r["sweep_params"];
            (
                params["training.optimizer.lr"].to_string(),
                params["training.seed"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        grid,
        [
            ("0.0001".to_string(), 0),
            ("0.0001".into(), 1),
            ("0.001".into(), 0),
            ("0.001".into(), 1),
            ("0.01".into(), 0),
            ("0.01".into(), 1)
        ]
    );
    // The learning rates in the tables and the legend, in the notation that writes them
    // shortest.
    let values = |params: &serde_json::Value| {
        (
            format!("{:e}", params["training.optimizer.lr"].as_f64().unwrap()),
            params["training.seed"].to_string(),
        )
    };
    let table = stdout_of(
        &cluster
            .shardrun(dir.path(), &["status", &sweep_arg])
            .unwrap(),
    );
    let words = |line: &str| {
        line.split_whitespace()
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    assert_eq!(
        words(table.lines().next().unwrap())[..4],
        ["RUN", "lr", "seed", "STATE"],
        "{table}"
    );
    for r in runs {
        let job = r["job_id"].as_str().expect("a Slurm job id");
        let array = format!("{}/{}", r["array"]["index"], r["array"]["count"]);
        let row = table
            .lines()
            .find(|l| l.starts_with(r["name"].as_str().unwrap()))
            .unwrap_or_else(|| panic!("{} not in\n{table}", r["name"]));
        let (lr, seed) = values(&r["sweep_params"]);
        assert_eq!(words(row)[1..4], [lr, seed, "COMPLETED".into()], "{row:?}");
        for cell in [job, &array] {
            assert!(row.contains(cell), "{cell:?} not in {row:?}");
        }
    }

    // metrics --json: the latest record of every point.
    let out = cluster
        .shardrun(dir.path(), &["metrics", "--json", &sweep_arg])
        .unwrap();
    assert!(out.status.success(), "{}", stderr_of(&out));
    let metrics: serde_json::Value = serde_json::from_str(&stdout_of(&out)).unwrap();
    let points = metrics["runs"].as_array().unwrap();
    assert_eq!(points.len(), 6);
    let names = |runs: &[serde_json::Value]| -> Vec<String> {
        runs.iter().map(|r| r["name"].to_string()).collect()
    };
    assert_eq!(names(points), names(runs), "in the same order as status");
    for p in points {
        assert_eq!(p["latest"]["step"], 6, "{p}");
        assert_eq!(p["total_steps"], 6);
        assert!(p["latest"]["loss"].as_f64().unwrap().is_finite(), "{p}");
        assert!(p["sweep_params"]["training.seed"].is_u64(), "{p}");
    }
    let out = cluster
        .shardrun(dir.path(), &["metrics", &sweep_arg])
        .unwrap();
    let table = stdout_of(&out);
    let header = table.lines().next().unwrap();
    assert_eq!(
        words(header)[..4],
        ["run", "lr", "seed", "status"],
        "{table}"
    );
    assert!(header.contains("  lr now  "), "{table}");
    for p in points {
        let row = table
            .lines()
            .find(|l| l.starts_with(p["name"].as_str().unwrap()))
            .unwrap_or_else(|| panic!("{} not in\n{table}", p["name"]));
        let (lr, seed) = values(&p["sweep_params"]);
        assert_eq!(words(row)[1..4], [lr, seed, "succeeded".into()], "{row:?}");
        let scheduled = format!("{:.2e}", p["latest"]["lr"].as_f64().unwrap());
        assert!(row.contains(&scheduled), "{scheduled:?} not in {row:?}");
    }

    // The figure: every point's loss, labelled by its parameters, and the final losses.
    for ext in ["svg", "png"] {
        let output = dir.join(format!("sweep.{ext}"));
        let out = run_with_deadline(
            Command::new(shardrun())
                .arg("plot")
                .arg(&sweep_dir)
                .arg("-o")
                .arg(&output),
            Duration::from_secs(60),
        )
        .unwrap();
        assert!(
            out.status.success(),
            "{}{} (PNG text needs fonts-dejavu-core, which scripts/setup.sh installs)",
            stdout_of(&out),
            stderr_of(&out)
        );
        assert!(
            stdout_of(&out)
                .contains("final loss by training.optimizer.lr, a line per value of training.seed"),
            "{}",
            stdout_of(&out)
        );
    }
    let svg = read_svg(&std::fs::read_to_string(dir.join("sweep.svg")).unwrap());
    assert_eq!(svg.frames.len(), 2, "the overlay and the final-loss panel");
    for lr in ["1e-2", "1e-3", "1e-4"] {
        for seed in [0, 1] {
            let entry = format!("lr={lr}, seed={seed}");
            assert!(
                svg.has_text(&entry),
                "no legend entry {entry:?}: {:?}",
                svg.texts
            );
        }
    }
    // Points without validation data are compared by their last step's training loss.
    for entry in [
        "seed=0",
        "seed=1",
        "final training loss (last step) by training.optimizer.lr",
    ] {
        assert!(svg.has_text(entry), "{entry:?} not in {:?}", svg.texts);
    }
    let outside = svg.marks_outside_frames();
    assert!(outside.is_empty(), "drawn outside every panel: {outside:?}");
    // The overlay holds 6 curves of 6 steps (and 6 legend samples); the final-loss panel
    // one line of 3 learning rates per seed, with a dot at each of the 6 points.
    let in_panel = |panel: usize, circle: bool, points: usize| {
        svg.marks
            .iter()
            .filter(|m| m.circle == circle && m.points.len() == points)
            .filter(|m| svg.frame_of(m) == Some(panel))
            .count()
    };
    assert_eq!(in_panel(0, false, 6), 6, "{:?}", svg.colour_counts());
    assert_eq!(in_panel(1, false, 3), 2, "{:?}", svg.colour_counts());
    // Six dots for the points, two legend samples (lines, not dots).
    assert_eq!(in_panel(1, true, 1), 6, "{:?}", svg.colour_counts());
    let png = read_png(&std::fs::read(dir.join("sweep.png")).unwrap()).unwrap();
    assert_eq!(
        (png.width as f64, png.height as f64),
        (svg.width, svg.height)
    );
}
