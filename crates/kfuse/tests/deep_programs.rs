//! Programs of any depth: 100,000 chained `let`s go through every pass over the graph (parsing,
//! lowering, verification, hashing, autodiff, planning, CUDA emission, the interpreter) on the
//! test harness's ordinary thread (a 2 MiB stack), and deeply nested expressions are refused with
//! a diagnostic that names the nesting limit and where it was passed, never a stack overflow.

use std::sync::Arc;

use kfuse::{DType, Engine, Error, HostTensor, KernelCache, Program};
use kfuse_lang::DiagnosticKind;

/// The number of chained `let`s.
const LETS: usize = 100_000;

/// `input x: f32[N]`, then `LETS` lets in cycles of four, `+ 1`, `* 2`, `- 1`, `* 0.5`: each
/// cycle adds exactly 0.5 and has derivative exactly 1, so the last value is `x + LETS / 8`.
fn chain(outputs: &str) -> String {
    let mut src = String::with_capacity(LETS * 24);
    src.push_str("input x: f32[N]\n");
    for i in 1..=LETS {
        let prev = if i == 1 { "x".to_string() } else { format!("a{}", i - 1) };
        let step = ["+ 1", "* 2", "- 1", "* 0.5"][(i - 1) % 4];
        src.push_str(&format!("let a{i} = {prev} {step}\n"));
    }
    src.push_str(outputs);
    src
}

fn engine() -> Engine {
    Engine::with_cache(Arc::new(KernelCache::memory_only()))
}

fn parse_error(src: &str) -> kfuse_lang::Diagnostic {
    match Program::compile(&engine(), src, "deep.kf") {
        Err(Error::Parse(d)) => *d,
        Err(other) => panic!("expected a diagnostic, got {other}"),
        Ok(_) => panic!("expected a diagnostic, the program compiled"),
    }
}

#[test]
fn a_hundred_thousand_chained_lets_are_checked_lowered_verified_and_hashed() {
    let src = chain(&format!("output y = a{LETS}\n"));
    let g = kfuse_lang::parse_program(&src, "deep.kf").unwrap();
    assert!(g.nodes.len() > LETS, "{} nodes", g.nodes.len());
    kfuse_ir::verify(&g).unwrap();
    assert_eq!(g.stable_hash(), kfuse_lang::parse_program(&src, "again.kf").unwrap().stable_hash());
    let i = kfuse_ir::Interface::of(&g);
    assert_eq!(i.outputs.len(), 1);
    assert_eq!(i.decl_str(&i.outputs[0]), "f32[N]");
    // The typed graph prints (`kfuse check`).
    assert!(g.to_string().lines().count() > LETS);
}

#[test]
fn a_hundred_thousand_chained_lets_are_planned_and_emitted_as_one_kernel() {
    let p = Program::compile(&engine(), &chain(&format!("output y = a{LETS}\n")), "deep.kf").unwrap();
    assert_eq!(p.plan().kernels.len(), 1);
    let src = p.cuda_source();
    // One named value per let, in order: the first let reads the input, the last is stored.
    let values = src.lines().filter(|l| l.trim_start().starts_with("const float v")).count();
    assert!(values >= LETS, "{values} values in the kernel");
    assert!(src.contains("out0["), "the output is stored");
}

#[test]
fn a_hundred_thousand_chained_lets_run_on_the_interpreter() {
    let p = Program::compile(&engine(), &chain(&format!("output y = a{LETS}\noutput s = sum(a{LETS})\n")), "deep.kf")
        .unwrap();
    let xs = [0.25, -3.0, 1000.0];
    let x = HostTensor::from_f64(DType::F32, vec![3], &xs);
    let out = p.run_cpu(&[("x", &x)]).unwrap();
    let expected: Vec<f64> = xs.iter().map(|v| v + (LETS / 8) as f64).collect();
    assert_eq!(out[0].0, "y");
    assert_eq!(out[0].1.to_f64(), expected);
    assert_eq!(out[1].1.scalar_f64(), Some(expected.iter().sum()));
}

/// `input x: f32[N]`, then `LETS` lets alternating `* x` and `+ x`: the gradient flows back
/// through a chain as long as the forward one.
fn product_chain(outputs: &str) -> String {
    let mut src = String::from("input x: f32[N]\n");
    for i in 1..=LETS {
        let prev = if i == 1 { "x".to_string() } else { format!("a{}", i - 1) };
        let op = if i % 2 == 1 { "*" } else { "+" };
        src.push_str(&format!("let a{i} = {prev} {op} x\n"));
    }
    src.push_str(outputs);
    src
}

#[test]
fn the_gradient_of_a_hundred_thousand_chained_lets_is_built_planned_and_run() {
    let src = product_chain(&format!("output loss = sum(a{LETS})\noutput dx = grad(loss, x)\n"));
    let p = Program::compile(&engine(), &src, "deep.kf").unwrap();
    assert!(p.graph().nodes.len() > 2 * LETS, "{} nodes", p.graph().nodes.len());
    assert!(!p.cuda_source().is_empty());
    let xs = [1.0, -1.0, 0.5, 0.0, -0.25];
    let x = HostTensor::from_f64(DType::F32, vec![xs.len()], &xs);
    let out = p.run_cpu(&[("x", &x)]).unwrap();
    // Forward mode, directly: the value and its derivative along the chain.
    let (mut loss, mut dx) = (0.0, Vec::new());
    for &x in &xs {
        let (mut v, mut dv) = (x, 1.0);
        for i in 1..=LETS {
            (v, dv) = if i % 2 == 1 { (v * x, dv * x + v) } else { (v + x, dv + 1.0) };
        }
        loss += v;
        dx.push(dv);
    }
    let close = |got: f64, want: f64| (got - want).abs() <= 1e-6 * want.abs().max(1.0);
    let got_loss = out[0].1.scalar_f64().unwrap();
    assert!(close(got_loss, loss), "loss {got_loss}, expected {loss}");
    assert_eq!(out[1].0, "dx");
    for (got, want) in out[1].1.to_f64().into_iter().zip(dx) {
        assert!(close(got, want), "dx {got}, expected {want}");
    }
}

#[test]
fn a_hundred_thousand_chained_selects_and_component_accesses_are_emitted_and_run() {
    let mut src = String::from("input x: f32[N, 4]\nlet a0 = x\n");
    for i in 1..=LETS / 2 {
        let (p, k) = (i - 1, i % 4);
        src.push_str(&format!(
            "let w{i} = where(a{p} > 0, a{p}, 0.5 * a{p})\nlet a{i} = w{i} + w{i}[.., {k}][.., None]\n"
        ));
    }
    src.push_str(&format!("output y = a{}\n", LETS / 2));
    let p = Program::compile(&engine(), &src, "deep.kf").unwrap();
    assert_eq!(p.plan().kernels.len(), 1);
    assert!(p.cuda_source().contains("float4"));
    let xs = [-1.0, -2.0, -3.0, -40.0];
    let x = HostTensor::from_f64(DType::F32, vec![1, 4], &xs);
    let out = p.run_cpu(&[("x", &x)]).unwrap();
    let mut a = xs.to_vec();
    for i in 1..=LETS / 2 {
        let w: Vec<f64> = a.iter().map(|&v| if v > 0.0 { v } else { 0.5 * v }).collect();
        a = w.iter().map(|&v| v + w[i % 4]).collect();
    }
    let want: Vec<f64> = a.iter().map(|&v| v as f32 as f64).collect();
    assert_eq!(out[0].1.to_f64(), want);
}

#[test]
fn chained_row_reductions_are_emitted_inside_their_loops() {
    // Each reduction's loop evaluates the chain below it again (a row loop keeps nothing of an
    // element's values), so the code grows with the square of this chain's length: kept short.
    let mut src = String::from("input x: f32[N, 4]\nlet a0 = x\n");
    for i in 1..=32 {
        let p = i - 1;
        src.push_str(&format!(
            "let r{i} = max(a{p}, axis: -1)\nlet a{i} = where(a{p} >= r{i}[.., None], a{p}, 0.5 * a{p})\n"
        ));
    }
    src.push_str("output y = a32\n");
    let p = Program::compile(&engine(), &src, "deep.kf").unwrap();
    assert_eq!(p.plan().kernels.len(), 1);
    let cuda = p.cuda_source();
    assert!(cuda.contains("kf_maxf("));
    assert!(cuda.matches("for (long long j").count() >= 32);
    let x = HostTensor::from_f64(DType::F32, vec![1, 4], &[1.0, 2.0, 3.0, 4.0]);
    let out = p.run_cpu(&[("x", &x)]).unwrap();
    let mut want = vec![1.0f64, 2.0, 3.0, 4.0];
    for _ in 0..32 {
        let r = want.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        want = want.iter().map(|&v| if v >= r { v } else { 0.5 * v }).collect();
    }
    assert_eq!(out[0].1.to_f64(), want);
}

#[test]
fn nesting_deeper_than_the_limits_is_a_diagnostic_with_the_limit_and_the_place() {
    let n = 100_000;
    let cases = [
        ("parentheses", format!("input x: f32[N]\noutput y = {}x{}\n", "(".repeat(n), ")".repeat(n)), "64"),
        ("negations", format!("input x: f32[N]\noutput y = {}x\n", "-".repeat(n)), "64"),
        ("nots", format!("input x: bool[N]\noutput y = {}x\n", "not ".repeat(n)), "64"),
        ("calls", format!("input x: f32[N]\noutput y = {}x{}\n", "abs(".repeat(n), ")".repeat(n)), "64"),
        ("a sum chain", format!("input x: f32[N]\noutput y = x{}\n", " + x".repeat(n)), "256"),
        ("a product chain", format!("input x: f32[N]\noutput y = x{}\n", " * x".repeat(n)), "256"),
        ("component accesses", format!("input x: f32[N, 1]\noutput y = x{}\n", "[.., None][.., 0]".repeat(n)), "256"),
    ];
    for (what, src, limit) in cases {
        let d = parse_error(&src);
        assert_eq!(d.kind, DiagnosticKind::Syntax, "{what}: {d}");
        assert!(d.message.contains(&format!("more than {limit} levels deep")), "{what}: {d}");
        assert!(d.expected.as_deref().is_some_and(|e| e.contains("let")), "{what}: {d}");
        assert_eq!(d.line, 2, "{what}: {d}");
        assert!(d.column > 1, "{what}: {d}");
    }
}

#[test]
fn nesting_within_the_limits_parses_and_runs() {
    let src = format!(
        "input x: f32[N]\nlet a = {}x{}\nlet b = x{}\noutput y = a + b\n",
        "(-".repeat(25),
        ")".repeat(25),
        " + x".repeat(250)
    );
    let p = Program::compile(&engine(), &src, "deep.kf").unwrap();
    let x = HostTensor::from_f64(DType::F32, vec![2], &[1.0, -2.0]);
    let out = p.run_cpu(&[("x", &x)]).unwrap();
    assert_eq!(out[0].1.to_f64(), vec![250.0, -500.0]);
}
