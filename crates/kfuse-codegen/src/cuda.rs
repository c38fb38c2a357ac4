//! CUDA C++ spelling: value and pointer types per dtype, literals, vector access widths, and the
//! header-free helper functions (f16/bf16 conversion through inline PTX, NaN-propagating min/max,
//! block reductions). Each helper is wrapped in its own `#ifndef` guard so that several generated
//! fragments (e.g. MLP activations) can share one translation unit.
//!
//! Not handled here: what to compute (see `emit`).

use kfuse_ir::{DType, Kind, Literal};

/// The C type a value of `dtype` is computed in.
pub(crate) fn value_type(dtype: DType) -> &'static str {
    match dtype.kind() {
        Kind::Float => "float",
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
        DType::Bool => "unsigned char",
    }
}

/// A literal in the C type of `dtype`'s kind.
pub(crate) fn literal(lit: Literal, dtype: DType) -> String {
    match dtype.kind() {
        Kind::Float => float_literal(lit.as_f64() as f32),
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

/// The raw-word vector type used to move `comps` elements of `dtype` at once, when their total
/// size is 4, 8 or 16 bytes (`float2`/`float4` for f32 so that the code reads naturally).
pub(crate) fn vector_type(dtype: DType, comps: u64) -> Option<&'static str> {
    if comps < 2 {
        return None;
    }
    match (dtype, comps * dtype.size_bytes() as u64) {
        (DType::F32, 8) => Some("float2"),
        (DType::F32, 16) => Some("float4"),
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
        DType::F32 | DType::I32 => v.to_string(),
        DType::F16 => format!("kf_f32_to_f16({v})"),
        DType::BF16 => format!("kf_f32_to_bf16({v})"),
        DType::Bool => format!("(unsigned char)({v} ? 1 : 0)"),
    }
}

/// Converts a loaded element of `dtype` to its computed value.
pub(crate) fn load_conversion(dtype: DType, v: &str) -> String {
    match dtype {
        DType::F32 | DType::I32 => v.to_string(),
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
    MinMaxF64,
    BlockSum,
    BlockMax,
    BlockMin,
    DivMod,
    StoreStreaming,
}

/// The definition of `h`, guarded so that it may appear more than once in a translation unit.
pub(crate) fn helper_source(h: Helper) -> String {
    match h {
        Helper::F16 => "\
#ifndef KF_HELPER_F16
#define KF_HELPER_F16
// f16 <-> f32 without cuda_fp16.h: the PTX conversions (round to nearest even).
__device__ __forceinline__ float kf_f16_to_f32(unsigned short h) { float f; asm(\"cvt.f32.f16 %0, %1;\" : \"=f\"(f) : \"h\"(h)); return f; }
__device__ __forceinline__ unsigned short kf_f32_to_f16(float f) { unsigned short h; asm(\"cvt.rn.f16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(f)); return h; }
#endif
"
        .to_string(),
        Helper::BF16 => "\
#ifndef KF_HELPER_BF16
#define KF_HELPER_BF16
// bf16 <-> f32 without cuda_bf16.h: bf16 is the top half of an f32; rounding uses PTX (sm_80+).
__device__ __forceinline__ float kf_bf16_to_f32(unsigned short h) { return __uint_as_float(((unsigned int)h) << 16); }
__device__ __forceinline__ unsigned short kf_f32_to_bf16(float f) { unsigned short h; asm(\"cvt.rn.bf16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(f)); return h; }
#endif
"
        .to_string(),
        Helper::MinMaxF32 => min_max("F32", "float", "kf_minf", "kf_maxf", ("__float_as_int", "__int_as_float"), ("fminf", "fmaxf")),
        Helper::MinMaxF64 => min_max("F64", "double", "kf_min_f64", "kf_max_f64", ("__double_as_longlong", "__longlong_as_double"), ("fmin", "fmax")),
        Helper::BlockSum => block_reduce("sum", "v + o", "0.0"),
        Helper::BlockMax => block_reduce("max", "kf_max_f64(v, o)", "__longlong_as_double(0xfff0000000000000ll)"),
        Helper::BlockMin => block_reduce("min", "kf_min_f64(v, o)", "__longlong_as_double(0x7ff0000000000000ll)"),
        Helper::DivMod => "\
#ifndef KF_HELPER_DIVMOD
#define KF_HELPER_DIVMOD
// Index division for non-negative operands: 32-bit when both fit (a uniform branch in practice;
// about a quarter of the instructions of the 64-bit sequence), 64-bit otherwise.
__device__ __forceinline__ long long kf_div(long long a, long long b) {
    return (((unsigned long long)a | (unsigned long long)b) >> 32) == 0ull ? (long long)((unsigned int)a / (unsigned int)b) : a / b;
}
__device__ __forceinline__ long long kf_mod(long long a, long long b) {
    return (((unsigned long long)a | (unsigned long long)b) >> 32) == 0ull ? (long long)((unsigned int)a % (unsigned int)b) : a % b;
}
#endif
"
        .to_string(),
        Helper::StoreStreaming => "\
#ifndef KF_HELPER_STORE_CS
#define KF_HELPER_STORE_CS
// Streaming (evict-first) stores for outputs that nothing re-reads: st.global.cs.
__device__ __forceinline__ void kf_st_cs(float4* p, float4 v) { asm volatile(\"st.global.cs.v4.f32 [%0], {%1, %2, %3, %4};\" :: \"l\"(p), \"f\"(v.x), \"f\"(v.y), \"f\"(v.z), \"f\"(v.w)); }
__device__ __forceinline__ void kf_st_cs(float2* p, float2 v) { asm volatile(\"st.global.cs.v2.f32 [%0], {%1, %2};\" :: \"l\"(p), \"f\"(v.x), \"f\"(v.y)); }
__device__ __forceinline__ void kf_st_cs(float* p, float v) { asm volatile(\"st.global.cs.f32 [%0], %1;\" :: \"l\"(p), \"f\"(v)); }
__device__ __forceinline__ void kf_st_cs(uint4* p, uint4 v) { asm volatile(\"st.global.cs.v4.u32 [%0], {%1, %2, %3, %4};\" :: \"l\"(p), \"r\"(v.x), \"r\"(v.y), \"r\"(v.z), \"r\"(v.w)); }
__device__ __forceinline__ void kf_st_cs(uint2* p, uint2 v) { asm volatile(\"st.global.cs.v2.u32 [%0], {%1, %2};\" :: \"l\"(p), \"r\"(v.x), \"r\"(v.y)); }
__device__ __forceinline__ void kf_st_cs(unsigned int* p, unsigned int v) { asm volatile(\"st.global.cs.u32 [%0], %1;\" :: \"l\"(p), \"r\"(v)); }
#endif
"
        .to_string(),
    }
}

/// NaN-propagating min/max (PyTorch's `minimum`/`maximum`; `fminf` alone would drop the NaN),
/// with `-0 < +0` as the interpreter orders them. Branch-free: the hardware min/max, then the
/// equal case (only zeros can differ in bits) merges sign bits, then NaN wins.
fn min_max(tag: &str, ty: &str, min: &str, max: &str, bits: (&str, &str), hw: (&str, &str)) -> String {
    let ((as_bits, from_bits), (hw_min, hw_max)) = (bits, hw);
    format!(
        "\
#ifndef KF_HELPER_MINMAX_{tag}
#define KF_HELPER_MINMAX_{tag}
// NaN-propagating min/max ordering -0 below +0, like torch.minimum/maximum.
__device__ __forceinline__ {ty} {min}({ty} a, {ty} b) {{
    const {ty} m = (a == b) ? {from_bits}({as_bits}(a) | {as_bits}(b)) : {hw_min}(a, b);
    return (a != a || b != b) ? a + b : m;
}}
__device__ __forceinline__ {ty} {max}({ty} a, {ty} b) {{
    const {ty} m = (a == b) ? {from_bits}({as_bits}(a) & {as_bits}(b)) : {hw_max}(a, b);
    return (a != a || b != b) ? a + b : m;
}}
#endif
"
    )
}

/// A block-wide reduction of one f64 per thread in a fixed order (warp shuffles, then warp 0
/// over the per-warp results), so the result is bit-identical from run to run.
fn block_reduce(name: &str, combine: &str, identity: &str) -> String {
    format!(
        "\
#ifndef KF_HELPER_BLOCK_{upper}
#define KF_HELPER_BLOCK_{upper}
// Block-wide {name} of one double per thread, in a fixed order; the result is valid in thread 0.
// `smem` holds 32 doubles; every thread of the block must call this.
__device__ double kf_block_{name}(double v, double* smem) {{
    const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    for (int off = 16; off > 0; off >>= 1) {{ const double o = __shfl_down_sync(0xffffffffu, v, off); v = {combine}; }}
    __syncthreads(); // smem may still be in use by the previous call
    if (lane == 0u) smem[warp] = v;
    __syncthreads();
    if (warp == 0u) {{
        v = (lane < ((blockDim.x + 31u) >> 5)) ? smem[lane] : {identity};
        for (int off = 16; off > 0; off >>= 1) {{ const double o = __shfl_down_sync(0xffffffffu, v, off); v = {combine}; }}
    }}
    return v;
}}
#endif
",
        upper = name.to_uppercase()
    )
}
