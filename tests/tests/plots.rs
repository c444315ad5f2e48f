//! `shardrun plot` of a real run that failed and was resumed: the SVG is read back and must
//! hold every panel, the raw and smoothed loss, a marker for each checkpoint, the failure
//! and the resume (in every panel, at the right step), the legend entries, and no drawn
//! point outside its panel; the PNG must be the same picture in pixels. PNG text needs the
//! TrueType font set-up installs (fonts-dejavu-core): without it this test fails.

use shardrun_e2e::figure::{read_png, read_svg, rgb};
use shardrun_e2e::jobs::*;
use shardrun_e2e::*;
use std::time::Duration;

const RESUMED: &str = "#2CA02C";
const CHECKPOINT: &str = "#707070";
const FAILED: &str = "#D62728";
const PANELS: [&str; 5] = [
    "loss",
    "learning rate",
    "gradient norm",
    "tokens/s (whole job)",
    "peak resident memory, RSS (the rank with the most)",
];

#[test]
fn a_resumed_run_plots_its_checkpoints_failure_and_resume_inside_every_panel() {
    let dir = TestDir::new("plots");
    let mut text = tiny_mlp_spec("resumed", 20, 2);
    text.push_str("  checkpoint: { interval_steps: 5, keep: 5 }\n");
    let spec = dir.write("resumed.yaml", &text);
    // Rank 1 fails at step 8: the run stops after its checkpoint of step 5 ...
    let envs = [("SHARDRUN_INJECT_FAILURE", "1:8".to_string())];
    let (out, run) = run_local(
        &dir,
        &spec,
        &["--nproc", "2", "--no-progress"],
        &envs,
        Duration::from_secs(120),
    );
    assert!(!out.status.success(), "the injected failure fails the job");
    // ... and the same command again resumes it from there to the end.
    let (out, _) = run_local(
        &dir,
        &spec,
        &["--nproc", "2", "--no-progress"],
        &[],
        Duration::from_secs(120),
    );
    assert!(
        out.status.success(),
        "{}{}",
        stdout_of(&out),
        stderr_of(&out)
    );
    assert!(
        stdout_of(&out).contains("from its checkpoint of step 5"),
        "{}",
        stdout_of(&out)
    );

    let events = std::fs::read_to_string(run.join("events.jsonl")).unwrap();
    let kinds: Vec<(String, Option<u64>)> = events
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .map(|v| (v["event"].as_str().unwrap().to_string(), v["step"].as_u64()))
        .collect();
    let failed_at = kinds
        .iter()
        .find(|(k, _)| k == "failed")
        .and_then(|(_, s)| *s)
        .expect("a failed event with a step");
    assert!((5..8).contains(&failed_at), "{events}");
    let kinds: Vec<(&str, Option<u64>)> = kinds.iter().map(|(k, s)| (k.as_str(), *s)).collect();
    assert_eq!(
        kinds,
        [
            ("started", None),
            ("checkpoint", Some(5)),
            ("failed", Some(failed_at)),
            ("started", None),
            ("resumed", Some(5)),
            ("checkpoint", Some(10)),
            ("checkpoint", Some(15)),
            ("checkpoint", Some(20)),
            ("finished", Some(20)),
        ],
        "{events}"
    );

    let run_arg = run.to_str().expect("a UTF-8 path");
    let plot = |output: &std::path::Path| {
        let output = output.to_str().expect("a UTF-8 path");
        let out = shardrun_in(
            dir.path(),
            &["plot", run_arg, "-o", output],
            Duration::from_secs(60),
        );
        assert!(
            out.status.success(),
            "{}{}\n(PNG text needs a TrueType font: `apt-get install fonts-dejavu-core`, which \
             scripts/setup.sh installs)",
            stdout_of(&out),
            stderr_of(&out)
        );
    };
    let svg_path = dir.join("resumed.svg");
    plot(&svg_path);
    let svg = read_svg(&std::fs::read_to_string(&svg_path).unwrap());

    assert_eq!(svg.frames.len(), PANELS.len(), "one frame per panel");
    for title in PANELS {
        assert!(
            svg.has_text(title),
            "no panel titled {title:?}: {:?}",
            svg.texts
        );
    }
    for legend in [
        "loss",
        "loss, smoothed (EMA 0.6)",
        "checkpoint",
        "resumed",
        "failed",
    ] {
        assert!(
            svg.has_text(legend),
            "no legend entry {legend:?}: {:?}",
            svg.texts
        );
    }
    assert!(svg.has_text("resumed from step 5"), "{:?}", svg.texts);
    assert!(
        svg.has_text(&match failed_at {
            // Steps after the checkpoint were trained again by the resumed attempt.
            6.. => format!("failed after step {failed_at} (then rerun from step 5)"),
            _ => format!("failed after step {failed_at}"),
        }),
        "{:?}",
        svg.texts
    );
    // Whole steps on the step axes.
    for tick in ["5", "10", "15", "20"] {
        assert!(svg.has_text(tick), "{:?}", svg.texts);
        assert!(!svg.has_text(&format!("{tick}.0")), "{:?}", svg.texts);
    }

    let outside = svg.marks_outside_frames();
    assert!(outside.is_empty(), "drawn outside every panel: {outside:?}");

    // Markers run the full height of every panel, at the same x in panels one above the
    // other; checkpoints at 4 distinct steps, the resume at 1, the failure at 1.
    for (color, steps) in [(CHECKPOINT, 4), (RESUMED, 1), (FAILED, 1)] {
        let lines = svg.full_height_lines(color);
        assert_eq!(lines.len(), steps * PANELS.len(), "{color}: {lines:?}");
        for panel in 0..PANELS.len() {
            assert_eq!(
                lines.iter().filter(|(p, _)| *p == panel).count(),
                steps,
                "{color} in panel {panel}"
            );
        }
    }
    let resume_x = |panel: usize| {
        svg.full_height_lines(RESUMED)
            .into_iter()
            .find(|(p, _)| *p == panel)
            .unwrap()
            .1
    };
    // The step axis runs from half a step before the first (1) to half a step past the last
    // (20), so that markers there stay off the frame; the resume sits where step 5 is: 4.5/20
    // of the way along.
    let loss_frame = &svg.frames[0];
    let expected = loss_frame.x + loss_frame.width * 4.5 / 20.0;
    assert!(
        (resume_x(0) - expected).abs() <= 2.0,
        "{} vs {expected}",
        resume_x(0)
    );

    // The loss curves: a raw one (faint) and a smoothed one, each one polyline of 20 points.
    let loss_curves: Vec<_> = svg
        .marks
        .iter()
        .filter(|m| m.stroke == "#1F77B4" && svg.frame_of(m) == Some(0) && m.points.len() == 20)
        .collect();
    assert_eq!(loss_curves.len(), 2, "raw and smoothed loss");
    assert!(
        loss_curves
            .iter()
            .all(|c| c.points.iter().all(|(x, y)| x.is_finite() && y.is_finite())),
        "{loss_curves:?}"
    );
    assert_ne!(loss_curves[0].points, loss_curves[1].points);

    // The PNG is the same figure in pixels.
    let png_path = dir.join("resumed.png");
    plot(&png_path);
    let png = read_png(&std::fs::read(&png_path).unwrap()).unwrap();
    assert_eq!(
        (png.width as f64, png.height as f64),
        (svg.width, svg.height)
    );
    let frame_px = png.count(rgb("#555555"));
    // At least half of every frame's perimeter (markers and curves cross the rest).
    let half_perimeters = svg.frames.iter().map(|f| f.width + f.height).sum::<f64>() as usize;
    assert!(frame_px > half_perimeters, "frames drawn: {frame_px} px");
    assert!(
        png.count(rgb(RESUMED)) >= 5 * 150,
        "the resume marker in every panel"
    );
    assert!(png.count(rgb("#1F77B4")) > 500, "the smoothed loss");
    let white = png.count([255, 255, 255]);
    assert!(
        white < png.rgb.len() * 97 / 100,
        "the PNG has a picture on it"
    );
}

/// A marker at the right end of a panel (a resume one step before the end) is labelled left
/// of its line, where the legend is: the label goes below the legend, not under it.
#[test]
fn a_marker_label_near_the_end_is_drawn_clear_of_the_legend() {
    let dir = TestDir::new("plots-legend");
    let mut text = tiny_mlp_spec("late", 10, 2);
    text.push_str("  checkpoint: { interval_steps: 10 }\n");
    let spec = dir.write("late.yaml", &text);
    for steps in ["11", "12"] {
        let set = format!("training.steps={steps}");
        let (out, _) = run_local(
            &dir,
            &spec,
            &["--nproc", "2", "--no-progress", "--set", &set],
            &[],
            Duration::from_secs(120),
        );
        assert!(out.status.success(), "{}", stderr_of(&out));
    }
    let svg_path = dir.join("late.svg");
    let out = shardrun_in(
        dir.path(),
        &["plot", "run", "-o", svg_path.to_str().unwrap()],
        Duration::from_secs(60),
    );
    assert!(out.status.success(), "{}", stderr_of(&out));
    // A font asked for that cannot be read is said, and a system font draws the labels.
    let png_path = dir.join("late.png");
    let out = run_with_deadline(
        std::process::Command::new(shardrun())
            .current_dir(dir.path())
            .env("SHARDRUN_PLOT_FONT", "/nonexistent/font.ttf")
            .args(["plot", "run", "-o", png_path.to_str().unwrap()]),
        Duration::from_secs(60),
    )
    .unwrap();
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert!(
        stderr_of(&out).contains(
            "warning: SHARDRUN_PLOT_FONT=/nonexistent/font.ttf is not a TrueType font that can \
             be read; using a system font"
        ),
        "{}",
        stderr_of(&out)
    );
    let svg = read_svg(&std::fs::read_to_string(&svg_path).unwrap());
    let labels: Vec<(f64, f64)> = svg
        .placed
        .iter()
        .filter(|(text, _)| text == "resumed from step 11")
        .map(|(_, at)| *at)
        .collect();
    assert!(!labels.is_empty(), "{:?}", svg.texts);
    assert!(!svg.legends.is_empty());
    for (x, y) in labels {
        // Anchored at its right end; its text runs about 120 pixels left, 12 down.
        for corner in [(x, y), (x - 120.0, y), (x, y + 12.0), (x - 120.0, y + 12.0)] {
            assert!(
                svg.legends.iter().all(|l| !l.contains(corner, 0.0)),
                "label at {corner:?} under a legend {:?}",
                svg.legends
            );
        }
    }
}
