//! PyTorch MLPs on the GPU: [`MlpProgram`] holds one model compiled for one device (the fused
//! tensor-core kernel that kfuse-mlp generates, or its tiled fallback), its parameters uploaded,
//! and runs it on host data ([`MlpProgram::forward`]) or on device buffers on a given stream
//! ([`MlpProgram::launch`]: the runtime's own memory, or a framework's borrowed with
//! `Gpu::borrow_memory` on its stream borrowed with `Gpu::borrow_stream`).
//!
//! The first compile is tiered (see [`launcher`]): when the optimised kernel is not cached, a
//! quickly compiled form serves the first calls while the optimised one compiles in the
//! background into the kernel cache; launches switch to it once it is ready
//! ([`MlpProgram::wait_optimized`] waits for that).
//!
//! Lower level: [`prepare`], [`prepare_with`], [`PreparedMlp`] (a model on a GPU given per call),
//! [`run_gpu`]. The CLI's `kfuse mlp bench` times a model against the card's ceilings.
//!
//! Does not handle: several GPUs per program (make one program per device).

pub mod launcher;

use std::sync::Arc;

use kfuse_ir::{DType, HostTensor};
use kfuse_runtime::{DeviceBuffer, Gpu, Stream};

pub use kfuse_mlp::{
    compare_rows, emit_kernel, evaluate_cpu, run_cpu, run_cpu_as, testing, ActivationMath, ChunkOrder, CompileEffort,
    ErrorReport, HiddenAccumulator, KernelTier, MlpError, MlpKernelOptions, MlpModel, RepeatedLayers,
    TensorInstructions, Tiering,
};
pub use launcher::{prepare, prepare_tiered, prepare_with, run_gpu, run_prepared, PreparedMlp, TierReady};

use crate::Error;

/// How an [`MlpProgram`] is compiled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MlpOptions {
    /// Dtype of the input rows (f32, f16 or bf16).
    pub in_dtype: DType,
    /// Dtype of the output rows (f32, f16 or bf16).
    pub out_dtype: DType,
    /// The kernel's choices; `None`: [`MlpKernelOptions::tuned_for`] the device. Their dtypes
    /// are replaced by `in_dtype` and `out_dtype`, their shared-memory limit capped at the
    /// device's.
    pub kernel: Option<MlpKernelOptions>,
    /// Whether the first calls may run a quickly compiled form while the optimised kernel
    /// compiles in the background.
    pub tiering: Tiering,
}

impl Default for MlpOptions {
    fn default() -> Self {
        MlpOptions { in_dtype: DType::F16, out_dtype: DType::F16, kernel: None, tiering: Tiering::Background }
    }
}

impl MlpOptions {
    /// The defaults for inputs of `in_dtype` and outputs of `out_dtype`.
    pub fn for_dtypes(in_dtype: DType, out_dtype: DType) -> MlpOptions {
        MlpOptions { in_dtype, out_dtype, ..MlpOptions::default() }
    }
}

/// A model compiled and uploaded for one GPU, which it holds: it can live as long as its user
/// (a Python object, a server) and be shared between threads.
pub struct MlpProgram {
    model: Arc<MlpModel>,
    gpu: Arc<Gpu>,
    prepared: PreparedMlp,
    options: MlpOptions,
}

impl MlpProgram {
    /// Compiles (through the GPU's kernel cache, tiered as `options.tiering` says) and uploads
    /// `model` for `gpu`.
    pub fn new(model: MlpModel, gpu: Arc<Gpu>, options: MlpOptions) -> Result<MlpProgram, Error> {
        let base = options.kernel.clone().unwrap_or_else(|| MlpKernelOptions::tuned_for(gpu.compile_arch()));
        let kernel = MlpKernelOptions {
            in_dtype: options.in_dtype,
            out_dtype: options.out_dtype,
            shared_limit: gpu.max_shared_bytes(),
            ..base
        };
        let (prepared, _) = prepare_tiered(&gpu, &model, &kernel, options.tiering)?;
        Ok(MlpProgram { model: Arc::new(model), gpu, prepared, options })
    }

    /// [`Self::new`] on device `ordinal` of `engine` (opened once by the engine, then shared),
    /// compiling through the engine's kernel cache.
    pub fn on_engine(
        engine: &crate::Engine,
        ordinal: usize,
        model: MlpModel,
        options: MlpOptions,
    ) -> Result<MlpProgram, Error> {
        // The caller's current device (its thread's CUDA context) is left as it was.
        kfuse_runtime::preserving_thread_context(|| MlpProgram::new(model, engine.device(ordinal)?, options))
    }

    /// Runs the model on `input` (`[rows, in]` of the input dtype given to [`Self::new`]) and
    /// returns `[rows, out]` in the output dtype: uploads, launches, downloads (the output is
    /// poisoned first, so that unwritten elements show up as NaN).
    pub fn forward(&self, input: &HostTensor) -> Result<HostTensor, Error> {
        run_prepared(&self.gpu, &self.prepared, &self.model, input, self.options.out_dtype)
    }

    /// Queues the model on `rows` rows of device memory on `stream` (the Gpu's
    /// [`Gpu::default_stream`], one it created, or a borrowed framework stream): `input` holds
    /// `[rows, in]`, `output` gets `[rows, out]`, in the dtypes given to [`Self::new`]; both must
    /// be ready for `stream`. The fused kernel is queued without host synchronisation or
    /// allocation; the tiled fallback (models too wide to fuse) allocates intermediates and
    /// synchronises. Uses the optimised kernel as soon as its background compile is done.
    pub fn launch(
        &self,
        stream: &Stream,
        input: &DeviceBuffer,
        output: &DeviceBuffer,
        rows: usize,
    ) -> Result<(), Error> {
        // The caller's current device (its thread's CUDA context) is left as it was.
        kfuse_runtime::preserving_thread_context(|| {
            self.prepared.launch_on_stream(&self.gpu, stream, input, output, rows)
        })
    }

    /// Blocks until the optimised kernel is compiled and loaded, so that every later call uses it;
    /// says when it was ready. Returns at once when the first call did not need the fast form.
    pub fn wait_optimized(&self) -> Result<TierReady, Error> {
        kfuse_runtime::preserving_thread_context(|| self.prepared.wait_optimized(&self.gpu))
    }

    /// The kernel launches use now.
    pub fn active_tier(&self) -> KernelTier {
        self.prepared.active_tier()
    }

    /// The model.
    pub fn model(&self) -> &MlpModel {
        &self.model
    }

    /// The GPU it runs on.
    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    /// The options it was compiled with.
    pub fn options(&self) -> &MlpOptions {
        &self.options
    }

    /// The compiled model, for benchmarks and tools.
    pub fn prepared(&self) -> &PreparedMlp {
        &self.prepared
    }
}

impl std::fmt::Debug for MlpProgram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MlpProgram")
            .field("model", &self.model.summary())
            .field("gpu", &self.gpu)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_program_can_be_shared_between_threads() {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<MlpProgram>();
        send_sync::<PreparedMlp>();
    }
}
