//! `shardrun completions bash|zsh|fish|elvish|powershell`: a completion script generated
//! from the command-line definition itself, so it never falls behind the commands.
//!
//! ```sh
//! shardrun completions bash > ~/.local/share/bash-completion/completions/shardrun
//! shardrun completions zsh > ~/.zfunc/_shardrun       # with fpath+=(~/.zfunc)
//! shardrun completions fish > ~/.config/fish/completions/shardrun.fish
//! ```

use clap::CommandFactory;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The shell to complete for.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

pub fn execute(args: Args) -> anyhow::Result<()> {
    let mut command = crate::cli::Cli::command();
    // Generated in memory: clap_complete panics when its writer fails.
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut command, "shardrun", &mut script);
    crate::output::write_stdout_bytes(&script);
    Ok(())
}
