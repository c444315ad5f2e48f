//! Records of a file that holds one JSON array of them (`[{...}, {...}]`), as Hugging Face
//! `datasets` reads a `.json` file that is not JSON Lines (Alpaca's `alpaca_data.json`,
//! ShareGPT dumps): each element's text and the line it starts on, one at a time, so memory
//! holds a record, not the file. Only the array's structure is followed here (strings,
//! nesting, commas); each element is parsed as a record is.

use std::io::{self, BufRead};

/// Where the reader is in the array.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// After `[`: a record or `]`.
    Opened,
    /// After a `,`: a record.
    Comma,
    /// After a record: `,` or `]`.
    Record,
    /// After `]`: white space only.
    Closed,
}

/// One step through the array.
#[derive(Debug, PartialEq, Eq)]
pub enum Element {
    /// An element's text (white space around it left out) and the line it starts on.
    Record { text: Vec<u8>, line: u64 },
    /// The array and the file have ended.
    End,
    /// The file does not go on as a JSON array: why, and on which line. Nothing after it
    /// can be told apart.
    Broken { why: String, line: u64 },
}

pub struct ArrayRecords {
    state: State,
    /// Line of the next byte (1-based).
    line: u64,
    /// Bytes consumed so far, the opening `[` and what came before it included.
    pub consumed: u64,
}

impl ArrayRecords {
    /// The array of `reader` when its first text (after a byte-order mark and white space) is
    /// `[`, which is then consumed; `None` otherwise (JSON Lines), with nothing consumed.
    pub fn open(reader: &mut impl BufRead, bom: &[u8]) -> io::Result<Option<ArrayRecords>> {
        let start = reader.fill_buf()?;
        let skip_bom = if start.starts_with(bom) { bom.len() } else { 0 };
        let Some(at) = start[skip_bom..]
            .iter()
            .position(|b| !b.is_ascii_whitespace())
            .map(|at| at + skip_bom)
        else {
            return Ok(None);
        };
        if start[at] != b'[' {
            return Ok(None);
        }
        let line = 1 + start[..at].iter().filter(|&&b| b == b'\n').count() as u64;
        reader.consume(at + 1);
        Ok(Some(ArrayRecords {
            state: State::Opened,
            line,
            consumed: at as u64 + 1,
        }))
    }

    /// The next element of the array.
    pub fn next(&mut self, reader: &mut impl BufRead) -> io::Result<Element> {
        loop {
            let Some(byte) = reader.fill_buf()?.first().copied() else {
                return Ok(match self.state {
                    State::Closed => Element::End,
                    _ => Element::Broken {
                        why: "the file ends before the JSON array's closing `]`: it is cut short"
                            .into(),
                        line: self.line,
                    },
                });
            };
            let broken = |why: String| Element::Broken {
                why,
                line: self.line,
            };
            match (self.state, byte) {
                (_, b' ' | b'\t' | b'\r' | b'\n') => {}
                (State::Opened | State::Record, b']') => self.state = State::Closed,
                (State::Record, b',') => self.state = State::Comma,
                (State::Opened | State::Comma, b']' | b',') => {
                    return Ok(broken(format!(
                        "`{}` where a record of the JSON array was expected (a comma too many?)",
                        byte as char
                    )))
                }
                (State::Opened | State::Comma, _) => return self.record(reader),
                (State::Record, _) => {
                    return Ok(broken(format!(
                        "{} after a record of the JSON array, where `,` or `]` was expected \
                         (a comma missing?)",
                        shown(byte)
                    )))
                }
                (State::Closed, _) => {
                    return Ok(broken(format!(
                        "{} after the JSON array's closing `]`: a file holds one array of records",
                        shown(byte)
                    )))
                }
            }
            if byte == b'\n' {
                self.line += 1;
            }
            reader.consume(1);
            self.consumed += 1;
        }
    }

    /// The element starting at the reader: up to its closing bracket, or (a bare value) up to
    /// the `,` or `]` after it.
    fn record(&mut self, reader: &mut impl BufRead) -> io::Result<Element> {
        let line = self.line;
        let mut text = Vec::new();
        let (mut depth, mut in_string, mut escaped) = (0u64, false, false);
        loop {
            let buf = reader.fill_buf()?;
            if buf.is_empty() {
                return Ok(Element::Broken {
                    why: "the file ends inside this record of the JSON array: it is cut short"
                        .into(),
                    line,
                });
            }
            // Where the element ends in `buf`, and whether that byte is its own.
            let mut end = None;
            for (i, &b) in buf.iter().enumerate() {
                if b == b'\n' {
                    self.line += 1;
                }
                if in_string {
                    match (escaped, b) {
                        (true, _) => escaped = false,
                        (false, b'\\') => escaped = true,
                        (false, b'"') => in_string = false,
                        _ => {}
                    }
                    continue;
                }
                match b {
                    b'"' => in_string = true,
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' if depth > 1 => depth -= 1,
                    b'}' | b']' if depth == 1 => {
                        end = Some(i + 1);
                        break;
                    }
                    b'}' | b']' | b',' if depth == 0 => {
                        end = Some(i);
                        break;
                    }
                    _ => {}
                }
            }
            let taken = end.unwrap_or(buf.len());
            text.extend_from_slice(&buf[..taken]);
            reader.consume(taken);
            self.consumed += taken as u64;
            if end.is_some() {
                self.state = State::Record;
                let trimmed = text.trim_ascii_end().len();
                text.truncate(trimmed);
                return Ok(Element::Record { text, line });
            }
        }
    }
}

/// A byte as an error names it.
fn shown(byte: u8) -> String {
    if byte.is_ascii_graphic() {
        format!("`{}`", byte as char)
    } else {
        format!("byte 0x{byte:02x}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOM: &[u8] = b"\xef\xbb\xbf";

    /// Every element of `text` read through a buffer of `capacity` bytes (elements cross
    /// buffer ends), or `None` when it is not an array.
    fn elements(text: &[u8], capacity: usize) -> Option<Vec<Element>> {
        let mut reader = io::BufReader::with_capacity(capacity, text);
        let mut array = ArrayRecords::open(&mut reader, BOM).unwrap()?;
        let mut out = Vec::new();
        loop {
            let next = array.next(&mut reader).unwrap();
            let last = !matches!(next, Element::Record { .. });
            out.push(next);
            if last {
                if out.last() == Some(&Element::End) {
                    assert_eq!(array.consumed, text.len() as u64);
                }
                return Some(out);
            }
        }
    }

    fn record(text: &str, line: u64) -> Element {
        Element::Record {
            text: text.as_bytes().to_vec(),
            line,
        }
    }

    #[test]
    fn elements_come_with_the_line_they_start_on() {
        let text = "\u{feff}\n[\n  {\"a\": \"x, ] } \\\" {\"},\n  {\"b\": [1, {\"c\": 2}]\n  }, 3 ,\"s\"\n]\n";
        for capacity in [8, 1 << 10] {
            assert_eq!(
                elements(text.as_bytes(), capacity).unwrap(),
                [
                    record("{\"a\": \"x, ] } \\\" {\"}", 3),
                    record("{\"b\": [1, {\"c\": 2}]\n  }", 4),
                    record("3", 5),
                    record("\"s\"", 5),
                    Element::End,
                ],
                "{capacity}"
            );
        }
        assert_eq!(elements(b" [ ] ", 8).unwrap(), [Element::End]);
    }

    #[test]
    fn json_lines_are_not_an_array() {
        assert!(elements(b"{\"a\": [1]}\n{\"a\": [2]}\n", 8).is_none());
        assert!(elements(b"", 8).is_none());
        assert!(elements(b" \n ", 8).is_none());
    }

    #[test]
    fn what_is_not_an_array_of_records_is_said_where() {
        let broken = |text: &str| match elements(text.as_bytes(), 4).unwrap().pop().unwrap() {
            Element::Broken { why, line } => (why, line),
            other => panic!("{other:?}"),
        };
        let (why, line) = broken("[\n{\"a\": 1},\n{\"a\": 2");
        assert_eq!(line, 3);
        assert!(why.starts_with("the file ends inside this record"), "{why}");
        let (why, line) = broken("[\n{\"a\": 1}\n");
        assert_eq!(line, 3);
        assert!(
            why.starts_with("the file ends before the JSON array's closing `]`"),
            "{why}"
        );
        let (why, line) = broken("[{\"a\": 1}\n{\"a\": 2}]");
        assert_eq!(line, 2);
        assert!(
            why.starts_with("`{` after a record of the JSON array"),
            "{why}"
        );
        let (why, _) = broken("[{\"a\": 1},]");
        assert!(
            why.starts_with("`]` where a record of the JSON array was expected"),
            "{why}"
        );
        let (why, line) = broken("[{\"a\": 1}]\n[{\"a\": 2}]\n");
        assert_eq!(line, 2);
        assert!(why.contains("after the JSON array's closing `]`"), "{why}");
    }
}
