//! Running a model on a GPU: [`prepare`] compiles (through kfuse-runtime's NVRTC + cache) and
//! uploads the parameters once; [`PreparedMlp::launch`] runs it on device buffers; [`run_gpu`]
//! does both for one host tensor, poisoning the output first so unwritten elements show up.
//!
//! Handles: the fused kernel, and the tiled fallback (with its note) when the model does not fit.
//! Does not handle: several GPUs, streams other than the Gpu's own, inputs already on the device
//! in another process.

use std::time::Instant;

use kfuse_ir::{DType, HostTensor};
use kfuse_runtime::{DeviceBuffer, Gpu, GpuFunction, KernelArg};

use crate::cpu::check_input;
use crate::error::{MlpError, Result};
use crate::kernel::{emit_kernel, MlpKernel, MlpKernelOptions};
use crate::model::MlpModel;
use crate::tiled::{emit_tiled, TiledPlan};

/// A compiled, uploaded model on one GPU.
pub enum PreparedMlp {
    /// The fused kernel.
    Fused {
        /// The generated kernel.
        kernel: MlpKernel,
        /// Its loaded function.
        function: GpuFunction,
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

fn too_large(what: &'static str, value: usize) -> MlpError {
    MlpError::TooLarge { what, value: value as u64, limit: u32::MAX as u64 }
}

/// Compiles and uploads `model` for inputs of `in_dtype` and outputs of `out_dtype`; returns it
/// and the wall time this took (the first-call compile time when the cache is cold).
pub fn prepare(gpu: &Gpu, model: &MlpModel, in_dtype: DType, out_dtype: DType) -> Result<(PreparedMlp, f64)> {
    let opts = MlpKernelOptions { in_dtype, out_dtype, shared_limit: gpu.max_shared_bytes(), ..MlpKernelOptions::default() };
    prepare_with(gpu, model, &opts)
}

/// [`prepare`] with explicit kernel choices (tile sizes, activation math; for tuning). The
/// shared-memory limit is capped at the device's.
pub fn prepare_with(gpu: &Gpu, model: &MlpModel, opts: &MlpKernelOptions) -> Result<(PreparedMlp, f64)> {
    let start = Instant::now();
    let (in_dtype, out_dtype) = (opts.in_dtype, opts.out_dtype);
    let opts = MlpKernelOptions { shared_limit: opts.shared_limit.min(gpu.max_shared_bytes()), ..opts.clone() };
    let prepared = match emit_kernel(model, &opts) {
        Ok(kernel) => {
            let function = gpu.load_kernel_with_options(&kernel.source, &kernel.name, &kernel.nvrtc_options)?;
            let params = gpu.upload(&kernel.params)?;
            PreparedMlp::Fused { kernel, function, params, max_blocks: gpu.sm_count().max(1) }
        }
        Err(MlpError::SharedMemory { what, needed, limit }) => {
            let why = format!("{what}: needs {needed}, limit {limit}");
            let plan = emit_tiled(model, in_dtype, out_dtype, &why)?;
            let mut layers = Vec::with_capacity(plan.layers.len());
            for l in &plan.layers {
                let f = gpu.load_kernel(&l.source, &l.name)?;
                layers.push((f, gpu.upload(&l.weight_bytes)?, gpu.upload(&l.bias_bytes)?));
            }
            PreparedMlp::Tiled { plan, layers, widths: model.layers.iter().map(|l| l.outputs).collect() }
        }
        Err(other) => return Err(other),
    };
    Ok((prepared, start.elapsed().as_secs_f64() * 1e3))
}

impl PreparedMlp {
    /// The tiled path's note (why the model is not fused), or `None` for the fused kernel.
    pub fn note(&self) -> Option<&str> {
        match self {
            PreparedMlp::Fused { .. } => None,
            PreparedMlp::Tiled { plan, .. } => Some(&plan.note),
        }
    }

    /// The fused kernel, if this model is fused.
    pub fn kernel(&self) -> Option<&MlpKernel> {
        match self {
            PreparedMlp::Fused { kernel, .. } => Some(kernel),
            PreparedMlp::Tiled { .. } => None,
        }
    }

    /// Queues the model on `rows` rows: `input` holds `[rows, in]`, `output` gets `[rows, out]`,
    /// in the dtypes given to [`prepare`]. Asynchronous: synchronize or download to wait.
    pub fn launch(&self, gpu: &Gpu, input: &DeviceBuffer, output: &DeviceBuffer, rows: usize) -> Result<()> {
        if rows == 0 {
            return Err(MlpError::EmptyBatch);
        }
        let rows_i64 = i64::try_from(rows).map_err(|_| too_large("rows", rows))?;
        match self {
            PreparedMlp::Fused { kernel, function, params, max_blocks } => {
                let rpb = kernel.rows_per_block as usize;
                let blocks = u32::try_from(rows.div_ceil(rpb)).unwrap_or(u32::MAX).min(*max_blocks).max(1);
                gpu.launch(
                    function,
                    blocks,
                    kernel.block,
                    kernel.shared_bytes,
                    &[KernelArg::Buffer(input), KernelArg::Buffer(output), KernelArg::Buffer(params), KernelArg::I64(rows_i64)],
                )?;
            }
            PreparedMlp::Tiled { layers, widths, .. } => {
                let mut temps: Vec<DeviceBuffer> = Vec::new();
                let last = layers.len() - 1;
                for (i, (f, w, b)) in layers.iter().enumerate() {
                    let n = widths[i];
                    let blocks = rows.div_ceil(16).checked_mul(n.div_ceil(16)).ok_or_else(|| too_large("tiled blocks", rows))?;
                    let grid = u32::try_from(blocks).map_err(|_| too_large("tiled blocks", blocks))?;
                    if i != last {
                        let bytes = rows.checked_mul(n * 4).ok_or_else(|| too_large("intermediate bytes", rows))?;
                        temps.push(gpu.alloc_zeroed(bytes)?);
                    }
                    let x = if i == 0 { input } else { &temps[i - 1] };
                    let y = if i == last { output } else { &temps[i] };
                    gpu.launch(
                        f,
                        grid,
                        256,
                        0,
                        &[KernelArg::Buffer(x), KernelArg::Buffer(y), KernelArg::Buffer(w), KernelArg::Buffer(b), KernelArg::I64(rows_i64)],
                    )?;
                }
                // Keep the intermediates alive until the launches that use them have finished.
                gpu.synchronize()?;
                drop(temps);
            }
        }
        Ok(())
    }
}

/// Runs `model` on `input` (f32, f16 or bf16 `[rows, in]`) on the GPU; the result is stored in
/// `out_dtype`. Compiles on first use (cached); the output is poisoned (all bits set: NaN)
/// before the launch.
pub fn run_gpu(gpu: &Gpu, model: &MlpModel, input: &HostTensor, out_dtype: DType) -> Result<HostTensor> {
    let rows = check_input(model, input)?;
    if !matches!(out_dtype, DType::F32 | DType::F16 | DType::BF16) {
        return Err(MlpError::OutputDType { dtype: out_dtype });
    }
    let (prepared, _) = prepare(gpu, model, input.dtype(), out_dtype)?;
    let x = gpu.upload(&input.to_bytes())?;
    let out_bytes = rows.checked_mul(model.output_width() * out_dtype.size_bytes()).ok_or_else(|| too_large("output bytes", rows))?;
    let y = gpu.alloc_zeroed(out_bytes)?;
    gpu.fill(&y, 0xff)?;
    prepared.launch(gpu, &x, &y, rows)?;
    let bytes = gpu.download(&y)?;
    HostTensor::from_bytes(out_dtype, vec![rows, model.output_width()], &bytes)
        .ok_or_else(|| too_large("downloaded bytes (size mismatch)", bytes.len()))
}
