//! How the points of a sweep are told apart by the values the sweep gave them, alike in the
//! `status` and `metrics` tables and in `plot`'s legends: each parameter under the shortest
//! part of its dotted path no other parameter ends with, and all values of a parameter in
//! the one notation that keeps them shortest (`1e-3, 3e-4` rather than `0.001, 0.0003`).

use serde_json::Value;
use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::path::Path;

/// How the `status` and `metrics` tables mark a run left in a sweep folder from an earlier
/// version of its spec (its values may equal a current point's), and the line that says so.
pub fn marked_superseded(name: &str) -> String {
    format!("{name} *")
}
pub const SUPERSEDED_NOTE: &str = "* left from an earlier version of the sweep's spec: not a point of the spec `shardrun sweep` last submitted";

/// A point's parameters: dotted path → value, as its manifest records them.
pub type PointParams = BTreeMap<String, Value>;

/// The parameters shown for a set of points, in path order.
#[derive(Debug, Clone, PartialEq)]
pub struct ParamColumns {
    columns: Vec<Column>,
}

#[derive(Debug, Clone, PartialEq)]
struct Column {
    key: String,
    name: String,
    scientific: bool,
}

impl ParamColumns {
    /// Every parameter any of `points` was given: a table's columns.
    pub fn given<'a>(points: impl IntoIterator<Item = &'a PointParams>) -> ParamColumns {
        Self::given_alongside(points, &[])
    }

    /// The parameters whose values differ between `points`: a legend's, where a value every
    /// curve shares tells none apart.
    pub fn varying<'a>(points: impl IntoIterator<Item = &'a PointParams>) -> ParamColumns {
        let points: Vec<&PointParams> = points.into_iter().collect();
        let mut keys: Vec<&String> = points.iter().flat_map(|p| p.keys()).collect();
        keys.sort();
        keys.dedup();
        keys.retain(|k| {
            let first = points.first().and_then(|p| p.get(*k));
            points.iter().any(|p| p.get(*k) != first)
        });
        Self::of(keys, &points)
    }

    /// [`Self::given`], each parameter in the notation that also fits `siblings` (the other
    /// points of the listed points' sweeps): one point of a sweep reads `lr=1e-2` in a table
    /// of its own as in the sweep's.
    pub fn given_alongside<'a>(
        points: impl IntoIterator<Item = &'a PointParams>,
        siblings: &'a [PointParams],
    ) -> ParamColumns {
        let points: Vec<&PointParams> = points.into_iter().collect();
        let mut keys: Vec<&String> = points.iter().flat_map(|p| p.keys()).collect();
        keys.sort();
        keys.dedup();
        let all: Vec<&PointParams> = points.into_iter().chain(siblings).collect();
        Self::of(keys, &all)
    }

    /// The parameters `point` was given, each in the notation the tables of its whole
    /// sweep (`siblings`: the other points) write it in: `lr=3e-2` beside `3e-3`, where the
    /// point alone would read `lr=0.03`.
    pub fn of_point<'a>(
        point: &'a PointParams,
        siblings: impl IntoIterator<Item = &'a PointParams>,
    ) -> ParamColumns {
        let points: Vec<&PointParams> = siblings.into_iter().chain([point]).collect();
        Self::of(point.keys().collect(), &points)
    }

    fn of(keys: Vec<&String>, points: &[&PointParams]) -> ParamColumns {
        let names = short_names(&keys);
        let columns = keys
            .into_iter()
            .zip(names)
            .map(|(key, name)| {
                let values = || points.iter().filter_map(|p| p.get(key));
                let widest = |text: fn(&Value) -> String| values().map(|v| text(v).len()).max();
                Column {
                    key: key.clone(),
                    name,
                    scientific: widest(scientific_text) < widest(plain_text),
                }
            })
            .collect();
        ParamColumns { columns }
    }

    pub fn len(&self) -> usize {
        self.columns.len()
    }

    pub fn is_empty(&self) -> bool {
        self.columns.is_empty()
    }

    /// The parameters' dotted paths.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.columns.iter().map(|c| c.key.as_str())
    }

    /// The parameters' short names: column headers.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.columns.iter().map(|c| c.name.as_str())
    }

    /// The short name of the parameter at `key` (the path itself if it is not shown).
    pub fn name<'a>(&'a self, key: &'a str) -> &'a str {
        self.column(key).map_or(key, |c| c.name.as_str())
    }

    /// Each parameter's value for `params`, `None` where the point was not given it.
    pub fn cells(&self, params: &PointParams) -> Vec<Option<String>> {
        self.columns
            .iter()
            .map(|c| params.get(&c.key).map(|v| c.text(v)))
            .collect()
    }

    /// `lr=1e-3, seed=1`: the values the point was given (a point of a sweep that sets a
    /// parameter in some points only is named without it).
    pub fn label(&self, params: &PointParams) -> String {
        self.columns
            .iter()
            .filter_map(|c| {
                params
                    .get(&c.key)
                    .map(|v| format!("{}={}", c.name, c.text(v)))
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// `value` of the parameter at `key`, in that parameter's notation.
    pub fn text(&self, key: &str, value: &Value) -> String {
        match self.column(key) {
            Some(c) => c.text(value),
            None => plain_text(value),
        }
    }

    /// The order of two points by their values, parameter by parameter in column order.
    pub fn order(&self, a: &PointParams, b: &PointParams) -> Ordering {
        self.columns
            .iter()
            .map(|c| compare(a.get(&c.key), b.get(&c.key)))
            .find(|o| o.is_ne())
            .unwrap_or(Ordering::Equal)
    }

    /// `items` as a table lists them: the points of each sweep folder (consecutive items in
    /// one folder) in the order of their values, since their folder names are hashes; runs
    /// outside a sweep keep their place.
    pub fn sort<T>(
        &self,
        items: &mut [T],
        path: impl Fn(&T) -> &Path,
        params: impl Fn(&T) -> &PointParams,
    ) {
        for folder in items.chunk_by_mut(|a, b| path(a).parent() == path(b).parent()) {
            folder.sort_by(|a, b| self.order(params(a), params(b)));
        }
    }

    fn column(&self, key: &str) -> Option<&Column> {
        self.columns.iter().find(|c| c.key == key)
    }
}

impl Column {
    fn text(&self, value: &Value) -> String {
        if self.scientific {
            scientific_text(value)
        } else {
            plain_text(value)
        }
    }
}

/// The values a sweep gave the current points of the sweep folders of `listed` (sweep
/// points' run directories) that are not among them: what a table or title of some of a
/// sweep's points takes its notation from ([`ParamColumns::given_alongside`]). A folder whose
/// every run is listed is not read again.
pub fn unlisted_siblings<'a>(listed: impl IntoIterator<Item = &'a Path>) -> Vec<PointParams> {
    // A set: a table lists thousands of a sweep's points, and each of its runs is looked up.
    let listed: std::collections::HashSet<std::path::PathBuf> = listed
        .into_iter()
        .filter_map(|p| std::path::absolute(p).ok())
        .collect();
    let mut folders: Vec<&Path> = listed.iter().filter_map(|p| p.parent()).collect();
    folders.sort();
    folders.dedup();
    let mut current = super::journal::CurrentPoints::default();
    let mut siblings = Vec::new();
    for folder in folders {
        let runs_here = std::fs::read_dir(folder)
            .map(|entries| {
                entries
                    .flatten()
                    .filter(|e| e.path().join("manifest.json").is_file())
                    .count()
            })
            .unwrap_or(0);
        let listed_here = listed.iter().filter(|p| p.parent() == Some(folder)).count();
        if runs_here <= listed_here {
            continue;
        }
        siblings.extend(
            crate::slurm::find_runs(folder)
                .iter()
                .filter(|run| !listed.contains(run.path()))
                .filter(|run| !current.superseded(run.path()))
                .filter_map(|run| run.read_manifest().ok())
                .map(|manifest| manifest.sweep_params)
                .filter(|params| !params.is_empty()),
        );
    }
    siblings
}

/// For each dotted path, its shortest tail of whole parts that no other path ends with:
/// `lr`, or `model.dropout` beside `data.dropout`.
fn short_names(keys: &[&String]) -> Vec<String> {
    let tail = |key: &str, parts: usize| -> String {
        let all: Vec<&str> = key.split('.').collect();
        all[all.len().saturating_sub(parts)..].join(".")
    };
    keys.iter()
        .map(|key| {
            let parts = key.split('.').count();
            (1..parts)
                .map(|n| tail(key, n))
                .find(|short| {
                    keys.iter()
                        .filter(|other| other != &key)
                        .all(|other| tail(other, short.split('.').count()) != *short)
                })
                .unwrap_or_else(|| key.to_string())
        })
        .collect()
}

/// A value as a spec writes it: numbers as JSON has them, except that a whole number
/// written with a fraction loses it (`0`, not `0.0`), strings without quotes.
fn plain_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Number(n) => match n.as_f64() {
            Some(f) if n.is_f64() && f.fract() == 0.0 && f.abs() < 1e15 => format!("{f}"),
            _ => n.to_string(),
        },
        other => other.to_string(),
    }
}

/// Fractional numbers as `3e-4`; whole numbers and anything else as [`plain_text`].
fn scientific_text(v: &Value) -> String {
    match v.as_f64() {
        Some(f) if v.is_f64() => format!("{f:e}"),
        _ => plain_text(v),
    }
}

/// The order points are listed in by one parameter: numbers by value, anything else by its
/// text; a point without the parameter first.
fn compare(a: Option<&Value>, b: Option<&Value>) -> Ordering {
    match (a.and_then(Value::as_f64), b.and_then(Value::as_f64)) {
        (Some(x), Some(y)) => x.total_cmp(&y),
        _ => a.map(plain_text).cmp(&b.map(plain_text)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn params(pairs: &[(&str, Value)]) -> PointParams {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect()
    }

    #[test]
    fn names_are_the_shortest_tails_no_other_path_ends_with() {
        let point = params(&[
            ("model.dropout", json!(0.1)),
            ("data.dropout", json!(0.0)),
            ("training.optimizer.lr", json!(1e-3)),
            ("lr", json!(1)),
            ("training.batch_size_per_device", json!(8)),
        ]);
        let columns = ParamColumns::given([&point]);
        assert_eq!(
            columns.names().collect::<Vec<_>>(),
            [
                "data.dropout",
                "lr",
                "model.dropout",
                "batch_size_per_device",
                "optimizer.lr"
            ]
        );
    }

    #[test]
    fn each_parameter_keeps_the_notation_that_writes_its_values_shortest() {
        let points: Vec<PointParams> = [(1e-3, 0.0, 0), (3e-4, 0.1, 1), (1e-2, 0.1, 2)]
            .into_iter()
            .map(|(lr, wd, seed)| {
                params(&[
                    ("training.optimizer.lr", json!(lr)),
                    ("training.optimizer.weight_decay", json!(wd)),
                    ("training.seed", json!(seed)),
                    ("name", json!("a")),
                ])
            })
            .collect();
        let columns = ParamColumns::given(&points);
        assert_eq!(
            columns.cells(&points[1]),
            [
                Some("a".to_string()),
                Some("3e-4".into()),
                Some("0.1".into()),
                Some("1".into())
            ]
        );
        assert_eq!(
            columns.label(&points[0]),
            "name=a, lr=1e-3, weight_decay=0, seed=0"
        );
        assert_eq!(columns.cells(&PointParams::new()), [None, None, None, None]);
        assert_eq!(
            columns.label(&params(&[("training.seed", json!(2))])),
            "seed=2"
        );
    }

    /// One point of a sweep listed alone (`shardrun status <point>`) is written as the
    /// sweep's table writes it, its siblings read from its folder: `1e-2`, not `0.01`.
    #[test]
    fn one_point_listed_alone_keeps_its_sweeps_notation() {
        let sweep = tempfile::tempdir().unwrap();
        let point = |name: &str, lr: f64| {
            let dir = sweep.path().join(name);
            std::fs::create_dir(&dir).unwrap();
            let manifest = json!({"version": 1, "name": name, "state": "COMPLETED",
                "config_hash": "h", "created_at": 0, "updated_at": 0,
                "sweep_params": {"training.optimizer.lr": lr}});
            std::fs::write(dir.join("manifest.json"), manifest.to_string()).unwrap();
            std::fs::write(dir.join("job.yaml"), "name: s\n").unwrap();
            (dir, params(&[("training.optimizer.lr", json!(lr))]))
        };
        let (one, its_params) = point("s-1", 1e-2);
        point("s-2", 3e-3);
        point("s-3", 1e-3);
        let alone = ParamColumns::given([&its_params]);
        assert_eq!(alone.cells(&its_params), [Some("0.01".to_string())]);
        let siblings = unlisted_siblings([one.as_path()]);
        assert_eq!(siblings.len(), 2, "{siblings:?}");
        let columns = ParamColumns::given_alongside([&its_params], &siblings);
        assert_eq!(columns.cells(&its_params), [Some("1e-2".to_string())]);
        assert_eq!(columns.len(), 1, "the siblings add no column");
    }

    #[test]
    fn a_legend_names_only_what_differs_between_points() {
        let a = params(&[
            ("training.optimizer.lr", json!(0.5)),
            ("training.steps", json!(5)),
        ]);
        let b = params(&[
            ("training.optimizer.lr", json!(0.25)),
            ("training.steps", json!(5)),
        ]);
        let columns = ParamColumns::varying([&a, &b]);
        assert_eq!(
            columns.keys().collect::<Vec<_>>(),
            ["training.optimizer.lr"]
        );
        assert_eq!(columns.label(&b), "lr=0.25");
        assert_eq!(columns.text("training.steps", &json!(5)), "5");
    }

    #[test]
    fn points_are_listed_by_value() {
        let mut values = vec![json!(1e-3), json!(2e-4), json!(1e-2)];
        values.sort_by(|a, b| compare(Some(a), Some(b)));
        assert_eq!(values, [json!(2e-4), json!(1e-3), json!(1e-2)]);
        assert_eq!(
            compare(Some(&json!("a")), Some(&json!("b"))),
            Ordering::Less
        );
        assert_eq!(compare(None, Some(&json!(0))), Ordering::Less);
    }

    #[test]
    fn a_table_lists_each_sweeps_points_by_value_and_other_runs_in_place() {
        let run = |path: &str, lr: Option<f64>| {
            let params = match lr {
                Some(lr) => params(&[("training.optimizer.lr", json!(lr))]),
                None => PointParams::new(),
            };
            (std::path::PathBuf::from(path), params)
        };
        let mut runs = vec![
            run("runs/alpha", None),
            run("runs/sweep/s-07", Some(1e-2)),
            run("runs/sweep/s-3a", Some(1e-4)),
            run("runs/sweep/s-c1", Some(1e-3)),
            run("runs/zeta", None),
        ];
        let columns = ParamColumns::given(runs.iter().map(|(_, p)| p));
        columns.sort(&mut runs, |(path, _)| path, |(_, p)| p);
        let order: Vec<&str> = runs.iter().map(|(p, _)| p.to_str().unwrap()).collect();
        assert_eq!(
            order,
            [
                "runs/alpha",
                "runs/sweep/s-3a",
                "runs/sweep/s-c1",
                "runs/sweep/s-07",
                "runs/zeta"
            ]
        );
    }
}
