//! Reading back what `shardrun plot` drew: the SVG's panel frames, curves, dots and texts,
//! and a PNG's pixels, so tests check the picture itself rather than the program's word.
//!
//! Panels are the rectangles stroked in the frame colour ([`FRAME`]); axes and tick marks
//! share that colour and grid lines have their own ([`MESH`]): every other polyline and
//! every circle is something drawn from the data (curves, markers, dots, legend samples).

use std::collections::BTreeMap;

/// `shardrun plot`'s panel frames and axes (`charts::canvas::FRAME_COLOR`).
pub const FRAME: &str = "#555555";
/// Its grid lines (`charts::canvas::MESH_COLOR`).
pub const MESH: &str = "#E4E4E4";
/// The border of its legend boxes (`charts::canvas::LEGEND_BORDER`).
pub const LEGEND: &str = "#999999";

#[derive(Debug, Clone, PartialEq)]
pub struct Rect {
    pub x: f64,
    pub y: f64,
    pub width: f64,
    pub height: f64,
}

impl Rect {
    /// Whether (x, y) is inside, edges included with `slack` pixels of rounding.
    pub fn contains(&self, (x, y): (f64, f64), slack: f64) -> bool {
        x >= self.x - slack
            && x <= self.x + self.width + slack
            && y >= self.y - slack
            && y <= self.y + self.height + slack
    }
}

/// A polyline or circle drawn from the data.
#[derive(Debug, Clone, PartialEq)]
pub struct Mark {
    pub stroke: String,
    pub points: Vec<(f64, f64)>,
    pub circle: bool,
}

#[derive(Debug, Default)]
pub struct Svg {
    pub width: f64,
    pub height: f64,
    pub frames: Vec<Rect>,
    pub marks: Vec<Mark>,
    pub texts: Vec<String>,
    /// Each text with where it is anchored (its `x` and `y`), in the order of `texts`.
    pub placed: Vec<(String, (f64, f64))>,
    pub legends: Vec<Rect>,
}

fn attr<'a>(tag: &'a str, name: &str) -> Option<&'a str> {
    let key = format!(" {name}=\"");
    let start = tag.find(&key)? + key.len();
    let end = tag[start..].find('"')? + start;
    Some(&tag[start..end])
}

fn number(tag: &str, name: &str) -> f64 {
    attr(tag, name)
        .and_then(|v| v.parse().ok())
        .unwrap_or(f64::NAN)
}

/// Parses the SVG plotters writes (one element per tag, texts on their own line).
pub fn read_svg(text: &str) -> Svg {
    let mut svg = Svg::default();
    let mut rest = text;
    while let Some(open) = rest.find('<') {
        rest = &rest[open..];
        let Some(close) = rest.find('>') else { break };
        let tag = &rest[..=close];
        let name: String = tag[1..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric())
            .collect();
        let stroke = attr(tag, "stroke").unwrap_or("none").to_ascii_uppercase();
        match name.as_str() {
            "svg" => {
                svg.width = number(tag, "width");
                svg.height = number(tag, "height");
            }
            "rect"
                if (stroke == FRAME || stroke == LEGEND) && attr(tag, "fill") == Some("none") =>
            {
                let rect = Rect {
                    x: number(tag, "x"),
                    y: number(tag, "y"),
                    width: number(tag, "width"),
                    height: number(tag, "height"),
                };
                match stroke == FRAME {
                    true => svg.frames.push(rect),
                    false => svg.legends.push(rect),
                }
            }
            "polyline" if stroke != FRAME && stroke != MESH => {
                let points = attr(tag, "points")
                    .unwrap_or("")
                    .split_whitespace()
                    .filter_map(|p| {
                        let (x, y) = p.split_once(',')?;
                        Some((x.parse().ok()?, y.parse().ok()?))
                    })
                    .collect();
                svg.marks.push(Mark {
                    stroke,
                    points,
                    circle: false,
                });
            }
            "circle" => {
                let color = if stroke == "NONE" {
                    attr(tag, "fill").unwrap_or("").to_ascii_uppercase()
                } else {
                    stroke
                };
                svg.marks.push(Mark {
                    stroke: color,
                    points: vec![(number(tag, "cx"), number(tag, "cy"))],
                    circle: true,
                });
            }
            "text" => {
                let body = &rest[close + 1..];
                let end = body.find("</text>").unwrap_or(body.len());
                let text = unescape(body[..end].trim());
                svg.placed
                    .push((text.clone(), (number(tag, "x"), number(tag, "y"))));
                svg.texts.push(text);
            }
            _ => {}
        }
        rest = &rest[close + 1..];
    }
    svg
}

fn unescape(s: &str) -> String {
    s.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&apos;", "'")
        .replace("&amp;", "&")
}

impl Svg {
    /// The marks (by colour) not entirely inside a single frame: must be none.
    pub fn marks_outside_frames(&self) -> Vec<&Mark> {
        self.marks
            .iter()
            .filter(|m| {
                !self
                    .frames
                    .iter()
                    .any(|f| m.points.iter().all(|p| f.contains(*p, 1.0)))
            })
            .collect()
    }

    /// The frame holding the mark, if one holds all of it.
    pub fn frame_of(&self, mark: &Mark) -> Option<usize> {
        self.frames
            .iter()
            .position(|f| mark.points.iter().all(|p| f.contains(*p, 1.0)))
    }

    /// Vertical lines of `color` running a frame's full height (event markers), as
    /// (frame index, x).
    pub fn full_height_lines(&self, color: &str) -> Vec<(usize, f64)> {
        self.marks
            .iter()
            .filter(|m| !m.circle && m.stroke == color && m.points.len() == 2)
            .filter(|m| (m.points[0].0 - m.points[1].0).abs() < 0.5)
            .filter_map(|m| {
                let i = self.frame_of(m)?;
                let f = &self.frames[i];
                let (top, bottom) = (
                    m.points[0].1.min(m.points[1].1),
                    m.points[0].1.max(m.points[1].1),
                );
                ((top - f.y).abs() <= 1.5 && (bottom - f.y - f.height).abs() <= 1.5)
                    .then_some((i, m.points[0].0))
            })
            .collect()
    }

    /// How many marks of each colour, curves and circles apart.
    pub fn colour_counts(&self) -> BTreeMap<(String, bool), usize> {
        let mut counts = BTreeMap::new();
        for m in &self.marks {
            *counts.entry((m.stroke.clone(), m.circle)).or_insert(0) += 1;
        }
        counts
    }

    pub fn has_text(&self, text: &str) -> bool {
        self.texts.iter().any(|t| t == text)
    }
}

/// A PNG's size and its pixels as RGB.
pub struct Png {
    pub width: u32,
    pub height: u32,
    pub rgb: Vec<[u8; 3]>,
}

pub fn read_png(bytes: &[u8]) -> anyhow::Result<Png> {
    let mut decoder = png::Decoder::new(std::io::Cursor::new(bytes));
    decoder.set_transformations(png::Transformations::EXPAND | png::Transformations::STRIP_16);
    let mut reader = decoder.read_info()?;
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf)?;
    let channels = info.color_type.samples();
    let rgb = buf[..info.buffer_size()]
        .chunks(channels)
        .map(|p| match channels {
            1 | 2 => [p[0], p[0], p[0]],
            _ => [p[0], p[1], p[2]],
        })
        .collect();
    Ok(Png {
        width: info.width,
        height: info.height,
        rgb,
    })
}

impl Png {
    /// Pixels of exactly this colour.
    pub fn count(&self, color: [u8; 3]) -> usize {
        self.rgb.iter().filter(|p| **p == color).count()
    }
}

/// `#2CA02C` → [0x2c, 0xa0, 0x2c].
pub fn rgb(hex: &str) -> [u8; 3] {
    let v = u32::from_str_radix(hex.trim_start_matches('#'), 16).unwrap_or(0);
    [(v >> 16) as u8, (v >> 8) as u8, v as u8]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_what_plotters_writes() {
        let svg = r##"<svg width="100" height="50" viewBox="0 0 100 50" xmlns="http://www.w3.org/2000/svg">
<rect x="10" y="10" width="80" height="30" opacity="1" fill="none" stroke="#555555"/>
<polyline fill="none" opacity="1" stroke="#1F77B4" stroke-width="2" points="10,20 50,39 90,10 "/>
<polyline fill="none" opacity="1" stroke="#1F77B4" stroke-width="2" points="10,20 50,45 "/>
<polyline fill="none" opacity="1" stroke="#555555" stroke-width="1" points="10,40 10,45 "/>
<circle cx="20" cy="20" r="4" opacity="1" fill="#D62728" stroke="none" stroke-width="1"/>
<text x="1" y="2" dy="0.76em" text-anchor="start" font-family="sans-serif" font-size="10" opacity="1" fill="#000000">
a &amp; b
</text>
</svg>"##;
        let parsed = read_svg(svg);
        assert_eq!((parsed.width, parsed.height), (100.0, 50.0));
        assert_eq!(parsed.frames.len(), 1);
        assert_eq!(parsed.marks.len(), 3, "axes are not marks");
        assert_eq!(parsed.marks_outside_frames().len(), 1);
        assert_eq!(parsed.marks_outside_frames()[0].points[1], (50.0, 45.0));
        assert!(parsed.has_text("a & b"));
        assert_eq!(
            parsed.colour_counts().get(&("#D62728".into(), true)),
            Some(&1)
        );
    }
}
