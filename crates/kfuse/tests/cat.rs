//! `cat([..], axis: A)` (torch.cat) and `stack([..], axis: A)` (torch.stack): values and gradients
//! on the CPU against hand-computed ones,
//! the errors of parts that do not fit, the kernels compiled by NVRTC (skips without libnvrtc),
//! and the GPU against the interpreter at odd sizes (skips without a GPU).

use std::sync::Arc;

use kfuse::{DType, Engine, HostTensor, KernelCache, Program};
use kfuse_runtime::testing::nvrtc_or_skip;
use kfuse_testing::{gpu_or_skip, random_tensor};

mod common;
use common::{compare, get, program};

/// Parts joined along the first, a middle and the last axis, of mixed dtypes, with a gradient.
const CATS: &str = "\
input a: f32[B, 2, 3]
input b: f32[B, 4, 3]
input c: bf16[B, 4, 1]
input d: f32[2, 3]
output rows = cat([a, b], axis: 1)
output last = cat([b, c, b * 2.0], axis: -1)
output first = cat([d, d * 3.0], axis: 0)
output da = grad(sum(cat([a, b], axis: 1) * cat([b, a], axis: 1)), a)
";

/// Parts stacked along a new first, middle and last axis, with a gradient.
const STACKS: &str = "\
input a: f32[B, 3]
input b: f32[B, 3]
output first = stack([a, b * 2.0], axis: 0)
output mid = stack([a, b], axis: 1)
output last = stack(a, b, axis: -1)
output da = grad(sum(stack([a, b * 3.0], axis: 1) * stack([b, a], axis: 1)), a)
";

/// Element `(i, j, k)` of a row-major `[_, n1, n2]` tensor.
fn at(v: &[f64], n1: usize, n2: usize, i: usize, j: usize, k: usize) -> f64 {
    v[(i * n1 + j) * n2 + k]
}

#[test]
fn cat_joins_the_parts_along_any_axis_and_its_gradient_splits_the_upstream_one() {
    let bsz = 2;
    let av: Vec<f64> = (0..bsz * 6).map(|i| i as f64).collect();
    let bv: Vec<f64> = (0..bsz * 12).map(|i| 100.0 + i as f64).collect();
    let cv: Vec<f64> = (0..bsz * 4).map(|i| -(i as f64)).collect();
    let inputs = [
        ("a", HostTensor::from_f64(DType::F32, vec![bsz, 2, 3], &av)),
        ("b", HostTensor::from_f64(DType::F32, vec![bsz, 4, 3], &bv)),
        ("c", HostTensor::from_f64(DType::BF16, vec![bsz, 4, 1], &cv)),
        ("d", HostTensor::from_f64(DType::F32, vec![2, 3], &av[..6])),
    ];
    let named: Vec<(&str, &HostTensor)> = inputs.iter().map(|(n, t)| (*n, t)).collect();
    let out = program(CATS, "cat.kf").run_cpu(&named).expect("runs");
    let (shape, rows) = get(&out, "rows");
    assert_eq!(shape, vec![bsz, 6, 3]);
    let (shape, last) = get(&out, "last");
    assert_eq!(shape, vec![bsz, 4, 7]);
    let (shape, first) = get(&out, "first");
    assert_eq!(shape, vec![4, 3]);
    let (_, da) = get(&out, "da");
    for i in 0..bsz {
        for j in 0..6 {
            for k in 0..3 {
                let want = if j < 2 { at(&av, 2, 3, i, j, k) } else { at(&bv, 4, 3, i, j - 2, k) };
                assert_eq!(at(&rows, 6, 3, i, j, k), want, "rows[{i}, {j}, {k}]");
            }
        }
        for j in 0..4 {
            for k in 0..7 {
                let want = match k {
                    0..=2 => at(&bv, 4, 3, i, j, k),
                    3 => at(&cv, 4, 1, i, j, 0),
                    _ => 2.0 * at(&bv, 4, 3, i, j, k - 4),
                };
                assert_eq!(at(&last, 4, 7, i, j, k), want, "last[{i}, {j}, {k}]");
            }
        }
        // sum(cat(a, b) * cat(b, a)) along axis 1: rows 0..2 hold a * b[.., 0..2], rows 4..6
        // hold b[.., 2..4] * a, so da = b[.., 0..2] + b[.., 2..4].
        for j in 0..2 {
            for k in 0..3 {
                let want = at(&bv, 4, 3, i, j, k) + at(&bv, 4, 3, i, 2 + j, k);
                assert_eq!(at(&da, 2, 3, i, j, k), want, "da[{i}, {j}, {k}]");
            }
        }
    }
    for j in 0..4 {
        for k in 0..3 {
            let want = if j < 2 { av[j * 3 + k] } else { 3.0 * av[(j - 2) * 3 + k] };
            assert_eq!(first[j * 3 + k], want, "first[{j}, {k}]");
        }
    }
}

#[test]
fn stack_puts_the_parts_along_a_new_axis_anywhere_and_its_gradient_routes_back() {
    let bsz = 3;
    let av: Vec<f64> = (0..bsz * 3).map(|i| i as f64).collect();
    let bv: Vec<f64> = (0..bsz * 3).map(|i| 100.0 + i as f64).collect();
    let inputs = [
        ("a", HostTensor::from_f64(DType::F32, vec![bsz, 3], &av)),
        ("b", HostTensor::from_f64(DType::F32, vec![bsz, 3], &bv)),
    ];
    let named: Vec<(&str, &HostTensor)> = inputs.iter().map(|(n, t)| (*n, t)).collect();
    let out = program(STACKS, "stack.kf").run_cpu(&named).expect("runs");
    let (shape, first) = get(&out, "first");
    assert_eq!(shape, vec![2, bsz, 3]);
    let (shape, mid) = get(&out, "mid");
    assert_eq!(shape, vec![bsz, 2, 3]);
    let (shape, last) = get(&out, "last");
    assert_eq!(shape, vec![bsz, 3, 2]);
    let (shape, da) = get(&out, "da");
    assert_eq!(shape, vec![bsz, 3]);
    for i in 0..bsz {
        for k in 0..3 {
            let (x, y) = (av[i * 3 + k], bv[i * 3 + k]);
            assert_eq!(at(&first, bsz, 3, 0, i, k), x, "first[0, {i}, {k}]");
            assert_eq!(at(&first, bsz, 3, 1, i, k), 2.0 * y, "first[1, {i}, {k}]");
            assert_eq!(at(&mid, 2, 3, i, 0, k), x, "mid[{i}, 0, {k}]");
            assert_eq!(at(&mid, 2, 3, i, 1, k), y, "mid[{i}, 1, {k}]");
            assert_eq!(at(&last, 3, 2, i, k, 0), x, "last[{i}, {k}, 0]");
            assert_eq!(at(&last, 3, 2, i, k, 1), y, "last[{i}, {k}, 1]");
            // sum(a * b + 3 b * a): da = 4 b.
            assert_eq!(da[i * 3 + k], 4.0 * y, "da[{i}, {k}]");
        }
    }
}

#[test]
fn parts_that_do_not_fit_are_clear_errors() {
    let engine = Engine::with_cache(Arc::new(KernelCache::memory_only()));
    let cases: &[(&str, &[&str])] = &[
        ("output o = cat([x, y], axis: 1)", &["cat", "part 1", "other than 1"]),
        ("output o = cat([x, s], axis: 0)", &["cat", "constant size"]),
        ("output o = cat([x, x], axis: 3)", &["axis 3"]),
        ("output o = cat(x, axis: 0)", &["as a list"]),
        ("output o = cat([], axis: 0)", &["at least one part"]),
        ("output o = stack([x, x], axis: 3)", &["stack", "axis 3", "0 to 2"]),
        ("output o = stack([x, y], axis: 0)", &["stack"]),
        ("output o = stack([], axis: 0)", &["at least one part"]),
        ("output o = stack([x, x], axis: 0.5)", &["integer literal"]),
    ];
    for (body, words) in cases {
        let src = format!("input x: f32[3, 4]\ninput y: f32[2, 4]\ninput s: f32[N, 4]\n{body}\n");
        let msg = match Program::compile(&engine, &src, "bad.kf") {
            Ok(_) => panic!("expected an error for {body:?}"),
            Err(e) => e.to_string(),
        };
        for w in *words {
            assert!(msg.contains(w), "{body:?}: {w:?} not in: {msg}");
        }
    }
}

#[test]
fn kernels_reading_cats_compile_for_sm80_and_sm90() {
    if nvrtc_or_skip("kernels_reading_cats_compile_for_sm80_and_sm90").is_none() {
        return;
    }
    for (src, name) in [(CATS, "cat.kf"), (STACKS, "stack.kf")] {
        let p = program(src, name);
        for k in &p.plan().kernels {
            kfuse_testing::assert_compiles_for_sm80_and_sm90(name, &k.name, &k.source);
        }
    }
}

#[test]
fn a_gpu_cat_and_stack_match_the_interpreter_at_odd_sizes() {
    let Some(gpu) = gpu_or_skip("a_gpu_cat_and_stack_match_the_interpreter_at_odd_sizes") else { return };
    let seed: u64 = std::env::var("KFUSE_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0xca7);
    println!("seed {seed} (KFUSE_TEST_SEED replays it)");
    let p = program(CATS, "cat.kf");
    for (k, b) in [1usize, 3, 255, 1023].into_iter().enumerate() {
        let s = seed + 10 * k as u64;
        let (a, bb, c) = (
            random_tensor(DType::F32, &[b, 2, 3], s),
            random_tensor(DType::F32, &[b, 4, 3], s + 1),
            random_tensor(DType::BF16, &[b, 4, 1], s + 2),
        );
        let d = random_tensor(DType::F32, &[2, 3], s + 3);
        let inputs = [("a", &a), ("b", &bb), ("c", &c), ("d", &d)];
        let want = p.run_cpu(&inputs).expect("the interpreter runs");
        let got = p.run_gpu(gpu.ordinal(), &inputs).expect("the GPU runs");
        for ((name, w), (_, g)) in want.iter().zip(&got) {
            assert_eq!(g.shape, w.shape, "B={b} {name}");
            for (e, (x, y)) in g.to_f64().iter().zip(w.to_f64()).enumerate() {
                assert!((x - y).abs() <= 1e-5 * y.abs().max(1.0), "B={b} {name}[{e}]: gpu {x} vs {y}");
            }
        }
        let (a, bb) = (random_tensor(DType::F32, &[b, 3], s + 4), random_tensor(DType::F32, &[b, 3], s + 5));
        compare(&program(STACKS, "stack.kf"), gpu.ordinal(), &[("a", &a), ("b", &bb)], &format!("stack B={b}"), 1e-5);
    }
}
