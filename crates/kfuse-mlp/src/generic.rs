//! The generic fast form of tiered compilation (issue 5): one MLP kernel whose code depends only
//! on the weight dtype, the I/O dtypes and the set of activation functions, not on the widths or
//! the depth. Layers, n8 output tiles and k16 input steps are run-time loops
//! (`mlp_generic.cuh`) driven by a small layer table in constant memory, so NVRTC compiles about
//! the same, small amount of code for every model (a first call's compile, see `tier.rs`). It
//! reads the optimised kernel's parameter blob unchanged: [`emit_generic`] takes the layer layout
//! from kernel.rs's own packer (`pack_params`) and refuses ([`GenericRefusal::Layout`]) when
//! hidden layers take f16 biases (`HiddenAccumulator::F16`, a layout this kernel does not read)
//! or when `full` was not packed with these options.
//!
//! Handles: any depth, widths 1..=256 whose weights fit in shared memory next to one warp's two
//! 16-row activation buffers, f16/bf16 weights, f32/f16/bf16 I/O, both bias forms
//! ([`BiasOperand`]), every activation (ReLU, SiLU in the optimised kernel's forms, other
//! expressions as `__noinline__` calls of kfuse-codegen's device functions). Does not handle:
//! speed (expected several times slower than the optimised kernel, not yet measured on a GPU:
//! one 16-row tile and one n8 tile per warp at a time, activations through shared memory, no
//! pipelining of input loads), the FMA-pipe SiLU share (`ActivationMath::PackedFma*`
//! models run the MUFU form here, within the same tolerance). Pure: no GPU, no I/O; deterministic.

use std::fmt::Write;

use kfuse_ir::DType;

use crate::activation::ActivationKind;
use crate::error::MlpError;
use crate::kernel::{hidden_forms, io_kind, round_up, ActivationMath, BiasOperand, MlpKernel, MlpKernelOptions};
use crate::model::MlpModel;

const GENERIC: &str = include_str!("mlp_generic.cuh");

/// Fast math for expression activations, as the optimised kernel compiles them (kernel.rs's
/// `FAST_MATH`): approximate MUFU intrinsics, values are rounded to f16/bf16 between layers.
const FAST_MATH: &str = "// Activations use fast approximate math (as the optimised kernel's, see kfuse-mlp kernel.rs).
__device__ __forceinline__ float kg_tanh_approx(float x) { float y; asm(\"tanh.approx.f32 %0, %1;\" : \"=f\"(y) : \"f\"(x)); return y; }
#define expf __expf
#define logf __logf
#define sinf __sinf
#define cosf __cosf
#define tanhf kg_tanh_approx
";

/// Warps per block at most (the template's `__launch_bounds__(512, 1)`).
const MAX_WARPS: usize = 16;

/// Why [`emit_generic`] gives no kernel (the caller then uses another fast form).
#[derive(Debug, thiserror::Error)]
pub enum GenericRefusal {
    /// The optimised kernel's parameter blob is not laid out as this module expects (its layout
    /// changed, or options this module does not know).
    #[error("the optimised kernel's parameter blob is not in the layout the generic kernel reads")]
    Layout,
    /// The weights plus one warp's buffers exceed the shared-memory limit.
    #[error("the generic kernel needs {needed} bytes of shared memory with one warp, over the limit")]
    SharedMemory {
        /// Bytes one block would need with one warp.
        needed: usize,
    },
    /// The model or an activation could not be emitted.
    #[error(transparent)]
    Emit(#[from] MlpError),
}

/// One layer as the generic kernel's table describes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct TableLayer {
    kt: usize,
    nt8: usize,
    gs: usize,
    w_off: usize,
    b_off: Option<usize>,
    n_real: usize,
    act: usize,
}

/// The kernel's code for each layer's activation: `(hidden pack body, last-layer body)`, with
/// expression activations named by their index in `exprs` (filled here, first use first).
fn activation_body(model: &MlpModel, opts: &MlpKernelOptions, li: usize, exprs: &mut Vec<String>) -> String {
    let layer = &model.layers[li];
    let last = li + 1 == model.layers.len();
    let packed_silu = matches!(
        opts.activation_math,
        ActivationMath::Packed | ActivationMath::PackedFma { .. } | ActivationMath::PackedFmaBalanced
    ) && model.dtype == DType::F16;
    let expr = |exprs: &mut Vec<String>| {
        let e = &layer.activation.expression;
        let n = exprs.iter().position(|x| x == e).unwrap_or_else(|| {
            exprs.push(e.clone());
            exprs.len() - 1
        });
        format!("kg_act_{n}")
    };
    match (last, layer.activation.kind()) {
        (false, ActivationKind::Identity) => "kg_pack2(lo, hi)".to_string(),
        (false, ActivationKind::Relu) => "kg_pack2_relu(lo, hi)".to_string(),
        (false, ActivationKind::Silu) if packed_silu => "kg_silu_half_f16x2(lo, hi)".to_string(),
        (false, ActivationKind::Silu) if opts.activation_math == ActivationMath::TanhF32 => {
            "kg_pack2(kg_silu_half_f32(lo), kg_silu_half_f32(hi))".to_string()
        }
        (false, ActivationKind::Silu) => "kg_pack2(kg_silu_f32(lo), kg_silu_f32(hi))".to_string(),
        (false, ActivationKind::Expression) => {
            let f = expr(exprs);
            format!("kg_pack2({f}(lo), {f}(hi))")
        }
        (true, ActivationKind::Identity) => "x".to_string(),
        (true, ActivationKind::Silu) => "kg_silu_f32(x)".to_string(),
        // The last layer's ReLU is the expression's device function, as in the optimised kernel.
        (true, ActivationKind::Relu | ActivationKind::Expression) => format!("{}(x)", expr(exprs)),
    }
}

/// A `switch` over the activation bodies (one return without a switch when there is one).
fn dispatcher(out: &mut String, signature: &str, bodies: &[String], fallback: &str) {
    let _ = writeln!(out, "__device__ __forceinline__ {signature} {{");
    match bodies {
        [] => {
            let _ = writeln!(out, "    (void)id;\n    return {fallback};");
        }
        [only] => {
            let _ = writeln!(out, "    (void)id;\n    return {only};");
        }
        [rest @ .., final_body] => {
            let _ = writeln!(out, "    switch (id) {{");
            for (i, b) in rest.iter().enumerate() {
                let _ = writeln!(out, "    case {i}: return {b};");
            }
            let _ = writeln!(out, "    default: return {final_body};\n    }}");
        }
    }
    let _ = writeln!(out, "}}");
}

/// The generic fast form of `full` (the optimised kernel emitted from `model` and `opts`): the
/// same parameter blob, I/O dtypes and NVRTC options plus `--Ofast-compile=mid`; one 16-row tile
/// per warp, up to 16 warps per block as shared memory allows.
pub fn emit_generic(
    model: &MlpModel,
    opts: &MlpKernelOptions,
    full: &MlpKernel,
) -> std::result::Result<MlpKernel, GenericRefusal> {
    let in_kind = io_kind(opts.in_dtype).ok_or(MlpError::InputDType { dtype: opts.in_dtype })? as usize;
    let out_kind = io_kind(opts.out_dtype).ok_or(MlpError::OutputDType { dtype: opts.out_dtype })? as usize;
    if model.layers.is_empty() || (full.in_dtype, full.out_dtype) != (opts.in_dtype, opts.out_dtype) {
        return Err(GenericRefusal::Layout);
    }
    // The optimised kernel's blob, read through its layout (mma B-fragment order, hidden layers
    // with two n8 tiles per 16-byte fetch, f32 biases in its bias layout): the halved SiLU layers
    // must be those this kernel's activations expect; f16 biases are not read here.
    let layout = &full.params_layout;
    let (halved, _) = hidden_forms(model, opts);
    if layout.acc16.contains(&true) || layout.halved != halved || layout.layers.len() != model.layers.len() {
        return Err(GenericRefusal::Layout);
    }
    let params = full.params.clone();
    let layouts = &layout.layers;
    let last = model.layers.len() - 1;
    let mut table: Vec<TableLayer> = layouts
        .iter()
        .zip(&model.layers)
        .enumerate()
        .map(|(li, (l, layer))| TableLayer {
            kt: l.k_pad / 16,
            nt8: l.n_pad / 8,
            gs: usize::from(li != last),
            w_off: l.w_off,
            b_off: layer.bias.as_ref().map(|_| l.b_off),
            n_real: layer.outputs,
            act: 0,
        })
        .collect();
    let mut exprs: Vec<String> = Vec::new();
    let (mut hidden, mut last_bodies): (Vec<String>, Vec<String>) = (Vec::new(), Vec::new());
    let depth = model.layers.len();
    for (li, entry) in table.iter_mut().enumerate() {
        let body = activation_body(model, opts, li, &mut exprs);
        let list = if li + 1 == depth { &mut last_bodies } else { &mut hidden };
        entry.act = list.iter().position(|b| *b == body).unwrap_or_else(|| {
            list.push(body);
            list.len() - 1
        });
    }
    // Shared memory: the blob, then per warp two 16-row buffers of the widest padded input.
    let widest = table.iter().map(|t| 16 * t.kt).max().unwrap_or(16);
    let stride = 2 * widest + 16;
    let warp_smem = 2 * 16 * stride;
    let limit = opts.shared_limit as usize;
    let warps = (1..=MAX_WARPS)
        .rev()
        .find(|w| params.len() + w * warp_smem <= limit)
        .ok_or(GenericRefusal::SharedMemory { needed: params.len() + warp_smem })?;
    let shared = params.len() + warps * warp_smem;
    let too_large = |what: &'static str, v: usize| {
        GenericRefusal::Emit(MlpError::TooLarge { what, value: v as u64, limit: i32::MAX as u64 })
    };
    let int = |v: usize, what: &'static str| i32::try_from(v).map_err(|_| too_large(what, v));
    let mut values: Vec<i32> = vec![
        int(depth, "layers")?,
        int(params.len() / 16, "parameter bytes")?,
        int(model.input_width(), "input width")?,
        int(round_up(model.input_width(), 16) / 2, "input width")?,
        int(model.output_width(), "output width")?,
        int(stride, "buffer stride")?,
        int(warp_smem, "shared bytes per warp")?,
        0,
    ];
    let bias_mult = match layout.bias {
        BiasOperand::Pairs => 1,
        BiasOperand::Quads => 2,
    };
    for t in &table {
        let b_off = match t.b_off {
            Some(b) => int(b, "bias offset")?,
            None => -1,
        };
        values.extend([
            int(t.kt, "k chunks")?,
            int(t.nt8, "n tiles")?,
            int(t.gs, "fetch")?,
            int(t.w_off, "weight offset")?,
            b_off,
            bias_mult,
            int(t.n_real, "width")?,
            int(t.act, "activation")?,
        ]);
    }

    let mut src = String::new();
    let _ = writeln!(
        src,
        "// kfuse generic MLP kernel (tiered compilation's fast form), generated by kfuse-mlp: do not edit."
    );
    let _ = writeln!(src, "// model: {}", model.summary());
    let _ = writeln!(
        src,
        "// input {} [rows, {}], output {} [rows, {}]; {warps} warps x 16 rows",
        opts.in_dtype,
        model.input_width(),
        opts.out_dtype,
        model.output_width()
    );
    let _ = writeln!(src, "#define KG_NAME KG_NAME_PLACEHOLDER");
    let defs = [
        ("KG_COMPUTE_BF16", usize::from(model.dtype == DType::BF16)),
        ("KG_IN_KIND", in_kind),
        ("KG_IN_BYTES", opts.in_dtype.size_bytes()),
        ("KG_OUT_KIND", out_kind),
        ("KG_OUT_BYTES", opts.out_dtype.size_bytes()),
    ];
    for (name, value) in defs {
        let _ = writeln!(src, "#define {name} {value}");
    }
    let _ = writeln!(
        src,
        "// The layer table (mlp_generic.cuh: header; per layer kt, nt8, gs, w_off, b_off, b_mult, n_real, act)."
    );
    let rows: Vec<String> =
        values.chunks(8).map(|c| c.iter().map(i32::to_string).collect::<Vec<_>>().join(", ")).collect();
    let _ = writeln!(src, "__constant__ int kg_table[{}] = {{\n    {}\n}};", values.len(), rows.join(",\n    "));
    src.push_str(FAST_MATH);
    for (n, e) in exprs.iter().enumerate() {
        let layer = model.layers.iter().position(|l| l.activation.expression == *e).unwrap_or(0);
        let f = model.layers[layer].activation.device_function(layer, &format!("kg_expr_{n}"))?;
        src.push_str(f.trim_end());
        // One out-of-line copy however many call sites: the kernel's code stays small.
        let _ = writeln!(src, "\n__device__ __noinline__ float kg_act_{n}(float x) {{ return kg_expr_{n}(x); }}");
    }
    src.push('\n');
    // The dispatchers use kg_pack2 etc. from the template; declare them first.
    let mut dispatch = String::new();
    dispatcher(&mut dispatch, "unsigned kg_hidden_act(int id, float lo, float hi)", &hidden, "kg_pack2(lo, hi)");
    dispatcher(&mut dispatch, "float kg_last_act(int id, float x)", &last_bodies, "x");
    let (helpers, layers) = GENERIC.split_once("// KG_DISPATCH\n").ok_or(GenericRefusal::Layout)?;
    src.push_str(helpers);
    src.push_str(&dispatch);
    src.push('\n');
    src.push_str(layers);
    let hash = blake3::hash(src.as_bytes()).to_hex();
    let name = format!("kf_mlp_generic_{}", &hash.as_str()[..16]);
    let source = src.replace("KG_NAME_PLACEHOLDER", &name);
    let block = u32::try_from(32 * warps).map_err(|_| too_large("threads", 32 * warps))?;
    let shared_bytes = u32::try_from(shared).map_err(|_| too_large("shared memory bytes", shared))?;
    let mut nvrtc_options: Vec<String> =
        full.nvrtc_options.iter().filter(|o| !o.starts_with("--Ofast-compile")).cloned().collect();
    nvrtc_options.push("--Ofast-compile=mid".to_string());
    Ok(MlpKernel {
        name,
        source,
        block,
        shared_bytes,
        warps: block / 32,
        row_tiles_per_warp: 1,
        rows_per_warp: 16,
        rows_per_block: 16 * (block / 32),
        params,
        in_dtype: opts.in_dtype,
        out_dtype: opts.out_dtype,
        fast_input: false,
        nvrtc_options,
        // The same target as the kernel it stands in for.
        arch: full.arch,
        params_layout: full.params_layout.clone(),
    })
}
