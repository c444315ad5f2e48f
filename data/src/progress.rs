//! Telling people how preparation goes: a progress bar on a terminal, otherwise a line every
//! few seconds (batch logs and `tail -f` read those).

use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::time::{Duration, Instant};

/// Where preparation's messages go (the console, a rank's log).
pub trait Observer: Sync {
    fn line(&self, text: &str);
    /// Draw a progress bar on stderr when it is a terminal.
    fn wants_bar(&self) -> bool {
        false
    }
}

/// Messages dropped (tests, benchmarks).
pub struct Quiet;

impl Observer for Quiet {
    fn line(&self, _text: &str) {}
}

/// Messages to stderr, with a bar on a terminal.
pub struct Stderr;

impl Observer for Stderr {
    fn line(&self, text: &str) {
        eprintln!("{text}");
    }
    fn wants_bar(&self) -> bool {
        true
    }
}

const LINE_EVERY: Duration = Duration::from_secs(10);

pub struct Progress<'a> {
    observer: &'a dyn Observer,
    bar: Option<ProgressBar>,
    what: String,
    total_bytes: u64,
    bytes: u64,
    tokens: u64,
    started: Instant,
    last_line: Instant,
}

impl<'a> Progress<'a> {
    pub fn new(observer: &'a dyn Observer, what: &str, total_bytes: u64) -> Progress<'a> {
        let bar = (observer.wants_bar() && std::io::stderr().is_terminal()).then(|| {
            let bar = ProgressBar::new(total_bytes);
            let style = ProgressStyle::with_template(
                // Decimal MB, as the line before the bar counts the data.
                "{msg} {bar:30.cyan/blue} {decimal_bytes}/{decimal_total_bytes} {decimal_bytes_per_sec} [{elapsed_precise} < {eta_precise}]",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar());
            bar.set_style(style);
            bar.set_message(format!("tokenizing {what}"));
            bar
        });
        let now = Instant::now();
        Progress {
            observer,
            bar,
            what: what.to_string(),
            total_bytes,
            bytes: 0,
            tokens: 0,
            started: now,
            last_line: now,
        }
    }

    pub fn advance(&mut self, bytes: u64, tokens: u64) {
        self.bytes += bytes;
        self.tokens += tokens;
        if let Some(bar) = &self.bar {
            bar.set_position(self.bytes);
            bar.set_message(format!(
                "tokenizing {} ({} tokens)",
                self.what,
                crate::dataset::thousands(self.tokens)
            ));
            return;
        }
        if self.last_line.elapsed() >= LINE_EVERY {
            self.last_line = Instant::now();
            let seconds = self.started.elapsed().as_secs_f64();
            self.observer.line(&format!(
                "tokenizing {}: {:.0}% ({:.1} of {:.1} MB, {:.1} MB/s, {} tokens)",
                self.what,
                100.0 * self.bytes as f64 / self.total_bytes.max(1) as f64,
                self.bytes as f64 / 1e6,
                self.total_bytes as f64 / 1e6,
                self.bytes as f64 / 1e6 / seconds.max(1e-9),
                crate::dataset::thousands(self.tokens)
            ));
        }
    }

    /// A line for people now, above the bar when there is one.
    pub fn note(&self, text: &str) {
        match &self.bar {
            Some(bar) => bar.suspend(|| self.observer.line(text)),
            None => self.observer.line(text),
        }
    }

    pub fn finish(self) {
        if let Some(bar) = self.bar {
            bar.finish_and_clear();
        }
    }
}
