//! The fused kernel's generator: from a model and the I/O dtypes to one CUDA source (constants,
//! activation functions, the reviewed templates `mlp_prelude.cuh` / `mlp_kernel.cuh`, and a
//! generated `kf_forward` that chains the layers), plus the packed parameter blob the kernel
//! copies to shared memory, and the launch geometry.
//!
//! Handles: any depth, widths 1..=256 on every layer (padded to 16/8), f16 or bf16 weights,
//! f32/f16/bf16 inputs and outputs. Does not handle: models whose weights do not fit in shared
//! memory or whose layers are too wide for register-resident activations (K + N > 640 padded);
//! [`emit_kernel`] reports those as errors and `tiled.rs` runs them instead.
//! Activations: ReLU is fused into the f32→f16/bf16 conversion (exact); SiLU of hidden layers is
//! `h + h·tanh(h)` with `h = x/2`, the ½ folded into the layer's weights and bias on the host, on
//! packed f16 pairs for f16 models (see `kf_silu_half_f16x2` in mlp_prelude.cuh: a few f16 ulps of
//! the row's scale; [`ActivationMath::TanhF32`] and [`ActivationMath::F32`] for f32 forms,
//! [`ActivationMath::PackedFma`] for a share of the pairs without the SFU); other
//! expressions are f32 device functions from
//! kfuse-codegen, compiled with approximate division (see `FAST_MATH_OPTIONS`).
//! Pure: no GPU, no I/O; the same model and options give the same bytes.

use std::fmt::Write;

use half::{bf16, f16};

use kfuse_arch::Arch;
use kfuse_ir::DType;

use crate::activation::ActivationKind;
use crate::error::{MlpError, Result};
use crate::model::MlpModel;
use crate::wgmma::{self, WgLayer};

const PRELUDE: &str = include_str!("mlp_prelude.cuh");
const KERNEL: &str = include_str!("mlp_kernel.cuh");
/// Alternative hidden-layer forms, appended after the prelude only when options select one.
const LAYER_FORMS: &str = include_str!("mlp_layer_forms.cuh");
/// Hidden layers on wgmma (sm_90a), appended after the prelude only for [`TensorInstructions::Wgmma`].
const WGMMA_FORMS: &str = include_str!("mlp_wgmma.cuh");

/// Fast math for the activations, placed before them. Activations are rounded to f16/bf16 between
/// layers, so IEEE-accurate library calls (tens of instructions each, inlined once per element a
/// thread owns: hundreds of copies in a fully unrolled kernel) buy nothing but compile time and
/// issue slots; the approximate intrinsics are one MUFU op (plus a multiply) each, with relative
/// errors near 2^-21 (exp, log, sin, cos on moderate arguments) and 2^-11 (tanh), under the
/// storage rounding. Division and erf keep their IEEE forms.
const FAST_MATH: &str = "// Activations use fast approximate math (see kfuse-mlp kernel.rs, FAST_MATH).
__device__ __forceinline__ float kf_tanh_approx(float x) { float y; asm(\"tanh.approx.f32 %0, %1;\" : \"=f\"(y) : \"f\"(x)); return y; }
#define expf __expf
#define logf __logf
#define sinf __sinf
#define cosf __cosf
#define tanhf kf_tanh_approx

";

/// Shared memory per block that a kernel may use on an H100 (227 KiB), the default limit.
pub const H100_SHARED_LIMIT: u32 = 232_448;

/// Register budget (32-bit registers per thread) for a warp's input + output fragments (all its
/// row tiles); the rest of the 255 covers accumulators, addresses and the activation's
/// temporaries.
const FRAGMENT_REGISTER_BUDGET: usize = 128;
/// Padded K + N above which a layer's fragments cannot stay in registers (spills).
const MAX_FUSED_K_PLUS_N: usize = 640;

/// How the fused kernel evaluates SiLU (every other activation is unaffected).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ActivationMath {
    /// f16 models: hidden SiLU as `h + h·tanh(h)` on packed f16 pairs (`tanh.approx.f16x2`, which
    /// sm_90 runs as two MUFU.TANH.F16; error a few f16 ulps of the row's scale), with the layer's
    /// weights and bias halved on the host so that the accumulators hold `h = x/2`. bf16 models
    /// use [`Self::F32`]'s form.
    #[default]
    Packed,
    /// [`Self::Packed`], with `eighths` of every 8 packed pairs of each hidden SiLU layer (0..=8)
    /// evaluated without the SFU: `exp` by exponent-bit construction and a polynomial, `tanh` as
    /// a polynomial in it, all on f16 pairs (`kf_silu_half_f16x2_fma` in mlp_prelude.cuh: 15
    /// FMA/integer-pipe instructions a pair instead of 2 MUFU + 1; error of the same order as
    /// the MUFU form, checked on every f16 input by this module's tests). For f16 models whose
    /// SFU (MUFU) pipe limits the kernel: one eighth pays with wgmma layers
    /// ([`MlpKernelOptions::tuned_for`]), larger shares add more instructions than they save.
    /// bf16 models use [`Self::F32`]'s form. Combines with [`ChunkOrder::Pipelined`].
    PackedFma {
        /// Pairs of every 8 that take the FMA form (0 is [`Self::Packed`], 8 all of them).
        eighths: u8,
    },
    /// Hidden SiLU as `h + h·tanh(h)` in f32 (`tanh.approx.f32`, one MUFU op and one FMA per
    /// element), with the ½ folded into the weights as for [`Self::Packed`]; any model dtype.
    TanhF32,
    /// SiLU in f32 as `x * rcp(1 + exp(-x))` with approximate exp and reciprocal (two MUFU ops
    /// per element; error far under the storage rounding).
    F32,
}

/// How hard NVRTC optimises the fused kernel (the first call's compile time against speed).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CompileEffort {
    /// NVRTC's default optimisation.
    #[default]
    Full,
    /// `--Ofast-compile=mid`: a fraction of the default's compile time for a slower kernel, for
    /// a first call that cannot wait for the fully optimised kernel.
    Fast,
}

/// How consecutive identical hidden layers (same width in and out, bias presence, activation) are
/// emitted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RepeatedLayers {
    /// One run-time loop over the run (`kf_hidden_loop`): one copy of the layer's code, so NVRTC
    /// compiles it in about half the time, for a kernel a few percent slower.
    Loop,
    /// Every layer unrolled (the compiler sees the whole chain and overlaps one layer's epilogue
    /// with the next layer's mmas): the fastest kernel, the default.
    #[default]
    Unrolled,
}

/// Where hidden layers accumulate their products (the last layer always accumulates in f32).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum HiddenAccumulator {
    /// f32 accumulators, rounded once to the compute dtype after the activation.
    #[default]
    F32,
    /// f16 models: hidden layers whose activation has a packed f16 form (SiLU with
    /// [`ActivationMath::Packed`], ReLU, identity; not the PackedFma share) accumulate in f16
    /// (`mma .f16.f16.f16.f16`): the accumulators are already the next layer's input
    /// registers, so the f32→f16 conversions go and the accumulators take half the registers.
    /// Biases are stored as f16. Accuracy: every k16 step rounds the running sum to f16 (K/16
    /// roundings instead of one), and sums past ±65504 overflow. Other layers and bf16 models
    /// keep [`Self::F32`]. Faster on f16 SiLU models, but an opt-in: the default accumulates in
    /// f32.
    F16,
}

/// Order of a hidden layer's work over its 16-column output chunks (f32 accumulators).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ChunkOrder {
    /// Chunk by chunk: mmas, then the activation (the compiler interleaves what it can).
    #[default]
    Sequential,
    /// Software-pipelined: chunk j + 1's mmas come before chunk j's activation in source order
    /// (`kf_hidden_layer_p`, mlp_layer_forms.cuh). Unrolled layers only; combines with an
    /// [`ActivationMath::PackedFma`] share.
    Pipelined,
}

/// Which tensor-core instructions the hidden layers with f32 accumulators use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TensorInstructions {
    /// `mma.sync.m16n8k16`, issued by each warp (any sm_80+ GPU).
    #[default]
    MmaSync,
    /// Hopper's asynchronous warpgroup MMA (`wgmma.mma_async`, mlp_wgmma.cuh): the products of
    /// the next 32 output columns run on the tensor cores while the warps apply the activation
    /// to the previous ones. Compiled for `sm_90a`, so only for compute capability 9.0 devices;
    /// warps per block a multiple of 4. Layers with f16 accumulators ([`HiddenAccumulator::F16`])
    /// and the last layer keep mma.sync; an FMA share of SiLU ([`ActivationMath::PackedFma`])
    /// applies as with mma.sync.
    Wgmma,
}

/// The row form's budget for the registers a warp keeps in flight around one layer (its f32
/// accumulators and fragments for both row tiles, plus the next layer's accumulators for one):
/// N + N_next / 2 for padded widths N (the SiLU bench model's 128 → 96 layer: 176).
const ROW_FORM_REGISTERS: usize = 192;

/// The target of kernels with wgmma layers: the architecture-specific `sm_90a`.
pub const WGMMA_ARCH: Arch = Arch::accelerated(9, 0);

/// NVRTC options of every fused kernel: approximate division and square root and f32 denormals
/// flushed, for activation expressions (whose values are rounded to f16/bf16 between layers).
const FAST_MATH_OPTIONS: [&str; 3] = ["-ftz=true", "-prec-div=false", "-prec-sqrt=false"];

/// Choices for [`emit_kernel`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MlpKernelOptions {
    /// Dtype of the input rows in global memory.
    pub in_dtype: DType,
    /// Dtype of the output rows in global memory.
    pub out_dtype: DType,
    /// Shared memory one block may use (the device's opt-in limit).
    pub shared_limit: u32,
    /// Warps per block (1..=16); `None` picks the most that fit the register file (estimated)
    /// and shared memory.
    pub warps: Option<u32>,
    /// 16-row tiles per warp (1..=8); `None` picks from the register budget (1..=2).
    pub row_tiles_per_warp: Option<u32>,
    /// How SiLU is evaluated.
    pub activation_math: ActivationMath,
    /// NVRTC's optimisation effort.
    pub compile_effort: CompileEffort,
    /// Runs of identical hidden layers: a loop or unrolled.
    pub repeated_layers: RepeatedLayers,
    /// Where hidden layers accumulate: f32 by default; [`HiddenAccumulator::F16`] is faster on
    /// f16 models but accumulates in f16, an opt-in.
    pub hidden_accumulator: HiddenAccumulator,
    /// The order of a hidden layer's output chunks.
    pub chunk_order: ChunkOrder,
    /// mma.sync or wgmma for the hidden layers (see [`TensorInstructions`]).
    pub tensor_instructions: TensorInstructions,
}

impl Default for MlpKernelOptions {
    fn default() -> Self {
        MlpKernelOptions {
            in_dtype: DType::F16,
            out_dtype: DType::F16,
            shared_limit: H100_SHARED_LIMIT,
            warps: None,
            row_tiles_per_warp: None,
            activation_math: ActivationMath::Packed,
            compile_effort: CompileEffort::Full,
            repeated_layers: RepeatedLayers::Unrolled,
            hidden_accumulator: HiddenAccumulator::F32,
            chunk_order: ChunkOrder::Sequential,
            tensor_instructions: TensorInstructions::MmaSync,
        }
    }
}

impl MlpKernelOptions {
    /// The defaults with the choices measured best on a GPU of compute capability `arch` (an `a`
    /// target counts as its plain one): on 9.0 (H100), hidden layers on wgmma
    /// ([`TensorInstructions::Wgmma`]) and one eighth of the packed SiLU pairs on the FMA pipe,
    /// faster than the defaults on every MLP benchmark model (see the benchmark results). Other
    /// GPUs get [`Default::default`].
    pub fn tuned_for(arch: Arch) -> MlpKernelOptions {
        let d = MlpKernelOptions::default();
        if arch.plain() == Arch::new(9, 0) {
            MlpKernelOptions {
                tensor_instructions: TensorInstructions::Wgmma,
                activation_math: ActivationMath::PackedFma { eighths: 1 },
                ..d
            }
        } else {
            d
        }
    }
}

/// A generated fused kernel: source, name, parameters and launch geometry together.
#[derive(Clone, Debug, PartialEq)]
pub struct MlpKernel {
    /// `kf_mlp_<hash>`, a function of the source.
    pub name: String,
    /// Header-free CUDA C++.
    pub source: String,
    /// Threads per block.
    pub block: u32,
    /// Dynamic shared memory per block.
    pub shared_bytes: u32,
    /// Warps per block.
    pub warps: u32,
    /// 16-row tiles per warp.
    pub row_tiles_per_warp: u32,
    /// Rows one warp handles at a time (16 × row tiles).
    pub rows_per_warp: u32,
    /// Rows all warps of a block handle at a time.
    pub rows_per_block: u32,
    /// The weights (fragment order) and f32 biases, to upload and pass as `params`.
    pub params: Vec<u8>,
    /// Input dtype the kernel reads.
    pub in_dtype: DType,
    /// Output dtype the kernel writes.
    pub out_dtype: DType,
    /// Whether inputs take the direct cp.async path (dtype = weight dtype, width % 8 == 0).
    pub fast_input: bool,
    /// Extra NVRTC options to compile `source` with, after the runtime's fixed ones.
    pub nvrtc_options: Vec<String>,
    /// How `params` is laid out (read by the forms that share it).
    pub(crate) params_layout: ParamsLayout,
    /// The target `source` must be compiled for ([`WGMMA_ARCH`] when a layer uses wgmma), or
    /// `None` for the device's own.
    pub arch: Option<Arch>,
}

impl MlpKernel {
    /// The target to compile `source` for on a device whose compile target is `device`.
    pub fn target(&self, device: Arch) -> Arch {
        self.arch.unwrap_or(device)
    }
}

pub(crate) fn round_up(v: usize, m: usize) -> usize {
    v.div_ceil(m) * m
}

/// The templates' number for an I/O dtype (`KF_*_KIND`, `KG_*_KIND`): 0 f32, 1 f16, 2 bf16;
/// `None` for dtypes the kernels do not read or write. The one mapping of every emitter.
pub(crate) fn io_kind(dtype: DType) -> Option<u32> {
    match dtype {
        DType::F32 => Some(0),
        DType::F16 => Some(1),
        DType::BF16 => Some(2),
        _ => None,
    }
}

fn bits16(dtype: DType, v: f32) -> u16 {
    match dtype {
        DType::BF16 => bf16::from_f32(v).to_bits(),
        _ => f16::from_f32(v).to_bits(),
    }
}

/// Whether hidden SiLU layers take the packed f16 form (`h + h·tanh(h)` on f16 pairs).
pub(crate) fn packed_silu(model: &MlpModel, opts: &MlpKernelOptions) -> bool {
    matches!(opts.activation_math, ActivationMath::Packed | ActivationMath::PackedFma { .. })
        && model.dtype == DType::F16
}

/// Per layer, how the host prepares it: `halved` (hidden SiLU layers whose kernel form takes
/// `h = x/2` from the accumulators: weights and bias times ½) and `acc16` (hidden layers that
/// accumulate in f16, [`HiddenAccumulator::F16`], for activations with a packed f16 form; layers
/// with an FMA share keep f32).
pub(crate) fn hidden_forms(model: &MlpModel, opts: &MlpKernelOptions) -> (Vec<bool>, Vec<bool>) {
    let last = model.layers.len().saturating_sub(1);
    let packed_silu = packed_silu(model, opts);
    let half_silu = packed_silu || opts.activation_math == ActivationMath::TanhF32;
    let halved = model
        .layers
        .iter()
        .enumerate()
        .map(|(i, l)| i != last && half_silu && l.activation.kind() == ActivationKind::Silu)
        .collect();
    let acc16 = model
        .layers
        .iter()
        .enumerate()
        .map(|(i, l)| {
            opts.hidden_accumulator == HiddenAccumulator::F16
                && model.dtype == DType::F16
                && i != last
                && match l.activation.kind() {
                    ActivationKind::Identity | ActivationKind::Relu => true,
                    ActivationKind::Silu => {
                        packed_silu && !matches!(opts.activation_math, ActivationMath::PackedFma { eighths: 1.. })
                    }
                    _ => false,
                }
        })
        .collect();
    (halved, acc16)
}

/// Where one layer lives in the parameter blob.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LayerLayout {
    /// Padded input width (a multiple of 16).
    pub k_pad: usize,
    /// Padded output width (a multiple of 16; of 8 for the last layer).
    pub n_pad: usize,
    /// Byte offset of the weights (mma B-fragment order).
    pub w_off: usize,
    /// Byte offset of the bias (meaningful when the layer has one).
    pub b_off: usize,
}

/// How [`pack_params`] laid out a kernel's parameter blob: every choice that changes its bytes
/// for a given model, and each layer's offsets. Kept with the kernel ([`MlpKernel`]) so that
/// another form can read the same blob (the generic fast form does) without packing it again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ParamsLayout {
    /// Per layer: weights and bias times ½ (SiLU's `h = x/2`).
    pub halved: Vec<bool>,
    /// Per layer: f16 bias pairs for f16 accumulators.
    pub acc16: Vec<bool>,
    /// Per layer offsets and padded widths.
    pub layers: Vec<LayerLayout>,
}

/// Packs every layer's weights into mma B-fragment order and appends the f32 biases (per n8
/// tile and lane quad, the quad `{b[c], b[c+1], b[c], b[c+1]}`: one LDS.128 is the C operand of
/// the tile's first mma), or f16 ones for layers with `acc16[i]` (see mlp_layer_forms.cuh); layers
/// with `halved[i]` get weights and bias times ½ (SiLU's `h = x/2`, see [`ActivationMath::Packed`]).
pub(crate) fn pack_params(model: &MlpModel, halved: &[bool], acc16: &[bool]) -> (Vec<u8>, ParamsLayout) {
    let mut blob: Vec<u8> = Vec::new();
    let mut layouts = Vec::with_capacity(model.layers.len());
    let last = model.layers.len() - 1;
    for (li, layer) in model.layers.iter().enumerate() {
        let k_pad = round_up(layer.inputs, 16);
        let n_pad = if li == last { round_up(layer.outputs, 8) } else { round_up(layer.outputs, 16) };
        let w_off = blob.len();
        let scale = if halved.get(li).copied().unwrap_or(false) { 0.5f32 } else { 1.0 };
        let at = |n: usize, k: usize| -> u16 {
            if n < layer.outputs && k < layer.inputs {
                bits16(model.dtype, scale * layer.weight[n * layer.inputs + k])
            } else {
                0
            }
        };
        // The last layer: one n8 tile per 8-byte fragment; hidden layers: two n8 tiles (2j and
        // 2j + 1, i.e. one k16 chunk of the next layer's input) per 16 bytes (see mlp_prelude.cuh).
        let tiles_per_fetch = if li == last { 1 } else { 2 };
        for j in 0..n_pad / (8 * tiles_per_fetch) {
            for kk in 0..k_pad / 16 {
                for lane in 0..32 {
                    for t in 0..tiles_per_fetch {
                        let (n, k) = (8 * (tiles_per_fetch * j + t) + lane / 4, 16 * kk + 2 * (lane % 4));
                        for v in [at(n, k), at(n, k + 1), at(n, k + 8), at(n, k + 9)] {
                            blob.extend_from_slice(&v.to_le_bytes());
                        }
                    }
                }
            }
        }
        let b_off = blob.len();
        if let Some(b) = &layer.bias {
            let at = |i: usize| (scale * b.get(i).copied().unwrap_or(0.0)).to_le_bytes();
            let half = |i: usize| bits16(model.dtype, scale * b.get(i).copied().unwrap_or(0.0)).to_le_bytes();
            match acc16.get(li).copied().unwrap_or(false) {
                // Chunk j, lane quad q: {p(2j), p(2j), p(2j + 1), p(2j + 1)}, p(t) the f16 pair
                // of columns 8t + 2q, 8t + 2q + 1.
                true => {
                    for j in 0..n_pad / 16 {
                        for q in 0..4 {
                            for t in [2 * j, 2 * j, 2 * j + 1, 2 * j + 1] {
                                blob.extend_from_slice(&half(8 * t + 2 * q));
                                blob.extend_from_slice(&half(8 * t + 2 * q + 1));
                            }
                        }
                    }
                }
                // n8 tile t, lane quad q: {b[c], b[c+1], b[c], b[c+1]}, c = 8t + 2q.
                false => {
                    for c in (0..n_pad).step_by(2) {
                        for i in [c, c + 1, c, c + 1] {
                            blob.extend_from_slice(&at(i));
                        }
                    }
                }
            }
        }
        blob.resize(round_up(blob.len(), 16), 0);
        layouts.push(LayerLayout { k_pad, n_pad, w_off, b_off });
    }
    (blob, ParamsLayout { halved: halved.to_vec(), acc16: acc16.to_vec(), layers: layouts })
}

/// Registers one row tile needs for the fragments of its widest layer.
fn fragment_registers(layouts: &[LayerLayout]) -> usize {
    layouts.iter().map(|l| (l.k_pad + l.n_pad) / 4).max().unwrap_or(0)
}

/// Whether the model can run as one fused kernel (else the launcher takes the tiled path, [`crate::emit_tiled`]).
pub fn fusable(model: &MlpModel, opts: &MlpKernelOptions) -> bool {
    emit_kernel(model, opts).is_ok()
}

/// Generates the fused kernel for `model` with `opts`.
pub fn emit_kernel(model: &MlpModel, opts: &MlpKernelOptions) -> Result<MlpKernel> {
    let in_kind = io_kind(opts.in_dtype).ok_or(MlpError::InputDType { dtype: opts.in_dtype })?;
    let out_kind = io_kind(opts.out_dtype).ok_or(MlpError::OutputDType { dtype: opts.out_dtype })?;
    if model.layers.is_empty() {
        return Err(MlpError::TooLarge { what: "layers (an empty model)", value: 0, limit: 0 });
    }
    if let Some(w) = opts.warps.filter(|w| !(1..=16).contains(w)) {
        return Err(MlpError::TooLarge { what: "warps per block (1..=16)", value: u64::from(w), limit: 16 });
    }
    if let Some(r) = opts.row_tiles_per_warp.filter(|r| !(1..=8).contains(r)) {
        return Err(MlpError::TooLarge { what: "row tiles per warp (1..=8)", value: u64::from(r), limit: 8 });
    }
    // Hidden SiLU layers whose kernel form takes h = x/2 from the accumulators.
    let last = model.layers.len() - 1;
    if let ActivationMath::PackedFma { eighths } = opts.activation_math {
        if eighths > 8 {
            return Err(MlpError::TooLarge {
                what: "SiLU pairs on the FMA pipe, in eighths",
                value: u64::from(eighths),
                limit: 8,
            });
        }
    }
    let packed_silu = packed_silu(model, opts);
    let half_silu = packed_silu || opts.activation_math == ActivationMath::TanhF32;
    let (halved, acc16) = hidden_forms(model, opts);
    let (params, params_layout) = pack_params(model, &halved, &acc16);
    let layouts = params_layout.layers.clone();
    for (i, l) in layouts.iter().enumerate() {
        if l.k_pad + l.n_pad > MAX_FUSED_K_PLUS_N {
            return Err(MlpError::SharedMemory {
                what: format!(
                    "layer {i} ({}→{}): too wide to keep its activations in registers",
                    model.layers[i].inputs, model.layers[i].outputs
                ),
                needed: (l.k_pad + l.n_pad) as u64,
                limit: MAX_FUSED_K_PLUS_N as u64,
            });
        }
    }
    // Eighths of each hidden layer's packed SiLU pairs that take the FMA-pipe form.
    let fma_eighths: Vec<usize> = (0..layouts.len())
        .map(|i| match opts.activation_math {
            _ if !packed_silu || i == last || model.layers[i].activation.kind() != ActivationKind::Silu => 0,
            ActivationMath::PackedFma { eighths } => usize::from(eighths),
            _ => 0,
        })
        .map(|q| q.min(8))
        .collect();
    // Hidden layers on wgmma (see TensorInstructions::Wgmma).
    let wg: Vec<bool> = (0..model.layers.len())
        .map(|i| opts.tensor_instructions == TensorInstructions::Wgmma && i != last && !acc16[i])
        .collect();
    let any_wg = wg.contains(&true);
    if let Some(w) = opts.warps.filter(|w| any_wg && w % 4 != 0) {
        return Err(MlpError::KernelOption {
            message: format!("wgmma layers run on warpgroups: warps per block must be a multiple of 4, not {w}"),
        });
    }
    let in_w = model.input_width();
    let out_w = model.output_width();
    let in_bytes = opts.in_dtype.size_bytes();
    let out_bytes = opts.out_dtype.size_bytes();
    let in_pad = round_up(in_w, 16);
    let fast_input = opts.in_dtype == model.dtype && in_w.is_multiple_of(8);
    let row_stride = in_pad * 2 + 16;
    let per_tile = fragment_registers(&layouts).max(1);
    // Two row tiles per warp where the fragments allow: each B fragment then feeds 2 x 2 mmas,
    // enough to keep shared-memory traffic under the tensor cores' rate (one tile per warp is
    // measurably slower); more tiles only grow the unrolled code (compile time) without measured
    // gain.
    // With wgmma and an activation on the SFU (anything but ReLU and identity), one row tile per
    // warp and so up to 16 warps: four warpgroups per SM keep the SFU busier than two warpgroups
    // of the row form on the SiLU benchmark model, while the ReLU models are faster in the row
    // form.
    let sfu_hidden = model.layers[..last]
        .iter()
        .any(|l| !matches!(l.activation.kind(), ActivationKind::Relu | ActivationKind::Identity));
    let r_auto = if any_wg && sfu_hidden { 1 } else { (FRAGMENT_REGISTER_BUDGET / per_tile).clamp(1, 2) };
    let r_max = opts.row_tiles_per_warp.map(|r| r as usize).unwrap_or(r_auto);
    let param_bytes = params.len();
    let warp_smem = |r: usize| {
        let rows = 16 * r;
        let frag = rows * row_stride;
        let stage = if fast_input { frag } else { round_up(rows * in_w * in_bytes, 16) };
        let frag_extra = if fast_input { 0 } else { frag };
        let out_tile = round_up(rows * out_w * out_bytes, 16);
        (stage, frag_extra, out_tile, 2 * stage + frag_extra + out_tile)
    };
    let limit = opts.shared_limit as usize;
    let mut choice = None;
    'search: for r in (1..=r_max.max(1)).rev() {
        // Warps: as many as the register file holds at the estimated registers per thread
        // (fragments x 1.5 + 40, fitted to ptxas reports of the benchmark models), in multiples
        // of 4 (one per scheduler) above 8; 8 or fewer always qualify (255 registers each).
        let est_regs = r * per_tile * 3 / 2 + 40;
        let w_candidates: Vec<usize> = match opts.warps {
            Some(w) => vec![w as usize],
            None => [16usize, 12, 8, 7, 6, 5, 4, 3, 2, 1]
                .into_iter()
                .filter(|&w| (w <= 8 || 65536 / (32 * w) >= est_regs) && (!any_wg || w % 4 == 0))
                .collect(),
        };
        for w in w_candidates {
            if param_bytes + w * warp_smem(r).3 <= limit {
                choice = Some((r, w));
                break 'search;
            }
        }
    }
    let (r, warps) = choice.ok_or_else(|| MlpError::SharedMemory {
        what: format!("the weights of {} ({} bytes) plus one warp's tiles", model.summary(), param_bytes),
        needed: (param_bytes + warp_smem(1).3) as u64,
        limit: limit as u64,
    })?;
    let (stage, frag_extra, out_tile, per_warp) = warp_smem(r);
    let shared = param_bytes + warps * per_warp;
    let too_large = |what: &'static str, v: usize| MlpError::TooLarge { what, value: v as u64, limit: u32::MAX as u64 };
    let shared_bytes = u32::try_from(shared).map_err(|_| too_large("shared memory bytes", shared))?;

    let mut src = String::new();
    let acts: Vec<&str> = model.layers.iter().map(|l| l.activation.expression.as_str()).collect();
    let _ = writeln!(src, "// kfuse fused MLP kernel, generated by kfuse-mlp: do not edit.");
    let _ = writeln!(src, "// model: {}", model.summary());
    for (i, a) in acts.iter().enumerate() {
        let _ = writeln!(src, "// layer {i} activation: {}", a.replace('\n', " "));
    }
    let _ = writeln!(
        src,
        "// input {} [rows, {in_w}], output {} [rows, {out_w}]; {warps} warps x {r} row tiles of 16",
        opts.in_dtype, opts.out_dtype
    );
    let _ = writeln!(src, "#define KF_KERNEL_NAME KF_NAME_PLACEHOLDER");
    let defs: [(&str, usize); 23] = [
        ("KF_COMPUTE_BF16", usize::from(model.dtype == DType::BF16)),
        ("KF_WARPS", warps),
        ("KF_THREADS", 32 * warps),
        ("KF_R", r),
        ("KF_WARP_ROWS", 16 * r),
        ("KF_IN", in_w),
        ("KF_IN_PAD", in_pad),
        ("KF_KT0", in_pad / 16),
        ("KF_IN_BYTES", in_bytes),
        ("KF_IN_KIND", in_kind as usize),
        ("KF_OUT", out_w),
        ("KF_OUT_BYTES", out_bytes),
        ("KF_OUT_KIND", out_kind as usize),
        ("KF_FAST_INPUT", usize::from(fast_input)),
        ("KF_ROW_STRIDE", row_stride),
        ("KF_STAGE_BYTES", stage),
        ("KF_FRAG_BYTES", frag_extra),
        ("KF_OUT_TILE_BYTES", out_tile),
        ("KF_WARP_SMEM", per_warp),
        ("KF_PARAM_BYTES", param_bytes),
        ("KF_LAYERS", model.layers.len()),
        // Biases are always quads; the templates keep their column-order branch (`#else`),
        // since their text is part of every generated kernel's bytes.
        ("KF_BIAS_QUADS", 1),
        ("KF_WGMMA", usize::from(any_wg)),
    ];
    for (name, value) in defs {
        let _ = writeln!(src, "#define {name} {value}");
    }
    src.push('\n');
    src.push_str(FAST_MATH);
    // The KfAct structs use the prelude's helpers, so they go after it.
    let mut act_structs = String::new();
    for (i, layer) in model.layers.iter().enumerate() {
        // Hidden layers get `pack(lo, hi)` (activation + conversion to a compute-dtype pair),
        // the last layer `apply(x)` (its f32 result is converted to the output dtype later).
        let kind = layer.activation.kind();
        let generic = matches!(kind, ActivationKind::Expression) || (i == last && kind == ActivationKind::Relu);
        if generic {
            let f = layer.activation.device_function(i, &format!("kf_act_{i}"))?;
            src.push_str(f.trim_end());
            src.push('\n');
        }
        let body = match (i == last, kind) {
            (false, ActivationKind::Identity) => "kf_pack2(lo, hi)".to_string(),
            (false, ActivationKind::Relu) => "kf_pack2_relu(lo, hi)".to_string(),
            (false, ActivationKind::Silu) if packed_silu => "kf_silu_half_f16x2(lo, hi)".to_string(),
            (false, ActivationKind::Silu) if half_silu => {
                "kf_pack2(kf_silu_half_f32(lo), kf_silu_half_f32(hi))".to_string()
            }
            (false, ActivationKind::Silu) => "kf_pack2(kf_silu_f32(lo), kf_silu_f32(hi))".to_string(),
            (false, _) => format!("kf_pack2(kf_act_{i}(lo), kf_act_{i}(hi))"),
            (true, ActivationKind::Identity) => "x".to_string(),
            (true, ActivationKind::Silu) => "kf_silu_f32(x)".to_string(),
            (true, _) => format!("kf_act_{i}(x)"),
        };
        // f16-accumulating layers: `pack16` on the f16 pair (mlp_layer_forms.cuh).
        let pack16 = match kind {
            _ if !acc16[i] => "",
            ActivationKind::Relu => {
                "\n    static __device__ __forceinline__ unsigned pack16(unsigned h) { return kf_relu_h2(h); }"
            }
            ActivationKind::Silu => {
                "\n    static __device__ __forceinline__ unsigned pack16(unsigned h) { return kf_silu_half_h2(h); }"
            }
            _ => "\n    static __device__ __forceinline__ unsigned pack16(unsigned h) { return h; }",
        };
        if i == last {
            let _ = writeln!(
                act_structs,
                "struct KfAct{i} {{ static __device__ __forceinline__ float apply(float x) {{ return {body}; }} }};"
            );
        } else if !pack16.is_empty() {
            let _ = writeln!(act_structs, "struct KfAct{i} {{ static __device__ __forceinline__ unsigned pack(float lo, float hi) {{ return {body}; }}{pack16} }};");
        } else if fma_eighths[i] > 0 {
            let _ = writeln!(
                act_structs,
                "struct KfAct{i} {{ static __device__ __forceinline__ unsigned pack(float lo, float hi) {{ return {body}; }}\n    static __device__ __forceinline__ unsigned pack_fma(float lo, float hi) {{ return kf_silu_half_f16x2_fma(lo, hi); }} }};"
            );
        } else {
            let _ = writeln!(act_structs, "struct KfAct{i} {{ static __device__ __forceinline__ unsigned pack(float lo, float hi) {{ return {body}; }} }};");
        }
    }
    src.push('\n');
    src.push_str(PRELUDE);
    src.push('\n');
    // Hidden layers in another chunk order (unrolled, f32 accumulators).
    let reordered = |i: usize| opts.chunk_order != ChunkOrder::Sequential && i != last && !acc16[i];
    if acc16.iter().any(|&a| a) || (0..last).any(reordered) {
        src.push_str(LAYER_FORMS);
        src.push('\n');
    }
    if any_wg {
        src.push_str(WGMMA_FORMS);
        src.push('\n');
    }
    src.push_str(&act_structs);
    src.push('\n');
    // The wgmma layers; the row form when every hidden layer takes wgmma, the warp has two row
    // tiles and the accumulators in flight fit (see wgmma.rs and ROW_FORM_REGISTERS).
    let wg_layers: Vec<WgLayer> = (0..last)
        .filter(|&i| wg[i])
        .map(|i| {
            let l = &layouts[i];
            let has_bias = model.layers[i].bias.is_some();
            WgLayer {
                index: i,
                kt: l.k_pad / 16,
                nt16: l.n_pad / 16,
                w_off: l.w_off,
                b_off: if has_bias { l.b_off } else { 0 },
                n_real: model.layers[i].outputs,
                has_bias,
                fma_eighths: fma_eighths[i],
            }
        })
        .collect();
    let row_form = any_wg
        && r == 2
        && wg_layers.len() == last
        && wg_layers
            .iter()
            .enumerate()
            .all(|(n, l)| 16 * l.nt16 + wg_layers.get(n + 1).map_or(0, |x| 8 * x.nt16) <= ROW_FORM_REGISTERS);
    if any_wg {
        src.push_str(&wgmma::stage_function(&wg_layers));
    }
    if row_form {
        let mut widths: Vec<usize> = wg_layers.iter().map(|l| 16 * l.nt16).collect();
        widths.sort_unstable();
        widths.dedup();
        src.push_str(&wgmma::instructions(&widths));
        src.push('\n');
    }
    // The generated layer chain.
    let _ = writeln!(src, "// The layers in order; h<i> holds layer i's input fragments.");
    let _ = writeln!(src, "__device__ __forceinline__ void kf_forward(const unsigned (&h0)[KF_R][KF_KT0][4], unsigned char* __restrict__ out_tile,");
    let _ = writeln!(
        src,
        "                                           const unsigned char* __restrict__ smem, int lane) {{"
    );
    if any_wg {
        let _ = writeln!(src, "    const unsigned long long kf_desc0 = kf_wg_desc(kf_smem_addr(smem));  // wgmma B operands: smem + offset");
    }
    // Hidden layer j continues layer i's run when it is square like i, identical to it, and its
    // parameters sit one stride further (a loop then addresses them as W_OFF + l * STRIDE).
    let same = |i: usize, j: usize| {
        let (a, b) = (&model.layers[i], &model.layers[j]);
        let (la, lb) = (&layouts[i], &layouts[j]);
        j < last
            && a.inputs == a.outputs
            && la.k_pad == la.n_pad
            && (a.inputs, a.outputs) == (b.inputs, b.outputs)
            && a.bias.is_some() == b.bias.is_some()
            && a.activation.expression == b.activation.expression
            && halved[i] == halved[j]
            && fma_eighths[i] == fma_eighths[j]
            && acc16[i] == acc16[j]
            && !wg[i]
            && lb.w_off - la.w_off == (j - i) * (layouts[i + 1].w_off - la.w_off)
            && lb.b_off - lb.w_off == la.b_off - la.w_off
    };
    let mut skip_to = 0;
    if row_form {
        src.push_str(&wgmma::row_form_chain(&wg_layers));
        skip_to = last;
    }
    for (i, (layer, l)) in model.layers.iter().zip(&layouts).enumerate() {
        if i < skip_to {
            continue;
        }
        let has_bias = usize::from(layer.bias.is_some());
        // The FMA share as the templates' last argument, only where it is not 0 (their default).
        let q = if fma_eighths[i] > 0 { format!(", {}", fma_eighths[i]) } else { String::new() };
        let run = if opts.repeated_layers == RepeatedLayers::Loop && i != last {
            (i + 1..last).take_while(|&j| same(i, j)).count() + 1
        } else {
            1
        };
        if run >= 2 {
            let kt = l.k_pad / 16;
            let stride = layouts[i + 1].w_off - l.w_off;
            let b_rel = if has_bias == 1 { l.b_off - l.w_off } else { 0 };
            let _ = writeln!(src, "    unsigned h{}[KF_R][{kt}][4];", i + run);
            let _ = writeln!(src, "    kf_copy_frags<{kt}>(h{i}, h{});", i + run);
            let _ = writeln!(
                src,
                "    kf_hidden_loop{}<{kt}, {run}, {}, {stride}, {b_rel}, {}, {has_bias}, KfAct{i}{q}>(h{}, smem, lane);  // layers {i}..={}",
                if acc16[i] { "_h" } else { "" },
                l.w_off,
                layer.outputs,
                i + run,
                i + run - 1
            );
            skip_to = i + run;
            continue;
        }
        let kt = l.k_pad / 16;
        let off = |o: usize| if has_bias == 1 || o != l.b_off { o } else { 0 };
        if i == last {
            let _ = writeln!(
                src,
                "    kf_output_layer<{kt}, {}, {}, {}, {has_bias}, KfAct{i}>(h{i}, out_tile, smem, lane);",
                l.n_pad / 8,
                l.w_off,
                off(l.b_off)
            );
        } else {
            let nt16 = l.n_pad / 16;
            let _ = writeln!(src, "    unsigned h{}[KF_R][{nt16}][4];", i + 1);
            if wg[i] {
                let _ = writeln!(
                    src,
                    "    kf_hidden_layer_wg<{kt}, {nt16}, {}, {}, {}, {has_bias}, KfAct{i}{q}>(h{i}, h{}, smem, kf_desc0, lane);",
                    l.w_off,
                    off(l.b_off),
                    layer.outputs,
                    i + 1
                );
                continue;
            }
            let form = if acc16[i] {
                "_h"
            } else if reordered(i) {
                "_p"
            } else {
                ""
            };
            let _ = writeln!(
                src,
                "    kf_hidden_layer{form}<{kt}, {nt16}, {}, {}, {}, {has_bias}, KfAct{i}{q}>(h{i}, h{}, smem, lane);",
                l.w_off,
                off(l.b_off),
                layer.outputs,
                i + 1
            );
        }
    }
    let _ = writeln!(src, "}}\n");
    src.push_str(KERNEL);
    let hash = blake3::hash(src.as_bytes()).to_hex();
    let name = format!("kf_mlp_{}", &hash.as_str()[..16]);
    let source = src.replace("KF_NAME_PLACEHOLDER", &name);
    let block = u32::try_from(32 * warps).map_err(|_| too_large("threads", 32 * warps))?;
    let rows_per_warp = u32::try_from(16 * r).map_err(|_| too_large("rows per warp", 16 * r))?;
    Ok(MlpKernel {
        name,
        source,
        block,
        shared_bytes,
        warps: block / 32,
        row_tiles_per_warp: rows_per_warp / 16,
        rows_per_warp,
        rows_per_block: rows_per_warp * (block / 32),
        params,
        in_dtype: opts.in_dtype,
        out_dtype: opts.out_dtype,
        fast_input,
        nvrtc_options: FAST_MATH_OPTIONS
            .iter()
            .map(|o| o.to_string())
            .chain(match opts.compile_effort {
                CompileEffort::Full => None,
                CompileEffort::Fast => Some("--Ofast-compile=mid".to_string()),
            })
            .collect(),
        // wgmma needs the arch-specific target.
        arch: any_wg.then_some(WGMMA_ARCH),
        params_layout,
    })
}

#[cfg(test)]
mod tests {
    //! Host transcription of `kf_silu_half_f16x2_fma` (mlp_prelude.cuh), op for op on one f16
    //! half, with the constants read from the prelude's `#define KF_SF_*` lines; checked against
    //! silu in f64 on every finite f16 input.

    use half::f16;

    use super::PRELUDE;

    /// The 32-bit constant `KF_SF_<name>` defined in the prelude.
    fn constant32(name: &str) -> u32 {
        let key = format!("#define KF_SF_{name} 0x");
        let line =
            PRELUDE.lines().find(|l| l.starts_with(&key)).unwrap_or_else(|| panic!("no {key} in mlp_prelude.cuh"));
        let hex: String = line[key.len()..].chars().take_while(char::is_ascii_hexdigit).collect();
        u32::from_str_radix(&hex, 16).unwrap_or_else(|e| panic!("{line}: {e}"))
    }

    /// The f16 of the pair constant `KF_SF_<name>` (both halves equal).
    fn constant(name: &str) -> f16 {
        let v = constant32(name);
        assert_eq!(v >> 16, v & 0xffff, "KF_SF_{name}: both halves must be equal");
        f16::from_bits((v & 0xffff) as u16)
    }

    /// `fma.rn.f16`: the exact product (22 bits) plus c in f64, rounded once more to f16.
    fn fma(a: f16, b: f16, c: f16) -> f16 {
        f16::from_f64(a.to_f64() * b.to_f64() + c.to_f64())
    }

    /// One half of kf_silu_half_f16x2_fma for the f16 value `h` (= x/2), as the GPU computes it;
    /// `k` gives the prelude's constants.
    fn silu_half_fma(h: f16, k: &impl Fn(&str) -> f16, exp_bias: u32) -> f16 {
        let a = f16::from_bits(h.to_bits() & 0x7fff);
        let a = if a.to_f64() < k("AMAX").to_f64() { a } else { k("AMAX") }; // min.f16x2
        let r = fma(a, k("NEG_K"), k("MAGIC"));
        let nf = f16::from_f64(k("MAGIC").to_f64() - r.to_f64());
        let f = fma(a, k("NEG_K"), nf);
        let p = fma(fma(f, k("C2"), k("C1")), f, k("ONE"));
        // The kernel's 32-bit integer step on the pair (h, h): both halves must give the same E.
        let pair = |v: f16| u32::from(v.to_bits()) * 0x1_0001;
        let e32 = pair(p).wrapping_add(pair(r) << 10).wrapping_sub(exp_bias);
        assert_eq!(e32 >> 16, e32 & 0xffff, "h = {h}: the halves of 2^n * 2^f differ");
        let e = f16::from_bits((e32 & 0xffff) as u16);
        let t = fma(fma(fma(fma(k("D4"), e, k("D3")), e, k("D2")), e, k("D1")), e, k("ONE"));
        let t = f16::from_bits((t.to_bits() & 0x7fff) | (h.to_bits() & 0x8000));
        fma(h, t, h)
    }

    #[test]
    fn fma_share_reaches_the_layer_templates() {
        use crate::testing::{write_model, ModelSpec};
        use crate::{emit_kernel, ActivationMath, MlpKernelOptions, MlpModel};
        let dir = tempfile::tempdir().expect("tempdir");
        let spec = ModelSpec::new(&[32, 64, 128, 96, 64, 32, 16], "silu");
        let model = MlpModel::load(write_model(dir.path(), "silu", &spec).expect("write")).expect("load");
        let with =
            |math| emit_kernel(&model, &MlpKernelOptions { activation_math: math, ..MlpKernelOptions::default() });
        let packed = with(ActivationMath::Packed).expect("packed");
        assert_eq!(with(ActivationMath::PackedFma { eighths: 0 }).expect("fma0"), packed);
        assert!(!packed.source.contains("return kf_silu_half_f16x2_fma(lo, hi);"));
        assert_eq!(with(ActivationMath::PackedFma { eighths: 3 }).expect("fma3").source.matches(", 3>(h").count(), 5);
        let err = with(ActivationMath::PackedFma { eighths: 9 }).expect_err("9 eighths");
        assert!(err.to_string().contains("eighths"), "{err}");
    }

    fn silu(x: f64) -> f64 {
        x / (1.0 + (-x).exp())
    }

    #[test]
    fn exponent_constants_match_their_derivation() {
        // r = 1039 + n has bits 0x6400 + n + 15; << 10 leaves 0x6400 >> 6 in the high half.
        assert_eq!(constant32("EXP_BIAS"), ((15 << 10) | (0x6400 >> 6)) << 16 | 15 << 10);
        assert_eq!(constant("MAGIC").to_f64(), 1039.0);
        assert_eq!(constant("MAGIC").to_bits(), 0x6400 + 15);
    }

    /// The packed MUFU form with an exactly rounded tanh (a lower bound on its error).
    fn silu_half_rounded_tanh(h: f16) -> f16 {
        fma(h, f16::from_f64(h.to_f64().tanh()), h)
    }

    /// (worst error / max(|silu|, 1), at h; mean and rms error for h ~ N(0, 1)) of `form` over
    /// every finite f16 h with |h| <= 16384 (above 32752 the result 2h overflows f16 in every form).
    fn errors(form: impl Fn(f16) -> f16) -> (f64, f64, f64, f64) {
        let (mut worst, mut worst_h) = (0.0f64, 0.0f64);
        let (mut sum, mut sum2, mut weight) = (0.0f64, 0.0f64, 0.0f64);
        for bits in 0..=u16::MAX {
            let h = f16::from_bits(bits);
            if !h.is_finite() || h.to_f64().abs() > 16384.0 {
                continue;
            }
            let got = form(h).to_f64();
            let want = silu(2.0 * h.to_f64());
            let err = got - want;
            let scaled = err.abs() / want.abs().max(1.0);
            if scaled > worst {
                (worst, worst_h) = (scaled, h.to_f64());
            }
            // Mean and rms for h ~ N(0, 1): each f16 value weighted by density times spacing.
            let x = h.to_f64();
            if x.abs() <= 4.0 && x != 0.0 {
                let spacing = f16::from_bits(bits + 1).to_f64() - x;
                let w = (-x * x / 2.0).exp() * spacing.abs();
                (sum, sum2, weight) = (sum + w * err, sum2 + w * err * err, weight + w);
            }
        }
        (worst, worst_h, sum / weight, (sum2 / weight).sqrt())
    }

    #[test]
    fn fma_silu_matches_f64_on_every_f16_input() {
        let names = ["AMAX", "NEG_K", "MAGIC", "ONE", "C1", "C2", "D1", "D2", "D3", "D4"];
        let table: Vec<(&str, f16)> = names.iter().map(|&n| (n, constant(n))).collect();
        let k = |n: &str| table.iter().find(|(m, _)| *m == n).map(|p| p.1).unwrap_or_else(|| panic!("constant {n}"));
        let exp_bias = constant32("EXP_BIAS");
        let (worst, worst_h, mean, rms) = errors(|h| silu_half_fma(h, &k, exp_bias));
        let (ref_worst, _, ref_mean, ref_rms) = errors(silu_half_rounded_tanh);
        println!("FMA form: worst error / max(|silu|, 1) {worst:.2e} at h = {worst_h}; h ~ N(0,1): mean {mean:+.2e}, rms {rms:.2e}");
        println!("exactly rounded tanh: worst {ref_worst:.2e}; mean {ref_mean:+.2e}, rms {ref_rms:.2e}");
        assert!(worst <= 1.5e-3, "worst {worst:.3e} at h = {worst_h}");
        assert!(
            rms <= 1.5 * ref_rms && mean.abs() <= 1e-4,
            "mean {mean:.3e}, rms {rms:.3e} (rounded tanh: {ref_rms:.3e})"
        );
    }
}
