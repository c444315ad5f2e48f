//! The arithmetic of a chart, apart from drawing: smoothing, the range an axis shows, tick
//! positions and labels, and clipping a curve to its panel: a curve leaving the panel is
//! cut where it crosses the edge and resumes where it comes back (plotters alone would pin
//! each outside point to the edge, drawing a false value along it).

/// A point of a curve: (step, value).
pub type Point = (f64, f64);

/// TensorBoard's smoothing: an exponential moving average with weight `weight` on the past
/// (0: none, 0.99: heavy), debiased so the first values are not pulled towards zero.
/// Non-finite values are skipped (the curve keeps its last smoothed value there).
pub fn ema(points: &[Point], weight: f64) -> Vec<Point> {
    let weight = weight.clamp(0.0, 0.999);
    let mut last = 0.0;
    let mut debias = 1.0;
    let mut out = Vec::with_capacity(points.len());
    for &(x, y) in points {
        if !y.is_finite() {
            continue;
        }
        last = last * weight + (1.0 - weight) * y;
        debias *= weight;
        out.push((x, last / (1.0 - debias)));
    }
    out
}

/// `points` (finite, in step order) with at most four in each of `columns` columns between
/// `lo` and `hi`: the first, lowest, highest and last of each column's, in their order. Drawn a
/// column a pixel, each column's line still spans its lowest to its highest value and joins
/// the next where it did, and a faint curve stays faint (hundreds of overlapping strokes in
/// one column blended into a solid band that hid the smoothed curve); 100,000 steps into
/// 1,000 columns keep at most 4,000 points.
pub fn thin(points: &[Point], lo: f64, hi: f64, columns: usize) -> Vec<Point> {
    if hi <= lo || columns == 0 {
        return points.to_vec();
    }
    let column = |x: f64| ((x - lo) / (hi - lo) * columns as f64).floor() as i64;
    let mut kept = Vec::with_capacity(4 * columns + 4);
    let mut start = 0;
    while start < points.len() {
        let c = column(points[start].0);
        let end = start
            + points[start..]
                .iter()
                .position(|p| column(p.0) != c)
                .unwrap_or(points.len() - start);
        let run = &points[start..end];
        let (mut low, mut high) = (0, 0);
        for (i, p) in run.iter().enumerate() {
            if p.1 < run[low].1 {
                low = i;
            }
            if p.1 > run[high].1 {
                high = i;
            }
        }
        let mut picks = [0, low, high, run.len() - 1];
        picks.sort_unstable();
        let mut last = None;
        for i in picks {
            if last != Some(i) {
                kept.push(run[i]);
                last = Some(i);
            }
        }
        start = end;
    }
    kept
}

/// The `q` quantile (0..=1) of finite values, nearest rank.
pub fn quantile(values: &[f64], q: f64) -> Option<f64> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    Some(v[((v.len() - 1) as f64 * q.clamp(0.0, 1.0)).round() as usize])
}

/// The range a panel shows for `values`, padded by 5% (a flat or single value still gets
/// some height). With `robust` and enough values, the extreme 1% at either end may fall
/// outside (spikes are then clipped at the panel's edge instead of squashing the rest);
/// `keep` values (the smoothed curve) are always inside.
pub fn value_range(values: &[f64], keep: &[f64], robust: bool) -> (f64, f64) {
    let finite = |v: &[f64]| -> Vec<f64> { v.iter().copied().filter(|x| x.is_finite()).collect() };
    let (values, keep) = (finite(values), finite(keep));
    let (mut lo, mut hi) = if robust && values.len() >= ROBUST_FROM {
        (
            quantile(&values, 0.01).unwrap_or(0.0),
            quantile(&values, 0.99).unwrap_or(1.0),
        )
    } else {
        values
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &v| {
                (lo.min(v), hi.max(v))
            })
    };
    for &v in &keep {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if !lo.is_finite() || !hi.is_finite() {
        return (0.0, 1.0);
    }
    let pad = ((hi - lo) * 0.05)
        .max(hi.abs().max(lo.abs()) * 0.01)
        .max(1e-12);
    (lo - pad, hi + pad)
}

/// Values a curve needs before its extremes may be cut: a short run's every point counts.
const ROBUST_FROM: usize = 200;

/// 1, 2 or 5 times a power of ten, the smallest such at least `raw`.
fn nice_step(raw: f64) -> f64 {
    if !(raw.is_finite() && raw > 0.0) {
        return 1.0;
    }
    let magnitude = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * magnitude)
        .find(|&s| s >= raw * (1.0 - 1e-9))
        .unwrap_or(10.0 * magnitude)
}

/// Tick positions in `lo..=hi`: multiples of a 1/2/5 step, at most about `max` of them.
pub fn ticks(lo: f64, hi: f64, max: usize) -> (Vec<f64>, f64) {
    let step = nice_step((hi - lo) / max.max(1) as f64);
    let first = (lo / step).ceil();
    let mut out = Vec::new();
    let mut k = first;
    while k * step <= hi + step * 1e-9 && out.len() <= 2 * max {
        // Products of a float step pick up noise (0.30000000000000004): round it off.
        out.push(round_to(k * step, step));
        k += 1.0;
    }
    (out, step)
}

/// Steps are whole numbers: ticks on whole steps only.
pub fn step_ticks(lo: f64, hi: f64, max: usize) -> Vec<f64> {
    let (ticks, step) = ticks(lo, hi, max);
    if step >= 1.0 {
        ticks
    } else {
        (lo.ceil() as i64..=hi.floor() as i64)
            .map(|s| s as f64)
            .collect()
    }
}

fn round_to(value: f64, step: f64) -> f64 {
    let decimals = (-step.log10().floor()).max(0.0) as i32 + 1;
    let scale = 10f64.powi(decimals);
    (value * scale).round() / scale
}

/// Ticks for a log10 axis over `lo..=hi` (exponents): the 1, 2 and 5 of each decade inside;
/// past four decades the powers of ten only, every few decades so that about eight stay
/// (27 decades of a loss blown up wrote labels over each other); or plain ticks of the
/// exponent when the range is within one decade.
pub fn log_ticks(lo: f64, hi: f64) -> Vec<f64> {
    let span = hi - lo;
    let (marks, every): (&[f64], i32) = if span > 4.0 {
        (&[1.0], (span / 8.0).ceil().max(1.0) as i32)
    } else {
        (&[1.0, 2.0, 5.0], 1)
    };
    let mut out = Vec::new();
    for decade in lo.floor() as i32..=hi.ceil() as i32 {
        if decade.rem_euclid(every) != 0 {
            continue;
        }
        for &m in marks {
            let v = (m * 10f64.powi(decade)).log10();
            if v >= lo && v <= hi {
                out.push(v);
            }
        }
    }
    if out.len() >= 2 {
        out
    } else {
        ticks(lo, hi, 5).0
    }
}

/// A tick label that shows as many digits as the ticks' spacing needs.
pub fn tick_label(value: f64, step: f64) -> String {
    // 0 computed as -1e-17 must not read "-0".
    let value = if value.abs() < step.abs() * 1e-6 {
        0.0
    } else {
        value
    };
    let magnitude = value.abs().max(step.abs());
    if magnitude >= 1e12 || (magnitude > 0.0 && magnitude < 1e-2) {
        // As many digits as tell ticks `step` apart (a constant 1e-3 spans 0.99e-3..1.01e-3).
        let decimals = ((magnitude / step.abs()).log10().ceil() as i64).clamp(1, 6) as usize;
        format!("{value:.decimals$e}")
    } else if magnitude >= 1e4 {
        si(value)
    } else {
        let decimals = (-step.abs().log10().floor()).max(0.0) as usize;
        format!("{value:.decimals$}")
    }
}

/// A tick of a logarithmic axis in the one notation that keeps the axis's widest tick
/// shortest, as the sweep tables choose one for a parameter's values: `1e-3 … 2e-2` rather
/// than `0.001 … 0.02`, `0.01 … 0.2` as they are; from 1 up as a linear axis writes them
/// (`100 … 5k, 10k`).
pub fn log_tick_label(value: f64, ticks: &[f64]) -> String {
    // Three significant digits: 10^-2.0 computed is not exactly 0.01.
    let rounded = |v: f64| format!("{v:.2e}").parse::<f64>().unwrap_or(v);
    if ticks.iter().all(|t| rounded(*t) >= 1.0) {
        return si(rounded(value));
    }
    let scientific = |v: f64| format!("{:e}", rounded(v));
    let plain = |v: f64| format!("{}", rounded(v));
    let widest = |text: &dyn Fn(f64) -> String| ticks.iter().map(|t| text(*t).len()).max();
    if widest(&scientific) < widest(&plain) {
        scientific(value)
    } else {
        plain(value)
    }
}

/// `12345` → `12.3k`, `2.5e6` → `2.5M`, `3e12` → `3T`; past that, `2.0e30`.
pub fn si(value: f64) -> String {
    if value == 0.0 {
        return "0".into();
    }
    let a = value.abs();
    if a >= 1e15 {
        return format!("{value:.1e}");
    }
    let (scaled, unit) = if a >= 1e12 {
        (value / 1e12, "T")
    } else if a >= 1e9 {
        (value / 1e9, "G")
    } else if a >= 1e6 {
        (value / 1e6, "M")
    } else if a >= 1e3 {
        (value / 1e3, "k")
    } else {
        (value, "")
    };
    let text = format!("{scaled:.1}");
    let text = text.strip_suffix(".0").unwrap_or(&text);
    format!("{text}{unit}")
}

/// A rectangle of the plane: (x0, x1, y0, y1) with x0 < x1, y0 < y1.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Frame {
    pub x0: f64,
    pub x1: f64,
    pub y0: f64,
    pub y1: f64,
}

impl Frame {
    pub fn contains(&self, (x, y): Point) -> bool {
        x >= self.x0 && x <= self.x1 && y >= self.y0 && y <= self.y1
    }
}

/// The parts of the polyline through `points` inside `frame`: a segment that leaves the
/// frame is cut at its edge (Liang-Barsky) and the curve resumes where it comes back in.
/// Non-finite points break the curve.
pub fn clip(points: &[Point], frame: &Frame) -> Vec<Vec<Point>> {
    let mut parts: Vec<Vec<Point>> = Vec::new();
    let mut current: Vec<Point> = Vec::new();
    let finite = |p: &Point| p.0.is_finite() && p.1.is_finite();
    let flush = |current: &mut Vec<Point>, parts: &mut Vec<Vec<Point>>| {
        if !current.is_empty() {
            parts.push(std::mem::take(current));
        }
    };
    if points.len() == 1 && finite(&points[0]) && frame.contains(points[0]) {
        return vec![vec![points[0]]];
    }
    for pair in points.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        if !finite(&a) || !finite(&b) {
            flush(&mut current, &mut parts);
            continue;
        }
        match clip_segment(a, b, frame) {
            Some((p, q)) => {
                if current.last() != Some(&p) {
                    flush(&mut current, &mut parts);
                    current.push(p);
                }
                current.push(q);
                if q != b {
                    // Left the frame: the next part starts where the curve comes back.
                    flush(&mut current, &mut parts);
                }
            }
            None => flush(&mut current, &mut parts),
        }
    }
    flush(&mut current, &mut parts);
    parts
}

/// The part of segment a-b inside `frame`, if any.
fn clip_segment(a: Point, b: Point, f: &Frame) -> Option<(Point, Point)> {
    let (dx, dy) = (b.0 - a.0, b.1 - a.1);
    let (mut t0, mut t1) = (0.0f64, 1.0f64);
    for (p, q) in [
        (-dx, a.0 - f.x0),
        (dx, f.x1 - a.0),
        (-dy, a.1 - f.y0),
        (dy, f.y1 - a.1),
    ] {
        if p == 0.0 {
            if q < 0.0 {
                return None;
            }
        } else {
            let r = q / p;
            if p < 0.0 {
                t0 = t0.max(r);
            } else {
                t1 = t1.min(r);
            }
        }
    }
    if t0 > t1 {
        return None;
    }
    let at = |t: f64| {
        if t == 0.0 {
            a
        } else if t == 1.0 {
            b
        } else {
            (a.0 + t * dx, a.1 + t * dy)
        }
    };
    Some((at(t0), at(t1)))
}

/// The drawn pieces of `line` (its x increasing) dashed along the x axis: `on` units of x
/// drawn, then `off` left out, from `origin`. Measured along x, not along the line, so a
/// noisy curve keeps its pattern: along the line, its ups and downs would use up each dash
/// within a pixel or two, and the curve would read as solid. Each dash is found by its
/// index from `origin`, never from a turn computed before: a rounded turn would otherwise
/// be taken for the start of the next dash, and the gap drawn.
pub fn dashed_along_x(line: &[Point], origin: f64, on: f64, off: f64) -> Vec<Vec<Point>> {
    let period = on + off;
    if !(on > 0.0 && off > 0.0 && period.is_finite()) {
        return vec![line.to_vec()];
    }
    let mut pieces: Vec<Vec<Point>> = Vec::new();
    let mut current: Vec<Point> = Vec::new();
    // The dash `current` is part of.
    let mut current_dash = None;
    for pair in line.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        if b.0 <= a.0 {
            // A step straight up or down: drawn where a dash is being drawn.
            if current.last() == Some(&a) {
                current.push(b);
            }
            continue;
        }
        let y_at = |x: f64| a.1 + (b.1 - a.1) * (x - a.0) / (b.0 - a.0);
        let mut dash = ((a.0 - origin) / period).floor() as i64;
        loop {
            let start = origin + dash as f64 * period;
            if start >= b.0 {
                break;
            }
            let (from, to) = (start.max(a.0), (start + on).min(b.0));
            if from < to {
                let goes_on =
                    current_dash == Some(dash) && current.last().is_some_and(|p| p.0 == from);
                if !goes_on {
                    if current.len() > 1 {
                        pieces.push(std::mem::take(&mut current));
                    }
                    current.clear();
                    current.push((from, y_at(from)));
                }
                current.push((to, y_at(to)));
                current_dash = Some(dash);
            }
            dash += 1;
        }
    }
    if current.len() > 1 {
        pieces.push(current);
    }
    pieces
}

/// A curve of `steps` steps whose values are `shape` of uniform noise in [0, 1): the same
/// noise for the same `seed`.
#[cfg(test)]
pub fn noisy_curve(steps: u64, seed: u64, shape: impl Fn(f64) -> f64) -> Vec<Point> {
    let mut state = seed;
    (1..=steps)
        .map(|step| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            let noise = (state >> 40) as f64 / (1u64 << 24) as f64;
            (step as f64, shape(noise))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dashes_are_measured_along_x_whatever_the_curve_does() {
        // A zigzag of a hundred units up and down a step: along the line, a dash of 8
        // would end within each step.
        let zigzag: Vec<Point> = (0..=30)
            .map(|i| (i as f64, if i % 2 == 0 { 0.0 } else { 100.0 }))
            .collect();
        let pieces = dashed_along_x(&zigzag, 0.0, 8.0, 4.0);
        let spans: Vec<(f64, f64)> = pieces
            .iter()
            .map(|piece| (piece[0].0, piece[piece.len() - 1].0))
            .collect();
        assert_eq!(spans, [(0.0, 8.0), (12.0, 20.0), (24.0, 30.0)]);
        // Each piece follows the curve: its points are the line's, cut where the pattern
        // turns (interpolated there).
        assert_eq!(pieces[0].len(), 9);
        assert_eq!(pieces[1][0], (12.0, 0.0));
        // A level line across an axis whose dash is not a whole number of steps (a 1..300
        // axis 640 pixels wide, 8 on and 4 off): every dash is one, whatever the rounding.
        let on = 8.0 * 299.0 / 640.0;
        let level: Vec<Point> = vec![(1.0, 2.0), (150.5, 2.0), (300.0, 2.0)];
        let pieces = dashed_along_x(&level, 1.0, on, on / 2.0);
        assert_eq!(pieces.len(), (299.0 / (1.5 * on)).ceil() as usize);
        for piece in &pieces {
            let long = piece[piece.len() - 1].0 - piece[0].0;
            assert!(long <= on * (1.0 + 1e-9), "{piece:?} is longer than a dash");
        }
        let between: Vec<Point> = vec![(0.5, 1.0), (2.5, 3.0)];
        assert_eq!(
            dashed_along_x(&between, 0.0, 1.0, 1.0),
            [vec![(0.5, 1.0), (1.0, 1.5)], vec![(2.0, 2.5), (2.5, 3.0)]]
        );
    }

    #[test]
    fn a_thinned_curve_keeps_each_columns_first_lowest_highest_and_last_point() {
        // 100,000 noisy steps into 500 columns of 200 steps each.
        let points = noisy_curve(100_000, 11, |noise| noise);
        let (lo, hi, columns) = (0.5, 100_000.5, 500);
        let kept = thin(&points, lo, hi, columns);
        assert!(kept.len() <= 4 * columns, "{} points", kept.len());
        assert!(kept.windows(2).all(|w| w[0].0 < w[1].0), "in step order");
        let column = |x: f64| ((x - lo) / (hi - lo) * columns as f64).floor() as usize;
        for c in 0..columns {
            let all: Vec<&Point> = points.iter().filter(|p| column(p.0) == c).collect();
            let ours: Vec<&Point> = kept.iter().filter(|p| column(p.0) == c).collect();
            let low = |v: &[&Point]| v.iter().map(|p| p.1).fold(f64::INFINITY, f64::min);
            let high = |v: &[&Point]| v.iter().map(|p| p.1).fold(f64::NEG_INFINITY, f64::max);
            assert_eq!(ours.first(), all.first(), "column {c}");
            assert_eq!(ours.last(), all.last(), "column {c}");
            assert_eq!(
                (low(&ours), high(&ours)),
                (low(&all), high(&all)),
                "column {c}"
            );
        }
        // Few points a column are drawn as they are, however many in all.
        assert_eq!(thin(&points, lo, hi, 50_000), points);
        // However short the curve (a piece of one between two cuts at the panel's edge).
        assert_eq!(thin(&points[..1000], lo, hi, columns).len(), 5 * 4);
    }

    #[test]
    fn ema_is_debiased_and_matches_tensorboard() {
        let points: Vec<Point> = [(1.0, 10.0), (2.0, 0.0), (3.0, 10.0)].to_vec();
        let s = ema(&points, 0.5);
        // TensorBoard: last = last*w + (1-w)*v; value / (1 - w^n).
        assert_eq!(s[0], (1.0, 10.0));
        assert!((s[1].1 - (2.5 / 0.75)).abs() < 1e-12);
        assert!((s[2].1 - (6.25 / 0.875)).abs() < 1e-12);
        assert_eq!(ema(&points, 0.0), points);
        assert_eq!(ema(&[(1.0, f64::NAN), (2.0, 4.0)], 0.9), vec![(2.0, 4.0)]);
    }

    #[test]
    fn ranges_keep_the_smoothed_curve_and_may_drop_spikes() {
        let mut values: Vec<f64> = (0..300).map(|i| 100.0 + (i % 3) as f64).collect();
        values[50] = 1e9;
        let (lo, hi) = value_range(&values, &[], true);
        assert!(lo < 100.0 && hi < 110.0, "{lo} {hi}");
        let (_, hi) = value_range(&values, &[], false);
        assert!(hi > 1e9);
        let (lo, _) = value_range(&values, &[50.0], true);
        assert!(lo < 50.0);
        assert_eq!(value_range(&[f64::NAN], &[], false), (0.0, 1.0));
        let (lo, hi) = value_range(&[3.0], &[], false);
        assert!(lo < 3.0 && hi > 3.0);
    }

    #[test]
    fn ticks_are_round_numbers_and_steps_are_whole() {
        assert_eq!(ticks(0.0, 1.0, 5).0, vec![0.0, 0.2, 0.4, 0.6, 0.8, 1.0]);
        assert_eq!(
            ticks(13.0, 3007.0, 6).0,
            vec![500.0, 1000.0, 1500.0, 2000.0, 2500.0, 3000.0]
        );
        assert_eq!(step_ticks(0.5, 4.5, 10), vec![1.0, 2.0, 3.0, 4.0]);
        assert!(step_ticks(1.0, 3000.0, 8).iter().all(|t| t.fract() == 0.0));
        assert_eq!(tick_label(500.0, 500.0), "500");
        assert_eq!(tick_label(0.4, 0.2), "0.4");
        assert_eq!(tick_label(120_000.0, 20_000.0), "120k");
        assert_eq!(tick_label(0.0003, 0.0001), "3.0e-4");
        assert_eq!(tick_label(-1e-13, 5000.0), "0");
        // A constant learning rate: ticks close together, each told apart.
        let (lo, hi) = value_range(&[1e-3], &[], false);
        let (close, step) = ticks(lo, hi, 5);
        let labels: Vec<String> = close.iter().map(|&t| tick_label(t, step)).collect();
        let mut distinct = labels.clone();
        distinct.dedup();
        assert!(close.len() >= 3 && distinct == labels, "{labels:?}");
        assert_eq!(tick_label(1e-3, 5e-6), "1.000e-3");
        // Far past giga: scientific, not a 21-digit number of G.
        assert_eq!(tick_label(2e29, 2e29), "2.0e29");
        assert_eq!(si(1e30), "1.0e30");
        assert_eq!(si(3e12), "3T");
        assert_eq!(
            log_ticks(0.0, 1.0),
            vec![0.0, 2f64.log10(), 5f64.log10(), 1.0]
        );
        // A loss from 1 to 1e27: a power of ten every four decades, not 84 ticks.
        assert_eq!(
            log_ticks(0.0, 27.0),
            [0.0, 4.0, 8.0, 12.0, 16.0, 20.0, 24.0]
        );
        assert_eq!(log_ticks(-1.0, 4.0), [-1.0, 0.0, 1.0, 2.0, 3.0, 4.0]);
    }

    #[test]
    fn a_log_axis_writes_its_ticks_in_one_notation_as_the_legend_does() {
        let labels = |lo: f64, hi: f64| -> Vec<String> {
            let exponents = log_ticks(lo.log10(), hi.log10());
            let ticks: Vec<f64> = exponents.iter().map(|e| 10f64.powf(*e)).collect();
            ticks.iter().map(|t| log_tick_label(*t, &ticks)).collect()
        };
        // Learning rates from 1e-3 to 3e-2: not `0.001 … 0.01, 0.02` mixed with `2e-3`.
        assert_eq!(labels(1e-3, 3e-2), ["1e-3", "2e-3", "5e-3", "1e-2", "2e-2"]);
        assert_eq!(labels(0.01, 0.3), ["0.01", "0.02", "0.05", "0.1", "0.2"]);
        assert_eq!(labels(2.0, 12.0), ["2", "5", "10"]);
        assert_eq!(
            labels(100.0, 2e4),
            ["100", "200", "500", "1k", "2k", "5k", "10k", "20k"]
        );
        // Too narrow for 1-2-5 ticks: evenly spaced exponents, three digits each.
        let ticks: Vec<f64> = log_ticks(0.0, 0.25)
            .iter()
            .map(|e| 10f64.powf(*e))
            .collect();
        let texts: Vec<String> = ticks.iter().map(|t| log_tick_label(*t, &ticks)).collect();
        assert!(texts.iter().all(|t| t.len() <= 4), "{texts:?}");
    }

    #[test]
    fn curves_are_cut_at_the_frame() {
        let frame = Frame {
            x0: 0.0,
            x1: 10.0,
            y0: 0.0,
            y1: 1.0,
        };
        // Up through the top edge at x=2.5 and back in at x=7.5.
        let points = [(0.0, 0.5), (5.0, 1.5), (10.0, 0.5)];
        let parts = clip(&points, &frame);
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0], vec![(0.0, 0.5), (2.5, 1.0)]);
        assert_eq!(parts[1], vec![(7.5, 1.0), (10.0, 0.5)]);
        for p in parts.iter().flatten() {
            assert!(frame.contains(*p), "{p:?}");
        }
        // Entirely outside, a NaN in the middle, one point.
        assert!(clip(&[(1.0, 5.0), (2.0, 6.0)], &frame).is_empty());
        let broken = clip(
            &[(1.0, 0.5), (2.0, f64::NAN), (3.0, 0.5), (4.0, 0.5)],
            &frame,
        );
        assert_eq!(broken, vec![vec![(3.0, 0.5), (4.0, 0.5)]]);
        assert_eq!(clip(&[(1.0, 0.5)], &frame), vec![vec![(1.0, 0.5)]]);
        // A curve inside stays one piece.
        let inside = [(0.0, 0.1), (1.0, 0.2), (2.0, 0.3)];
        assert_eq!(clip(&inside, &frame), vec![inside.to_vec()]);
    }
}
