//! `metrics.jsonl`: one [`StepMetrics`] JSON object per line, as the workers sent them.

use shardrun_protocol::messages::StepMetrics;
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

    pub fn record(&mut self, m: &StepMetrics) -> std::io::Result<()> {
        serde_json::to_writer(&mut self.file, m)?;
        self.file.write_all(b"\n")
    }

    pub fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }
}
