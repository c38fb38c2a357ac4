//! Tier gating for tests across the workspace: run NVRTC tests when libnvrtc loads and GPU
//! tests when a device opens; otherwise write `SKIPPED #<n> (<tier> tier): <test>: <why>` on stderr
//! (past the test harness's capture, so a plain `cargo test` shows it) and let the test pass,
//! unless `KFUSE_REQUIRE_NVRTC=1` / `KFUSE_REQUIRE_GPU=1` make absence a failure.
//!
//! A skipped test passes, so a summary could not tell it from one that ran. When `KFUSE_SKIP_LOG`
//! names a file, every skip also appends one line `<tier>\t<package>/<target>::<test>\t<why>` to
//! it (tier `nvrtc` or `gpu`; tabs and line breaks in the reason become spaces), which `.ci/run`
//! counts and lists at the end of its run.
//!
//! These helpers panic on purpose (that is how a required tier fails a test); they are for
//! test code only.

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use crate::{nvrtc_version, open_default, Gpu};

/// Whether the tier gate `var` is on; an invalid value panics with the variable's error (this is
/// test code: a misspelt requirement must not pass as "not required").
fn required(var: &'static str) -> bool {
    crate::env::flag(var).unwrap_or_else(|e| panic!("{e}"))
}

/// Skips so far in this test executable (each line numbers its skip, so the highest number is
/// the executable's count).
static SKIPS: AtomicUsize = AtomicUsize::new(0);
/// Whether this test executable has already shown why its NVRTC / GPU tier tests skip.
static REASON_SHOWN: [AtomicBool; 2] = [AtomicBool::new(false), AtomicBool::new(false)];

/// Shows the `SKIPPED:` line and appends `tier\ttest\twhy` to the file `KFUSE_SKIP_LOG` names,
/// if any. A log that cannot be written is reported on stderr and does not fail the test.
///
/// The line goes to the process's stderr directly, not through `println!`/`eprintln!`, which the
/// test harness captures (and shows only for failing tests): a plain `cargo test` shows every
/// skip. The first skip of a tier in a test executable gives the reason; later ones refer to it.
fn record_skip(tier: &str, test: &str, why: &dyn std::fmt::Display) {
    let shown = &REASON_SHOWN[usize::from(tier == "gpu")];
    let n = SKIPS.fetch_add(1, Ordering::Relaxed) + 1;
    let line = if shown.swap(true, Ordering::Relaxed) {
        format!("SKIPPED #{n} ({tier} tier, reason as above): {}{test}\n", test_target())
    } else {
        format!("SKIPPED #{n} ({tier} tier): {}{test}: {why}\n", test_target())
    };
    // One write of a whole line: concurrent tests' lines stay whole. A closed stderr is no failure.
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
    let Some(path) = std::env::var_os("KFUSE_SKIP_LOG").filter(|p| !p.is_empty()) else {
        return;
    };
    let why: String =
        why.to_string().chars().map(|c| if c == '\t' || c == '\n' || c == '\r' { ' ' } else { c }).collect();
    let line = format!("{tier}\t{}{test}\t{why}\n", test_target());
    // One write of a short line to a file opened for appending: concurrent tests' lines stay whole.
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut file| file.write_all(line.as_bytes()));
    if let Err(err) = written {
        eprintln!("KFUSE_SKIP_LOG: cannot append to {}: {err}", std::path::Path::new(&path).display());
    }
}

/// `package/target::` for the running test executable (e.g. `kfuse-runtime/gpu::`), so that
/// tests of the same name in two places stay apart in the log; empty when unknown. Cargo sets
/// `CARGO_PKG_NAME` for the tests it runs; the target is the executable's name without its hash.
fn test_target() -> String {
    let package = std::env::var("CARGO_PKG_NAME").unwrap_or_default();
    let exe = std::env::current_exe().ok().and_then(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()));
    let target = exe.map(|e| match e.rsplit_once('-') {
        Some((name, hash)) if hash.len() == 16 && hash.chars().all(|c| c.is_ascii_hexdigit()) => name.to_string(),
        _ => e,
    });
    match (package.is_empty(), target) {
        (false, Some(t)) => format!("{package}/{t}::"),
        (true, Some(t)) => format!("{t}::"),
        (false, None) => format!("{package}::"),
        (true, None) => String::new(),
    }
}

/// `Some(())` when NVRTC is usable; otherwise shows a `SKIPPED` line (and logs the skip, see the
/// module docs) and returns `None`, or panics when `KFUSE_REQUIRE_NVRTC=1`.
pub fn nvrtc_or_skip(test: &str) -> Option<()> {
    match nvrtc_version() {
        Ok(_) => Some(()),
        Err(why) => {
            if required("KFUSE_REQUIRE_NVRTC") {
                panic!("{test}: NVRTC required (KFUSE_REQUIRE_NVRTC=1) but unavailable: {why}");
            }
            record_skip("nvrtc", test, &why);
            None
        }
    }
}

/// The default GPU ([`open_default`]) when one opens; otherwise shows a `SKIPPED` line (and logs the
/// skip, see the module docs) and returns `None`, or panics when `KFUSE_REQUIRE_GPU=1`. Also
/// requires NVRTC, since GPU tests compile.
pub fn gpu_or_skip(test: &str) -> Option<Gpu> {
    let opened = nvrtc_version().and_then(|_| open_default());
    match opened {
        Ok(gpu) => Some(gpu),
        Err(why) => {
            if required("KFUSE_REQUIRE_GPU") {
                panic!("{test}: GPU required (KFUSE_REQUIRE_GPU=1) but unavailable: {why}");
            }
            record_skip("gpu", test, &why);
            None
        }
    }
}
