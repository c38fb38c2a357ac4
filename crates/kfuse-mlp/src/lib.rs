//! kfuse's MLP path: a PyTorch MLP (model.json + safetensors, see `tools/export_mlp.py`) becomes
//! one fused tensor-core CUDA kernel generated for its exact widths, activations and dtypes,
//! compiled with NVRTC and cached by kfuse-runtime; the same model runs on the CPU through the
//! interpreter as the oracle.
//!
//! Entry points: [`MlpModel::load`], [`run_cpu`], [`run_gpu`], [`prepare`] (tiered compilation:
//! the first call runs a quickly compiled kernel while the optimised one compiles in the
//! background, see [`Tiering`]), [`bench_gpu`], and for tests and
//! tools [`emit_kernel`], [`reference_f64`], [`testing`].
//! Does not handle: training/backward, layers other than Linear + elementwise activation.
#![forbid(unsafe_code)]

mod activation;
mod bench;
mod cpu;
mod error;
mod generic;
mod gpu;
mod kernel;
mod model;
pub mod testing;
mod tier;
mod tiled;
mod wgmma;

pub use activation::{Activation, ActivationKind, NAMED_ACTIVATIONS};
pub use bench::{bench_gpu, measure_ceilings, nvrtc_cache_disabled, BenchOptions, BenchReport};
pub use cpu::{check_input, compare_rows, erf_f64, evaluate_cpu, reference_f64, run_cpu, run_cpu_as, ErrorReport};
pub use error::{MlpError, Result};
pub use generic::{emit_generic, GenericRefusal};
pub use gpu::{prepare, prepare_tiered, prepare_with, run_gpu, run_prepared, PreparedMlp, TierReady};
pub use kernel::{
    emit_kernel, fusable, ActivationMath, BiasOperand, ChunkOrder, CompileEffort, HiddenAccumulator, MlpKernel,
    MlpKernelOptions, RepeatedLayers, TensorInstructions, H100_SHARED_LIMIT, WGMMA_ARCH,
};
pub use model::{weights_path, LayerDescription, MlpLayer, MlpModel, ModelDescription, MODEL_FORMAT};
pub use tier::{emit_fast_form, BackgroundCompile, BackgroundFailure, BackgroundOutcome, KernelTier, Tiering};
pub use tiled::{emit_tiled, TiledLayerKernel, TiledPlan};
