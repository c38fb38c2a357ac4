//! GPU tier of `kfuse mlp bench`'s harness: a 2^21-row batch of a ReLU model timed and checked on
//! a subsample against the CPU interpreter, and the odd batch 2^21 + 1 (a one-row tail tile)
//! through `run_gpu`, subsampled. Skips without a GPU unless KFUSE_REQUIRE_GPU=1.

use kfuse::mlp::run_gpu;
use kfuse::mlp::testing::{check_16bit, random_input, write_model, ModelSpec, Numerics, Rng};
use kfuse::mlp::{compare_rows, evaluate_cpu, MlpModel};
use kfuse::runtime::testing::gpu_or_skip;
use kfuse::{DType, HostTensor};
use kfuse_cli::mlp_bench::{bench_gpu, BenchOptions};

/// Named tolerance: per-row worst relative error for f16/bf16 storage between layers.
const TOL_16BIT: f64 = 1e-2;

#[test]
fn large_batch_subsample_and_bench_report() {
    let Some(gpu) = gpu_or_skip("large_batch_subsample_and_bench_report") else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let mut spec = ModelSpec::new(&[64, 64, 64, 64, 64, 16], "relu");
    spec.with_bias = false;
    let model = MlpModel::load(write_model(dir.path(), "big", &spec).expect("write")).expect("load");
    let (_, seed) = Rng::from_time();
    let opts = BenchOptions { batch: 1 << 21, iterations: 20, check_rows: 8192, seed, ..BenchOptions::default() };
    let report = bench_gpu(&gpu, &model, &opts).expect("bench");
    println!("{}", report.render());
    assert_eq!(report.check.non_finite, 0);
    assert!(report.check.rel_err <= TOL_16BIT, "{:?}", report.check);
    // Also the odd batch 2^21 + 1 (a one-row tail tile), subsampled through run_gpu.
    let mut rng = Rng::new(seed ^ 1);
    let rows = (1 << 21) + 1;
    let x = random_input(DType::F16, rows, 64, &mut rng);
    let got = run_gpu(&gpu, &model, &x, DType::F16).expect("run");
    let picks: Vec<usize> = (0..2048).map(|i| i * (rows - 1) / 2047).collect();
    let xs: Vec<f64> = x.to_f64();
    let sub: Vec<f64> = picks.iter().flat_map(|&r| xs[r * 64..(r + 1) * 64].to_vec()).collect();
    let sub = HostTensor::from_f64(DType::F16, vec![picks.len(), 64], &sub);
    let want = evaluate_cpu(&model, &sub).expect("cpu");
    let g = got.to_f64();
    let got_sub: Vec<f64> = picks.iter().flat_map(|&r| g[r * 16..(r + 1) * 16].to_vec()).collect();
    let e = compare_rows(&got_sub, &want, 16);
    println!("2^21+1 rows, {} sampled: {e:?}", picks.len());
    check_16bit(&model, &sub, &got_sub, &want, DType::F16, Numerics { f16_accumulator: false }, "2^21+1 rows")
        .unwrap_or_else(|why| panic!("{why}"));
}
