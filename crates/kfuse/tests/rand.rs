//! `rand_like(x, seed)`: counter-based uniform numbers (Philox-4x32-10) and dropout.
//!
//! Pure tier: the interpreter's bits are the generator's (whose known-answer vectors
//! `kfuse_ir::philox` checks), a large draw's statistics, a dropout program's value and gradient,
//! the seed's typing, and the kernels the planner picks. NVRTC tier: every such kernel compiles.
//! GPU tier: the GPU's bits equal the interpreter's at odd sizes and in every kernel shape
//! (elementwise, a row softmax, full and row reductions, columns, a lengths-masked gradient).

use std::sync::Arc;

use kfuse::{Engine, HostTensor, Program, TensorData};
use kfuse_codegen::GridSpec;
use kfuse_ir::philox;
use kfuse_testing::{gpu_or_skip, nvrtc_or_skip, random_tensor};

fn program(src: &str) -> Program {
    let engine = Engine::with_cache(Arc::new(kfuse::KernelCache::memory_only()));
    Program::compile(&engine, src, "rand").unwrap_or_else(|e| panic!("compiles: {e}\n{src}"))
}

fn compile_error(src: &str) -> String {
    let engine = Engine::with_cache(Arc::new(kfuse::KernelCache::memory_only()));
    match Program::compile(&engine, src, "rand") {
        Ok(_) => panic!("expected an error for\n{src}"),
        Err(e) => e.to_string(),
    }
}

fn f32s(outs: &[(String, HostTensor)], name: &str) -> Vec<f32> {
    match &outs.iter().find(|(n, _)| n == name).expect("output").1.data {
        TensorData::F32(v) => v.clone(),
        other => panic!("f32 output expected, got {other:?}"),
    }
}

fn seed(v: i64) -> HostTensor {
    HostTensor::new(vec![], TensorData::I64(vec![v]))
}

fn zeros(shape: &[usize]) -> HostTensor {
    HostTensor::new(shape.to_vec(), TensorData::F32(vec![0.0; shape.iter().product()]))
}

#[test]
fn the_interpreter_gives_the_generators_bits_at_each_flat_index() {
    let p = program("input x: f32[A, B, C]\ninput seed: i64\noutput r = rand_like(x, seed)\n");
    for s in [0i64, 1, -1, 0x1234_5678_9abc_def0, i64::MIN] {
        let outs = p.run_cpu(&[("x", &zeros(&[3, 5, 7])), ("seed", &seed(s))]).expect("runs");
        let r = f32s(&outs, "r");
        for (k, v) in r.iter().enumerate() {
            assert_eq!(v.to_bits(), philox::uniform(s, k as u64).to_bits(), "seed {s} element {k}");
        }
    }
    // Counter 0 under key 0: Random123's first known answer, word 0 = 0x6627e8d5, whose top 24
    // bits give the value.
    let outs = p.run_cpu(&[("x", &zeros(&[1, 1, 1])), ("seed", &seed(0))]).expect("runs");
    assert_eq!(f32s(&outs, "r"), vec![0x6627e8 as f32 / 16_777_216.0]);
}

#[test]
fn a_large_draw_is_uniform_on_the_unit_interval() {
    // A fixed seed; n = 2^20 values: the mean within 5 standard errors of 1/2 (the variance of
    // a uniform is 1/12), each quarter's share within 5 sigma of 1/4, every value in [0, 1).
    let n = 1usize << 20;
    let p = program("input x: f32[N]\noutput r = rand_like(x, 20240611)\n");
    let r = f32s(&p.run_cpu(&[("x", &zeros(&[n]))]).expect("runs"), "r");
    assert!(r.iter().all(|&v| (0.0..1.0).contains(&v)), "a value outside [0, 1)");
    let mean = r.iter().map(|&v| f64::from(v)).sum::<f64>() / n as f64;
    let se = (1.0 / 12.0 / n as f64).sqrt();
    assert!((mean - 0.5).abs() < 5.0 * se, "mean {mean}");
    for q in 0..4 {
        let lo = q as f32 / 4.0;
        let share = r.iter().filter(|&&v| v >= lo && v < lo + 0.25).count() as f64 / n as f64;
        let sigma = (0.25 * 0.75 / n as f64).sqrt();
        assert!((share - 0.25).abs() < 5.0 * sigma, "quarter {q}: {share}");
    }
    // Distinct values almost everywhere: 24 bits of 2^20 draws collide about 2^15 times.
    let mut bits: Vec<u32> = r.iter().map(|v| v.to_bits()).collect();
    bits.sort_unstable();
    bits.dedup();
    assert!(bits.len() > n - 3 * (1 << 15), "{} distinct values", bits.len());
}

const DROPOUT: &str = "input x: f32[B, N]\ninput seed: i64\n\
    let keep = rand_like(x, seed) >= 0.25\n\
    output y = where(keep, x / 0.75, 0.0)\n\
    output loss = sum(y * y)\n\
    output dx = grad(loss, x)\n";

#[test]
fn dropout_keeps_and_scales_the_elements_its_draw_keeps_and_its_gradient_uses_the_same_mask() {
    let p = program(DROPOUT);
    let (b, n) = (7usize, 33usize);
    let x = random_tensor(kfuse::DType::F32, &[b, n], 0x5eed_d0d0);
    let xs = match &x.data {
        TensorData::F32(v) => v.clone(),
        _ => unreachable!(),
    };
    let s = 1234;
    let outs = p.run_cpu(&[("x", &x), ("seed", &seed(s))]).expect("runs");
    let (y, dx) = (f32s(&outs, "y"), f32s(&outs, "dx"));
    let mut loss = 0.0f64;
    for k in 0..b * n {
        let kept = philox::uniform(s, k as u64) >= 0.25;
        let want = if kept { (f64::from(xs[k]) / 0.75) as f32 } else { 0.0 };
        assert_eq!(y[k], want, "y[{k}]");
        loss += f64::from(want) * f64::from(want);
        // d/dx of (x / 0.75)^2 = 2 x / 0.75^2 where kept, 0 elsewhere.
        let g = if kept { 2.0 * f64::from(xs[k]) / 0.5625 } else { 0.0 };
        assert!((f64::from(dx[k]) - g).abs() <= 1e-5 * (1.0 + g.abs()), "dx[{k}]: {} vs {g}", dx[k]);
    }
    let got = f64::from(f32s(&outs, "loss")[0]);
    assert!((got - loss).abs() <= 1e-5 * loss, "loss {got} vs {loss}");
    // Another seed, another mask; the same seed, the same mask.
    let other = f32s(&p.run_cpu(&[("x", &x), ("seed", &seed(s + 1))]).expect("runs"), "y");
    assert_ne!(other, y);
    assert_eq!(f32s(&p.run_cpu(&[("x", &x), ("seed", &seed(s))]).expect("runs"), "y"), y);
}

#[test]
fn the_seed_is_an_integer_scalar_and_its_value_is_a_kernel_argument() {
    // A literal and an i32 input are converted to i64: the same bits as the i64 seed.
    let lit = program("input x: f32[N]\noutput r = rand_like(x, 77)\n");
    let int = program("input x: f32[N]\ninput s: i32\noutput r = rand_like(x, s)\n");
    let x = zeros(&[9]);
    let want: Vec<f32> = (0..9).map(|k| philox::uniform(77, k)).collect();
    assert_eq!(f32s(&lit.run_cpu(&[("x", &x)]).unwrap(), "r"), want);
    let s = HostTensor::new(vec![], TensorData::I32(vec![77]));
    assert_eq!(f32s(&int.run_cpu(&[("x", &x), ("s", &s)]).unwrap(), "r"), want);
    // A seed input is read by the kernel, not compiled into it.
    let p = program("input x: f32[N]\ninput seed: i64\noutput r = rand_like(x, seed)\n");
    let src = &p.plan().kernels[0].source;
    assert!(src.contains("kf_philox_uniform("), "{src}");
    assert!(src.contains("// seed i64"), "{src}");
    // A float seed, a tensor seed: errors that say what the seed must be.
    let e = compile_error("input x: f32[N]\noutput r = rand_like(x, 1.5)\n");
    assert!(e.contains("rand_like") && e.contains("i32 or i64"), "{e}");
    let e = compile_error("input x: f32[N]\ninput s: i64[N]\noutput r = rand_like(x, s)\n");
    assert!(e.contains("seed of `rand_like` must be a scalar"), "{e}");
    let e = compile_error("input x: f32[N]\noutput r = rand_like(x)\n");
    assert!(e.contains("takes 2 arguments"), "{e}");
}

#[test]
fn random_numbers_have_no_gradient() {
    // d/dx of sum(x * r) is r, and nothing flows into r itself.
    let p = program("input x: f32[N]\noutput r = rand_like(x, 5)\noutput dx = grad(sum(x * rand_like(x, 5)), x)\n");
    let outs = p.run_cpu(&[("x", &zeros(&[17]))]).unwrap();
    assert_eq!(f32s(&outs, "dx"), f32s(&outs, "r"));
    let p = program("input x: f32[N]\noutput d = grad(sum(rand_like(x, 5) * 3.0), x)\n");
    assert_eq!(f32s(&p.run_cpu(&[("x", &zeros(&[4]))]).unwrap(), "d"), vec![0.0; 4]);
}

/// Programs whose random numbers are drawn in each kernel shape the planner picks, with the
/// grid each kernel that draws them has, and outputs whose GPU values must equal the
/// interpreter's bit for bit (`r`: the draw itself; maxima and counts: exact reductions).
fn shapes() -> Vec<(&'static str, &'static str, Vec<&'static str>)> {
    vec![
        (
            "elementwise",
            "input x: f32[N]\ninput seed: i64\noutput r = rand_like(x, seed)\n\
             output y = where(rand_like(x, seed) < 0.5, x * 2.0, 0.0)\n",
            vec!["work"],
        ),
        (
            "row softmax",
            "input x: f32[B, C]\ninput seed: i64\noutput r = rand_like(x, seed)\n\
             output p = softmax(where(r >= 0.1, x, -1000.0), axis: -1)\noutput m = max(r, axis: -1)\n",
            vec!["rows"],
        ),
        (
            "full reduction",
            "input x: f32[B, C]\ninput seed: i64\nlet r = rand_like(x, seed)\n\
             output m = max(r)\noutput k = count(r < 0.5)\noutput s = sum(r * x)\n",
            vec!["work"],
        ),
        (
            "columns",
            "input x: f32[B, C]\ninput seed: i64\nlet r = rand_like(x, seed + 3)\n\
             output k = count(r < 0.5, axis: 0)\noutput s = sum(r * x, axis: 0)\n",
            vec!["columns"],
        ),
        (
            "lengths-masked gradient",
            "input x: f32[B, N, 3]\ninput lengths: i32[B] as lengths(N)\ninput seed: i64\n\
             let m = mask(lengths)\nlet r = rand_like(x, seed)\nlet y = where(r >= 0.5, x * 2.0, 0.0)\n\
             let sq = y[.., 0] * y[.., 0] + y[.., 1] * y[.., 1] + y[.., 2] * y[.., 2]\n\
             output loss = sum(sq, where: m) / max(count(m), 1)\noutput dx = grad(loss, x)\n",
            vec![],
        ),
    ]
}

fn grid_kind(g: &GridSpec) -> &'static str {
    match g {
        GridSpec::Work { .. } => "work",
        GridSpec::Rows { .. } => "rows",
        GridSpec::Columns { .. } => "columns",
    }
}

#[test]
fn every_kernel_shape_draws_with_the_helper_at_the_elements_flat_index() {
    for (name, src, grids) in shapes() {
        let p = program(src);
        let drawing: Vec<_> = p.plan().kernels.iter().filter(|k| k.source.contains("kf_philox_uniform(")).collect();
        assert!(!drawing.is_empty(), "{name}: no kernel draws");
        for (k, want) in drawing.iter().zip(&grids) {
            assert_eq!(grid_kind(&k.grid), *want, "{name}: {}", k.source);
        }
        for k in &drawing {
            // The helper is defined once per kernel, guarded.
            assert_eq!(k.source.matches("#define KF_HELPER_PHILOX").count(), 1, "{name}");
        }
    }
}

fn inputs_for(name: &str, s: i64) -> Vec<(&'static str, HostTensor)> {
    let sizes: &[usize] = match name {
        "elementwise" => &[1023],
        "lengths-masked gradient" => &[5, 13, 3],
        _ => &[37, 255],
    };
    let mut v = vec![("x", random_tensor(kfuse::DType::F32, sizes, 0x5eed_0001)), ("seed", seed(s))];
    if name == "lengths-masked gradient" {
        v.push(("lengths", HostTensor::new(vec![5], TensorData::I32(vec![0, 13, 4, 1, 9]))));
    }
    v
}

#[test]
fn every_kernel_compiles_with_nvrtc() {
    if nvrtc_or_skip("every_kernel_compiles_with_nvrtc").is_none() {
        return;
    }
    for (name, src, _) in shapes() {
        for k in &program(src).plan().kernels {
            kfuse_testing::assert_compiles_for_sm80_and_sm90(name, &k.name, &k.source);
        }
    }
}

#[test]
fn the_gpu_draws_the_interpreters_bits_at_odd_sizes_and_in_every_kernel_shape() {
    let Some(gpu) = gpu_or_skip("the_gpu_draws_the_interpreters_bits_at_odd_sizes_and_in_every_kernel_shape") else {
        return;
    };
    let ordinal = gpu.ordinal();
    let same_bits = |name: &str, got: &[(String, HostTensor)], want: &[(String, HostTensor)], exact: &[&str]| {
        for ((gn, g), (wn, w)) in got.iter().zip(want) {
            assert_eq!(gn, wn);
            if exact.contains(&gn.as_str()) {
                assert_eq!(g.to_bytes(), w.to_bytes(), "{name}: output {gn} differs from the interpreter's bits");
            } else {
                let err = kfuse_testing::max_rel_err(g, w);
                assert!(err < 1e-4, "{name}: output {gn} is off by {err}");
            }
        }
    };
    // Odd sizes, two seeds (one with high key bits), ranks 1 and 3.
    let p = program("input x: f32[A, B, C]\ninput seed: i64\noutput r = rand_like(x, seed)\n");
    for shape in [[1, 1, 1], [1, 1, 3], [1, 3, 85], [3, 11, 31], [1, 1, 1023]] {
        for s in [42i64, -0x0123_4567_89ab_cdef] {
            let (x, sd) = (zeros(&shape), seed(s));
            let inputs = [("x", &x), ("seed", &sd)];
            let got = p.run_gpu(ordinal, &inputs).expect("runs on the GPU");
            same_bits(&format!("{shape:?} seed {s}"), &got, &p.run_cpu(&inputs).expect("runs"), &["r"]);
        }
    }
    for (name, src, _) in shapes() {
        let p = program(src);
        let inputs = inputs_for(name, 99);
        let refs: Vec<(&str, &HostTensor)> = inputs.iter().map(|(n, t)| (*n, t)).collect();
        let got = p.run_gpu(ordinal, &refs).expect("runs on the GPU");
        let want = p.run_cpu_f32(&refs).expect("runs");
        same_bits(name, &got, &want, &["r", "m", "k"]);
    }
}
