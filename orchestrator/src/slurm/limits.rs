//! What a cluster lets one user queue, as Slurm reports it: slurmctld's limits (`scontrol
//! show config`: `MaxArraySize`, `MaxJobCount`, `SchedulerParameters=max_array_tasks`), the
//! user's association and QOS limits (`sacctmgr`: `MaxSubmitJobs`, `GrpSubmitJobs`,
//! `MaxSubmitJobsPerUser`) where accounting enforces them, and what is queued already
//! (`squeue`), since Slurm counts every array task as one job against each of them.
//! The parsers are pure and tested on recorded outputs; [`read_limits`] runs the commands.

use super::command::{check, run};
use super::SlurmError;
use std::collections::HashMap;

/// The parts of slurmctld's configuration that bound what may be submitted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ControllerConfig {
    pub cluster_name: Option<String>,
    /// Array indices must be below this (`MaxArraySize`).
    pub max_array_size: Option<u64>,
    /// Most tasks in one array (`SchedulerParameters=max_array_tasks=N`).
    pub max_array_tasks: Option<u64>,
    /// Jobs slurmctld holds at once, ended ones it still remembers and every array task
    /// included (`MaxJobCount`).
    pub max_job_count: Option<u64>,
    /// `AccountingStorageType=accounting_storage/slurmdbd`: `sacctmgr` knows associations.
    pub accounting: bool,
    /// `AccountingStorageEnforce` has `limits` (or `safe`, which implies it): association
    /// and QOS limits reject submissions.
    pub enforces_limits: bool,
}

/// `scontrol show config`: `Key = Value` lines.
pub fn parse_show_config(stdout: &str) -> ControllerConfig {
    let mut config = ControllerConfig::default();
    for line in stdout.lines() {
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        let value = value.trim();
        let value = (!value.is_empty() && value != "(null)").then_some(value);
        match key.trim() {
            "ClusterName" => config.cluster_name = value.map(str::to_string),
            "MaxArraySize" => config.max_array_size = value.and_then(|v| v.parse().ok()),
            "MaxJobCount" => config.max_job_count = value.and_then(|v| v.parse().ok()),
            "SchedulerParameters" => {
                config.max_array_tasks = value.and_then(|v| {
                    v.split(',')
                        .find_map(|p| p.trim().strip_prefix("max_array_tasks="))
                        .and_then(|n| n.parse().ok())
                })
            }
            "AccountingStorageType" => {
                config.accounting = value == Some("accounting_storage/slurmdbd")
            }
            "AccountingStorageEnforce" => {
                config.enforces_limits = value
                    .map(|v| v.split(',').any(|f| matches!(f.trim(), "limits" | "safe")))
                    .unwrap_or(false)
            }
            _ => {}
        }
    }
    config
}

/// One association of the user, with the limits `sacctmgr` shows for it (inherited ones
/// included).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Association {
    pub default_account: String,
    pub cluster: String,
    pub account: String,
    /// Empty: every partition.
    pub partition: String,
    pub max_submit_jobs: Option<u64>,
    pub grp_submit_jobs: Option<u64>,
    pub default_qos: String,
}

/// The `format=` of [`parse_user_associations`].
pub const ASSOCIATION_FORMAT: &str =
    "format=User,DefaultAccount,Cluster,Account,Partition,MaxSubmit,GrpSubmit,DefaultQOS";

/// `sacctmgr -n -P show user withassoc where name=<user>` with [`ASSOCIATION_FORMAT`].
pub fn parse_user_associations(stdout: &str) -> Result<Vec<Association>, SlurmError> {
    let mut rows = Vec::new();
    for line in stdout.lines().filter(|l| !l.trim().is_empty()) {
        let fields: Vec<&str> = line.split('|').map(str::trim).collect();
        if fields.len() < 8 {
            return Err(unparsable("sacctmgr show user withassoc", line));
        }
        rows.push(Association {
            default_account: fields[1].to_string(),
            cluster: fields[2].to_string(),
            account: fields[3].to_string(),
            partition: fields[4].to_string(),
            max_submit_jobs: count("sacctmgr show user withassoc", fields[5])?,
            grp_submit_jobs: count("sacctmgr show user withassoc", fields[6])?,
            default_qos: fields[7].to_string(),
        });
    }
    Ok(rows)
}

/// Submission limits of one QOS.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QosLimits {
    pub name: String,
    pub max_submit_jobs_per_user: Option<u64>,
    pub grp_submit_jobs: Option<u64>,
}

/// The `format=` of [`parse_qos`].
pub const QOS_FORMAT: &str = "format=Name,MaxSubmitPU,GrpSubmit";

/// `sacctmgr -n -P show qos where name=<qos>` with [`QOS_FORMAT`].
pub fn parse_qos(stdout: &str) -> Result<Vec<QosLimits>, SlurmError> {
    let mut rows = Vec::new();
    for line in stdout.lines().filter(|l| !l.trim().is_empty()) {
        let fields: Vec<&str> = line.split('|').map(str::trim).collect();
        if fields.len() < 3 {
            return Err(unparsable("sacctmgr show qos", line));
        }
        rows.push(QosLimits {
            name: fields[0].to_string(),
            max_submit_jobs_per_user: count("sacctmgr show qos", fields[1])?,
            grp_submit_jobs: count("sacctmgr show qos", fields[2])?,
        });
    }
    Ok(rows)
}

/// What slurmctld holds now, counted as its limits count (one per array task).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueCounts {
    /// Every job record, ended ones still remembered included (against `MaxJobCount`).
    pub records: u64,
    /// The user's pending or running jobs, in all.
    pub mine: u64,
    /// The user's pending or running jobs per account.
    pub mine_by_account: HashMap<String, u64>,
    /// The user's pending or running jobs per QOS.
    pub mine_by_qos: HashMap<String, u64>,
    /// Everyone's pending or running jobs per QOS.
    pub all_by_qos: HashMap<String, u64>,
}

/// The `-o` of [`parse_queue`].
pub const QUEUE_FORMAT: &str = "%u|%a|%q|%T";

/// `squeue -h -r --states=all -o '%u|%a|%q|%T'`: one line per job or array task.
pub fn parse_queue(stdout: &str, user: &str) -> QueueCounts {
    let mut counts = QueueCounts::default();
    for line in stdout.lines() {
        let fields: Vec<&str> = line.trim().split('|').collect();
        if fields.len() < 4 {
            continue;
        }
        counts.records += 1;
        let state = super::JobState::parse(fields[3]);
        if state.is_finished() {
            continue;
        }
        *counts.all_by_qos.entry(fields[2].to_string()).or_default() += 1;
        if fields[0] == user {
            counts.mine += 1;
            *counts
                .mine_by_account
                .entry(fields[1].to_string())
                .or_default() += 1;
            *counts.mine_by_qos.entry(fields[2].to_string()).or_default() += 1;
        }
    }
    counts
}

fn count(command: &'static str, field: &str) -> Result<Option<u64>, SlurmError> {
    if field.is_empty() {
        return Ok(None);
    }
    field
        .parse()
        .map(Some)
        .map_err(|_| unparsable(command, field))
}

fn unparsable(command: &'static str, output: &str) -> SlurmError {
    SlurmError::Unparsable {
        command,
        output: output.to_string(),
    }
}

/// One limit on jobs queued at once: what it is, its value, and how much of it is in use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueLimit {
    /// As people read it: `MaxSubmitJobs of user me, account proj (sacctmgr)`.
    pub what: String,
    pub max: u64,
    pub used: u64,
    /// The count must stay below `max`, not reach it: slurmctld refuses a submission that
    /// would bring its jobs to `MaxJobCount` (an array of 100 with 150 held of 250).
    pub below: bool,
}

impl QueueLimit {
    /// Jobs (array tasks) that may still be queued under this limit.
    pub fn room(&self) -> u64 {
        self.max
            .saturating_sub(self.used)
            .saturating_sub(u64::from(self.below))
    }
}

/// Everything read from the cluster that bounds a submission.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterLimits {
    /// Most tasks in one array and what says so (`MaxArraySize=1001 (scontrol show config)`).
    pub array_size: Option<(u64, String)>,
    /// Limits on jobs queued at once, each with its use now.
    pub queue: Vec<QueueLimit>,
    /// The user's pending and running jobs, all accounts together.
    pub queued_by_me: u64,
    /// What could not be read or does not apply, for the user to see.
    pub notes: Vec<String>,
}

/// Where a job of the sweep would go (its spec's `resources`), to pick the association and
/// QOS whose limits apply.
#[derive(Debug, Clone, Copy, Default)]
pub struct Destination<'a> {
    pub account: Option<&'a str>,
    pub partition: Option<&'a str>,
    pub qos: Option<&'a str>,
}

/// Combine what the commands printed into limits. Pure, so each combination is testable.
pub fn combine(
    config: &ControllerConfig,
    associations: &[Association],
    qos: &[QosLimits],
    queue: &QueueCounts,
    user: &str,
    to: Destination<'_>,
) -> ClusterLimits {
    let mut limits = ClusterLimits {
        queued_by_me: queue.mine,
        ..Default::default()
    };
    let array_size = match (config.max_array_size, config.max_array_tasks) {
        (Some(size), Some(tasks)) if tasks < size => Some((
            tasks,
            format!("SchedulerParameters=max_array_tasks={tasks} (scontrol show config)"),
        )),
        (Some(size), _) => Some((size, format!("MaxArraySize={size} (scontrol show config)"))),
        (None, Some(tasks)) => Some((
            tasks,
            format!("SchedulerParameters=max_array_tasks={tasks} (scontrol show config)"),
        )),
        (None, None) => None,
    };
    limits.array_size = array_size;
    if let Some(max) = config.max_job_count {
        limits.queue.push(QueueLimit {
            what: "MaxJobCount, every user's jobs slurmctld holds (scontrol show config)".into(),
            max,
            used: queue.records,
            below: true,
        });
    }
    if !config.accounting {
        return limits;
    }
    if !config.enforces_limits {
        limits.notes.push(
            "association limits are not enforced here (AccountingStorageEnforce has no `limits`)"
                .into(),
        );
        return limits;
    }

    let cluster = config.cluster_name.as_deref().unwrap_or("");
    let mine: Vec<&Association> = associations
        .iter()
        .filter(|a| cluster.is_empty() || a.cluster == cluster)
        .collect();
    let account = to
        .account
        .map(str::to_string)
        .or_else(|| mine.first().map(|a| a.default_account.clone()))
        .unwrap_or_default();
    let of_account: Vec<&Association> = mine
        .iter()
        .copied()
        .filter(|a| a.account == account)
        .collect();
    // A partition's own association applies to jobs there; else the account-wide one.
    let in_partition: Vec<&Association> = of_account
        .iter()
        .copied()
        .filter(|a| Some(a.partition.as_str()) == to.partition)
        .collect();
    let applicable = if in_partition.is_empty() {
        of_account
            .iter()
            .copied()
            .filter(|a| a.partition.is_empty())
            .collect()
    } else {
        in_partition
    };
    if applicable.is_empty() {
        limits.notes.push(format!(
            "sacctmgr shows no association of user {user} with account `{account}`{}",
            if cluster.is_empty() {
                String::new()
            } else {
                format!(" on cluster {cluster}")
            }
        ));
    }
    let used_in_account = queue.mine_by_account.get(&account).copied().unwrap_or(0);
    for association in &applicable {
        let whose = format!(
            "user {user}, account {account}{}",
            if association.partition.is_empty() {
                String::new()
            } else {
                format!(", partition {}", association.partition)
            }
        );
        for (name, value) in [
            ("MaxSubmitJobs", association.max_submit_jobs),
            ("GrpSubmitJobs", association.grp_submit_jobs),
        ] {
            if let Some(max) = value {
                limits.queue.push(QueueLimit {
                    what: format!("{name} of {whose} (sacctmgr)"),
                    max,
                    used: used_in_account,
                    below: false,
                });
            }
        }
    }

    let qos_name = to
        .qos
        .map(str::to_string)
        .or_else(|| {
            applicable
                .first()
                .map(|a| a.default_qos.clone())
                .filter(|q| !q.is_empty())
        })
        .unwrap_or_else(|| "normal".to_string());
    if let Some(q) = qos.iter().find(|q| q.name == qos_name) {
        if let Some(max) = q.max_submit_jobs_per_user {
            limits.queue.push(QueueLimit {
                what: format!("MaxSubmitJobsPerUser of QOS {qos_name} for user {user} (sacctmgr)"),
                max,
                used: queue.mine_by_qos.get(&qos_name).copied().unwrap_or(0),
                below: false,
            });
        }
        if let Some(max) = q.grp_submit_jobs {
            limits.queue.push(QueueLimit {
                what: format!("GrpSubmitJobs of QOS {qos_name}, every user's jobs (sacctmgr)"),
                max,
                used: queue.all_by_qos.get(&qos_name).copied().unwrap_or(0),
                below: false,
            });
        }
    }
    limits
}

/// The name of the user running this (Slurm's commands act as them).
pub fn current_user() -> String {
    crate::rundir::access::this_user()
}

/// Read the limits from the cluster: `scontrol show config`, `squeue`, and with enforced
/// accounting `sacctmgr` for the user's associations and the job's QOS. A command that does
/// not answer is a note, not an error (sites may hide their configuration); only a failing
/// `squeue` is an error, since without it nothing can be submitted safely anyway.
pub fn read_limits(to: Destination<'_>) -> Result<ClusterLimits, SlurmError> {
    let user = current_user();
    let mut notes = Vec::new();
    let args = ["show", "config"];
    let config = match run("scontrol", &args).and_then(|out| check("scontrol", &args, out)) {
        Ok(text) => parse_show_config(&text),
        Err(err) => {
            notes.push(format!("`scontrol show config` did not answer: {err}"));
            ControllerConfig::default()
        }
    };
    let args = ["-h", "-r", "--states=all", "-o", QUEUE_FORMAT];
    let queue = parse_queue(&check("squeue", &args, run("squeue", &args)?)?, &user);

    let mut associations = Vec::new();
    let mut qos = Vec::new();
    if config.accounting && config.enforces_limits {
        let name = format!("name={user}");
        let args = [
            "-n",
            "-P",
            "show",
            "user",
            "withassoc",
            "where",
            &name,
            ASSOCIATION_FORMAT,
        ];
        match run("sacctmgr", &args)
            .and_then(|out| check("sacctmgr", &args, out))
            .and_then(|text| parse_user_associations(&text))
        {
            Ok(rows) => associations = rows,
            Err(err) => notes.push(format!("association limits not read: {err}")),
        }
        let args = ["-n", "-P", "show", "qos", QOS_FORMAT];
        match run("sacctmgr", &args)
            .and_then(|out| check("sacctmgr", &args, out))
            .and_then(|text| parse_qos(&text))
        {
            Ok(rows) => qos = rows,
            Err(err) => notes.push(format!("QOS limits not read: {err}")),
        }
    }
    let mut limits = combine(&config, &associations, &qos, &queue, &user, to);
    notes.append(&mut limits.notes);
    limits.notes = notes;
    Ok(limits)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn show_config_recorded_from_a_cluster_with_max_array_size_10() {
        let config = parse_show_config(include_str!("testdata/scontrol_show_config.txt"));
        assert_eq!(
            config,
            ControllerConfig {
                cluster_name: Some("shardrun".into()),
                max_array_size: Some(10),
                max_array_tasks: None,
                max_job_count: Some(10000),
                accounting: false,
                enforces_limits: false,
            }
        );
    }

    #[test]
    fn show_config_recorded_with_enforced_accounting() {
        let config = parse_show_config(include_str!("testdata/scontrol_show_config_acct.txt"));
        assert!(config.accounting && config.enforces_limits, "{config:?}");
        assert_eq!(config.max_array_size, Some(1001));
    }

    #[test]
    fn max_array_tasks_of_scheduler_parameters_is_read() {
        let config = parse_show_config(
            "MaxArraySize            = 4001\nSchedulerParameters     = batch_sched_delay=0,max_array_tasks=1000,bf_continue\n",
        );
        assert_eq!(config.max_array_tasks, Some(1000));
        let limits = combine(
            &config,
            &[],
            &[],
            &QueueCounts::default(),
            "me",
            Destination::default(),
        );
        assert_eq!(limits.array_size.unwrap().0, 1000);
    }

    #[test]
    fn user_associations_recorded() {
        // Recorded with `sacctmgr -i modify user root set MaxSubmitJobs=12 GrpSubmitJobs=20`.
        let rows = parse_user_associations(include_str!("testdata/sacctmgr_user_assoc.txt"))
            .expect("parses");
        assert_eq!(
            rows,
            vec![Association {
                default_account: "root".into(),
                cluster: "shardrun".into(),
                account: "root".into(),
                partition: String::new(),
                max_submit_jobs: Some(12),
                grp_submit_jobs: Some(20),
                default_qos: String::new(),
            }]
        );
        assert!(parse_user_associations("root|root|shardrun|root||many||\n").is_err());
    }

    #[test]
    fn qos_recorded() {
        // Recorded with `sacctmgr -i modify qos normal set MaxSubmitJobsPerUser=30`.
        let rows = parse_qos(include_str!("testdata/sacctmgr_qos.txt")).expect("parses");
        assert_eq!(
            rows,
            vec![QosLimits {
                name: "normal".into(),
                max_submit_jobs_per_user: Some(30),
                grp_submit_jobs: None,
            }]
        );
    }

    #[test]
    fn queue_recorded_counts_array_tasks_one_each() {
        // Recorded: a held 10-task array, a completed job and a running one.
        let queue = parse_queue(include_str!("testdata/squeue_users.txt"), "root");
        assert_eq!(queue.records, 12);
        assert_eq!(queue.mine, 11);
        assert_eq!(queue.mine_by_account.get("root"), Some(&11));
        assert_eq!(queue.mine_by_qos.get("normal"), Some(&11));
    }

    fn enforced() -> ControllerConfig {
        ControllerConfig {
            cluster_name: Some("c".into()),
            max_array_size: Some(1001),
            max_job_count: Some(10_000),
            accounting: true,
            enforces_limits: true,
            ..Default::default()
        }
    }

    fn association(account: &str, partition: &str, max_submit: Option<u64>) -> Association {
        Association {
            default_account: "proj".into(),
            cluster: "c".into(),
            account: account.into(),
            partition: partition.into(),
            max_submit_jobs: max_submit,
            grp_submit_jobs: None,
            default_qos: String::new(),
        }
    }

    fn queue() -> QueueCounts {
        QueueCounts {
            records: 500,
            mine: 40,
            mine_by_account: [("proj".to_string(), 30), ("other".to_string(), 10)].into(),
            mine_by_qos: [("normal".to_string(), 40)].into(),
            all_by_qos: [("normal".to_string(), 400)].into(),
        }
    }

    #[test]
    fn the_default_account_association_applies_with_its_jobs_counted() {
        let rows = [
            association("proj", "", Some(100)),
            association("other", "", Some(5)),
        ];
        let limits = combine(
            &enforced(),
            &rows,
            &[],
            &queue(),
            "me",
            Destination::default(),
        );
        let submit: Vec<_> = limits
            .queue
            .iter()
            .filter(|l| l.what.starts_with("MaxSubmitJobs"))
            .collect();
        assert_eq!(submit.len(), 1, "{limits:?}");
        assert_eq!(
            (submit[0].max, submit[0].used, submit[0].room()),
            (100, 30, 70)
        );
        assert!(
            submit[0].what.contains("account proj"),
            "{}",
            submit[0].what
        );
        let job_count = &limits.queue[0];
        // 500 held of 10,000: slurmctld accepts 9,499 more, not 9,500.
        assert_eq!((job_count.max, job_count.room()), (10_000, 9_499));
    }

    #[test]
    fn the_spec_account_and_partition_pick_the_association() {
        let rows = [
            association("proj", "", Some(100)),
            association("other", "", Some(50)),
            association("other", "gpu", Some(8)),
        ];
        let to = Destination {
            account: Some("other"),
            partition: Some("gpu"),
            qos: None,
        };
        let limits = combine(&enforced(), &rows, &[], &queue(), "me", to);
        let submit: Vec<_> = limits
            .queue
            .iter()
            .filter(|l| l.what.starts_with("MaxSubmitJobs"))
            .collect();
        assert_eq!(submit.len(), 1, "{limits:?}");
        assert_eq!((submit[0].max, submit[0].used), (8, 10));
        assert_eq!(
            submit[0].room(),
            0,
            "over the limit already: no room, no underflow"
        );
    }

    #[test]
    fn qos_limits_count_the_users_jobs_in_that_qos() {
        let qos = [QosLimits {
            name: "normal".into(),
            max_submit_jobs_per_user: Some(64),
            grp_submit_jobs: Some(1000),
        }];
        let limits = combine(
            &enforced(),
            &[association("proj", "", None)],
            &qos,
            &queue(),
            "me",
            Destination::default(),
        );
        let rooms: Vec<(u64, u64)> = limits.queue.iter().map(|l| (l.max, l.used)).collect();
        assert_eq!(rooms, vec![(10_000, 500), (64, 40), (1000, 400)]);
    }

    #[test]
    fn unenforced_accounting_limits_are_not_applied() {
        let config = ControllerConfig {
            enforces_limits: false,
            ..enforced()
        };
        let limits = combine(
            &config,
            &[association("proj", "", Some(1))],
            &[],
            &queue(),
            "me",
            Destination::default(),
        );
        assert_eq!(limits.queue.len(), 1, "only MaxJobCount: {limits:?}");
        assert!(
            limits.notes[0].contains("not enforced"),
            "{:?}",
            limits.notes
        );
    }
}
