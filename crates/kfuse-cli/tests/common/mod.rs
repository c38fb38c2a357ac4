//! What the command-line tests share: the `kfuse` binary under test and its output as text.
//!
//! Each test file uses a part of it, so unused items are expected.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Command, Output};

/// The binary cargo built, or (for test executables copied to a machine without Rust, such as the
/// GPU machine's bundle) the `kfuse` on PATH.
pub fn kfuse_exe() -> PathBuf {
    let built = PathBuf::from(env!("CARGO_BIN_EXE_kfuse"));
    if built.exists() {
        return built;
    }
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|d| d.join("kfuse"))
        .find(|p| p.exists())
        .unwrap_or(built)
}

/// A command for the binary, to add arguments and environment to.
pub fn command() -> Command {
    Command::new(kfuse_exe())
}

/// Runs the binary with `args` in the test's environment.
pub fn kfuse(args: &[&str]) -> Output {
    command().args(args).output().expect("kfuse runs")
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}
