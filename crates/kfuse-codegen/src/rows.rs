//! The rows plan: a loss over a lengths mask and its scaled gradient in ONE plain launch (see
//! `onepass::detect`, which recognises it: the gradient's scalars follow from `count(mask)`
//! alone, and the count of `col < bound(row)` is the sum of the clamped bounds).
//!
//! Each block takes tiles of up to [`TILE_ROWS`] consecutive rows. Per tile, in this order:
//!
//! 1. its loads: every row's bound, and speculatively the first [`SPEC_COLS`] columns of every
//!    row (whatever the bound; they are in range), so no load waits for another;
//! 2. the zero fill of the tile's rows, whole (16-byte streaming stores, no dependency);
//! 3. on the first tile only, the count: every block sums the clamped bounds of all rows itself
//!    (`int4` loads of a plain `i32` bound input, the first ones issued before the fill) into
//!    `kf_cntd`, then thread 0 computes the crossing scalars (`kf_c<t>`, the gradient's scale)
//!    into shared memory;
//! 4. a barrier (which also orders the tile's zero stores before the stores below), then the
//!    valid speculated columns, then columns `[SPEC_COLS, bound)` of longer rows (a warp per row).
//!
//! The block's first tile is peeled out of the tile loop (both forms come from [`write_tile`]):
//! it counts unconditionally, with no run-time flag, and the loop over the block's further tiles
//! (rows beyond the grid's first tiles) has no count code. A block with no tile (few rows, or
//! the last blocks when the tiles are fewer than the blocks) runs the first tile over an empty
//! range of rows: it only counts, so every block holds the count.
//!
//! The reductions (the loss) use the ticket tail of every reduction kernel, except the counts of
//! the mask (`onepass::OnePass::counts`, e.g. the `count(valid)` of a mean loss): they take no
//! partial slot, are neither accumulated per element nor folded, and the tail reads the last
//! block's own `kf_cntd` (an exact integer in f64, as the folded count was). There is no grid
//! barrier and no list, and the values equal the two-kernel plan's bit for bit (the scale is
//! the same f32 expression of the same count). Measured on the H100 (hand-written prototype of
//! this schedule, bf16, B=16384, N=256): 17.2 µs against 20.6 µs for two kernels; the generated
//! kernel with the tile loop's run-time count flag and a count slot: 18.6-19.2 µs, each of the
//! two changes above saving about 0.6 µs as a hand edit of that source. Strides are the
//! compile-time block size `KF_B`: a run-time `blockDim.x` stride measured 2 µs slower.
//!
//! Not handled here: recognising the plan (`onepass`), the tail (`tail`, assembled in `kernel`).

use std::fmt::Write as _;

use kfuse_ir::{DType, Graph, NodeId, Op};

use crate::analysis::Analysis;
use crate::emit::{Coord, Emitter, Mode, Prefetch};
use crate::kernel::{row_mode_bound, run_actions, zero_fill_bytes, Action, Group};
use crate::CodegenError;

/// Threads per block of a rows-plan kernel (two blocks per SM measured best).
pub(crate) const ROWS_BLOCK: u32 = 512;
/// The most rows per tile.
pub(crate) const TILE_ROWS: u32 = 64;
/// Columns of each row loaded before the fill, whatever the row's bound (one per thread).
const SPEC_COLS: u32 = ROWS_BLOCK / TILE_ROWS;
/// `int4` loads of the bounds per thread issued before the first fill.
const COUNT_VECTORS: u32 = 8;

/// The rows loop's emitted pieces (see [`rows_loop`]).
struct RowsLines {
    /// The bound of `row`: the lines computing it and its value.
    bound_lines: Vec<String>,
    bound: String,
    /// A plain `i32` bound input, read as `int4` by the count.
    plain: Option<u32>,
    /// The then-branch with its loads hoisted into `kf_pf<k>` (speculated columns), and with
    /// direct loads (longer rows).
    prefetch: Vec<Prefetch>,
    spec_body: Vec<String>,
    direct_body: Vec<String>,
    /// Zero fills: (output, bytes per domain element) of outputs all-zero where the mask fails.
    fills: Vec<(usize, u64)>,
    /// Else-branch stores that are not plain zero fills (per element, flat index).
    other: Vec<String>,
    /// The crossing scalars' shared declarations and the lines (thread 0) that compute them.
    decls: Vec<String>,
    crossing_lines: Vec<String>,
    rows: String,
    cols: String,
}

/// Which of a block's tiles [`write_tile`] emits.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Tile {
    /// The block's first tile (`kf_tile = blockIdx.x`), peeled out of the loop: it also counts
    /// the mask (step 3). A block with no tile (`blockIdx.x >= kf_tiles`: few rows, or rows that
    /// the grid's tiles cover before the last blocks) runs it over an empty range of rows, so
    /// every block has its count for the tail, whichever block takes the last ticket.
    First,
    /// A further tile (`kf_tile = blockIdx.x + gridDim.x, ...`, when rows exceed the grid's
    /// first tiles): no count.
    Later,
}

/// The source of the rows loop (every tile of the block, up to the tail).
fn write_rows_loop(g: &Graph, l: &RowsLines) -> String {
    let RowsLines { plain, decls, rows, cols, .. } = l;
    let mut s = String::new();
    let _ = writeln!(s, "    const long long rows = {rows}, cols = {cols};");
    let _ = writeln!(s, "    constexpr int KF_B = {ROWS_BLOCK}, KF_T = {TILE_ROWS}, KF_S = {SPEC_COLS}; // threads (the launch's block), most rows per tile, columns loaded before the bounds are known");
    s.push_str("    // Rows per tile: the grid's share, so that every block has a tile.\n");
    s.push_str("    const long long kf_rt = rows == 0 ? 1 : ((rows + gridDim.x - 1) / gridDim.x < KF_T ? (rows + gridDim.x - 1) / gridDim.x : KF_T);\n");
    s.push_str("    const long long kf_tiles = (rows + kf_rt - 1) / kf_rt;\n");
    s.push_str("    const long long lane = threadIdx.x & 31u;\n");
    s.push_str("    __shared__ int kf_hs[KF_T]; // the tile's bounds, clamped to [0, cols]\n");
    s.push_str("    __shared__ double kf_csm[32];\n");
    for d in decls {
        let _ = writeln!(s, "    {d}");
    }
    s.push_str("    auto kf_cl = [&](int v) -> long long { return v < 0 ? 0ll : ((long long)v < cols ? (long long)v : cols); };\n");
    s.push_str("    // The count of the mask: every block sums the clamped bounds of all rows itself (in its first tile).\n");
    s.push_str("    double kf_cntd = 0.0; // the block's count (valid in thread 0): the crossing scalars' and the tail's\n");
    match plain {
        Some(id) => {
            let _ = writeln!(s, "    const int* kf_bl = in{id};");
            s.push_str("    const long long kf_nv = (((unsigned long long)kf_bl & 15ull) == 0ull) ? rows / 4 : 0; // int4 loads when 16-byte aligned\n");
            let _ = writeln!(s, "    int4 kf_cv[{COUNT_VECTORS}]; // issued before the first fill");
            s.push_str("    #pragma unroll\n");
            let _ = writeln!(s, "    for (int k = 0; k < {COUNT_VECTORS}; ++k) {{");
            s.push_str("        const long long j = threadIdx.x + k * (long long)KF_B;\n");
            s.push_str("        kf_cv[k] = j < kf_nv ? reinterpret_cast<const int4*>(kf_bl)[j] : make_int4(0, 0, 0, 0);\n    }\n");
        }
        None => s.push_str("    const long long kf_nv = 0;\n"),
    }
    s.push_str("    // The block's first tile, with the count; a block with no tile (blockIdx.x >= kf_tiles) has no rows in it and only counts.\n");
    s.push_str("    {\n");
    write_tile(&mut s, g, l, Tile::First);
    s.push_str("    }\n");
    s.push_str("    // The block's further tiles, when the rows exceed the grid's first tiles.\n");
    s.push_str("    for (long long kf_tile = blockIdx.x + gridDim.x; kf_tile < kf_tiles; kf_tile += gridDim.x) {\n");
    write_tile(&mut s, g, l, Tile::Later);
    s.push_str("    }\n");
    s
}

/// The body of one tile (steps 1 to 4 of the module docs, then the barrier before the next
/// tile), inside the caller's braces; only a [`Tile::First`] counts.
fn write_tile(s: &mut String, g: &Graph, l: &RowsLines, tile: Tile) {
    let RowsLines { bound_lines, bound: bv, plain, prefetch, spec_body, direct_body, fills, other, crossing_lines, .. } = l;
    let w = |s: &mut String, ind: usize, l: &str| {
        let _ = writeln!(s, "{}{l}", "    ".repeat(ind));
    };
    match tile {
        Tile::First => {
            s.push_str("        const long long kf_tile = blockIdx.x;\n");
            s.push_str("        const long long kf_r0 = kf_tile < kf_tiles ? kf_tile * kf_rt : rows, kf_r1 = kf_r0 + kf_rt < rows ? kf_r0 + kf_rt : rows; // empty past the last tile\n");
        }
        Tile::Later => s.push_str("        const long long kf_r0 = kf_tile * kf_rt, kf_r1 = kf_r0 + kf_rt < rows ? kf_r0 + kf_rt : rows;\n"),
    }
    s.push_str("        // 1. Loads: the rows' bounds, and the first KF_S columns of every row whatever its bound.\n");
    s.push_str("        int kf_b = 0;\n");
    s.push_str("        if ((long long)threadIdx.x < kf_r1 - kf_r0) {\n");
    s.push_str("            const long long row = kf_r0 + threadIdx.x;\n");
    for l in bound_lines {
        w(s, 3, l);
    }
    let _ = writeln!(s, "            kf_b = {bv};");
    s.push_str("        }\n");
    for (k, pf) in prefetch.iter().enumerate() {
        let _ = writeln!(s, "        {} kf_pf{k}[1]; // {}", pf.ty, pf.note);
    }
    s.push_str("        const int kf_u = 0;\n");
    s.push_str("        const long long kf_sr = kf_r0 + threadIdx.x / KF_S, kf_sc = threadIdx.x % KF_S; // this thread's speculated element\n");
    if !prefetch.is_empty() {
        s.push_str("        if (kf_sr < kf_r1 && kf_sc < cols) {\n");
        s.push_str("            const long long i = kf_sr * cols + kf_sc;\n");
        for (k, pf) in prefetch.iter().enumerate() {
            let _ = writeln!(s, "            kf_pf{k}[kf_u] = {};", pf.load);
        }
        s.push_str("        }\n");
    }
    s.push_str("        // 2. The zero fill of the tile's rows, whole: the valid columns are overwritten after the barrier.\n");
    s.push_str("        const long long kf_za = kf_r0 * cols, kf_zb = kf_r1 * cols; // elements\n");
    for &(o, esz) in fills {
        write_fill(s, g, o, esz);
    }
    if !other.is_empty() {
        s.push_str("        for (long long i = kf_za + threadIdx.x; i < kf_zb; i += KF_B) {\n");
        for l in other {
            w(s, 3, l);
        }
        s.push_str("        }\n");
    }
    if tile == Tile::First {
        s.push_str("        // 3. The count (the first tile only), and the scalars that follow from it.\n");
        s.push_str("        long long kf_n = 0;\n");
        if plain.is_some() {
            s.push_str("        #pragma unroll\n");
            let _ = writeln!(s, "        for (int k = 0; k < {COUNT_VECTORS}; ++k) kf_n += kf_cl(kf_cv[k].x) + kf_cl(kf_cv[k].y) + kf_cl(kf_cv[k].z) + kf_cl(kf_cv[k].w);");
            let _ = writeln!(s, "        for (long long j = threadIdx.x + {COUNT_VECTORS}ll * KF_B; j < kf_nv; j += KF_B) {{");
            s.push_str("            const int4 v = reinterpret_cast<const int4*>(kf_bl)[j];\n");
            s.push_str("            kf_n += kf_cl(v.x) + kf_cl(v.y) + kf_cl(v.z) + kf_cl(v.w);\n        }\n");
        }
        s.push_str("        #pragma unroll 4\n");
        s.push_str("        for (long long row = kf_nv * 4 + threadIdx.x; row < rows; row += KF_B) {\n");
        for l in bound_lines {
            w(s, 3, l);
        }
        let _ = writeln!(s, "            kf_n += kf_cl({bv});");
        s.push_str("        }\n");
        s.push_str("        kf_cntd = kf_block_sum((double)kf_n, kf_csm);\n");
        s.push_str("        if (threadIdx.x == 0) {\n");
        for l in crossing_lines {
            w(s, 3, l);
        }
        s.push_str("        }\n");
    }
    s.push_str("        if ((long long)threadIdx.x < kf_r1 - kf_r0) kf_hs[threadIdx.x] = (int)kf_cl(kf_b);\n");
    let note = match tile {
        Tile::First => "the bounds and scalars are shared",
        Tile::Later => "the bounds are shared",
    };
    let _ = writeln!(s, "        __syncthreads(); // {note}; the tile's zero stores precede the stores below");
    s.push_str("        // 4. The speculated columns that are valid, then columns [KF_S, bound) of longer rows, a warp per row.\n");
    s.push_str("        if (kf_sr < kf_r1 && kf_sc < kf_hs[threadIdx.x / KF_S]) {\n");
    s.push_str("            const long long row = kf_sr, col = kf_sc, i = row * cols + col;\n");
    for l in spec_body {
        w(s, 3, l);
    }
    s.push_str("        }\n");
    s.push_str("        for (long long kf_r = threadIdx.x >> 5; kf_r < kf_r1 - kf_r0; kf_r += KF_B / 32) {\n");
    s.push_str("            const long long row = kf_r0 + kf_r, rowbase = row * cols, kf_hi = kf_hs[kf_r];\n");
    s.push_str("            for (long long col = KF_S + lane; col < kf_hi; col += 32) {\n");
    s.push_str("                const long long i = rowbase + col;\n");
    for l in direct_body {
        w(s, 4, l);
    }
    s.push_str("            }\n        }\n");
    s.push_str("        __syncthreads(); // kf_hs is rewritten by the next tile\n");
}

/// The zero fill of output `o` over the tile's elements `[kf_za, kf_zb)`, the block's threads
/// taking every `KF_B`-th store.
fn write_fill(s: &mut String, g: &Graph, o: usize, esz: u64) {
    let _ = writeln!(s, "        {{ // {}", g.outputs[o].name);
    for l in crate::kernel::zero_fill_lines(o, esz, "threadIdx.x", "KF_B") {
        let _ = writeln!(s, "            {l}");
    }
    s.push_str("        }\n");
}

/// The rows plan's loop (see `rows`): its source, and the next free value number. `counts` are
/// the kernel's counts of the mask (see `onepass::OnePass::counts`): the crossing scalars read
/// them as the block's `kf_cntd`.
pub(crate) fn rows_loop(em: &mut Emitter, g: &Graph, an: &Analysis, k: usize, groups: &[Group], counts: &[NodeId], first_var: u32) -> Result<(String, u32), CodegenError> {
    let internal = |what| CodegenError::Internal { node: 0, what };
    let info = &an.kernels[k];
    let dom: Vec<Coord> = (0..info.dims.len() as u32).map(Coord::Dom).collect();
    let [grp] = groups else { return Err(internal("rows plan with several predicates")) };
    // Element emitters in row mode, continuing the numbering from `first`.
    let fresh = |first| {
        let mut e = Emitter::new(g, Some(an), Mode::Element { kernel: k }, info.dims.clone(), first);
        e.substitutions = em.substitutions.clone();
        e.row_mode = true;
        e
    };
    // Else-branch stores: zero fills, or (any other constant) per element at the flat index.
    let (mut fills, mut others) = (Vec::new(), Vec::new());
    for a in &grp.otherwise {
        match (a, zero_fill_bytes(em, g, a)) {
            (Action::Store { output, .. }, Some(esz)) => fills.push((*output, esz)),
            _ => others.push(a.clone()),
        }
    }
    let mut flat = fresh(first_var);
    flat.row_mode = false;
    run_actions(&mut flat, g, &others)?;
    let next = flat.next_var();
    let (other, u) = flat.into_lines();
    em.uses.absorb(u);
    // The bound of `row`; a plain `i32` input (through `[.., None]`) is read as int4 by the count.
    let (b, bctx) = row_mode_bound(em, g, &info.dims, &dom, groups).ok_or(internal("rows plan without a row bound"))?;
    let (mut pn, mut pctx) = (b, bctx.clone());
    while let (Op::ExpandLast(x), Some(Coord::Const(0))) = (g.node(pn).op, pctx.last()) {
        pn = x;
        pctx.pop();
    }
    let plain = match g.node(pn).op {
        Op::Input(id) if g.node(pn).dtype == DType::I32 && pctx.iter().enumerate().all(|(a, c)| *c == Coord::Dom(a as u32)) => Some(id.0),
        _ => None,
    };
    let mut bound_em = fresh(next);
    let bound = bound_em.eval(b, &bctx)?;
    let next = bound_em.next_var();
    let (bound_lines, u) = bound_em.into_lines();
    em.uses.absorb(u);
    // The then-branch: speculative (loads hoisted into kf_pf) and direct.
    let mut spec = fresh(next);
    spec.prefetch = Some(Vec::new());
    run_actions(&mut spec, g, &grp.then)?;
    let prefetch = spec.prefetch.take().unwrap_or_default();
    let (next, (spec_body, u)) = (spec.next_var(), spec.into_lines());
    em.uses.absorb(u);
    let mut direct = fresh(next);
    run_actions(&mut direct, g, &grp.then)?;
    let (next, (direct_body, u)) = (direct.next_var(), direct.into_lines());
    em.uses.absorb(u);
    // The scalars crossing to the gradient, from `count(mask)` (the block's `kf_cntd`).
    let mut epilogue = Emitter::new(g, Some(an), Mode::Epilogue { kernel: k }, Vec::new(), next);
    for &node in counts {
        epilogue.slot_results.insert(node, vec!["kf_cntd".to_string()]);
    }
    let mut decls = Vec::new();
    for (&n, &t) in &an.temps {
        let v = epilogue.eval(n, &[])?;
        let ty = crate::cuda::value_type(crate::emit::temp_dtype(g.node(n).dtype));
        decls.push(format!("__shared__ {ty} kf_c{t}; // n{} from the count", n.0));
        epilogue.push_stmt(format!("kf_c{t} = {v};"));
    }
    let (next, (crossing_lines, u)) = (epilogue.next_var(), epilogue.into_lines());
    em.uses.absorb(u);
    em.uses.helpers.insert(crate::cuda::Helper::BlockSum);
    if !fills.is_empty() {
        em.uses.helpers.insert(crate::cuda::Helper::StoreStreaming);
    }
    let lines = RowsLines {
        bound_lines,
        bound,
        plain,
        prefetch,
        spec_body,
        direct_body,
        fills,
        other,
        decls,
        crossing_lines,
        rows: em.product(&info.dims[..info.dims.len() - 1]),
        cols: match info.dims.last() {
            Some(&d) => em.dim(d),
            None => "1".to_string(),
        },
    };
    let src = write_rows_loop(g, &lines);
    Ok((src, next))
}
