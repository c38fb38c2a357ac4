//! An `i32` sum is an `i64`, as torch gives: exact beyond the `i32` range (and when partial sums
//! leave it), the GPU and the interpreter agreeing exactly. The GPU case skips, saying why,
//! without a GPU.

use std::sync::Arc;

use kfuse::{DType, Engine, HostTensor, KernelCache, Program};
use kfuse_testing::gpu_or_skip;

const PROGRAM: &str = "input x: i32[N]\ninput y: i32[B, K]\noutput s = sum(x)\noutput r = sum(y, axis: -1)\n";

fn program() -> Program {
    let engine = Engine::with_cache(Arc::new(KernelCache::memory_only()));
    Program::compile(&engine, PROGRAM, "int_sum.kf").expect("compiles")
}

fn ints(shape: Vec<usize>, v: &[f64]) -> HostTensor {
    HostTensor::from_f64(DType::I32, shape, v)
}

/// (x, y, s, r): s over x, r over y's rows.
fn cases() -> Vec<(HostTensor, HostTensor, f64, Vec<f64>)> {
    let max = f64::from(i32::MAX);
    let min = f64::from(i32::MIN);
    vec![
        (ints(vec![3], &[1.0, 2.0, 3.0]), ints(vec![1, 2], &[4.0, 5.0]), 6.0, vec![9.0]),
        // Partial sums leave the i32 range; the totals do not.
        (ints(vec![4], &[max, max, min, min + 2.0]), ints(vec![1, 3], &[max, 1.0, -2.0]), 0.0, vec![max - 1.0]),
        // Totals beyond it, exact.
        (
            ints(vec![3], &[1073741824.0; 3]),
            ints(vec![2, 2], &[max, 1.0, min, -1.0]),
            3221225472.0,
            vec![max + 1.0, min - 1.0],
        ),
    ]
}

#[test]
fn the_interpreter_sums_i32_into_an_exact_i64() {
    let p = program();
    for (x, y, s, r) in cases() {
        let out = p.run_cpu(&[("x", &x), ("y", &y)]).expect("runs on the CPU");
        assert_eq!((out[0].1.dtype(), out[1].1.dtype()), (DType::I64, DType::I64));
        assert_eq!(out[0].1.to_f64(), vec![s], "x {:?}", x.to_f64());
        assert_eq!(out[1].1.to_f64(), r, "y {:?}", y.to_f64());
    }
}

#[test]
fn a_gpu_sums_i32_into_the_same_exact_i64() {
    let Some(gpu) = gpu_or_skip("a_gpu_sums_i32_into_the_same_exact_i64") else { return };
    let p = program();
    for (x, y, s, r) in cases() {
        let out = p.run_gpu(gpu.ordinal(), &[("x", &x), ("y", &y)]).expect("runs on the GPU");
        assert_eq!(out[0].1.to_f64(), vec![s], "x {:?}", x.to_f64());
        assert_eq!(out[1].1.to_f64(), r, "y {:?}", y.to_f64());
    }
}
