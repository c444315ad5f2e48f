//! The variables the controller sets for every rank: the spec's `resources.env`, always, and
//! the `NCCL_*` variables of the shell that submitted the job, so that they reach the ranks
//! even where Slurm does not pass that shell's environment on (`--export=NONE`) — but not
//! over a value the job's own environment sets otherwise (its set-up lines, a `module load`
//! on the compute node), which knows that node better than the login node did.

use crate::resolve::summary::shown_value;

#[derive(Debug, Clone, Default, PartialEq)]
pub struct RankEnv {
    /// Set for every rank, sorted by name.
    pub vars: Vec<(String, String)>,
    /// Submitting-shell variables the job's environment sets otherwise, and so keeps:
    /// (name, the shell's value, the job's value).
    pub kept_by_the_job: Vec<(String, String, String)>,
}

impl RankEnv {
    /// `spec`: `resources.env`; `shell`: the submitting shell's `NCCL_*` the spec does not
    /// name; `job_env`: a variable of the controller's own environment.
    pub fn new(
        spec: &[(String, String)],
        shell: &[(String, String)],
        job_env: impl Fn(&str) -> Option<String>,
    ) -> RankEnv {
        let mut env = RankEnv {
            vars: spec.to_vec(),
            kept_by_the_job: Vec::new(),
        };
        for (name, value) in shell {
            if spec.iter().any(|(n, _)| n == name) {
                continue;
            }
            match job_env(name) {
                Some(job) if job != *value => {
                    env.kept_by_the_job.push((name.clone(), value.clone(), job))
                }
                _ => env.vars.push((name.clone(), value.clone())),
            }
        }
        env.vars.sort();
        env
    }

    /// For train.log: what every rank gets (credentials by their length only), and each
    /// submitting-shell value the job's environment overrides.
    pub fn lines(&self) -> Vec<String> {
        let mut lines = Vec::new();
        if !self.vars.is_empty() {
            let shown: Vec<String> = self
                .vars
                .iter()
                .map(|(name, value)| format!("{name}={}", shown_value(name, value)))
                .collect();
            lines.push(format!("environment of every rank: {}", shown.join(" ")));
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
        let spec = pairs(&[("NCCL_DEBUG", "WARN"), ("HF_TOKEN", "hf_secret")]);
        let shell = pairs(&[
            ("NCCL_DEBUG", "INFO"),
            ("NCCL_IB_HCA", "mlx5_0"),
            ("NCCL_NET_PLUGIN", "none"),
            ("NCCL_SOCKET_IFNAME", "ib0"),
        ]);
        // The job's environment: the spec's variable set otherwise (the spec still wins),
        // one shell variable set otherwise by a module, one passed on unchanged by Slurm, one
        // not passed on at all (`--export=NONE`).
        let job = |name: &str| match name {
            "NCCL_DEBUG" => Some("TRACE".to_string()),
            "NCCL_NET_PLUGIN" => Some("aws-ofi".to_string()),
            "NCCL_SOCKET_IFNAME" => Some("ib0".to_string()),
            _ => None,
        };
        let env = RankEnv::new(&spec, &shell, job);
        assert_eq!(
            env.vars,
            pairs(&[
                ("HF_TOKEN", "hf_secret"),
                ("NCCL_DEBUG", "WARN"),
                ("NCCL_IB_HCA", "mlx5_0"),
                ("NCCL_SOCKET_IFNAME", "ib0"),
            ])
        );
        assert_eq!(
            env.kept_by_the_job,
            vec![(
                "NCCL_NET_PLUGIN".to_string(),
                "none".to_string(),
                "aws-ofi".to_string()
            )]
        );
        assert_eq!(
            env.lines(),
            [
                "environment of every rank: HF_TOKEN=<hidden, 9 characters> NCCL_DEBUG=WARN \
                 NCCL_IB_HCA=mlx5_0 NCCL_SOCKET_IFNAME=ib0",
                "NCCL_NET_PLUGIN stays aws-ofi as the job's environment sets it (its set-up \
                 lines or modules), not none as the submitting shell had it",
            ]
        );
        assert!(RankEnv::new(&[], &[], job).lines().is_empty());
    }
}
