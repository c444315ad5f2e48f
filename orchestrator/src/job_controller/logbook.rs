//! Log files of a run: the merged `train.log` (every line prefixed with time and rank) and
//! `logs/rank-N.log`, plus the last lines of every rank for failure reports. Lines are
//! buffered and flushed by the writer whenever its queue runs empty, so `tail -f` sees a
//! line as soon as the controller has nothing else to do (well within a second).

use super::clock;
use crate::rundir::line_files::append_lines;
use shardrun_protocol::messages::{LogLevel, LogLine};
use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// How many recent lines per rank a failure report quotes.
pub const RECENT_LINES: usize = 20;

/// Where a line came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// A `Reporter::log` call on the worker.
    Reported(LogLevel),
    /// Raw stdout / stderr of the worker process.
    Stdout,
    Stderr,
}

pub struct LogBook {
    merged: BufWriter<File>,
    logs_dir: PathBuf,
    per_rank: HashMap<u64, BufWriter<File>>,
    recent: HashMap<u64, VecDeque<String>>,
    /// The last timestamp formatted (many lines share a millisecond under load).
    stamp: (i64, String),
    /// The first write that failed since the last flush: told by [`LogBook::flush`], so
    /// that a full disk does not also silence the console and the failure reports.
    failed: Option<std::io::Error>,
}

impl LogBook {
    pub fn open(train_log: &Path, logs_dir: &Path) -> std::io::Result<LogBook> {
        std::fs::create_dir_all(logs_dir)?;
        Ok(LogBook {
            merged: BufWriter::new(append_lines(train_log)?),
            logs_dir: logs_dir.to_path_buf(),
            per_rank: HashMap::new(),
            recent: HashMap::new(),
            stamp: (-1, String::new()),
            failed: None,
        })
    }

    /// Writes one line of `rank` (or of the launcher when `rank` is `None`) and returns the
    /// text as it appears after the rank prefix, for the console, whether or not the files
    /// took it (a failed write is kept for [`LogBook::flush`]).
    pub fn rank_line(
        &mut self,
        rank: Option<u64>,
        source: Source,
        time: f64,
        text: &str,
    ) -> String {
        let tag = match source {
            Source::Reported(LogLevel::Info) => "",
            Source::Reported(LogLevel::Debug) => "debug: ",
            Source::Reported(LogLevel::Warn) => "warning: ",
            Source::Reported(LogLevel::Error) => "error: ",
            Source::Stdout => "(stdout) ",
            Source::Stderr => "(stderr) ",
        };
        let body = format!("{tag}{text}");
        let millis = (time * 1000.0).round() as i64;
        if self.stamp.0 != millis {
            self.stamp = (millis, clock::format_utc(time));
        }
        let written = self.write_line(rank, &body);
        if let Err(e) = written {
            self.failed.get_or_insert(e);
        }
        if let Some(rank) = rank {
            let recent = self.recent.entry(rank).or_default();
            // Reuse the oldest line's buffer: no allocation per line once full.
            let mut slot = if recent.len() == RECENT_LINES {
                recent.pop_front().unwrap_or_default()
            } else {
                String::new()
            };
            slot.clear();
            slot.push_str(&body);
            recent.push_back(slot);
        }
        body
    }

    fn write_line(&mut self, rank: Option<u64>, body: &str) -> std::io::Result<()> {
        let stamp = &self.stamp.1;
        match rank {
            Some(rank) => {
                writeln!(self.merged, "{stamp} [rank {rank}] {body}")?;
                let file = match self.per_rank.get_mut(&rank) {
                    Some(f) => f,
                    None => {
                        let f = BufWriter::new(append_lines(
                            &self.logs_dir.join(format!("rank-{rank}.log")),
                        )?);
                        self.per_rank.entry(rank).or_insert(f)
                    }
                };
                writeln!(file, "{stamp} {body}")
            }
            None => writeln!(self.merged, "{stamp} [launcher] {body}"),
        }
    }

    pub fn controller_line(&mut self, text: &str) -> std::io::Result<()> {
        writeln!(
            self.merged,
            "{} [controller] {text}",
            clock::format_utc(clock::now())
        )
    }

    pub fn recent(&self, rank: u64) -> Vec<String> {
        self.recent
            .get(&rank)
            .map(|r| r.iter().cloned().collect())
            .unwrap_or_default()
    }

    pub fn flush(&mut self) -> std::io::Result<()> {
        if let Some(failed) = self.failed.take() {
            return Err(failed);
        }
        self.merged.flush()?;
        for f in self.per_rank.values_mut() {
            f.flush()?;
        }
        Ok(())
    }
}

/// A line as reported (levels come with the message).
pub fn reported(line: &LogLine) -> (Source, f64, &str) {
    (Source::Reported(line.level), line.time, &line.text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merged_and_per_rank_files_with_recent_lines() {
        let dir = tempfile::tempdir().unwrap();
        let mut book =
            LogBook::open(&dir.path().join("train.log"), &dir.path().join("logs")).unwrap();
        for i in 0..25 {
            book.rank_line(
                Some(1),
                Source::Reported(LogLevel::Info),
                0.0,
                &format!("line {i}"),
            );
        }
        book.rank_line(Some(0), Source::Stderr, 0.0, "panicked");
        book.controller_line("hello").unwrap();
        book.flush().unwrap();
        let merged = std::fs::read_to_string(dir.path().join("train.log")).unwrap();
        assert!(merged.starts_with("1970-01-01 00:00:00.000 [rank 1] line 0\n"));
        assert!(merged.contains("[rank 0] (stderr) panicked\n"));
        assert!(merged.contains("[controller] hello\n"));
        let rank1 = std::fs::read_to_string(dir.path().join("logs/rank-1.log")).unwrap();
        assert_eq!(rank1.lines().count(), 25);
        let recent = book.recent(1);
        assert_eq!((recent.len(), recent[0].as_str()), (RECENT_LINES, "line 5"));
    }

    /// A disk that takes nothing (`/dev/full` answers every write with ENOSPC): each line is
    /// still returned for the console and kept for failure reports; the flush tells.
    #[test]
    fn a_full_disk_loses_no_line_for_the_console_and_is_told_at_the_flush() {
        let dir = tempfile::tempdir().unwrap();
        let mut book = LogBook::open(Path::new("/dev/full"), dir.path()).unwrap();
        // More than a buffer's worth, so that writes fail before the flush.
        let long = "x".repeat(4096);
        for _ in 0..4 {
            let body = book.rank_line(None, Source::Stdout, 0.0, &long);
            assert_eq!(body, format!("(stdout) {long}"));
        }
        let body = book.rank_line(Some(2), Source::Reported(LogLevel::Warn), 0.0, "low");
        assert_eq!(body, "warning: low");
        assert_eq!(book.recent(2), ["warning: low"]);
        let err = book.flush().unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");
    }
}
