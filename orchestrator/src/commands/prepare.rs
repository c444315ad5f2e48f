//! `shardrun prepare job.yaml`: tokenize the job's data ahead of submission (on the login
//! node), so the job starts training at once; a later run with the same files and tokenizer
//! reuses the cache. Every edit of the data leaves a cache folder no run opens again: it
//! says how much they hold, and removes them with `--remove-outdated`.

use crate::commands::spec_args::{self, OneJob, SetArgs};
use crate::resolve::Overrides;
use shardrun_data::outdated;
use shardrun_protocol::config::DataConfig;
use std::path::{Path, PathBuf};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Job spec (YAML), or a run directory (its `job.yaml` is used).
    pub spec: PathBuf,
    /// Tokenization threads (default: every CPU this process may use).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Remove the folders of the data cache built from files that have since been edited,
    /// replaced or removed (no run opens them again).
    #[arg(long)]
    pub remove_outdated: bool,
    /// The same `--set` overrides the job will be submitted with.
    #[command(flatten)]
    pub set: SetArgs,
}

pub fn execute(args: Args) -> anyhow::Result<()> {
    let (_, job) = spec_args::load_one_job(&args.spec, &args.set, OneJob::Prepare, |_| {
        Ok(Overrides::default())
    })?;
    crate::interrupt::on_stop("preparing the data", || {
        let removed = shardrun_data::cache::abandon_builds();
        (!removed.is_empty()).then(|| {
            format!(
                "the cache folder it was building is removed ({}); run the same command to \
                 prepare the data",
                crate::interrupt::listed(&removed)
            )
        })
    })?;
    for line in crate::data_prep::prepare_data(&job.train, args.threads)? {
        outln!("{line}");
    }
    if let DataConfig::Dataset(data) = &job.train.data {
        tell_outdated(&data.cache_dir, &args)?;
    }
    Ok(())
}

/// Says how much the outdated folders of `cache_dir` hold, or removes them.
fn tell_outdated(cache_dir: &Path, args: &Args) -> anyhow::Result<()> {
    let found = outdated::find(cache_dir);
    let mib = |bytes: u64| shardrun_protocol::mib(bytes);
    let total: u64 = found.iter().map(|o| o.bytes).sum();
    if !args.remove_outdated {
        if !found.is_empty() {
            // The same `--set` values: they may name another cache folder.
            let set: String = args.set.set.iter().map(|s| format!(" --set {s}")).collect();
            outln!(
                "data cache: {} folder(s) in {} ({:.1} MiB) hold data since edited or removed \
                 ({}); `shardrun prepare {}{set} --remove-outdated` removes them",
                found.len(),
                cache_dir.display(),
                mib(total),
                found[0].why,
                crate::output::pasteable(&args.spec)
            );
        }
        return Ok(());
    }
    let interrupted = outdated::remove_interrupted(cache_dir);
    if interrupted > 0 {
        outln!(
            "removed what {interrupted} interrupted removal(s) left in {}",
            cache_dir.display()
        );
    }
    for folder in &found {
        outdated::remove(folder)?;
        outln!(
            "removed {} ({:.1} MiB): {}",
            folder.dir.display(),
            mib(folder.bytes),
            folder.why
        );
    }
    outln!(
        "removed {} outdated folder(s) from {} ({:.1} MiB)",
        found.len(),
        cache_dir.display(),
        mib(total)
    );
    let locks = outdated::remove_orphan_locks(cache_dir);
    if locks > 0 {
        outln!(
            "removed {locks} lock file(s) of data no folder holds from {}",
            cache_dir.display()
        );
    }
    Ok(())
}
