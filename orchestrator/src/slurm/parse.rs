//! Parsers for the outputs of `sbatch --parsable`, `squeue`, `sacct` and `scontrol`.

use super::{JobRecord, JobState, SlurmError};

/// `sbatch --parsable` prints `<job id>` or `<job id>;<cluster>`.
pub fn parse_sbatch_parsable(stdout: &str) -> Result<String, SlurmError> {
    let line = stdout
        .lines()
        .map(str::trim)
        .rfind(|l| !l.is_empty())
        .unwrap_or("");
    let id = line.split(';').next().unwrap_or("");
    if !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()) {
        Ok(id.to_string())
    } else {
        Err(SlurmError::Unparsable {
            command: "sbatch --parsable",
            output: stdout.to_string(),
        })
    }
}

/// `squeue -h -r --states=all -o '%i|%T|%r'`.
pub fn parse_squeue(stdout: &str) -> Vec<JobRecord> {
    stdout
        .lines()
        .filter_map(|line| {
            let mut fields = line.trim().split('|');
            let id = fields.next()?.trim();
            let state = fields.next()?;
            let reason = fields
                .next()
                .map(str::trim)
                .filter(|r| !r.is_empty() && *r != "None");
            (!id.is_empty()).then(|| JobRecord {
                id: id.to_string(),
                state: JobState::parse(state),
                reason: reason.map(str::to_string),
                exit_code: None,
            })
        })
        .collect()
}

/// `sacct -n -P -X -o JobID,State,ExitCode`. Pending array ranges (`12_[1-3]`) are expanded
/// into one record per task.
pub fn parse_sacct(stdout: &str) -> Vec<JobRecord> {
    let mut records = Vec::new();
    for line in stdout.lines() {
        let mut fields = line.trim().split('|');
        let (Some(id), Some(state)) = (fields.next(), fields.next()) else {
            continue;
        };
        let exit_code = fields
            .next()
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .map(str::to_string);
        let state = JobState::parse(state);
        for id in expand_array_id(id.trim()) {
            records.push(JobRecord {
                id,
                state: state.clone(),
                reason: None,
                exit_code: exit_code.clone(),
            });
        }
    }
    records
}

/// `scontrol -o show job`: one line of `Key=Value` pairs per job. Array tasks are keyed
/// `<ArrayJobId>_<ArrayTaskId>`; a pending meta record (`ArrayTaskId=1-3%1`) expands.
pub fn parse_scontrol(stdout: &str) -> Vec<JobRecord> {
    let mut records = Vec::new();
    for line in stdout.lines() {
        let get = |key: &str| {
            line.split_whitespace()
                .find_map(|kv| kv.strip_prefix(key).and_then(|rest| rest.strip_prefix('=')))
        };
        let Some(job_id) = get("JobId") else { continue };
        let Some(state) = get("JobState") else {
            continue;
        };
        let state = JobState::parse(state);
        let reason = get("Reason").filter(|r| *r != "None").map(str::to_string);
        let exit_code = get("ExitCode").map(str::to_string);
        let ids = match (get("ArrayJobId"), get("ArrayTaskId")) {
            (Some(array), Some(tasks)) => {
                let tasks = tasks.split('%').next().unwrap_or(tasks);
                expand_ranges(tasks)
                    .into_iter()
                    .map(|t| format!("{array}_{t}"))
                    .collect()
            }
            _ => vec![job_id.to_string()],
        };
        for id in ids {
            records.push(JobRecord {
                id,
                state: state.clone(),
                reason: reason.clone(),
                exit_code: exit_code.clone(),
            });
        }
    }
    records
}

/// A job of the user as `squeue -o '%F|%T|%r|%k'` shows it: array job id, state, reason,
/// comment (last, since a comment may hold `|`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommentedJob {
    /// The array's job id (`%F`; a plain job's own id).
    pub array_job_id: String,
    pub state: JobState,
    /// Held by `sbatch --hold` (`JobHeldUser`) and not started.
    pub held: bool,
    pub comment: String,
}

/// `squeue -h --states=all -u <user> -o '%F|%T|%r|%k'`; jobs without a comment are left out.
pub fn parse_commented_jobs(stdout: &str) -> Vec<CommentedJob> {
    stdout
        .lines()
        .filter_map(|line| {
            let mut fields = line.trim_end().splitn(4, '|');
            let id = fields.next()?.trim();
            let state = JobState::parse(fields.next()?);
            let reason = fields.next()?.trim();
            let comment = fields.next()?.trim();
            (!id.is_empty() && !comment.is_empty() && comment != "(null)").then(|| CommentedJob {
                array_job_id: id.to_string(),
                held: state == JobState::Pending && reason == "JobHeldUser",
                state,
                comment: comment.to_string(),
            })
        })
        .collect()
}

/// `12_[1-3,5%2]` → `12_1`, `12_2`, `12_3`, `12_5`; plain ids stay as they are.
fn expand_array_id(id: &str) -> Vec<String> {
    match id.split_once("_[") {
        Some((job, rest)) => {
            let ranges = rest.trim_end_matches(']');
            let ranges = ranges.split('%').next().unwrap_or(ranges);
            expand_ranges(ranges)
                .into_iter()
                .map(|t| format!("{job}_{t}"))
                .collect()
        }
        None => vec![id.to_string()],
    }
}

/// Job ids as Slurm writes a set of them (the inverse of [`expand_array_id`]): each
/// array's tasks as ranges, `74_[0-99] 76_[0-29,31] 80_4 81`, arrays and jobs in id order.
pub fn compact_job_ids(ids: &[String]) -> String {
    let mut arrays: std::collections::BTreeMap<(u64, &str), Vec<u64>> = Default::default();
    let mut plain: Vec<&str> = Vec::new();
    for id in ids {
        match id.split_once('_') {
            Some((job, task)) if task.parse::<u64>().is_ok() => arrays
                .entry((job.parse().unwrap_or(u64::MAX), job))
                .or_default()
                .extend(task.parse::<u64>().ok()),
            _ => plain.push(id),
        }
    }
    let mut out: Vec<(u64, String)> = plain
        .into_iter()
        .map(|id| (id.parse().unwrap_or(u64::MAX), id.to_string()))
        .collect();
    for ((order, job), mut tasks) in arrays {
        tasks.sort_unstable();
        tasks.dedup();
        let text = match tasks.as_slice() {
            [one] => format!("{job}_{one}"),
            _ => {
                let mut ranges: Vec<String> = Vec::new();
                let mut i = 0;
                while i < tasks.len() {
                    let start = tasks[i];
                    while i + 1 < tasks.len() && tasks[i + 1] == tasks[i] + 1 {
                        i += 1;
                    }
                    ranges.push(match tasks[i] {
                        end if end == start => start.to_string(),
                        end => format!("{start}-{end}"),
                    });
                    i += 1;
                }
                format!("{job}_[{}]", ranges.join(","))
            }
        };
        out.push((order, text));
    }
    out.sort();
    out.into_iter()
        .map(|(_, text)| text)
        .collect::<Vec<_>>()
        .join(" ")
}

/// `1-3,5` → 1, 2, 3, 5 (`1-7:2` steps too). Unreadable parts are skipped.
fn expand_ranges(text: &str) -> Vec<u64> {
    let mut out = Vec::new();
    for part in text.split(',') {
        let (range, step) = match part.split_once(':') {
            Some((r, s)) => (r, s.parse().unwrap_or(1).max(1)),
            None => (part, 1),
        };
        match range.split_once('-') {
            Some((a, b)) => {
                if let (Ok(a), Ok(b)) = (a.parse::<u64>(), b.parse::<u64>()) {
                    // Bound the expansion: a corrupt range must not allocate without limit.
                    out.extend((a..=b.min(a + 1_000_000)).step_by(step));
                }
            }
            None => out.extend(range.parse::<u64>().ok()),
        }
    }
    out
}

/// A Slurm memory size (`--mem`, `resources.mem`) in megabytes: whole digits with at most
/// one unit, K, M, G or T in either case (`GB` read as `G`, as sbatch reads it); M when
/// none, as Slurm reads it. `0` is Slurm's "all of the node's memory".
pub fn parse_memory_size(mem: &str) -> Option<u64> {
    let mem = memory_size_for_sbatch(mem);
    let (digits, unit) = match mem.chars().last()?.to_ascii_uppercase() {
        'K' => (&mem[..mem.len() - 1], None),
        'M' => (&mem[..mem.len() - 1], Some(1)),
        'G' => (&mem[..mem.len() - 1], Some(1 << 10)),
        'T' => (&mem[..mem.len() - 1], Some(1 << 20)),
        _ => (mem, Some(1)),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let value: u64 = digits.parse().ok()?;
    match unit {
        Some(megabytes) => value.checked_mul(megabytes),
        None => Some(value.div_ceil(1024)),
    }
}

/// `mem` as the sbatch script writes it: sbatch takes one `B` after the unit's letter, so
/// `200GB` asks for `200G`; the script has the form Slurm documents, `200G`.
pub fn memory_size_for_sbatch(mem: &str) -> &str {
    let mem = mem.trim();
    match mem.strip_suffix(['B', 'b']) {
        Some(unit_written) if unit_written.ends_with(|c: char| "KMGTkmgt".contains(c)) => {
            unit_written
        }
        _ => mem,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_sizes_read_as_slurm_reads_them() {
        assert_eq!(parse_memory_size("900G"), Some(921600));
        assert_eq!(parse_memory_size("4000"), Some(4000));
        assert_eq!(parse_memory_size("512m"), Some(512));
        assert_eq!(parse_memory_size("1t"), Some(1 << 20));
        assert_eq!(parse_memory_size("1500K"), Some(2), "kilobytes round up");
        assert_eq!(parse_memory_size("0"), Some(0));
        assert_eq!(
            parse_memory_size("200GB"),
            Some(200 << 10),
            "sbatch reads 200GB as 200G"
        );
        assert_eq!(parse_memory_size("512mb"), Some(512));
        assert_eq!(memory_size_for_sbatch("200GB"), "200G");
        assert_eq!(memory_size_for_sbatch("64G"), "64G");
        for bad in ["", "G", "GB", "16B", "16GBB", "1.5G", "-1G"] {
            assert_eq!(parse_memory_size(bad), None, "{bad}");
        }
    }

    fn find<'a>(records: &'a [JobRecord], id: &str) -> &'a JobRecord {
        records
            .iter()
            .find(|r| r.id == id)
            .unwrap_or_else(|| panic!("no record {id}"))
    }

    #[test]
    fn sbatch_parsable_with_and_without_cluster() {
        assert_eq!(parse_sbatch_parsable("1234\n").unwrap(), "1234");
        assert_eq!(parse_sbatch_parsable("1234;cluster\n").unwrap(), "1234");
        assert!(parse_sbatch_parsable("").is_err());
        assert!(parse_sbatch_parsable("Submitted batch job 12").is_err());
    }

    #[test]
    fn squeue_recorded_output() {
        let records = parse_squeue(include_str!("testdata/squeue_all.txt"));
        assert_eq!(records.len(), 10);
        assert_eq!(find(&records, "5").state, JobState::Cancelled);
        assert_eq!(find(&records, "1").state, JobState::Completed);
        let failed = find(&records, "4");
        assert_eq!(failed.state, JobState::Failed);
        assert_eq!(failed.reason.as_deref(), Some("NonZeroExitCode"));
        assert_eq!(find(&records, "6_2").state, JobState::Pending);
        assert_eq!(find(&records, "6_0").state, JobState::Running);
    }

    #[test]
    fn scontrol_recorded_output_expands_pending_array_tasks() {
        let records = parse_scontrol(include_str!("testdata/scontrol_show_job.txt"));
        assert_eq!(find(&records, "4").state, JobState::Failed);
        assert_eq!(find(&records, "4").exit_code.as_deref(), Some("3:0"));
        assert_eq!(find(&records, "5").state, JobState::Cancelled);
        assert_eq!(find(&records, "6_0").state, JobState::Running);
        for task in ["6_1", "6_2", "6_3"] {
            assert_eq!(find(&records, task).state, JobState::Pending);
        }
        assert!(!records.iter().any(|r| r.id == "6" || r.id == "7"));
    }

    #[test]
    fn sacct_states_are_reported_as_themselves() {
        // Hand-written in sacct's `-n -P -X -o JobID,State,ExitCode` format (this machine
        // has no slurmdbd to record from).
        let records = parse_sacct(include_str!("testdata/sacct_states.txt"));
        assert_eq!(find(&records, "1234").state, JobState::Completed);
        assert_eq!(find(&records, "1235").state, JobState::Cancelled);
        assert_eq!(find(&records, "1236_0").state, JobState::Timeout);
        assert_eq!(find(&records, "1236_3").state, JobState::Pending);
        assert_eq!(find(&records, "1237").state, JobState::Preempted);
        assert_eq!(find(&records, "1238").state, JobState::OutOfMemory);
        assert_eq!(find(&records, "1239").state, JobState::NodeFail);
        assert_eq!(find(&records, "1240").exit_code.as_deref(), Some("3:0"));
        assert_eq!(find(&records, "1241").state, JobState::Running);
    }

    #[test]
    fn sacct_recorded_output() {
        // Recorded from slurm/start.sh --with-accounting: a COMPLETED job, an `exit 3`, a
        // scancel'ed sleep and a throttled array.
        let records = parse_sacct(include_str!("testdata/sacct_recorded.txt"));
        assert_eq!(find(&records, "1").state, JobState::Completed);
        assert_eq!(find(&records, "2").state, JobState::Failed);
        assert_eq!(find(&records, "2").exit_code.as_deref(), Some("3:0"));
        assert_eq!(find(&records, "3").state, JobState::Cancelled);
        assert_eq!(find(&records, "4_0").state, JobState::Completed);
    }

    #[test]
    fn commented_jobs_recorded() {
        // Recorded: a held array and a running one with shardrun's tags, a job whose comment
        // holds `|`, and one without a comment.
        let jobs = parse_commented_jobs(include_str!("testdata/squeue_comments.txt"));
        assert_eq!(jobs.len(), 5, "{jobs:?}");
        assert!(
            !jobs.iter().any(|j| j.array_job_id == "1"),
            "no comment, left out"
        );
        let held = jobs.iter().find(|j| j.array_job_id == "2").unwrap();
        assert!(held.held);
        assert_eq!(held.comment, "shardrun-sweep:grid:1763880000-4242-2");
        let running = jobs.iter().find(|j| j.array_job_id == "3").unwrap();
        assert!(!running.held);
        assert_eq!(running.state, JobState::Running);
        assert_eq!(
            jobs.iter().find(|j| j.array_job_id == "4").unwrap().comment,
            "a|b c"
        );
    }

    #[test]
    fn ranges_expand() {
        assert_eq!(expand_ranges("1-3,5"), vec![1, 2, 3, 5]);
        assert_eq!(expand_ranges("0-6:3"), vec![0, 3, 6]);
        assert_eq!(expand_array_id("7_[0-2%1]"), vec!["7_0", "7_1", "7_2"]);
        let ids: Vec<String> = [
            "76_31", "74_1", "81", "76_0", "74_0", "80_4", "76_1", "74_2",
        ]
        .into_iter()
        .map(String::from)
        .collect();
        assert_eq!(compact_job_ids(&ids), "74_[0-2] 76_[0-1,31] 80_4 81");
        let round_trip: Vec<String> = compact_job_ids(&ids)
            .split(' ')
            .flat_map(expand_array_id)
            .collect();
        assert_eq!(round_trip.len(), ids.len());
        assert_eq!(expand_array_id("7_4"), vec!["7_4"]);
    }
}
