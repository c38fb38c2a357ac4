//! Tier gating for tests across the workspace: run NVRTC tests when libnvrtc loads and GPU
//! tests when a device opens; otherwise print `SKIPPED: <test>: <why>` and let the test pass,
//! unless `KFUSE_REQUIRE_NVRTC=1` / `KFUSE_REQUIRE_GPU=1` make absence a failure.
//!
//! These helpers panic on purpose (that is how a required tier fails a test); they are for
//! test code only.

use crate::{nvrtc_version, open_default, Gpu};

fn required(var: &str) -> bool {
    std::env::var(var).map(|v| v.trim() == "1").unwrap_or(false)
}

/// `Some(())` when NVRTC is usable; otherwise prints `SKIPPED:` and returns `None` (or panics
/// when `KFUSE_REQUIRE_NVRTC=1`).
pub fn nvrtc_or_skip(test: &str) -> Option<()> {
    match nvrtc_version() {
        Ok(_) => Some(()),
        Err(why) => {
            if required("KFUSE_REQUIRE_NVRTC") {
                panic!("{test}: NVRTC required (KFUSE_REQUIRE_NVRTC=1) but unavailable: {why}");
            }
            println!("SKIPPED: {test}: {why}");
            None
        }
    }
}

/// The default GPU ([`open_default`]) when one opens; otherwise prints `SKIPPED:` and returns
/// `None` (or panics when `KFUSE_REQUIRE_GPU=1`). Also requires NVRTC, since GPU tests compile.
pub fn gpu_or_skip(test: &str) -> Option<Gpu> {
    let opened = nvrtc_version().and_then(|_| open_default());
    match opened {
        Ok(gpu) => Some(gpu),
        Err(why) => {
            if required("KFUSE_REQUIRE_GPU") {
                panic!("{test}: GPU required (KFUSE_REQUIRE_GPU=1) but unavailable: {why}");
            }
            println!("SKIPPED: {test}: {why}");
            None
        }
    }
}
