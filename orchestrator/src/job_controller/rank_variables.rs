//! The variables the controller sets for every rank: the spec's `resources.env`, always, and
//! the `NCCL_*` variables of the shell that submitted the job, so that they reach the ranks
//! even where Slurm does not pass that shell's environment on (`--export=NONE`) — but not
//! over a value the job's own environment sets otherwise (its set-up lines, a `module load`
//! on the compute node), which knows that node better than the login node did.

use crate::resolve::summary::{shown_value, shown_variables};

#[derive(Debug, Clone, Default, PartialEq)]
pub struct RankVariables {
    /// Set for every rank, sorted by name.
    pub vars: Vec<(String, String)>,
    /// Submitting-shell variables the job's environment sets otherwise, and so keeps:
    /// (name, the shell's value, the job's value).
    pub kept_by_the_job: Vec<(String, String, String)>,
}

impl RankVariables {
    /// `env`: `resources.env` and the submitting shell's `NCCL_*` (as resolved);
    /// `from_shell`: those of them the shell gave; `job_env`: a variable of the controller's
    /// own environment.
    pub fn new(
        env: &[(String, String)],
        from_shell: &[String],
        job_env: impl Fn(&str) -> Option<String>,
    ) -> RankVariables {
        let mut variables = RankVariables::default();
        for (name, value) in env {
            match job_env(name).filter(|_| from_shell.contains(name)) {
                Some(job) if job != *value => {
                    variables
                        .kept_by_the_job
                        .push((name.clone(), value.clone(), job))
                }
                _ => variables.vars.push((name.clone(), value.clone())),
            }
        }
        variables.vars.sort();
        variables
    }

    /// For train.log: what every rank gets (credentials by their length only), and each
    /// submitting-shell value the job's environment overrides.
    pub fn lines(&self) -> Vec<String> {
        let mut lines = Vec::new();
        if !self.vars.is_empty() {
            lines.push(format!(
                "environment of every rank: {}",
                shown_variables(&self.vars)
            ));
        }
        for (name, shell, job) in &self.kept_by_the_job {
            lines.push(format!(
                "{name} stays {} as the job's environment sets it (its set-up lines or modules), \
                 not {} as the submitting shell had it",
                shown_value(name, job),
                shown_value(name, shell)
            ));
        }
        lines
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn the_spec_always_wins_and_the_job_environment_wins_over_the_shell() {
        // As resolved: the spec's NCCL_DEBUG and HF_TOKEN, the shell's other three.
        let env = pairs(&[
            ("HF_TOKEN", "hf_secret"),
            ("NCCL_DEBUG", "WARN"),
            ("NCCL_IB_HCA", "mlx5_0"),
            ("NCCL_NET_PLUGIN", "none"),
            ("NCCL_SOCKET_IFNAME", "ib0"),
        ]);
        let from_shell = ["NCCL_IB_HCA", "NCCL_NET_PLUGIN", "NCCL_SOCKET_IFNAME"].map(String::from);
        // The job's environment: the spec's variable set otherwise (the spec still wins),
        // one shell variable set otherwise by a module, one passed on unchanged by Slurm, one
        // not passed on at all (`--export=NONE`).
        let job = |name: &str| match name {
            "NCCL_DEBUG" => Some("TRACE".to_string()),
            "NCCL_NET_PLUGIN" => Some("aws-ofi".to_string()),
            "NCCL_SOCKET_IFNAME" => Some("ib0".to_string()),
            _ => None,
        };
        let variables = RankVariables::new(&env, &from_shell, job);
        assert_eq!(
            variables.vars,
            pairs(&[
                ("HF_TOKEN", "hf_secret"),
                ("NCCL_DEBUG", "WARN"),
                ("NCCL_IB_HCA", "mlx5_0"),
                ("NCCL_SOCKET_IFNAME", "ib0"),
            ])
        );
        assert_eq!(
            variables.kept_by_the_job,
            vec![(
                "NCCL_NET_PLUGIN".to_string(),
                "none".to_string(),
                "aws-ofi".to_string()
            )]
        );
        assert_eq!(
            variables.lines(),
            [
                "environment of every rank: HF_TOKEN=<hidden, 9 characters> NCCL_DEBUG=WARN \
                 NCCL_IB_HCA=mlx5_0 NCCL_SOCKET_IFNAME=ib0",
                "NCCL_NET_PLUGIN stays aws-ofi as the job's environment sets it (its set-up \
                 lines or modules), not none as the submitting shell had it",
            ]
        );
        // A run directory from before `from_shell`: everything is applied as it was.
        assert_eq!(RankVariables::new(&env, &[], job).vars, env);
        assert!(RankVariables::new(&[], &[], job).lines().is_empty());
    }
}
