//! A process waits for its background compiles before it exits: a job cut off by the exit would
//! run NVRTC or the driver while their libraries are torn down (a crash at exit). Pure tier: the
//! job here sleeps and writes a file instead of compiling.

use std::process::Command;
use std::time::Duration;

use kfuse_runtime::KernelCache;

const CHILD: &str = "KFUSE_EXIT_WAIT_CHILD";

#[test]
fn a_process_waits_for_its_background_compiles_before_it_exits() {
    if let Some(marker) = std::env::var_os(CHILD) {
        // The child: start a job that outlives main's last step, then exit at once.
        let cache = KernelCache::memory_only();
        let _job = cache.in_background(move || {
            std::thread::sleep(Duration::from_millis(300));
            let _ = std::fs::write(&marker, b"done");
            Ok(())
        });
        std::process::exit(0);
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let marker = dir.path().join("marker");
    let status = Command::new(std::env::current_exe().expect("the test binary"))
        .args(["--exact", "a_process_waits_for_its_background_compiles_before_it_exits", "--test-threads=1"])
        .env(CHILD, &marker)
        .status()
        .expect("the child runs");
    assert!(status.success(), "the child exited with {status}");
    let written = std::fs::read(&marker).unwrap_or_default();
    assert_eq!(written, b"done", "the exit did not wait for the background job");
}
