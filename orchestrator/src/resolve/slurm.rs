//! What the sbatch script asks Slurm for, and how the job reacts to its time limit.

use super::ranks::Ranks;
use super::{defaults, Overrides, PreemptionPlan, ResolveError, Section, SlurmResources};

pub fn resolve_slurm(
    s: &Section,
    ranks: &Ranks,
    overrides: &Overrides,
    warnings: &mut Vec<String>,
) -> Result<SlurmResources, ResolveError> {
    let res = &s.spec().resources;
    let time_limit_seconds = match &res.time {
        None => None,
        // No limit, where the partition's allows it: no time-limit notice either.
        Some(time) if ["UNLIMITED", "INFINITE"].contains(&time.to_uppercase().as_str()) => None,
        Some(time) => Some(parse_slurm_time(time).ok_or_else(|| {
            s.err(
                "resources.time",
                format!("`{time}` is not a Slurm time limit"),
                "write `MM`, `HH:MM:SS` or `D-HH:MM:SS`, e.g. `time: \"02:00:00\"` (quoted), \
                 or `UNLIMITED`",
            )
        })?),
    };
    if let (Some(time), Some(secs)) = (&res.time, time_limit_seconds) {
        warnings.extend(minutes_read_as_hours(time, secs));
    }
    if let Some(mem) = &res.mem {
        if crate::slurm::parse_memory_size(mem).is_none() {
            return Err(s.err(
                "resources.mem",
                format!("`{mem}` is not a Slurm memory size"),
                "write a number with an optional K/M/G/T suffix, e.g. `mem: 16G`",
            ));
        }
    }
    // The first entry asking for memory by CPU or by GPU: sbatch takes one of them only.
    let mut memory_per_unit: Option<(usize, &str, &str)> = None;
    for (i, line) in res.extra_sbatch.iter().enumerate() {
        if !line.starts_with('-') || line.contains('\n') {
            return Err(s.err(
                "resources.extra_sbatch",
                format!("entry {i} `{line}` is not one sbatch option"),
                "write each option as on the command line, e.g. `--mail-type=END`",
            ));
        }
        if let Some((option, instead)) = written_by_shardrun(line) {
            return Err(s.err(
                "resources.extra_sbatch",
                format!(
                    "entry {i} `{line}` sets {option}, which shardrun writes itself from the \
                     plan: a second one would override it, and the job would no longer be the \
                     one planned (its ranks, time limit, signal or files)"
                ),
                format!("remove it and {instead}"),
            ));
        }
        let per_unit =
            option_name(line).filter(|name| ["--mem-per-cpu", "--mem-per-gpu"].contains(name));
        if let (Some(option), Some(mem)) = (per_unit, &res.mem) {
            return Err(s.err(
                "resources.extra_sbatch",
                format!(
                    "entry {i} `{line}` asks for memory by {option}, and `resources.mem: {mem}` \
                     asks for it by node (--mem): sbatch refuses a job with both (\"mutually \
                     exclusive\")"
                ),
                "keep one: remove `resources.mem`, or this entry",
            ));
        }
        match (per_unit, memory_per_unit) {
            (Some(option), Some((first, first_line, first_option))) if option != first_option => {
                return Err(s.err(
                    "resources.extra_sbatch",
                    format!(
                        "entry {i} `{line}` asks for memory by {option}, and entry {first} \
                         `{first_line}` by {first_option}: sbatch refuses a job with both \
                         (\"mutually exclusive\")"
                    ),
                    "keep one of the two entries",
                ));
            }
            (Some(option), None) => memory_per_unit = Some((i, line, option)),
            _ => {}
        }
    }
    if let Some(kind) = &res.gpu_type {
        // Slurm's GRES type names: what `gres.conf` can spell, nothing that ends the entry.
        let spelt = !kind.is_empty()
            && kind
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
        if !spelt {
            return Err(s.err(
                "resources.gpu_type",
                format!("`{kind}` is not a GPU type as Slurm's GRES names one"),
                "write the type alone, as `sinfo -o %G` lists it (`gpu:h100:8` is `gpu_type: h100`)",
            ));
        }
        if ranks.gpus_per_node == 0 {
            return Err(s.err(
                "resources.gpu_type",
                format!("a GPU type (`{kind}`) for a job of CPU ranks"),
                "set `resources.gpus_per_node`, or remove `gpu_type`",
            ));
        }
    }
    if ranks.gpus_per_node > 0 && res.cpus_per_task.is_none() && overrides.world_size.is_none() {
        warnings.push(format!(
            "`resources.cpus_per_task` is not set: each GPU rank gets {} CPU (Slurm's default) \
             for its data loading, its torch threads and a data preparation in the job; GPU \
             jobs usually ask for the node's cores divided by its GPUs (`cpus_per_task: 8` or \
             more)",
            ranks.cpus_per_task
        ));
    }
    if res.setup.iter().any(|l| l.contains('\n')) {
        return Err(s.err(
            "resources.setup",
            "a setup entry spans several lines",
            "write one shell line per list entry",
        ));
    }
    for (name, value) in &res.env {
        let valid_name = name
            .chars()
            .next()
            .is_some_and(|c| c == '_' || c.is_ascii_alphabetic())
            && name.chars().all(|c| c == '_' || c.is_ascii_alphanumeric());
        if !valid_name || value.contains('\0') {
            return Err(s.err(
                "resources.env",
                format!("`{name}` is not an environment variable name (or its value holds a NUL)"),
                "use names of letters, digits and `_`, not starting with a digit",
            ));
        }
    }
    // The spec's variables win over the submitting shell's.
    let from_shell: Vec<(String, String)> = overrides
        .submitting_env
        .iter()
        .filter(|(k, _)| !res.env.contains_key(k))
        .cloned()
        .collect();
    let mut env: Vec<(String, String)> = res
        .env
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .chain(from_shell.iter().cloned())
        .collect();
    env.sort();
    let from_shell = from_shell.into_iter().map(|(name, _)| name).collect();
    Ok(SlurmResources {
        nodes: ranks.nodes,
        ntasks_per_node: ranks.ntasks_per_node,
        // Local runs (`--nproc`) ask Slurm for no GPUs.
        gpus_per_node: if overrides.world_size.is_some() {
            0
        } else {
            ranks.gpus_per_node
        },
        gpu_type: res
            .gpu_type
            .clone()
            .filter(|_| overrides.world_size.is_none()),
        cpus_per_task: ranks.cpus_per_task,
        mem: (res.mem.as_deref()).map(|mem| crate::slurm::memory_size_for_sbatch(mem).to_string()),
        time: res.time.clone(),
        time_limit_seconds,
        partition: res.partition.clone(),
        account: res.account.clone(),
        qos: res.qos.clone(),
        reservation: res.reservation.clone(),
        constraint: res.constraint.clone(),
        exclusive: res.exclusive.unwrap_or(false),
        extra_sbatch: res.extra_sbatch.clone(),
        setup: res.setup.clone(),
        env,
        from_shell,
    })
}

pub fn resolve_preemption(
    s: &Section,
    time_limit_seconds: Option<u64>,
    warnings: &mut Vec<String>,
) -> Result<PreemptionPlan, ResolveError> {
    let p = &s.spec().preemption;
    let signal_seconds = match (p.signal_seconds, time_limit_seconds) {
        // `--signal=…@0` arrives with the kill itself: no time to save anything.
        (Some(0), _) => {
            return Err(s.err(
                "preemption.signal_seconds",
                "0 s of warning: the signal would come with the time limit's kill, leaving no time to save a checkpoint",
                format!(
                    "give the checkpoint time to be written, e.g. `signal_seconds: {}` (Slurm may also send it up to 60 s early)",
                    defaults::SIGNAL_SECONDS
                ),
            ));
        }
        // Slurm keeps the warning time in 16 bits and refuses anything larger.
        (Some(secs), _) if secs > u64::from(u16::MAX) => {
            return Err(s.err(
                "preemption.signal_seconds",
                format!(
                    "{secs} s is more than Slurm's largest warning time, {} s",
                    u16::MAX
                ),
                format!("use at most {} seconds", u16::MAX),
            ));
        }
        (Some(secs), Some(limit)) if secs >= limit => {
            return Err(s.err(
                "preemption.signal_seconds",
                format!("the warning comes {secs} s before a time limit of {limit} s, i.e. before the job starts"),
                format!("use fewer than {limit} seconds, or a longer `resources.time`"),
            ));
        }
        (Some(secs), Some(limit)) => {
            warnings.extend(notice_at_the_start(
                secs,
                limit,
                "give it more `resources.time` or a smaller `preemption.signal_seconds`",
            ));
            secs
        }
        (Some(secs), None) => secs,
        // Small limits (tests, debug queues) get the warning halfway instead.
        (None, Some(limit)) => {
            let secs = defaults::SIGNAL_SECONDS.min(limit / 2);
            warnings.extend(notice_at_the_start(
                secs,
                limit,
                "give it more `resources.time` (the notice comes halfway through a limit under \
                 4 minutes)",
            ));
            secs
        }
        (None, None) => defaults::SIGNAL_SECONDS,
    };
    Ok(PreemptionPlan {
        signal_seconds,
        requeue: p.requeue.unwrap_or(true),
        max_requeues: p.max_requeues.unwrap_or(defaults::MAX_REQUEUES),
    })
}

/// A notice `secs` before a limit of `limit` seconds that Slurm may send as the job starts
/// (it sends it up to a minute early): the job then stops before it trains a step, and is
/// not requeued.
fn notice_at_the_start(secs: u64, limit: u64, fix: &str) -> Option<String> {
    let early_by = crate::job_controller::notice::SIGNAL_EARLY_BY;
    (limit - secs < early_by).then(|| {
        format!(
            "the time-limit notice comes {secs} s before a limit of {limit} s, {} s in, and \
             Slurm may send it up to {early_by} s early: the job may get it as it starts and \
             stop before it trains a step, and is then not requeued; {fix}",
            limit - secs
        )
    })
}

/// Slurm time limits: `M`, `M:S`, `H:M:S`, `D-H`, `D-H:M`, `D-H:M:S` → seconds; a limit of
/// none is not one.
pub fn parse_slurm_time(s: &str) -> Option<u64> {
    slurm_duration(s).filter(|&secs| secs > 0)
}

/// A duration in Slurm's formats (those of [`parse_slurm_time`]), zero included: squeue's
/// time used is `0:00` at the start.
pub fn slurm_duration(s: &str) -> Option<u64> {
    let num = |x: &str| -> Option<u64> {
        if x.is_empty() || !x.bytes().all(|b| b.is_ascii_digit()) {
            None
        } else {
            x.parse().ok()
        }
    };
    let (days, rest) = match s.split_once('-') {
        Some((d, rest)) => (Some(num(d)?), rest),
        None => (None, s),
    };
    let parts: Vec<u64> = rest.split(':').map(num).collect::<Option<_>>()?;
    let secs = match (days, parts.as_slice()) {
        (None, [m]) => m * 60,
        (None, [m, s]) => m * 60 + s,
        (None, [h, m, s]) => h * 3600 + m * 60 + s,
        (Some(d), [h]) => d * 86400 + h * 3600,
        (Some(d), [h, m]) => d * 86400 + h * 3600 + m * 60,
        (Some(d), [h, m, s]) => d * 86400 + h * 3600 + m * 60 + s,
        _ => return None,
    };
    Some(secs)
}

/// Two fields are minutes and seconds to Slurm, and a limit of a few minutes written that
/// way (`"00:10"`, `"01:30"`) is most likely hours and minutes misread.
fn minutes_read_as_hours(time: &str, secs: u64) -> Option<String> {
    let (hours, minutes) = time.split_once(':').filter(|_| !time.contains('-'))?;
    (!minutes.contains(':') && secs < 10 * 60).then(|| {
        format!(
            "resources.time `{time}` is {} min {} s: Slurm reads two fields as minutes:seconds; \
             for {hours} h {minutes} min write \"{hours}:{minutes}:00\"",
            secs / 60,
            secs % 60
        )
    })
}

/// The sbatch option `line` sets, when the script already has it from the spec (or from
/// shardrun's own workings), with what to write instead.
fn written_by_shardrun(line: &str) -> Option<(&'static str, &'static str)> {
    const WRITTEN: [(&[&str], &str, &str); 17] = [
        (&["--job-name", "-J"], "--job-name", "set `name`"),
        (&["--nodes", "-N"], "--nodes", "set `resources.nodes`"),
        (
            &["--ntasks-per-node", "--ntasks", "-n", "--ntasks-per-gpu"],
            "the number of tasks",
            "set `resources.gpus_per_node` (or `tasks_per_node` for CPU ranks)",
        ),
        (
            &["--cpus-per-task", "-c"],
            "--cpus-per-task",
            "set `resources.cpus_per_task`",
        ),
        (
            &[
                "--gres",
                "--gpus",
                "--gpus-per-node",
                "-G",
                // One GPU a task: every rank is to see its node's GPUs (see the launcher).
                "--gpus-per-task",
                "--gpus-per-socket",
            ],
            "the GPUs",
            "set `resources.gpus_per_node` (and `gpu_type` for a type of GPU)",
        ),
        (&["--mem"], "--mem", "set `resources.mem`"),
        (&["--time", "-t"], "--time", "set `resources.time`"),
        (
            &["--partition", "-p"],
            "--partition",
            "set `resources.partition`",
        ),
        (&["--account", "-A"], "--account", "set `resources.account`"),
        (&["--qos", "-q"], "--qos", "set `resources.qos`"),
        (
            &["--reservation"],
            "--reservation",
            "set `resources.reservation`",
        ),
        (
            &["--constraint", "-C"],
            "--constraint",
            "set `resources.constraint`",
        ),
        (
            &["--exclusive"],
            "--exclusive",
            "set `resources.exclusive: true`",
        ),
        (
            &["--array", "-a"],
            "--array",
            "write a `sweep:` section: its points are the array",
        ),
        (
            &["--output", "-o", "--error", "-e", "--open-mode"],
            "the job's output files",
            "leave them to shardrun: a job writes them into its run directory (`<name>-<job id>.out`, .err), a sweep into its folder's slurm/",
        ),
        (
            &["--signal"],
            "--signal",
            "set `preemption.signal_seconds` (USR2 to the batch shell, which checkpoints)",
        ),
        (
            &["--requeue", "--no-requeue"],
            "--requeue",
            "set `preemption.requeue`",
        ),
    ];
    let name = option_name(line)?;
    WRITTEN
        .iter()
        .find(|(names, _, _)| names.contains(&name))
        .map(|(_, option, instead)| (*option, *instead))
}

/// The option an sbatch option line sets, as its manual names it: `--mem-per-gpu` of
/// `--mem-per-gpu=80G` or `--mem-per-gpu 80G`, `-N` of `-N3` or `-N 3`.
fn option_name(line: &str) -> Option<&str> {
    match line.strip_prefix("--") {
        Some(long) => Some(&line[..2 + long.find(['=', ' ']).unwrap_or(long.len())]),
        // `-N3`, `-N 3`: the letter names it.
        None => line.get(..2),
    }
}

#[cfg(test)]
mod tests {
    use super::written_by_shardrun;

    #[test]
    fn sbatch_options_the_plan_writes_are_named_in_any_spelling() {
        for line in ["--nodes=3", "--nodes 3", "-N3", "-N 3"] {
            assert_eq!(
                written_by_shardrun(line).map(|(o, _)| o),
                Some("--nodes"),
                "{line}"
            );
        }
        assert_eq!(
            written_by_shardrun("--time=5").map(|(o, _)| o),
            Some("--time")
        );
        assert_eq!(
            written_by_shardrun("--gpus-per-node=2").map(|(o, _)| o),
            Some("the GPUs")
        );
        for line in [
            "--mail-type=END",
            "--nodelist=n1",
            "--gpu-bind=closest",
            "-w n1",
        ] {
            assert_eq!(written_by_shardrun(line), None, "{line}");
        }
    }

    use super::*;

    #[test]
    fn slurm_time_formats() {
        assert_eq!(parse_slurm_time("30"), Some(1800));
        assert_eq!(parse_slurm_time("01:30"), Some(90));
        assert_eq!(parse_slurm_time("02:00:00"), Some(7200));
        assert_eq!(parse_slurm_time("1-00:00:00"), Some(86400));
        assert_eq!(parse_slurm_time("1-2"), Some(93600));
        assert_eq!(parse_slurm_time("two hours"), None);
        assert_eq!(parse_slurm_time("0"), None);
    }

    #[test]
    fn a_short_limit_of_two_fields_is_said_to_be_minutes_and_seconds() {
        let warned = |time: &str| minutes_read_as_hours(time, parse_slurm_time(time).unwrap());
        assert_eq!(
            warned("00:10").unwrap(),
            "resources.time `00:10` is 0 min 10 s: Slurm reads two fields as minutes:seconds; \
             for 00 h 10 min write \"00:10:00\""
        );
        assert!(warned("01:30").unwrap().contains("is 1 min 30 s"));
        for meant in ["30:00", "10:00", "5", "00:05:00", "0-00:05"] {
            assert_eq!(warned(meant), None, "{meant}");
        }
    }

    #[test]
    fn memory_sizes() {
        let valid = |mem| crate::slurm::parse_memory_size(mem).is_some();
        assert!(valid("16G") && valid("4000") && valid("512m") && valid("16GB"));
        assert!(!valid("") && !valid("G") && !valid("16 GiB") && !valid("1.5G"));
    }
}
