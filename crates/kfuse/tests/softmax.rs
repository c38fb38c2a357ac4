//! Pure tier: `softmax`, `log_softmax` and `detach` in the interpreter, against the same math
//! written out, and their gradients against the written-out form's (the detached maximum changes
//! no gradient: the result does not depend on the shift), on random rows with a printed seed.

use std::sync::Arc;

use kfuse::{Engine, HostTensor, Program, TensorData};

fn compile(src: &str) -> Program {
    let engine = Engine::with_cache(Arc::new(kfuse::KernelCache::memory_only()));
    Program::compile(&engine, src, "test").expect("compiles")
}

fn f32s(outs: &[(String, HostTensor)], name: &str) -> Vec<f32> {
    match &outs.iter().find(|(n, _)| n == name).expect("output").1.data {
        TensorData::F32(v) => v.clone(),
        other => panic!("f32 output expected, got {other:?}"),
    }
}

/// `n` values in about [-4, 4) from a small linear congruential generator.
fn random(seed: u64, n: usize) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 8.0 - 4.0
        })
        .collect()
}

fn assert_close(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len());
    for (k, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= 1e-6 * (1.0 + w.abs()), "{what}[{k}]: {g} vs {w}");
    }
}

const WRITTEN_OUT: &str = "input x: f32[B, C]\ninput dy: f32[B, C]\n\
    let m = max(x, axis: AXIS, keepdim: true)\n\
    let z = x - m\n\
    let s = sum(exp(z), axis: AXIS, keepdim: true)\n\
    output sm = exp(z) / s\n\
    output lsm = z - log(s)\n\
    let loss = sum(sm * dy) + sum(lsm * dy * dy)\n\
    output dx = grad(loss, x)\n";

const BUILT_IN: &str = "input x: f32[B, C]\ninput dy: f32[B, C]\n\
    output sm = softmax(x, axis: AXIS)\n\
    output lsm = log_softmax(x, axis: AXIS)\n\
    let loss = sum(sm * dy) + sum(lsm * dy * dy)\n\
    output dx = grad(loss, x)\n";

#[test]
fn softmax_and_log_softmax_match_the_math_written_out_with_their_gradients() {
    let seed = 0x5eed_50f7;
    println!("seed {seed:#x}");
    for (axis, (b, c)) in [("-1", (5, 7)), ("0", (6, 3)), ("1", (1, 13))] {
        let x = HostTensor::new(vec![b, c], TensorData::F32(random(seed, b * c)));
        let dy = HostTensor::new(vec![b, c], TensorData::F32(random(seed + 1, b * c)));
        let inputs = [("x", &x), ("dy", &dy)];
        let want = compile(&WRITTEN_OUT.replace("AXIS", axis)).run_cpu(&inputs).unwrap();
        let got = compile(&BUILT_IN.replace("AXIS", axis)).run_cpu(&inputs).unwrap();
        for name in ["sm", "lsm", "dx"] {
            assert_close(&f32s(&got, name), &f32s(&want, name), &format!("{name} along axis {axis}"));
        }
        // Each softmax row sums to 1.
        let sm = f32s(&got, "sm");
        if axis != "0" {
            for r in sm.chunks(c) {
                assert!((r.iter().sum::<f32>() - 1.0).abs() < 1e-5, "{r:?}");
            }
        }
    }
}

#[test]
fn no_gradient_flows_through_detach() {
    let p = compile(
        "input x: f32[N]\noutput y = detach(x) * x\noutput dx = grad(sum(detach(x) * x), x)\n\
         output dz = grad(sum(detach(x * x)) + sum(x), x)\n",
    );
    let x = HostTensor::new(vec![3], TensorData::F32(vec![1.5, -2.0, 0.25]));
    let outs = p.run_cpu(&[("x", &x)]).unwrap();
    assert_eq!(f32s(&outs, "y"), vec![2.25, 4.0, 0.0625]);
    // d/dx of detach(x) * x is detach(x): the first factor contributes nothing.
    assert_eq!(f32s(&outs, "dx"), vec![1.5, -2.0, 0.25]);
    assert_eq!(f32s(&outs, "dz"), vec![1.0, 1.0, 1.0]);
}

#[test]
fn detach_of_an_integer_is_the_integer_and_softmax_names_a_bad_axis() {
    let p = compile("input n: i32[N]\noutput m = detach(n) + 1\n");
    let n = HostTensor::new(vec![2], TensorData::I32(vec![3, -4]));
    let outs = p.run_cpu(&[("n", &n)]).unwrap();
    match &outs[0].1.data {
        TensorData::I32(v) => assert_eq!(v, &vec![4, -3]),
        other => panic!("i32 expected, got {other:?}"),
    }
    let engine = Engine::with_cache(Arc::new(kfuse::KernelCache::memory_only()));
    let err = match Program::compile(&engine, "input x: f32[N]\noutput y = softmax(x, axis: 2)\n", "test") {
        Ok(_) => panic!("axis 2 of a 1-d tensor is an error"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("axis"), "{err}");
}

#[test]
fn cross_entropy_gradient_kernel_folds_one_sum_per_row() {
    // The loss kernel computes the row maximum, the exp-sum and the mean of the log-probabilities
    // once per row; the gradient kernel reads the first two back and folds only the sum of the
    // log-probabilities' gradient (no tie count of the maximum, no count of the row's columns).
    let p = compile(
        "input logits: f32[B, C]\ninput labels: i64[B]\n\
         let log_probs = log_softmax(logits, axis: -1)\n\
         let valid = labels != -100\n\
         let nll = -sum(gather(log_probs, where(valid, labels, 0)[.., None], axis: -1), axis: -1)\n\
         output loss = sum(0.9 * nll - 0.1 * mean(log_probs, axis: -1), where: valid) / max(count(valid), 1)\n\
         output dlogits = grad(loss, logits)\n",
    );
    let kernels = &p.plan().kernels;
    assert_eq!(kernels.len(), 2);
    assert!(kernels[0].source.contains("its 3 row reduction phase(s)"), "{}", kernels[0].source);
    let grad = &kernels[1].source;
    assert!(grad.contains("its 1 row reduction phase(s)"), "{grad}");
    assert!(grad.contains("= (int)(sz1); // n"), "the mean's count is the row length: {grad}");
}
