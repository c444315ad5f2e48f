//! Reading a run's `metrics.jsonl` back (for `shardrun plot` and `shardrun metrics`): step
//! records and evaluation records, each line read as the kind it parses as.

use serde::de::DeserializeOwned;
use shardrun_protocol::messages::{EvalMetrics, StepMetrics};
use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum MetricsFileError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
}

/// The step records of the lowest rank that reported (rank 0 normally), one per step in step
/// order. A resumed run repeats the steps after its checkpoint, appending them again: the
/// later attempt's records replace the earlier ones from the step it resumed at. A line
/// that does not parse (the last one, while it is being written) is skipped.
pub fn read_main_rank(path: &Path) -> Result<Vec<StepMetrics>, MetricsFileError> {
    let all: Vec<StepMetrics> = read_kind(path)?;
    let Some(main) = all.iter().map(|m| m.rank).min() else {
        return Ok(Vec::new());
    };
    let mut kept: Vec<StepMetrics> = Vec::new();
    for m in all.into_iter().filter(|m| m.rank == main) {
        if let Some(cut) = kept.iter().position(|k| k.step >= m.step) {
            kept.truncate(cut);
        }
        kept.push(m);
    }
    Ok(kept)
}

/// The evaluation records (rank 0 sends them) in step order; a resumed run's evaluations
/// replace those of the steps it repeated, as for step records.
pub fn read_evals(path: &Path) -> Result<Vec<EvalMetrics>, MetricsFileError> {
    let mut kept: Vec<EvalMetrics> = Vec::new();
    for e in read_kind::<EvalMetrics>(path)? {
        if let Some(cut) = kept.iter().position(|k| k.step >= e.step) {
            kept.truncate(cut);
        }
        kept.push(e);
    }
    Ok(kept)
}

fn read_kind<T: DeserializeOwned>(path: &Path) -> Result<Vec<T>, MetricsFileError> {
    let text = std::fs::read_to_string(path).map_err(|source| MetricsFileError::Read {
        path: path.display().to_string(),
        source,
    })?;
    Ok(text
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_lowest_rank_and_skips_partial_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.jsonl");
        let rec = |rank: u64, step: u64| {
            format!(
                r#"{{"rank":{rank},"step":{step},"loss":1.0,"lr":0.1,"grad_norm":1.0,"step_time_s":0.1,"tokens_per_s":5.0,"mfu":null,"model_state_bytes":1,"peak_memory_bytes":2,"loss_scale":null}}"#
            )
        };
        let eval = r#"{"rank":0,"step":2,"eval_loss":2.5,"eval_perplexity":12.18,"eval_tokens":100,"eval_time_s":0.5}"#;
        let text = format!(
            "{}\n{}\n{}\n{eval}\n{{\"rank\":0,\"st",
            rec(1, 1),
            rec(0, 1),
            rec(0, 2)
        );
        std::fs::write(&path, text).unwrap();
        let got = read_main_rank(&path).unwrap();
        assert_eq!(
            got.iter().map(|m| (m.rank, m.step)).collect::<Vec<_>>(),
            vec![(0, 1), (0, 2)]
        );
        let evals = read_evals(&path).unwrap();
        assert_eq!(evals.len(), 1);
        assert_eq!((evals[0].step, evals[0].eval_loss), (2, 2.5));
    }

    #[test]
    fn a_resumed_run_replaces_the_steps_it_repeated() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.jsonl");
        let rec = |step: u64, loss: f64| {
            format!(
                r#"{{"rank":0,"step":{step},"loss":{loss},"lr":0.1,"grad_norm":1.0,"step_time_s":0.1,"tokens_per_s":5.0,"mfu":null,"model_state_bytes":1,"peak_memory_bytes":2,"loss_scale":null}}"#
            )
        };
        // Steps 1-4, stopped; resumed from the checkpoint of step 2.
        let lines = [
            rec(1, 9.0),
            rec(2, 8.0),
            rec(3, 7.5),
            rec(4, 7.4),
            rec(3, 7.0),
            rec(4, 6.0),
        ];
        std::fs::write(&path, lines.join("\n")).unwrap();
        let got: Vec<(u64, f64)> = read_main_rank(&path)
            .unwrap()
            .iter()
            .map(|m| (m.step, m.loss))
            .collect();
        assert_eq!(got, vec![(1, 9.0), (2, 8.0), (3, 7.0), (4, 6.0)]);
    }
}
