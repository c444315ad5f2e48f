//! Find where a dotted field path is written in block-style YAML, so errors found after
//! parsing (an impossible batch split, a bad time limit) still point at a line and column.

/// 1-based (line, column) of the key `path` (`training.total_batch_size`), or of its
/// deepest written ancestor when the key itself is absent (it got a default).
pub fn locate_path(source: &str, path: &str) -> Option<(usize, usize)> {
    let target: Vec<&str> = path.split('.').filter(|s| !s.is_empty()).collect();
    let mut stack: Vec<(usize, &str)> = Vec::new();
    let mut best: Option<(usize, (usize, usize))> = None;
    for (number, raw) in source.lines().enumerate() {
        let line = raw.split(" #").next().unwrap_or(raw);
        let trimmed = line.trim_start();
        if trimmed.is_empty() || trimmed.starts_with('#') || trimmed.starts_with("---") {
            continue;
        }
        let mut indent = line.len() - trimmed.len();
        let mut body = trimmed;
        // A list item's mapping keys sit two columns to the right of the dash.
        while let Some(rest) = body.strip_prefix("- ") {
            indent += 2;
            body = rest;
        }
        let Some((key, _)) = body.split_once(':') else {
            continue;
        };
        let key = key.trim().trim_matches(|c| c == '"' || c == '\'');
        if key.is_empty() || key.contains(' ') {
            continue;
        }
        while stack.last().is_some_and(|(i, _)| *i >= indent) {
            stack.pop();
        }
        stack.push((indent, key));
        let depth = stack.len();
        let matches_prefix =
            depth <= target.len() && stack.iter().zip(&target).all(|((_, k), t)| k == t);
        if matches_prefix && best.is_none_or(|(d, _)| depth > d) {
            best = Some((depth, (number + 1, indent + 1)));
            if depth == target.len() {
                break;
            }
        }
    }
    best.map(|(_, at)| at)
}

#[cfg(test)]
mod tests {
    use super::locate_path;

    const YAML: &str = "name: x\ntraining:\n  # comment\n  steps: 3\n  optimizer:\n    lr: 0.1\nresources:\n  nodes: 2\n";

    #[test]
    fn finds_nested_keys() {
        assert_eq!(locate_path(YAML, "training.optimizer.lr"), Some((6, 5)));
        assert_eq!(locate_path(YAML, "resources.nodes"), Some((8, 3)));
        assert_eq!(locate_path(YAML, "name"), Some((1, 1)));
    }

    #[test]
    fn falls_back_to_the_deepest_written_parent() {
        assert_eq!(locate_path(YAML, "training.optimizer.eps"), Some((5, 3)));
        assert_eq!(locate_path(YAML, "preemption.requeue"), None);
    }
}
