//! Opt-in timing breakdown on stderr (`KFUSE_LOG_TIMING=1`): where the first run of a fresh
//! process spends its time (context creation, NVRTC loading, cache reads, module loads,
//! allocations, copies, launches). Host wall-clock only; it never synchronises the device
//! itself, so an asynchronous call is charged to whichever later call waits for it.

use std::sync::OnceLock;
use std::time::Instant;

/// Whether `KFUSE_LOG_TIMING` is on (read once per process; see [`crate::env::flag`]). An
/// invalid value is an error of [`crate::CacheConfig::from_env`], so of `Engine::new` and the
/// command-line tool; here, where no error can be returned, it is warned about once and off.
pub fn enabled() -> bool {
    static ENABLED: OnceLock<bool> = OnceLock::new();
    *ENABLED.get_or_init(|| {
        crate::env::flag("KFUSE_LOG_TIMING").unwrap_or_else(|e| {
            eprintln!("kfuse: warning: {e}; the timing log stays off");
            false
        })
    })
}

/// Prints `kfuse: timing: <what>: <ms> ms` for the time since `started`, when enabled.
pub fn log(what: &str, started: Instant) {
    if enabled() {
        eprintln!("kfuse: timing: {what}: {:.3} ms", started.elapsed().as_secs_f64() * 1e3);
    }
}
