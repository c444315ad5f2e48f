//! `shardrun plot <run>`: loss and throughput curves from `metrics.jsonl`, as SVG (default)
//! or PNG (chosen by the output's extension).

use crate::metrics_file;
use anyhow::{bail, Context};
use plotters::coord::Shift;
use plotters::prelude::*;
use shardrun_protocol::messages::{EvalMetrics, StepMetrics};
use std::path::{Path, PathBuf};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Run directory.
    pub run: PathBuf,
    /// Output file, `.svg` or `.png` (default: `<run>/metrics.svg`).
    #[arg(long, short)]
    pub output: Option<PathBuf>,
}

pub fn execute(args: Args) -> anyhow::Result<()> {
    let metrics_path = args.run.join("metrics.jsonl");
    if !metrics_path.is_file() {
        bail!(
            "no metrics at {}: is {} a run directory, and has the run logged a step yet?",
            metrics_path.display(),
            args.run.display()
        );
    }
    let records = metrics_file::read_main_rank(&metrics_path)?;
    if records.is_empty() {
        bail!(
            "{} has no metrics records yet; try again after the first step",
            metrics_path.display()
        );
    }
    let evals = metrics_file::read_evals(&metrics_path)?;
    let output = args.output.unwrap_or_else(|| args.run.join("metrics.svg"));
    let title = args
        .run
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    draw_file(&output, &title, &records, &evals)?;
    println!("wrote {} ({} steps)", output.display(), records.len());
    Ok(())
}

/// Loss (training, and validation where evaluated) over throughput, by step.
pub fn draw_file(
    output: &Path,
    title: &str,
    records: &[StepMetrics],
    evals: &[EvalMetrics],
) -> anyhow::Result<()> {
    let size = (1000, 700);
    // Text layout needs a font even for SVG; without one, SVG still gets the curves.
    let font = register_system_font();
    match output.extension().and_then(|e| e.to_str()) {
        Some("svg") => {
            if let Err(e) = &font {
                eprintln!("warning: drawing without labels: {e}");
            }
            let area = SVGBackend::new(output, size).into_drawing_area();
            draw(area, title, records, evals, font.is_ok())
        }
        Some("png") => {
            font?;
            draw(
                BitMapBackend::new(output, size).into_drawing_area(),
                title,
                records,
                evals,
                true,
            )
        }
        _ => bail!(
            "cannot tell the format of {}: name it .svg or .png",
            output.display()
        ),
    }
    .with_context(|| format!("cannot draw {}", output.display()))
}

/// TrueType fonts tried for PNG text (SVG leaves text to the viewer and needs none).
const FONT_CANDIDATES: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
];

/// Rasterising text into a PNG needs a font file; plotters' `ab_glyph` renderer takes one
/// registered by name. `SHARDRUN_PLOT_FONT` may name another `.ttf`.
fn register_system_font() -> anyhow::Result<()> {
    static REGISTERED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if REGISTERED.get() == Some(&true) {
        return Ok(());
    }
    let custom = std::env::var("SHARDRUN_PLOT_FONT").ok();
    let candidates = custom
        .iter()
        .map(String::as_str)
        .chain(FONT_CANDIDATES.iter().copied());
    for path in candidates {
        if let Ok(bytes) = std::fs::read(path) {
            // Registered fonts must live for the whole program.
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            if plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
                let _ = REGISTERED.set(true);
                return Ok(());
            }
        }
    }
    bail!(
        "labels need a TrueType font and none was found (tried {}); install fonts-dejavu-core \
         or set SHARDRUN_PLOT_FONT to a .ttf file (SVG output works without one, unlabelled)",
        FONT_CANDIDATES.join(", ")
    )
}

fn draw<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    title: &str,
    records: &[StepMetrics],
    evals: &[EvalMetrics],
    text: bool,
) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow::anyhow!("{e:?}");
    root.fill(&WHITE).map_err(err)?;
    let root = if text {
        root.titled(title, ("sans-serif", 24)).map_err(err)?
    } else {
        root
    };
    let (top, bottom) = root.split_vertically(root.dim_in_pixel().1 / 2);
    let loss: Vec<(f64, f64)> = records.iter().map(|m| (m.step as f64, m.loss)).collect();
    let eval: Vec<(f64, f64)> = evals.iter().map(|e| (e.step as f64, e.eval_loss)).collect();
    let tput: Vec<(f64, f64)> = records
        .iter()
        .map(|m| (m.step as f64, m.tokens_per_s))
        .collect();
    let training = Series {
        name: "training",
        points: &loss,
        color: RED,
    };
    let validation = Series {
        name: "validation",
        points: &eval,
        color: GREEN,
    };
    let loss_series: &[Series] = if eval.is_empty() {
        &[training]
    } else {
        &[training, validation]
    };
    panel(&top, "loss", loss_series, text).map_err(err)?;
    let throughput = Series {
        name: "tokens/s",
        points: &tput,
        color: BLUE,
    };
    panel(&bottom, "tokens/s", &[throughput], text).map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}

/// One curve of a panel (points are marked too: an evaluation every K steps is a few dots).
struct Series<'a> {
    name: &'static str,
    points: &'a [(f64, f64)],
    color: RGBColor,
}

fn panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    label: &str,
    series: &[Series],
    text: bool,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let all = || series.iter().flat_map(|s| s.points.iter());
    let (x0, x1) = range(all().map(|p| p.0));
    let (y0, y1) = range(all().map(|p| p.1).filter(|y| y.is_finite()));
    let mut chart = ChartBuilder::on(area)
        .margin(15)
        .x_label_area_size(if text { 35 } else { 0 })
        .y_label_area_size(if text { 70 } else { 0 })
        .build_cartesian_2d(x0..x1, y0..y1)?;
    if text {
        chart.configure_mesh().x_desc("step").y_desc(label).draw()?;
    } else {
        chart.configure_mesh().x_labels(0).y_labels(0).draw()?;
    }
    for s in series {
        let color = s.color;
        let drawn = chart.draw_series(LineSeries::new(
            s.points.iter().copied(),
            color.stroke_width(2),
        ))?;
        if series.len() > 1 {
            drawn.label(s.name).legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        }
        if s.points.len() <= 200 && series.len() > 1 {
            chart.draw_series(s.points.iter().map(|&p| Circle::new(p, 3, color.filled())))?;
        }
    }
    if series.len() > 1 && text {
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()?;
    }
    Ok(())
}

/// Min and max with some headroom; a flat or single-point series still gets a range.
fn range(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
        (lo.min(v), hi.max(v))
    });
    if !lo.is_finite() {
        return (0.0, 1.0);
    }
    let pad = ((hi - lo) * 0.05).max(hi.abs() * 0.01).max(1e-9);
    (lo - pad, hi + pad)
}
