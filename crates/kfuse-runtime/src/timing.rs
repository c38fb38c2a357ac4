//! Opt-in timing breakdown on stderr (`KFUSE_LOG_TIMING=1`): where the first run of a fresh
//! process spends its time (context creation, NVRTC loading, cache reads, module loads,
//! allocations, copies, launches). Host wall-clock only; it never synchronises the device
//! itself, so an asynchronous call is charged to whichever later call waits for it.

use std::sync::OnceLock;
use std::time::Instant;

/// Whether `KFUSE_LOG_TIMING=1` is set (read once per process).
pub fn enabled() -> bool {
    static ENABLED: OnceLock<bool> = OnceLock::new();
    *ENABLED.get_or_init(|| std::env::var("KFUSE_LOG_TIMING").map(|v| v.trim() == "1").unwrap_or(false))
}

/// Prints `kfuse: timing: <what>: <ms> ms` for the time since `started`, when enabled.
pub fn log(what: &str, started: Instant) {
    if enabled() {
        eprintln!("kfuse: timing: {what}: {:.3} ms", started.elapsed().as_secs_f64() * 1e3);
    }
}
