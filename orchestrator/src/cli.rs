//! Command-line definition: raw arguments become one typed [`Command`], dispatched to the
//! module of the same name in [`crate::commands`].

use crate::{commands, output};
use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "shardrun",
    version,
    about = "Fully sharded data-parallel training on Slurm clusters and on one machine",
    long_about = "Plan, render, submit and follow FSDP training jobs described by one YAML file.\n\
                  Start with `shardrun plan job.yaml`, try it locally with `shardrun run job.yaml`,\n\
                  submit it with `shardrun submit job.yaml`."
)]
pub struct Cli {
    /// Show diagnostics on stderr (-v info, -vv debug, -vvv trace), for this command and
    /// every process it starts (sets RUST_LOG; ranks write theirs to logs/rank-N.debug.log).
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Check a job spec and print the resolved plan (world size, accumulation, memory).
    Plan(commands::plan::Args),
    /// Tokenize the job's data into its cache now (on the login node), before submitting.
    Prepare(commands::prepare::Args),
    /// Print the sbatch script a job spec renders to.
    Render(commands::render::Args),
    /// Validate, create the run directory and submit the job with sbatch.
    Submit(commands::submit::Args),
    /// Expand the spec's sweep and submit new, changed or failed points as job arrays within
    /// the cluster's limits.
    Sweep(commands::sweep::Args),
    /// Show the state of runs (one batched squeue/sacct query).
    Status(commands::status::Args),
    /// Cancel a run: its Slurm job, or SIGTERM to the controller of a local run.
    Cancel(commands::cancel::Args),
    /// Run the whole job on this machine (N CPU ranks or local GPUs), no Slurm needed.
    Run(commands::run::Args),
    /// Print (or follow with -f) a run's merged train.log.
    Logs(commands::logs::Args),
    /// Latest metrics of a run, or of every run of a sweep, as a table.
    Metrics(commands::metrics::Args),
    /// Draw loss and throughput curves of a run as PNG or SVG.
    Plot(commands::plot::Args),
    /// Export a checkpoint: a Hugging Face folder (Llama family) or a full
    /// `model.safetensors` (no GPU needed).
    Export(commands::export::Args),
    /// Print a completion script for a shell: `shardrun completions bash > ...`.
    Completions(commands::completions::Args),
    /// The in-allocation job controller started by the rendered sbatch script.
    #[command(hide = true)]
    Controller(commands::controller::Args),
}

pub fn run(cli: Cli) -> anyhow::Result<()> {
    // A job's outcome is the job's own, whatever became of stdout (train.log has every line).
    let judged_by_output = !matches!(cli.command, Command::Run(_) | Command::Controller(_));
    let result = match cli.command {
        Command::Plan(args) => commands::plan::execute(args),
        Command::Prepare(args) => commands::prepare::execute(args),
        Command::Render(args) => commands::render::execute(args),
        Command::Submit(args) => commands::submit::execute(args),
        Command::Sweep(args) => commands::sweep::execute(args),
        Command::Status(args) => commands::status::execute(args),
        Command::Cancel(args) => commands::cancel::execute(args),
        Command::Run(args) => commands::run::execute(args),
        Command::Logs(args) => commands::logs::execute(args),
        Command::Metrics(args) => commands::metrics::execute(args),
        Command::Plot(args) => commands::plot::execute(args),
        Command::Export(args) => commands::export::execute(args),
        Command::Completions(args) => commands::completions::execute(args),
        Command::Controller(args) => commands::controller::execute(args),
    };
    if let (Ok(()), Some(error), true) = (&result, output::stdout_failure(), judged_by_output) {
        anyhow::bail!("cannot write to stdout: {error}");
    }
    result
}
