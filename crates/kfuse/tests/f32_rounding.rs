//! Pure tier: the interpreter in f32 (every float value rounded as the kernels compute it)
//! against the f64 reference: about one ulp apart where nothing cancels, far more where large
//! terms cancel, which is what the GPU tests allow for.

use std::sync::Arc;

use kfuse::{Engine, HostTensor, Program, TensorData};

fn compile(src: &str) -> Program {
    let engine = Engine::with_cache(Arc::new(kfuse::KernelCache::memory_only()));
    Program::compile(&engine, src, "test").expect("compiles")
}

fn f32s(t: &HostTensor) -> Vec<f32> {
    match &t.data {
        TensorData::F32(v) => v.clone(),
        other => panic!("f32 output expected, got {other:?}"),
    }
}

/// The largest difference of `a` and `b` relative to `b`'s largest magnitude.
fn rel_diff(a: &[f32], b: &[f32]) -> f64 {
    let scale = b.iter().fold(0.0f64, |m, &v| m.max(f64::from(v).abs()));
    a.iter().zip(b).fold(0.0f64, |m, (&x, &y)| m.max((f64::from(x) - f64::from(y)).abs())) / scale
}

#[test]
fn f32_rounding_loses_what_an_addition_to_one_cannot_hold() {
    let p = compile("input x: f32[N]\noutput y = (x + 1.0) - 1.0\n");
    let x = HostTensor::new(vec![2], TensorData::F32(vec![1e-4, 0.5]));
    let exact = f32s(&p.run_cpu(&[("x", &x)]).unwrap()[0].1);
    let rounded = f32s(&p.run_cpu_f32(&[("x", &x)]).unwrap()[0].1);
    assert_eq!(exact, vec![1e-4, 0.5], "f64 keeps every digit");
    // 1 + 1e-4 in f32 is 1.00010001659393: 1e-4 comes back as 1.0001659e-4.
    assert_eq!(rounded[0], (1.0f32 + 1e-4) - 1.0);
    assert!((f64::from(rounded[0]) - 1e-4).abs() > 1e-8, "{rounded:?}");
    assert_eq!(rounded[1], 0.5);
}

#[test]
fn rms_norm_over_rows_of_one_element_has_a_gradient_that_f32_resolves_only_roughly() {
    let p = compile(
        "input x: f32[B, D]\ninput w: f32[D]\ninput dy: f32[B, D]\n\
         let r = rsqrt(mean(x * x, axis: -1, keepdim: true) + 0.00001)\n\
         output y = x * r * w\noutput loss = sum(y * dy)\noutput dx = grad(loss, x)\n",
    );
    let xs: Vec<f32> = (0..16).map(|k| 0.02 + 0.013 * k as f32).collect();
    let x = HostTensor::new(vec![16, 1], TensorData::F32(xs));
    let w = HostTensor::new(vec![1], TensorData::F32(vec![1.3]));
    let dy = HostTensor::new(vec![16, 1], TensorData::F32((0..16).map(|k| 0.7 - 0.05 * k as f32).collect()));
    let inputs = [("x", &x), ("w", &w), ("dy", &dy)];
    let exact = p.run_cpu(&inputs).unwrap();
    let rounded = p.run_cpu_f32(&inputs).unwrap();
    let output = |outs: &[(String, HostTensor)], name: &str| f32s(&outs.iter().find(|(n, _)| n == name).unwrap().1);
    // y = x / |x| * w (almost): nothing cancels, a few ulps at most.
    assert!(rel_diff(&output(&rounded, "y"), &output(&exact, "y")) < 4.0 * f64::from(f32::EPSILON));
    // dx = dy * w * r * (1 - x² r²): two terms of size dy * w * r cancel into one of size
    // dy * w * r * ε / (x² + ε); f32 rounding moves it by many ulps of itself.
    let moved = rel_diff(&output(&rounded, "dx"), &output(&exact, "dx"));
    assert!(moved > 10.0 * f64::from(f32::EPSILON), "dx moved by only {moved:.2e}");
}

#[test]
fn an_output_that_a_later_sum_reads_is_rounded_to_its_dtype_as_the_kernels_store_it() {
    // dbias sums the stored bf16 dx (a later kernel reads the stored tensor): the f32 run rounds dx
    // to bf16 before the sum, where the f64 reference sums it unrounded.
    let p = compile("input x: bf16[B, D]\noutput dx = x * 3.0\noutput dbias = sum(dx, axis: 0)\n");
    let x = HostTensor::from_f64(kfuse::DType::BF16, vec![3, 1], &[1.0078125; 3]);
    let exact = p.run_cpu(&[("x", &x)]).unwrap();
    let rounded = p.run_cpu_f32(&[("x", &x)]).unwrap();
    let dx = rounded[0].1.to_f64();
    assert_eq!(dx, exact[0].1.to_f64(), "an output alone is rounded once either way");
    let stored_sum = HostTensor::from_f64(kfuse::DType::BF16, vec![1], &[dx.iter().sum()]).to_f64();
    assert_eq!(rounded[1].1.to_f64(), stored_sum, "the sum of dx as stored");
    // 3 * 1.0078125 = 3.0234375 is stored as 3.03125: 9.125 summed as stored, 9.0625 unrounded.
    assert_eq!(exact[1].1.to_f64(), vec![9.0625]);
    assert_eq!(stored_sum, vec![9.125]);
}

#[test]
fn rounding_upward_moves_a_cancelling_sum_by_about_the_sum_of_its_terms_errors() {
    // loss = sum(y * dy) over products of both signs: the terms' rounding errors to nearest may
    // cancel; upward they share a sign, so the sum moves by a fair share of u * sum(|y * dy|).
    const RMS_NORM: &str = "input x: f32[B, C]\ninput w: f32[C]\ninput dy: f32[B, C]\n\
         let y = x * rsqrt(mean(x * x, axis: -1, keepdim: true) + 0.00001) * w\n";
    let p = compile(&format!("{RMS_NORM}output loss = sum(y * dy)\n"));
    let (b, c) = (33usize, 4096usize);
    // A fixed pattern of mixed signs and magnitudes (no randomness needed to cancel).
    let wave = |k: usize, f: f64| ((k as f64 * f).sin() * 1.7) as f32;
    let x = HostTensor::new(vec![b, c], TensorData::F32((0..b * c).map(|k| wave(k, 0.37)).collect()));
    let w = HostTensor::new(vec![c], TensorData::F32((0..c).map(|k| 1.0 + 0.5 * wave(k, 0.11)).collect()));
    let dy = HostTensor::new(vec![b, c], TensorData::F32((0..b * c).map(|k| wave(k, 0.73)).collect()));
    let inputs = [("x", &x), ("w", &w), ("dy", &dy)];
    let loss = |outs: Vec<(String, HostTensor)>| outs[0].1.to_f64()[0];
    let exact = loss(p.run_cpu(&inputs).unwrap());
    let upward = loss(p.run_cpu_f32_upward(&inputs).unwrap());
    // The terms' magnitudes, from the f64 run's own pieces.
    let p_abs = compile(&format!("{RMS_NORM}output s = sum(abs(y * dy))\n"));
    let magnitude = loss(p_abs.run_cpu(&inputs).unwrap());
    let u = f64::from(f32::EPSILON) / 2.0;
    let moved = upward - exact;
    assert!(exact.abs() < magnitude / 10.0, "the terms cancel: sum {exact:.3e} of magnitudes {magnitude:.3e}");
    // Every term's own rounding moves it up; an error in y reaches the term with dy's sign, so not
    // every error adds, but most of the terms' errors do. Here: 0.72 u * sum(|terms|).
    assert!(moved > 0.1 * u * magnitude, "moved {moved:.3e}, u * sum|terms| = {:.3e}", u * magnitude);
    assert!(moved < 8.0 * u * magnitude, "moved {moved:.3e}, u * sum|terms| = {:.3e}", u * magnitude);
}
