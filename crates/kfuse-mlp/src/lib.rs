//! kfuse's MLP path, pure part: a PyTorch MLP (model.json + safetensors, see
//! `tools/export_mlp.py`) becomes one fused tensor-core CUDA kernel generated for its exact
//! widths, activations and dtypes; the same model runs on the CPU through the interpreter as the
//! oracle. No GPU and no CUDA here: compiling, caching and launching are the `kfuse` facade's
//! (`kfuse::mlp`), which this crate's kernels describe fully (source, NVRTC options, target
//! [`Arch`], launch geometry, parameter blob).
//!
//! Entry points: [`MlpModel::load`] (or [`MlpModel::from_tensors`] from memory), [`run_cpu`],
//! [`emit_kernel`] (the fused kernel), [`emit_fast_form`] (tiered compilation's quickly compiled
//! stand-in, see [`Tiering`]), [`emit_tiled`] (one kernel per layer, for models that do not
//! fit), and for tests and tools [`reference_f64`], [`testing`].
//! Does not handle: training/backward, layers other than Linear + elementwise activation.
#![forbid(unsafe_code)]

mod activation;
mod cpu;
mod error;
mod generic;
mod kernel;
mod model;
pub mod testing;
mod tier;
mod tiled;
mod wgmma;

pub use kfuse_arch::Arch;

pub use activation::{Activation, ActivationKind, NAMED_ACTIVATIONS};
pub use cpu::{check_input, compare_rows, erf_f64, evaluate_cpu, reference_f64, run_cpu, run_cpu_as, ErrorReport};
pub use error::{MlpError, Result};
pub use generic::{emit_generic, GenericRefusal};
pub use kernel::{
    emit_kernel, fusable, ActivationMath, ChunkOrder, CompileEffort, HiddenAccumulator, MlpKernel, MlpKernelOptions,
    RepeatedLayers, TensorInstructions, H100_SHARED_LIMIT, WGMMA_ARCH,
};
pub use model::{weights_path, LayerDescription, MlpLayer, MlpModel, ModelDescription, MODEL_FORMAT};
pub use tier::{emit_fast_form, KernelTier, Tiering};
pub use tiled::{emit_tiled, TiledLayerKernel, TiledPlan};
