//! Gradients through long chains of `where`s: autodiff keeps a gradient that is zero outside many
//! masks two `where` layers deep (the inner masks combined with `and`), so a chain of 100,000 is
//! differentiated, planned, emitted and run on the test harness's ordinary thread (a 2 MiB stack),
//! and its gradient is the product of the chain's factors under all of its masks, exactly 0
//! elsewhere (NaN and infinite inputs included).

use std::sync::Arc;

use kfuse::{DType, Engine, HostTensor, KernelCache, Program};
use kfuse_ir::{Graph, Literal, NodeId, Op, TernaryOp};

/// The seed of the random inputs (fixed, so every run checks the same values).
const SEED: u64 = 1729;

fn engine() -> Engine {
    Engine::with_cache(Arc::new(KernelCache::memory_only()))
}

/// `lets` lets `a_i = where(x > threshold(i), a_{i-1} * factor(i), 0)` from `a_0 = x`, then
/// `outputs`.
fn where_chain(lets: usize, threshold: impl Fn(usize) -> f64, factor: impl Fn(usize) -> f64, outputs: &str) -> String {
    let mut src = String::with_capacity(lets * 48);
    src.push_str("input x: f32[N]\n");
    for i in 1..=lets {
        let prev = if i == 1 { "x".to_string() } else { format!("a{}", i - 1) };
        src.push_str(&format!("let a{i} = where(x > {:?}, {prev} * {:?}, 0)\n", threshold(i), factor(i)));
    }
    src.push_str(outputs);
    src
}

/// `n` inputs uniform in `[lo, hi)` from [`SEED`], then a NaN and a negative infinity (both
/// masked out by every `x > t`), as the f32 values the program sees.
fn inputs(n: usize, lo: f64, hi: f64) -> HostTensor {
    println!("inputs from seed {SEED}");
    let unit = kfuse_testing::random_tensor(DType::F32, &[n], SEED).to_f64();
    let mut v: Vec<f64> = unit.iter().map(|u| lo + (u + 1.0) / 2.0 * (hi - lo)).collect();
    v.extend([f64::NAN, f64::NEG_INFINITY]);
    HostTensor::from_f64(DType::F32, vec![v.len()], &v)
}

/// How many `where(m, _, 0)` layers sit directly around node `n`.
fn masked_layers(g: &Graph, mut n: NodeId) -> usize {
    let mut layers = 0;
    while let Op::Ternary(TernaryOp::Select, _, inner, zero) = g.nodes[n.index()].op {
        match g.nodes[zero.index()].op {
            Op::Const(Literal::Float(bits)) if f64::from_bits(bits) == 0.0 => {}
            _ => break,
        }
        layers += 1;
        n = inner;
    }
    layers
}

fn output(g: &Graph, name: &str) -> NodeId {
    g.outputs.iter().find(|o| o.name == name).map(|o| o.node).expect("the output exists")
}

/// Checks `got` against `want`: within `rel` where `want` is nonzero, exactly +0 where it is 0.
fn assert_close(what: &str, got: &[f64], want: &[f64], rel: f64) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        if w == 0.0 {
            assert!(g == 0.0 && g.is_sign_positive(), "{what}[{i}] = {g}, expected exactly 0");
        } else {
            assert!((g - w).abs() <= rel * w.abs(), "{what}[{i}] = {g}, expected {w}");
        }
    }
}

#[test]
fn the_gradient_through_a_hundred_and_fifty_wheres_is_the_product_of_their_factors_under_all_masks() {
    // a_i = where(x > i, a_{i-1} * 1.5, 0): 1.5^150 times the inputs, and their sum, are finite f32s.
    let lets = 150;
    let src = where_chain(lets, |i| i as f64, |_| 1.5, &format!("output y = sum(a{lets})\noutput dx = grad(y, x)\n"));
    let p = Program::compile(&engine(), &src, "chain.kf").unwrap();
    let g = p.graph();
    assert!((1..=2).contains(&masked_layers(g, output(g, "dx"))), "{}", masked_layers(g, output(g, "dx")));
    let x = inputs(64, -20.0, 2.0 * lets as f64);
    let out = p.run_cpu(&[("x", &x)]).unwrap();
    let xs = x.to_f64();
    assert!(xs.iter().any(|&v| v > lets as f64) && xs.iter().any(|&v| v > 1.0 && v <= lets as f64));
    let product = 1.5f64.powi(lets as i32);
    let dx: Vec<f64> = xs.iter().map(|&v| if v > lets as f64 { product } else { 0.0 }).collect();
    let y: f64 = xs.iter().zip(&dx).filter(|(_, &d)| d != 0.0).map(|(&v, &d)| v * d).sum();
    assert_eq!(out[1].0, "dx");
    assert_close("dx", &out[1].1.to_f64(), &dx, 1e-5);
    // The forward pass rounds to f32 at each of the 150 products.
    assert_close("y", &[out[0].1.scalar_f64().unwrap()], &[y], 1e-4);
}

#[test]
fn the_gradient_through_a_hundred_thousand_wheres_is_built_planned_emitted_and_run() {
    // Thresholds -1 ..= 1.5 in a scattered order (the combined mask is x > 1.5); the factors are
    // 1.5, then 2 and 0.5 in turn, so the product, 3, is exact.
    let lets = 100_000;
    let threshold = |i: usize| ((i * 7) % 11) as f64 / 4.0 - 1.0;
    let factor = |i: usize| match i {
        1 => 1.5,
        _ if i.is_multiple_of(2) => 2.0,
        _ => 0.5,
    };
    let src = where_chain(lets, threshold, factor, &format!("output y = sum(a{lets})\noutput dx = grad(y, x)\n"));
    let p = Program::compile(&engine(), &src, "chain.kf").unwrap();
    let g = p.graph();
    assert!((1..=2).contains(&masked_layers(g, output(g, "dx"))), "{}", masked_layers(g, output(g, "dx")));
    assert!(g.nodes.len() < 8 * lets, "{} nodes", g.nodes.len());
    assert!(p.cuda_source().contains("__global__"));
    let x = inputs(256, -3.0, 3.0);
    let out = p.run_cpu(&[("x", &x)]).unwrap();
    let xs = x.to_f64();
    let dx: Vec<f64> = xs.iter().map(|&v| if v > 1.5 { 3.0 } else { 0.0 }).collect();
    let y: f64 =
        xs.iter().zip(&dx).filter(|(_, &d)| d != 0.0).map(|(&v, &d)| f64::from((1.5 * v) as f32) * d / 1.5).sum();
    assert_close("dx", &out[1].1.to_f64(), &dx, 0.0);
    assert_close("y", &[out[0].1.scalar_f64().unwrap()], &[y], 1e-6);
}

#[test]
fn a_product_with_a_hundred_thousand_nested_wheres_is_differentiated() {
    // w_i = where(x > t_i, w_{i-1}, 0) nests 100,000 layers in the forward graph; the gradient of
    // `w * w` multiplies through all of them at once.
    let lets = 100_000;
    let mut src = String::from("input x: f32[N]\nlet w0 = x\n");
    for i in 1..=lets {
        src.push_str(&format!("let w{i} = where(x > {:?}, w{}, 0)\n", ((i * 5) % 13) as f64 / 8.0 - 0.5, i - 1));
    }
    src.push_str(&format!("output y = sum(w{lets} * w{lets} * 0.5)\noutput dx = grad(y, x)\n"));
    let p = Program::compile(&engine(), &src, "nested.kf").unwrap();
    let g = p.graph();
    assert!(g.nodes.len() < 8 * lets, "{} nodes", g.nodes.len());
    let x = inputs(256, -2.0, 2.0);
    let out = p.run_cpu(&[("x", &x)]).unwrap();
    // The combined mask is x > 12/8 - 1/2 = 1; y = sum(x² / 2) and dx = x under it.
    let xs = x.to_f64();
    let dx: Vec<f64> = xs.iter().map(|&v| if v > 1.0 { v } else { 0.0 }).collect();
    let y: f64 = dx.iter().map(|&v| f64::from((v * v) as f32) / 2.0).sum();
    assert_close("dx", &out[1].1.to_f64(), &dx, 0.0);
    assert_close("y", &[out[0].1.scalar_f64().unwrap()], &[y], 1e-6);
}
