//! CUDA C++ spelling: value and pointer types per dtype, literals, vector access widths, and the
//! header-free helper functions (f16/bf16 conversion through inline PTX, NaN-propagating min/max,
//! block reductions). Each helper is wrapped in its own `#ifndef` guard so that several generated
//! fragments (e.g. MLP activations) can share one translation unit.
//!
//! Not handled here: what to compute (see `emit`).

use kfuse_ir::{DType, Kind, Literal};

use crate::text::render;

/// The C type a value of `dtype` is computed in.
pub(crate) fn value_type(dtype: DType) -> &'static str {
    match dtype.kind() {
        Kind::Float => "float",
        Kind::Int if dtype == DType::I64 => "long long",
        Kind::Int => "int",
        Kind::Bool => "bool",
    }
}

/// The C element type of a buffer of `dtype`.
pub(crate) fn storage_type(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "float",
        DType::F16 | DType::BF16 => "unsigned short",
        DType::I32 => "int",
        DType::I64 => "long long",
        DType::Bool => "unsigned char",
    }
}

/// A literal in the C type of `dtype`'s kind.
pub(crate) fn literal(lit: Literal, dtype: DType) -> String {
    match dtype.kind() {
        Kind::Float => float_literal(lit.as_f64() as f32),
        Kind::Int if dtype == DType::I64 => match lit {
            Literal::Int(v) => long_literal(v),
            l => long_literal(l.as_f64() as i64),
        },
        Kind::Int => int_literal(lit.as_f64() as i64 as i32),
        Kind::Bool => (if lit.as_f64() != 0.0 { "true" } else { "false" }).to_string(),
    }
}

/// An f32 literal that reads back bit-exactly (infinities and NaN through their bit patterns).
pub(crate) fn float_literal(v: f32) -> String {
    if v.is_nan() {
        return "__int_as_float(0x7fffffff)".to_string();
    }
    if v.is_infinite() {
        return if v > 0.0 { "__int_as_float(0x7f800000)" } else { "__int_as_float(0xff800000)" }.to_string();
    }
    let s = format!("{v:?}");
    let s = if s.contains(['.', 'e']) { format!("{s}f") } else { format!("{s}.0f") };
    if v.is_sign_negative() {
        format!("({s})")
    } else {
        s
    }
}

pub(crate) fn int_literal(v: i32) -> String {
    match v {
        i32::MIN => "(-2147483647 - 1)".to_string(),
        v if v < 0 => format!("({v})"),
        v => v.to_string(),
    }
}

pub(crate) fn long_literal(v: i64) -> String {
    match v {
        i64::MIN => "(-9223372036854775807ll - 1)".to_string(),
        v if v < 0 => format!("({v}ll)"),
        v => format!("{v}ll"),
    }
}

/// The raw-word vector type used to move `comps` elements of `dtype` at once, when their total
/// size is 4, 8 or 16 bytes (`float2`/`float4` for f32 so that the code reads naturally).
pub(crate) fn vector_type(dtype: DType, comps: u64) -> Option<&'static str> {
    if comps < 2 {
        return None;
    }
    match (dtype, comps * dtype.size_bytes() as u64) {
        (DType::F32, 8) => Some("float2"),
        (DType::F32, 16) => Some("float4"),
        (DType::I64, 16) => Some("longlong2"),
        (DType::I64, _) => None,
        (_, 4) => Some("unsigned int"),
        (_, 8) => Some("uint2"),
        (_, 16) => Some("uint4"),
        _ => None,
    }
}

const LANES: [&str; 4] = ["x", "y", "z", "w"];

/// Component `k` of a vector variable `v` loaded with [`vector_type`], as a computed value.
pub(crate) fn vector_extract(v: &str, dtype: DType, comps: u64, k: u64) -> String {
    let bytes = dtype.size_bytes() as u64;
    let word = |w: u64| if comps * bytes == 4 { v.to_string() } else { format!("{v}.{}", LANES[w as usize]) };
    let (w, shift) = ((k * bytes) / 4, ((k * bytes) % 4) * 8);
    let shifted = |w: u64| if shift == 0 { word(w) } else { format!("({} >> {shift})", word(w)) };
    match dtype {
        DType::F32 => format!("{v}.{}", LANES[k as usize]),
        DType::I32 => format!("(int){}", word(w)),
        DType::I64 => format!("{v}.{}", LANES[k as usize]),
        DType::F16 => format!("kf_f16_to_f32((unsigned short){})", shifted(w)),
        DType::BF16 => format!("kf_bf16_to_f32((unsigned short){})", shifted(w)),
        DType::Bool => format!("(({} & 0xffu) != 0u)", shifted(w)),
    }
}

/// Packs computed values (one per component) into the words of [`vector_type`].
pub(crate) fn vector_pack(dtype: DType, values: &[String]) -> String {
    if dtype == DType::F32 {
        return format!("make_float{}({})", values.len(), values.join(", "));
    }
    if dtype == DType::I64 {
        return format!("make_longlong{}({})", values.len(), values.join(", "));
    }
    let bytes = dtype.size_bytes();
    let per_word = 4 / bytes;
    let words: Vec<String> = values
        .chunks(per_word)
        .map(|chunk| {
            let parts: Vec<String> = chunk
                .iter()
                .enumerate()
                .map(|(j, v)| {
                    let bits = match dtype {
                        DType::I32 => format!("(unsigned int){v}"),
                        DType::F16 | DType::BF16 => format!("(unsigned int){}", store_conversion(dtype, v)),
                        _ => format!("({v} ? 1u : 0u)"),
                    };
                    if j == 0 {
                        bits
                    } else {
                        format!("({bits} << {})", j * bytes * 8)
                    }
                })
                .collect();
            parts.join(" | ")
        })
        .collect();
    match words.len() {
        1 => words[0].clone(),
        n => format!("make_uint{n}({})", words.join(", ")),
    }
}

/// Converts a computed value to the element type stored for `dtype`.
pub(crate) fn store_conversion(dtype: DType, v: &str) -> String {
    match dtype {
        DType::F32 | DType::I32 | DType::I64 => v.to_string(),
        DType::F16 => format!("kf_f32_to_f16({v})"),
        DType::BF16 => format!("kf_f32_to_bf16({v})"),
        DType::Bool => format!("(unsigned char)({v} ? 1 : 0)"),
    }
}

/// Converts a loaded element of `dtype` to its computed value.
pub(crate) fn load_conversion(dtype: DType, v: &str) -> String {
    match dtype {
        DType::F32 | DType::I32 | DType::I64 => v.to_string(),
        DType::F16 => format!("kf_f16_to_f32({v})"),
        DType::BF16 => format!("kf_bf16_to_f32({v})"),
        DType::Bool => format!("({v} != 0)"),
    }
}

/// The helper functions generated code may call; emitted once each, in this order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Helper {
    F16,
    BF16,
    MinMaxF32,
    /// `kf_minf`/`kf_maxf` in the branch-free form of `MinMaxF64` (the same values), for the rows
    /// plan's kernels in place of `MinMaxF32`: with the one-instruction form the GIoU training
    /// step over a lengths layout ran 1.5-2.5% slower on an H200 (bench/RESULTS.md), the other
    /// shapes' kernels 2-9% faster.
    MinMaxF32Bits,
    MinMaxF64,
    BlockSum,
    BlockMax,
    BlockMin,
    BlockProd,
    /// `kf_row_sum`, `kf_row_max`, `kf_row_min`, `kf_row_prod`: folds over a row group of the
    /// row-wise shape.
    RowSum,
    RowMax,
    RowMin,
    RowProd,
    /// `kf_online_add`, `kf_online_merge`, `kf_row_online`: a softmax's maximum and sum of exp in
    /// one pass (see `shapes::row_wise`); needs `MinMaxF32`.
    RowOnline,
    DivMod,
    StoreStreaming,
    /// `kf_rem_i32`, `kf_fmod_i32`, `kf_floordiv_i32`, `kf_shl_i32`, `kf_shr_i32`.
    IntDivShift,
    /// `kf_rem_i64`, `kf_fmod_i64`, `kf_floordiv_i64`, `kf_shl_i64`, `kf_shr_i64`.
    Int64DivShift,
    /// `kf_remf`, `kf_floordivf`.
    FloatDiv,
    /// `kf_digammaf`, `kf_trigammaf` (`torch.digamma`, `torch.special.polygamma(1, x)`).
    Polygamma,
    /// `kf_report`: the record of a failed check of a lengths/offsets value.
    Report,
    /// `kf_philox_uniform`: the value of `rand_like` at a flat index (see `kfuse_ir::philox`).
    Philox,
}

const F16: &str = include_str!("templates/helper_f16.cuh");
const BF16: &str = include_str!("templates/helper_bf16.cuh");
const DIV_MOD: &str = include_str!("templates/helper_divmod.cuh");
const STORE_CS: &str = include_str!("templates/helper_store_cs.cuh");
const MIN_MAX: &str = include_str!("templates/helper_min_max.cuh");
const MIN_MAX_F32: &str = include_str!("templates/helper_min_max_f32.cuh");
const BLOCK_REDUCE: &str = include_str!("templates/helper_block_reduce.cuh");
const ROW_REDUCE: &str = include_str!("templates/helper_row_reduce.cuh");
const ROW_ONLINE: &str = include_str!("templates/helper_row_online.cuh");
const INT_DIV_SHIFT: &str = include_str!("templates/helper_int_div_shift.cuh");
const INT64_DIV_SHIFT: &str = include_str!("templates/helper_int64_div_shift.cuh");
const FLOAT_DIV: &str = include_str!("templates/helper_float_div.cuh");
const POLYGAMMA: &str = include_str!("templates/helper_polygamma.cuh");
const REPORT: &str = include_str!("templates/helper_report.cuh");
const PHILOX: &str = include_str!("templates/helper_philox.cuh");

/// The definition of `h`, guarded so that it may appear more than once in a translation unit.
pub(crate) fn helper_source(h: Helper) -> String {
    match h {
        Helper::F16 => render(F16, &[]),
        Helper::BF16 => render(BF16, &[]),
        Helper::MinMaxF32 => render(MIN_MAX_F32, &[]),
        Helper::MinMaxF32Bits => {
            min_max("F32", "float", "kf_minf", "kf_maxf", ("__float_as_int", "__int_as_float"), ("fminf", "fmaxf"))
        }
        Helper::MinMaxF64 => min_max(
            "F64",
            "double",
            "kf_min_f64",
            "kf_max_f64",
            ("__double_as_longlong", "__longlong_as_double"),
            ("fmin", "fmax"),
        ),
        Helper::BlockSum => block_reduce("sum", "v + o", "0.0"),
        Helper::BlockMax => block_reduce("max", "kf_max_f64(v, o)", "__longlong_as_double(0xfff0000000000000ll)"),
        Helper::BlockMin => block_reduce("min", "kf_min_f64(v, o)", "__longlong_as_double(0x7ff0000000000000ll)"),
        Helper::BlockProd => block_reduce("prod", "v * o", "1.0"),
        Helper::RowSum => row_reduce("sum", "v + o"),
        Helper::RowMax => row_reduce("max", "kf_max_f64(v, o)"),
        Helper::RowMin => row_reduce("min", "kf_min_f64(v, o)"),
        Helper::RowProd => row_reduce("prod", "v * o"),
        Helper::RowOnline => render(ROW_ONLINE, &[]),
        Helper::DivMod => render(DIV_MOD, &[]),
        Helper::StoreStreaming => render(STORE_CS, &[]),
        Helper::IntDivShift => render(INT_DIV_SHIFT, &[]),
        Helper::Int64DivShift => render(INT64_DIV_SHIFT, &[]),
        Helper::FloatDiv => render(FLOAT_DIV, &[]),
        Helper::Polygamma => render(POLYGAMMA, &[]),
        Helper::Report => render(REPORT, &[]),
        Helper::Philox => render(PHILOX, &[]),
    }
}

/// A fold of one f64 per lane over each row group (see `shapes::row_wise`).
fn row_reduce(name: &str, combine: &str) -> String {
    let upper = name.to_uppercase();
    render(ROW_REDUCE, &[("name", name), ("upper", &upper), ("combine", combine)])
}

/// NaN-propagating min/max (PyTorch's `minimum`/`maximum`; `fmin` alone would drop the NaN),
/// with `-0 < +0` as the interpreter orders them. Branch-free: the hardware min/max, then the
/// equal case (only zeros can differ in bits) merges sign bits, then NaN wins. (f32 has its own
/// template: one instruction on sm_80 and later.)
fn min_max(tag: &str, ty: &str, min: &str, max: &str, bits: (&str, &str), hw: (&str, &str)) -> String {
    let ((as_bits, from_bits), (hw_min, hw_max)) = (bits, hw);
    render(
        MIN_MAX,
        &[
            ("tag", tag),
            ("ty", ty),
            ("min", min),
            ("max", max),
            ("as_bits", as_bits),
            ("from_bits", from_bits),
            ("hw_min", hw_min),
            ("hw_max", hw_max),
        ],
    )
}

/// A block-wide reduction of one f64 per thread in a fixed order (warp shuffles, then warp 0
/// over the per-warp results), so the result is bit-identical from run to run.
fn block_reduce(name: &str, combine: &str, identity: &str) -> String {
    let upper = name.to_uppercase();
    render(BLOCK_REDUCE, &[("name", name), ("upper", &upper), ("combine", combine), ("identity", identity)])
}
