//! The command-line tool on programs of any depth: 100,000 chained `let`s are checked, emitted
//! and run on the CPU (exit 0), the gradient through 100,000 chained `where`s is checked (exit 0),
//! and an expression nested past the parser's limits is a
//! diagnostic (exit 1) with the limit, the line and the column; never a death by signal.

use std::path::Path;

use kfuse::{DType, HostTensor};
use kfuse_cli::npy;

mod common;
use common::kfuse;

const LETS: usize = 100_000;

/// `LETS` lets in cycles of `+ 1`, `* 2`, `- 1`, `* 0.5` (each cycle adds exactly 0.5).
fn deep_file(dir: &Path) -> String {
    let mut src = String::from("input x: f32[N]\n");
    for i in 1..=LETS {
        let prev = if i == 1 { "x".to_string() } else { format!("a{}", i - 1) };
        src.push_str(&format!("let a{i} = {prev} {}\n", ["+ 1", "* 2", "- 1", "* 0.5"][(i - 1) % 4]));
    }
    src.push_str(&format!("output y = a{LETS}\noutput s = sum(a{LETS})\n"));
    let path = dir.join("deep.kf");
    std::fs::write(&path, src).unwrap();
    path.display().to_string()
}

#[test]
fn check_emit_and_run_a_hundred_thousand_chained_lets() {
    let dir = tempfile::tempdir().unwrap();
    let file = deep_file(dir.path());

    let out = kfuse(&["check", &file]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("output y: f32[N]"));

    let out = kfuse(&["emit", &file]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let cuda = String::from_utf8_lossy(&out.stdout);
    assert!(cuda.contains("__global__"));
    assert!(cuda.lines().filter(|l| l.trim_start().starts_with("const float v")).count() >= LETS);

    let x = dir.path().join("x.npy");
    npy::write_npy(&x, &HostTensor::from_f64(DType::F32, vec![2], &[1.0, -4.0])).unwrap();
    let x = format!("x={}", x.display());
    let outdir = dir.path().display().to_string();
    let out = kfuse(&["run", &file, "--device", "cpu", "--input", &x, "--output", &outdir]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let half = (LETS / 8) as f64;
    assert!(String::from_utf8_lossy(&out.stdout).contains(&format!("s = {}", 1.0 - 4.0 + 2.0 * half)));
    let y = npy::read_npy(&dir.path().join("y.npy")).unwrap();
    assert_eq!(y.to_f64(), vec![1.0 + half, -4.0 + half]);
}

#[test]
fn expressions_nested_past_the_limit_are_diagnostics_with_the_limit_and_the_place() {
    let dir = tempfile::tempdir().unwrap();
    let n = 100_000;
    for (name, expr, limit) in [
        ("parens.kf", format!("{}x{}", "(".repeat(n), ")".repeat(n)), "64"),
        ("negations.kf", "-".repeat(n) + "x", "64"),
        ("sum.kf", "x".to_string() + &" + x".repeat(n), "256"),
    ] {
        let path = dir.path().join(name);
        std::fs::write(&path, format!("input x: f32[N]\noutput y = {expr}\n")).unwrap();
        let file = path.display().to_string();
        for cmd in ["check", "emit"] {
            let out = kfuse(&[cmd, &file]);
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{cmd} {name}: {err}");
            assert!(err.contains(&format!("more than {limit} levels deep")), "{cmd} {name}: {err}");
            assert!(err.contains(&format!("{name}:2:")), "{cmd} {name}: {err}");
            assert!(!err.contains("panicked"), "{cmd} {name}: {err}");
        }
    }
}

#[test]
fn check_the_gradient_through_a_hundred_thousand_chained_wheres() {
    // a_i = where(x > i, a_{i-1} * 1.5, 0): the gradient is zero outside one mask per `let`.
    let dir = tempfile::tempdir().unwrap();
    let mut src = String::from("input x: f32[N]\n");
    for i in 1..=LETS {
        let prev = if i == 1 { "x".to_string() } else { format!("a{}", i - 1) };
        src.push_str(&format!("let a{i} = where(x > {i}, {prev} * 1.5, 0)\n"));
    }
    src.push_str(&format!("output y = sum(a{LETS})\noutput dx = grad(y, x)\n"));
    let path = dir.path().join("wheres.kf");
    std::fs::write(&path, src).unwrap();
    let out = kfuse(&["check", &path.display().to_string()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let typed = String::from_utf8_lossy(&out.stdout);
    assert!(typed.contains("output y: f32[]") && typed.contains("output dx: f32[N]"), "{typed}");
}
