//! `metrics.jsonl`: one JSON object per line, as the workers sent them: a [`StepMetrics`]
//! per logged step and an [`EvalMetrics`] per evaluation (told apart by their fields).

use serde::Serialize;
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::Path;

pub struct MetricsLog {
    file: BufWriter<File>,
}

impl MetricsLog {
    pub fn open(path: &Path) -> std::io::Result<MetricsLog> {
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        Ok(MetricsLog {
            file: BufWriter::new(file),
        })
    }

    pub fn record<T: Serialize>(&mut self, m: &T) -> std::io::Result<()> {
        serde_json::to_writer(&mut self.file, m)?;
        self.file.write_all(b"\n")
    }

    pub fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }
}
