//! `prod` along any axis, over everything and under a mask: the interpreter's values (1 for
//! nothing, zeros), its gradient as PyTorch's `prod_backward` (no zero, one zero, two zeros in a
//! row), clear errors for integers and bools, the kernels compiled by NVRTC (skips without
//! libnvrtc), and the GPU against the interpreter at odd sizes (skips without a GPU).

use std::sync::Arc;

use kfuse::{DType, Engine, HostTensor, KernelCache, Program};
use kfuse_runtime::testing::nvrtc_or_skip;
use kfuse_testing::gpu_or_skip;

mod common;
use common::{get, program};

const PRODUCTS: &str = "\
input x: f32[R, C]
output rows = prod(x, axis: -1)
output cols = prod(x, axis: 0, keepdim: true)
output all = prod(x)
output positive = prod(x, axis: -1, where: x > 0.0)
";

const GRADIENT: &str = "\
input x: f32[R, C]
input w: f32[R]
output dx = grad(sum(prod(x, axis: -1) * w), x)
output dcols = grad(sum(prod(x, axis: 0)), x)
";

#[rustfmt::skip]
const X: [f64; 12] = [
    1.0, 2.0, 3.0, 4.0,   // no zero
    0.0, 2.0, 0.5, -3.0,  // one zero
    0.0, 0.0, 5.0, 1.0,   // two zeros
];

#[test]
fn prod_multiplies_along_any_axis_over_everything_and_under_a_mask() {
    let x = HostTensor::from_f64(DType::F32, vec![3, 4], &X);
    let out = program(PRODUCTS, "prod.kf").run_cpu(&[("x", &x)]).expect("runs");
    assert_eq!(get(&out, "rows"), (vec![3], vec![24.0, 0.0, 0.0]));
    assert_eq!(get(&out, "cols"), (vec![1, 4], vec![0.0, 0.0, 7.5, -12.0]));
    assert_eq!(get(&out, "all"), (vec![], vec![0.0]));
    // Only the positive elements: 24, 2 * 0.5, 5 * 1.
    assert_eq!(get(&out, "positive"), (vec![3], vec![24.0, 1.0, 5.0]));
    // The product of nothing is 1.
    let empty = HostTensor::from_f64(DType::F32, vec![2, 0], &[]);
    let out = program(PRODUCTS, "prod.kf").run_cpu(&[("x", &empty)]).expect("runs");
    assert_eq!(get(&out, "rows"), (vec![2], vec![1.0, 1.0]));
    assert_eq!(get(&out, "all"), (vec![], vec![1.0]));
}

#[test]
fn the_gradient_of_prod_is_pytorchs_with_zeros() {
    let x = HostTensor::from_f64(DType::F32, vec![3, 4], &X);
    let w = HostTensor::from_f64(DType::F32, vec![3], &[2.0, 3.0, 5.0]);
    let out = program(GRADIENT, "prod.kf").run_cpu(&[("x", &x), ("w", &w)]).expect("runs");
    #[rustfmt::skip]
    let want = [
        48.0, 24.0, 16.0, 12.0,  // w * 24 / x
        -9.0, 0.0, 0.0, 0.0,     // the zero gets w * (2 * 0.5 * -3); the others 0
        0.0, 0.0, 0.0, 0.0,      // two zeros: 0 everywhere
    ];
    assert_eq!(get(&out, "dx"), (vec![3, 4], want.to_vec()));
    // Columns: [1, 0, 0] (two zeros) -> 0; [2, 2, 0] -> the zero gets 4; [3, 0.5, 5] -> 7.5 / x;
    // [4, -3, 1] -> -12 / x.
    #[rustfmt::skip]
    let cols = [
        0.0, 0.0, 2.5, -3.0,
        0.0, 0.0, 15.0, 4.0,
        0.0, 4.0, 1.5, -12.0,
    ];
    assert_eq!(get(&out, "dcols"), (vec![3, 4], cols.to_vec()));
}

#[test]
fn prod_of_integers_or_bools_is_a_clear_error() {
    let engine = Engine::with_cache(Arc::new(KernelCache::memory_only()));
    let cases: &[(&str, &[&str])] = &[
        ("input k: i32[3]\noutput o = prod(k)", &["prod", "i32", "cast"]),
        ("input k: i64[3, 2]\noutput o = prod(k, axis: 0)", &["prod", "i64", "cast"]),
        ("input x: f32[3]\noutput o = prod(x > 0.0)", &["prod", "bool"]),
    ];
    for (src, words) in cases {
        let msg = match Program::compile(&engine, &format!("{src}\n"), "bad.kf") {
            Ok(_) => panic!("expected an error for {src:?}"),
            Err(e) => e.to_string(),
        };
        for w in *words {
            assert!(msg.contains(w), "{src:?}: {w:?} not in: {msg}");
        }
    }
}

#[test]
fn prod_kernels_compile_for_sm80_and_sm90() {
    if nvrtc_or_skip("prod_kernels_compile_for_sm80_and_sm90").is_none() {
        return;
    }
    for src in [PRODUCTS, GRADIENT] {
        for k in &program(src, "prod.kf").plan().kernels {
            kfuse_testing::assert_compiles_for_sm80_and_sm90("prod", &k.name, &k.source);
        }
    }
}

/// Values near 1 (products of thousands stay finite) with an exact zero now and then.
fn near_one(n: usize, seed: u64) -> Vec<f64> {
    (0..n)
        .map(|e| {
            let h = (e as u64 ^ seed).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40;
            if h.is_multiple_of(97) {
                0.0
            } else {
                1.0 + ((h % 2001) as f64 - 1000.0) * 1e-5
            }
        })
        .collect()
}

#[test]
fn a_gpu_prod_and_its_gradient_match_the_interpreter_at_odd_sizes() {
    let Some(gpu) = gpu_or_skip("a_gpu_prod_and_its_gradient_match_the_interpreter_at_odd_sizes") else { return };
    let seed: u64 = std::env::var("KFUSE_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x9d0);
    println!("seed {seed} (KFUSE_TEST_SEED replays it)");
    let (products, gradient) = (program(PRODUCTS, "prod.kf"), program(GRADIENT, "prod.kf"));
    // Rows in registers (64), read from memory (37, 5003), one row, many rows.
    for (i, (r, c)) in [(1usize, 64usize), (3, 37), (255, 64), (9, 5003), (1023, 33)].into_iter().enumerate() {
        let s = seed + 10 * i as u64;
        let x = HostTensor::from_f64(DType::F32, vec![r, c], &near_one(r * c, s));
        let w = HostTensor::from_f64(DType::F32, vec![r], &near_one(r, s + 1));
        for (p, inputs) in [(&products, vec![("x", &x)]), (&gradient, vec![("x", &x), ("w", &w)])] {
            let want = p.run_cpu(&inputs).expect("the interpreter runs");
            let got = p.run_gpu(gpu.ordinal(), &inputs).expect("the GPU runs");
            for ((name, w), (_, g)) in want.iter().zip(&got) {
                assert_eq!(g.shape, w.shape, "[{r}, {c}] {name}");
                for (k, (a, b)) in g.to_f64().iter().zip(w.to_f64()).enumerate() {
                    // f64 products in another order, rounded to f32: at most an ulp or so apart.
                    assert!(
                        (a - b).abs() <= 1e-6 * b.abs().max(1e-30),
                        "[{r}, {c}] {name}[{k}]: gpu {a} vs interpreter {b}"
                    );
                }
            }
        }
    }
}
