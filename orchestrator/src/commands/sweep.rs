//! `shardrun sweep` (placeholder until its owner lands it).

#[derive(Debug, clap::Args)]
pub struct Args {}

pub fn execute(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("`shardrun sweep` is not available in this build yet")
}
