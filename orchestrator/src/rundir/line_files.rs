//! The run directory's files of lines (`train.log`, `metrics.jsonl`, `events.jsonl`, the
//! ranks' logs), opened to append to by each attempt of the run.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;

/// Opens the file at `path` to append lines to (created if missing). A last line cut short
/// (a controller killed mid-write, a full disk) is ended first, so that the next record
/// starts a line of its own instead of running into the broken one, where neither would read.
pub fn append_lines(path: &Path) -> std::io::Result<File> {
    let mut file = OpenOptions::new()
        .create(true)
        .read(true)
        .append(true)
        .open(path)?;
    let len = file.metadata()?.len();
    if len > 0 {
        let mut last = [0u8];
        file.seek(SeekFrom::Start(len - 1))?;
        file.read_exact(&mut last)?;
        if last[0] != b'\n' {
            file.write_all(b"\n")?;
        }
    }
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_cut_short_is_ended_before_the_next_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.jsonl");
        std::fs::write(&path, "{\"step\": 1}\n{\"step").unwrap();
        writeln!(append_lines(&path).unwrap(), "{{\"resumed_at_step\": 2}}").unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(
            text, "{\"step\": 1}\n{\"step\n{\"resumed_at_step\": 2}\n",
            "{text}"
        );
        // Whole lines are left as they are; a new file starts empty.
        writeln!(append_lines(&path).unwrap(), "{{\"step\": 3}}").unwrap();
        assert!(std::fs::read_to_string(&path)
            .unwrap()
            .ends_with("2}\n{\"step\": 3}\n"));
        let fresh = dir.path().join("new.log");
        append_lines(&fresh).unwrap();
        assert_eq!(std::fs::read(&fresh).unwrap(), b"");
    }
}
