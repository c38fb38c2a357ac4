//! Zero fills: outputs that are all zero where a lengths mask fails (a gradient's padding) are
//! written as byte ranges, 16-byte streaming stores over the whole chunks and element stores at
//! the partial ends.
//!
//! Not handled here: the rows plan's tiled fill (see `shapes::rows`).

use kfuse_ir::{DType, Graph, Op};

use crate::actions::{has_component_axis, Action};
use crate::cuda::Helper;
use crate::emit::Emitter;
use crate::text::render;

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

/// The row-mode zero fills: reviewed templates.
const ZERO_FILL: &str = include_str!("templates/zero_fill.cuh");
const ZERO_FILL_16: &str = include_str!("templates/zero_fill_16.cuh");

/// Row mode: zeroes the elements `[kf_hi, cols)` of the row of output `o` (`esz` bytes each,
/// dividing 16) as one byte range: 16-byte streaming stores over the whole 16-byte chunks,
/// element stores for the partial chunks at either end (fewer than 16 / `esz` elements each); the
/// row's lanes take every `stride`-th store (32: a warp per row; `kf_g`: a row group).
pub(crate) fn write_zero_fill(em: &mut Emitter, g: &Graph, o: usize, esz: u64, cols: &str, stride: &str) {
    em.uses.helpers.insert(Helper::StoreStreaming);
    let per = 16 / esz;
    let (ety, zero, zero16) = fill_values(esz, g.node(g.outputs[o].node).dtype, em.checks);
    let name = &g.outputs[o].name;
    let (o, per_m1, per) = (o.to_string(), (per - 1).to_string(), per.to_string());
    let text = render(
        if esz == 16 { ZERO_FILL_16 } else { ZERO_FILL },
        &[
            ("o", &o),
            ("name", name),
            ("cols", cols),
            ("stride", stride),
            ("per", &per),
            ("per_m1", &per_m1),
            ("ety", ety),
            ("zero", &zero),
            ("zero16", &zero16),
        ],
    );
    for l in text.lines() {
        em.push_stmt(l.to_string());
    }
}

/// The C type of one `esz`-byte element of a zero fill (`esz` < 16, dividing 16), its zero, and
/// the value of a 16-byte chunk. In a checked kernel a float output's fill writes NaN bits
/// instead while `kf_bad` holds (see `check`).
pub(crate) fn fill_values(esz: u64, dtype: DType, checks: bool) -> (&'static str, String, String) {
    let (ety, zero) = match esz {
        1 => ("unsigned char", "(unsigned char)0"),
        2 => ("unsigned short", "(unsigned short)0"),
        4 => ("unsigned int", "0u"),
        _ => ("uint2", "make_uint2(0u, 0u)"),
    };
    let zero16 = "make_uint4(0u, 0u, 0u, 0u)";
    match crate::check::fill_word(dtype).filter(|_| checks && esz > 1) {
        None => (ety, zero.to_string(), zero16.to_string()),
        Some(w) => {
            let nan = match esz {
                2 => format!("(unsigned short)0x{:04x}", w & 0xffff),
                4 => format!("0x{w:08x}u"),
                _ => format!("make_uint2(0x{w:08x}u, 0x{w:08x}u)"),
            };
            let nan16 = format!("make_uint4(0x{w:08x}u, 0x{w:08x}u, 0x{w:08x}u, 0x{w:08x}u)");
            (ety, format!("(kf_bad ? {nan} : {zero})"), format!("(kf_bad ? {nan16} : {zero16})"))
        }
    }
}
