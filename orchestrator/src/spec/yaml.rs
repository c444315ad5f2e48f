//! The spec's YAML text as a tree that remembers where every key and value was written
//! (saphyr's marked nodes), so errors found while reading the spec, or later by the plan,
//! point at a line and column.
//!
//! A spec is one YAML document. Anchors and aliases are read as YAML defines them (an alias
//! is a copy of the anchored value); merge keys (`<<`), which YAML 1.2 does not define, and
//! tags other than YAML's own (`!!str`) are refused where they are written, as is a second
//! document, rather than silently read in some other way.

use saphyr::{AnnotatedMapping, LoadableYamlNode, MarkedYaml, ScalarStyle, YamlData, YamlLoader};
use saphyr_parser::{Event, Marker, Parser, ScanError, Span, SpannedEventReceiver};

/// Where something is written: 1-based line and column (in characters), and how many
/// characters of that line it covers (at least 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Location {
    pub line: u32,
    pub column: u32,
    pub width: u32,
}

impl Location {
    /// The start of the text, for what has no better place.
    const START: Location = Location {
        line: 1,
        column: 1,
        width: 1,
    };

    /// Nodes made up rather than read (an empty file's root) have no location.
    pub(crate) fn of(span: &Span) -> Option<Location> {
        if span.start.line() == 0 {
            return None;
        }
        let width = if span.end.line() == span.start.line() {
            span.end.col().saturating_sub(span.start.col())
        } else {
            1
        };
        Some(Location {
            line: span.start.line() as u32,
            column: span.start.col() as u32 + 1,
            width: width.max(1) as u32,
        })
    }

    fn at(marker: Marker) -> Location {
        Location {
            line: marker.line() as u32,
            column: marker.col() as u32 + 1,
            width: 1,
        }
    }
}

/// Text that is not one YAML document a spec can be read from, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Malformed {
    pub at: Location,
    pub why: String,
    pub fix: String,
}

/// One parsed spec text.
pub struct SpannedDocument<'a> {
    root: MarkedYaml<'a>,
}

/// saphyr's loader, plus where each document starts (the loader keeps only the documents).
struct Loader<'a> {
    nodes: YamlLoader<'a, MarkedYaml<'a>>,
    document_starts: Vec<Span>,
}

impl<'a> SpannedEventReceiver<'a> for Loader<'a> {
    fn on_event(&mut self, event: Event<'a>, span: Span) {
        if matches!(event, Event::DocumentStart(_)) {
            self.document_starts.push(span);
        }
        self.nodes.on_event(event, span);
    }
}

impl<'a> SpannedDocument<'a> {
    pub fn parse(source: &'a str) -> Result<SpannedDocument<'a>, Malformed> {
        let mut nodes = YamlLoader::default();
        // Scalars stay as written: a string field gets `0x10` or `1.0e-3` verbatim, and only a
        // field that asks for a number, a boolean or any value reads them as one.
        nodes.early_parse(false);
        let mut loader = Loader {
            nodes,
            document_starts: Vec::new(),
        };
        Parser::new_from_str(source)
            .load(&mut loader, true)
            .map_err(|e| not_yaml(source, &e))?;
        if let Some(e) = loader.nodes.error() {
            return Err(not_yaml(source, e));
        }
        let starts = loader.document_starts;
        let mut documents = loader.nodes.into_documents();
        if documents.len() > 1 {
            let at = starts
                .get(1)
                .and_then(Location::of)
                .or_else(|| Location::of(&documents[1].span))
                .unwrap_or(Location::START);
            return Err(Malformed {
                at,
                why: "a second YAML document starts here; a job spec is one document".into(),
                fix: "remove this `---` and what follows it, or move that part to a spec file of its own".into(),
            });
        }
        let root = documents.pop().unwrap_or_else(|| {
            MarkedYaml::from_bare_yaml(saphyr::Yaml::Mapping(Default::default()))
        });
        refuse_unsupported(&root, 0)?;
        Ok(SpannedDocument { root })
    }

    pub(crate) fn root(&self) -> &MarkedYaml<'a> {
        &self.root
    }

    /// The key of `path`, or of its deepest written ancestor when the key itself is absent
    /// (its value is a default).
    pub fn key_location(&self, path: &[Step]) -> Option<Location> {
        walk(&self.root, path).key
    }

    /// The value at `path` when all of it is written.
    pub fn value_location(&self, path: &[Step]) -> Option<Location> {
        let found = walk(&self.root, path);
        found.value.and_then(|node| Location::of(&node.span))
    }

    /// Every key written inside the value at `path`, at any depth, with the path of the
    /// mapping holding it.
    pub(crate) fn entries_within(&self, path: &[Step]) -> Vec<Entry<'_, 'a>> {
        let mut entries = Vec::new();
        if let Some(node) = walk(&self.root, path).value {
            collect_entries(node, path.to_vec(), &mut entries);
        }
        entries
    }
}

/// A key written in the document and its value.
pub(crate) struct Entry<'n, 'a> {
    /// The path of the mapping that holds the key.
    pub parent: Vec<Step>,
    pub key: &'n str,
    pub key_at: Option<Location>,
    pub value: &'n MarkedYaml<'a>,
}

impl Entry<'_, '_> {
    pub fn value_at(&self) -> Option<Location> {
        Location::of(&self.value.span)
    }

    /// The path of the key itself.
    pub fn path(&self) -> Vec<Step> {
        let mut path = self.parent.clone();
        path.push(Step::Key(self.key.to_string()));
        path
    }
}

fn collect_entries<'n, 'a>(
    node: &'n MarkedYaml<'a>,
    path: Vec<Step>,
    out: &mut Vec<Entry<'n, 'a>>,
) {
    match &node.data {
        YamlData::Mapping(map) => {
            for (k, v) in map.iter() {
                let Some(key) = scalar_text(k) else { continue };
                let mut inner = path.clone();
                inner.push(Step::Key(key.to_string()));
                collect_entries(v, inner, out);
                out.push(Entry {
                    parent: path.clone(),
                    key,
                    key_at: Location::of(&k.span),
                    value: v,
                });
            }
        }
        YamlData::Sequence(items) => {
            for (i, item) in items.iter().enumerate() {
                let mut inner = path.clone();
                inner.push(Step::Index(i));
                collect_entries(item, inner, out);
            }
        }
        _ => {}
    }
}

/// 1-based (line, column, width) of the dotted field `path` (`training.total_batch_size`,
/// `resources.setup[0]`) in a spec's text: its key, or that of its deepest written ancestor
/// when the field got a default. `None` when nothing of it is written.
pub fn locate_path(source: &str, path: &str) -> Option<Location> {
    SpannedDocument::parse(source)
        .ok()?
        .key_location(&steps(path))
}

/// The key at `path` (dotted) when the text writes all of it, not only a section above it.
pub fn locate_written_key(source: &str, path: &str) -> Option<Location> {
    let document = SpannedDocument::parse(source).ok()?;
    let steps = steps(path);
    document.value_location(&steps)?;
    document.key_location(&steps)
}

/// One step of a path into the tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    Key(String),
    Index(usize),
}

/// `training.data.files[0]` → `training`, `data`, `files`, `[0]`.
fn steps(path: &str) -> Vec<Step> {
    let mut out = Vec::new();
    for part in path.split('.').filter(|p| !p.is_empty()) {
        let (key, mut indices) = match part.find('[') {
            Some(i) => (&part[..i], &part[i..]),
            None => (part, ""),
        };
        if !key.is_empty() {
            out.push(Step::Key(key.to_string()));
        }
        while let Some(rest) = indices.strip_prefix('[') {
            let Some((index, tail)) = rest.split_once(']') else {
                break;
            };
            match index.parse() {
                Ok(i) => out.push(Step::Index(i)),
                Err(_) => out.push(Step::Key(index.to_string())),
            }
            indices = tail;
        }
    }
    out
}

struct Found<'n, 'a> {
    /// The deepest key of the path that is written.
    key: Option<Location>,
    /// The value at the whole path, when all of it is written.
    value: Option<&'n MarkedYaml<'a>>,
}

fn walk<'n, 'a>(root: &'n MarkedYaml<'a>, path: &[Step]) -> Found<'n, 'a> {
    let mut node = root;
    let mut key = None;
    let mut rest = path;
    while !rest.is_empty() {
        let next = match (&node.data, &rest[0]) {
            (YamlData::Mapping(map), Step::Key(_)) => entry(map, rest),
            (YamlData::Sequence(items), Step::Index(i)) => items
                .get(*i)
                .map(|item| (Location::of(&item.span), item, 1)),
            _ => None,
        };
        let Some((at, value, used)) = next else {
            return Found { key, value: None };
        };
        key = at.or(key);
        node = value;
        rest = &rest[used..];
    }
    Found {
        key,
        value: Some(node),
    }
}

/// The entry of `map` named by the first keys of `path`: the longest run of them joined by
/// dots that is a key (sweep keys such as `training.optimizer.lr` are single keys), with how
/// many steps it used.
fn entry<'n, 'a>(
    map: &'n AnnotatedMapping<'a, MarkedYaml<'a>>,
    path: &[Step],
) -> Option<(Option<Location>, &'n MarkedYaml<'a>, usize)> {
    let keys: Vec<&str> = path
        .iter()
        .map_while(|s| match s {
            Step::Key(k) => Some(k.as_str()),
            Step::Index(_) => None,
        })
        .collect();
    (1..=keys.len()).rev().find_map(|n| {
        let wanted = keys[..n].join(".");
        map.iter()
            .find(|(k, _)| scalar_text(k) == Some(wanted.as_str()))
            .map(|(k, v)| (Location::of(&k.span), v, n))
    })
}

/// The text of a scalar node as written (without quotes).
fn scalar_text<'n>(node: &'n MarkedYaml<'_>) -> Option<&'n str> {
    match &node.data {
        YamlData::Representation(text, _, _) => Some(text),
        _ => None,
    }
}

fn not_yaml(source: &str, e: &ScanError) -> Malformed {
    let at = Location::at(*e.marker());
    match e.info() {
        // saphyr reports a repeated key as a scan error; it gets its own fix.
        "duplicated key in mapping" => Malformed {
            at,
            why: format!("not valid YAML: {}", e.info()),
            fix: "keep only one of the two keys".into(),
        },
        // Found where the next line starts; the key without its `:` is above.
        "simple key expect ':'" => Malformed {
            at: key_without_colon(source, at).unwrap_or(at),
            why: "not valid YAML: a key without `:` (YAML read on to the next line for it)".into(),
            fix: "write `key: value`, with a `:` and a space after the key".into(),
        },
        // Found where the plain value before the tab starts; the tab is after it.
        "while scanning a plain scalar, found a tab" => Malformed {
            at: first_tab(source, at).unwrap_or(at),
            why: "not valid YAML: a tab in the indentation".into(),
            fix: "indent with spaces only".into(),
        },
        "while parsing node, found unknown anchor" => {
            let name = alias_at(source, at).unwrap_or_default();
            // `files: *.bin`: a glob pattern, not an alias.
            if name.is_empty() || name.contains(['.', '/', '*', '?', '[']) {
                return Malformed {
                    at,
                    why: format!(
                        "not valid YAML: `*{name}` reads as an alias (YAML's `*name`), not as \
                         the pattern it looks like"
                    ),
                    fix: format!("quote the pattern: `\"*{name}\"`"),
                };
            }
            Malformed {
                at: Location {
                    width: name.chars().count() as u32 + 1,
                    ..at
                },
                why: format!("not valid YAML: the alias `*{name}` names no anchor above it"),
                fix: format!(
                    "define it before it is used (`key: &{name} value`), or write the value here"
                ),
            }
        }
        // A tab where YAML wants a space (after a `:`, before a `#`) reads as spaces in
        // the quoted line: say it is there.
        info if tab_before(source, at) => Malformed {
            at,
            why: format!("not valid YAML: {info}"),
            fix: "this line holds a tab (shown as spaces above): YAML separates with spaces \
                  only, replace it with a space"
                .into(),
        },
        info => Malformed {
            at,
            why: format!("not valid YAML: {info}"),
            fix: "check indentation (spaces only) and quoting around this position".into(),
        },
    }
}

/// The line where the key ended by `at` starts: the nearest line above that holds text and
/// is indented no deeper than `at` (a value can run on over deeper-indented lines).
fn key_without_colon(source: &str, at: Location) -> Option<Location> {
    let lines: Vec<&str> = source.lines().collect();
    let above = lines.get(..(at.line as usize).checked_sub(1)?)?;
    above.iter().enumerate().rev().find_map(|(i, line)| {
        let text = line.trim_start_matches(' ');
        let indent = line.chars().count() - text.chars().count();
        let holds_text = !text.trim().is_empty() && !text.starts_with('#');
        (holds_text && indent < at.column as usize).then(|| Location {
            line: i as u32 + 1,
            column: indent as u32 + 1,
            width: text.trim_end().chars().count().max(1) as u32,
        })
    })
}

/// The name of the alias (`*name`) written at `at`.
fn alias_at(source: &str, at: Location) -> Option<String> {
    let rest = line_from(source, at)?;
    let name = rest.strip_prefix('*')?;
    Some(
        name.chars()
            .take_while(|c| !c.is_whitespace() && !matches!(c, ',' | ']' | '}'))
            .collect(),
    )
}

/// The text of `at`'s line from `at` on.
pub fn line_from(source: &str, at: Location) -> Option<String> {
    let line = source.lines().nth((at.line as usize).checked_sub(1)?)?;
    Some(
        line.chars()
            .skip((at.column as usize).saturating_sub(1))
            .collect(),
    )
}

/// Whether the blank run just before `at` on its line holds a tab: the separator YAML
/// refused (a tab inside quotes or a comment elsewhere on the line is not it).
fn tab_before(source: &str, at: Location) -> bool {
    let Some(line) = source.lines().nth(at.line.saturating_sub(1) as usize) else {
        return false;
    };
    let before: Vec<char> = line
        .chars()
        .take(at.column.saturating_sub(1) as usize)
        .collect();
    before
        .iter()
        .rev()
        .take_while(|c| c.is_whitespace())
        .any(|&c| c == '\t')
}

/// The first tab at or after `at`.
fn first_tab(source: &str, at: Location) -> Option<Location> {
    source
        .lines()
        .enumerate()
        .skip(at.line.checked_sub(1)? as usize)
        .find_map(|(i, line)| {
            let skip = if i + 1 == at.line as usize {
                at.column as usize - 1
            } else {
                0
            };
            let column = line.chars().skip(skip).position(|c| c == '\t')? + skip;
            Some(Location {
                line: i as u32 + 1,
                column: column as u32 + 1,
                width: 1,
            })
        })
}

/// Sections and lists nested deeper than a spec needs are refused before anything walks
/// them recursively.
const MAX_DEPTH: usize = 128;

/// Merge keys, foreign tags and runaway nesting, refused where they are written.
fn refuse_unsupported(node: &MarkedYaml<'_>, depth: usize) -> Result<(), Malformed> {
    let here = || Location::of(&node.span).unwrap_or(Location::START);
    if depth > MAX_DEPTH {
        return Err(Malformed {
            at: here(),
            why: format!("sections and lists are nested more than {MAX_DEPTH} deep here"),
            fix: "a job spec needs only a few levels; check the indentation and brackets".into(),
        });
    }
    match &node.data {
        YamlData::Mapping(map) => {
            for (key, value) in map {
                if let YamlData::Representation(text, ScalarStyle::Plain, None) = &key.data {
                    if text == "<<" {
                        return Err(Malformed {
                            at: Location::of(&key.span).unwrap_or_else(here),
                            why: "merge keys (`<<`) are not part of YAML 1.2 and not read in a job spec".into(),
                            fix: "write the keys out here; an alias (`*name`) can stand for a whole value".into(),
                        });
                    }
                }
                refuse_unsupported(key, depth + 1)?;
                refuse_unsupported(value, depth + 1)?;
            }
            Ok(())
        }
        YamlData::Sequence(items) => items
            .iter()
            .try_for_each(|item| refuse_unsupported(item, depth + 1)),
        YamlData::Representation(_, _, Some(tag)) if !tag.is_yaml_core_schema() => {
            Err(foreign_tag(&tag.to_string(), here()))
        }
        YamlData::Tagged(tag, _) => Err(foreign_tag(&tag.to_string(), here())),
        _ => Ok(()),
    }
}

fn foreign_tag(tag: &str, at: Location) -> Malformed {
    Malformed {
        at,
        why: format!("the YAML tag `{tag}` has no meaning in a job spec"),
        fix: "remove the tag; write the value as it is".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const YAML: &str = "name: x\ntraining:\n  # comment\n  steps: 3\n  optimizer:\n    lr: 0.1\nresources:\n  nodes: 2\n";

    fn at(line: u32, column: u32, width: u32) -> Option<Location> {
        Some(Location {
            line,
            column,
            width,
        })
    }

    /// saphyr finds these past the mistake; the error points at the mistake itself.
    #[test]
    fn a_key_without_colon_and_a_tab_are_shown_where_they_are_written() {
        let missing = "training:\n  steps: 3\n  total_batch_size 8\n\n  # why\n  lr: 1\n";
        let err = SpannedDocument::parse(missing).err().unwrap();
        assert_eq!(Some(err.at), at(3, 3, 18), "{err:?}");
        assert!(err.fix.contains("`key: value`"), "{err:?}");
        // A value that runs on over deeper lines started above them.
        let deeper = "a: 1\nb 2\n  c 3\nd: 4\n";
        let err = SpannedDocument::parse(deeper).err().unwrap();
        assert_eq!(Some(err.at), at(2, 1, 3), "{err:?}");
        let glob = SpannedDocument::parse("files: *.bin\n").err().unwrap();
        assert_eq!(glob.fix, "quote the pattern: `\"*.bin\"`", "{glob:?}");
        // A tab elsewhere on the line (in quotes) is not the error's.
        let quoted = SpannedDocument::parse("env: {A: \"x\ty\", B: [1, 2}\n")
            .err()
            .unwrap();
        assert!(!quoted.fix.contains("tab"), "{quoted:?}");
        let after_colon = SpannedDocument::parse("name: ft\nsteps:\t20\n")
            .err()
            .unwrap();
        assert!(
            after_colon
                .fix
                .starts_with("this line holds a tab (shown as spaces above)"),
            "{after_colon:?}"
        );
        let tab = "name: ft\n\ttraining: {}\n";
        let err = SpannedDocument::parse(tab).err().unwrap();
        assert_eq!(Some(err.at), at(2, 1, 1), "{err:?}");
        assert!(err.why.contains("tab"), "{err:?}");
    }

    #[test]
    fn finds_nested_keys() {
        assert_eq!(locate_path(YAML, "training.optimizer.lr"), at(6, 5, 2));
        assert_eq!(locate_path(YAML, "resources.nodes"), at(8, 3, 5));
        assert_eq!(locate_path(YAML, "name"), at(1, 1, 4));
    }

    #[test]
    fn falls_back_to_the_deepest_written_parent() {
        assert_eq!(locate_path(YAML, "training.optimizer.eps"), at(5, 3, 9));
        assert_eq!(locate_path(YAML, "preemption.requeue"), None);
    }

    #[test]
    fn finds_keys_inside_flow_maps() {
        let yaml = "training:\n  fsdp: {strategy: FULL_SHARD, prefetch: true}\n";
        assert_eq!(locate_path(yaml, "training.fsdp.prefetch"), at(2, 32, 8));
        assert_eq!(locate_path(yaml, "training.fsdp.wrap"), at(2, 3, 4));
    }

    #[test]
    fn a_hash_inside_quotes_is_not_a_comment() {
        let yaml = "name: \"run #1\"\nresources: {partition: 'gpu #2', time: \"1:00\"}\n";
        assert_eq!(locate_path(yaml, "resources.time"), at(2, 34, 4));
    }

    #[test]
    fn sequence_items_and_dotted_keys() {
        let yaml = "resources:\n  setup:\n    - module load cuda\n    - echo hi\nsweep:\n  grid:\n    training.optimizer.lr: [1, 2]\n";
        assert_eq!(locate_path(yaml, "resources.setup[1]"), at(4, 7, 7));
        assert_eq!(
            locate_path(yaml, "sweep.grid.training.optimizer.lr"),
            at(7, 5, 21)
        );
    }

    #[test]
    fn one_document_only() {
        let err = SpannedDocument::parse("name: a\n---\nname: b\n")
            .err()
            .unwrap();
        assert_eq!(err.at.line, 2);
        let err = SpannedDocument::parse("---\nname: a\n---\nname: b\n")
            .err()
            .unwrap();
        assert_eq!(err.at.line, 3);
        assert!(SpannedDocument::parse("---\nname: a\n").is_ok());
        assert!(SpannedDocument::parse("name: a\n...\n").is_ok());
    }

    #[test]
    fn merge_keys_and_foreign_tags_are_refused_where_written() {
        let err = SpannedDocument::parse("a: &d {x: 1}\nb:\n  <<: *d\n")
            .err()
            .unwrap();
        assert_eq!(
            err.at,
            Location {
                line: 3,
                column: 3,
                width: 2
            }
        );
        let err = SpannedDocument::parse("a: !thing 1\n").err().unwrap();
        assert_eq!(err.at.line, 1);
        assert!(err.why.contains("`!thing`"), "{}", err.why);
        assert!(SpannedDocument::parse("a: !!str 1\n").is_ok());
    }

    #[test]
    fn runaway_nesting_is_refused() {
        let deep = format!("a: {}{}\n", "[".repeat(200), "]".repeat(200));
        let err = SpannedDocument::parse(&deep).err().unwrap();
        assert!(err.why.contains("nested more than 128 deep"), "{}", err.why);
        let fine = format!("a: {}{}\n", "[".repeat(20), "]".repeat(20));
        assert!(SpannedDocument::parse(&fine).is_ok());
    }
}
