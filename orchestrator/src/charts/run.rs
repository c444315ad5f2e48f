//! The figure of one run: loss on top (the raw curve faint under its smoothed one, eval
//! losses as dots), then learning rate, gradient norm, tokens/s (and MFU on GPUs) and peak
//! memory, with a vertical line wherever the run's events say something happened
//! (checkpoints, preemptions and requeues, stops, failures, resumes).

use super::canvas::{self, Axis, Curve, Dots, Figure, Marker, Panel, PALETTE, TITLE_HEIGHT, WIDTH};
use super::series::{ema, value_range, Point};
use crate::events_file::{EventRecord, RunEvent};
use crate::metrics_file::EvalRecord;
use crate::step_record::StepRecord;
use plotters::coord::Shift;
use plotters::prelude::*;

pub struct RunFigure {
    pub title: String,
    pub steps: Vec<StepRecord>,
    pub evals: Vec<EvalRecord>,
    pub events: Vec<EventRecord>,
    /// EMA weight of the smoothed curves (0: raw curves only).
    pub smoothing: f64,
    /// Loss on a log10 axis.
    pub log_loss: bool,
}

const LOSS_HEIGHT: u32 = 430;
const ROW_HEIGHT: u32 = 270;

impl RunFigure {
    /// Every panel, loss first.
    pub fn panels(&self) -> Vec<Panel> {
        let first = self.steps.first().map_or(0.0, |r| r.step as f64);
        let last = self.steps.last().map_or(1.0, |r| r.step as f64);
        // A little room past the first and last steps: a marker there (a resume from the
        // first step, a failure after the last) would otherwise lie on the panel's frame.
        let room = ((last - first) * 0.02).max(0.5);
        let x = Axis::steps(first - room, last + room);
        let markers = self.markers();
        let points = |get: &dyn Fn(&StepRecord) -> f64| -> Vec<Point> {
            self.steps.iter().map(|r| (r.step as f64, get(r))).collect()
        };
        let mut panels = vec![self.loss_panel(&x, &markers)];
        let mut add = |title: &str, label: &str, raw: Vec<Point>, smooth: bool, color: usize| {
            panels.push(series_panel(
                title,
                label,
                &x,
                raw,
                if smooth { self.smoothing } else { 0.0 },
                PALETTE[color],
                &markers,
            ));
        };
        add("learning rate", "lr", points(&|r| r.lr), false, 1);
        add("gradient norm", "norm", points(&|r| r.grad_norm), true, 2);
        add(
            "tokens/s (whole job)",
            "tokens/s",
            points(&|r| r.tokens_per_s),
            true,
            4,
        );
        if self.steps.iter().any(|r| r.mfu.is_some()) {
            add(
                "MFU",
                "%",
                points(&|r| r.mfu.map_or(f64::NAN, |m| m * 100.0)),
                true,
                5,
            );
        }
        let peak = self
            .steps
            .iter()
            .map(|r| r.peak_memory_max_bytes)
            .max()
            .unwrap_or(0) as f64;
        let (unit, scale) = if peak >= 4.0 * 1024f64.powi(3) {
            ("GiB", 1024f64.powi(3))
        } else {
            ("MiB", 1024f64.powi(2))
        };
        // CPU ranks report their resident set; GPU ranks the allocator's peak.
        let gpu = self
            .steps
            .iter()
            .any(|r| r.peak_reserved_max_bytes.is_some());
        add(
            if gpu {
                "peak memory allocated (the rank with the most)"
            } else {
                "peak resident memory, RSS (the rank with the most)"
            },
            unit,
            points(&|r| r.peak_memory_max_bytes as f64 / scale),
            false,
            6,
        );
        panels
    }

    fn loss_panel(&self, x: &Axis, markers: &[Marker]) -> Panel {
        let transform = |v: f64| {
            if self.log_loss {
                if v > 0.0 {
                    v.log10()
                } else {
                    f64::NAN
                }
            } else {
                v
            }
        };
        let raw: Vec<Point> = self
            .steps
            .iter()
            .filter_map(|r| Some((r.step as f64, transform(r.loss()?))))
            .collect();
        let evals: Vec<Point> = self
            .evals
            .iter()
            .map(|e| (e.step as f64, transform(e.eval_loss)))
            .collect();
        let smoothed = if self.smoothing > 0.0 {
            ema(&raw, self.smoothing)
        } else {
            Vec::new()
        };
        let mut keep = ends(&smoothed);
        keep.extend(evals.iter().map(|p| p.1));
        let range = value_range(
            &raw.iter().map(|p| p.1).collect::<Vec<_>>(),
            &keep,
            !smoothed.is_empty(),
        );
        let label = if self.log_loss {
            "loss (log scale)"
        } else {
            "loss"
        };
        let mut curves = vec![Curve {
            points: raw,
            color: PALETTE[0],
            dash: None,
            width: 1,
            opacity: if smoothed.is_empty() { 1.0 } else { 0.3 },
            label: Some("loss".into()),
        }];
        if !smoothed.is_empty() {
            curves.push(Curve {
                points: smoothed,
                color: PALETTE[0],
                dash: None,
                width: 2,
                opacity: 1.0,
                label: Some(format!("loss, smoothed (EMA {})", self.smoothing)),
            });
        }
        Panel {
            title: "loss".into(),
            x: x.clone(),
            y: Axis::values(range, self.log_loss, label),
            curves,
            dots: if evals.is_empty() {
                Vec::new()
            } else {
                vec![Dots {
                    points: evals,
                    color: PALETTE[3],
                    label: Some("eval loss".into()),
                    hollow: false,
                }]
            },
            markers: markers.to_vec(),
            legend: true,
            marker_text: true,
            legend_note: None,
        }
    }

    /// A marker per event that has a step; one repeated at a step is drawn once.
    pub fn markers(&self) -> Vec<Marker> {
        let mut out: Vec<Marker> = Vec::new();
        // How often each marker's event happened at its step (resumed twice from one
        // checkpoint): drawn once, counted in its label.
        let mut times: Vec<u32> = Vec::new();
        for (i, record) in self.events.iter().enumerate() {
            let Some(step) = record.event.step() else {
                continue;
            };
            // A later attempt resumed from before this event's step, or started over: the
            // curve there is the later attempt's, so the event is drawn faint and says so.
            let later = &self.events[i + 1..];
            let rerun_from = later.iter().enumerate().find_map(|(k, e)| match e.event {
                RunEvent::Resumed { step: from, .. } if from < step => Some(from),
                // An attempt that trained (it saved or finished) without a resume restored
                // nothing: it started over. One that ended while it loaded says nothing.
                RunEvent::Started { .. } => {
                    let attempt: Vec<&RunEvent> = later[k + 1..]
                        .iter()
                        .map(|next| &next.event)
                        .take_while(|next| !matches!(next, RunEvent::Started { .. }))
                        .collect();
                    let resumed = attempt
                        .iter()
                        .any(|e| matches!(e, RunEvent::Resumed { .. }));
                    let trained = attempt.iter().any(|e| {
                        matches!(e, RunEvent::Checkpoint { .. } | RunEvent::Finished { .. })
                    });
                    (trained && !resumed).then_some(0)
                }
                _ => None,
            });
            // A requeue Slurm refused (the attempt then failed) did not happen.
            if matches!(record.event, RunEvent::Requeued { .. })
                && !crate::events_file::requeued_at(&self.events, i)
            {
                continue;
            }
            let (kind, color, width, opacity, text) = match &record.event {
                RunEvent::Checkpoint { .. } => {
                    ("checkpoint", RGBColor(0x70, 0x70, 0x70), 1, 0.5, None)
                }
                RunEvent::Resumed { .. } => (
                    "resumed",
                    RGBColor(0x2c, 0xa0, 0x2c),
                    2,
                    1.0,
                    Some(format!("resumed from step {step}")),
                ),
                RunEvent::Preempted { notice, .. } => (
                    "preempted",
                    RGBColor(0xff, 0x7f, 0x0e),
                    2,
                    1.0,
                    Some(format!("{} after step {step}", notice.marker())),
                ),
                RunEvent::Requeued {
                    requeue,
                    max_requeues,
                    ..
                } => (
                    "requeued",
                    RGBColor(0xd6, 0x6a, 0x00),
                    2,
                    1.0,
                    Some(format!("requeued ({requeue} of {max_requeues})")),
                ),
                RunEvent::Stopped { by, .. } => (
                    "stopped",
                    RGBColor(0x94, 0x67, 0xbd),
                    2,
                    1.0,
                    Some(format!("stopped after step {step} ({by})")),
                ),
                RunEvent::Failed { .. } => (
                    "failed",
                    RGBColor(0xd6, 0x27, 0x28),
                    2,
                    1.0,
                    Some(format!("failed after step {step}")),
                ),
                RunEvent::Finished { .. }
                | RunEvent::Started { .. }
                | RunEvent::PreemptRequested { .. } => continue,
            };
            let (opacity, text) = match rerun_from {
                Some(0) => (
                    opacity * 0.4,
                    text.map(|t| format!("{t} (then rerun from the start)")),
                ),
                Some(from) => (
                    opacity * 0.4,
                    text.map(|t| format!("{t} (then rerun from step {from})")),
                ),
                None => (opacity, text),
            };
            let step = step as f64;
            if let Some(same) = out.iter().position(|m| m.kind == kind && m.step == step) {
                times[same] += 1;
                // The latest of them says whether the curve there is still its attempt's.
                out[same].opacity = opacity;
                out[same].text = text;
                continue;
            }
            times.push(1);
            out.push(Marker {
                step,
                color,
                width,
                opacity,
                kind: kind.into(),
                text,
                text_row: 0,
            });
        }
        for (marker, &n) in out.iter_mut().zip(&times).filter(|(_, &n)| n > 1) {
            if let Some(label) = marker.text.as_mut() {
                label.push_str(&format!(" ({n}×)"));
            }
        }
        // Where the loss (or an applied gradient) stops being finite, or the loss blows up:
        // its curve ends there or leaves the chart, and nothing else would say why.
        let mut was_diverged = false;
        for record in &self.steps {
            let diverged = record.diverged();
            if diverged && !was_diverged {
                let kind = if record.loss_blew_up && record.loss.is_finite() {
                    "blew up"
                } else {
                    "not finite"
                };
                out.push(Marker {
                    step: record.step as f64,
                    color: RGBColor(0x33, 0x33, 0x33),
                    width: 2,
                    opacity: 1.0,
                    kind: kind.into(),
                    text: Some(format!("{kind} from step {}", record.step)),
                    text_row: 0,
                });
            }
            was_diverged = diverged;
        }
        // Labels of markers within a sixth of the run of each other go on separate lines:
        // each on the first line no label near it uses.
        let span = self.steps.last().map_or(1.0, |r| r.step as f64)
            - self.steps.first().map_or(0.0, |r| r.step as f64);
        let mut labelled: Vec<(f64, u32)> = Vec::new();
        for marker in out.iter_mut().filter(|m| m.text.is_some()) {
            let taken: Vec<u32> = labelled
                .iter()
                .filter(|(s, _)| (s - marker.step).abs() <= span.max(1.0) / 6.0)
                .map(|&(_, row)| row)
                .collect();
            marker.text_row = (0..).find(|row| !taken.contains(row)).unwrap_or(0);
            labelled.push((marker.step, marker.text_row));
        }
        out
    }
}

/// Where a smoothed curve starts and ends: always inside the panel (the first value is the
/// run's first, a loss's starting point; the last is where the run stands). In between it
/// may leave the panel after a spike, and is cut there like the raw curve.
fn ends(smoothed: &[Point]) -> Vec<f64> {
    smoothed
        .first()
        .into_iter()
        .chain(smoothed.last())
        .map(|p| p.1)
        .collect()
}

/// A panel of one series: raw (faint when smoothed) and its EMA; in a long run, spikes beyond
/// the 1st and 99th percentiles are cut at the panel's edge when smoothed.
fn series_panel(
    title: &str,
    label: &str,
    x: &Axis,
    raw: Vec<Point>,
    smoothing: f64,
    color: RGBColor,
    markers: &[Marker],
) -> Panel {
    let smoothed = if smoothing > 0.0 {
        ema(&raw, smoothing)
    } else {
        Vec::new()
    };
    let range = value_range(
        &raw.iter().map(|p| p.1).collect::<Vec<_>>(),
        &ends(&smoothed),
        !smoothed.is_empty(),
    );
    let mut curves = vec![Curve {
        points: raw,
        color,
        dash: None,
        width: if smoothed.is_empty() { 2 } else { 1 },
        opacity: if smoothed.is_empty() { 1.0 } else { 0.3 },
        label: None,
    }];
    if !smoothed.is_empty() {
        curves.push(Curve {
            points: smoothed,
            color,
            dash: None,
            width: 2,
            opacity: 1.0,
            label: None,
        });
    }
    Panel {
        title: title.into(),
        x: x.clone(),
        y: Axis::values(range, false, label),
        curves,
        dots: Vec::new(),
        markers: markers
            .iter()
            .map(|m| Marker {
                text: None,
                ..m.clone()
            })
            .collect(),
        legend: false,
        marker_text: false,
        legend_note: None,
    }
}

impl Figure for RunFigure {
    fn size(&self) -> (u32, u32) {
        let others = self.panels().len() - 1;
        (
            WIDTH,
            TITLE_HEIGHT + LOSS_HEIGHT + others.div_ceil(2) as u32 * ROW_HEIGHT,
        )
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
        let (top, rest) = body.split_vertically(LOSS_HEIGHT);
        canvas::draw_panel(&top, &panels[0], surface)?;
        for (area, panel) in canvas::grid(&rest, panels.len() - 1, 2)
            .iter()
            .zip(&panels[1..])
        {
            canvas::draw_panel(area, panel, surface)?;
        }
        root.present().map_err(canvas::err)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shardrun_protocol::messages::StepMetrics;

    fn record(step: u64, loss: f64) -> StepRecord {
        StepRecord::fold(
            &[StepMetrics {
                rank: 0,
                step,
                loss,
                lr: 1e-3,
                grad_norm: 1.0,
                step_time_s: 0.1,
                tokens_per_s: 100.0,
                model_state_bytes: 1,
                peak_memory_bytes: 1 << 20,
                ..Default::default()
            }],
            0.0,
        )
    }

    fn event(event: RunEvent) -> EventRecord {
        EventRecord { time: 0.0, event }
    }

    #[test]
    fn a_figure_that_cannot_be_written_says_where_to_write_it_and_leaves_nothing() {
        let figure = RunFigure {
            title: "t".into(),
            steps: (1..=3).map(|s| record(s, 2.0)).collect(),
            evals: Vec::new(),
            events: Vec::new(),
            smoothing: 0.0,
            log_loss: false,
        };
        let dir = tempfile::tempdir().unwrap();
        let nowhere = dir.path().join("gone/metrics.svg");
        let said = crate::charts::save(&figure, &nowhere)
            .unwrap_err()
            .to_string();
        assert_eq!(
            said,
            format!(
                "cannot write {}: No such file or directory (os error 2)\n  fix: write the \
                 figure elsewhere: `-o <file>.svg` (or .png)",
                nowhere.display()
            )
        );
        // A name of no format it knows: said, and the file it tried is not left behind.
        let unknown = dir.path().join("metrics.txt");
        let said = crate::charts::save(&figure, &unknown).unwrap_err();
        assert!(
            format!("{said:#}").contains("name it .svg or .png"),
            "{said:#}"
        );
        assert!(!unknown.exists());
        let svg = dir.path().join("metrics.svg");
        crate::charts::save(&figure, &svg).unwrap();
        assert!(std::fs::read_to_string(&svg).unwrap().starts_with("<svg"));
    }

    #[test]
    fn a_loss_that_stops_being_finite_is_marked_where_it_does() {
        let figure = RunFigure {
            title: "t".into(),
            steps: (1..=8)
                .map(|s| record(s, if s < 5 { 2.0 } else { f64::NAN }))
                .collect(),
            evals: Vec::new(),
            events: Vec::new(),
            smoothing: 0.0,
            log_loss: false,
        };
        let markers = figure.markers();
        assert_eq!(markers.len(), 1, "{markers:?}");
        assert_eq!(
            (markers[0].step, markers[0].kind.as_str()),
            (5.0, "not finite")
        );
        assert_eq!(markers[0].text.as_deref(), Some("not finite from step 5"));

        // A loss that blew up while finite is marked as such where it starts.
        let blown = RunFigure {
            steps: (1..=6)
                .map(|s| StepRecord {
                    loss_blew_up: s >= 3,
                    ..record(s, if s < 3 { 2.0 } else { 4.2e5 })
                })
                .collect(),
            ..figure
        };
        let markers = blown.markers();
        assert_eq!(markers.len(), 1, "{markers:?}");
        assert_eq!(markers[0].text.as_deref(), Some("blew up from step 3"));
    }

    #[test]
    fn nearby_labels_take_free_lines_and_repeats_are_counted() {
        let figure = RunFigure {
            title: "t".into(),
            steps: (1..=600).map(|s| record(s, 1.0)).collect(),
            evals: Vec::new(),
            events: vec![
                event(RunEvent::Resumed {
                    step: 100,
                    path: "c".into(),
                }),
                event(RunEvent::Stopped {
                    step: Some(180),
                    by: "SIGTERM".into(),
                }),
                // Near the second only: the first line is free there.
                event(RunEvent::Resumed {
                    step: 240,
                    path: "c".into(),
                }),
                event(RunEvent::Resumed {
                    step: 240,
                    path: "c".into(),
                }),
                event(RunEvent::Resumed {
                    step: 240,
                    path: "c".into(),
                }),
            ],
            smoothing: 0.0,
            log_loss: false,
        };
        let labels: Vec<(Option<String>, u32)> = figure
            .markers()
            .into_iter()
            .map(|m| (m.text, m.text_row))
            .collect();
        assert_eq!(
            labels,
            [
                (Some("resumed from step 100".into()), 0),
                (Some("stopped after step 180 (SIGTERM)".into()), 1),
                (Some("resumed from step 240 (3×)".into()), 0),
            ]
        );
    }

    #[test]
    fn panels_and_markers_of_a_resumed_run() {
        let figure = RunFigure {
            title: "t".into(),
            steps: (1..=30).map(|s| record(s, 10.0 / s as f64)).collect(),
            evals: vec![EvalRecord {
                step: 10,
                eval_loss: 1.5,
                eval_perplexity: None,
            }],
            events: vec![
                event(RunEvent::Checkpoint {
                    step: 10,
                    path: "c".into(),
                }),
                event(RunEvent::Failed {
                    step: Some(12),
                    reason: "x".into(),
                }),
                event(RunEvent::Resumed {
                    step: 10,
                    path: "c".into(),
                }),
                event(RunEvent::Checkpoint {
                    step: 10,
                    path: "c".into(),
                }),
                event(RunEvent::Checkpoint {
                    step: 20,
                    path: "c".into(),
                }),
                event(RunEvent::Finished { step: 30 }),
            ],
            smoothing: 0.9,
            log_loss: false,
        };
        let panels = figure.panels();
        assert_eq!(
            panels.iter().map(|p| p.title.as_str()).collect::<Vec<_>>(),
            [
                "loss",
                "learning rate",
                "gradient norm",
                "tokens/s (whole job)",
                "peak resident memory, RSS (the rank with the most)"
            ]
        );
        // GPU ranks report the allocator's peak, and the panel says so.
        let mut gpu = RunFigure {
            title: "t".into(),
            steps: figure.steps.clone(),
            evals: Vec::new(),
            events: Vec::new(),
            smoothing: 0.0,
            log_loss: false,
        };
        for r in &mut gpu.steps {
            r.peak_reserved_max_bytes = Some(2 << 20);
        }
        assert_eq!(
            gpu.panels().last().map(|p| p.title.clone()).as_deref(),
            Some("peak memory allocated (the rank with the most)")
        );
        let kinds: Vec<(&str, f64)> = panels[0]
            .markers
            .iter()
            .map(|m| (m.kind.as_str(), m.step))
            .collect();
        assert_eq!(
            kinds,
            [
                ("checkpoint", 10.0),
                ("failed", 12.0),
                ("resumed", 10.0),
                ("checkpoint", 20.0)
            ]
        );
        // The failure's step was trained again by the resumed attempt: its line is faint.
        let failed = &panels[0].markers[1];
        assert_eq!(
            failed.text.as_deref(),
            Some("failed after step 12 (then rerun from step 10)")
        );
        assert!(failed.opacity < 0.5, "{failed:?}");
        assert_eq!(panels[0].markers[2].opacity, 1.0, "the resume itself");
        // Stopped after step 12, then started over without a checkpoint to resume from.
        let started = || {
            event(RunEvent::Started {
                world_size: 2,
                slurm_job_id: None,
            })
        };
        let over = RunFigure {
            events: vec![
                started(),
                event(RunEvent::Stopped {
                    step: Some(12),
                    by: "SIGTERM".into(),
                }),
                started(),
                started(),
                event(RunEvent::Checkpoint {
                    step: 20,
                    path: "c".into(),
                }),
            ],
            title: "t".into(),
            steps: figure.steps.clone(),
            evals: Vec::new(),
            smoothing: 0.0,
            log_loss: false,
        };
        let markers = over.markers();
        assert_eq!(
            markers[0].text.as_deref(),
            Some("stopped after step 12 (SIGTERM) (then rerun from the start)")
        );
        assert!(markers[0].opacity < 0.5);
        // An attempt that ended while it loaded its checkpoint, then one that resumed: not a
        // start over.
        let loaded = RunFigure {
            events: vec![
                started(),
                event(RunEvent::Checkpoint {
                    step: 10,
                    path: "c".into(),
                }),
                event(RunEvent::Stopped {
                    step: Some(12),
                    by: "SIGTERM".into(),
                }),
                started(),
                event(RunEvent::Failed {
                    step: None,
                    reason: "x".into(),
                }),
                started(),
                event(RunEvent::Resumed {
                    step: 10,
                    path: "c".into(),
                }),
                event(RunEvent::Finished { step: 20 }),
            ],
            title: "t".into(),
            steps: figure.steps.clone(),
            evals: Vec::new(),
            smoothing: 0.0,
            log_loss: false,
        };
        let labels: Vec<Option<String>> = loaded.markers().into_iter().map(|m| m.text).collect();
        assert!(
            labels.contains(&Some(
                "stopped after step 12 (SIGTERM) (then rerun from step 10)".into()
            )),
            "{labels:?}"
        );
        // A requeue Slurm refused, after which the attempt failed, is not drawn.
        let refused = RunFigure {
            events: vec![
                started(),
                event(RunEvent::Preempted {
                    step: Some(5),
                    notice: Default::default(),
                }),
                event(RunEvent::Requeued {
                    step: Some(5),
                    slurm_job_id: "7".into(),
                    requeue: 1,
                    max_requeues: 3,
                }),
                event(RunEvent::Failed {
                    step: Some(5),
                    reason: "not requeued".into(),
                }),
            ],
            title: "t".into(),
            steps: figure.steps.clone(),
            evals: Vec::new(),
            smoothing: 0.0,
            log_loss: false,
        };
        let kinds: Vec<String> = refused.markers().into_iter().map(|m| m.kind).collect();
        assert_eq!(kinds, ["preempted", "failed"]);
        assert_eq!(panels[0].curves.len(), 2, "raw and smoothed");
        assert_eq!(panels[0].dots[0].points, vec![(10.0, 1.5)]);
        assert!(panels[1..]
            .iter()
            .all(|p| p.markers.iter().all(|m| m.text.is_none())));
        assert_eq!(panels[0].x.ticks.first(), Some(&5.0));
        assert!(panels[0].x.ticks.iter().all(|t| t.fract() == 0.0));

        let log = RunFigure {
            log_loss: true,
            ..figure
        };
        let loss = &log.panels()[0];
        assert!(
            (loss.curves[0].points[0].1 - 1.0).abs() < 1e-12,
            "log10(10)"
        );
    }

    /// (frames, data polylines and circles) of an SVG plotters wrote.
    type Shapes = (Vec<[f64; 4]>, Vec<(String, Vec<(f64, f64)>)>);

    fn shapes(svg: &str) -> Shapes {
        let attr = |tag: &str, name: &str| -> Option<String> {
            let key = format!(" {name}=\"");
            let start = tag.find(&key)? + key.len();
            Some(tag[start..start + tag[start..].find('"')?].to_string())
        };
        let num = |tag: &str, name: &str| attr(tag, name).unwrap().parse::<f64>().unwrap();
        let (mut frames, mut marks) = (Vec::new(), Vec::new());
        for tag in svg.split('<').map(|t| t.split('>').next().unwrap_or("")) {
            let stroke = attr(tag, "stroke").unwrap_or_default();
            if tag.starts_with("rect") && stroke == "#555555" {
                frames.push([
                    num(tag, "x"),
                    num(tag, "y"),
                    num(tag, "x") + num(tag, "width"),
                    num(tag, "y") + num(tag, "height"),
                ]);
            } else if tag.starts_with("polyline") && stroke != "#555555" && stroke != "#E4E4E4" {
                let points = attr(tag, "points")
                    .unwrap()
                    .split_whitespace()
                    .map(|p| {
                        let (x, y) = p.split_once(',').unwrap();
                        (x.parse().unwrap(), y.parse().unwrap())
                    })
                    .collect();
                marks.push((stroke, points));
            } else if tag.starts_with("circle") {
                marks.push((stroke, vec![(num(tag, "cx"), num(tag, "cy"))]));
            }
        }
        (frames, marks)
    }

    #[test]
    fn spikes_and_gaps_are_cut_at_the_panel_edge_never_drawn_across_another_panel() {
        let steps: Vec<StepRecord> = (1..=300)
            .map(|s| {
                let mut r = record(s, 3.0 - s as f64 * 0.001 + (s % 7) as f64 * 0.01);
                // Three spikes far above everything else.
                r.tokens_per_s = if s % 100 == 50 {
                    1e9
                } else {
                    1000.0 + (s % 5) as f64
                };
                r.grad_norm = if s == 200 {
                    f64::NAN
                } else {
                    1.0 + (s % 3) as f64 * 0.1
                };
                r.loss = if s == 120 { 1e6 } else { r.loss };
                r
            })
            .collect();
        let figure = RunFigure {
            title: "spiky".into(),
            steps,
            evals: Vec::new(),
            events: Vec::new(),
            smoothing: 0.6,
            log_loss: false,
        };
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("spiky.svg");
        canvas::save(&figure, &path).unwrap();
        let (frames, marks) = shapes(&std::fs::read_to_string(&path).unwrap());
        assert_eq!(frames.len(), 5);
        let inside = |f: &[f64; 4], (x, y): (f64, f64)| {
            x >= f[0] - 1.0 && x <= f[2] + 1.0 && y >= f[1] - 1.0 && y <= f[3] + 1.0
        };
        for (stroke, points) in &marks {
            assert!(
                frames.iter().any(|f| points.iter().all(|p| inside(f, *p))),
                "{stroke} drawn outside every panel: {points:?}"
            );
        }
        // The throughput spikes are cut where they cross the top edge: the raw curve stops
        // there and resumes where it comes back, never running along the edge (a value
        // pinned to the edge would read as a value).
        let throughput = &frames[3];
        let on_edge = |p: &(f64, f64)| (p.1 - throughput[1]).abs() <= 1.0;
        let raw: Vec<&Vec<(f64, f64)>> = marks
            .iter()
            .filter(|(stroke, points)| {
                stroke == "#9467BD" && points.iter().all(|p| inside(throughput, *p))
            })
            .map(|(_, points)| points)
            .collect();
        assert!(
            raw.iter()
                .filter(|points| points.iter().any(on_edge))
                .count()
                >= 6,
            "each spike leaves and re-enters the panel: {raw:?}"
        );
        for points in &raw {
            assert!(
                !points.windows(2).any(|w| on_edge(&w[0]) && on_edge(&w[1])),
                "a stretch drawn along the edge: {points:?}"
            );
        }
    }
}
