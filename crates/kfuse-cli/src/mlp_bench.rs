//! `kfuse mlp bench`: times the model on the GPU (CUDA events, warm-up, median), measures the
//! card's copy bandwidth and mma.sync rate in the same run, and checks a subsample of rows against
//! the CPU interpreter path. The report is serde-serialisable for `--json`.
//!
//! Tiered compilation in one run ([`Tiering::Background`], the default): the first call (prepare,
//! input upload, one launch, download) is timed as a user sees it; when the optimised kernel
//! was not cached it runs the fast-compiled form, which is then timed too, and the optimised
//! kernel's background compile is waited for ([`kfuse::mlp::PreparedMlp::wait_optimized`]) before the
//! headline figures, which always time the optimised kernel ([`KernelTier::Full`]).
//! Cold figures need cold caches: kfuse's (a fresh `KFUSE_CACHE_DIR`) and NVRTC's own (12.9+ keeps
//! one in the driver's compute cache: set `CUDA_CACHE_DISABLE=1`); the report records whether
//! `CUDA_CACHE_DISABLE=1` was set.

use kfuse::mlp::testing::{random_input, Rng};
use kfuse::mlp::{compare_rows, evaluate_cpu, ErrorReport, KernelTier, MlpError, MlpKernelOptions, MlpModel, Tiering};
use kfuse::runtime::{Gpu, KernelArg, KernelLaunch};
use kfuse::{DType, HostTensor};

use kfuse::mlp::prepare_tiered;
use kfuse::Error;

type Result<T, E = Error> = std::result::Result<T, E>;

const BENCH_KERNELS: &str = include_str!("mlp_bench_kernels.cuh");

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
    /// Whether the first call may run the fast-compiled form (then timed separately).
    pub tiering: Tiering,
    /// The kernel's choices (`in_dtype`, `out_dtype` and `shared_limit` are taken from here and the
    /// device); `None`: [`MlpKernelOptions::tuned_for`] the device.
    pub kernel: Option<MlpKernelOptions>,
}

impl Default for BenchOptions {
    fn default() -> Self {
        BenchOptions {
            batch: 1 << 21,
            in_dtype: DType::F16,
            out_dtype: DType::F16,
            warmup: 5,
            iterations: 50,
            check_rows: 4096,
            seed: 7,
            tiering: Tiering::Background,
            kernel: None,
        }
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
    /// Which kernel served the first call: "fast" (the optimised one was not cached) or "full".
    pub first_call_tier: KernelTier,
    /// Wall time from the start of the first prepare to its first result downloaded (prepare,
    /// input upload, one launch on the whole batch, download), ms.
    pub first_result_ms: f64,
    /// Time to load the model files, ms, when the caller measured it (`kfuse mlp bench` does);
    /// the first call from a user's point of view is this plus `first_result_ms`.
    pub model_load_ms: Option<f64>,
    /// The fast-compiled form's kernel time, median and min, ms (when the first call used it).
    pub fast_kernel_ms_median: Option<f64>,
    pub fast_kernel_ms_min: Option<f64>,
    /// The first result (fast form when tiered) against the CPU interpreter path.
    pub first_check: ErrorReport,
    /// From the start of the first prepare until the optimised kernel was compiled, ms (its
    /// background compile's end when tiered, else the prepare itself).
    pub full_ready_ms: f64,
    /// The optimised kernel's compile time on the background thread, ms (when tiered).
    pub full_compile_ms: Option<f64>,
    /// Whether `CUDA_CACHE_DISABLE=1` was set (NVRTC's own cache off: compile times are cold).
    pub nvrtc_cache_disabled: bool,
    /// Wall time of a second prepare of the same model after the optimised kernel was ready
    /// (in-memory cache), ms.
    pub cached_call_ms: f64,
    /// The optimised kernel's time (the headline figure), median of `iterations` runs, ms.
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

fn time_launches(
    gpu: &Gpu,
    warmup: usize,
    iterations: usize,
    mut launch: impl FnMut() -> Result<()>,
) -> Result<Vec<f64>> {
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
    let n16 = i64::try_from(bytes / 16).map_err(|_| MlpError::TooLarge {
        what: "copy bytes",
        value: bytes as u64,
        limit: i64::MAX as u64,
    })?;
    let blocks = gpu.sm_count().max(1) * 8;
    let t = time_launches(gpu, 3, 20, || {
        gpu.launch(
            &gpu.default_stream(),
            &copy,
            KernelLaunch::new(blocks, 256),
            &[KernelArg::Buffer(&src), KernelArg::Buffer(&dst), KernelArg::I64(n16)],
        )
        .map_err(Error::from)
    })?;
    let copy_gbps = 2.0 * bytes as f64 / (median(t) * 1e-3) / 1e9;
    let mma_blocks = gpu.sm_count().max(1) * 4;
    let sink = gpu.alloc_zeroed(mma_blocks as usize * 256 * 4)?;
    let iters: i32 = 4096;
    let t = time_launches(gpu, 2, 10, || {
        gpu.launch(
            &gpu.default_stream(),
            &mma,
            KernelLaunch::new(mma_blocks, 256),
            &[KernelArg::Buffer(&sink), KernelArg::I32(iters)],
        )
        .map_err(Error::from)
    })?;
    let flops = mma_blocks as f64 * 8.0 * iters as f64 * 8.0 * 4096.0;
    Ok((copy_gbps, flops / (median(t) * 1e-3) / 1e12))
}

/// Rows spread evenly over `batch` (first and last included) compared with the CPU interpreter.
fn check_subsample(
    model: &MlpModel,
    input: &HostTensor,
    got: &HostTensor,
    batch: usize,
    check_rows: usize,
) -> Result<ErrorReport> {
    let n_check = check_rows.clamp(1, batch);
    let picks: Vec<usize> =
        (0..n_check).map(|i| if n_check == 1 { 0 } else { i * (batch - 1) / (n_check - 1) }).collect();
    let (in_w, out_w) = (model.input_width(), model.output_width());
    let all_in = input.to_f64();
    let all_out = got.to_f64();
    let sub_in: Vec<f64> = picks.iter().flat_map(|&r| all_in[r * in_w..(r + 1) * in_w].iter().copied()).collect();
    let sub_got: Vec<f64> = picks.iter().flat_map(|&r| all_out[r * out_w..(r + 1) * out_w].iter().copied()).collect();
    let want = evaluate_cpu(model, &HostTensor::from_f64(input.dtype(), vec![n_check, in_w], &sub_in))?;
    Ok(compare_rows(&sub_got, &want, out_w))
}

fn download_output(
    gpu: &Gpu,
    y: &kfuse::runtime::DeviceBuffer,
    dtype: DType,
    rows: usize,
    width: usize,
) -> Result<HostTensor> {
    let out = gpu.download(y)?;
    HostTensor::from_bytes(dtype, vec![rows, width], &out).ok_or({
        Error::Mlp(MlpError::TooLarge { what: "downloaded bytes (size mismatch)", value: out.len() as u64, limit: 0 })
    })
}

/// Benchmarks `model` on `gpu`: see the module docs.
pub fn bench_gpu(gpu: &Gpu, model: &MlpModel, opts: &BenchOptions) -> Result<BenchReport> {
    if opts.batch == 0 {
        return Err(MlpError::EmptyBatch.into());
    }
    let base = opts.kernel.clone().unwrap_or_else(|| MlpKernelOptions::tuned_for(gpu.compile_arch()));
    let kopts = MlpKernelOptions {
        in_dtype: opts.in_dtype,
        out_dtype: opts.out_dtype,
        shared_limit: gpu.max_shared_bytes(),
        ..base
    };
    let mut rng = Rng::new(opts.seed);
    let input = random_input(opts.in_dtype, opts.batch, model.input_width(), &mut rng);
    let out_w = model.output_width();
    let out_bytes = opts.batch.checked_mul(out_w * opts.out_dtype.size_bytes()).ok_or({
        Error::Mlp(MlpError::TooLarge { what: "output bytes", value: opts.batch as u64, limit: usize::MAX as u64 })
    })?;

    // The first call as a user sees it: prepare, upload, one launch, download.
    let first_started = std::time::Instant::now();
    let (prepared, first_call_ms) = prepare_tiered(gpu, model, &kopts, opts.tiering)?;
    let first_call_tier = prepared.active_tier();
    let x = gpu.upload(&input.to_bytes())?;
    let y = gpu.alloc_zeroed(out_bytes)?;
    gpu.fill(&y, 0xff)?;
    prepared.launch_tier(gpu, first_call_tier, &x, &y, opts.batch)?;
    let first = download_output(gpu, &y, opts.out_dtype, opts.batch, out_w)?;
    let first_result_ms = first_started.elapsed().as_secs_f64() * 1e3;
    let first_check = check_subsample(model, &input, &first, opts.batch, opts.check_rows)?;

    // The fast form's speed, while the optimised kernel compiles on the CPU.
    let fast_times = if first_call_tier == KernelTier::Fast {
        Some(time_launches(gpu, opts.warmup, opts.iterations, || {
            prepared.launch_tier(gpu, KernelTier::Fast, &x, &y, opts.batch)
        })?)
    } else {
        None
    };
    let ready = prepared.wait_optimized(gpu)?;
    let (_, cached_call_ms) = prepare_tiered(gpu, model, &kopts, opts.tiering)?;

    // The headline: the optimised kernel, never the fast form.
    gpu.fill(&y, 0xff)?;
    let times = time_launches(gpu, opts.warmup, opts.iterations, || {
        prepared.launch_tier(gpu, KernelTier::Full, &x, &y, opts.batch)
    })?;
    let got = download_output(gpu, &y, opts.out_dtype, opts.batch, out_w)?;
    let check = check_subsample(model, &input, &got, opts.batch, opts.check_rows)?;

    let (copy_gbps, mma_tflops) = measure_ceilings(gpu)?;
    let med = median(times.clone());
    let min = min_of(&times);
    let in_w = model.input_width();
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
        first_call_tier,
        first_result_ms,
        model_load_ms: None,
        fast_kernel_ms_median: fast_times.clone().map(median),
        fast_kernel_ms_min: fast_times.as_deref().map(min_of),
        first_check,
        full_ready_ms: ready.ready_ms,
        full_compile_ms: ready.background_compile_ms,
        nvrtc_cache_disabled: nvrtc_cache_disabled(),
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

fn min_of(times: &[f64]) -> f64 {
    times.iter().copied().fold(f64::INFINITY, f64::min)
}

/// Whether `CUDA_CACHE_DISABLE=1` is set: NVRTC 12.9+ then skips its own compile cache.
pub fn nvrtc_cache_disabled() -> bool {
    std::env::var("CUDA_CACHE_DISABLE").is_ok_and(|v| v.trim() == "1")
}

impl BenchReport {
    /// The human-readable summary `kfuse mlp bench` prints.
    pub fn render(&self) -> String {
        let mut s = String::new();
        s.push_str(&format!(
            "model      {}\ndevice     {}\nbatch      {} rows, {} in, {} out\n",
            self.model, self.device, self.batch, self.in_dtype, self.out_dtype
        ));
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
        s.push_str(&self.render_first_call());
        s.push_str(&format!(
            "time       {:.4} ms median ({:.4} min, {} runs, CUDA events; the optimised kernel)\n",
            self.kernel_ms_median, self.kernel_ms_min, self.iterations
        ));
        s.push_str(&format!("rows/s     {:.3e}\n", self.rows_per_s));
        s.push_str(&format!(
            "compute    {:.1} TFLOP/s of {:.1} measured mma.sync peak ({:.0}%)\n",
            self.tflops,
            self.mma_tflops_ceiling,
            100.0 * self.tflops / self.mma_tflops_ceiling
        ));
        s.push_str(&format!(
            "memory     {:.0} GB/s of {:.0} measured copy bandwidth ({:.0}%)\n",
            self.gbps,
            self.copy_gbps_ceiling,
            100.0 * self.gbps / self.copy_gbps_ceiling
        ));
        s.push_str(&format!("floor      {:.4} ms (max of bytes/bandwidth, flops/peak)\n", self.floor_ms));
        s.push_str(&format!(
            "check      vs CPU interpreter on {} rows: rel err {:.2e}, max abs err {:.2e}, worst row rel err {:.2e} (row {}), non-finite {}\n",
            self.check.rows, self.check.rel_err, self.check.max_abs_err, self.check.worst_row_rel_err, self.check.worst_row, self.check.non_finite
        ));
        s
    }

    /// The first-call and tier lines of [`Self::render`].
    pub fn render_first_call(&self) -> String {
        let mut s = String::new();
        let load = self.model_load_ms.map(|ms| format!(", {ms:.1} ms model load before it")).unwrap_or_default();
        let tier = match self.first_call_tier {
            KernelTier::Fast => "fast-compiled form (--Ofast-compile=mid): the optimised kernel was not cached",
            KernelTier::Full => "the optimised kernel (cached or compiled in full)",
        };
        s.push_str(&format!(
            "first call {:.1} ms prepare, {:.1} ms to the first result downloaded{load}; ran the {tier}\n",
            self.first_call_ms, self.first_result_ms
        ));
        s.push_str(&format!(
            "           first result vs CPU interpreter: rel err {:.2e}, worst row rel err {:.2e}, non-finite {}\n",
            self.first_check.rel_err, self.first_check.worst_row_rel_err, self.first_check.non_finite
        ));
        if let (Some(med), Some(min)) = (self.fast_kernel_ms_median, self.fast_kernel_ms_min) {
            s.push_str(&format!("fast form  {med:.4} ms median ({min:.4} min, CUDA events; timed while the optimised kernel compiled)\n"));
        }
        match self.full_compile_ms {
            Some(compile) => s.push_str(&format!(
                "optimised  ready {:.1} ms after the first call began (background NVRTC compile {compile:.1} ms)\n",
                self.full_ready_ms
            )),
            None => s.push_str(&format!(
                "optimised  ready {:.1} ms after the first call began (no background compile)\n",
                self.full_ready_ms
            )),
        }
        s.push_str(&format!("cached     second prepare {:.2} ms\n", self.cached_call_ms));
        if !self.nvrtc_cache_disabled {
            s.push_str("note       CUDA_CACHE_DISABLE=1 is not set: NVRTC 12.9+ may serve compiles from its own cache; cold figures need it and a fresh KFUSE_CACHE_DIR\n");
        }
        s
    }
}
