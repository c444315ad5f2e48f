//! Sweeps: a spec's `sweep:` section expanded into points, each a complete job keyed by a
//! stable hash of its resolved parameters. Re-running a sweep compares these keys with the
//! run directories already there, so only new, changed or failed points are submitted.

pub mod carried;
pub mod journal;
pub mod labels;
pub mod point_dirs;
pub mod split;
pub mod submit;
pub mod survey;

use crate::resolve::{self, Overrides, ResolveError, ResolvedJob};
use crate::sbatch::shell_quote;
use crate::spec::overrides::within;
use crate::spec::read::{read, ReadError};
use crate::spec::{JobSpec, LoadedSpec, SpecError, SpecErrorKind, SweepSpec};
use serde::{Deserialize, Serialize};
use serde_norway::Value;
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, HashSet};

/// One point of a sweep: the parameters it sets and the job they resolve to.
#[derive(Debug, Clone)]
pub struct SweepPoint {
    /// Dotted path → value, as written in the sweep (as JSON for the manifest).
    pub params: BTreeMap<String, serde_json::Value>,
    /// Stable key of the resolved point (hex): same parameters, same key, on any machine.
    pub key: String,
    /// `<name>-<key>`: run directory name and Slurm-visible job name of the point.
    pub name: String,
    pub job: ResolvedJob,
}

#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    #[error("{0}")]
    Spec(#[from] SpecError),
    /// The point's own error is part of the message, not a separate cause: printed as a
    /// chain it would appear twice.
    #[error("sweep point {label}:\n{error}")]
    Point {
        label: String,
        error: Box<ResolveError>,
    },
    /// Several points cannot run: every distinct error once, so one pass fixes them all.
    #[error("{}", impossible_points(*total, failures))]
    Points {
        /// The points the sweep writes out.
        total: usize,
        /// Each failing point's label and error, in the sweep's order.
        failures: Vec<(String, ResolveError)>,
    },
}

/// How many distinct errors [`SweepError::Points`] shows; fixing them shows the rest.
const ERRORS_SHOWN: usize = 6;

fn impossible_points(total: usize, failures: &[(String, ResolveError)]) -> String {
    // Points that fail at one place for one reason (a swept value every combination of the
    // others holds) say it once.
    let mut distinct: Vec<(String, &str, usize)> = Vec::new();
    for (label, error) in failures {
        let text = error.to_string();
        match distinct.iter_mut().find(|(t, _, _)| *t == text) {
            Some((_, _, n)) => *n += 1,
            None => distinct.push((text, label, 1)),
        }
    }
    let mut out = format!(
        "{} of the sweep's {total} points cannot run, for {} reason(s):",
        failures.len(),
        distinct.len()
    );
    for (text, label, n) in distinct.iter().take(ERRORS_SHOWN) {
        let others = match n - 1 {
            0 => String::new(),
            more => format!(" (and {more} more point(s) for the same reason)"),
        };
        out.push_str(&format!(
            "\n\nsweep point {label}{others}:\n{}",
            text.trim_end()
        ));
    }
    if distinct.len() > ERRORS_SHOWN {
        out.push_str(&format!(
            "\n\nand {} more reason(s), shown once these are fixed",
            distinct.len() - ERRORS_SHOWN
        ));
    }
    out
}

/// Length of the hex key in run directory names (64 bits: collisions are not a concern
/// for sweeps of any practical size).
const KEY_LEN: usize = 16;

/// Expand the spec's sweep into resolved points, in a stable order (list entries, then the
/// grid in key order), each resolved with `overrides` (`force`: points whose peak memory
/// exceeds the GPU's are planned anyway). A spec without `sweep:` is an error: use
/// `shardrun submit`.
pub fn expand(loaded: &LoadedSpec, overrides: &Overrides) -> Result<Vec<SweepPoint>, SweepError> {
    let Some(sweep) = loaded.spec.sweep.clone() else {
        return Err(loaded.error_at("sweep", "this spec has no `sweep:` section", "add `sweep: { grid: { training.optimizer.lr: [1.0e-3, 3.0e-4] } }`, or submit it as one job with `shardrun submit`").into());
    };
    if sweep.grid.is_empty() && sweep.list.is_empty() {
        return Err(loaded
            .error_at(
                "sweep",
                "the sweep has no points: its `grid` and `list` are empty or absent",
                "add `grid:` (every combination) or `list:` (explicit points)",
            )
            .into());
    }
    if let Some((path, _)) = sweep.grid.iter().find(|(_, values)| values.is_empty()) {
        return Err(loaded
            .error_at(
                &format!("sweep.grid.{path}"),
                format!("`{path}` has no values"),
                "give at least one value, or remove the entry",
            )
            .into());
    }
    for (path, values) in &sweep.grid {
        // The same value twice is the same point twice (`1` and `1.0` too).
        let same = |a: &Value, b: &Value| a == b || (a.is_number() && a.as_f64() == b.as_f64());
        let repeated = (0..values.len()).find(|&j| (0..j).any(|i| same(&values[i], &values[j])));
        if let Some(j) = repeated {
            // Every entry of that value, counted from 1 as people count a list.
            let entries: Vec<String> = (0..values.len())
                .filter(|&i| same(&values[i], &values[j]))
                .map(|i| ordinal(i + 1))
                .collect();
            let times = match entries.len() {
                2 => "twice".to_string(),
                n => format!("{n} times"),
            };
            return Err(loaded
                .error_at(
                    &format!("sweep.grid.{path}"),
                    format!(
                        "`{path}` lists {} {times} (its {} entries): the grid would run the \
                         same point {times}",
                        serde_json::to_string(&values[j]).unwrap_or_default(),
                        crate::output::listed(&entries, "and")
                    ),
                    "list each value once",
                )
                .into());
        }
    }
    if sweep.throttle == Some(0) {
        return Err(loaded
            .error_at(
                "sweep.throttle",
                "a throttle of 0 would never run a task",
                "use 1 or more, or remove it",
            )
            .into());
    }
    if let Some(limits) = &sweep.limits {
        for (key, value) in [
            ("max_array_size", limits.max_array_size),
            ("max_queued", limits.max_queued),
        ] {
            if value == Some(0) {
                return Err(loaded
                    .error_at(
                        &format!("sweep.limits.{key}"),
                        format!("a {key} of 0 would never submit a point"),
                        "use 1 or more, or remove it to use the cluster's own limit",
                    )
                    .into());
            }
        }
    }
    // A path swept in two places (or one path inside another) would keep one value silently:
    // the grid's replaces a list entry's, and `a.b` replaces what `a` set of it.
    let overlap = |a: &str, b: &str| {
        a == b || a.starts_with(&format!("{b}.")) || b.starts_with(&format!("{a}."))
    };
    let grid_keys: Vec<&String> = sweep.grid.keys().collect();
    for (i, a) in grid_keys.iter().enumerate() {
        if let Some(b) = grid_keys[i + 1..].iter().find(|b| overlap(a, b)) {
            return Err(loaded
                .error_at(
                    &format!("sweep.grid.{b}"),
                    format!("`{b}` and `{a}` both sweep `{}`", a.min(b)),
                    "sweep each setting under one key",
                )
                .into());
        }
    }
    for (i, entry) in sweep.list.iter().enumerate() {
        let keys: Vec<&String> = entry.keys().collect();
        for (j, key) in keys.iter().enumerate() {
            let other = grid_keys
                .iter()
                .map(|g| (*g, "the grid"))
                .chain(keys[j + 1..].iter().map(|k| (*k, "the same entry")))
                .find(|(other, _)| overlap(key, other));
            if let Some((other, place)) = other {
                return Err(loaded
                    .error_at(
                        &format!("sweep.list[{i}].{key}"),
                        format!(
                            "`{key}` of list entry {i} is also swept by `{other}` of {place}, \
                             whose values would replace it"
                        ),
                        "sweep each setting in one place: in the grid, or in every list entry",
                    )
                    .into());
            }
        }
    }
    // A `--set` whose value at a swept path every point's value would replace changes
    // nothing there: the key itself, a key inside it, or a section whose value holds it.
    let replaced = |set: &crate::spec::Override, key: &str| {
        if !set.covers(key) {
            return false;
        }
        // A section around the key: replaced there only where the value set holds it.
        match key.strip_prefix(&format!("{}.", set.path)) {
            Some(inside) => inside
                .split('.')
                .try_fold(&set.value, |value, part| value.get(part))
                .is_some(),
            None => true,
        }
    };
    let swept = grid_keys.iter().map(|k| (k.as_str(), true)).chain(
        sweep
            .list
            .iter()
            .flat_map(|e| e.keys().map(|k| (k.as_str(), false))),
    );
    for (key, in_grid) in swept {
        let Some(o) = loaded
            .overrides
            .iter()
            .find(|o| !o.path.starts_with("sweep.") && replaced(o, key))
        else {
            continue;
        };
        let other_values = if in_grid {
            format!("set the sweep's: `--set 'sweep.grid.{key}=[...]'`")
        } else {
            "change them in the spec's `sweep.list` entries".to_string()
        };
        return Err(SpecError::from_flag(
            &o.flag(),
            o.path.clone(),
            SpecErrorKind::Invalid,
            format!(
                "`{key}` is swept: every point's value would replace the one set here, so the \
                 flag would change nothing there"
            ),
            format!(
                "to sweep other values, {other_values}; to train this value alone, `shardrun \
                 submit` the spec with `--set sweep=null`"
            ),
        )
        .into());
    }
    let mut base_spec = loaded.spec.clone();
    base_spec.sweep = None;
    let base = serde_norway::to_value(&base_spec)
        .map_err(|e| loaded.error_at("sweep", format!("cannot apply the sweep: {e}"), ""))?;

    // Check every value on its own, so a typo in a key is reported at the key, and a value
    // of the wrong type at the value, not at the first point holding it.
    let written = sweep
        .grid
        .iter()
        .flat_map(|(k, values)| {
            values.iter().enumerate().map(move |(j, v)| {
                let key_at = format!("sweep.grid.{k}");
                (format!("{key_at}[{j}]"), key_at, k, v)
            })
        })
        .chain(sweep.list.iter().enumerate().flat_map(|(i, entry)| {
            entry.iter().map(move |(k, v)| {
                let at = format!("sweep.list[{i}].{k}");
                (at.clone(), at, k, v)
            })
        }));
    for (value_at, key_at, path, value) in written {
        let mut doc = base.clone();
        apply(&mut doc, path, value.clone())
            .map_err(|why| sweep_key_error(loaded, &key_at, path, why, None))?;
        match to_spec(&doc) {
            Ok(_) => {}
            Err(e) if e.kind == SpecErrorKind::UnknownField && !within(&e.field, path) => {
                let suggestion = e.unknown.and_then(|u| u.did_you_mean());
                return Err(sweep_key_error(loaded, &key_at, path, e.why, suggestion));
            }
            Err(e) => return Err(sweep_value_error(loaded, &value_at, path, value, e)),
        }
    }

    let list: Vec<BTreeMap<String, Value>> = if sweep.list.is_empty() {
        vec![BTreeMap::new()]
    } else {
        sweep.list.clone()
    };
    let grid: Vec<(&String, &Vec<Value>)> = sweep.grid.iter().collect();
    let grid_size: usize = grid.iter().map(|(_, v)| v.len()).product();
    let mut points = Vec::with_capacity(list.len() * grid_size);
    let mut seen = HashSet::new();
    let mut lookups = resolve::Lookups::default();
    let mut failures = Vec::new();
    for (i, entry) in list.iter().enumerate() {
        for index in 0..grid_size {
            let mut params: BTreeMap<String, Value> = entry.clone();
            // Where each value is written, for an error about it.
            let mut written_at: BTreeMap<String, String> = entry
                .keys()
                .map(|k| (k.clone(), format!("sweep.list[{i}].{k}")))
                .collect();
            let mut rest = index;
            for (path, values) in grid.iter().rev() {
                let j = rest % values.len();
                params.insert((*path).clone(), values[j].clone());
                written_at.insert((*path).clone(), format!("sweep.grid.{path}[{j}]"));
                rest /= values.len();
            }
            let point = match resolve_point(
                loaded,
                &base,
                params,
                &written_at,
                (overrides, &mut lookups),
            ) {
                Ok(point) => point,
                // Every point is tried: a sweep's impossible points are told all at once.
                Err(SweepError::Point { label, error }) => {
                    failures.push((label, *error));
                    continue;
                }
                Err(e) => return Err(e),
            };
            // Two sweep entries that resolve to the same job are one point.
            if seen.insert(point.key.clone()) {
                points.push(point);
            }
        }
    }
    match failures.len() {
        0 => Ok(points),
        1 => {
            let (label, error) = failures.remove(0);
            Err(SweepError::Point {
                label,
                error: Box::new(error),
            })
        }
        _ => Err(SweepError::Points {
            total: list.len() * grid_size,
            failures,
        }),
    }
}

fn resolve_point(
    loaded: &LoadedSpec,
    base: &Value,
    params: BTreeMap<String, Value>,
    written_at: &BTreeMap<String, String>,
    (overrides, lookups): (&Overrides, &mut resolve::Lookups),
) -> Result<SweepPoint, SweepError> {
    let json_params: BTreeMap<String, serde_json::Value> = params
        .iter()
        .map(|(k, v)| {
            (
                k.clone(),
                serde_json::to_value(v).unwrap_or(serde_json::Value::Null),
            )
        })
        .collect();
    let label = json_params
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(" ");
    let overrides = Overrides {
        swept: params.keys().cloned().collect(),
        ..overrides.clone()
    };
    let mut doc = base.clone();
    for (path, value) in params {
        apply(&mut doc, &path, value)
            .map_err(|why| sweep_key_error(loaded, "sweep", &path, why, None))?;
    }
    let spec = to_spec(&doc).map_err(|e| {
        SweepError::Spec(loaded.error_at(
            "sweep",
            format!("point {label}: {}", e.why),
            "check the sweep values' types",
        ))
    })?;
    let point_spec = LoadedSpec {
        spec,
        path: loaded.path.clone(),
        base_dir: loaded.base_dir.clone(),
        source: loaded.source.clone(),
        overrides: loaded.overrides.clone(),
    };
    let mut job = resolve::resolve_with(&point_spec, &overrides, lookups).map_err(|error| {
        SweepError::Point {
            label: label.clone(),
            error: Box::new(at_swept_value(loaded, written_at, error)),
        }
    })?;
    let key = point_key(&job);
    let name = format!("{}-{key}", loaded.spec.name);
    job.name = name.clone();
    job.train.name = name.clone();
    Ok(SweepPoint {
        params: json_params,
        key,
        name,
        job,
    })
}

/// Each distinct planning warning of `points` once, in the order first met, with the points
/// it concerns.
pub fn shared_warnings<'a>(
    points: impl IntoIterator<Item = &'a SweepPoint>,
) -> Vec<(&'a str, Vec<&'a SweepPoint>)> {
    let mut shared: Vec<(&str, Vec<&SweepPoint>)> = Vec::new();
    for point in points {
        for warning in &point.job.warnings {
            match shared.iter_mut().find(|(w, _)| *w == warning.as_str()) {
                Some((_, concerned)) => concerned.push(point),
                None => shared.push((warning.as_str(), vec![point])),
            }
        }
    }
    shared
}

/// Points the sweep writes out, before two that resolve to the same job are made one.
pub fn written_points(sweep: &SweepSpec) -> usize {
    sweep.list.len().max(1) * sweep.grid.values().map(Vec::len).product::<usize>()
}

/// The values of the sweep's first point, as [`expand`] orders them.
pub fn first_point(sweep: &SweepSpec) -> BTreeMap<String, serde_json::Value> {
    let mut params = sweep.list.first().cloned().unwrap_or_default();
    for (path, values) in &sweep.grid {
        if let Some(first) = values.first() {
            params.insert(path.clone(), first.clone());
        }
    }
    params
        .into_iter()
        .map(|(k, v)| {
            (
                k,
                serde_json::to_value(v).unwrap_or(serde_json::Value::Null),
            )
        })
        .collect()
}

/// The command line that trains one point as a job of its own, from the sweep's spec
/// (`spec`, as the shell should see it):
/// the sweep turned off, the point's values given with `--set`, and a name of its own (the
/// sweep's name is its folder, which holds the points).
pub fn one_point_command(
    command: &str,
    spec: &str,
    name: &str,
    params: &BTreeMap<String, serde_json::Value>,
) -> String {
    let mut words = vec![
        format!("shardrun {command} {spec}"),
        "--set sweep=null".into(),
    ];
    for (path, value) in params {
        words.push(format!(
            "--set {}",
            shell_quote(&format!("{path}={}", yaml_value(value)))
        ));
    }
    words.push(format!("--set {}", shell_quote(&format!("name={name}"))));
    words.join(" ")
}

/// A value as `--set` reads it back: plain where YAML reads the text as the same value,
/// else JSON (which YAML reads as written).
fn yaml_value(value: &serde_json::Value) -> String {
    if let serde_json::Value::String(text) = value {
        let plain: Option<serde_json::Value> = serde_norway::from_str(text).ok();
        if plain.as_ref() == Some(value) {
            return text.clone();
        }
    }
    value.to_string()
}

/// Hash of everything that makes the point's run what it is (training config without its
/// name, Slurm resources, preemption): a changed value anywhere gives a new key.
pub fn point_key(job: &ResolvedJob) -> String {
    #[derive(Serialize)]
    struct Keyed<'a> {
        train: &'a shardrun_protocol::TrainConfig,
        slurm: &'a resolve::SlurmResources,
        preemption: &'a resolve::PreemptionPlan,
    }
    let mut train = job.train.clone();
    train.name.clear();
    // Which variables came from the shell changes how they are applied, not the run: keys
    // stay those of points made before it was recorded.
    let mut slurm = job.slurm.clone();
    slurm.from_shell.clear();
    let bytes = serde_json::to_vec(&Keyed {
        train: &train,
        slurm: &slurm,
        preemption: &job.preemption,
    })
    .unwrap_or_default();
    hex::encode(Sha256::digest(&bytes))[..KEY_LEN].to_string()
}

/// Set `a.b.c` in a YAML document (as `--set` does), except the keys points cannot vary.
fn apply(doc: &mut Value, path: &str, value: Value) -> Result<(), String> {
    if matches!(path.split('.').next(), Some("sweep" | "name")) {
        return Err(format!(
            "`{path}` cannot be swept (points get their own names)"
        ));
    }
    crate::spec::overrides::set_path(doc, path, value)
}

/// A point's document as a spec. Its values are already typed, so it is read directly; one
/// that does not read is read again from its YAML text, as a spec file is, for an error that
/// is explained the same way.
fn to_spec(doc: &Value) -> Result<JobSpec, ReadError> {
    JobSpec::deserialize(doc).or_else(|_| read(&serde_norway::to_string(doc).unwrap_or_default()))
}

/// A point's error about a field the sweep sets, moved from the spec's own line for it to
/// where the sweep writes the point's value.
fn at_swept_value(
    loaded: &LoadedSpec,
    written_at: &BTreeMap<String, String>,
    error: ResolveError,
) -> ResolveError {
    let ResolveError::Invalid(err) = &error;
    let Some((_, at)) = written_at.iter().find(|(path, _)| within(&err.field, path)) else {
        return error;
    };
    let mut moved = loaded.error_at(at, err.why.clone(), err.fix.clone());
    moved.field = err.field.clone();
    ResolveError::Invalid(moved)
}

/// A swept value the spec's key does not take, located at the value (`written_at`).
fn sweep_value_error(
    loaded: &LoadedSpec,
    written_at: &str,
    path: &str,
    value: &Value,
    e: ReadError,
) -> SweepError {
    let shown = serde_json::to_string(value).unwrap_or_default();
    let inside = match e.field.strip_prefix(path) {
        Some(rest) if !rest.is_empty() => format!(" (at `{}`)", e.field),
        _ => String::new(),
    };
    loaded
        .error_at(
            written_at,
            format!("`{path}` cannot be {shown}{inside}: {}", e.why),
            e.fix,
        )
        .into()
}

/// An error about the swept `path`, located where the sweep writes it (`written_at`).
fn sweep_key_error(
    loaded: &LoadedSpec,
    written_at: &str,
    path: &str,
    why: String,
    did_you_mean: Option<String>,
) -> SweepError {
    let mut err = loaded.error_at(
        written_at,
        format!("cannot sweep over `{path}`: {why}"),
        "use a dotted path of a spec key, e.g. `training.optimizer.lr` (docs/job-spec.md)",
    );
    // Named where the sweep writes it (`sweep.grid.<path>`, `sweep.list[1].<path>`).
    err.field = match written_at {
        "sweep" => format!("sweep.{path}"),
        at => at.to_string(),
    };
    if let Some(did_you_mean) = did_you_mean {
        err.fix = format!("`{path}` is not a key of the spec; {did_you_mean}");
    }
    err.into()
}

/// `1st`, `2nd`, `3rd`, `11th`, `22nd`.
fn ordinal(n: usize) -> String {
    let suffix = match (n % 10, n % 100) {
        (_, 11..=13) => "th",
        (1, _) => "st",
        (2, _) => "nd",
        (3, _) => "rd",
        _ => "th",
    };
    format!("{n}{suffix}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::parse;
    use std::path::Path;

    fn points(yaml: &str) -> Result<Vec<SweepPoint>, SweepError> {
        expand(
            &parse(yaml, Path::new("sweep.yaml")).unwrap(),
            &Overrides::submitting(),
        )
    }

    #[test]
    fn a_setting_swept_in_two_places_is_refused() {
        let spec = |sweep: &str| {
            format!(
                "name: s\ntraining:\n  model: {{ kind: mlp, input_dim: 4, hidden_dim: 8, output_dim: 4 }}\n  steps: 1\n  total_batch_size: 4\n  batch_size_per_device: 4\nsweep:\n{sweep}"
            )
        };
        for (sweep, said) in [
            (
                "  grid:\n    training.optimizer.lr: [1.0e-3, 1.0e-4]\n  list:\n    - { training.optimizer.lr: 0.5, training.seed: 2 }\n",
                "`training.optimizer.lr` of list entry 0 is also swept by `training.optimizer.lr` of the grid",
            ),
            (
                "  grid:\n    training.optimizer: [{ lr: 1.0e-3 }]\n    training.optimizer.lr: [1.0e-4]\n",
                "both sweep `training.optimizer`",
            ),
        ] {
            let text = spec(sweep);
            let loaded = crate::spec::parse(&text, Path::new("s.yaml")).unwrap();
            let err = expand(&loaded, &Overrides::default()).unwrap_err().to_string();
            assert!(err.contains(said), "{err}");
        }
    }

    #[test]
    fn a_set_flag_on_a_swept_path_is_refused_as_it_would_change_nothing() {
        let loaded = parse(
            include_str!("../../../examples/sweep.yaml"),
            Path::new("sweep.yaml"),
        )
        .unwrap();
        let with = |arg: &str| {
            let set = [crate::spec::overrides::parse(arg).unwrap()];
            expand(
                &crate::spec::overrides::apply(loaded.clone(), &set).unwrap(),
                &Overrides::submitting(),
            )
        };
        for arg in [
            "training.optimizer.lr=0.01",
            "training.optimizer={lr: 0.01, beta2: 0.9}",
        ] {
            let err = with(arg).unwrap_err().to_string();
            assert!(
                err.contains(&format!("--set {arg}"))
                    && err.contains("`training.optimizer.lr` is swept")
                    && err.contains("`--set 'sweep.grid.training.optimizer.lr=[...]'`"),
                "{err}"
            );
        }
        // A key swept by the list entries: changed there.
        let err = with("training.optimizer.weight_decay=0.5")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("change them in the spec's `sweep.list` entries"),
            "{err}"
        );
        // Setting the sweep's own values, a path it does not sweep, or a section around a
        // swept key without it, is what --set is for.
        let points = with("training.optimizer={beta2: 0.9}").unwrap();
        assert_eq!(points[0].job.train.optimizer.beta2, 0.9);
        assert_eq!(
            with("sweep.grid.training.optimizer.lr=[0.01]")
                .unwrap()
                .len(),
            4
        );
        assert_eq!(with("training.steps=7").unwrap()[0].job.train.steps, 7);
    }

    #[test]
    fn entries_are_counted_as_people_count_them() {
        let said: Vec<String> = [1, 2, 3, 4, 11, 12, 13, 21, 22, 103, 111]
            .into_iter()
            .map(ordinal)
            .collect();
        assert_eq!(
            said,
            [
                "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "103rd",
                "111th"
            ]
        );
        let items = |n: usize| (1..=n).map(ordinal).collect::<Vec<_>>();
        assert_eq!(crate::output::listed(&items(1), "and"), "1st");
        assert_eq!(crate::output::listed(&items(3), "and"), "1st, 2nd and 3rd");
    }

    #[test]
    fn a_grid_value_listed_twice_is_refused_at_its_entry() {
        let err = points(
            "name: s\ntraining:\n  model: { kind: mlp, input_dim: 4, hidden_dim: 8, output_dim: 4 }\n  steps: 1\n  total_batch_size: 4\n  batch_size_per_device: 4\nsweep:\n  grid:\n    training.seed: [1, 2, 1.0]\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("sweep.yaml:9:5")
                && err.contains("`training.seed` lists 1.0 twice (its 1st and 3rd entries)"),
            "{err}"
        );
        let err = points(
            "name: s\ntraining:\n  model: { kind: mlp, input_dim: 4, hidden_dim: 8, output_dim: 4 }\n  steps: 1\n  total_batch_size: 4\n  batch_size_per_device: 4\nsweep:\n  grid:\n    training.optimizer.lr: [1.0e-3, 2.0e-3, 1.0e-3, 0.001]\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains(
                "`training.optimizer.lr` lists 0.001 3 times (its 1st, 3rd and 4th entries): the \
                 grid would run the same point 3 times"
            ),
            "{err}"
        );
    }

    #[test]
    fn grid_times_list() {
        let p = points(include_str!("../../../examples/sweep.yaml")).unwrap();
        assert_eq!(p.len(), 12);
        let keys: HashSet<_> = p.iter().map(|p| p.key.clone()).collect();
        assert_eq!(keys.len(), 12);
        assert!(p
            .iter()
            .all(|p| p.name == format!("mlp-sweep-{}", p.key) && p.job.train.name == p.name));
        let lrs: HashSet<String> = p
            .iter()
            .map(|p| p.job.train.optimizer.lr.to_string())
            .collect();
        assert_eq!(lrs.len(), 3);
    }

    #[test]
    fn points_of_different_models_are_planned_each_for_its_own_model() {
        // The footprints built for one point are kept for the next: a point whose model
        // differs must still get its own memory plan, the one it gets resolved alone.
        let yaml = include_str!("../../../examples/sweep.yaml").replace(
            "training.seed: [0, 1]",
            "training.model.hidden_dim: [256, 512]\n    training.fsdp.mixed_precision.param_dtype: [f32, bf16]",
        );
        let loaded = parse(&yaml, Path::new("sweep.yaml")).unwrap();
        let p = expand(&loaded, &Overrides::submitting()).unwrap();
        assert_eq!(p.len(), 3 * 2 * 2 * 2);
        let peaks: HashSet<u64> = p.iter().map(|p| p.job.memory.chosen.peak).collect();
        assert!(peaks.len() >= 4, "{peaks:?}");
        for point in &p {
            let mut alone = loaded.clone();
            for (path, value) in &point.params {
                let value = serde_norway::to_value(value).unwrap();
                let mut doc = serde_norway::to_value(&alone.spec).unwrap();
                apply(&mut doc, path, value).unwrap();
                alone.spec = to_spec(&doc).unwrap();
            }
            alone.spec.sweep = None;
            let job = resolve::resolve(&alone, &Overrides::submitting()).unwrap();
            assert_eq!(job.memory, point.job.memory, "{:?}", point.params);
        }
    }

    #[test]
    fn points_that_exceed_the_gpu_are_refused_once_or_planned_with_force() {
        let yaml = "name: big\nresources: { gpus_per_node: 2, gpu_memory_gb: 1.5 }\ntraining:\n  \
                    model: { kind: transformer, vocab_size: 32000, dim: 1024, n_layers: 8, n_heads: 16, max_seq_len: 1024 }\n  \
                    data: { kind: synthetic, seq_len: 1024 }\n  steps: 10\n  total_batch_size: 16\n  \
                    batch_size_per_device: 8\nsweep:\n  grid:\n    training.optimizer.lr: [1.0e-3, 1.0e-4]\n";
        let err = points(yaml).unwrap_err();
        // As `shardrun sweep` prints it: the error with its chain of causes.
        let printed = format!("{:#}", anyhow::Error::from(err));
        assert!(
            printed.starts_with(
                "2 of the sweep's 2 points cannot run, for 1 reason(s):\n\nsweep point \
                 training.optimizer.lr=0.001 (and 1 more point(s) for the same reason):"
            ),
            "{printed}"
        );
        assert_eq!(printed.matches("exceeds the").count(), 1, "{printed}");
        assert!(printed.contains("pass --force"), "{printed}");
        let loaded = parse(yaml, Path::new("sweep.yaml")).unwrap();
        let forced = Overrides {
            force: true,
            ..Overrides::submitting()
        };
        let p = expand(&loaded, &forced).unwrap();
        assert_eq!(p.len(), 2);
        assert!(p.iter().all(|p| p
            .job
            .warnings
            .iter()
            .any(|w| w.ends_with("planned anyway (--force)"))));
    }

    #[test]
    fn keys_are_stable_and_change_only_for_changed_points() {
        let yaml = include_str!("../../../examples/sweep.yaml");
        let a = points(yaml).unwrap();
        let b = points(yaml).unwrap();
        assert_eq!(
            a.iter().map(|p| &p.key).collect::<Vec<_>>(),
            b.iter().map(|p| &p.key).collect::<Vec<_>>()
        );
        let changed =
            points(&yaml.replace("[1.0e-3, 3.0e-4, 1.0e-4]", "[1.0e-3, 3.0e-4, 2.0e-4]")).unwrap();
        let old: HashSet<_> = a.iter().map(|p| p.key.clone()).collect();
        let new_points = changed.iter().filter(|p| !old.contains(&p.key)).count();
        assert_eq!(
            new_points, 4,
            "only the 4 points with the changed lr get new keys"
        );
    }

    #[test]
    fn typo_in_a_swept_path_suggests_the_key() {
        let yaml = include_str!("../../../examples/sweep.yaml")
            .replace("training.optimizer.lr:", "training.optimizer.lrate:");
        let SweepError::Spec(err) = points(&yaml).unwrap_err() else {
            panic!("expected a spec error")
        };
        assert_eq!(err.field, "sweep.grid.training.optimizer.lrate");
        assert!(
            err.fix.contains("did you mean `training.optimizer.lr`"),
            "{err}"
        );
        // At the swept key itself.
        assert_eq!((err.line, err.column), (Some(20), Some(5)), "{err}");
        // A Hugging Face Trainer argument's name: where it is here, and whose name it was.
        let yaml = include_str!("../../../examples/sweep.yaml")
            .replace("training.optimizer.lr:", "training.learning_rate:");
        let SweepError::Spec(err) = points(&yaml).unwrap_err() else {
            panic!("expected a spec error")
        };
        assert!(
            err.fix.ends_with(
                "did you mean `training.optimizer.lr`? (the name here of the Hugging Face \
                 Trainer's `learning_rate`)"
            ),
            "{err}"
        );
    }

    #[test]
    fn a_point_with_an_impossible_split_names_the_point() {
        let yaml = include_str!("../../../examples/sweep.yaml").replace(
            "training.seed: [0, 1]",
            "training.total_batch_size: [32, 33]",
        );
        let err = points(&yaml).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("training.total_batch_size=33"), "{text}");
        assert!(text.contains("nearest 32 or 48"), "{text}");
        // Located at the swept 33, not at the spec's own `total_batch_size: 32`; one reason
        // for the 6 points with 33 (3 learning rates × 2 weight decays).
        assert!(
            text.contains("(and 5 more point(s) for the same reason)"),
            "{text}"
        );
        let SweepError::Points { mut failures, .. } = err else {
            panic!("expected the points' errors")
        };
        assert_eq!(failures.len(), 6, "{text}");
        let ResolveError::Invalid(err) = failures.remove(0).1;
        assert_eq!(err.field, "training.total_batch_size");
        assert_eq!((err.line, err.column), (Some(21), Some(37)), "{err}");
    }

    #[test]
    fn every_impossible_point_is_told_once_for_each_reason_at_its_swept_value() {
        let yaml = include_str!("../../../examples/sweep.yaml").replace(
            "training.seed: [0, 1]",
            "training.seed: [0, 1]\n    training.batch_size_per_device: [3, 4, 8, 5]\n    \
             training.schedule.warmup_steps: [10, 60]",
        );
        let err = points(&yaml).unwrap_err();
        let text = err.to_string();
        let SweepError::Points { total, failures } = err else {
            panic!("expected every point's error: {text}")
        };
        // 3 × 2 × 4 × 2 × 2 points; per-device batches 3 and 5 do not split 32 on 2 ranks,
        // and 60 warm-up steps are more than 50 (told for the points whose batch splits).
        assert_eq!((total, failures.len()), (96, 72), "{text}");
        assert!(
            text.starts_with("72 of the sweep's 96 points cannot run, for 3 reason(s):"),
            "{text}"
        );
        for (at, value) in [("sweep.yaml:22:38", 3), ("sweep.yaml:22:47", 5)] {
            assert!(
                text.contains(&format!(
                    "(and 23 more point(s) for the same reason):\n{at}: field \
                     `training.batch_size_per_device`: total batch 32 does not split into \
                     per-device batches of {value} on 2 ranks"
                )),
                "{text}"
            );
            assert!(
                text.contains(&format!(
                    "fix: drop {value} from the sweep's `batch_size_per_device` values (32 on \
                     2 rank(s) splits into per-device batches of 1, 2, 4, 8 or 16), or make \
                     `total_batch_size` a common multiple of every swept per-device batch × 2 \
                     rank(s)"
                )),
                "{text}"
            );
        }
        assert!(
            text.contains("sweep.yaml:23:42: field `training.schedule.warmup_steps`: 60 warmup steps but only 50 steps"),
            "{text}"
        );
    }

    #[test]
    fn a_swept_value_of_the_wrong_type_is_located_at_the_value() {
        let sweep = include_str!("../../../examples/sweep.yaml");
        let yaml = sweep.replace("training.seed: [0, 1]", "training.seed: [0, -1]");
        let SweepError::Spec(err) = points(&yaml).unwrap_err() else {
            panic!("expected a spec error")
        };
        assert_eq!(err.field, "sweep.grid.training.seed[1]");
        assert_eq!((err.line, err.column), (Some(21), Some(24)), "{err}");
        assert!(
            err.why.starts_with("`training.seed` cannot be -1: "),
            "{err}"
        );
        assert!(err.fix.contains("a whole number"), "{err}");

        let yaml = sweep.replace("weight_decay: 0.1", "weight_decay: lots");
        let SweepError::Spec(err) = points(&yaml).unwrap_err() else {
            panic!("expected a spec error")
        };
        assert_eq!(err.field, "sweep.list[1].training.optimizer.weight_decay");
        assert_eq!(err.line, Some(24), "{err}");

        // An unknown key inside a swept section is the value's, with the key it may mean.
        let yaml = sweep.replace(
            "training.seed: [0, 1]",
            "training.schedule: [{ decay: cosine }, { decay: cosine, warmup_stepz: 2 }]",
        );
        let SweepError::Spec(err) = points(&yaml).unwrap_err() else {
            panic!("expected a spec error")
        };
        assert_eq!(err.field, "sweep.grid.training.schedule[1]");
        assert!(err.fix.contains("did you mean `warmup_steps`"), "{err}");
    }

    #[test]
    fn sweep_limits_are_read_and_zero_is_refused() {
        let yaml = include_str!("../../../examples/sweep.yaml");
        let with = |limits: &str| format!("{yaml}  limits: {limits}\n");
        let loaded = parse(
            &with("{ max_array_size: 500, max_queued: 2000 }"),
            Path::new("s.yaml"),
        )
        .unwrap();
        let limits = loaded.spec.sweep.as_ref().unwrap().limits.clone().unwrap();
        assert_eq!(
            (limits.max_array_size, limits.max_queued),
            (Some(500), Some(2000))
        );
        assert!(expand(&loaded, &Overrides::submitting()).is_ok());
        let SweepError::Spec(err) = points(&with("{ max_array_size: 0 }")).unwrap_err() else {
            panic!("expected a spec error")
        };
        assert_eq!(err.field, "sweep.limits.max_array_size");
        assert!(err.line.is_some(), "{err}");
        let err = parse(&with("{ max_arrays: 5 }"), Path::new("s.yaml")).unwrap_err();
        assert!(err.to_string().contains("max_array_size"), "{err}");
    }

    #[test]
    fn a_spec_without_sweep_is_refused() {
        assert!(points(include_str!("../../../examples/mlp.yaml")).is_err());
    }
}
