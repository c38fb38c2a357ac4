//! Tiered compilation's pure pieces: the choice ([`Tiering`]), the two kernels' names
//! ([`KernelTier`]) and the fast form's generation ([`emit_fast_form`]: less code and cheaper
//! NVRTC options than the optimised kernel, the same parameters). The launcher (in the `kfuse`
//! facade) runs the fast form while the optimised kernel compiles in the background into the
//! kernel cache.

use crate::generic::emit_generic;
use crate::kernel::{emit_kernel, CompileEffort, MlpKernel, MlpKernelOptions, RepeatedLayers};
use crate::model::MlpModel;

/// The first NVRTC version that knows `-minimal` (CUDA 12.4).
const NVRTC_MINIMAL_SINCE: (i32, i32) = (12, 4);

/// The stand-in kernel that serves a cold first call while `full` (emitted from `model` and
/// `opts`) compiles in the background, or `None` when no form shares `full`'s parameter blob and
/// I/O dtypes (then there is no tiering). Tried in order, the first that shares them wins:
/// 0. the generic kernel ([`crate::emit_generic`], generic.rs): code independent of the widths
///    and the depth (run-time loops over a layer table), `--Ofast-compile=mid`; refused when
///    its two 16-row activation buffers per warp do not fit next to the weights, or when the
///    blob's layout is not the one it knows;
/// 1. `--Ofast-compile=mid`, identical hidden layers as one run-time loop
///    ([`RepeatedLayers::Loop`]) and one 16-row tile per warp: the least code for NVRTC; its
///    launch geometry (warps, block, shared memory, rows per block) is its own;
/// 2. `full`'s source with `--Ofast-compile=mid` (the same geometry).
///
/// With NVRTC 12.4 or later (`nvrtc_version`), `-minimal` is added to the options: it leaves out
/// the runtime-API declarations a header-free kernel never uses.
///
/// Form 0 compiles quickest and about as fast for every model: NVRTC's time grows with the code
/// it optimises, and the generic code holds one copy of each piece. The measured compile times
/// of each form are in the MLP first-call benchmark results.
pub fn emit_fast_form(
    model: &MlpModel,
    opts: &MlpKernelOptions,
    full: &MlpKernel,
    nvrtc_version: (i32, i32),
) -> Option<MlpKernel> {
    let minimal = nvrtc_version >= NVRTC_MINIMAL_SINCE;
    if let Ok(mut generic) = emit_generic(model, opts, full) {
        if minimal {
            generic.nvrtc_options.push("-minimal".to_string());
        }
        return Some(generic);
    }
    let fast = MlpKernelOptions { compile_effort: CompileEffort::Fast, ..opts.clone() };
    let smallest =
        MlpKernelOptions { repeated_layers: RepeatedLayers::Loop, row_tiles_per_warp: Some(1), ..fast.clone() };
    let mut chosen = [smallest, fast].iter().filter_map(|o| emit_kernel(model, o).ok()).find(|k| {
        k.params_layout == full.params_layout
            && (k.in_dtype, k.out_dtype) == (full.in_dtype, full.out_dtype)
            && k.nvrtc_options != full.nvrtc_options
    })?;
    if minimal {
        chosen.nvrtc_options.push("-minimal".to_string());
    }
    Some(chosen)
}

/// Whether the launcher (`kfuse::mlp::prepare_tiered`) may start with a quickly compiled kernel.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub enum Tiering {
    /// When the fully optimised kernel is not in the kernel cache (memory or disk), compile the
    /// [`crate::CompileEffort::Fast`] form now, run with it, and compile the optimised one on a
    /// background thread; launches switch to it once it is ready. Applies only when the
    /// requested effort is [`crate::CompileEffort::Full`] and the cache is not bypassed.
    #[default]
    Background,
    /// Compile exactly the requested kernel before returning (the first call waits for it).
    FullOnly,
}

/// Which of a prepared model's kernels a launch uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum KernelTier {
    /// The stand-in ([`emit_fast_form`], compiled with `--Ofast-compile=mid`) because the
    /// requested kernel was not cached: quick to compile, slower to run.
    Fast,
    /// The kernel of the requested options (the fully optimised one by default), or the tiled
    /// path's kernels.
    Full,
}

impl KernelTier {
    /// `"fast"` or `"full"`.
    pub fn as_str(self) -> &'static str {
        match self {
            KernelTier::Fast => "fast",
            KernelTier::Full => "full",
        }
    }
}
