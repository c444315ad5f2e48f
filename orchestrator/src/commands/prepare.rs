//! `shardrun prepare job.yaml`: tokenize the job's data ahead of submission (on the login
//! node), so the job starts training at once; a later run with the same files and tokenizer
//! reuses the cache.

use crate::commands::spec_args::{self, OneJob, SetArgs};
use crate::resolve::Overrides;
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Job spec (YAML), or a run directory (its `job.yaml` is used).
    pub spec: PathBuf,
    /// Tokenization threads (default: every CPU this process may use).
    #[arg(long)]
    pub threads: Option<usize>,
    /// The same `--set` overrides the job will be submitted with.
    #[command(flatten)]
    pub set: SetArgs,
}

pub fn execute(args: Args) -> anyhow::Result<()> {
    let (_, job) = spec_args::load_one_job(&args.spec, &args.set, OneJob::Prepare, |_| {
        Ok(Overrides::default())
    })?;
    for line in crate::data_prep::prepare_data(&job.train, args.threads)? {
        outln!("{line}");
    }
    Ok(())
}
