//! Drawing a [`Panel`] with plotters, and saving a [`Figure`] as SVG or PNG (by the file's
//! extension). Every curve is clipped to its panel's frame before it is drawn (see
//! [`super::series::clip`]), the frame itself is drawn, and a step axis has whole-step
//! ticks.

use super::series::{self, clip, thin, Frame, Point};
use anyhow::{bail, Context};
use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint};
use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use std::path::Path;

/// Every figure's width and the band its title takes, so run and sweep figures line up.
pub const WIDTH: u32 = 1200;
pub const TITLE_HEIGHT: u32 = 44;

/// The colour of panel frames: the SVG tells panels by it (`stroke="#555555"`).
pub const FRAME_COLOR: RGBColor = RGBColor(0x55, 0x55, 0x55);
pub const LEGEND_BORDER: RGBColor = RGBColor(0x99, 0x99, 0x99);
/// The height of a legend entry in 13-pixel text, and what the box adds around them (a
/// little more than plotters draws: what goes below must clear it).
const LEGEND_ROW: i32 = 17;
const LEGEND_PADDING: i32 = 16;
/// Grid lines at the ticks.
pub const MESH_COLOR: RGBColor = RGBColor(0xe4, 0xe4, 0xe4);

/// Tableau's ten colours: distinct, and readable on white.
pub const PALETTE: [RGBColor; 10] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x8c, 0x56, 0x4b),
    RGBColor(0xe3, 0x77, 0xc2),
    RGBColor(0x7f, 0x7f, 0x7f),
    RGBColor(0xbc, 0xbd, 0x22),
    RGBColor(0x17, 0xbe, 0xcf),
];

/// A dashed line: `on` pixels drawn, then `off` pixels left out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dash {
    pub on: u32,
    pub off: u32,
}

/// The line styles curves take once the palette's colours are used up: solid, dashed,
/// dotted, sparse dashes (each tells itself apart within a legend's 20-pixel sample).
pub const DASHES: [Option<Dash>; 4] = [
    None,
    Some(Dash { on: 8, off: 4 }),
    Some(Dash { on: 2, off: 3 }),
    Some(Dash { on: 4, off: 8 }),
];

/// The colour and line style of curve `i` of many in one panel: every colour solid, then
/// every colour dashed, and so on, so the first `PALETTE.len() * DASHES.len()` curves
/// are each drawn their own way.
pub fn pen(i: usize) -> (RGBColor, Option<Dash>) {
    (
        PALETTE[i % PALETTE.len()],
        DASHES[i / PALETTE.len() % DASHES.len()],
    )
}

/// How an axis labels its ticks.
#[derive(Debug, Clone, PartialEq)]
pub enum TickFormat {
    /// Whole numbers (steps).
    Steps,
    /// Values with as many digits as the tick spacing needs.
    Values,
    /// The axis is log10 of the value; ticks show the value.
    Log10,
    /// Tick `i` is category `i`'s name.
    Categories(Vec<String>),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Axis {
    pub lo: f64,
    pub hi: f64,
    pub ticks: Vec<f64>,
    pub format: TickFormat,
    pub label: String,
}

impl Axis {
    /// A step axis over `lo..=hi` with whole-step ticks.
    pub fn steps(lo: f64, hi: f64) -> Axis {
        let (lo, hi) = if hi > lo {
            (lo, hi)
        } else {
            (lo - 1.0, hi + 1.0)
        };
        Axis {
            lo,
            hi,
            ticks: series::step_ticks(lo, hi, 8),
            format: TickFormat::Steps,
            label: "step".into(),
        }
    }

    /// A value axis over `range`, linear, or log10 of the values when `log` (the range is
    /// then of exponents).
    pub fn values(range: (f64, f64), log: bool, label: &str) -> Axis {
        let (lo, hi) = range;
        let (ticks, format) = if log {
            (series::log_ticks(lo, hi), TickFormat::Log10)
        } else {
            (series::ticks(lo, hi, 5).0, TickFormat::Values)
        };
        Axis {
            lo,
            hi,
            ticks,
            format,
            label: label.into(),
        }
    }

    fn tick_text(&self, value: f64) -> String {
        match &self.format {
            // A tick at 0 computed as -1e-17 must not read "-0" (-0.0 + 0.0 is 0.0).
            TickFormat::Steps => format!("{:.0}", value.round() + 0.0),
            TickFormat::Values => {
                let step = self
                    .ticks
                    .windows(2)
                    .map(|w| w[1] - w[0])
                    .next()
                    .unwrap_or((self.hi - self.lo).abs());
                // One style per axis: 5k, 10k, 15k rather than 5000, 10k, 15k (and past
                // tera, tick_label's digits: a constant 1e30 has ticks 1.005e30 apart).
                let largest = self.ticks.iter().fold(0f64, |m, t| m.max(t.abs()));
                if (1e4..1e12).contains(&largest) {
                    series::si(if value.abs() < step.abs() * 1e-6 {
                        0.0
                    } else {
                        value
                    })
                } else {
                    series::tick_label(value, step)
                }
            }
            TickFormat::Log10 => {
                let ticks: Vec<f64> = self.ticks.iter().map(|t| 10f64.powf(*t)).collect();
                series::log_tick_label(10f64.powf(value), &ticks)
            }
            TickFormat::Categories(names) => names
                .get(value.round() as usize)
                .cloned()
                .unwrap_or_default(),
        }
    }
}

/// A linear coordinate whose grid lines and labels are exactly the axis's ticks.
struct Ticked {
    inner: RangedCoordf64,
    ticks: Vec<f64>,
}

impl Ticked {
    fn of(axis: &Axis) -> Ticked {
        Ticked {
            inner: (axis.lo..axis.hi).into(),
            ticks: axis.ticks.clone(),
        }
    }
}

impl Ranged for Ticked {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        self.inner.map(value, limit)
    }

    fn key_points<Hint: KeyPointHint>(&self, hint: Hint) -> Vec<f64> {
        if hint.weight().allow_light_points() {
            Vec::new()
        } else {
            self.ticks.clone()
        }
    }

    fn range(&self) -> std::ops::Range<f64> {
        self.inner.range()
    }
}

/// A curve of a panel.
#[derive(Debug, Clone)]
pub struct Curve {
    pub points: Vec<Point>,
    pub color: RGBColor,
    /// `None`: a solid line.
    pub dash: Option<Dash>,
    pub width: u32,
    /// 1.0 opaque; raw curves under a smoothed one are faint.
    pub opacity: f64,
    pub label: Option<String>,
}

/// Points marked with dots (evaluations, final losses).
#[derive(Debug, Clone)]
pub struct Dots {
    pub points: Vec<Point>,
    pub color: RGBColor,
    pub label: Option<String>,
    /// Rings rather than discs: values that are not final yet.
    pub hollow: bool,
}

/// A vertical line at a step: something that happened to the run.
#[derive(Debug, Clone, PartialEq)]
pub struct Marker {
    pub step: f64,
    pub color: RGBColor,
    pub width: u32,
    pub opacity: f64,
    /// The legend entry of this kind of marker (the first of a kind carries it).
    pub kind: String,
    /// Written next to the line in panels that label markers, on this line of text from
    /// the top (markers close together do not write over each other).
    pub text: Option<String>,
    pub text_row: u32,
}

#[derive(Debug, Clone)]
pub struct Panel {
    pub title: String,
    pub x: Axis,
    pub y: Axis,
    pub curves: Vec<Curve>,
    pub dots: Vec<Dots>,
    pub markers: Vec<Marker>,
    pub legend: bool,
    pub marker_text: bool,
    /// A last legend line with no sample beside it ("... and 18 more point(s)").
    pub legend_note: Option<String>,
}

/// What a figure is drawn onto: whether it has text (a font was found), and whether it is
/// a raster (PNG), where plotters fills a thick path as one polygon whose joins go wild where
/// the path turns back on itself (a noisy curve with several steps to a pixel column).
#[derive(Debug, Clone, Copy)]
pub struct Surface {
    pub text: bool,
    pub raster: bool,
}

/// Something drawn into a drawing area of any backend.
pub trait Figure {
    fn size(&self) -> (u32, u32);
    fn draw<DB: DrawingBackend>(
        &self,
        root: DrawingArea<DB, Shift>,
        surface: Surface,
    ) -> anyhow::Result<()>;
}

/// The formats a figure is drawn in, by the output's extension.
enum Format {
    Svg,
    Png,
}

/// The format `output` names, or why it names none: asked before anything is read or said.
pub fn check_format(output: &Path) -> anyhow::Result<()> {
    format_of(output).map(|_| ())
}

fn format_of(output: &Path) -> anyhow::Result<Format> {
    let extension = output.extension().and_then(|e| e.to_str());
    match extension.map(str::to_ascii_lowercase).as_deref() {
        Some("svg") => Ok(Format::Svg),
        Some("png") => Ok(Format::Png),
        _ => bail!(
            "cannot tell the format of {}: name it .svg or .png",
            output.display()
        ),
    }
}

/// Draws `figure` into `output`: SVG or PNG by the extension. PNG needs a TrueType font for
/// its text; SVG without one is drawn unlabelled, saying so.
pub fn save(figure: &impl Figure, output: &Path) -> anyhow::Result<()> {
    check_format(output)?;
    // Asked before drawing, whose backends say only "permission denied" at the end (a run
    // directory of another user's, read-only).
    let existed = output.exists();
    if let Err(e) = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(output)
    {
        bail!(
            "cannot write {}: {e}\n  fix: write the figure elsewhere: `-o <file>.svg` (or .png)",
            output.display()
        );
    }
    let drawn = draw(figure, output);
    if drawn.is_err() && !existed {
        let _ = std::fs::remove_file(output);
    }
    drawn
}

fn draw(figure: &impl Figure, output: &Path) -> anyhow::Result<()> {
    let font = register_system_font();
    let size = figure.size();
    match format_of(output)? {
        Format::Svg => {
            if let Err(e) = &font {
                errln!("warning: drawing without labels: {e}");
            }
            figure.draw(
                SVGBackend::new(output, size).into_drawing_area(),
                Surface {
                    text: font.is_ok(),
                    raster: false,
                },
            )
        }
        Format::Png => {
            font?;
            figure.draw(
                BitMapBackend::new(output, size).into_drawing_area(),
                Surface {
                    text: true,
                    raster: true,
                },
            )
        }
    }
    .with_context(|| format!("cannot draw {}", output.display()))
}

/// plotters' errors carry the backend's error type; they become text here.
pub fn err<E: std::fmt::Display>(e: E) -> anyhow::Error {
    anyhow::anyhow!("{e}")
}

/// `root` under its title: 24-pixel text, smaller (to 14) where that would not fit the width,
/// and cut short with "…" past that (a sweep point's run name and parameters make long
/// titles, which centred text would spill past both edges).
pub fn titled<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
) -> anyhow::Result<DrawingArea<DB, Shift>> {
    let room = root.dim_in_pixel().0.saturating_sub(24);
    let fits = |text: &str, size: u32| {
        let style = TextStyle::from(("sans-serif", size).into_font());
        root.estimate_text_size(text, &style)
            .map_or(true, |(width, _)| width <= room)
    };
    let mut size = 24;
    while size > 14 && !fits(title, size) {
        size -= 1;
    }
    let mut text = title.to_string();
    while !fits(&text, size) && text.chars().count() > 1 {
        let kept: String = text
            .chars()
            .take(text.chars().count().saturating_sub(2))
            .collect();
        text = format!("{}…", kept.trim_end_matches('…'));
    }
    root.titled(&text, ("sans-serif", size)).map_err(err)
}

/// TrueType fonts tried for text (PNG needs one; SVG layout uses one for sizes).
const FONT_CANDIDATES: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
];

/// plotters' `ab_glyph` text renderer takes a font registered by name. `SHARDRUN_PLOT_FONT`
/// may name another `.ttf`.
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
        let registered = std::fs::read(path).is_ok_and(|bytes| {
            // Registered fonts must live for the whole program.
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok()
        });
        if registered {
            let _ = REGISTERED.set(true);
            return Ok(());
        }
        // The font asked for is not used: said, rather than drawn in another one silently.
        if custom.as_deref() == Some(path) {
            errln!(
                "warning: SHARDRUN_PLOT_FONT={path} is not a TrueType font that can be read; \
                 using a system font"
            );
        }
    }
    bail!(
        "labels need a TrueType font and none was found (tried {}); install fonts-dejavu-core \
         or set SHARDRUN_PLOT_FONT to a .ttf file (SVG output works without one, unlabelled)",
        FONT_CANDIDATES.join(", ")
    )
}

/// Draws `panel` into `area`: axes, frame, markers, curves cut to the frame, dots inside it,
/// and the legend.
pub fn draw_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    panel: &Panel,
    surface: Surface,
) -> anyhow::Result<()> {
    let text = surface.text;
    let (x, y) = (&panel.x, &panel.y);
    let frame = Frame {
        x0: x.lo,
        x1: x.hi,
        y0: y.lo,
        y1: y.hi,
    };
    let mut builder = ChartBuilder::on(area);
    builder
        .margin(8)
        // Room for half the last x tick's label, centred on the frame's right edge.
        .margin_right(if text { 24 } else { 8 })
        .x_label_area_size(if text { 32 } else { 0 })
        .y_label_area_size(if text { 64 } else { 0 });
    if text {
        builder.caption(&panel.title, ("sans-serif", 17));
    }
    let mut chart = builder
        .build_cartesian_2d(Ticked::of(x), Ticked::of(y))
        .map_err(err)?;
    let x_text = |v: &f64| x.tick_text(*v);
    let y_text = |v: &f64| y.tick_text(*v);
    let mut mesh = chart.configure_mesh();
    mesh.bold_line_style(MESH_COLOR)
        .light_line_style(TRANSPARENT)
        .axis_style(FRAME_COLOR);
    if text {
        mesh.x_label_formatter(&x_text)
            .y_label_formatter(&y_text)
            .x_desc(x.label.as_str())
            .y_desc(y.label.as_str())
            .label_style(("sans-serif", 12));
    } else {
        mesh.x_labels(0).y_labels(0);
    }
    mesh.draw().map_err(err)?;
    chart
        .draw_series(std::iter::once(Rectangle::new(
            [(x.lo, y.lo), (x.hi, y.hi)],
            FRAME_COLOR.stroke_width(1),
        )))
        .map_err(err)?;

    // The legend goes to the corner where it hides the least data; labels of markers on its
    // side of an upper corner go below it.
    let legend_entries = legend_entries(panel);
    let legend_height = LEGEND_ROW * legend_entries.len() as i32 + LEGEND_PADDING;
    let corner = match (panel.legend && text, legend_entries.is_empty()) {
        (true, false) => {
            let font = ("sans-serif", 13).into_font();
            let widest = legend_entries
                .iter()
                .filter_map(|entry| font.box_size(entry).ok())
                .map(|(w, _)| w as i32)
                .max()
                .unwrap_or(0);
            // plotters' box: a 30-pixel sample column and a 10-pixel margin all round.
            let size = (widest + 30 + 20, legend_height);
            Some(least_covered_corner(&chart, panel, &frame, size))
        }
        _ => None,
    };
    let below_legend = |right_side: bool| match (&corner, right_side) {
        (Some(SeriesLabelPosition::UpperRight), true)
        | (Some(SeriesLabelPosition::UpperLeft), false) => legend_height,
        _ => 0,
    };
    let mut kinds_shown: Vec<&str> = Vec::new();
    for marker in &panel.markers {
        if marker.step < x.lo || marker.step > x.hi {
            continue;
        }
        let style = marker.color.mix(marker.opacity).stroke_width(marker.width);
        let anno = chart
            .draw_series(std::iter::once(PathElement::new(
                vec![(marker.step, y.lo), (marker.step, y.hi)],
                style,
            )))
            .map_err(err)?;
        if panel.legend && !kinds_shown.contains(&marker.kind.as_str()) {
            kinds_shown.push(&marker.kind);
            anno.label(marker.kind.clone()).legend(move |(px, py)| {
                PathElement::new(vec![(px + 10, py - 6), (px + 10, py + 6)], style)
            });
        }
        if let (true, true, Some(label)) = (text, panel.marker_text, &marker.text) {
            // Right of the line, or left of it in the right third of the panel.
            let right_side = marker.step > x.lo + (x.hi - x.lo) * 0.67;
            let anchor = if right_side { HPos::Right } else { HPos::Left };
            let style = ("sans-serif", 12)
                .into_font()
                .color(&marker.color)
                .pos(Pos::new(anchor, VPos::Top));
            let (offset, top) = if right_side {
                (-4, 4 + below_legend(true))
            } else {
                (4, 4 + below_legend(false))
            };
            chart
                .draw_series(std::iter::once(
                    EmptyElement::at((marker.step, y.hi))
                        + Text::new(
                            label.clone(),
                            (offset, top + 15 * marker.text_row as i32),
                            style,
                        ),
                ))
                .map_err(err)?;
        }
    }

    // Long runs have many steps to a pixel column: drawn thinned (see `thin`).
    let columns = area.dim_in_pixel().0 as usize;
    let plot_width = chart.plotting_area().dim_in_pixel().0;
    for curve in &panel.curves {
        let style = curve.color.mix(curve.opacity).stroke_width(curve.width);
        let parts: Vec<Vec<Point>> = clip(&curve.points, &frame)
            .into_iter()
            .map(|part| thin(&part, x.lo, x.hi, columns))
            .collect();
        let (mut lines, singles): (Vec<Vec<Point>>, Vec<Vec<Point>>) =
            parts.into_iter().partition(|p| p.len() > 1);
        if let Some(Dash { on, off }) = curve.dash {
            let x_per_pixel = (x.hi - x.lo) / f64::from(plot_width.max(1));
            let (on, off) = (f64::from(on) * x_per_pixel, f64::from(off) * x_per_pixel);
            lines = lines
                .iter()
                .flat_map(|line| series::dashed_along_x(line, x.lo, on, off))
                .collect();
        }
        if surface.raster && curve.width > 1 {
            // Each segment its own path: a rectangle, with no join to go wrong.
            lines = lines
                .iter()
                .flat_map(|line| line.windows(2).map(<[Point]>::to_vec))
                .collect();
        }
        let label = curve.label.clone().filter(|_| panel.legend);
        let anno = chart
            .draw_series(lines.into_iter().map(|p| PathElement::new(p, style)))
            .map_err(err)?;
        // The legend's sample is drawn as the curve is, dashes included (a level line: its
        // dashes along the line are those along x).
        if let Some(label) = label {
            let dash = curve.dash;
            anno.label(label).legend(move |(px, py)| {
                let sample = vec![(px, py), (px + 20, py)];
                match dash {
                    None => PathElement::new(sample, style).into_dyn(),
                    Some(Dash { on, off }) => {
                        DashedPathElement::new(sample, on, off, style).into_dyn()
                    }
                }
            });
        }
        chart
            .draw_series(
                singles
                    .into_iter()
                    .flatten()
                    .map(|p| Circle::new(p, 3, style.filled())),
            )
            .map_err(err)?;
    }
    for dots in &panel.dots {
        let style = if dots.hollow {
            dots.color.stroke_width(2)
        } else {
            dots.color.filled()
        };
        let inside: Vec<Point> = dots
            .points
            .iter()
            .copied()
            .filter(|p| frame.contains(*p))
            .collect();
        let anno = chart
            .draw_series(inside.into_iter().map(|p| Circle::new(p, 4, style)))
            .map_err(err)?;
        if let (true, Some(label)) = (panel.legend, &dots.label) {
            anno.label(label.clone())
                .legend(move |(px, py)| Circle::new((px + 10, py), 4, style));
        }
    }
    if let (true, Some(note)) = (panel.legend, &panel.legend_note) {
        chart
            .draw_series(std::iter::empty::<PathElement<Point>>())
            .map_err(err)?
            .label(note.clone())
            .legend(|(px, py)| EmptyElement::at((px, py)));
    }
    if let Some(corner) = corner {
        chart
            .configure_series_labels()
            .position(corner)
            .background_style(WHITE.mix(0.85))
            .border_style(LEGEND_BORDER)
            .label_font(("sans-serif", 13))
            .draw()
            .map_err(err)?;
    }
    Ok(())
}

/// The lines of `panel`'s legend, in plotters' order: each kind of marker in view, then the
/// named curves, the named dots, and the note.
fn legend_entries(panel: &Panel) -> Vec<String> {
    let (lo, hi) = (panel.x.lo, panel.x.hi);
    let mut kinds: Vec<String> = Vec::new();
    for marker in panel
        .markers
        .iter()
        .filter(|m| m.step >= lo && m.step <= hi)
    {
        if !kinds.contains(&marker.kind) {
            kinds.push(marker.kind.clone());
        }
    }
    kinds
        .into_iter()
        .chain(panel.curves.iter().filter_map(|c| c.label.clone()))
        .chain(panel.dots.iter().filter_map(|d| d.label.clone()))
        .chain(panel.legend_note.clone())
        .collect()
}

/// The corner of the plotting area where a legend box of `size` pixels covers the fewest of
/// `panel`'s points (a dot, one datum, weighs as much as a stretch of curve); the upper right
/// on a tie, as plotting libraries place a legend by default.
fn least_covered_corner<DB: DrawingBackend>(
    chart: &ChartContext<DB, Cartesian2d<Ticked, Ticked>>,
    panel: &Panel,
    frame: &Frame,
    (w, h): (i32, i32),
) -> SeriesLabelPosition {
    let (xs, ys) = chart.plotting_area().get_pixel_range();
    // plotters sets the box 5 pixels in from the plotting area's edges.
    let (left, right) = (xs.start + 5, xs.end - 5 - w);
    let (top, bottom) = (ys.start + 5, ys.end - 5 - h);
    let corners = [
        (SeriesLabelPosition::UpperRight, (right, top)),
        (SeriesLabelPosition::UpperLeft, (left, top)),
        (SeriesLabelPosition::LowerRight, (right, bottom)),
        (SeriesLabelPosition::LowerLeft, (left, bottom)),
    ];
    let covered = |(x0, y0): (i32, i32), point: &Point| {
        let (px, py) = chart.backend_coord(point);
        px >= x0 && px <= x0 + w && py >= y0 && py <= y0 + h
    };
    // Curves of many steps are sampled: where they run, not each step, is what counts; a
    // line of few points is followed between them (it may cross a corner with none inside).
    const SAMPLES: usize = 2_000;
    const BETWEEN: usize = 8;
    const DOT_WEIGHT: usize = 25;
    let count = |corner: (i32, i32)| -> usize {
        let on_curves: usize = panel
            .curves
            .iter()
            .map(|curve| {
                let every = curve.points.len().div_ceil(SAMPLES).max(1);
                let sampled: Vec<Point> = curve.points.iter().step_by(every).copied().collect();
                let along = sampled.windows(2).flat_map(|pair| {
                    let (a, b) = (pair[0], pair[1]);
                    (0..BETWEEN).map(move |i| {
                        let t = i as f64 / BETWEEN as f64;
                        (a.0 + t * (b.0 - a.0), a.1 + t * (b.1 - a.1))
                    })
                });
                along
                    .chain(sampled.last().copied())
                    .filter(|p| frame.contains(*p) && covered(corner, p))
                    .count()
                    * every
            })
            .sum();
        let on_dots: usize = panel
            .dots
            .iter()
            .flat_map(|dots| &dots.points)
            .filter(|p| frame.contains(**p) && covered(corner, p))
            .count();
        on_curves + DOT_WEIGHT * on_dots
    };
    corners
        .into_iter()
        .map(|(position, at)| (count(at), position))
        .min_by_key(|(covered, _)| *covered)
        .map(|(_, position)| position)
        .unwrap_or(SeriesLabelPosition::UpperRight)
}

/// `area` split into rows of at most `per_row` panels; a short last row's panels are wider.
pub fn grid<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    count: usize,
    per_row: usize,
) -> Vec<DrawingArea<DB, Shift>> {
    if count == 0 {
        return Vec::new();
    }
    let rows = count.div_ceil(per_row);
    let mut out = Vec::new();
    for (r, row) in area.split_evenly((rows, 1)).into_iter().enumerate() {
        let in_row = per_row.min(count - r * per_row);
        out.extend(row.split_evenly((1, in_row)));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_format_is_told_by_the_extension_in_either_case() {
        for (name, svg) in [
            ("a.svg", true),
            ("a.SVG", true),
            ("a.png", false),
            ("b.PNG", false),
        ] {
            let format = format_of(Path::new(name)).unwrap();
            assert_eq!(matches!(format, Format::Svg), svg, "{name}");
        }
        assert!(format_of(Path::new("a.pdf")).is_err());
    }

    /// The font sizes (as the SVG writes them: plotters scales a size in pixels by 0.8) and
    /// texts of an SVG's text elements.
    fn svg_texts(svg: &str) -> Vec<(u32, String)> {
        svg.split("<text")
            .skip(1)
            .filter_map(|element| {
                let size = element.split("font-size=\"").nth(1)?.split('"').next()?;
                let text = element.split('>').nth(1)?.split('<').next()?;
                Some((size.parse::<f64>().ok()? as u32, text.trim().to_string()))
            })
            .collect()
    }

    fn title_of(title: &str) -> (u32, String) {
        register_system_font().expect("a TrueType font (scripts/setup.sh installs one)");
        let mut svg = String::new();
        {
            let root = SVGBackend::with_string(&mut svg, (WIDTH, 100)).into_drawing_area();
            titled(&root, title).unwrap();
            root.present().unwrap();
        }
        let texts = svg_texts(&svg);
        assert_eq!(texts.len(), 1, "{svg}");
        texts[0].clone()
    }

    #[test]
    fn a_title_too_wide_is_made_smaller_then_cut_short() {
        // 24 pixels, 14 at the least.
        let (largest, smallest) = (24 * 8 / 10, 14 * 8 / 10);
        assert_eq!(title_of("loss"), (largest, "loss".into()));
        // About 1.3 times the width at 24 pixels: smaller, whole.
        let long = "mlp-sweep-d512b413b62d4059 (batch_size_per_device=1, lr=3e-4, seq_len=2048, warmup=10): step 500, loss 2.0431, 1 rank";
        let (size, text) = title_of(long);
        assert!(
            (smallest..largest).contains(&size) && text == long,
            "{size} {text}"
        );
        // Past what 14 pixels fit: cut, with an ellipsis.
        let longer = long.repeat(3);
        let (size, text) = title_of(&longer);
        assert!(
            size == smallest
                && text.ends_with('…')
                && longer.starts_with(text.trim_end_matches('…')),
            "{size} {text}"
        );
    }

    #[test]
    fn a_step_axis_with_room_before_step_0_reads_0_not_minus_0() {
        // A run plot leaves room left of its first step: the first tick is then -0.0.
        let axis = Axis::steps(-20.0, 440.0);
        let texts: Vec<String> = axis.ticks.iter().map(|&t| axis.tick_text(t)).collect();
        assert_eq!(texts.first().map(String::as_str), Some("0"), "{texts:?}");
        assert!(texts.iter().all(|t| !t.starts_with('-')), "{texts:?}");
    }

    /// Where the legend's box is drawn in an SVG of `panel` (its border's colour tells it):
    /// left or right half, top or bottom half.
    fn legend_corner_of(panel: &Panel) -> (bool, bool) {
        register_system_font().expect("a TrueType font (scripts/setup.sh installs one)");
        let (width, height) = (800u32, 500u32);
        let mut svg = String::new();
        {
            let root = SVGBackend::with_string(&mut svg, (width, height)).into_drawing_area();
            let surface = Surface {
                text: true,
                raster: false,
            };
            draw_panel(&root, panel, surface).unwrap();
            root.present().unwrap();
        }
        let border = format!(
            "stroke=\"#{:02X}{:02X}{:02X}\"",
            LEGEND_BORDER.0, LEGEND_BORDER.1, LEGEND_BORDER.2
        );
        let legend = svg
            .split("<rect")
            .find(|rect| rect.split("/>").next().is_some_and(|r| r.contains(&border)))
            .unwrap_or_else(|| panic!("no legend box in {svg}"));
        let attribute = |name: &str| -> f64 {
            legend
                .split(&format!(" {name}=\""))
                .nth(1)
                .unwrap()
                .split('"')
                .next()
                .unwrap()
                .parse()
                .unwrap()
        };
        let (x, y) = (attribute("x"), attribute("y"));
        (x > f64::from(width) / 2.0, y < f64::from(height) / 2.0)
    }

    /// The legend goes where it hides no data: the upper right unless the data is there.
    #[test]
    fn the_legend_goes_to_the_corner_that_hides_the_fewest_points() {
        let panel = |points: Vec<Point>| Panel {
            title: "final loss".into(),
            x: Axis::values((0.0, 10.0), false, "lr"),
            y: Axis::values((0.0, 10.0), false, "loss"),
            curves: Vec::new(),
            dots: vec![Dots {
                points,
                color: PALETTE[0],
                label: Some("seed=0".into()),
                hollow: false,
            }],
            markers: Vec::new(),
            legend: true,
            marker_text: false,
            legend_note: None,
        };
        let (right, top) = (true, true);
        // Worst points up and to the right (a high LR's high loss): the legend leaves them.
        let up_right = vec![(1.0, 1.0), (9.0, 9.5), (9.5, 9.0), (9.8, 9.8)];
        assert_eq!(legend_corner_of(&panel(up_right)), (!right, top));
        let up_left = vec![(0.5, 9.5), (1.0, 9.0), (9.0, 1.0)];
        assert_eq!(legend_corner_of(&panel(up_left)), (right, top));
        // Both upper corners taken: below, on the side that is free.
        let both_up = vec![(0.5, 9.5), (9.5, 9.5), (0.5, 0.5)];
        assert_eq!(legend_corner_of(&panel(both_up)), (right, !top));
        // A line of two points crossing the upper right corner, neither point in it.
        let mut crossing = panel(Vec::new());
        crossing.dots.clear();
        crossing.curves.push(Curve {
            points: vec![(7.0, 10.0), (10.0, 9.0)],
            color: PALETTE[1],
            dash: None,
            width: 2,
            opacity: 1.0,
            label: Some("seed=1".into()),
        });
        assert_eq!(legend_corner_of(&crossing), (!right, top));
    }

    /// A thick, noisy curve of several steps to a pixel column (it turns back on itself
    /// within a column) drawn into the top half of a PNG-like raster: nothing of its color
    /// lands in the bottom half, where the panels below it would be.
    #[test]
    fn a_thick_noisy_curve_stays_in_its_panel_on_a_raster() {
        let (width, height) = (400u32, 400u32);
        let color = RGBColor(44, 160, 44);
        let points = series::noisy_curve(3000, 7, |noise| 1.0 + 4.0 * noise * noise * noise);
        let panel = Panel {
            title: "gradient norm".into(),
            x: Axis::steps(1.0, 3000.0),
            y: Axis::values((0.0, 6.0), false, "norm"),
            curves: vec![Curve {
                points,
                color,
                dash: None,
                width: 2,
                opacity: 1.0,
                label: None,
            }],
            dots: Vec::new(),
            markers: Vec::new(),
            legend: false,
            marker_text: false,
            legend_note: None,
        };
        let mut pixels = vec![255u8; (width * height * 3) as usize];
        {
            let root = BitMapBackend::with_buffer(&mut pixels, (width, height)).into_drawing_area();
            let (top, _) = root.split_vertically(height / 2);
            let surface = Surface {
                text: false,
                raster: true,
            };
            draw_panel(&top, &panel, surface).unwrap();
            root.present().unwrap();
        }
        let [r, g, b] = [color.0, color.1, color.2];
        let curve_in = |rows: std::ops::Range<u32>| {
            rows.flat_map(|y| (0..width).map(move |x| ((y * width + x) * 3) as usize))
                .filter(|&i| pixels[i..i + 3] == [r, g, b])
                .count()
        };
        assert!(curve_in(0..height / 2) > 1000, "the curve is drawn");
        assert_eq!(curve_in(height / 2..height), 0, "the curve left its panel");
    }
}
