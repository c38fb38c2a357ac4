//! Kernel cache tests (NVRTC tier: compilation needs libnvrtc, not a GPU). Every test uses its
//! own temporary cache folder; compiles are counted, never timed.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Barrier};

mod common;
use common::probe_exe;
use kfuse_runtime::testing::nvrtc_or_skip;
use kfuse_runtime::{
    Arch, CacheConfig, CacheMode, CacheOutcome, CompileOptions, CompiledModule, KernelCache, VerifyAction,
};

const MAX: u64 = 1 << 30;

fn source(variant: u32) -> String {
    format!(
        "extern \"C\" __global__ void k(float* out, const float* x, long long n) {{\n    \
         long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n    \
         if (i < n) {{ out[i] = x[i] * {variant}.25f; }}\n}}\n"
    )
}

fn sm90() -> CompileOptions {
    CompileOptions::for_arch(Arch::new(9, 0))
}

fn entry_path(cache: &KernelCache, src: &str, opts: &CompileOptions) -> PathBuf {
    cache.entry_path(src, opts).expect("key computes").expect("cache has a folder")
}

#[test]
fn second_identical_build_performs_no_compile() {
    let Some(()) = nvrtc_or_skip("second_identical_build_performs_no_compile") else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let cache = KernelCache::with_dir(dir.path(), MAX);
    let (first, outcome) = cache.get_or_compile(&source(1), &sm90()).expect("compiles");
    assert_eq!(outcome, CacheOutcome::Compiled);
    let (second, outcome) = cache.get_or_compile(&source(1), &sm90()).expect("cached");
    assert_eq!(outcome, CacheOutcome::MemoryHit);
    assert!(Arc::ptr_eq(&first, &second));
    assert_eq!(cache.stats().session.compiles, 1);
    assert_eq!(cache.stats().session.memory_hits, 1);

    // A new process (a fresh cache on the same folder) reads the disk entry.
    let fresh = KernelCache::with_dir(dir.path(), MAX);
    let (from_disk, outcome) = fresh.get_or_compile(&source(1), &sm90()).expect("from disk");
    assert_eq!(outcome, CacheOutcome::DiskHit);
    assert_eq!(*from_disk, *first);
    assert_eq!(fresh.stats().session.compiles, 0);
    let stats = fresh.stats();
    assert_eq!((stats.persisted.compiles, stats.persisted.disk_hits), (1, 1));
    assert_eq!(stats.entries, 1);
    assert!(stats.bytes > first.cubin.len() as u64);
    // The source is kept beside the entry for debugging.
    let src_path = entry_path(&fresh, &source(1), &sm90()).with_extension("cu");
    assert_eq!(fs::read_to_string(src_path).expect("source beside entry"), source(1));
}

#[test]
fn a_change_to_any_key_part_misses() {
    let Some(()) = nvrtc_or_skip("a_change_to_any_key_part_misses") else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let cache = KernelCache::with_dir(dir.path(), MAX);
    let base = sm90();
    let with_extra = CompileOptions { extra: vec!["-DKFUSE_UNUSED=1".to_string()], ..sm90() };
    let other_arch = CompileOptions::for_arch(Arch::new(8, 0));
    let mut keys = Vec::new();
    for (src, opts) in [(source(1), &base), (source(2), &base), (source(1), &with_extra), (source(1), &other_arch)] {
        let (module, outcome) = cache.get_or_compile(&src, opts).expect("compiles");
        assert_eq!(outcome, CacheOutcome::Compiled, "{:?}", opts);
        assert!(!keys.contains(&module.key));
        keys.push(module.key);
    }
    assert_eq!(cache.stats().session.compiles, 4);
    assert_eq!(cache.list().expect("list").len(), 4);
    // NVRTC, kfuse and format versions are covered by key::tests (they cannot vary here).
}

#[test]
fn threads_asking_for_the_same_new_kernel_compile_it_once() {
    let Some(()) = nvrtc_or_skip("threads_asking_for_the_same_new_kernel_compile_it_once") else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let cache = Arc::new(KernelCache::with_dir(dir.path(), MAX));
    let barrier = Arc::new(Barrier::new(8));
    let handles: Vec<_> = (0..8)
        .map(|_| {
            let (cache, barrier) = (cache.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                cache.get_or_compile(&source(3), &sm90()).map(|(m, o)| (m.key, o))
            })
        })
        .collect();
    let results: Vec<_> = handles.into_iter().map(|h| h.join().expect("thread").expect("compiles")).collect();
    let compiled = results.iter().filter(|(_, o)| *o == CacheOutcome::Compiled).count();
    let hits = results.iter().filter(|(_, o)| *o == CacheOutcome::MemoryHit).count();
    assert_eq!((compiled, hits), (1, 7), "{results:?}");
    assert!(results.iter().all(|(k, _)| *k == results[0].0));
    assert_eq!(cache.stats().session.compiles, 1);
}

#[test]
fn sixteen_processes_on_an_empty_folder_compile_once() {
    let Some(()) = nvrtc_or_skip("sixteen_processes_on_an_empty_folder_compile_once") else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let cache_dir = dir.path().join("cache");
    let start = dir.path().join("start");
    let probes: Vec<_> = (0..16)
        .map(|_| {
            Command::new(probe_exe())
                .arg("--dir")
                .arg(&cache_dir)
                .arg("--start-file")
                .arg(&start)
                .arg("--variant")
                .arg("16")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("probe starts")
        })
        .collect();
    fs::write(&start, b"go").expect("release the probes");
    let mut outcomes = Vec::new();
    let mut keys = Vec::new();
    let mut cubins = Vec::new();
    for probe in probes {
        let output = probe.wait_with_output().expect("probe runs");
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "probe failed: {}", String::from_utf8_lossy(&output.stderr));
        let line: serde_json::Value = serde_json::from_str(stdout.trim()).expect("probe prints JSON");
        outcomes.push(line["outcome"].as_str().expect("outcome").to_string());
        keys.push(line["key"].as_str().expect("key").to_string());
        cubins.push(line["cubin_blake3"].as_str().expect("cubin hash").to_string());
    }
    let compiled = outcomes.iter().filter(|o| *o == "Compiled").count();
    let disk_hits = outcomes.iter().filter(|o| *o == "DiskHit").count();
    assert_eq!((compiled, disk_hits), (1, 15), "{outcomes:?}");
    assert!(keys.iter().all(|k| *k == keys[0]));
    assert!(cubins.iter().all(|c| *c == cubins[0]));
    let stats = KernelCache::with_dir(&cache_dir, MAX).stats();
    assert_eq!((stats.persisted.compiles, stats.persisted.disk_hits, stats.entries), (1, 15, 1));
}

/// Populates a fresh folder with one entry and returns (folder, module, entry path).
fn populated() -> (tempfile::TempDir, CompiledModule, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let cache = KernelCache::with_dir(dir.path(), MAX);
    let (module, outcome) = cache.get_or_compile(&source(5), &sm90()).expect("compiles");
    assert_eq!(outcome, CacheOutcome::Compiled);
    let path = entry_path(&cache, &source(5), &sm90());
    assert!(path.exists());
    (dir, (*module).clone(), path)
}

fn corruptions(original: &[u8], foreign_entry: &[u8]) -> Vec<(&'static str, Vec<u8>)> {
    let mut flipped_payload = original.to_vec();
    let last = flipped_payload.len() - 1;
    flipped_payload[last / 2] ^= 0x10;
    let mut flipped_header = original.to_vec();
    flipped_header[12] ^= 0x01; // the arch field
    vec![
        ("truncated", original[..original.len() / 2].to_vec()),
        ("truncated by one byte", original[..original.len() - 1].to_vec()),
        ("bit-flipped payload", flipped_payload),
        ("bit-flipped header", flipped_header),
        ("emptied", Vec::new()),
        ("foreign text", b"this is not a kernel, it is a shopping list\n".repeat(20)),
        ("another key's entry", foreign_entry.to_vec()),
    ]
}

#[test]
fn damaged_entries_are_detected_repaired_and_reported_never_loaded() {
    let Some(()) = nvrtc_or_skip("damaged_entries_are_detected_repaired_and_reported") else { return };
    let (_other_dir, _, other_path) = {
        let dir = tempfile::tempdir().expect("tempdir");
        let cache = KernelCache::with_dir(dir.path(), MAX);
        cache.get_or_compile(&source(6), &sm90()).expect("compiles");
        let path = entry_path(&cache, &source(6), &sm90());
        (dir, (), path)
    };
    let foreign_entry = fs::read(&other_path).expect("other entry");
    let (dir, module, path) = populated();
    let original = fs::read(&path).expect("entry");
    for (what, bytes) in corruptions(&original, &foreign_entry) {
        fs::write(&path, &bytes).expect("corrupt");
        if what == "foreign text" {
            // Not kfuse's by its header: compiled, never replaced.
            let cache = KernelCache::with_dir(dir.path(), MAX);
            let (got, outcome) = cache.get_or_compile(&source(5), &sm90()).expect("compiles");
            assert_eq!((outcome, &*got), (CacheOutcome::Compiled, &module), "{what}");
            assert_eq!(fs::read(&path).expect("left alone"), bytes, "{what}: a file that is not kfuse's was replaced");
            continue;
        }
        let cache = KernelCache::with_dir(dir.path(), MAX);
        let (got, outcome) = cache.get_or_compile(&source(5), &sm90()).expect("recompiles");
        assert_eq!(outcome, CacheOutcome::Repaired, "{what}");
        assert_eq!(*got, module, "{what}: repaired module differs from the original");
        assert_eq!(cache.stats().session.repairs, 1, "{what}");
        assert_eq!(fs::read(&path).expect("rewritten"), original, "{what}: entry not rewritten");
        let after = KernelCache::with_dir(dir.path(), MAX);
        let (_, outcome) = after.get_or_compile(&source(5), &sm90()).expect("reads");
        assert_eq!(outcome, CacheOutcome::DiskHit, "{what}: not repaired on disk");
    }
    let expected_repairs = corruptions(&original, &foreign_entry).len() as u64 - 1;
    assert_eq!(KernelCache::with_dir(dir.path(), MAX).stats().persisted.repairs, expected_repairs);
}

#[test]
fn verify_removes_bad_entries_and_leaves_foreign_files_alone() {
    let Some(()) = nvrtc_or_skip("verify_removes_bad_entries_and_leaves_foreign_files_alone") else { return };
    let (dir, _, path) = populated();
    let cache = KernelCache::with_dir(dir.path(), MAX);
    cache.get_or_compile(&source(7), &sm90()).expect("second entry");
    let good = entry_path(&cache, &source(7), &sm90());
    let original = fs::read(&path).expect("entry");
    for (what, bytes) in corruptions(&original, b"") {
        fs::write(&path, &bytes).expect("corrupt");
        let stray_root = dir.path().join("notes.txt");
        let stray_arch = path.with_file_name("random.bin");
        fs::write(&stray_root, b"hello").expect("stray");
        fs::write(&stray_arch, b"\x7fELF").expect("stray");
        let report = cache.verify().expect("verify runs");
        let ours = what != "foreign text";
        assert_eq!((report.checked, report.valid), (1 + u64::from(ours), 1), "{what}: {report:?}");
        let action = |p: &Path| report.problems.iter().find(|q| q.path == p).map(|q| q.action.clone());
        for stray in [&stray_root, &stray_arch] {
            assert_eq!(action(stray), Some(VerifyAction::LeftAlone), "{what}: {report:?}");
            assert!(stray.exists(), "{what}: {} is not kfuse's but was removed", stray.display());
        }
        if ours {
            assert_eq!(action(&path), Some(VerifyAction::Removed), "{what}: {report:?}");
            assert!(!path.exists(), "{what}: bad entry kept");
            assert!(!path.with_extension("cu").exists(), "{what}: source of a bad entry kept");
        } else {
            assert_eq!(action(&path), Some(VerifyAction::LeftAlone), "{what}: {report:?}");
            assert_eq!(fs::read(&path).expect("kept"), bytes, "{what}: not kfuse's, must be left alone");
            fs::remove_file(&path).expect("the test removes it");
        }
        assert!(good.exists(), "{what}: a valid entry was removed");
        // The next lookup recompiles and rewrites it.
        let (_, outcome) =
            KernelCache::with_dir(dir.path(), MAX).get_or_compile(&source(5), &sm90()).expect("recompiles");
        assert_eq!(outcome, CacheOutcome::Compiled, "{what}");
    }
    let clean = cache.verify().expect("verify runs");
    let not_left_alone: Vec<_> = clean.problems.iter().filter(|p| p.action != VerifyAction::LeftAlone).collect();
    assert!(not_left_alone.is_empty(), "{clean:?}");
}

#[test]
fn unwritable_cache_folder_still_gives_correct_results() {
    let Some(()) = nvrtc_or_skip("unwritable_cache_folder_still_gives_correct_results") else { return };
    let reference = kfuse_runtime::compile(&source(8), &sm90()).expect("compiles");
    // A folder that can never be created: its parent is a file (works even as root).
    let dir = tempfile::tempdir().expect("tempdir");
    let blocker = dir.path().join("file");
    fs::write(&blocker, b"x").expect("file");
    let cache = KernelCache::with_dir(blocker.join("cache"), MAX);
    for expected in [CacheOutcome::Compiled, CacheOutcome::MemoryHit] {
        let (module, outcome) = cache.get_or_compile(&source(8), &sm90()).expect("no error");
        assert_eq!(outcome, expected);
        assert_eq!(*module, reference);
    }
    assert_eq!(cache.stats().session.write_failures, 1);
}

#[cfg(unix)]
#[test]
fn read_only_cache_folder_still_gives_correct_results() {
    use std::os::unix::fs::PermissionsExt;
    let Some(()) = nvrtc_or_skip("read_only_cache_folder_still_gives_correct_results") else { return };
    let (dir, module, _) = populated();
    let set_mode = |mode: u32| {
        for path in [dir.path().to_path_buf(), dir.path().join("sm_90"), dir.path().join("sm_90/locks")] {
            fs::set_permissions(&path, fs::Permissions::from_mode(mode)).expect("chmod");
        }
    };
    set_mode(0o555);
    let probe = dir.path().join("sm_90/write-probe");
    let enforced = fs::write(&probe, b"x").is_err();
    let _ = fs::remove_file(&probe);
    let cache = KernelCache::with_dir(dir.path(), MAX);
    let (got, outcome) = cache.get_or_compile(&source(5), &sm90()).expect("reads");
    assert_eq!((outcome, &*got), (CacheOutcome::DiskHit, &module));
    let (got, outcome) = cache.get_or_compile(&source(9), &sm90()).expect("compiles anyway");
    assert_eq!(outcome, CacheOutcome::Compiled);
    assert_eq!(*got, kfuse_runtime::compile(&source(9), &sm90()).expect("compiles"));
    if enforced {
        assert_eq!(cache.stats().session.write_failures, 1);
    } else {
        println!("note: read_only_cache_folder: permissions are not enforced for this user (root); the unwritable-folder test covers failed writes");
    }
    set_mode(0o755);
}

#[test]
fn size_cap_evicts_least_recently_used_entries() {
    let Some(()) = nvrtc_or_skip("size_cap_evicts_least_recently_used_entries") else { return };
    let probe_dir = tempfile::tempdir().expect("tempdir");
    let probe = KernelCache::with_dir(probe_dir.path(), MAX);
    probe.get_or_compile(&source(10), &sm90()).expect("compiles");
    let one = probe.stats().bytes;
    // Room for two entries, not three.
    let dir = tempfile::tempdir().expect("tempdir");
    let cap = one * 5 / 2;
    let cache = KernelCache::with_dir(dir.path(), cap);
    let pause = || std::thread::sleep(std::time::Duration::from_millis(30));
    cache.get_or_compile(&source(10), &sm90()).expect("a");
    pause();
    cache.get_or_compile(&source(11), &sm90()).expect("b");
    pause();
    // Use `a` again from disk (a new process), making `b` the least recently used.
    let (_, outcome) = KernelCache::with_dir(dir.path(), cap).get_or_compile(&source(10), &sm90()).expect("a");
    assert_eq!(outcome, CacheOutcome::DiskHit);
    pause();
    cache.get_or_compile(&source(12), &sm90()).expect("c");
    let stats = cache.stats();
    assert!(stats.bytes <= cap, "{} bytes over the {cap}-byte cap", stats.bytes);
    assert_eq!(stats.session.evictions, 1);
    assert!(entry_path(&cache, &source(10), &sm90()).exists(), "recently used entry evicted");
    assert!(!entry_path(&cache, &source(11), &sm90()).exists(), "LRU entry kept");
    assert!(entry_path(&cache, &source(12), &sm90()).exists(), "new entry evicted");
}

#[test]
fn list_and_clear() {
    let Some(()) = nvrtc_or_skip("list_and_clear") else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let cache = KernelCache::with_dir(dir.path(), MAX);
    let (a, _) = cache.get_or_compile(&source(13), &sm90()).expect("a");
    let (b, _) = cache.get_or_compile(&source(13), &CompileOptions::for_arch(Arch::new(8, 0))).expect("b");
    let listed = cache.list().expect("list");
    assert_eq!(listed.len(), 2);
    for module in [&a, &b] {
        let entry = listed.iter().find(|e| e.key == module.key).expect("listed");
        assert_eq!(entry.arch, module.arch);
        assert!(entry.bytes > module.cubin.len() as u64);
    }
    let cleared = cache.clear().expect("clear");
    assert_eq!(cleared.entries, 2);
    assert!(cache.list().expect("list").is_empty());
    assert_eq!(cache.stats().entries, 0);
    let (_, outcome) = cache.get_or_compile(&source(13), &sm90()).expect("recompiles");
    assert_eq!(outcome, CacheOutcome::Compiled, "clear must empty the memory tier too");
}

#[test]
fn bypass_compiles_every_time_and_writes_nothing() {
    let Some(()) = nvrtc_or_skip("bypass_compiles_every_time_and_writes_nothing") else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let cache = KernelCache::new(CacheConfig {
        dir: Some(dir.path().to_path_buf()),
        max_bytes: MAX,
        mode: CacheMode::Bypassed,
        log_compiles: false,
    });
    for _ in 0..2 {
        let (_, outcome) = cache.get_or_compile(&source(14), &sm90()).expect("compiles");
        assert_eq!(outcome, CacheOutcome::Compiled);
    }
    assert_eq!(cache.stats().session.compiles, 2);
    assert_eq!(fs::read_dir(dir.path()).expect("dir").count(), 0);
}

#[test]
fn compile_errors_are_not_cached() {
    let Some(()) = nvrtc_or_skip("compile_errors_are_not_cached") else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let cache = KernelCache::with_dir(dir.path(), MAX);
    for _ in 0..2 {
        let err = cache.get_or_compile("extern \"C\" __global__ void k( {", &sm90()).expect_err("fails");
        assert!(matches!(err, kfuse_runtime::RuntimeError::Compile { .. }), "{err}");
    }
    assert_eq!(cache.stats().entries, 0);
}

/// Root ignores folder permissions, so the read-only case is also run as an unprivileged user
/// (`setpriv`, util-linux) in a probe process: a pre-warmed folder it can only read gives a disk
/// hit, and a new kernel still compiles, with nothing written.
#[cfg(unix)]
#[test]
fn read_only_cache_folder_as_an_unprivileged_user() {
    use std::os::unix::fs::PermissionsExt;
    let Some(()) = nvrtc_or_skip("read_only_cache_folder_as_an_unprivileged_user") else { return };
    let root = tempfile::tempdir().expect("tempdir");
    let probe = |dir: &std::path::Path, variant: u32, as_nobody: bool| {
        let mut cmd = if as_nobody {
            let mut c = Command::new("setpriv");
            c.args(["--reuid=65534", "--regid=65534", "--clear-groups"]).arg(probe_exe());
            c
        } else {
            Command::new(probe_exe())
        };
        cmd.arg("--dir").arg(dir).args(["--variant", &variant.to_string()]).output()
    };
    let dir = root.path().join("cache");
    let warm = probe(&dir, 7, false).expect("probe runs");
    assert!(warm.status.success(), "{}", String::from_utf8_lossy(&warm.stderr));
    let mut paths = vec![root.path().to_path_buf()];
    for e in walk(&dir) {
        paths.push(e);
    }
    for p in &paths {
        let mode = if p.is_dir() { 0o555 } else { 0o444 };
        fs::set_permissions(p, fs::Permissions::from_mode(mode)).expect("chmod");
    }
    let entries_before = walk(&dir).len();
    let hit = probe(&dir, 7, true);
    let restore = || {
        for p in &paths {
            let _ = fs::set_permissions(p, fs::Permissions::from_mode(0o755));
        }
    };
    let hit = match hit {
        Ok(out) if out.status.success() => out,
        Ok(out) => {
            restore();
            let err = String::from_utf8_lossy(&out.stderr);
            if err.contains("setpriv") || err.contains("Permission denied") || out.status.code() == Some(126) {
                println!("SKIPPED: read_only_cache_folder_as_an_unprivileged_user: cannot run the probe as an unprivileged user here: {err}");
                return;
            }
            panic!("probe as nobody failed on a read-only cache: {err}");
        }
        Err(e) => {
            restore();
            println!("SKIPPED: read_only_cache_folder_as_an_unprivileged_user: setpriv unavailable: {e}");
            return;
        }
    };
    let line: serde_json::Value = serde_json::from_str(String::from_utf8_lossy(&hit.stdout).trim()).expect("JSON");
    assert_eq!(line["outcome"], "DiskHit", "a read-only folder is still read");
    let miss = probe(&dir, 8, true).expect("probe runs");
    assert!(
        miss.status.success(),
        "a new kernel compiles though nothing can be written: {}",
        String::from_utf8_lossy(&miss.stderr)
    );
    let line: serde_json::Value = serde_json::from_str(String::from_utf8_lossy(&miss.stdout).trim()).expect("JSON");
    assert_eq!(line["outcome"], "Compiled");
    assert!(String::from_utf8_lossy(&miss.stderr).contains("warning"), "the failed write is a warning");
    assert_eq!(walk(&dir).len(), entries_before, "nothing was written");
    restore();
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    if let Ok(rd) = fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(walk(&p));
            }
            out.push(p);
        }
    }
    out
}

#[test]
fn an_a_target_compiles_as_itself_into_its_own_folder() {
    let Some(()) = nvrtc_or_skip("an_a_target_compiles_as_itself_into_its_own_folder") else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let cache = KernelCache::with_dir(dir.path(), MAX);
    let sm90a = CompileOptions::for_arch(Arch::accelerated(9, 0));
    assert_eq!(sm90a.nvrtc_options()[0], "--gpu-architecture=sm_90a");
    let (plain, _) = cache.get_or_compile(&source(3), &sm90()).expect("sm_90 compiles");
    let (accel, outcome) = cache.get_or_compile(&source(3), &sm90a).expect("sm_90a compiles");
    assert_eq!(outcome, CacheOutcome::Compiled);
    assert_ne!(plain.key, accel.key);
    assert_eq!(accel.arch, Arch::accelerated(9, 0));
    assert!(accel.ptx.contains(".target sm_90a"), "{}", &accel.ptx[..accel.ptx.len().min(400)]);
    let path = entry_path(&cache, &source(3), &sm90a);
    assert_eq!(path.parent().and_then(|p| p.file_name()).and_then(|n| n.to_str()), Some("sm_90a"));
    assert!(path.is_file());
    // A new process finds it on disk under its own arch.
    let fresh = KernelCache::with_dir(dir.path(), MAX);
    let (again, outcome) = fresh.get_or_compile(&source(3), &sm90a).expect("from disk");
    assert_eq!(outcome, CacheOutcome::DiskHit);
    assert_eq!(*again, *accel);
}
