//! `kfuse cache ...` and `kfuse compile` never remove or change a file kfuse did not write: a
//! folder of user files given as KFUSE_CACHE_DIR is refused by every command with an error that
//! names it and says what to do, and a user file inside kfuse's own folder outlives compiles,
//! eviction, verify and clear (all files are read before and after). Also: the environment's
//! flags and sizes, a cache path that is a file, readable dates in `cache list`, and `cache warm`
//! failing when a file fails. Compiles need NVRTC (gated); the refusals need nothing.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use kfuse::runtime::testing::nvrtc_or_skip;

mod common;
use common::{kfuse_exe, stdout};

const SIGNATURE: &str = "Signature: 8a477f597d28d172789f06886806bc55";
const ENTRY_NAME: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef.kfc";

/// Runs kfuse with `cache_dir` as KFUSE_CACHE_DIR, the other cache variables cleared, then `env`.
fn kfuse_in(cache_dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(kfuse_exe());
    cmd.args(args).env("KFUSE_CACHE_DIR", cache_dir);
    for var in ["KFUSE_NO_CACHE", "KFUSE_LOG_COMPILES", "KFUSE_LOG_TIMING", "KFUSE_CACHE_MAX_BYTES"] {
        cmd.env_remove(var);
    }
    cmd.envs(env.iter().copied());
    cmd.output().expect("kfuse runs")
}

/// Asserts success and returns stdout.
fn succeeds(out: &Output) -> String {
    assert!(out.status.success(), "failed: {}\n{}", String::from_utf8_lossy(&out.stderr), stdout(out));
    stdout(out)
}

/// Asserts a failure with one error line holding every `needle`, and no panic.
fn fails_with(out: &Output, needles: &[&str]) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "expected failure, got success; stderr: {err}");
    assert!(!err.contains("panicked"), "panic: {err}");
    let errors: Vec<&str> = err.lines().filter(|l| l.starts_with("error")).collect();
    assert_eq!(errors.len(), 1, "one error line:\n{err}");
    for n in needles {
        assert!(errors[0].contains(n), "the error lacks {n:?}:\n{err}");
    }
}

fn giou() -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/giou.kf").display().to_string()
}

fn write(path: &Path, bytes: &[u8]) {
    fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    fs::write(path, bytes).expect("write");
}

/// Every file under `dir` with its bytes.
fn hashes(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for item in fs::read_dir(&d).expect("readable") {
            let item = item.expect("entry");
            if item.file_type().expect("type").is_dir() {
                stack.push(item.path());
            } else {
                out.insert(item.path(), fs::read(item.path()).expect("read"));
            }
        }
    }
    out
}

/// A clone of a repository, as a mistyped `KFUSE_CACHE_DIR=.` would point at, with an `sm_90`
/// folder of the user's, a file named like a cache entry and, with `other_tag`, another tool's
/// `CACHEDIR.TAG`.
fn user_folder(other_tag: bool) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    write(&d.join("Cargo.toml"), b"[package]\nname = \"mine\"\n");
    write(&d.join("README.md"), b"# Mine\n");
    write(&d.join(".gitignore"), b"target/\n");
    write(&d.join("src/lib.rs"), b"pub fn f() {}\n");
    write(&d.join(ENTRY_NAME), b"named like an entry\n");
    write(&d.join("sm_90").join(ENTRY_NAME), b"mine too\n");
    write(&d.join("sm_90/plot.png"), b"\x89PNG");
    write(&d.join("sm_90/locks/a.lock"), b"");
    if other_tag {
        write(&d.join("CACHEDIR.TAG"), format!("{SIGNATURE}\n# created by another tool\n").as_bytes());
    }
    dir
}

#[test]
fn every_cache_command_refuses_a_folder_of_user_files() {
    for other_tag in [false, true] {
        let dir = user_folder(other_tag);
        let before = hashes(dir.path());
        let shown = dir.path().display().to_string();
        for args in [
            &["cache", "verify"][..],
            &["cache", "clear"],
            &["cache", "list"],
            &["cache", "stats"],
            &["cache", "stats", "--json"],
            &["cache", "warm", dir.path().to_str().expect("utf-8"), "--arch", "sm_90"],
            &["compile", &giou(), "--arch", "sm_90"],
        ] {
            for env in [&[][..], &[("KFUSE_CACHE_MAX_BYTES", "1")]] {
                let out = kfuse_in(dir.path(), args, env);
                fails_with(&out, &[&shown, "is not a kfuse cache folder", "removes nothing", "KFUSE_CACHE_DIR"]);
            }
        }
        // The CPU path uses no cache folder and leaves this one alone too.
        let out = kfuse_in(dir.path(), &["emit", &giou()], &[]);
        assert!(succeeds(&out).contains("__global__"));
        assert_eq!(hashes(dir.path()), before, "other_tag {other_tag}: a user file changed or appeared");
    }
}

#[test]
fn user_files_inside_kfuses_folder_outlive_compiles_eviction_verify_and_clear() {
    let Some(()) = nvrtc_or_skip("user_files_inside_kfuses_folder_outlive_compiles_eviction_verify_and_clear") else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("cache");
    succeeds(&kfuse_in(&root, &["compile", &giou(), "--arch", "sm_90"], &[]));
    let tag = fs::read_to_string(root.join("CACHEDIR.TAG")).expect("kfuse tags the folder it creates");
    assert!(tag.starts_with(SIGNATURE) && tag.contains("created by kfuse"), "{tag}");
    let user: Vec<PathBuf> =
        ["notes.txt", "sub/deep.txt", "sm_90/plot.png", "sm_90/mine/x.txt", "sm_90/locks/mine.lock", "sm_75/a.txt"]
            .iter()
            .map(|name| root.join(name))
            .chain([root.join("sm_90").join(ENTRY_NAME)])
            .collect();
    for (i, path) in user.iter().enumerate() {
        write(path, format!("user file {i}\n").as_bytes());
    }
    let user_bytes = |paths: &[PathBuf]| paths.iter().map(|p| fs::read(p).expect("still there")).collect::<Vec<_>>();
    let before = user_bytes(&user);

    // Compiles for other archs under a cap of one byte: every write evicts all it may.
    for arch in ["sm_80", "sm_86"] {
        let out = kfuse_in(&root, &["compile", &giou(), "--arch", arch], &[("KFUSE_CACHE_MAX_BYTES", "1")]);
        assert!(succeeds(&out).contains("miss (compiled)"));
    }
    let stats = succeeds(&kfuse_in(&root, &["cache", "stats", "--json"], &[]));
    let stats: serde_json::Value = serde_json::from_str(&stats).expect("JSON");
    assert!(stats["persisted"]["evictions"].as_u64().is_some_and(|e| e >= 1), "{stats}");
    assert_eq!(user_bytes(&user), before, "eviction touched a user file");

    let verify = succeeds(&kfuse_in(&root, &["cache", "verify"], &[]));
    for path in &user {
        let shown = path.display().to_string();
        let line = verify.lines().find(|l| shown.starts_with(l.split(" — ").next().unwrap_or(l)));
        let line = line.unwrap_or_else(|| panic!("{shown} not reported:\n{verify}"));
        assert!(line.ends_with("(not kfuse's, left alone)"), "{line}");
    }
    assert!(verify.contains("0 bad;"), "{verify}");
    assert_eq!(user_bytes(&user), before, "verify touched a user file");

    let clear = succeeds(&kfuse_in(&root, &["cache", "clear"], &[]));
    assert!(clear.contains("left alone: ") && clear.contains("removed 1 entries"), "{clear}");
    assert_eq!(user_bytes(&user), before, "clear touched a user file");
    let mut left: Vec<PathBuf> = hashes(&root).into_keys().collect();
    left.sort();
    let mut expected = user.clone();
    expected.push(root.join("CACHEDIR.TAG"));
    expected.sort();
    assert_eq!(left, expected, "clear left a kfuse file or took a user's");
}

#[test]
fn a_cache_path_that_is_a_file_is_named_as_such() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("cache");
    fs::write(&file, b"precious").expect("file");
    for args in [&["cache", "stats"][..], &["cache", "list"], &["cache", "verify"], &["cache", "clear"]] {
        let out = kfuse_in(&file, args, &[]);
        fails_with(&out, &[&file.display().to_string(), "is not a folder", "KFUSE_CACHE_DIR"]);
    }
    assert_eq!(fs::read(&file).expect("file"), b"precious");
}

#[test]
fn flags_take_words_and_refuse_anything_else() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cache = dir.path().join("cache");
    for on in ["1", "true", "YES", " on "] {
        let out = succeeds(&kfuse_in(&cache, &["cache", "stats"], &[("KFUSE_NO_CACHE", on)]));
        assert!(out.contains("bypassed by KFUSE_NO_CACHE"), "{on:?}: {out}");
    }
    for off in ["", "0", "false", "No", "OFF"] {
        let out = succeeds(&kfuse_in(&cache, &["cache", "stats"], &[("KFUSE_NO_CACHE", off)]));
        assert!(!out.contains("bypassed"), "{off:?}: {out}");
    }
    for var in ["KFUSE_NO_CACHE", "KFUSE_LOG_COMPILES", "KFUSE_LOG_TIMING"] {
        for args in [&["cache", "stats"][..], &["emit", &giou()]] {
            let out = kfuse_in(&cache, args, &[(var, "maybe")]);
            fails_with(&out, &[var, "\"maybe\"", "is invalid", "1, true, yes, on", "0, false, no, off"]);
        }
    }
    assert!(!cache.exists(), "a refused setting wrote nothing");
}

#[test]
fn the_size_cap_is_a_size_or_an_error_and_zero_keeps_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cache = dir.path().join("cache");
    for bad in ["lots", "-1", "1.5G", "12 TB"] {
        let out = kfuse_in(&cache, &["cache", "stats"], &[("KFUSE_CACHE_MAX_BYTES", bad)]);
        fails_with(&out, &["KFUSE_CACHE_MAX_BYTES", bad, "is invalid", "512M"]);
    }
    let out = succeeds(&kfuse_in(&cache, &["cache", "stats"], &[("KFUSE_CACHE_MAX_BYTES", "64K")]));
    assert!(out.contains("of 65536 allowed"), "{out}");
    let out = succeeds(&kfuse_in(&cache, &["cache", "stats"], &[("KFUSE_CACHE_MAX_BYTES", "0")]));
    assert!(out.contains("KFUSE_CACHE_MAX_BYTES=0 keeps nothing new on disk"), "{out}");
    if nvrtc_or_skip("the_size_cap_is_a_size_or_an_error_and_zero_keeps_nothing (compile)").is_some() {
        let args = ["compile", &giou(), "--arch", "sm_90"];
        assert!(succeeds(&kfuse_in(&cache, &args, &[("KFUSE_CACHE_MAX_BYTES", "0")])).contains("miss (compiled)"));
        assert!(!cache.exists(), "a cap of 0 wrote to disk");
    }
}

#[test]
fn cache_list_shows_dates_and_ages() {
    let Some(()) = nvrtc_or_skip("cache_list_shows_dates_and_ages") else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let cache = dir.path().join("cache");
    succeeds(&kfuse_in(&cache, &["compile", &giou(), "--arch", "sm_90"], &[]));
    let list = succeeds(&kfuse_in(&cache, &["cache", "list"], &[]));
    let line = list.lines().next().expect("one entry");
    assert!(line.contains(" UTC (") && (line.contains(" ago)") || line.contains("just now")), "{line}");
    let date = line.split("last used ").nth(1).expect("a date");
    assert!(date.as_bytes()[4] == b'-' && date.as_bytes()[7] == b'-', "{line}");
}

#[test]
fn cache_warm_fails_when_a_file_fails_and_says_why() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cache = dir.path().join("cache");
    let sources = dir.path().join("kf");
    write(&sources.join("broken.kf"), b"input x: f32[N]\noutput y = x +\n");
    let out = kfuse_in(&cache, &["cache", "warm", sources.to_str().expect("utf-8"), "--arch", "sm_90"], &[]);
    // stderr is a pipe here, not a terminal: the reason must be printed anyway.
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("failed: {}", sources.join("broken.kf").display())), "{err}");
    fails_with(&out, &["1 of 1 .kf files", "failed"]);
    if nvrtc_or_skip("cache_warm_fails_when_a_file_fails_and_says_why (with a good file)").is_some() {
        fs::copy(giou(), sources.join("giou.kf")).expect("copy");
        let out = kfuse_in(&cache, &["cache", "warm", sources.to_str().expect("utf-8"), "--arch", "sm_90"], &[]);
        assert!(
            stdout(&out).contains("2 files for sm_90") && stdout(&out).contains("1 files failed"),
            "{}",
            stdout(&out)
        );
        fails_with(&out, &["1 of 2 .kf files", "failed"]);
    }
}
