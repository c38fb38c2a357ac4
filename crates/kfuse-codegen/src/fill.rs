//! Zero fills: outputs that are all zero where a lengths mask fails (a gradient's padding) are
//! written as byte ranges, 16-byte streaming stores over the whole chunks and element stores at
//! the partial ends.
//!
//! Not handled here: the rows plan's tiled fill (see `shapes::rows`).

use kfuse_ir::{Graph, Op};

use crate::actions::{has_component_axis, Action};
use crate::cuda::Helper;
use crate::emit::Emitter;

/// For a store of nothing but zero literals (all bits zero in storage) whose bytes per domain
/// element divide 16: those bytes.
pub(crate) fn zero_fill_bytes(em: &Emitter, g: &Graph, a: &Action) -> Option<u64> {
    let Action::Store { output, values } = a else { return None };
    let all_zero = values.iter().all(|(n, ctx)| {
        let (c, _) = em.canonical(*n, ctx.clone());
        matches!(g.node(c).op, Op::Const(l) if l.as_f64().to_bits() == 0)
    });
    let esz = values.len() as u64 * g.node(g.outputs[*output].node).dtype.size_bytes() as u64;
    (all_zero && esz > 0 && 16 % esz == 0 && (has_component_axis(g, *output) || values.len() == 1)).then_some(esz)
}

/// Row mode: zeroes the elements `[kf_hi, cols)` of the row of output `o` (`esz` bytes each) as
/// one byte range: 16-byte streaming stores over the whole 16-byte chunks, element stores for
/// the partial chunks at either end (fewer than 16 / `esz` elements each); the row's lanes take
/// every `stride`-th store (32: a warp per row; `kf_g`: a row group).
pub(crate) fn write_zero_fill(em: &mut Emitter, g: &Graph, o: usize, esz: u64, cols: &str, stride: &str) {
    em.uses.helpers.insert(Helper::StoreStreaming);
    let name = &g.outputs[o].name;
    em.push_stmt(format!("{{ // zero fill of {name} over columns [kf_hi, {cols}): 16-byte streaming stores"));
    em.push_stmt(format!("    const long long kf_za = rowbase + kf_hi, kf_zb = rowbase + {cols}; // elements"));
    for l in zero_fill_lines(o, esz, "lane", stride) {
        em.push_stmt(format!("    {l}"));
    }
    em.push_stmt("}".to_string());
}

/// The zero fill of output `o` (`esz` bytes per domain element, dividing 16) over the elements
/// `[kf_za, kf_zb)` declared by the caller: element stores for the partial 16-byte chunks at
/// either end, 16-byte streaming stores (`kf_st_cs`) between; thread `lane` of the filling
/// group takes every `stride`-th store.
pub(crate) fn zero_fill_lines(o: usize, esz: u64, lane: &str, stride: &str) -> Vec<String> {
    let per = 16 / esz;
    let chunks = |c: &str, from: &str, to: &str| {
        format!("for (long long {c} = {from} + {lane}; {c} < {to}; {c} += {stride}) kf_st_cs(reinterpret_cast<uint4*>(out{o}) + {c}, make_uint4(0u, 0u, 0u, 0u));")
    };
    if per == 1 {
        return vec!["#pragma unroll 4".to_string(), chunks("e", "kf_za", "kf_zb")];
    }
    let (ety, zero) = zero_element(esz);
    vec![
        format!("const long long kf_zc = (kf_za + {}) / {per}, kf_zd = kf_zb / {per}; // whole 16-byte chunks [kf_zc, kf_zd)", per - 1),
        format!("const long long kf_zh = kf_zc * {per} < kf_zb ? kf_zc * {per} : kf_zb; // head elements [kf_za, kf_zh)"),
        format!("const long long kf_zt = kf_zd * {per} > kf_zh ? kf_zd * {per} : kf_zh; // tail elements [kf_zt, kf_zb)"),
        format!("for (long long e = kf_za + {lane}; e < kf_zh; e += {stride}) reinterpret_cast<{ety}*>(out{o})[e] = {zero};"),
        format!("for (long long e = kf_zt + {lane}; e < kf_zb; e += {stride}) reinterpret_cast<{ety}*>(out{o})[e] = {zero};"),
        "#pragma unroll 4".to_string(),
        chunks("c", "kf_zc", "kf_zd"),
    ]
}

/// The C type of one `esz`-byte element of a zero fill (`esz` < 16, dividing 16) and its zero.
pub(crate) fn zero_element(esz: u64) -> (&'static str, &'static str) {
    match esz {
        1 => ("unsigned char", "(unsigned char)0"),
        2 => ("unsigned short", "(unsigned short)0"),
        4 => ("unsigned int", "0u"),
        _ => ("uint2", "make_uint2(0u, 0u)"),
    }
}
