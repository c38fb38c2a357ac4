//! What the cache tests share: the `kfuse-cache-probe` binary they start as a second process.

use std::path::PathBuf;

/// The probe binary: where cargo built it, or (for test executables copied to a machine without
/// Rust, such as the GPU machine's bundle) the copy on PATH.
pub fn probe_exe() -> PathBuf {
    let built = PathBuf::from(env!("CARGO_BIN_EXE_kfuse-cache-probe"));
    if built.exists() {
        return built;
    }
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|d| d.join("kfuse-cache-probe"))
        .find(|p| p.exists())
        .unwrap_or(built)
}
