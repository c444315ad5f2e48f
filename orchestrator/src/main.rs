//! `shardrun`: thin binary over the `shardrun` library. Errors are printed in one place.

#![deny(clippy::print_stdout, clippy::print_stderr)]

use clap::Parser;

fn main() {
    let cli = shardrun::cli::Cli::parse();
    shardrun::diagnostics::init(cli.verbose);
    let ran = shardrun::cli::run(cli);
    // A stop signal's removal of what the command was writing often fails it (its file
    // is gone), or comes as it ends: the signal's own ending says what happened.
    shardrun::interrupt::wait_if_stopping();
    if let Err(err) = ran {
        if shardrun::exit::should_print(&err) {
            shardrun::errln!("error: {}", shardrun::exit::message(&err));
        }
        std::process::exit(shardrun::exit::exit_code(&err));
    }
}
