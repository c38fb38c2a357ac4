//! The kernel cache never removes or overwrites a file it did not write: a folder of user files
//! goes through verify, clear, list, compiles and eviction and every user file is byte-identical
//! afterwards (all files are hashed before and after). Also: kfuse's own folder is tagged, an
//! older untagged kfuse cache is adopted, a path that is a file is refused, a cap of 0 keeps
//! nothing on disk, an invalid setting is an error, and a held lock is announced on stderr.
//!
//! Compiles need NVRTC (gated); the refusals need nothing.

use std::collections::BTreeMap;
use std::fs;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

mod common;
use common::probe_exe;
use kfuse_runtime::testing::nvrtc_or_skip;
use kfuse_runtime::{Arch, CacheOutcome, CompileOptions, KernelCache, RuntimeError, VerifyAction};

const MAX: u64 = 1 << 30;
const SIGNATURE: &str = "Signature: 8a477f597d28d172789f06886806bc55";
const KFUSE_LINE: &str = "# This file is a cache directory tag created by kfuse.";
/// A name kfuse would give an entry.
const ENTRY_NAME: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef.kfc";

fn source(variant: u32) -> String {
    format!("extern \"C\" __global__ void safety(float* x) {{ x[threadIdx.x] *= {variant}.75f; }}\n")
}

fn sm90() -> CompileOptions {
    CompileOptions::for_arch(Arch::new(9, 0))
}

/// Every file under `dir` (recursively, not following links) with the blake3 of its bytes.
fn hashes(dir: &Path) -> BTreeMap<PathBuf, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for item in fs::read_dir(&d).expect("readable") {
            let item = item.expect("entry");
            let kind = item.file_type().expect("type");
            if kind.is_dir() {
                stack.push(item.path());
            } else {
                let bytes = fs::read(item.path()).expect("readable file");
                out.insert(item.path(), blake3::hash(&bytes).to_hex().to_string());
            }
        }
    }
    out
}

fn write(path: &Path, bytes: &[u8]) {
    fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    fs::write(path, bytes).expect("write");
}

/// A folder as a user's: a repository's files, subfolders, a file named like a cache entry, an
/// `sm_90` folder of their own; with `other_tag`, another tool's `CACHEDIR.TAG` too.
fn user_folder(other_tag: bool) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    write(&d.join("Cargo.toml"), b"[package]\nname = \"mine\"\n");
    write(&d.join("README.md"), b"# My project\n");
    write(&d.join(".gitignore"), b"target/\n");
    write(&d.join("stats.json"), b"{\"my\": \"numbers\"}\n");
    write(&d.join("src/deep/main.rs"), b"fn main() {}\n");
    write(&d.join(ENTRY_NAME), b"my notes, named oddly\n");
    write(&d.join("sm_90").join(ENTRY_NAME), b"not a kernel at all\n");
    write(&d.join("sm_90/results.csv"), b"a,b\n1,2\n");
    write(&d.join("sm_90/locks/mine.lock"), b"held by me\n");
    write(&d.join(".tmp-1-2-3"), b"a temporary file of mine\n");
    if other_tag {
        write(
            &d.join("CACHEDIR.TAG"),
            format!("{SIGNATURE}\n# This file is a cache directory tag created by cargo.\n").as_bytes(),
        );
    }
    dir
}

fn assert_not_owned(result: Result<impl std::fmt::Debug, RuntimeError>, dir: &Path, what: &str) {
    match result {
        Err(e @ RuntimeError::CacheNotOwned { .. }) => {
            let text = e.to_string();
            for word in
                [&dir.display().to_string(), "is not a kfuse cache folder", "removes nothing", "KFUSE_CACHE_DIR"]
            {
                assert!(text.contains(word), "{what}: `{word}` missing from: {text}");
            }
        }
        other => panic!("{what}: expected CacheNotOwned, got {other:?}"),
    }
}

#[test]
fn a_folder_of_user_files_is_refused_by_every_command_that_removes() {
    for other_tag in [false, true] {
        let dir = user_folder(other_tag);
        let before = hashes(dir.path());
        let cache = KernelCache::with_dir(dir.path(), MAX);
        assert_not_owned(cache.verify(), dir.path(), "verify");
        assert_not_owned(cache.clear(), dir.path(), "clear");
        assert_not_owned(cache.list(), dir.path(), "list");
        assert_not_owned(cache.check_folder(), dir.path(), "check_folder");
        if other_tag {
            let text = cache.verify().expect_err("refused").to_string();
            assert!(text.contains("another tool's"), "{text}");
        }
        let stats = cache.stats();
        assert_eq!(stats.entries, 0);
        assert!(stats.disk_unused.as_deref().is_some_and(|u| u.contains("not a kfuse cache folder")), "{stats:?}");
        assert_eq!(hashes(dir.path()), before, "other_tag {other_tag}: a user file changed or appeared");
    }
}

#[test]
fn a_folder_of_user_files_survives_compiles_and_a_tiny_cap() {
    let Some(()) = nvrtc_or_skip("a_folder_of_user_files_survives_compiles_and_a_tiny_cap") else { return };
    for other_tag in [false, true] {
        let dir = user_folder(other_tag);
        let before = hashes(dir.path());
        // A cap smaller than any entry: were the folder used, every write would evict.
        for cap in [MAX, 1] {
            let cache = KernelCache::with_dir(dir.path(), cap);
            for variant in 0..3 {
                let (_, outcome) = cache.get_or_compile(&source(variant), &sm90()).expect("compiles");
                assert_eq!(outcome, CacheOutcome::Compiled);
                let found = cache.get_cached(&source(variant), &sm90()).expect("probe").map(|(_, o)| o);
                assert_eq!(found, Some(CacheOutcome::MemoryHit));
            }
            let stats = cache.stats();
            assert_eq!((stats.session.evictions, stats.session.write_failures), (0, 0), "{stats:?}");
            // A fresh process finds nothing on disk either: nothing was written.
            let fresh = KernelCache::with_dir(dir.path(), cap);
            assert_eq!(fresh.get_cached(&source(0), &sm90()).expect("probe").map(|(_, o)| o), None);
        }
        assert_eq!(hashes(dir.path()), before, "other_tag {other_tag}: a user file changed or appeared");
    }
}

/// Files a user drops into kfuse's own (tagged) folder.
fn drop_user_files(root: &Path) -> Vec<PathBuf> {
    let files = [
        ("notes.txt", &b"my notes"[..]),
        ("mine/data.bin", b"\x00\x01\x02"),
        ("sm_90/results.csv", b"a,b\n"),
        ("sm_90/mine/deeper.txt", b"deep"),
        ("sm_90/locks/mine.lock", b"not empty"),
        ("sm_90/.tmp-mine", b"my temp"),
        ("sm_80/notes.md", b"# an arch folder of mine"),
    ];
    let mut paths = Vec::new();
    for (name, bytes) in files {
        write(&root.join(name), bytes);
        paths.push(root.join(name));
    }
    let entry_named = root.join("sm_90").join(ENTRY_NAME);
    write(&entry_named, b"named like an entry, but mine\n");
    paths.push(entry_named);
    paths
}

fn hashes_of(paths: &[PathBuf]) -> Vec<String> {
    paths.iter().map(|p| blake3::hash(&fs::read(p).expect("still there")).to_hex().to_string()).collect()
}

#[test]
fn inside_kfuses_folder_only_kfuses_files_are_removed() {
    let Some(()) = nvrtc_or_skip("inside_kfuses_folder_only_kfuses_files_are_removed") else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("cache");
    let probe = KernelCache::with_dir(&root, MAX);
    probe.get_or_compile(&source(10), &sm90()).expect("compiles");
    let one = probe.stats().bytes;
    let tag = fs::read_to_string(root.join("CACHEDIR.TAG")).expect("kfuse tags the folder it creates");
    assert_eq!(tag.lines().next(), Some(SIGNATURE));
    assert!(tag.lines().any(|l| l == KFUSE_LINE), "{tag}");
    let user = drop_user_files(&root);
    let before = hashes_of(&user);

    // Eviction: room for two entries; four more compiles evict three, none of them the user's.
    let cache = KernelCache::with_dir(&root, one * 5 / 2);
    for variant in 11..15 {
        let (_, outcome) = cache.get_or_compile(&source(variant), &sm90()).expect("compiles");
        assert_eq!(outcome, CacheOutcome::Compiled);
    }
    assert_eq!(cache.stats().session.evictions, 3, "{:?}", cache.stats());
    assert_eq!(cache.list().expect("list").len(), 2);
    assert_eq!(hashes_of(&user), before, "eviction touched a user file");

    // Verify: kfuse's entries are valid, the user's files reported and left.
    let report = cache.verify().expect("verify");
    assert_eq!((report.checked, report.valid), (2, 2), "{report:?}");
    for path in &user {
        let problem = report.problems.iter().find(|p| p.path == *path || path.starts_with(&p.path));
        let problem = problem.unwrap_or_else(|| panic!("{} not reported: {report:?}", path.display()));
        assert_eq!(problem.action, VerifyAction::LeftAlone, "{problem:?}");
    }
    assert!(report.problems.iter().all(|p| p.action == VerifyAction::LeftAlone), "{report:?}");
    assert_eq!(hashes_of(&user), before, "verify touched a user file");

    // Clear: every kfuse file goes, every user file stays and is listed.
    let cleared = cache.clear().expect("clear");
    assert_eq!(cleared.entries, 2);
    for path in &user {
        assert!(cleared.left_alone.iter().any(|l| path.starts_with(l)), "{} not listed: {cleared:?}", path.display());
    }
    assert_eq!(hashes_of(&user), before, "clear touched a user file");
    let left: Vec<PathBuf> = hashes(&root).into_keys().collect();
    let mut expected: Vec<PathBuf> = user.clone();
    expected.push(root.join("CACHEDIR.TAG"));
    expected.sort();
    assert_eq!(left, expected, "clear left a kfuse file or removed a user's");
}

#[test]
fn a_file_in_an_entrys_place_that_is_not_kfuses_is_never_replaced() {
    let Some(()) = nvrtc_or_skip("a_file_in_an_entrys_place_that_is_not_kfuses_is_never_replaced") else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let cache = KernelCache::with_dir(dir.path(), MAX);
    cache.get_or_compile(&source(20), &sm90()).expect("tags the folder");
    let path = cache.entry_path(&source(21), &sm90()).expect("key").expect("folder");
    write(&path, b"a user's file that happens to have this name\n");
    let before = fs::read(&path).expect("written");
    for _ in 0..2 {
        let (_, outcome) =
            KernelCache::with_dir(dir.path(), MAX).get_or_compile(&source(21), &sm90()).expect("compiles");
        assert_eq!(outcome, CacheOutcome::Compiled);
    }
    assert_eq!(fs::read(&path).expect("kept"), before);
    assert!(!path.with_extension("cu").exists(), "nothing of kfuse's is written beside a file it does not own");
}

#[test]
fn an_empty_folder_is_adopted_and_an_untagged_kfuse_cache_migrated() {
    let Some(()) = nvrtc_or_skip("an_empty_folder_is_adopted_and_an_untagged_kfuse_cache_migrated") else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let cache = KernelCache::with_dir(dir.path(), MAX);
    cache.get_or_compile(&source(30), &sm90()).expect("compiles");
    let tag = dir.path().join("CACHEDIR.TAG");
    assert!(fs::read_to_string(&tag).expect("an empty folder is tagged").contains(KFUSE_LINE));
    // As an older kfuse left it: no tag.
    fs::remove_file(&tag).expect("untag");
    let older = KernelCache::with_dir(dir.path(), MAX);
    let (_, outcome) = older.get_or_compile(&source(30), &sm90()).expect("reads");
    assert_eq!(outcome, CacheOutcome::DiskHit, "an older kfuse cache is read");
    assert!(tag.exists(), "and adopted (tagged)");
    fs::remove_file(&tag).expect("untag");
    let report = KernelCache::with_dir(dir.path(), MAX).verify().expect("an older kfuse cache is verified");
    assert_eq!((report.checked, report.valid), (1, 1), "{report:?}");
    assert!(tag.exists(), "verify adopts it");
    // One file of someone else's makes an untagged folder foreign.
    fs::remove_file(&tag).expect("untag");
    write(&dir.path().join("sm_90/mine.txt"), b"mine");
    assert_not_owned(KernelCache::with_dir(dir.path(), MAX).clear(), dir.path(), "clear of a mixed folder");
    assert!(dir.path().join("sm_90/mine.txt").exists());
}

#[test]
fn a_cache_path_that_is_a_file_is_refused_clearly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("cache");
    fs::write(&file, b"precious").expect("file");
    let cache = KernelCache::with_dir(&file, MAX);
    for (what, result) in [
        ("verify", cache.verify().map(|_| ())),
        ("clear", cache.clear().map(|_| ())),
        ("list", cache.list().map(|_| ())),
        ("check_folder", cache.check_folder()),
    ] {
        match result {
            Err(e @ RuntimeError::CacheNotAFolder { .. }) => {
                let text = e.to_string();
                assert!(text.contains(&file.display().to_string()) && text.contains("is not a folder"), "{text}");
            }
            other => panic!("{what}: expected CacheNotAFolder, got {other:?}"),
        }
    }
    assert!(cache.stats().disk_unused.is_some_and(|u| u.contains("is not a folder")));
    if nvrtc_or_skip("a_cache_path_that_is_a_file_is_refused_clearly (compile)").is_some() {
        let (_, outcome) = cache.get_or_compile(&source(40), &sm90()).expect("compiles without the disk tier");
        assert_eq!(outcome, CacheOutcome::Compiled);
    }
    assert_eq!(fs::read(&file).expect("file"), b"precious");
}

#[test]
fn a_cap_of_zero_keeps_nothing_on_disk() {
    let Some(()) = nvrtc_or_skip("a_cap_of_zero_keeps_nothing_on_disk") else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("cache");
    let cache = KernelCache::with_dir(&root, 0);
    for expected in [CacheOutcome::Compiled, CacheOutcome::MemoryHit] {
        let (_, outcome) = cache.get_or_compile(&source(50), &sm90()).expect("compiles");
        assert_eq!(outcome, expected);
    }
    assert!(!root.exists(), "a cap of 0 wrote to disk");
    assert!(cache.stats().disk_unused.is_some_and(|u| u.contains("KFUSE_CACHE_MAX_BYTES=0")));
}

#[test]
fn an_invalid_flag_is_an_error_not_a_silent_off() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = Command::new(probe_exe())
        .arg("--dir")
        .arg(dir.path())
        .env("KFUSE_LOG_COMPILES", "sometimes")
        .output()
        .expect("probe runs");
    assert!(!out.status.success(), "an invalid KFUSE_LOG_COMPILES was ignored");
    let err = String::from_utf8_lossy(&out.stderr);
    for word in ["KFUSE_LOG_COMPILES", "\"sometimes\"", "is invalid", "true", "off"] {
        assert!(err.contains(word), "`{word}` missing from: {err}");
    }
    assert_eq!(fs::read_dir(dir.path()).expect("dir").count(), 0, "nothing written");
}

#[test]
fn a_held_lock_is_announced_with_its_file_and_then_waited_for() {
    let Some(()) = nvrtc_or_skip("a_held_lock_is_announced_with_its_file_and_then_waited_for") else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let probe = |variant: u32| {
        Command::new(probe_exe())
            .arg("--dir")
            .arg(dir.path())
            .args(["--variant", &variant.to_string()])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("probe starts")
    };
    // A first probe makes the folder kfuse's; a second one's key is read from a first run elsewhere.
    let key_of = |variant: u32| {
        let elsewhere = tempfile::tempdir().expect("tempdir");
        let out = Command::new(probe_exe())
            .arg("--dir")
            .arg(elsewhere.path())
            .args(["--variant", &variant.to_string()])
            .output()
            .expect("probe runs");
        let line: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
        line["key"].as_str().expect("key").to_string()
    };
    assert!(probe(60).wait_with_output().expect("first probe").status.success());
    let key = key_of(61);
    let lock_path = dir.path().join("sm_90/locks").join(format!("{key}.lock"));
    let lock = fs::OpenOptions::new().create(true).truncate(false).write(true).open(&lock_path).expect("lock file");
    fs4::FileExt::lock(&lock).expect("the test holds the lock, as a stopped process would");
    let mut child = probe(61);
    let stderr = child.stderr.take().expect("stderr");
    let mut lines = BufReader::new(stderr).lines();
    let notice = lines
        .by_ref()
        .map(|l| l.expect("utf-8"))
        .find(|l| l.contains("waiting for the lock file"))
        .expect("the waiting probe says what it waits for");
    for word in [&lock_path.display().to_string(), &key, "another kfuse process is compiling", "120 s"] {
        assert!(notice.contains(word), "`{word}` missing from: {notice}");
    }
    fs4::FileExt::unlock(&lock).expect("release");
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    let out = child.wait_with_output().expect("probe ends");
    assert!(out.status.success(), "{rest:?}");
    let line: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(line["outcome"], "Compiled");
}
