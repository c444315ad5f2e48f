//! The figure of a sweep folder: every point's loss overlaid (smoothed), labelled by the
//! parameters the sweep gave it, and the final loss against one swept parameter (`plot --by`,
//! else the one with the most values), a line per combination of the others' values (a point
//! not finished is a ring at its latest loss, off the lines). The final loss is the validation loss when every
//! point has one: the last step's training loss is one batch's, too noisy to rank points by.

use super::canvas::{self, pen, Axis, Curve, Dots, Figure, Panel, TickFormat, TITLE_HEIGHT, WIDTH};
use super::series::{ema, value_range, Point};
use crate::step_record::StepRecord;
use crate::sweeps::labels::ParamColumns;
use plotters::coord::Shift;
use plotters::prelude::*;
use serde_json::Value;
use std::collections::BTreeMap;

/// Where a parameter value goes on the x axis.
type Placement = Box<dyn Fn(&Value) -> f64>;

/// One point of the sweep: its run's name, parameters and step records.
pub struct PointRecords {
    pub name: String,
    pub params: BTreeMap<String, Value>,
    pub steps: Vec<StepRecord>,
    /// Its evaluations on the validation data: (step, loss), in step order.
    pub evals: Vec<(u64, f64)>,
    /// Where its run is: its last loss is the final one only once it finished.
    pub progress: PointProgress,
}

/// Where a point's run is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PointProgress {
    /// Created, queued, running, or preempted and requeued: more steps may come.
    Going,
    /// Completed.
    Finished,
    /// Ended without completing (cancelled, failed, out of time or memory, preempted and not
    /// requeued): no more steps until it is run again.
    Stopped,
}

pub struct SweepFigure {
    pub title: String,
    pub points: Vec<PointRecords>,
    pub smoothing: f64,
    pub log_loss: bool,
    /// The parameter the final-loss panel puts along its axis (`plot --by`), by its short
    /// name or dotted path; `None`: the one with the most values.
    pub by: Option<String>,
}

/// Points named in one line: the first [`NAMED_AT_MOST`], then how many more; `None` for none.
pub fn named_at_most(labels: &[String]) -> Option<String> {
    match labels.len() {
        0 => None,
        n if n > NAMED_AT_MOST => Some(format!(
            "{} and {} more",
            labels[..NAMED_AT_MOST].join("; "),
            n - NAMED_AT_MOST
        )),
        _ => Some(labels.join("; ")),
    }
}

/// `point` named by the values of `params`, or by its run's name where nothing varies.
fn point_label(params: &ParamColumns, point: &PointRecords) -> String {
    if params.is_empty() {
        point.name.clone()
    } else {
        params.label(&point.params)
    }
}

/// Points named in one line at most; the rest are counted.
const NAMED_AT_MOST: usize = 8;

/// Points named in the loss overlay's legend at most; the rest are drawn in grey and
/// counted on the legend's last line.
const MAX_LEGEND: usize = 12;

/// The curves of points past the legend: behind the named ones, and not of their colours.
const UNNAMED: RGBColor = RGBColor(0x99, 0x99, 0x99);
const OVERLAY_HEIGHT: u32 = 520;
const FINAL_HEIGHT: u32 = 400;

impl SweepFigure {
    /// The parameters whose values differ between points, as the legend names them.
    pub fn params(&self) -> ParamColumns {
        ParamColumns::varying(self.points.iter().map(|p| &p.params))
    }

    /// The dotted paths of [`Self::params`], in name order.
    pub fn swept(&self) -> Vec<String> {
        self.params().keys().map(str::to_string).collect()
    }

    /// `lr=1e-3, seed=1` ([`ParamColumns::label`]), or the run's name where nothing varies.
    pub fn label(&self, point: &PointRecords) -> String {
        point_label(&self.params(), point)
    }

    /// The points at `progress` that logged no step, named as the legend names them: the
    /// first [`NAMED_AT_MOST`], then how many more.
    pub fn without_steps(&self, progress: PointProgress) -> Option<String> {
        let params = self.params();
        let labels: Vec<String> = self
            .sorted(&params)
            .into_iter()
            .filter(|p| p.steps.is_empty() && p.progress == progress)
            .map(|p| self.label(p))
            .collect();
        named_at_most(&labels)
    }

    /// Points are compared by their validation loss: every point that logged a step has one
    /// (else by the training loss, which every one has).
    fn by_validation(&self) -> bool {
        self.points
            .iter()
            .filter(|p| !p.steps.is_empty())
            .all(|p| !p.evals.is_empty())
    }

    fn transform(&self, v: f64) -> f64 {
        match (self.log_loss, v > 0.0) {
            (false, _) => v,
            (true, true) => v.log10(),
            (true, false) => f64::NAN,
        }
    }

    pub fn panels(&self) -> Vec<Panel> {
        let mut panels = vec![self.overlay()];
        if let Some(final_loss) = self.final_loss() {
            panels.push(final_loss);
        }
        panels
    }

    /// The points in the order of the values of `params` (numbers by value), as a legend
    /// reads.
    pub fn sorted(&self, params: &ParamColumns) -> Vec<&PointRecords> {
        let mut points: Vec<&PointRecords> = self.points.iter().collect();
        points.sort_by(|a, b| params.order(&a.params, &b.params));
        points
    }

    fn overlay(&self) -> Panel {
        let params = self.params();
        let with_steps: Vec<&PointRecords> = self
            .sorted(&params)
            .into_iter()
            .filter(|p| !p.steps.is_empty())
            .collect();
        let first = with_steps
            .iter()
            .filter_map(|p| p.steps.first())
            .map(|r| r.step as f64)
            .fold(f64::INFINITY, f64::min);
        let last = with_steps
            .iter()
            .filter_map(|p| p.steps.last())
            .map(|r| r.step as f64)
            .fold(f64::NEG_INFINITY, f64::max);
        let (first, last) = if first.is_finite() {
            (first, last)
        } else {
            (0.0, 1.0)
        };
        let mut curves = Vec::new();
        let mut all = Vec::new();
        // Where each curve starts and its lowest loss (the best points' ends, which a cut of
        // the lowest 1% of all values would take) stay in view; a point that diverges leaves
        // the panel (cut at its edge) rather than squash every other curve to a line: its
        // values set the range only when every point diverged.
        let mut kept = Vec::new();
        let diverged: Vec<bool> = with_steps
            .iter()
            .map(|p| crate::metrics_file::has_diverged(&p.steps))
            .collect();
        let every_one_diverged = diverged.iter().all(|&d| d);
        let shown: Vec<Vec<Point>> = with_steps
            .iter()
            .map(|point| {
                let raw: Vec<Point> = point
                    .steps
                    .iter()
                    .filter_map(|r| Some((r.step as f64, self.transform(r.loss()?))))
                    .collect();
                if self.smoothing > 0.0 {
                    ema(&raw, self.smoothing)
                } else {
                    raw
                }
            })
            .collect();
        for (i, curve) in shown.iter().enumerate() {
            if !diverged[i] || every_one_diverged {
                all.extend(curve.iter().map(|p| p.1));
                kept.extend(curve.iter().map(|p| p.1).find(|v| v.is_finite()));
                kept.extend(
                    curve
                        .iter()
                        .map(|p| p.1)
                        .filter(|v| v.is_finite())
                        .min_by(f64::total_cmp),
                );
            }
        }
        // More curves than a legend can name are a tangle: the best ones are drawn in
        // colour and named, best first; the rest thin and grey behind them.
        let validation = self.by_validation();
        let named = if with_steps.len() > MAX_LEGEND {
            let ends: Vec<f64> = with_steps
                .iter()
                .zip(&shown)
                .zip(&diverged)
                .map(|((point, curve), &diverged)| {
                    let end = match validation {
                        true => point.evals.last().map(|&(_, loss)| self.transform(loss)),
                        false => curve.iter().rev().map(|p| p.1).find(|v| v.is_finite()),
                    };
                    end.filter(|v| v.is_finite() && !diverged)
                        .unwrap_or(f64::INFINITY)
                })
                .collect();
            let mut best: Vec<usize> = (0..with_steps.len()).collect();
            best.sort_by(|&a, &b| ends[a].total_cmp(&ends[b]));
            best.truncate(MAX_LEGEND);
            best
        } else {
            (0..with_steps.len()).collect()
        };
        for (i, curve) in shown.iter().enumerate() {
            if !named.contains(&i) {
                curves.push(Curve {
                    points: curve.clone(),
                    color: UNNAMED,
                    dash: None,
                    width: 1,
                    opacity: 0.5,
                    label: None,
                });
            }
        }
        for (k, &i) in named.iter().enumerate() {
            // Past the palette's colours, curves are told apart by their dashes.
            let (color, dash) = pen(k);
            curves.push(Curve {
                points: shown[i].clone(),
                color,
                dash,
                width: 2,
                opacity: 1.0,
                // Cut at the panel's edge, a diverged curve may not show: its entry says why.
                label: Some(match diverged[i] {
                    true => format!("{} (diverged)", point_label(&params, with_steps[i])),
                    false => point_label(&params, with_steps[i]),
                }),
            });
        }
        let title = if self.smoothing > 0.0 {
            format!("loss of every point (smoothed, EMA {})", self.smoothing)
        } else {
            "loss of every point".into()
        };
        Panel {
            title,
            x: Axis::steps(first, last),
            y: Axis::values(
                value_range(&all, &kept, true),
                self.log_loss,
                if self.log_loss {
                    "loss (log scale)"
                } else {
                    "loss"
                },
            ),
            curves,
            dots: Vec::new(),
            markers: Vec::new(),
            legend: true,
            marker_text: false,
            // Not a curve's label: it would be drawn with that curve's colour and dashes.
            legend_note: (with_steps.len() > MAX_LEGEND).then(|| {
                let measure = match validation {
                    true => "validation loss",
                    false => "loss",
                };
                let grey_diverged = (0..with_steps.len())
                    .filter(|i| !named.contains(i) && diverged[*i])
                    .count();
                let higher = with_steps.len() - MAX_LEGEND - grey_diverged;
                match (higher, grey_diverged) {
                    (_, 0) => {
                        format!("... and {higher} more point(s), in grey: higher final {measure}")
                    }
                    (0, d) => format!("... and {d} more point(s), in grey: diverged"),
                    (h, d) => format!(
                        "... and {} more point(s), in grey: {h} with a higher final \
                         {measure}, {d} diverged",
                        h + d
                    ),
                }
            }),
        }
    }

    /// The final-loss panel's axes: the parameter along its x axis (`by`, else the one with
    /// the most values, the first of them on a tie) and those whose values make its lines
    /// (the others, a line per combination of their values); `None` when nothing varies.
    /// A `by` that names no varying parameter is an error naming those that vary.
    pub fn final_axes(&self) -> Result<Option<(String, Vec<String>)>, String> {
        let params = self.params();
        let keys: Vec<String> = params.keys().map(str::to_string).collect();
        if keys.is_empty() {
            return match &self.by {
                Some(by) => Err(format!(
                    "`--by {by}`: no parameter varies between the points, so there is no \
                     final-loss panel"
                )),
                None => Ok(None),
            };
        }
        let x_key = match &self.by {
            Some(by) => {
                // Its path, its short name, or the end of its path (`optimizer.lr`).
                let exact: Vec<&String> = keys.iter().filter(|k| *k == by).collect();
                let named: Vec<&String> = keys
                    .iter()
                    .filter(|k| params.name(k) == by || k.ends_with(&format!(".{by}")))
                    .collect();
                match (exact.as_slice(), named.as_slice()) {
                    ([k], _) | ([], [k]) => (*k).clone(),
                    ([], []) => {
                        let varying: Vec<String> = keys
                            .iter()
                            .map(|k| format!("`{}`", params.name(k)))
                            .collect();
                        return Err(format!(
                            "`--by {by}`: no parameter of that name varies between the points; \
                             these do: {}",
                            varying.join(", ")
                        ));
                    }
                    (_, several) => {
                        let paths: Vec<String> = several.iter().map(|k| format!("`{k}`")).collect();
                        return Err(format!(
                            "`--by {by}` names {}: give the one meant by its path",
                            paths.join(" and ")
                        ));
                    }
                }
            }
            None => {
                let distinct = |k: &String| {
                    let mut v: Vec<String> = self
                        .points
                        .iter()
                        .filter_map(|p| p.params.get(k).map(|v| params.text(k, v)))
                        .collect();
                    v.sort();
                    v.dedup();
                    v.len()
                };
                let most = keys.iter().map(distinct).max().unwrap_or(0);
                keys.iter()
                    .find(|k| distinct(k) == most)
                    .cloned()
                    .unwrap_or_default()
            }
        };
        let line_keys = keys.into_iter().filter(|k| *k != x_key).collect();
        Ok(Some((x_key, line_keys)))
    }

    /// Final loss against one swept parameter, a line per combination of the others'.
    fn final_loss(&self) -> Option<Panel> {
        let params = self.params();
        let (x_key, line_keys) = self.final_axes().ok()??;
        let validation = self.by_validation();
        let measure = if validation {
            "validation loss"
        } else {
            "training loss (last step)"
        };
        let finals: Vec<(&Value, BTreeMap<String, Value>, f64, bool)> = self
            .points
            .iter()
            .filter_map(|p| {
                let last = match validation {
                    true => p.evals.last().map(|&(_, loss)| loss),
                    false => p.steps.iter().rev().find_map(|r| r.loss()),
                };
                // A point that diverged has no final loss, nor a place on the axis: a finite
                // loss after its blow-up (1e25) would squash every other point to a line.
                if crate::metrics_file::has_diverged(&p.steps) {
                    return None;
                }
                let loss = last.filter(|l| l.is_finite())?;
                let x = p.params.get(&x_key)?;
                let line: BTreeMap<String, Value> = line_keys
                    .iter()
                    .filter_map(|k| Some((k.clone(), p.params.get(k)?.clone())))
                    .collect();
                let finished = p.progress == PointProgress::Finished;
                Some((x, line, self.transform(loss), finished))
            })
            .collect();
        if finals.is_empty() {
            return None;
        }
        let numbers: Option<Vec<f64>> = finals.iter().map(|f| f.0.as_f64()).collect();
        let (x_axis, place): (Axis, Placement) = match numbers {
            Some(xs) => {
                let (lo, hi) = xs
                    .iter()
                    .fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), &v| {
                        (l.min(v), h.max(v))
                    });
                // Rates and decays are swept by factors: a log axis once they span a decade.
                // Whole numbers (seeds, sizes) stay linear unless they span two.
                let whole = xs.iter().all(|v| v.fract() == 0.0);
                let span = if whole { 100.0 } else { 10.0 };
                let log = lo > 0.0 && hi / lo >= span;
                let to_axis = move |v: f64| if log { v.log10() } else { v };
                let values: Vec<f64> = xs.iter().map(|&v| to_axis(v)).collect();
                let range = value_range(&values, &[], false);
                (
                    Axis::values(range, log, &x_key),
                    Box::new(move |v: &Value| to_axis(v.as_f64().unwrap_or(f64::NAN))),
                )
            }
            None => {
                let mut names: Vec<String> =
                    finals.iter().map(|f| params.text(&x_key, f.0)).collect();
                names.sort();
                names.dedup();
                let axis = Axis {
                    lo: -0.5,
                    hi: names.len() as f64 - 0.5,
                    ticks: (0..names.len()).map(|i| i as f64).collect(),
                    format: TickFormat::Categories(names.clone()),
                    label: x_key.clone(),
                };
                (
                    axis,
                    Box::new({
                        let params = params.clone();
                        let x_key = x_key.clone();
                        move |v: &Value| {
                            names
                                .iter()
                                .position(|n| *n == params.text(&x_key, v))
                                .map_or(f64::NAN, |i| i as f64)
                        }
                    }),
                )
            }
        };
        // Per line: the finished points' final losses, and the others' latest ones; the
        // lines in the order of their values (numbers by size), as the legend lists them.
        type Line<'a> = (&'a BTreeMap<String, Value>, String, Vec<Point>, Vec<Point>);
        let mut lines: Vec<Line> = Vec::new();
        for (x, line, loss, finished) in &finals {
            // Every line parameter named, `-` where a point was not given it.
            let name = match line_keys.is_empty() {
                true => format!("final {measure}"),
                false => line_keys
                    .iter()
                    .map(|k| match line.get(k) {
                        Some(v) => format!("{}={}", params.name(k), params.text(k, v)),
                        None => format!("{}=-", params.name(k)),
                    })
                    .collect::<Vec<_>>()
                    .join(", "),
            };
            let at = match lines.iter().position(|l| l.1 == name) {
                Some(at) => at,
                None => {
                    lines.push((line, name, Vec::new(), Vec::new()));
                    lines.len() - 1
                }
            };
            let (_, _, done, going) = &mut lines[at];
            if *finished { done } else { going }.push((place(x), *loss));
        }
        lines.sort_by(|a, b| params.order(a.0, b.0).then_with(|| a.1.cmp(&b.1)));
        let lines = lines
            .into_iter()
            .map(|(_, name, done, going)| (name, (done, going)));
        let losses: Vec<f64> = finals.iter().map(|f| f.2).collect();
        let mut curves = Vec::new();
        let mut dots = Vec::new();
        let mut rings_named = false;
        let lines: Vec<_> = lines.collect();
        let unnamed = lines.len().saturating_sub(MAX_LEGEND);
        for (i, (name, (mut done, going))) in lines.into_iter().enumerate() {
            done.sort_by(|a, b| a.0.total_cmp(&b.0));
            // Past the legend's room, grey and counted on its last line, as in the overlay.
            let named = i < MAX_LEGEND;
            let (color, dash) = match named {
                true => pen(i),
                false => (UNNAMED, None),
            };
            if !done.is_empty() {
                curves.push(Curve {
                    points: done.clone(),
                    color,
                    dash,
                    width: if named { 2 } else { 1 },
                    opacity: 1.0,
                    label: named.then_some(name),
                });
                dots.push(Dots {
                    points: done,
                    color,
                    label: None,
                    hollow: false,
                });
            }
            if !going.is_empty() {
                dots.push(Dots {
                    points: going,
                    color,
                    label: (!std::mem::replace(&mut rings_named, true)).then(|| match validation {
                        true => "not finished: latest validation loss".to_string(),
                        false => "not finished: latest loss".to_string(),
                    }),
                    hollow: true,
                });
            }
        }
        Some(Panel {
            title: format!("final {measure} by {x_key}"),
            x: x_axis,
            y: Axis::values(
                value_range(&losses, &[], false),
                self.log_loss,
                &format!("final {measure}"),
            ),
            curves,
            dots,
            markers: Vec::new(),
            legend: true,
            marker_text: false,
            legend_note: (unnamed > 0).then(|| format!("... and {unnamed} more line(s), in grey")),
        })
    }

    /// Whether the figure has a final-loss panel: some point has a final loss to draw.
    pub fn has_final_loss(&self) -> bool {
        self.final_loss().is_some()
    }

    /// The points the final-loss panel draws as rings (not finished): of those with steps,
    /// neither diverged nor without its axis parameter, which it leaves out.
    pub fn unfinished_in_final_loss(&self) -> usize {
        let Ok(Some((x_key, _))) = self.final_axes() else {
            return 0;
        };
        self.points
            .iter()
            .filter(|p| {
                p.progress != PointProgress::Finished
                    && !p.steps.is_empty()
                    && !crate::metrics_file::has_diverged(&p.steps)
                    && p.params.contains_key(&x_key)
            })
            .count()
    }

    /// The points that logged a step and did not diverge but lack the final-loss panel's
    /// axis parameter, which the panel leaves out (points given different parameter sets),
    /// named as [`named_at_most`] names them.
    pub fn without_axis_value(&self) -> Option<String> {
        let Ok(Some((x_key, _))) = self.final_axes() else {
            return None;
        };
        let labels: Vec<String> = self
            .sorted(&self.params())
            .into_iter()
            .filter(|p| {
                !p.steps.is_empty()
                    && !crate::metrics_file::has_diverged(&p.steps)
                    && !p.params.contains_key(&x_key)
            })
            .map(|p| self.label(p))
            .collect();
        named_at_most(&labels)
    }
}

impl Figure for SweepFigure {
    fn size(&self) -> (u32, u32) {
        let finals = if self.final_loss().is_some() {
            FINAL_HEIGHT
        } else {
            0
        };
        (WIDTH, TITLE_HEIGHT + OVERLAY_HEIGHT + finals)
    }

    fn draw<DB: DrawingBackend>(
        &self,
        root: DrawingArea<DB, Shift>,
        surface: canvas::Surface,
    ) -> anyhow::Result<()> {
        root.fill(&WHITE).map_err(canvas::err)?;
        let body = if surface.text {
            canvas::titled(&root, &self.title)?
        } else {
            root.clone()
        };
        let panels = self.panels();
        if panels.len() == 1 {
            canvas::draw_panel(&body, &panels[0], surface)?;
        } else {
            let (top, bottom) = body.split_vertically(OVERLAY_HEIGHT);
            canvas::draw_panel(&top, &panels[0], surface)?;
            canvas::draw_panel(&bottom, &panels[1], surface)?;
        }
        root.present().map_err(canvas::err)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shardrun_protocol::messages::StepMetrics;

    fn point(lr: f64, seed: u64, final_loss: f64) -> PointRecords {
        let steps = (1..=5)
            .map(|step| {
                StepRecord::fold(
                    &[StepMetrics {
                        rank: 0,
                        step,
                        loss: final_loss + (5 - step) as f64,
                        lr,
                        grad_norm: 1.0,
                        step_time_s: 0.1,
                        tokens_per_s: 1.0,
                        model_state_bytes: 1,
                        peak_memory_bytes: 1,
                        ..Default::default()
                    }],
                    0.0,
                )
            })
            .collect();
        let mut params = BTreeMap::new();
        params.insert("training.optimizer.lr".to_string(), serde_json::json!(lr));
        params.insert("training.seed".to_string(), serde_json::json!(seed));
        params.insert("training.steps".to_string(), serde_json::json!(5));
        PointRecords {
            name: format!("p-{lr}-{seed}"),
            params,
            steps,
            evals: Vec::new(),
            progress: PointProgress::Finished,
        }
    }

    #[test]
    fn points_without_steps_are_named_by_their_values_and_counted_past_eight() {
        let waiting = |lr: f64, seed: u64| PointRecords {
            steps: Vec::new(),
            progress: PointProgress::Going,
            ..point(lr, seed, 1.0)
        };
        let mut points = vec![point(1e-3, 0, 1.0), waiting(1e-4, 0)];
        let lost = PointRecords {
            steps: Vec::new(),
            ..point(1e-5, 0, 1.0)
        };
        points.push(lost);
        let cancelled = PointRecords {
            steps: Vec::new(),
            progress: PointProgress::Stopped,
            ..point(3e-5, 0, 1.0)
        };
        points.push(cancelled);
        let figure = SweepFigure {
            title: "s".into(),
            points,
            smoothing: 0.6,
            log_loss: false,
            by: None,
        };
        assert_eq!(
            figure.without_steps(PointProgress::Going).as_deref(),
            Some("lr=1e-4")
        );
        assert_eq!(
            figure.without_steps(PointProgress::Finished).as_deref(),
            Some("lr=1e-5")
        );
        assert_eq!(
            figure.without_steps(PointProgress::Stopped).as_deref(),
            Some("lr=3e-5")
        );
        // In the order of their values, not of their folders' names.
        let many = SweepFigure {
            points: (0..10).rev().map(|seed| waiting(1e-3, seed)).collect(),
            ..figure
        };
        let named = many.without_steps(PointProgress::Going).unwrap();
        assert!(
            named.starts_with("seed=0; seed=1; ") && named.ends_with("seed=7 and 2 more"),
            "{named}"
        );
        assert_eq!(many.without_steps(PointProgress::Finished), None);
    }

    #[test]
    fn past_the_legend_the_best_points_are_named_and_the_rest_drawn_grey() {
        let count = MAX_LEGEND as u64 + 3;
        // The higher the seed, the lower the final loss; one point diverged.
        let mut points: Vec<PointRecords> = (0..count)
            .map(|seed| point(1e-3, seed, (count - seed) as f64))
            .collect();
        points[count as usize - 1].steps[2].loss = f64::NAN;
        let figure = SweepFigure {
            title: "s".into(),
            points,
            smoothing: 0.0,
            log_loss: false,
            by: None,
        };
        let overlay = &figure.panels()[0];
        let labels: Vec<&str> = overlay
            .curves
            .iter()
            .filter_map(|c| c.label.as_deref())
            .collect();
        let best_first: Vec<String> = (2..count - 1)
            .rev()
            .map(|seed| format!("seed={seed}"))
            .collect();
        assert_eq!(
            labels, best_first,
            "the diverged point is not among the best"
        );
        let grey: Vec<&Curve> = overlay.curves.iter().take(3).collect();
        assert!(
            grey.iter()
                .all(|c| c.label.is_none() && c.color == UNNAMED && c.width == 1),
            "the unnamed curves are grey, thin and drawn first (behind)"
        );
        assert!(overlay.curves[3..].iter().all(|c| c.color != UNNAMED));
        assert_eq!(
            overlay.legend_note.as_deref(),
            Some("... and 3 more point(s), in grey: 2 with a higher final loss, 1 diverged"),
            "not drawn as a curve's label, with that curve's pen; the diverged one has no \
             final loss to be higher"
        );
        let mut fewer = figure;
        fewer.points.truncate(MAX_LEGEND);
        let overlay = &fewer.panels()[0];
        assert_eq!(overlay.legend_note, None);
        let first = overlay.curves[0].label.as_deref();
        assert_eq!(
            first,
            Some("seed=0"),
            "a legend that names all is in value order"
        );
    }

    /// Twenty long curves: the lowest 1% of all their values are the best point's last
    /// steps, which the overlay shows whole (a cut of the extremes is for spikes).
    #[test]
    fn the_overlay_shows_the_best_points_lowest_loss() {
        let long = |seed: u64| {
            let mut p = point(1e-3, seed, 1.0);
            p.steps = (1..=300u64)
                .map(|step| {
                    let mut record = p.steps[0].clone();
                    record.step = step;
                    // Seed 0 falls furthest.
                    record.loss = 3.0 - (1.0 + 0.05 * seed as f64).recip() * step as f64 / 300.0;
                    record
                })
                .collect();
            p
        };
        let figure = SweepFigure {
            title: "s".into(),
            points: (0..20).map(long).collect(),
            smoothing: 0.6,
            log_loss: false,
            by: None,
        };
        let overlay = &figure.panels()[0];
        let lowest = overlay
            .curves
            .iter()
            .flat_map(|c| c.points.iter().map(|p| p.1))
            .fold(f64::INFINITY, f64::min);
        assert!(
            overlay.y.lo <= lowest && lowest < 2.01,
            "axis from {} hides the lowest loss {lowest}",
            overlay.y.lo
        );
    }

    #[test]
    fn a_two_parameter_grid_gets_lines_per_value_of_the_second() {
        let figure = SweepFigure {
            title: "s".into(),
            points: vec![
                point(1e-3, 0, 1.0),
                point(1e-4, 0, 2.0),
                point(1e-5, 0, 3.0),
                point(1e-3, 1, 1.5),
                point(1e-4, 1, 2.5),
                point(1e-5, 1, 3.5),
            ],
            smoothing: 0.6,
            log_loss: false,
            by: None,
        };
        assert_eq!(figure.swept(), ["training.optimizer.lr", "training.seed"]);
        assert_eq!(figure.label(&figure.points[3]), "lr=1e-3, seed=1");
        let panels = figure.panels();
        assert_eq!(panels.len(), 2);
        assert_eq!(panels[0].curves.len(), 6);
        assert_eq!(
            panels[0].curves[0].label.clone(),
            Some("lr=1e-5, seed=0".to_string()),
            "sorted by value"
        );
        let finals = &panels[1];
        assert_eq!(finals.x.format, TickFormat::Log10, "lr spans two decades");
        assert_eq!(
            finals
                .curves
                .iter()
                .map(|c| c.label.clone().unwrap())
                .collect::<Vec<_>>(),
            ["seed=0", "seed=1"]
        );
        assert_eq!(
            finals.curves[0].points,
            vec![(-5.0, 3.0), (-4.0, 2.0), (-3.0, 1.0)]
        );
    }

    #[test]
    fn points_with_validation_losses_are_compared_by_them() {
        // The training loss of the last step ranks seed 0 first; the validation loss, seed 1.
        let evaluated = |lr, seed, train, validation| PointRecords {
            evals: vec![(3, validation + 1.0), (5, validation)],
            ..point(lr, seed, train)
        };
        let figure = SweepFigure {
            title: "s".into(),
            points: vec![evaluated(1e-3, 0, 1.0, 2.5), evaluated(1e-3, 1, 1.5, 2.0)],
            smoothing: 0.6,
            log_loss: false,
            by: None,
        };
        let finals = &figure.panels()[1];
        assert_eq!(finals.title, "final validation loss by training.seed");
        assert_eq!(finals.y.label, "final validation loss");
        assert_eq!(finals.curves[0].points, vec![(0.0, 2.5), (1.0, 2.0)]);

        // One point without an evaluation: the training loss, said so, for every point.
        let mut points = figure.points;
        points[1].evals.clear();
        let figure = SweepFigure { points, ..figure };
        let finals = &figure.panels()[1];
        assert_eq!(
            finals.title,
            "final training loss (last step) by training.seed"
        );
        assert_eq!(finals.curves[0].points, vec![(0.0, 1.0), (1.0, 1.5)]);
    }

    #[test]
    fn the_final_loss_lines_are_listed_by_value() {
        // Seeds have more values: along the axis; the rates make the lines.
        let points = [1e-3, 1e-4, 3e-4]
            .into_iter()
            .flat_map(|lr| (0..4).map(move |seed| point(lr, seed, 1.0)))
            .collect();
        let figure = SweepFigure {
            title: "s".into(),
            points,
            smoothing: 0.6,
            log_loss: false,
            by: None,
        };
        let panels = figure.panels();
        let lines: Vec<String> = panels[1]
            .curves
            .iter()
            .map(|c| c.label.clone().unwrap())
            .collect();
        assert_eq!(lines, ["lr=1e-4", "lr=3e-4", "lr=1e-3"]);
    }

    #[test]
    fn a_point_not_finished_is_a_ring_at_its_latest_loss_off_the_lines() {
        let mut points = vec![
            point(1e-3, 0, 1.0),
            point(1e-4, 0, 2.0),
            point(1e-5, 0, 3.0),
            point(1e-3, 1, 1.5),
        ];
        points[1].progress = PointProgress::Going;
        points[3].progress = PointProgress::Stopped;
        let figure = SweepFigure {
            title: "s".into(),
            points,
            smoothing: 0.0,
            log_loss: false,
            by: None,
        };
        let finals = &figure.panels()[1];
        let lines: Vec<_> = finals
            .curves
            .iter()
            .map(|c| (c.label.clone().unwrap(), c.points.clone()))
            .collect();
        assert_eq!(
            lines,
            [("seed=0".to_string(), vec![(-5.0, 3.0), (-3.0, 1.0)])],
            "seed=1 has no finished point"
        );
        let rings: Vec<_> = finals
            .dots
            .iter()
            .filter(|d| d.hollow)
            .map(|d| (d.points.clone(), d.label.clone()))
            .collect();
        assert_eq!(
            rings,
            [
                (
                    vec![(-4.0, 2.0)],
                    Some("not finished: latest loss".to_string())
                ),
                (vec![(-3.0, 1.5)], None),
            ]
        );
        assert_eq!(
            finals.dots.iter().filter(|d| !d.hollow).count(),
            1,
            "discs on the one line"
        );
    }

    #[test]
    fn a_diverged_point_does_not_stretch_the_final_loss_axis() {
        let mut points = vec![
            point(1e-3, 0, 1.0),
            point(1e-4, 0, 2.0),
            point(1e30, 0, 1.0),
        ];
        if let Some(last) = points[2].steps.last_mut() {
            last.loss = f64::NAN;
        }
        let figure = SweepFigure {
            title: "s".into(),
            points,
            smoothing: 0.0,
            log_loss: false,
            by: None,
        };
        let finals = &figure.panels()[1];
        assert!(
            finals.x.hi < 0.0,
            "lr 1e30 is not on the axis: {:?}",
            finals.x
        );
        assert_eq!(finals.curves[0].points, vec![(-4.0, 2.0), (-3.0, 1.0)]);
        // In the overlay, cut at its edge, the diverged curve is named as such.
        let labels: Vec<_> = figure.panels()[0]
            .curves
            .iter()
            .filter_map(|c| c.label.clone())
            .collect();
        assert_eq!(
            labels.iter().filter(|l| l.ends_with(" (diverged)")).count(),
            1,
            "{labels:?}"
        );
        assert!(
            labels
                .iter()
                .any(|l| l.contains("1e30") && l.ends_with(" (diverged)")),
            "{labels:?}"
        );
    }

    #[test]
    fn a_point_that_blew_up_sets_neither_axis() {
        // An LR far too high: the loss overflows, then is finite again, enormous.
        let mut points = vec![point(1e-3, 0, 1.0), point(1e-4, 0, 2.0), point(1e6, 0, 1.0)];
        for (r, loss) in points[2]
            .steps
            .iter_mut()
            .zip([3.0, f64::INFINITY, 1e25, 4e26, 9e27])
        {
            r.loss = loss;
        }
        let figure = SweepFigure {
            title: "s".into(),
            points,
            smoothing: 0.6,
            log_loss: false,
            by: None,
        };
        let panels = figure.panels();
        assert!(panels[0].y.hi < 10.0, "loss axis: {:?}", panels[0].y);
        assert_eq!(
            panels[0].curves.len(),
            3,
            "its curve is drawn, cut at the edge"
        );
        assert!(
            panels[1].x.hi < 0.0,
            "lr 1e6 is not on the axis: {:?}",
            panels[1].x
        );
        assert!(panels[1].y.hi < 10.0, "final loss axis: {:?}", panels[1].y);
    }

    #[test]
    fn rates_over_a_decade_get_a_log_axis_and_seeds_a_linear_one() {
        let finals_axis = |points: Vec<PointRecords>| {
            let figure = SweepFigure {
                title: "s".into(),
                points,
                smoothing: 0.0,
                log_loss: false,
                by: None,
            };
            figure.panels()[1].x.format.clone()
        };
        let lrs = [1e-4, 3e-4, 1e-3, 3e-3];
        let by_lr = lrs.iter().map(|&lr| point(lr, 0, 1.0)).collect();
        assert_eq!(finals_axis(by_lr), TickFormat::Log10);
        let mut by_seed: Vec<PointRecords> = (1..=10).map(|seed| point(1e-3, seed, 1.0)).collect();
        for p in &mut by_seed {
            p.params.remove("training.optimizer.lr");
        }
        assert_eq!(finals_axis(by_seed), TickFormat::Values);
    }

    #[test]
    fn no_two_named_curves_are_drawn_alike_past_the_palette() {
        let points: Vec<PointRecords> = (0..24)
            .map(|i| point(10f64.powi(-(i % 6)), i as u64 / 6, 1.0 + i as f64))
            .collect();
        let figure = SweepFigure {
            title: "s".into(),
            points,
            smoothing: 0.0,
            log_loss: false,
            by: None,
        };
        for panel in figure.panels() {
            // The grey curves past the overlay's legend are alike on purpose.
            let pens: Vec<_> = panel
                .curves
                .iter()
                .filter(|c| c.label.is_some())
                .map(|c| (c.color, c.dash))
                .collect();
            for (i, pen) in pens.iter().enumerate() {
                assert!(
                    !pens[..i].contains(pen),
                    "{}: curve {i} drawn as an earlier one",
                    panel.title
                );
            }
        }
        let overlay = &figure.panels()[0];
        assert_eq!(overlay.curves.len(), 24);
        let named: Vec<&Curve> = overlay
            .curves
            .iter()
            .filter(|c| c.label.is_some())
            .collect();
        assert_eq!(named.len(), MAX_LEGEND);
        assert_eq!(named[9].dash, None);
        assert!(named[10].dash.is_some(), "the 11th named curve is dashed");
        assert_eq!(named[10].color, named[0].color);
    }

    /// Three swept parameters (the example sweep's lr × weight decay × seed): the one with
    /// the most values along the axis, a line per combination of the others; `--by` picks
    /// another, by short name or path, and one that does not vary is refused naming those
    /// that do.
    #[test]
    fn three_swept_parameters_put_one_on_the_axis_and_a_line_per_combination_of_the_others() {
        let mut points = Vec::new();
        for (i, lr) in [1e-2, 1e-3, 1e-4].into_iter().enumerate() {
            for seed in [0, 1] {
                for decay in [0.0, 0.1] {
                    let mut p = point(lr, seed, 1.0 + i as f64 + decay);
                    p.params.insert(
                        "training.optimizer.weight_decay".into(),
                        serde_json::json!(decay),
                    );
                    points.push(p);
                }
            }
        }
        let mut figure = SweepFigure {
            title: "s".into(),
            points,
            smoothing: 0.0,
            log_loss: false,
            by: None,
        };
        assert_eq!(figure.swept().len(), 3);
        assert_eq!(
            figure.final_axes().unwrap(),
            Some((
                "training.optimizer.lr".to_string(),
                vec![
                    "training.optimizer.weight_decay".to_string(),
                    "training.seed".to_string()
                ]
            ))
        );
        let panels = figure.panels();
        assert_eq!(panels.len(), 2);
        let lines: Vec<&str> = panels[1]
            .curves
            .iter()
            .filter_map(|c| c.label.as_deref())
            .collect();
        assert_eq!(
            lines,
            [
                "weight_decay=0, seed=0",
                "weight_decay=0, seed=1",
                "weight_decay=0.1, seed=0",
                "weight_decay=0.1, seed=1"
            ]
        );
        assert!(panels[1].curves.iter().all(|c| c.points.len() == 3));
        figure.by = Some("seed".into());
        let (x, lines) = figure.final_axes().unwrap().unwrap();
        assert_eq!(x, "training.seed");
        assert_eq!(lines.len(), 2);
        figure.by = Some("training.optimizer.weight_decay".into());
        assert_eq!(
            figure.final_axes().unwrap().unwrap().0,
            "training.optimizer.weight_decay"
        );
        figure.by = Some("optimizer.weight_decay".into());
        assert_eq!(
            figure.final_axes().unwrap().unwrap().0,
            "training.optimizer.weight_decay",
            "a dotted tail names it too"
        );
        figure.by = Some("steps".into());
        let err = figure.final_axes().unwrap_err();
        assert!(
            err.contains("`--by steps`") && err.contains("`lr`") && err.contains("`seed`"),
            "{err}"
        );

        // Points given different parameter sets: one without the axis parameter is left
        // out and named; one without a line parameter is on a line labelled with `-`.
        figure.by = None;
        figure.points[0].params.remove("training.optimizer.lr");
        figure.points[1]
            .params
            .remove("training.optimizer.weight_decay");
        assert_eq!(
            figure.without_axis_value().map(|l| l.split("; ").count()),
            Some(1)
        );

        let panels = figure.panels();
        let lines: Vec<&str> = panels[1]
            .curves
            .iter()
            .filter_map(|c| c.label.as_deref())
            .collect();
        assert!(lines.contains(&"weight_decay=-, seed=0"), "{lines:?}");
        assert_eq!(
            panels[1]
                .curves
                .iter()
                .map(|c| c.points.len())
                .sum::<usize>(),
            figure.points.len() - 1
        );
        // Not finished, a point left out is not counted among the panel's rings.
        assert_eq!(figure.unfinished_in_final_loss(), 0);
        for p in &mut figure.points[..3] {
            p.progress = PointProgress::Going;
        }
        assert_eq!(figure.unfinished_in_final_loss(), 2);

        // More lines than the legend has room for: the rest grey, counted on its last line.
        let mut points = Vec::new();
        for lr in [1e-2, 1e-3, 1e-4] {
            for seed in [0, 1, 2] {
                for decay in [0.0, 0.1, 0.2] {
                    for dropout in [0.0, 0.1, 0.2, 0.3] {
                        let mut p = point(lr, seed, 1.0 + decay + dropout);
                        p.params.insert(
                            "training.optimizer.weight_decay".into(),
                            serde_json::json!(decay),
                        );
                        p.params
                            .insert("training.model.dropout".into(), serde_json::json!(dropout));
                        points.push(p);
                    }
                }
            }
        }
        let many = SweepFigure {
            title: "s".into(),
            points,
            smoothing: 0.0,
            log_loss: false,
            by: None,
        };
        let (x, lines) = many.final_axes().unwrap().unwrap();
        assert_eq!((x.as_str(), lines.len()), ("training.model.dropout", 3));
        let panel = &many.panels()[1];
        let named = panel.curves.iter().filter(|c| c.label.is_some()).count();
        assert_eq!((named, panel.curves.len()), (MAX_LEGEND, 27));
        assert_eq!(
            panel.legend_note.as_deref(),
            Some("... and 15 more line(s), in grey")
        );

        // A name two parameters end in is refused, naming both; the path picks one.
        let mut two = SweepFigure {
            title: "s".into(),
            points: (0..4)
                .map(|i| {
                    let mut p = point(1e-3, 0, 1.0 + i as f64);
                    p.params.insert(
                        "training.model.dropout".into(),
                        serde_json::json!(0.1 * (i % 2) as f64),
                    );
                    p.params.insert(
                        "training.data.dropout".into(),
                        serde_json::json!(0.1 * (i / 2) as f64),
                    );
                    p
                })
                .collect(),
            smoothing: 0.0,
            log_loss: false,
            by: Some("dropout".into()),
        };
        let err = two.final_axes().unwrap_err();
        assert!(
            err.contains("`training.data.dropout` and `training.model.dropout`"),
            "{err}"
        );
        two.by = Some("model.dropout".into());
        assert_eq!(
            two.final_axes().unwrap().unwrap().0,
            "training.model.dropout"
        );
    }
}
