//! Reductions over leading, middle and several axes (column sums, `keepdim`, masks, a weight
//! gradient) end to end: hand values on the CPU, the kernels compiled by NVRTC (skips without
//! libnvrtc), and the GPU against the interpreter at odd sizes (skips without a GPU).

use kfuse::{DType, HostTensor};
use kfuse_runtime::{compile, testing::nvrtc_or_skip, Arch, CompileOptions};
use kfuse_testing::{gpu_or_skip, random_tensor};

mod common;
use common::{compare, program, t};

const RANK3: &str = "\
input x: f32[B, N, D]
input m: bool[N, D]
output col = sum(x, axis: 0)
output mid = max(x, axis: 1, keepdim: true)
output both = mean(x, axis: [0, 2])
output masked = sum(x, axis: -3, where: m)
output cnt = count(m, axis: 0)
output centered = x - mean(x, axis: [0, 1], keepdim: true)
";

const COLUMNS: &str = "\
input x: f32[R, C]
input bias: f32[C]
let y = x + bias
output c0 = sum(x, axis: 0)
output lo = min(x, axis: 0, keepdim: true)
output loss = sum(y * y)
output dbias = grad(loss, bias)
";

#[test]
fn column_middle_and_list_reductions_give_the_hand_values() {
    let p = program(RANK3, "axes.kf");
    // x[b, n, d] = 4b + 2n + d over [2, 2, 2]; m masks n = 1, d = 0 out.
    let x: Vec<f64> = (0..8).map(f64::from).collect();
    let m = HostTensor::from_f64(DType::Bool, vec![2, 2], &[1.0, 1.0, 0.0, 1.0]);
    let out = p.run_cpu(&[("x", &t(&[2, 2, 2], &x)), ("m", &m)]).expect("runs");
    let get = |name: &str| out.iter().find(|(n, _)| n == name).map(|(_, v)| (v.shape.clone(), v.to_f64())).unwrap();
    assert_eq!(get("col"), (vec![2, 2], vec![4.0, 6.0, 8.0, 10.0]));
    assert_eq!(get("mid"), (vec![2, 1, 2], vec![2.0, 3.0, 6.0, 7.0]));
    assert_eq!(get("both"), (vec![2], vec![2.5, 4.5]));
    assert_eq!(get("masked"), (vec![2, 2], vec![4.0, 6.0, 0.0, 10.0]));
    assert_eq!(get("cnt"), (vec![2], vec![1.0, 2.0]));
    // mean over [0, 1] keeps [1, 1, 2]: 3 for d = 0 and 4 for d = 1.
    assert_eq!(get("centered"), (vec![2, 2, 2], vec![-3.0, -3.0, -1.0, -1.0, 1.0, 1.0, 3.0, 3.0]));
    let p = program(COLUMNS, "axes.kf");
    let out =
        p.run_cpu(&[("x", &t(&[3, 2], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0])), ("bias", &t(&[2], &[0.5, -1.0]))]).unwrap();
    let get = |name: &str| out.iter().find(|(n, _)| n == name).map(|(_, v)| v.to_f64()).unwrap();
    assert_eq!(get("c0"), vec![9.0, 12.0]);
    assert_eq!(get("lo"), vec![1.0, 2.0]);
    // d/dbias sum((x + bias)^2) = 2 * column sums of x + bias.
    assert_eq!(get("dbias"), vec![2.0 * (9.0 + 1.5), 2.0 * (12.0 - 3.0)]);
}

#[test]
fn column_reduction_kernels_compile_for_sm80_and_sm90() {
    if nvrtc_or_skip("column_reduction_kernels_compile_for_sm80_and_sm90").is_none() {
        return;
    }
    for src in [RANK3, COLUMNS] {
        let p = program(src, "axes.kf");
        let source = p.cuda_source();
        assert!(source.contains("over axes [0"), "a column loop is emitted:\n{source}");
        for k in &p.plan().kernels {
            for arch in [Arch::new(8, 0), Arch::new(9, 0)] {
                if let Err(e) = compile(&k.source, &CompileOptions::for_arch(arch)) {
                    panic!("{} does not compile for {}: {e}\n{}", k.name, arch.sm_name(), k.source);
                }
            }
        }
    }
}

#[test]
fn a_gpu_reduces_any_axes_like_the_interpreter_at_odd_sizes() {
    let Some(gpu) = gpu_or_skip("a_gpu_reduces_any_axes_like_the_interpreter_at_odd_sizes") else { return };
    let rank3 = program(RANK3, "axes.kf");
    for (seed, (b, n, d)) in [(1, 1, 1), (3, 1, 33), (1, 33, 3), (33, 3, 1), (3, 33, 33)].into_iter().enumerate() {
        let x = random_tensor(DType::F32, &[b, n, d], seed as u64);
        let m = random_tensor(DType::Bool, &[n, d], seed as u64 + 100);
        compare(&rank3, gpu.ordinal(), &[("x", &x), ("m", &m)], &format!("[{b}, {n}, {d}]"), 1e-5);
    }
    let columns = program(COLUMNS, "axes.kf");
    for (seed, (r, c)) in [(1, 1), (1, 3), (3, 1), (33, 3), (1023, 33), (3, 1023), (1023, 1023)].into_iter().enumerate()
    {
        let x = random_tensor(DType::F32, &[r, c], seed as u64 + 7);
        let bias = random_tensor(DType::F32, &[c], seed as u64 + 9);
        compare(&columns, gpu.ordinal(), &[("x", &x), ("bias", &bias)], &format!("[{r}, {c}]"), 1e-5);
    }
}
