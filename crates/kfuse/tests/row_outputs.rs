//! A row's statistics saved as outputs (a layer norm's mean and inverse deviation, kept for its
//! backward) are stored once per row by the kernel that normalises the row, which reads each row
//! once: pure tier (the plan and the interpreter's values against the math in f64), NVRTC tier
//! (the kernel compiles), GPU tier (the kernel against the interpreter at odd sizes).

use std::sync::Arc;

use kfuse::{Engine, HostTensor, Program, TensorData};
use kfuse_runtime::testing::nvrtc_or_skip;

fn compile(src: &str) -> Program {
    let engine = Engine::with_cache(Arc::new(kfuse::KernelCache::memory_only()));
    Program::compile(&engine, src, "test").expect("compiles")
}

const LAYER_NORM_WITH_STATS: &str = "input x: f32[B, D]\ninput w: f32[D]\ninput b: f32[D]\n\
    let mu = mean(x, axis: -1, keepdim: true)\n\
    let xc = x - mu\n\
    let r = rsqrt(mean(xc * xc, axis: -1, keepdim: true) + 1e-5)\n\
    output y = xc * r * w + b\n\
    output mean = mu\n\
    output rstd = r\n\
    output var_rows = mean(xc * xc, axis: -1)\n";

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

fn inputs(seed: u64, b: usize, d: usize) -> [HostTensor; 3] {
    [
        HostTensor::new(vec![b, d], TensorData::F32(random(seed, b * d))),
        HostTensor::new(vec![d], TensorData::F32(random(seed + 1, d))),
        HostTensor::new(vec![d], TensorData::F32(random(seed + 2, d))),
    ]
}

fn named(t: &[HostTensor; 3]) -> [(&'static str, &HostTensor); 3] {
    [("x", &t[0]), ("w", &t[1]), ("b", &t[2])]
}

#[test]
fn row_statistics_are_stored_once_per_row_by_the_kernel_that_normalises_the_row() {
    let p = compile(LAYER_NORM_WITH_STATS);
    let kernels = &p.plan().kernels;
    assert_eq!(kernels.len(), 1, "{}", p.cuda_source());
    let src = &kernels[0].source;
    for name in ["mean", "rstd", "var_rows"] {
        let sink = src.lines().find(|l| l.starts_with(&format!("// sink: output {name}"))).unwrap_or_default();
        assert!(sink.ends_with("once per row"), "{name}: {src}");
    }
    assert!(src.contains("row reduction phase"), "{src}");
}

#[test]
fn the_rows_statistics_match_the_math() {
    let seed = 0x5eed_0a11;
    println!("seed {seed:#x}");
    let (b, d) = (7usize, 37usize);
    let t = inputs(seed, b, d);
    let outs = compile(LAYER_NORM_WITH_STATS).run_cpu(&named(&t)).expect("runs");
    let get = |name: &str| outs.iter().find(|(n, _)| n == name).expect("output").1.to_f64();
    let (x, w, bias) = (t[0].to_f64(), t[1].to_f64(), t[2].to_f64());
    let (mean, rstd, var_rows, y) = (get("mean"), get("rstd"), get("var_rows"), get("y"));
    assert_eq!((mean.len(), rstd.len(), var_rows.len(), y.len()), (b, b, b, b * d));
    for r in 0..b {
        let row: Vec<f64> = x[r * d..(r + 1) * d].to_vec();
        let m = row.iter().sum::<f64>() / d as f64;
        let v = row.iter().map(|e| (e - m) * (e - m)).sum::<f64>() / d as f64;
        let close = |got: f64, want: f64, what: &str| {
            assert!((got - want).abs() <= 1e-5 * (1.0 + want.abs()), "row {r} {what}: {got} vs {want}")
        };
        close(mean[r], m, "mean");
        close(var_rows[r], v, "variance");
        close(rstd[r], 1.0 / (v + 1e-5).sqrt(), "rstd");
        for c in 0..d {
            close(y[r * d + c], (row[c] - m) / (v + 1e-5).sqrt() * w[c] + bias[c], "y");
        }
    }
}

#[test]
fn row_statistics_compile_for_sm80_and_sm90() {
    if nvrtc_or_skip("row_statistics_compile_for_sm80_and_sm90").is_none() {
        return;
    }
    let p = compile(LAYER_NORM_WITH_STATS);
    for k in &p.plan().kernels {
        kfuse_testing::assert_compiles_for_sm80_and_sm90("row statistics", &k.name, &k.source);
    }
}

#[test]
fn gpu_row_statistics_match_the_interpreter() {
    let Some(gpu) = kfuse_testing::gpu_or_skip("gpu_row_statistics_match_the_interpreter") else {
        return;
    };
    let p = compile(LAYER_NORM_WITH_STATS);
    let seed = 0x5eed_0a12;
    println!("seed {seed:#x}");
    // Rows in registers (64, 1024) and read from memory (37, 5003); one row, odd row counts.
    for (b, d) in [(1usize, 64usize), (3, 37), (255, 1024), (33, 5003)] {
        let t = inputs(seed + d as u64, b, d);
        let want = p.run_cpu(&named(&t)).expect("the interpreter runs");
        let got = p.run_gpu(gpu.ordinal(), &named(&t)).expect("the GPU runs");
        for ((name, w), (_, g)) in want.iter().zip(&got) {
            for (k, (a, e)) in g.to_f64().iter().zip(w.to_f64()).enumerate() {
                assert!((a - e).abs() <= 1e-4 * (1.0 + e.abs()), "{name} at [{b}, {d}], element {k}: gpu {a} vs {e}");
            }
        }
    }
}
