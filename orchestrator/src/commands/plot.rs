//! `shardrun plot` (placeholder until its owner lands it).

#[derive(Debug, clap::Args)]
pub struct Args {}

pub fn execute(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("`shardrun plot` is not available in this build yet")
}
