//! Running a model on a GPU: [`prepare`] / [`prepare_tiered`] compile (through kfuse-runtime's
//! NVRTC + kernel cache) and upload the parameters once; [`PreparedMlp::launch`] runs it on
//! device buffers; [`run_gpu`] does both for one host tensor, poisoning the output first so
//! unwritten elements show up.
//!
//! Tiered compilation: when the fully optimised fused kernel is not in the kernel cache (memory
//! or disk), [`prepare`] compiles its fast form ([`kfuse_mlp::emit_fast_form`]: less code,
//! `--Ofast-compile=mid`, the same parameters) and returns, and only then starts its background
//! compile into the cache ([`KernelCache::compile_in_background`](kfuse_runtime::KernelCache::compile_in_background)),
//! so that the two compiles never compete for the CPU during the first call;
//! [`PreparedMlp::launch`] checks with one atomic load whether that compile is done and then loads
//! the optimised kernel (a cache hit) and uses it from then on. When the optimised kernel is
//! already cached, no fast form is compiled. [`PreparedMlp::wait_optimized`] blocks until the
//! switch; [`Tiering::FullOnly`] (and [`prepare_with`]) opt out.
//!
//! Handles: the fused kernel, and the tiled fallback (with its note) when the model does not fit.
//! Launches go on the Gpu's own stream or on a given one ([`PreparedMlp::launch_on_stream`]).
//! Does not handle: several GPUs, tiering of the tiled fallback (compiled in full at once).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

use kfuse_ir::{DType, HostTensor};
use kfuse_mlp::{
    check_input, emit_fast_form, emit_kernel, emit_tiled, CompileEffort, KernelTier, MlpError, MlpKernel,
    MlpKernelOptions, MlpModel, Tiering, TiledPlan,
};
use kfuse_runtime::{
    BackgroundCompile, CompileOptions, DeviceBuffer, Gpu, GpuFunction, KernelArg, KernelLaunch, Stream,
};

use crate::exec::enqueue;
use crate::Error;

type Result<T, E = Error> = std::result::Result<T, E>;

/// A compiled, uploaded model on one GPU.
pub struct PreparedMlp {
    body: Body,
    in_dtype: DType,
    out_dtype: DType,
    started_at: Instant,
    prepare_ms: f64,
}

enum Body {
    /// The fused kernel.
    Fused {
        /// The generated kernel (its `nvrtc_options` are the requested ones); boxed, as the
        /// largest part of the enum.
        kernel: Box<MlpKernel>,
        /// Its loaded function(s).
        functions: FusedFunctions,
        /// The packed parameters on the device.
        params: DeviceBuffer,
        /// Blocks per launch (persistent: one per SM at most).
        max_blocks: u32,
    },
    /// One kernel per layer.
    Tiled {
        /// The generated kernels and the note.
        plan: TiledPlan,
        /// Per layer: function, weights, biases (an empty buffer without bias).
        layers: Vec<(GpuFunction, DeviceBuffer, DeviceBuffer)>,
        /// Output width of each layer.
        widths: Vec<usize>,
    },
}

enum FusedFunctions {
    /// The requested kernel, loaded before `prepare` returned.
    Single(GpuFunction),
    /// The fast form now, the requested kernel once its background compile is done.
    Tiered(Box<Tiered>),
}

struct Tiered {
    fast: GpuFunction,
    /// The fast form's launch geometry (its own: it may use fewer rows per warp).
    fast_geometry: Geometry,
    background: BackgroundCompile,
    /// The requested kernel, loaded on the first launch after its compile finished.
    full: OnceLock<GpuFunction>,
    /// Set once the switch failed and was warned about: launches stay on `fast` quietly.
    gave_up: AtomicBool,
    /// Print tier switches (`KFUSE_LOG_COMPILES=1`).
    log: bool,
}

/// How one compiled form of the fused kernel is launched.
#[derive(Clone, Copy, Debug)]
struct Geometry {
    /// Threads per block.
    block: u32,
    /// Dynamic shared memory per block.
    shared_bytes: u32,
    /// Rows all warps of a block handle at a time.
    rows_per_block: u32,
}

impl Geometry {
    fn of(kernel: &MlpKernel) -> Geometry {
        Geometry { block: kernel.block, shared_bytes: kernel.shared_bytes, rows_per_block: kernel.rows_per_block }
    }
}

/// When the fully optimised kernel of a [`PreparedMlp`] was ready.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TierReady {
    /// Milliseconds from the start of `prepare` until the requested kernel was compiled into the
    /// cache: the background compile's end when the first call used the fast form, else
    /// `prepare`'s own duration.
    pub ready_ms: f64,
    /// How long the background compile took on its thread, when there was one.
    pub background_compile_ms: Option<f64>,
}

fn too_large(what: &'static str, value: usize) -> Error {
    Error::Mlp(MlpError::TooLarge { what, value: value as u64, limit: u32::MAX as u64 })
}

/// Compiles and uploads `model` for inputs of `in_dtype` and outputs of `out_dtype`, tiered
/// ([`Tiering::Background`]): when the optimised kernel is not cached, the fast form serves the
/// first launches. Returns it and the wall time this took (the first-call compile time when the
/// cache is cold). The kernel choices are [`MlpKernelOptions::tuned_for`] the device.
pub fn prepare(gpu: &Gpu, model: &MlpModel, in_dtype: DType, out_dtype: DType) -> Result<(PreparedMlp, f64)> {
    let opts = MlpKernelOptions {
        in_dtype,
        out_dtype,
        shared_limit: gpu.max_shared_bytes(),
        ..MlpKernelOptions::tuned_for(gpu.compile_arch())
    };
    prepare_tiered(gpu, model, &opts, Tiering::Background)
}

/// [`prepare`] with explicit kernel choices (tile sizes, activation math, compile effort; for
/// tuning), compiling exactly that kernel before returning ([`Tiering::FullOnly`]): what it
/// launches is what `opts` asked for. The shared-memory limit is capped at the device's.
pub fn prepare_with(gpu: &Gpu, model: &MlpModel, opts: &MlpKernelOptions) -> Result<(PreparedMlp, f64)> {
    prepare_tiered(gpu, model, opts, Tiering::FullOnly)
}

/// [`prepare_with`] with a choice of tiering. [`Tiering::Background`] starts with the fast form
/// only when `opts.compile_effort` is [`CompileEffort::Full`], the kernel cache is not bypassed
/// (`KFUSE_NO_CACHE=1`) and the optimised kernel is in neither the memory nor the disk cache.
pub fn prepare_tiered(
    gpu: &Gpu,
    model: &MlpModel,
    opts: &MlpKernelOptions,
    tiering: Tiering,
) -> Result<(PreparedMlp, f64)> {
    let started_at = Instant::now();
    let (in_dtype, out_dtype) = (opts.in_dtype, opts.out_dtype);
    let opts = MlpKernelOptions { shared_limit: opts.shared_limit.min(gpu.max_shared_bytes()), ..opts.clone() };
    let body = match emit_kernel(model, &opts) {
        Ok(kernel) => {
            let functions = load_fused(gpu, model, &opts, &kernel, tiering)?;
            let params = gpu.upload(&kernel.params)?;
            Body::Fused { kernel: Box::new(kernel), functions, params, max_blocks: gpu.sm_count().max(1) }
        }
        Err(MlpError::SharedMemory { what, needed, limit }) => {
            let why = format!("{what}: needs {needed}, limit {limit}");
            let plan = emit_tiled(model, in_dtype, out_dtype, &why)?;
            let mut layers = Vec::with_capacity(plan.layers.len());
            for l in &plan.layers {
                let f = gpu.load_kernel(&l.source, &l.name)?;
                layers.push((f, gpu.upload(&l.weight_bytes)?, gpu.upload(&l.bias_bytes)?));
            }
            Body::Tiled { plan, layers, widths: model.layers.iter().map(|l| l.outputs).collect() }
        }
        Err(other) => return Err(other.into()),
    };
    let prepare_ms = started_at.elapsed().as_secs_f64() * 1e3;
    Ok((PreparedMlp { body, in_dtype, out_dtype, started_at, prepare_ms }, prepare_ms))
}

/// Compiles (through the cache) and loads one form of the fused kernel on `gpu`, for its target
/// and with its NVRTC options.
fn load(gpu: &Gpu, kernel: &MlpKernel) -> Result<GpuFunction> {
    Ok(gpu.load_kernel_for(&kernel.source, &kernel.name, kernel.target(gpu.compile_arch()), &kernel.nvrtc_options)?)
}

/// Loads the requested kernel, or (tiering applies and it is not cached) its fast form with the
/// requested one compiling in the background.
fn load_fused(
    gpu: &Gpu,
    model: &MlpModel,
    opts: &MlpKernelOptions,
    kernel: &MlpKernel,
    tiering: Tiering,
) -> Result<FusedFunctions> {
    let cache = gpu.cache();
    let full_opts = CompileOptions { arch: kernel.target(gpu.compile_arch()), extra: kernel.nvrtc_options.clone() };
    let may_tier = tiering == Tiering::Background && opts.compile_effort == CompileEffort::Full && !cache.is_bypassed();
    if !may_tier || cache.get_cached(&kernel.source, &full_opts)?.is_some() {
        return Ok(FusedFunctions::Single(load(gpu, kernel)?));
    }
    // The fast form shares `params` (checked by emit_fast_form); without one, no tiering.
    let Some(fast_kernel) = emit_fast_form(model, opts, kernel, kfuse_runtime::nvrtc_version()?) else {
        return Ok(FusedFunctions::Single(load(gpu, kernel)?));
    };
    let fast = load(gpu, &fast_kernel)?;
    // Started once the fast form is compiled: a concurrent optimised compile slows the fast one
    // on a machine with few cores, for an optimised kernel ready only a little sooner.
    let background = cache.compile_in_background(kernel.source.clone(), full_opts);
    let log = cache.config().log_compiles;
    if log {
        eprintln!(
            "kfuse: {} is not cached: running its fast-compiled form, compiling the optimised kernel in the background",
            kernel.name
        );
    }
    let fast_geometry = Geometry::of(&fast_kernel);
    Ok(FusedFunctions::Tiered(Box::new(Tiered {
        fast,
        fast_geometry,
        background,
        full: OnceLock::new(),
        gave_up: AtomicBool::new(false),
        log,
    })))
}

impl Tiered {
    /// The kernel a launch uses now and its geometry: the optimised one if loaded or ready to
    /// load, else the fast form. Never waits for the compile; a failed switch is warned about
    /// once.
    fn current(&self, gpu: &Gpu, kernel: &MlpKernel) -> (&GpuFunction, Geometry) {
        if let Some(full) = self.full.get() {
            return (full, Geometry::of(kernel));
        }
        if !self.background.is_finished() || self.gave_up.load(Ordering::Relaxed) {
            return (&self.fast, self.fast_geometry);
        }
        match self.promote(gpu, kernel) {
            Ok(full) => (full, Geometry::of(kernel)),
            Err(e) => {
                if !self.gave_up.swap(true, Ordering::Relaxed) {
                    eprintln!("kfuse: warning: {e}");
                }
                (&self.fast, self.fast_geometry)
            }
        }
    }

    /// Loads the optimised kernel (a cache hit) once its background compile has finished.
    fn promote(&self, gpu: &Gpu, kernel: &MlpKernel) -> Result<&GpuFunction> {
        if let Some(full) = self.full.get() {
            return Ok(full);
        }
        let outcome = self.background.outcome().ok_or_else(|| MlpError::TierUnavailable {
            tier: KernelTier::Full.as_str(),
            kernel: kernel.name.clone(),
            why: "it is still compiling in the background; call wait_optimized first",
        })?;
        let compile_ms = outcome.result.map_err(|failure| MlpError::OptimizedCompile {
            kernel: kernel.name.clone(),
            arch: kernel.target(gpu.compile_arch()),
            message: failure.to_string(),
        })?;
        let function = load(gpu, kernel)?;
        if self.log {
            eprintln!(
                "kfuse: {}: switched to the optimised kernel (compiled in the background in {compile_ms:.0} ms)",
                kernel.name
            );
        }
        Ok(self.full.get_or_init(|| function))
    }
}

impl PreparedMlp {
    /// The tiled path's note (why the model is not fused), or `None` for the fused kernel.
    pub fn note(&self) -> Option<&str> {
        match &self.body {
            Body::Fused { .. } => None,
            Body::Tiled { plan, .. } => Some(&plan.note),
        }
    }

    /// The fused kernel (source, geometry, the requested NVRTC options), if this model is fused.
    pub fn kernel(&self) -> Option<&MlpKernel> {
        match &self.body {
            Body::Fused { kernel, .. } => Some(kernel),
            Body::Tiled { .. } => None,
        }
    }

    /// Wall time of the `prepare` that made this, ms.
    pub fn prepare_ms(&self) -> f64 {
        self.prepare_ms
    }

    /// Whether the first call got the fast form (the optimised kernel was not cached), whatever
    /// the launches use now.
    pub fn was_tiered(&self) -> bool {
        matches!(&self.body, Body::Fused { functions: FusedFunctions::Tiered(_), .. })
    }

    /// The kernel [`Self::launch`] uses as of its last switch: [`KernelTier::Fast`] until the
    /// optimised kernel has been loaded (by a launch after its compile finished, or by
    /// [`Self::wait_optimized`]), [`KernelTier::Full`] from then on and for untiered models.
    pub fn active_tier(&self) -> KernelTier {
        match &self.body {
            Body::Fused { functions: FusedFunctions::Tiered(t), .. } if t.full.get().is_none() => KernelTier::Fast,
            _ => KernelTier::Full,
        }
    }

    /// Whether launches run the requested (fully optimised) kernel: `active_tier() == Full`.
    pub fn is_optimized(&self) -> bool {
        self.active_tier() == KernelTier::Full
    }

    /// Blocks until the optimised kernel is compiled, loads it on `gpu` (the GPU given to
    /// `prepare`) so that every later launch uses it, and says when it was ready. Returns at once
    /// for untiered models. A failed background compile is [`MlpError::OptimizedCompile`]; the
    /// fast form keeps working.
    pub fn wait_optimized(&self, gpu: &Gpu) -> Result<TierReady> {
        let Body::Fused { kernel, functions: FusedFunctions::Tiered(tiered), .. } = &self.body else {
            return Ok(TierReady { ready_ms: self.prepare_ms, background_compile_ms: None });
        };
        let outcome = tiered.background.wait();
        tiered.promote(gpu, kernel)?;
        let ready_ms = outcome.finished_at.saturating_duration_since(self.started_at).as_secs_f64() * 1e3;
        Ok(TierReady { ready_ms, background_compile_ms: outcome.result.ok() })
    }

    /// Queues the model on `rows` rows: `input` holds `[rows, in]`, `output` gets `[rows, out]`,
    /// in the dtypes given to [`prepare`]. Asynchronous: synchronize or download to wait. Uses the
    /// optimised kernel as soon as it is ready (see the module docs), never waiting for it.
    pub fn launch(&self, gpu: &Gpu, input: &DeviceBuffer, output: &DeviceBuffer, rows: usize) -> Result<()> {
        self.launch_with(gpu, None, None, input, output, rows)
    }

    /// [`Self::launch`] on `stream` (created or borrowed by `gpu`, e.g. a framework's current
    /// stream) instead of the Gpu's own: no host synchronisation for the fused kernel. `input`
    /// and `output` must be ready for `stream`. The tiled fallback allocates its intermediates
    /// and so synchronises the Gpu's stream before and `stream` after its launches.
    pub fn launch_on_stream(
        &self,
        gpu: &Gpu,
        stream: &Stream,
        input: &DeviceBuffer,
        output: &DeviceBuffer,
        rows: usize,
    ) -> Result<()> {
        self.launch_with(gpu, Some(stream), None, input, output, rows)
    }

    /// [`Self::launch`] with one tier's kernel, for benchmarks: [`KernelTier::Fast`] needs a
    /// tiered model ([`Self::was_tiered`]); [`KernelTier::Full`] needs the optimised kernel to
    /// be compiled (loads it if needed). Otherwise [`MlpError::TierUnavailable`].
    pub fn launch_tier(
        &self,
        gpu: &Gpu,
        tier: KernelTier,
        input: &DeviceBuffer,
        output: &DeviceBuffer,
        rows: usize,
    ) -> Result<()> {
        self.launch_with(gpu, None, Some(tier), input, output, rows)
    }

    fn launch_with(
        &self,
        gpu: &Gpu,
        stream: Option<&Stream>,
        tier: Option<KernelTier>,
        input: &DeviceBuffer,
        output: &DeviceBuffer,
        rows: usize,
    ) -> Result<()> {
        if rows == 0 {
            return Err(MlpError::EmptyBatch.into());
        }
        let rows_i64 = i64::try_from(rows).map_err(|_| too_large("rows", rows))?;
        match &self.body {
            Body::Fused { kernel, functions, params, max_blocks } => {
                let unavailable = |why| MlpError::TierUnavailable {
                    tier: KernelTier::Fast.as_str(),
                    kernel: kernel.name.clone(),
                    why,
                };
                let (function, geometry) = match (functions, tier) {
                    (FusedFunctions::Single(f), None | Some(KernelTier::Full)) => (f, Geometry::of(kernel)),
                    (FusedFunctions::Single(_), Some(KernelTier::Fast)) => {
                        return Err(Error::from(unavailable(
                            "the optimised kernel was cached, so no fast form was compiled",
                        )))
                    }
                    (FusedFunctions::Tiered(t), None) => t.current(gpu, kernel),
                    (FusedFunctions::Tiered(t), Some(KernelTier::Fast)) => (&t.fast, t.fast_geometry),
                    (FusedFunctions::Tiered(t), Some(KernelTier::Full)) => {
                        (t.promote(gpu, kernel)?, Geometry::of(kernel))
                    }
                };
                let rpb = geometry.rows_per_block.max(1) as usize;
                let blocks = u32::try_from(rows.div_ceil(rpb)).unwrap_or(u32::MAX).min(*max_blocks).max(1);
                let args = [
                    KernelArg::Buffer(input),
                    KernelArg::Buffer(output),
                    KernelArg::Buffer(params),
                    KernelArg::I64(rows_i64),
                ];
                let launch = KernelLaunch::new(blocks, geometry.block).with_shared_bytes(geometry.shared_bytes);
                enqueue(gpu, stream.unwrap_or(&gpu.default_stream()), function, launch, &args)?;
            }
            Body::Tiled { plan, layers, widths } => {
                if tier == Some(KernelTier::Fast) {
                    let why = "the tiled fallback is compiled in full at once and has no fast form";
                    return Err(MlpError::TierUnavailable {
                        tier: KernelTier::Fast.as_str(),
                        kernel: format!("the tiled path ({})", plan.note),
                        why,
                    }
                    .into());
                }
                let mut temps: Vec<DeviceBuffer> = Vec::new();
                let last = layers.len() - 1;
                for n in &widths[..last] {
                    let bytes = rows.checked_mul(n * 4).ok_or_else(|| too_large("intermediate bytes", rows))?;
                    temps.push(gpu.alloc_zeroed(bytes)?);
                }
                if stream.is_some() {
                    // The intermediates were allocated on the Gpu's own stream.
                    gpu.synchronize()?;
                }
                for (i, (f, w, b)) in layers.iter().enumerate() {
                    let n = widths[i];
                    let blocks =
                        rows.div_ceil(16).checked_mul(n.div_ceil(16)).ok_or_else(|| too_large("tiled blocks", rows))?;
                    let grid = u32::try_from(blocks).map_err(|_| too_large("tiled blocks", blocks))?;
                    let x = if i == 0 { input } else { &temps[i - 1] };
                    let y = if i == last { output } else { &temps[i] };
                    let args = [
                        KernelArg::Buffer(x),
                        KernelArg::Buffer(y),
                        KernelArg::Buffer(w),
                        KernelArg::Buffer(b),
                        KernelArg::I64(rows_i64),
                    ];
                    enqueue(gpu, stream.unwrap_or(&gpu.default_stream()), f, KernelLaunch::new(grid, 256), &args)?;
                }
                // Keep the intermediates alive until the launches that use them have finished.
                match stream {
                    Some(s) => s.synchronize()?,
                    None => gpu.synchronize()?,
                }
                drop(temps);
            }
        }
        Ok(())
    }
}

/// Runs `model` on `input` (f32, f16 or bf16 `[rows, in]`) on the GPU; the result is stored in
/// `out_dtype`. Compiles on first use (tiered and cached: see [`prepare`]); the output is
/// poisoned (all bits set: NaN) before the launch.
pub fn run_gpu(gpu: &Gpu, model: &MlpModel, input: &HostTensor, out_dtype: DType) -> Result<HostTensor> {
    check_input(model, input)?;
    check_output_dtype(out_dtype)?;
    let (prepared, _) = prepare(gpu, model, input.dtype(), out_dtype)?;
    run_prepared(gpu, &prepared, model, input, out_dtype)
}

fn check_output_dtype(out_dtype: DType) -> Result<()> {
    match out_dtype {
        DType::F32 | DType::F16 | DType::BF16 => Ok(()),
        _ => Err(MlpError::OutputDType { dtype: out_dtype }.into()),
    }
}

/// [`run_gpu`] with a model prepared already (by [`prepare`] for `input.dtype()` and
/// `out_dtype`): uploads `input`, poisons the output, launches, downloads.
pub fn run_prepared(
    gpu: &Gpu,
    prepared: &PreparedMlp,
    model: &MlpModel,
    input: &HostTensor,
    out_dtype: DType,
) -> Result<HostTensor> {
    let rows = check_input(model, input)?;
    check_output_dtype(out_dtype)?;
    for (what, prepared_for, given) in
        [("input", prepared.in_dtype, input.dtype()), ("output", prepared.out_dtype, out_dtype)]
    {
        if prepared_for != given {
            return Err(MlpError::PreparedDType { what, prepared: prepared_for, given }.into());
        }
    }
    let x = gpu.upload(&input.to_bytes())?;
    let out_bytes = rows
        .checked_mul(model.output_width() * out_dtype.size_bytes())
        .ok_or_else(|| too_large("output bytes", rows))?;
    let y = gpu.alloc_zeroed(out_bytes)?;
    gpu.fill(&y, 0xff)?;
    prepared.launch(gpu, &x, &y, rows)?;
    let bytes = gpu.download(&y)?;
    HostTensor::from_bytes(out_dtype, vec![rows, model.output_width()], &bytes)
        .ok_or_else(|| too_large("downloaded bytes (size mismatch)", bytes.len()))
}
