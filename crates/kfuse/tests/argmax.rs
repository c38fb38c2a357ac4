//! `argmax` / `argmin` along one axis and over every element (the flat index): torch's answers on
//! ties (the first), NaN (the first NaN), infinities and integers in the interpreter; clear errors; the kernels compiled by NVRTC (skips
//! without libnvrtc); the GPU against the interpreter at odd sizes (skips without a GPU).

use std::sync::Arc;

use kfuse::{DType, Engine, HostTensor, KernelCache, Program};
use kfuse_runtime::testing::nvrtc_or_skip;
use kfuse_testing::{gpu_or_skip, random_tensor};

mod common;
use common::{get, program};

const ARGS: &str = "\
input x: f32[R, C]
input k: i32[R, C]
output last = argmax(x, axis: -1)
output first = argmin(x, axis: 0, keepdim: true)
output ints = argmax(k, axis: 1)
output flat = argmax(x)
output flat_min = argmin(k)
output kept = argmin(x, keepdim: true)
";

#[test]
fn argmax_and_argmin_give_torchs_first_position_with_ties_nan_and_infinities() {
    let (nan, inf) = (f64::NAN, f64::INFINITY);
    #[rustfmt::skip]
    let xs = [
        1.0, 5.0, 5.0, -2.0,   // a tie: the first 5
        nan, 3.0, nan, 9.0,    // NaN is the maximum and the minimum: the first NaN
        -inf, -inf, 0.0, inf,  // infinities
    ];
    let ks = [3.0, 7.0, 7.0, 1.0, -4.0, -4.0, -9.0, 0.0, 2.0, 2.0, 2.0, 2.0];
    let x = HostTensor::from_f64(DType::F32, vec![3, 4], &xs);
    let k = HostTensor::from_f64(DType::I32, vec![3, 4], &ks);
    let out = program(ARGS, "argmax.kf").run_cpu(&[("x", &x), ("k", &k)]).expect("runs");
    let (shape, last) = get(&out, "last");
    assert_eq!(shape, vec![3]);
    assert_eq!(last, vec![1.0, 0.0, 3.0]);
    let (shape, first) = get(&out, "first");
    assert_eq!(shape, vec![1, 4]);
    // Column minima: 1 vs NaN vs -inf -> NaN at row 1; 5, 3, -inf -> row 2; 5, NaN, 0 -> row 1;
    // -2, 9, inf -> row 0.
    assert_eq!(first, vec![1.0, 2.0, 1.0, 0.0]);
    let (_, ints) = get(&out, "ints");
    assert_eq!(ints, vec![1.0, 3.0, 0.0]);
    // Over every element, row-major: the first NaN (position 4) is the maximum and the minimum;
    // the integers' minimum -9 is at position 6.
    assert_eq!(get(&out, "flat"), (vec![], vec![4.0]));
    assert_eq!(get(&out, "flat_min"), (vec![], vec![6.0]));
    assert_eq!(get(&out, "kept"), (vec![1, 1], vec![4.0]));
    // Without NaN: the flat index of the first maximum (-inf and inf included).
    let finite =
        HostTensor::from_f64(DType::F32, vec![3, 4], &[1.0, 5.0, 9.0, -2.0, 9.0, 3.0, 0.0, 9.0, -inf, 7.0, 0.0, -inf]);
    let out = program(ARGS, "argmax.kf").run_cpu(&[("x", &finite), ("k", &k)]).expect("runs");
    assert_eq!(get(&out, "flat"), (vec![], vec![2.0]));
    assert_eq!(get(&out, "kept"), (vec![1, 1], vec![8.0]));
    assert!(out.iter().all(|(_, t)| t.dtype() == DType::I64), "every result is i64");
}

#[test]
fn argmax_refuses_a_bad_axis_a_bool_and_a_keepdim_that_is_not_a_bool() {
    let engine = Engine::with_cache(Arc::new(KernelCache::memory_only()));
    let cases: &[(&str, &[&str])] = &[
        ("output o = argmin(x, axis: 2)", &["argmin", "axis 2"]),
        ("output o = argmax(x > 0.0, axis: 0)", &["argmax", "bool"]),
        ("output o = argmax(x, axis: 0, keepdim: 1)", &["keepdim"]),
    ];
    for (body, words) in cases {
        let src = format!("input x: f32[3, 4]\n{body}\n");
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
fn argmax_kernels_compile_for_sm80_and_sm90() {
    if nvrtc_or_skip("argmax_kernels_compile_for_sm80_and_sm90").is_none() {
        return;
    }
    for k in &program(ARGS, "argmax.kf").plan().kernels {
        kfuse_testing::assert_compiles_for_sm80_and_sm90("argmax", &k.name, &k.source);
    }
}

#[test]
fn a_gpu_argmax_matches_the_interpreter_at_odd_sizes() {
    let Some(gpu) = gpu_or_skip("a_gpu_argmax_matches_the_interpreter_at_odd_sizes") else { return };
    let seed: u64 = std::env::var("KFUSE_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0xa4a);
    println!("seed {seed} (KFUSE_TEST_SEED replays it)");
    let p = program(ARGS, "argmax.kf");
    // Rows in registers (64), read from memory (37, 5003); one row; ties from a small range of ints.
    for (i, (r, c)) in [(1usize, 64usize), (3, 37), (255, 64), (9, 5003)].into_iter().enumerate() {
        let s = seed + 10 * i as u64;
        let x = random_tensor(DType::F32, &[r, c], s);
        let ks: Vec<f64> = (0..r * c).map(|e| ((e as u64 * 2654435761 + s) % 7) as f64).collect();
        let k = HostTensor::from_f64(DType::I32, vec![r, c], &ks);
        let inputs = [("x", &x), ("k", &k)];
        let want = p.run_cpu(&inputs).expect("the interpreter runs");
        let got = p.run_gpu(gpu.ordinal(), &inputs).expect("the GPU runs");
        for ((name, w), (_, g)) in want.iter().zip(&got) {
            assert_eq!((g.shape.clone(), g.to_f64()), (w.shape.clone(), w.to_f64()), "[{r}, {c}] {name}");
        }
    }
}
