//! The rows plan: a loss over a lengths mask and its scaled gradient in ONE cooperative launch
//! (see `onepass::detect`, which recognises it: the gradient's scalars follow from `count(mask)`
//! alone, and the count of `col < bound(row)` is the sum of the clamped bounds).
//!
//! Each block owns a contiguous, balanced share of the rows, in tiles of up to [`TILE_ROWS`]. It
//! loads its first tile's bounds, and warp 0 takes their prefix sum and splits the block's warps
//! in two roles (more compute warps the more of the tile is valid, at least
//! [`MIN_COMPUTE_WARPS`]; see `templates/rows_prelude.cuh`). From there on the two roles share nothing but
//! the exit, and each synchronises on a named barrier of its own:
//!
//! - **Fill warps** write the else-branch (the zero gradient of the padding) of every tile, and
//!   only there: a 16-byte streaming store per chunk of padding, element stores for a chunk that
//!   holds a valid element or crosses a row. They never wait for the count and are the kernel's
//!   critical path: the padding is nearly all of the bytes a run must move.
//! - **Compute warps** add the block's count to the grid's 64-bit arrival word (the count in the
//!   low [`COUNT_BITS`] bits, one arrival above them), wait until every block has arrived (all
//!   are resident: a cooperative launch), compute the crossing scalars (the gradient's scale)
//!   from the count, then compute the tile's valid elements, flattened over its rows by the
//!   prefix of their bounds ([`BATCH`] per thread, their loads issued together), and fold the
//!   reductions (the loss) across the compute warps in a fixed order. Warp 0 takes the ticket;
//!   the last block folds the partials, runs the epilogue, and resets the ticket and the arrival
//!   word for the next launch. This tail overlaps the other blocks' fill.
//!
//! No element is written twice, no float atomics: the results are deterministic for a given grid.
//! The counts of the mask (`onepass::OnePass::counts`) take no partial slot: they are the
//! arrival word's count (`kf_cntd`, an exact integer in f64).
//!
//! Measured on the H100 (bf16 GIoU step, B=16384, N=256): 14.9 µs back to back
//! and 16.4 µs rotating two buffer sets (the hand-written prototype of this schedule: 14.2 /
//! 15.6 µs), against 18.2 / 20.1 µs for the previous rows plan, where every warp filled its whole
//! tile, summed all the lengths, and overwrote the valid columns after a barrier.
//!
//! Not handled here: recognising the plan (`onepass`), the kernel's header and accumulators
//! (`kernel`).

use std::fmt::Write as _;

use kfuse_ir::{Graph, NodeId};

use crate::actions::{row_mode_bound, run_actions, Action, Combine, Group};
use crate::analysis::Analysis;
use crate::emit::{Coord, Emitter, Mode, Prefetch};
use crate::fill::{fill_values, zero_fill_bytes};
use crate::text::render;
use crate::CodegenError;

/// Threads per block of a rows-plan kernel (two blocks per SM measured best).
pub(crate) const ROWS_BLOCK: u32 = 512;
/// The most rows per tile: warp 0's prefix sum takes two a lane.
const TILE_ROWS: u32 = 64;
/// Valid elements a compute thread takes per step, their loads issued together (4 measured
/// 0.7 µs slower than 2 on the bf16 GIoU step: registers spill).
const BATCH: u32 = 2;
/// The fewest compute warps of a block: they wait on load latencies amid the fill's stores,
/// so more of them finish the tail sooner (bf16 GIoU step on the H100, back to back / rotating
/// two buffer sets: the prototype with 1, 2, 4, 6, 8 measured 18.5, 15.7, 14.7, 14.2, 14.0 µs
/// back to back; this kernel with 4, 6, 8: 16.1 / 18.2, 15.5 / 17.4, 15.4 / 17.2 µs).
const MIN_COMPUTE_WARPS: u32 = 8;
/// What a valid element costs against a 16-byte chunk of padding, for the split of the warps.
const VALID_COST: u32 = 3;
/// Bits of the arrival word that hold the count (the arrivals count above them).
const COUNT_BITS: u32 = 40;

/// The emitted pieces of the rows plan (see [`rows_loop`]).
struct RowsLines {
    /// The bound of `row`: the lines computing it and its value.
    bound_lines: Vec<String>,
    bound: String,
    /// The then-branch, its loads hoisted into `kf_pf<k>[kf_u]`.
    prefetch: Vec<Prefetch>,
    body: Vec<String>,
    /// Zero fills: (output, bytes per domain element) of outputs all-zero where the mask fails.
    fills: Vec<(usize, u64)>,
    /// Else-branch stores that are not plain zero fills (per element, flat index `i`).
    other: Vec<String>,
    /// Bytes the else-branch stores per padding element (every fill and other store).
    pad_bytes: u64,
    /// Whether the kernel checks lengths values: a failed check in a thread that loads bounds
    /// is or-ed into `kf_bad` of every thread that uses them, at the barrier that publishes them.
    checks: bool,
    /// The crossing scalars' shared declarations and the lines (thread 0) that compute them.
    decls: Vec<String>,
    crossing_lines: Vec<String>,
    rows: String,
    cols: String,
}

fn line(s: &mut String, ind: usize, l: &str) {
    let _ = writeln!(s, "{}{l}", "    ".repeat(ind));
}

/// The bound of `row` into `dst` (an `int`, clamped to `[0, cols]`), inside braces at `ind`.
fn write_bound(s: &mut String, l: &RowsLines, ind: usize, row: &str, dst: &str) {
    line(s, ind, "{");
    line(s, ind + 1, &format!("const long long row = {row};"));
    for b in &l.bound_lines {
        line(s, ind + 1, b);
    }
    line(s, ind + 1, &format!("{dst} = (int)kf_cl({});", l.bound));
    line(s, ind, "}");
}

/// The rows plan's prelude and step 1 (the reviewed template `rows_prelude.cuh`).
const ROWS_PRELUDE: &str = include_str!("../templates/rows_prelude.cuh");

/// The kernel body up to the compute warps' reductions (steps 1 to 4 of the module docs); the
/// caller appends [`write_rows_tail`].
fn write_rows_body(g: &Graph, l: &RowsLines) -> String {
    let mut decls = String::new();
    for d in &l.decls {
        let _ = writeln!(decls, "    {d}");
    }
    let mut first_bound = String::new();
    write_bound(&mut first_bound, l, 2, "kf_ra + threadIdx.x", "kf_b");
    let mut s = render(
        ROWS_PRELUDE,
        &[
            ("rows", &l.rows),
            ("cols", &l.cols),
            ("block", &ROWS_BLOCK.to_string()),
            ("tile_rows", &TILE_ROWS.to_string()),
            ("batch", &BATCH.to_string()),
            ("valid_cost", &VALID_COST.to_string()),
            ("pad_bytes", &l.pad_bytes.to_string()),
            ("min_compute_warps", &MIN_COMPUTE_WARPS.to_string()),
            ("decls", &decls),
            ("first_bound", &first_bound),
            ("bar_or", if l.checks { BAR_OR } else { "" }),
            ("first_sync", &sync(l.checks, 1, "__syncthreads()")),
        ],
    );
    write_fill_role(&mut s, g, l);
    write_compute_role(&mut s, l);
    s
}

/// A named barrier that also ors `kf_bad` over its threads (`bar.red.or.pred`): checked kernels
/// only.
const BAR_OR: &str = "    auto kf_bar_or = [](int id, int n, bool p) -> bool { int r; asm volatile(\"{ .reg .pred kf_p, kf_q; setp.ne.s32 kf_p, %1, 0; bar.red.or.pred kf_q, %2, %3, kf_p; selp.s32 %0, 1, 0, kf_q; }\" : \"=r\"(r) : \"r\"((int)p), \"r\"(id), \"r\"(n) : \"memory\"); return r != 0; }; // a named barrier that ors kf_bad (a failed check) over its threads\n";

/// The barrier `plain` (a statement without its `;`) at `ind` levels, which in a checked kernel
/// also ors `kf_bad` over the threads that pass it (`__syncthreads_or`, or `kf_bar_or` for a
/// role's named barrier `kf_bar(id, n)`).
fn sync(checks: bool, ind: usize, plain: &str) -> String {
    let mut s = String::new();
    let l = match (checks, plain.strip_prefix("kf_bar(")) {
        (false, _) => format!("{plain};"),
        (true, None) => {
            "kf_bad = __syncthreads_or(kf_bad) != 0; // and a failed check of a bound reaches every thread".into()
        }
        (true, Some(args)) => format!(
            "kf_bad = kf_bar_or({}, kf_bad); // and a failed check of a bound reaches the role",
            args.trim_end_matches(')')
        ),
    };
    line(&mut s, ind, &l);
    s
}

/// Step 2, the fill warps (the else-branch of every padding element of the block's tiles), and
/// its pieces: reviewed templates.
const FILL_ROLE: &str = include_str!("../templates/rows_fill_role.cuh");
const FILL_SETUP: &str = include_str!("../templates/rows_fill_setup.cuh");
const FILL: &str = include_str!("../templates/rows_fill.cuh");
const FILL_16: &str = include_str!("../templates/rows_fill_16.cuh");
const FILL_OTHER: &str = include_str!("../templates/rows_fill_other.cuh");

/// Step 2: the fill warps (the else-branch of every padding element of the block's tiles).
fn write_fill_role(s: &mut String, g: &Graph, l: &RowsLines) {
    let (mut setup, mut fills) = (String::new(), String::new());
    for &(o, esz) in &l.fills {
        let per = 16 / esz;
        let (ety, zero, zero16) = fill_values(esz, g.node(g.outputs[o].node).dtype, l.checks);
        let (o, name, per_m1, per) =
            (o.to_string(), g.outputs[o].name.as_str(), (per - 1).to_string(), per.to_string());
        let values = [
            ("o", o.as_str()),
            ("name", name),
            ("per", per.as_str()),
            ("per_m1", per_m1.as_str()),
            ("ety", ety),
            ("zero", &zero),
            ("zero16", &zero16),
        ];
        setup.push_str(&render(FILL_SETUP, &values));
        // The zero fill over the padding of the tile's elements `[kf_za, kf_zb)`, fill thread
        // `kf_ft` taking every `kf_fn`-th 16-byte chunk.
        fills.push_str(&render(if esz == 16 { FILL_16 } else { FILL }, &values));
    }
    let mut later_bound = String::new();
    write_bound(&mut later_bound, l, 5, "kf_r0 + kf_ft", "kf_b");
    let mut other = String::new();
    if !l.other.is_empty() {
        let mut stores = String::new();
        for x in &l.other {
            line(&mut stores, 4, x);
        }
        other = render(FILL_OTHER, &[("stores", &stores)]);
    }
    s.push_str(&render(
        FILL_ROLE,
        &[
            ("fill_setup", &setup),
            ("later_bound", &later_bound),
            ("fills", &fills),
            ("other", &other),
            ("later_sync", &sync(l.checks, 4, "kf_bar(2, kf_fn)")),
        ],
    ));
}

/// Steps 3 and 4, the compute warps: a reviewed template.
const COMPUTE_ROLE: &str = include_str!("../templates/rows_compute_role.cuh");

/// Steps 3 and 4: the compute warps' count, arrival, wait, crossing scalars and valid elements.
fn write_compute_role(s: &mut String, l: &RowsLines) {
    let RowsLines { prefetch, body, crossing_lines, .. } = l;
    let (mut further_bound, mut tile_bound) = (String::new(), String::new());
    write_bound(&mut further_bound, l, 3, "kf_r", "kf_b");
    write_bound(&mut tile_bound, l, 4, "kf_r0 + threadIdx.x", "kf_b");
    let (mut prefetch_decls, mut prefetch_loads) = (String::new(), String::new());
    for (k, pf) in prefetch.iter().enumerate() {
        let _ = writeln!(prefetch_decls, "    {} kf_pf{k}[KF_U]; // {}", pf.ty, pf.note);
    }
    if !prefetch.is_empty() {
        prefetch_loads.push_str("                const long long i = (kf_r0 + lo) * cols + kf_tc[kf_u];\n");
        for (k, pf) in prefetch.iter().enumerate() {
            let _ = writeln!(prefetch_loads, "                kf_pf{k}[kf_u] = {};", pf.load);
        }
    }
    let mut crossing = String::new();
    for c in crossing_lines {
        line(&mut crossing, 2, c);
    }
    let mut body_lines = String::new();
    for b in body {
        line(&mut body_lines, 4, b);
    }
    s.push_str(&render(
        COMPUTE_ROLE,
        &[
            ("count_bits", &COUNT_BITS.to_string()),
            ("further_bound", &further_bound),
            ("prefetch_decls", &prefetch_decls),
            ("prefetch_loads", &prefetch_loads),
            ("crossing", &crossing),
            ("tile_bound", &tile_bound),
            ("body", &body_lines),
            ("further_sync", &sync(l.checks, 3, "kf_bar(1, kf_cn)")),
        ],
    ));
}

/// Step 5, the tail: a reviewed template.
const TAIL: &str = include_str!("../templates/rows_tail.cuh");

/// Step 5: the compute warps' reductions in warp order, the ticket of warp 0, and the last
/// block's fold, epilogue (thread 0) and reset of the ticket and the arrival word. `slots` are the
/// kernel's partial slots (none when its only reductions are counts of the mask).
pub(crate) fn write_rows_tail(src: &mut String, slots: &[(Combine, String, String)], epilogue: &[String]) {
    let (mut warp_sums, mut block_sums, mut fold, mut ep) =
        (String::new(), String::new(), String::new(), String::new());
    if !slots.is_empty() {
        let _ = writeln!(warp_sums, "    __shared__ double kf_wr[{}][KF_W];", slots.len());
        for (s, (c, _, _)) in slots.iter().enumerate() {
            let _ = writeln!(
                warp_sums,
                "    for (int o = 16; o > 0; o >>= 1) acc{s} = {};",
                c.expr(&format!("acc{s}"), &format!("__shfl_xor_sync(0xffffffffu, acc{s}, o)"))
            );
            let _ = writeln!(warp_sums, "    if (kf_l == 0) kf_wr[{s}][kf_w] = acc{s};");
        }
        warp_sums.push_str("    kf_bar(1, kf_cn);\n");
        fold.push_str("    // The last block's warp 0 folds every block's sums: lane l takes blocks l, l + 32, ... in order, then\n");
        fold.push_str("    // the warp's fixed-order sum; no float atomics, so the result is bit-identical for a given grid size.\n");
    }
    for (s, (c, init, _)) in slots.iter().enumerate() {
        let _ = writeln!(block_sums, "        double p{s} = {init};");
        let _ = writeln!(
            block_sums,
            "        for (int w = 0; w < kf_cw; ++w) p{s} = {};",
            c.expr(&format!("p{s}"), &format!("kf_wr[{s}][w]"))
        );
        let _ = writeln!(block_sums, "        partials[{s}u * gridDim.x + blockIdx.x] = p{s};");
        let _ = writeln!(fold, "    double r{s} = {init};");
        let _ = writeln!(
            fold,
            "    for (unsigned int b = kf_l; b < gridDim.x; b += 32u) r{s} = {};",
            c.expr(&format!("r{s}"), &format!("((volatile double*)partials)[{s}u * gridDim.x + b]"))
        );
        let _ = writeln!(
            fold,
            "    for (int o = 16; o > 0; o >>= 1) r{s} = {};",
            c.expr(&format!("r{s}"), &format!("__shfl_xor_sync(0xffffffffu, r{s}, o)"))
        );
    }
    for l in epilogue {
        let _ = writeln!(ep, "        {l}");
    }
    let what = if slots.is_empty() { "the count's read" } else { "the block's sums (and the count's read)" };
    src.push_str(&render(
        TAIL,
        &[("warp_sums", &warp_sums), ("block_sums", &block_sums), ("fold", &fold), ("what", what), ("epilogue", &ep)],
    ));
}

/// The rows plan's body (see the module docs): its source up to the tail ([`write_rows_tail`]), and the
/// next free value number. `counts` are the kernel's counts of the mask (see
/// `onepass::OnePass::counts`): the crossing scalars and the epilogue read them as `kf_cntd`.
pub(crate) fn rows_loop(
    em: &mut Emitter,
    g: &Graph,
    an: &Analysis,
    k: usize,
    groups: &[Group],
    counts: &[NodeId],
    first_var: u32,
) -> Result<(String, u32), CodegenError> {
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
    let mut pad_bytes = 0;
    for a in &grp.otherwise {
        let Action::Store { output, values } = a else {
            return Err(internal("rows plan with an else-branch reduction"));
        };
        pad_bytes += values.len() as u64 * g.node(g.outputs[*output].node).dtype.size_bytes() as u64;
        match zero_fill_bytes(em, g, a) {
            Some(esz) => fills.push((*output, esz)),
            None => others.push(a.clone()),
        }
    }
    let mut flat = fresh(first_var);
    flat.row_mode = false;
    run_actions(&mut flat, g, &others)?;
    let next = flat.next_var();
    let (other, u) = flat.into_lines();
    em.uses.absorb(u);
    let (b, bctx) = row_mode_bound(em, g, &info.dims, &dom, groups).ok_or(internal("rows plan without a row bound"))?;
    let mut bound_em = fresh(next);
    let bound = bound_em.eval(b, &bctx)?;
    let next = bound_em.next_var();
    let (bound_lines, u) = bound_em.into_lines();
    em.uses.absorb(u);
    // The then-branch, its loads hoisted into kf_pf.
    let mut then = fresh(next);
    then.prefetch = Some(Vec::new());
    then.plain_stores = true;
    run_actions(&mut then, g, &grp.then)?;
    let prefetch = then.prefetch.take().unwrap_or_default();
    let (next, (body, u)) = (then.next_var(), then.into_lines());
    em.uses.absorb(u);
    // The scalars crossing to the gradient, from `count(mask)` (thread 0's `kf_cntd`).
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
    if !fills.is_empty() {
        em.uses.helpers.insert(crate::cuda::Helper::StoreStreaming);
    }
    let lines = RowsLines {
        bound_lines,
        bound,
        prefetch,
        body,
        fills,
        other,
        pad_bytes,
        checks: em.checks,
        decls,
        crossing_lines,
        rows: em.product(&info.dims[..info.dims.len() - 1]),
        cols: match info.dims.last() {
            Some(&d) => em.dim(d),
            None => "1".to_string(),
        },
    };
    Ok((write_rows_body(g, &lines), next))
}
