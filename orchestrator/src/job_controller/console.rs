//! The controller's stdout, which under Slurm is the job's output file: controller messages,
//! the echoed ranks' lines and a one-line progress summary per metrics record. In local mode
//! on a terminal the summary is an indicatif progress bar with an ETA instead.

use super::clock;
use indicatif::{ProgressBar, ProgressStyle};
use shardrun_protocol::messages::{loss_text, EvalMetrics, StepMetrics};
use std::time::Instant;

pub struct Console {
    bar: Option<ProgressBar>,
    total_steps: u64,
    /// First metrics record seen (time, step): the ETA is the rate since then.
    first: Option<(Instant, u64)>,
    /// Lines kept instead of printed, for tests of what the console shows.
    #[cfg(test)]
    captured: Option<std::cell::RefCell<Vec<String>>>,
}

impl Console {
    /// `progress_bar`: draw a bar (only honoured when stdout is a terminal).
    pub fn new(total_steps: u64, progress_bar: bool) -> Console {
        use std::io::IsTerminal;
        let bar = (progress_bar && std::io::stdout().is_terminal()).then(|| {
            let bar = ProgressBar::new(total_steps);
            let style = ProgressStyle::with_template(
                "{bar:30.cyan/blue} step {pos}/{len} [{elapsed_precise} < {eta_precise}] {msg}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar());
            bar.set_style(style);
            bar
        });
        Console {
            bar,
            total_steps,
            first: None,
            #[cfg(test)]
            captured: None,
        }
    }

    /// A console that keeps its lines (see [`Console::captured`]) and draws nothing; `bar`:
    /// behave as on a terminal with a progress bar.
    #[cfg(test)]
    pub fn capturing(total_steps: u64, bar: bool) -> Console {
        Console {
            bar: bar.then(ProgressBar::hidden),
            total_steps,
            first: None,
            captured: Some(Default::default()),
        }
    }

    /// The lines a [`Console::capturing`] console would have shown.
    #[cfg(test)]
    pub fn captured(&self) -> Vec<String> {
        self.captured
            .as_ref()
            .map(|lines| lines.borrow().clone())
            .unwrap_or_default()
    }

    /// Whether progress is drawn as a bar (local mode on a terminal).
    pub fn has_bar(&self) -> bool {
        self.bar.is_some()
    }

    /// A line for people; printed above the bar when there is one.
    pub fn line(&self, text: &str) {
        #[cfg(test)]
        if let Some(lines) = &self.captured {
            lines.borrow_mut().push(text.to_string());
            return;
        }
        match &self.bar {
            Some(bar) => bar.println(text),
            // Training goes on whatever became of stdout: train.log has every line.
            None => outln!("{text}"),
        }
    }

    pub fn progress(&mut self, m: &StepMetrics) {
        let summary = format!(
            "loss {}  lr {:.2e}  grad norm {:.3}  {} tok/s{}{}{}",
            loss_text(m.loss()),
            m.lr,
            m.grad_norm,
            group_thousands(m.tokens_per_s),
            m.trained_tokens_per_s
                .map(|t| format!(" ({} trained)", group_thousands(t)))
                .unwrap_or_default(),
            m.mfu
                .map(|mfu| format!("  MFU {:.1}%", mfu * 100.0))
                .unwrap_or_default(),
            m.epoch
                .map(|e| format!("  epoch {e:.2}"))
                .unwrap_or_default()
        );
        let first_record = self.first.is_none();
        let first = *self.first.get_or_insert((Instant::now(), m.step));
        if let Some(bar) = &self.bar {
            bar.set_message(summary);
            bar.set_position(m.step);
            if first_record {
                // The rate since the launch counts the start-up (rendezvous, loading the
                // model) as training: the ETA counts from the first step instead.
                bar.reset_eta();
            }
            return;
        }
        let eta = eta_seconds(
            first.0.elapsed().as_secs_f64(),
            first.1,
            m.step,
            self.total_steps,
        )
        .map(|s| format!("  ETA {}", format_duration(s)))
        .unwrap_or_default();
        self.line(&format!(
            "{} step {}/{}  {summary}{eta}",
            clock::format_time_of_day(clock::now()),
            m.step,
            self.total_steps
        ));
    }

    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.abandon();
        }
    }
}

/// An evaluation for the console and the job's output file.
pub fn format_eval(e: &EvalMetrics) -> String {
    format!(
        "{} eval after step {}  loss {:.4}  perplexity {:.2}  ({} tokens, {:.1} s)",
        clock::format_time_of_day(clock::now()),
        e.step,
        e.eval_loss,
        e.eval_perplexity,
        group_thousands(e.eval_tokens as f64),
        e.eval_time_s
    )
}

/// Seconds left to step `total` at the pace from `first_step` to `step` (`elapsed`).
pub fn eta_seconds(elapsed: f64, first_step: u64, step: u64, total: u64) -> Option<f64> {
    let done = step.checked_sub(first_step).filter(|&d| d > 0)?;
    Some(elapsed / done as f64 * total.saturating_sub(step) as f64)
}

pub fn format_duration(secs: f64) -> String {
    let s = secs.round() as u64;
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, s / 60 % 60),
    }
}

/// `12345.6` → `12,346`.
pub fn group_thousands(x: f64) -> String {
    shardrun_data::dataset::thousands(x.max(0.0).round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_for_people() {
        assert_eq!(group_thousands(1234567.4), "1,234,567");
        assert_eq!(group_thousands(999.0), "999");
        assert_eq!(format_duration(75.0), "1m15s");
        assert_eq!(format_duration(7300.0), "2h01m");
        assert_eq!(eta_seconds(10.0, 1, 11, 21), Some(10.0));
        assert_eq!(eta_seconds(10.0, 5, 5, 21), None);
    }
}
