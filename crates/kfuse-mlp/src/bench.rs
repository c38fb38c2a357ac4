//! `kfuse mlp bench`: times the model on the GPU (CUDA events, warm-up, median), measures the
//! card's copy bandwidth and mma.sync rate in the same run, and checks a subsample of rows against
//! the CPU interpreter path. The report is serde-serialisable for `--json`.

use kfuse_ir::{DType, HostTensor};
use kfuse_runtime::{Gpu, KernelArg};

use crate::cpu::{compare_rows, evaluate_cpu, ErrorReport};
use crate::error::{MlpError, Result};
use crate::gpu::prepare_with;
use crate::kernel::{ActivationMath, CompileEffort, MlpKernelOptions, RepeatedLayers};
use crate::model::MlpModel;
use crate::testing::{random_input, Rng};

const BENCH_KERNELS: &str = include_str!("bench_kernels.cuh");

/// What to benchmark.
#[derive(Clone, Debug)]
pub struct BenchOptions {
    /// Rows per launch.
    pub batch: usize,
    /// Input dtype.
    pub in_dtype: DType,
    /// Output dtype.
    pub out_dtype: DType,
    /// Untimed launches first.
    pub warmup: usize,
    /// Timed launches (the median is reported).
    pub iterations: usize,
    /// Rows compared with the CPU path (spread evenly over the batch).
    pub check_rows: usize,
    /// Seed of the random input.
    pub seed: u64,
    /// Warps per block (`None`: the generator's choice).
    pub warps: Option<u32>,
    /// 16-row tiles per warp (`None`: the generator's choice).
    pub row_tiles_per_warp: Option<u32>,
    /// How SiLU is evaluated.
    pub activation_math: ActivationMath,
    /// NVRTC's optimisation effort.
    pub compile_effort: CompileEffort,
    /// Runs of identical hidden layers: a loop or unrolled.
    pub repeated_layers: RepeatedLayers,
}

impl Default for BenchOptions {
    fn default() -> Self {
        BenchOptions { batch: 1 << 21, in_dtype: DType::F16, out_dtype: DType::F16, warmup: 5, iterations: 50, check_rows: 4096, seed: 7, warps: None, row_tiles_per_warp: None, activation_math: ActivationMath::Packed, compile_effort: CompileEffort::Full, repeated_layers: RepeatedLayers::Unrolled }
    }
}

/// A benchmark's results.
#[derive(Clone, Debug, serde::Serialize)]
pub struct BenchReport {
    pub model: String,
    pub device: String,
    pub batch: usize,
    pub in_dtype: String,
    pub out_dtype: String,
    /// Kernel name (fused) or `None` for the tiled path.
    pub kernel: Option<String>,
    /// The tiled path's note, if the model is not fused.
    pub note: Option<String>,
    pub warps_per_block: Option<u32>,
    pub rows_per_warp: Option<u32>,
    pub shared_bytes: Option<u32>,
    /// Wall time of the first prepare (generate + NVRTC or cache + load + upload), ms.
    pub first_call_ms: f64,
    /// Wall time of a second prepare of the same model (in-memory cache), ms.
    pub cached_call_ms: f64,
    pub kernel_ms_median: f64,
    pub kernel_ms_min: f64,
    pub iterations: usize,
    pub rows_per_s: f64,
    /// 2 · multiply-adds per row · rows.
    pub flops: f64,
    pub tflops: f64,
    /// Input read once plus output written once.
    pub bytes: f64,
    pub gbps: f64,
    /// Device-to-device copy bandwidth measured in this run (read + write), GB/s.
    pub copy_gbps_ceiling: f64,
    /// mma.sync m16n8k16 f16→f32 rate measured in this run, TFLOP/s.
    pub mma_tflops_ceiling: f64,
    /// Lower bound on the kernel time from the two ceilings, ms.
    pub floor_ms: f64,
    /// GPU vs CPU interpreter path on the checked rows.
    pub check: ErrorReport,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

fn time_launches(gpu: &Gpu, warmup: usize, iterations: usize, mut launch: impl FnMut() -> Result<()>) -> Result<Vec<f64>> {
    for _ in 0..warmup {
        launch()?;
    }
    gpu.synchronize()?;
    let mut times = Vec::with_capacity(iterations);
    for _ in 0..iterations.max(1) {
        let a = gpu.record_event()?;
        launch()?;
        let b = gpu.record_event()?;
        times.push(gpu.elapsed_ms(&a, &b)? as f64);
    }
    Ok(times)
}

/// Measures copy bandwidth (GB/s, read + write) and mma.sync rate (TFLOP/s) on `gpu`.
pub fn measure_ceilings(gpu: &Gpu) -> Result<(f64, f64)> {
    let copy = gpu.load_kernel(BENCH_KERNELS, "kf_bench_copy")?;
    let mma = gpu.load_kernel(BENCH_KERNELS, "kf_bench_mma")?;
    let bytes: usize = 512 << 20;
    let src = gpu.alloc_zeroed(bytes)?;
    gpu.fill(&src, 0x3c)?;
    let dst = gpu.alloc_zeroed(bytes)?;
    let n16 = i64::try_from(bytes / 16).map_err(|_| MlpError::TooLarge { what: "copy bytes", value: bytes as u64, limit: i64::MAX as u64 })?;
    let blocks = gpu.sm_count().max(1) * 8;
    let t = time_launches(gpu, 3, 20, || {
        gpu.launch(&copy, blocks, 256, 0, &[KernelArg::Buffer(&src), KernelArg::Buffer(&dst), KernelArg::I64(n16)]).map_err(MlpError::from)
    })?;
    let copy_gbps = 2.0 * bytes as f64 / (median(t) * 1e-3) / 1e9;
    let mma_blocks = gpu.sm_count().max(1) * 4;
    let sink = gpu.alloc_zeroed(mma_blocks as usize * 256 * 4)?;
    let iters: i32 = 4096;
    let t = time_launches(gpu, 2, 10, || {
        gpu.launch(&mma, mma_blocks, 256, 0, &[KernelArg::Buffer(&sink), KernelArg::I32(iters)]).map_err(MlpError::from)
    })?;
    let flops = mma_blocks as f64 * 8.0 * iters as f64 * 8.0 * 4096.0;
    Ok((copy_gbps, flops / (median(t) * 1e-3) / 1e12))
}

/// Benchmarks `model` on `gpu`: see the module docs.
pub fn bench_gpu(gpu: &Gpu, model: &MlpModel, opts: &BenchOptions) -> Result<BenchReport> {
    if opts.batch == 0 {
        return Err(MlpError::EmptyBatch);
    }
    let kopts = MlpKernelOptions {
        in_dtype: opts.in_dtype,
        out_dtype: opts.out_dtype,
        shared_limit: gpu.max_shared_bytes(),
        warps: opts.warps,
        row_tiles_per_warp: opts.row_tiles_per_warp,
        activation_math: opts.activation_math,
        compile_effort: opts.compile_effort,
        repeated_layers: opts.repeated_layers,
    };
    let (prepared, first_call_ms) = prepare_with(gpu, model, &kopts)?;
    let (_, cached_call_ms) = prepare_with(gpu, model, &kopts)?;
    let mut rng = Rng::new(opts.seed);
    let input = random_input(opts.in_dtype, opts.batch, model.input_width(), &mut rng);
    let x = gpu.upload(&input.to_bytes())?;
    let out_w = model.output_width();
    let y = gpu.alloc_zeroed(opts.batch * out_w * opts.out_dtype.size_bytes())?;
    gpu.fill(&y, 0xff)?;
    let times = time_launches(gpu, opts.warmup, opts.iterations, || prepared.launch(gpu, &x, &y, opts.batch))?;
    let out = gpu.download(&y)?;
    let got = HostTensor::from_bytes(opts.out_dtype, vec![opts.batch, out_w], &out)
        .ok_or(MlpError::TooLarge { what: "downloaded bytes (size mismatch)", value: out.len() as u64, limit: 0 })?;

    // Check evenly spread rows (first and last included) against the CPU interpreter path.
    let n_check = opts.check_rows.clamp(1, opts.batch);
    let picks: Vec<usize> = (0..n_check).map(|i| if n_check == 1 { 0 } else { i * (opts.batch - 1) / (n_check - 1) }).collect();
    let in_w = model.input_width();
    let all_in = input.to_f64();
    let all_out = got.to_f64();
    let sub_in: Vec<f64> = picks.iter().flat_map(|&r| all_in[r * in_w..(r + 1) * in_w].iter().copied()).collect();
    let sub_got: Vec<f64> = picks.iter().flat_map(|&r| all_out[r * out_w..(r + 1) * out_w].iter().copied()).collect();
    let want = evaluate_cpu(model, &HostTensor::from_f64(opts.in_dtype, vec![n_check, in_w], &sub_in))?;
    let check = compare_rows(&sub_got, &want, out_w);

    let (copy_gbps, mma_tflops) = measure_ceilings(gpu)?;
    let med = median(times.clone());
    let min = times.iter().copied().fold(f64::INFINITY, f64::min);
    let flops = 2.0 * model.macs_per_row() as f64 * opts.batch as f64;
    let bytes = (opts.batch * (in_w * opts.in_dtype.size_bytes() + out_w * opts.out_dtype.size_bytes())) as f64;
    let floor_ms = (bytes / (copy_gbps * 1e9)).max(flops / (mma_tflops * 1e12)) * 1e3;
    let kernel = prepared.kernel();
    Ok(BenchReport {
        model: model.summary(),
        device: gpu.name(),
        batch: opts.batch,
        in_dtype: opts.in_dtype.to_string(),
        out_dtype: opts.out_dtype.to_string(),
        kernel: kernel.map(|k| k.name.clone()),
        note: prepared.note().map(str::to_string),
        warps_per_block: kernel.map(|k| k.warps),
        rows_per_warp: kernel.map(|k| k.rows_per_warp),
        shared_bytes: kernel.map(|k| k.shared_bytes),
        first_call_ms,
        cached_call_ms,
        kernel_ms_median: med,
        kernel_ms_min: min,
        iterations: times.len(),
        rows_per_s: opts.batch as f64 / (med * 1e-3),
        flops,
        tflops: flops / (med * 1e-3) / 1e12,
        bytes,
        gbps: bytes / (med * 1e-3) / 1e9,
        copy_gbps_ceiling: copy_gbps,
        mma_tflops_ceiling: mma_tflops,
        floor_ms,
        check,
    })
}

impl BenchReport {
    /// The human-readable summary `kfuse mlp bench` prints.
    pub fn render(&self) -> String {
        let mut s = String::new();
        s.push_str(&format!("model      {}\ndevice     {}\nbatch      {} rows, {} in, {} out\n", self.model, self.device, self.batch, self.in_dtype, self.out_dtype));
        if let Some(note) = &self.note {
            s.push_str(&format!("{note}\n"));
        }
        if let Some(k) = &self.kernel {
            s.push_str(&format!(
                "kernel     {k}: {} warps/block, {} rows/warp, {} B shared\n",
                self.warps_per_block.unwrap_or(0),
                self.rows_per_warp.unwrap_or(0),
                self.shared_bytes.unwrap_or(0)
            ));
        }
        s.push_str(&format!("compile    first call {:.1} ms, cached {:.2} ms\n", self.first_call_ms, self.cached_call_ms));
        s.push_str(&format!("time       {:.4} ms median ({:.4} min, {} runs, CUDA events)\n", self.kernel_ms_median, self.kernel_ms_min, self.iterations));
        s.push_str(&format!("rows/s     {:.3e}\n", self.rows_per_s));
        s.push_str(&format!("compute    {:.1} TFLOP/s of {:.1} measured mma.sync peak ({:.0}%)\n", self.tflops, self.mma_tflops_ceiling, 100.0 * self.tflops / self.mma_tflops_ceiling));
        s.push_str(&format!("memory     {:.0} GB/s of {:.0} measured copy bandwidth ({:.0}%)\n", self.gbps, self.copy_gbps_ceiling, 100.0 * self.gbps / self.copy_gbps_ceiling));
        s.push_str(&format!("floor      {:.4} ms (max of bytes/bandwidth, flops/peak)\n", self.floor_ms));
        s.push_str(&format!(
            "check      vs CPU interpreter on {} rows: rel err {:.2e}, max abs err {:.2e}, worst row rel err {:.2e} (row {}), non-finite {}\n",
            self.check.rows, self.check.rel_err, self.check.max_abs_err, self.check.worst_row_rel_err, self.check.worst_row, self.check.non_finite
        ));
        s
    }
}
