//! Running the `shardrun` binary in a test's folder, shared by the tests that drive it.

#![allow(dead_code)] // each test binary uses some of these

use std::path::Path;
use std::process::{Command, Output};

pub const SHARDRUN: &str = env!("CARGO_BIN_EXE_shardrun");

/// A temporary folder holding the spec `file` with `yaml` in it, for commands run there.
pub fn spec_dir(file: &str, yaml: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("create a temporary folder");
    std::fs::write(dir.path().join(file), yaml).expect("write the spec");
    dir
}

/// `shardrun args...` in `dir`.
pub fn shardrun(dir: &Path, args: &[&str]) -> Output {
    shardrun_with(dir, args, &[])
}

/// `shardrun args...` in `dir` with extra environment variables.
pub fn shardrun_with(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(SHARDRUN)
        .current_dir(dir)
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("run shardrun")
}

/// Stdout then stderr.
pub fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}
