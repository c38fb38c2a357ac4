//! `kfuse bench` from the command line. Pure tier: bad options fail before any GPU is opened, and
//! a machine without a CUDA driver gets a clear error (skipped where a driver is present). GPU
//! tier: the three timing modes on small odd sizes, every figure in the JSON, and the rotated
//! mode's last buffer set agreeing with the interpreter (the hand-written baseline's too).
//! Speed is never asserted.

use std::path::PathBuf;
use std::process::Output;

use kfuse_cli::{boxes, npy};

mod common;
use common::kfuse;

/// f32 results against the f64 interpreter (the conformance suite's tolerance).
const F32_TOLERANCE: f64 = 1e-5;

fn example(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples").join(name).display().to_string()
}

fn fails_with(out: &Output, needles: &[&str]) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "expected failure, got success; stderr: {err}");
    assert!(!err.contains("panicked"), "panic: {err}");
    for n in needles {
        assert!(err.contains(n), "stderr lacks {n:?}:\n{err}");
    }
}

#[test]
fn bad_rotate_sets_fail_before_the_gpu_is_opened() {
    for k in ["0", "1", "65"] {
        let out = kfuse(&["bench", &example("giou.kf"), "--dim", "B=3", "--dim", "N=5", "--rotate-sets", k]);
        fails_with(&out, &[&format!("--rotate-sets {k}"), "2 to 64"]);
    }
}

#[test]
fn bench_without_a_gpu_is_a_clear_error() {
    if kfuse::runtime::driver_available() {
        println!("SKIPPED: bench_without_a_gpu_is_a_clear_error: a CUDA driver is present, so the no-GPU error cannot be seen");
        return;
    }
    let out = kfuse(&["bench", &example("giou.kf"), "--dim", "B=3", "--dim", "N=5"]);
    fails_with(&out, &["`kfuse bench` times the GPU", "CUDA driver is not available"]);
}

/// Runs `kfuse bench` with `args` and a JSON file; returns stdout and the JSON.
fn bench_json(args: &[&str], dir: &std::path::Path, name: &str) -> (String, serde_json::Value) {
    let json = dir.join(format!("{name}.json"));
    let mut all: Vec<&str> = args.to_vec();
    let json_arg = json.display().to_string();
    all.extend(["--iters", "20", "--json", &json_arg]);
    let out = kfuse(&all);
    assert!(out.status.success(), "{name}: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    println!("{text}");
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    (text, v)
}

/// Every mode timed, the rotation's sets as asked (or at least 2), and the outputs of the last
/// set, after the timed launches, equal to the interpreter's.
fn check_timed(t: &serde_json::Value, sets: Option<u64>, what: &str) {
    for mode in ["back_to_back", "rotated", "l2_flushed"] {
        let us = t[mode]["median_us"].as_f64().unwrap_or(f64::NAN);
        assert!(us.is_finite() && us > 0.0, "{what}: {mode} median {us}");
        assert!(t[mode]["runs"].as_u64().unwrap_or(0) >= 5, "{what}: {mode}");
    }
    assert!(t["gbps_rotated"].as_f64().is_some_and(|g| g > 0.0), "{what}: {t}");
    let r = &t["rotation"];
    let got = r["sets"].as_u64().unwrap_or(0);
    match sets {
        Some(k) => assert_eq!(got, k, "{what}: {r}"),
        None => assert!(got >= 2 && r["note"].is_null(), "{what}: {r}"),
    }
    assert!(r["set_bytes"].as_u64().unwrap_or(0) > 0, "{what}: {r}");
    let err = r["max_rel_err"].as_f64().unwrap_or(f64::NAN);
    assert!(err <= F32_TOLERANCE, "{what}: the last rotated set's outputs are off by {err:.2e}");
    let err = t["max_rel_err"].as_f64().unwrap_or(f64::NAN);
    assert!(err <= F32_TOLERANCE, "{what}: outputs off by {err:.2e}");
}

#[test]
fn bench_times_three_modes_and_checks_the_rotated_sets() {
    let Some(gpu) = kfuse::runtime::testing::gpu_or_skip("bench_times_three_modes_and_checks_the_rotated_sets") else {
        return;
    };
    drop(gpu);
    let d = tempfile::tempdir().unwrap();

    // The training step (scalar and tensor outputs) on random inputs; the automatic set count.
    let (text, v) =
        bench_json(&["bench", &example("giou_train.kf"), "--dim", "B=3", "--dim", "N=255"], d.path(), "train");
    check_timed(&v["kfuse"], None, "giou_train B=3 N=255");
    assert!(v["baseline"].is_null());
    for o in v["outputs"].as_array().unwrap() {
        assert!(o["rel_err"].as_f64().is_some_and(|e| e <= F32_TOLERANCE), "{o}");
    }
    for needle in ["b2b    ", "rot    ", "flush  ", "% copy bw", "rot check, kfuse (generated)"] {
        assert!(text.contains(needle), "stdout lacks {needle:?}");
    }

    // The forward loss with the hand-written baseline, on a ragged box batch; three sets asked for.
    let b = boxes::generate(255, 3, 7).unwrap();
    let (p, t) = (d.path().join("p.npy"), d.path().join("t.npy"));
    npy::write_npy(&p, &b.pred).unwrap();
    npy::write_npy(&t, &b.target).unwrap();
    let (pi, ti) = (format!("pred={}", p.display()), format!("target={}", t.display()));
    let (text, v) = bench_json(
        &["bench", &example("giou.kf"), "--input", &pi, "--input", &ti, "--baseline", "giou", "--rotate-sets", "3"],
        d.path(),
        "fwd",
    );
    check_timed(&v["kfuse"], Some(3), "giou B=255 N=3");
    check_timed(&v["baseline"], Some(3), "baseline B=255 N=3");
    assert!(text.contains("rot check, hand-written CUDA"), "{text}");
}
