//! An `i32` sum never wraps: in range, the GPU and the interpreter agree exactly (even when
//! partial sums leave the range); out of range, the interpreter refuses it and a GPU kernel clamps
//! it to the nearest `i32` limit. The GPU cases skip, saying why, without a GPU.

use std::sync::Arc;

use kfuse::{DType, Engine, Error, HostTensor, KernelCache, Program};
use kfuse_testing::gpu_or_skip;

const PROGRAM: &str = "input x: i32[N]\ninput y: i32[B, K]\noutput s = sum(x)\noutput r = sum(y, axis: -1)\n";

fn program() -> Program {
    let engine = Engine::with_cache(Arc::new(KernelCache::memory_only()));
    Program::compile(&engine, PROGRAM, "int_sum.kf").expect("compiles")
}

fn ints(shape: Vec<usize>, v: &[f64]) -> HostTensor {
    HostTensor::from_f64(DType::I32, shape, v)
}

/// (x, y, whether both sums fit, s, r): s over x, r over y's rows.
fn cases() -> Vec<(HostTensor, HostTensor, bool, f64, Vec<f64>)> {
    let max = f64::from(i32::MAX);
    let min = f64::from(i32::MIN);
    vec![
        (ints(vec![3], &[1.0, 2.0, 3.0]), ints(vec![1, 2], &[4.0, 5.0]), true, 6.0, vec![9.0]),
        // Partial sums leave the range; the totals do not.
        (ints(vec![4], &[max, max, min, min + 2.0]), ints(vec![1, 3], &[max, 1.0, -2.0]), true, 0.0, vec![max - 1.0]),
        (ints(vec![3], &[1073741824.0; 3]), ints(vec![2, 2], &[max, 1.0, min, -1.0]), false, max, vec![max, min]),
    ]
}

#[test]
fn the_interpreter_sums_exactly_and_refuses_a_total_outside_the_range() {
    let p = program();
    for (x, y, fits, s, r) in cases() {
        match p.run_cpu(&[("x", &x), ("y", &y)]) {
            Ok(out) if fits => {
                assert_eq!(out[0].1.to_f64(), vec![s]);
                assert_eq!(out[1].1.to_f64(), r);
            }
            Err(Error::Interp(kfuse_interp::InterpError::IntOverflow { op: "sum", .. })) if !fits => {}
            other => panic!("x {:?}: unexpected {:?}", x.to_f64(), other.map(|o| o.len())),
        }
    }
}

#[test]
fn a_gpu_sums_exactly_and_clamps_a_total_outside_the_range() {
    let Some(gpu) = gpu_or_skip("a_gpu_sums_exactly_and_clamps_a_total_outside_the_range") else { return };
    let p = program();
    for (x, y, _, s, r) in cases() {
        let out = p.run_gpu(gpu.ordinal(), &[("x", &x), ("y", &y)]).expect("runs on the GPU");
        assert_eq!(out[0].1.to_f64(), vec![s], "x {:?}", x.to_f64());
        assert_eq!(out[1].1.to_f64(), r, "y {:?}", y.to_f64());
    }
}
