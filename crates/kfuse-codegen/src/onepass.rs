//! One-pass masked gradients: recognises a second kernel whose only work is a masked tensor
//! output `where(m, v, 0)` with `v` linear in the scalars of the first kernel's reductions
//! (typically `v = s * h(inputs)` with `s = 1 / max(count(m), 1)`), and plans both as one launch.
//!
//! Under a lengths mask (`col < lengths[row]`) the count is the sum of the clamped lengths, so
//! every block adds its rows' share to one arrival word: the rows plan (see `rows`), a
//! cooperative launch with no list and no barrier for the stores of the padding, when every
//! crossing scalar follows from `count(m)` alone.
//!
//! Otherwise (e.g. the predicate `target[.., 3] != 0`), the compacted plan, one cooperative
//! kernel (every block resident at once):
//!
//! - before its grid barrier, the reduction kernel's loop over the predicate's inputs: where
//!   `m` fails it stores the zeros; where it holds, the element's index is queued in shared
//!   memory, and whenever a block's worth is queued (and at the end) full sets of lanes compute
//!   the queued elements (`kf_drain`: the reductions' terms and `h = v` at the scale `s = 1`,
//!   loads direct) and list `(index, h)`: in shared memory, past its capacity in the block's
//!   global segment (which starts at the count of elements the threads of blocks `< b` own in
//!   the grid-stride loop, so it always fits). The valid elements are few in a padded batch; in
//!   place they would idle the other lanes of their warps.
//! - the barrier: each block publishes its partials and arrives; once all have arrived, every
//!   block folds all partials itself in the same fixed order (the same values everywhere; block
//!   0 writes the scalar outputs) and computes the scale. The last block to leave resets it.
//! - after it: each block writes `out[index] = s * h` for the entries it listed itself.
//!
//! So the predicate's inputs (e.g. `target` under `target[.., 3] != 0`) are read once instead of
//! twice, and a loss with its gradient is one launch instead of two. The values are
//! deterministic (each entry's value does not depend on the list order), so runs are
//! bit-identical for a given grid; they round as `s * h(1)` instead of `h(s)` (a few f32 ulps
//! apart). H100, bf16 GIoU step at B=16384, N=256: 33.7 µs (the previous in-place form with a
//! list in global memory and a last-block release: 38.3 µs).
//!
//! Not handled (the two-kernel plan is kept): more than one crossing scale that is not a constant
//! multiple of the first, anything non-linear in the scale, a non-zero `else` value, outputs
//! without a small component axis, graphs with more kernels or other sinks in the second kernel,
//! lengths masks whose scalars need more than the count, and lengths masks when
//! `CodegenOptions::lengths_gradient` asks for two kernels.

use std::collections::HashMap;

use kfuse_ir::{BinaryOp, Graph, Kind, NodeId, Op, ReduceOp, TernaryOp, UnaryOp};

use crate::analysis::{full_reduce, Analysis, SinkKind};
use crate::emit::{Coord, Emitter, Mode};

/// A recognised one-pass plan for kernels 0 and 1.
#[derive(Clone, Debug)]
pub(crate) struct OnePass {
    /// The masked tensor output (index into `graph.outputs`).
    pub output: usize,
    /// Its component count (the small constant last axis).
    pub comps: u32,
    /// The scale `s` (a scalar of kernel 0 crossing to kernel 1 through its Temp buffer).
    pub scale: NodeId,
    /// Every crossing scalar and what the kernel uses for it: the f32 literal it takes when
    /// `s = 1` (compacted plan), or the `kf_c<t>` each block computes (rows plan).
    pub substitutions: Vec<(NodeId, String)>,
    /// The rows plan (a lengths mask; see `rows`): the count slots the crossing scalars need,
    /// taken from the lengths, so no grid barrier and no list.
    pub rows: bool,
    /// The rows plan: kernel 0's full reductions that are `count(m)` of the lengths mask (one
    /// per element where it holds, no mask of their own, no component axis). Every block sums
    /// the clamped lengths itself (`kf_cntd`), so these get no partial slot: they are neither
    /// accumulated per element nor folded, and the tail reads the block's count. Empty
    /// otherwise.
    pub counts: Vec<NodeId>,
}

/// How a value depends on the crossing scalars.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Deg {
    /// The constant 0 (homogeneous of every degree).
    Zero,
    /// Independent of them.
    Free,
    /// Homogeneous of degree 1.
    Linear,
}

/// Recognises the one-pass form (see the module docs).
pub(crate) fn detect(g: &Graph, an: &Analysis, lengths: crate::LengthsGradient) -> Option<OnePass> {
    let [k0, k1] = an.kernels.as_slice() else { return None };
    if k0.level != 0 || k1.level != 1 || k0.dims != k1.dims || k0.slots == 0 || k1.slots != 0 {
        return None;
    }
    if !k1.scalar_outputs.is_empty() || !k1.temp_writes.is_empty() || k0.dims.is_empty() {
        return None;
    }
    let [sink] = k1.sinks.as_slice() else { return None };
    let (SinkKind::Output { index }, Some(comps)) = (&sink.kind, sink.comps) else { return None };
    let out = g.outputs[*index].node;
    if g.node(out).dtype.kind() != Kind::Float {
        return None;
    }
    // The crossing scalars: the first is the scale, the others constant multiples of it.
    let crossing: Vec<NodeId> = an.temps.keys().copied().collect();
    let scale = *crossing.first()?;
    let mut substitutions = vec![(scale, crate::cuda::float_literal(1.0))];
    for &t in &crossing[1..] {
        let v = value_at_unit_scale(g, t, scale)?;
        substitutions.push((t, crate::cuda::float_literal(v)));
    }
    // The output must be where(m, v, 0) with one shared m, v linear, 0 literal.
    let em = Emitter::new(g, Some(an), Mode::Element { kernel: 1 }, k1.dims.clone(), 0);
    let dom: Vec<Coord> = (0..k1.dims.len() as u32).map(Coord::Dom).collect();
    let mut guard = None;
    let mut degs: HashMap<NodeId, Option<Deg>> = HashMap::new();
    for c in 0..u64::from(comps) {
        let mut ctx = dom.clone();
        ctx.push(Coord::Const(c));
        let (gd, (a, _), (b, _)) = crate::kernel::resolve_select(&em, g, out, ctx)?;
        let gd = em.canonical(gd.0, gd.1);
        if guard.as_ref().is_some_and(|x| *x != gd) {
            return None;
        }
        guard = Some(gd);
        if degree(g, b, &crossing, &mut degs)? != Deg::Zero || degree(g, a, &crossing, &mut degs)? == Deg::Free {
            return None;
        }
    }
    let guard = guard?;
    let m = guard.0;
    if degree(g, m, &crossing, &mut degs)? != Deg::Free {
        return None;
    }
    let rows = is_lengths_mask(g, m);
    let mut counts = Vec::new();
    if rows {
        // Every crossing scalar must follow from counts of the mask alone (sums of the clamped
        // lengths), which every block computes itself.
        counts = mask_counts(g, &em, k0, &guard, &dom);
        if lengths == crate::LengthsGradient::TwoKernels || !crossing.iter().all(|&t| counts_only(g, t, &counts)) {
            return None;
        }
        substitutions = crossing.iter().map(|t| (*t, format!("kf_c{}", an.temps[t]))).collect();
    }
    Some(OnePass { output: *index, comps, scale, substitutions, rows, counts })
}

/// Kernel `k0`'s full reductions `count(x)` (no mask of their own, no component axis) whose
/// `x` over the domain is the guard (`m` in the domain's context): one per element where it
/// holds.
fn mask_counts(
    g: &Graph,
    em: &Emitter,
    k0: &crate::analysis::KernelInfo,
    guard: &(NodeId, Vec<Coord>),
    dom: &[Coord],
) -> Vec<NodeId> {
    let count_of_guard = |n: NodeId| match full_reduce(g, n) {
        Some((ReduceOp::Count, x, None)) => {
            g.node(x).shape.dims() == k0.dims.as_slice() && em.canonical(x, dom.to_vec()) == *guard
        }
        _ => false,
    };
    k0.sinks
        .iter()
        .filter_map(|s| match s.kind {
            SinkKind::Reduce { node, .. } if s.comps.is_none() && count_of_guard(node) => Some(node),
            _ => None,
        })
        .collect()
}

/// Whether scalar `t` depends on reductions only through `counts` (see [`mask_counts`]).
fn counts_only(g: &Graph, t: NodeId, counts: &[NodeId]) -> bool {
    let mut stack = vec![t];
    let mut seen = std::collections::HashSet::new();
    while let Some(n) = stack.pop() {
        if !seen.insert(n) {
            continue;
        }
        if let Op::Reduce { .. } = g.node(n).op {
            if !counts.contains(&n) {
                return false;
            }
            continue;
        }
        stack.extend(g.operands(n));
    }
    true
}

/// `iota(last) < bound`: the row-mode predicate of `mask(lengths)`.
fn is_lengths_mask(g: &Graph, m: NodeId) -> bool {
    matches!(g.node(m).op, Op::Binary(BinaryOp::Lt, a, _) if matches!(g.node(a).op, Op::Iota { .. }))
}

/// The f32 value of scalar `t` when `scale` is 1, for `t` built from `scale` and constants by
/// negation, +, -, * and /; `None` otherwise.
fn value_at_unit_scale(g: &Graph, t: NodeId, scale: NodeId) -> Option<f32> {
    if t == scale {
        return Some(1.0);
    }
    let node = g.node(t);
    if node.dtype.kind() != Kind::Float {
        return None;
    }
    match node.op {
        Op::Const(l) => Some(l.as_f64() as f32),
        Op::Unary(UnaryOp::Neg, x) => Some(-value_at_unit_scale(g, x, scale)?),
        Op::Binary(op, a, b) => {
            let (a, b) = (value_at_unit_scale(g, a, scale)?, value_at_unit_scale(g, b, scale)?);
            match op {
                BinaryOp::Add => Some(a + b),
                BinaryOp::Sub => Some(a - b),
                BinaryOp::Mul => Some(a * b),
                BinaryOp::Div => Some(a / b),
                _ => None,
            }
        }
        _ => None,
    }
    .filter(|v| v.is_finite())
}

/// The degree of node `n` in the crossing scalars (`None`: not homogeneous, or a shape of
/// dependence this analysis does not follow).
fn degree(g: &Graph, n: NodeId, crossing: &[NodeId], memo: &mut HashMap<NodeId, Option<Deg>>) -> Option<Deg> {
    if let Some(d) = memo.get(&n) {
        return *d;
    }
    let d = degree_uncached(g, n, crossing, memo);
    memo.insert(n, d);
    d
}

fn degree_uncached(g: &Graph, n: NodeId, crossing: &[NodeId], memo: &mut HashMap<NodeId, Option<Deg>>) -> Option<Deg> {
    use Deg::*;
    if crossing.contains(&n) {
        return Some(Linear);
    }
    let node = g.node(n);
    let mut deg = |x: NodeId| degree(g, x, crossing, memo);
    let free = |d: Deg| matches!(d, Free | Zero);
    match node.op {
        Op::Const(l) => Some(if node.dtype.kind() == Kind::Float && l.as_f64() == 0.0 { Zero } else { Free }),
        Op::Input(_) | Op::Iota { .. } => Some(Free),
        Op::Component { x, .. } | Op::ExpandLast(x) => deg(x),
        Op::Unary(UnaryOp::Neg, x) => deg(x),
        Op::Cast(x) if node.dtype.kind() == Kind::Float && g.node(x).dtype.kind() == Kind::Float => deg(x),
        Op::Unary(_, x) | Op::Cast(x) => deg(x).filter(|d| free(*d)).map(|_| Free),
        Op::Binary(op, a, b) => {
            let (da, db) = (deg(a)?, deg(b)?);
            match op {
                BinaryOp::Add | BinaryOp::Sub => match (da, db) {
                    (Zero, d) | (d, Zero) => Some(d),
                    (x, y) if x == y => Some(x),
                    _ => None,
                },
                BinaryOp::Mul => match (da, db) {
                    (Zero, _) | (_, Zero) => Some(Zero),
                    (Free, d) | (d, Free) => Some(d),
                    _ => None,
                },
                BinaryOp::Div => match (da, db) {
                    (Zero, Free) => Some(Zero),
                    (d, Free) => Some(d),
                    _ => None,
                },
                _ if free(da) && free(db) => Some(Free),
                _ => None,
            }
        }
        Op::Ternary(TernaryOp::Select, c, a, b) => {
            if !free(deg(c)?) {
                return None;
            }
            match (deg(a)?, deg(b)?) {
                (Zero, d) | (d, Zero) => Some(d),
                (x, y) if x == y => Some(x),
                (Free, Free) => Some(Free),
                _ => None,
            }
        }
        Op::Ternary(_, a, b, c) => (free(deg(a)?) && free(deg(b)?) && free(deg(c)?)).then_some(Free),
        Op::Stack(l) => {
            let mut acc = Zero;
            for &p in g.list(l) {
                acc = match (acc, deg(p)?) {
                    (Zero, d) | (d, Zero) => d,
                    (x, y) if x == y => x,
                    _ => return None,
                };
            }
            Some(acc)
        }
        Op::Reduce { x, mask, .. } => {
            let dm = match mask {
                Some(m) => deg(m)?,
                None => Free,
            };
            (free(deg(x)?) && free(dm) && !node.shape.is_scalar()).then_some(Free)
        }
    }
}

/// Buffers of a one-pass plan (indices into `Plan::buffers`).
#[derive(Clone, Debug)]
pub(crate) struct OnePassBuffers {
    pub pass: OnePass,
    /// The compacted plan's list: `u64` flat domain indices of the entries past the shared
    /// memory, and their `f32` unscaled values, `comps` per entry (`None`: the rows plan).
    pub list: Option<(usize, usize)>,
}

/// Entries of a block's one-pass list held in shared memory; more go to its global segment.
const LIST_SHARED: u32 = 256;

/// Inside the batched loop, after each batch: full sets of `blockDim.x` queued elements are
/// computed at once (block-uniform: every thread reads the same queue length between barriers).
pub(crate) const QUEUE_DRAIN: &[&str] = &[
    "__syncthreads(); // the batch's queue appends are visible",
    "while (kf_qn >= (int)blockDim.x) kf_drain((int)blockDim.x);",
    "__syncthreads(); // every thread has read kf_qn before the next batch appends",
];

/// After the batched loop: the queue's rest.
pub(crate) const FINAL_DRAIN: &str =
    "    __syncthreads();\n    if (kf_qn > 0) kf_drain(kf_qn); // the rest of the queue (block-uniform)\n";

/// The compaction's shared state, the block's global list segment and `kf_drain` (whose body is
/// `drain`: the queued group's work for element `i`, loads direct). Block `b`'s global segment
/// starts at the count of elements the threads of blocks `< b` own in the grid-stride loop
/// (`S` threads in all, `T = b * block`; thread `t` owns `n / S` elements, one more when
/// `t < n % S`), so its entries always fit there.
pub(crate) fn write_compaction_state(src: &mut String, block: u32, batch: u32, comps: u32, drain: &[String]) {
    use std::fmt::Write as _;
    src.push_str(
        "    // One pass, compacted: an element whose predicate holds is queued (kf_q) and computed later by a full\n",
    );
    src.push_str("    // set of lanes (kf_drain), so that the few valid elements do not idle the other lanes of their warps; its\n");
    src.push_str("    // unscaled values are listed in shared memory (kf_li, kf_lv), past KF_LCAP entries in the block's global segment.\n");
    let _ = writeln!(src, "    constexpr int KF_LCAP = {LIST_SHARED};");
    let _ = writeln!(
        src,
        "    __shared__ long long kf_q[{}]; // queued flat indices: at most a batch's worth and a drain's rest",
        block * (batch + 1)
    );
    src.push_str("    __shared__ int kf_qn, kf_ln; // queued, listed\n");
    src.push_str("    __shared__ long long kf_li[KF_LCAP];\n");
    let _ = writeln!(src, "    __shared__ float kf_lv[KF_LCAP * {comps}];");
    src.push_str("    if (threadIdx.x == 0) { kf_qn = 0; kf_ln = 0; }\n    __syncthreads();\n");
    src.push_str("    const long long kf_list_s = (long long)gridDim.x * blockDim.x, kf_list_t = (long long)blockIdx.x * blockDim.x;\n");
    src.push_str("    const long long kf_list_r = n % kf_list_s;\n");
    src.push_str("    const long long kf_list_base = kf_list_t * (n / kf_list_s) + (kf_list_t < kf_list_r ? kf_list_t : kf_list_r); // elements of the threads before this block\n");
    src.push_str(
        "    // Threads [0, kf_count) compute the last kf_count queued elements; every thread of the block calls it.\n",
    );
    src.push_str("    auto kf_drain = [&](int kf_count) {\n");
    src.push_str("        const int kf_q0 = kf_qn - kf_count;\n");
    src.push_str("        if ((int)threadIdx.x < kf_count) {\n");
    src.push_str("            const long long i = kf_q[kf_q0 + (int)threadIdx.x];\n");
    for l in drain {
        let _ = writeln!(src, "            {l}");
    }
    src.push_str("        }\n        __syncthreads();\n");
    src.push_str(
        "        if (threadIdx.x == 0) { kf_qn = kf_q0; kf_ln += kf_count; }\n        __syncthreads();\n    };\n",
    );
}

/// A drain's append of `(i, vals)` as entry `kf_ln + threadIdx.x` of the block's list.
pub(crate) fn append_lines(vals: &[String]) -> Vec<String> {
    let c = vals.len();
    let mut lines = vec![
        "const int kf_slot = kf_ln + (int)threadIdx.x; // this entry's number in the block's list".to_string(),
        "if (kf_slot < KF_LCAP) {".to_string(),
        "    kf_li[kf_slot] = i;".to_string(),
    ];
    lines.extend(vals.iter().enumerate().map(|(k, v)| format!("    kf_lv[kf_slot * {c} + {k}] = {v};")));
    lines.push("} else {".to_string());
    lines.push("    const long long kf_j = kf_list_base + (kf_slot - KF_LCAP);".to_string());
    lines.push("    list_index[kf_j] = (unsigned long long)i;".to_string());
    lines.extend(vals.iter().enumerate().map(|(k, v)| format!("    list_values[kf_j * {c} + {k}] = {v};")));
    lines.push("}".to_string());
    lines
}

/// The code after a one-pass kernel's grid barrier: the block writes `out[index] = s * h` for
/// the entries of its own list (shared memory, then its global segment), with the scale `s`
/// (`kf_scale`) that every block computed past the barrier.
pub(crate) fn rescale_lines(g: &Graph, pass: &OnePass) -> Vec<String> {
    use crate::cuda;
    let o = pass.output;
    let d = g.node(g.outputs[o].node).dtype;
    let c = pass.comps as usize;
    let vals: Vec<String> = (0..c).map(|k| format!("kf_s * kf_h[{k}]")).collect();
    let mut lines = vec![
        format!(
            "// After the barrier: the scale n{} is final; each block rescales the entries it listed.",
            pass.scale.0
        ),
        "const float kf_s = kf_scale;".to_string(),
        "for (int kf_j = threadIdx.x; kf_j < kf_ln; kf_j += blockDim.x) {".to_string(),
        "    long long i;".to_string(),
        format!("    float kf_h[{c}];"),
        "    if (kf_j < KF_LCAP) {".to_string(),
        "        i = kf_li[kf_j];".to_string(),
    ];
    lines.extend((0..c).map(|k| format!("        kf_h[{k}] = kf_lv[kf_j * {c} + {k}];")));
    lines.push("    } else {".to_string());
    lines.push("        const long long j = kf_list_base + (kf_j - KF_LCAP);".to_string());
    lines.push("        i = (long long)list_index[j];".to_string());
    lines.extend((0..c).map(|k| format!("        kf_h[{k}] = list_values[j * {c} + {k}];")));
    lines.push("    }".to_string());
    match cuda::vector_type(d, c as u64) {
        Some(vty) => lines.push(format!(
            "    reinterpret_cast<{vty}*>(out{o})[i] = {}; // {}",
            cuda::vector_pack(d, &vals),
            g.outputs[o].name
        )),
        None => {
            for (k, v) in vals.iter().enumerate() {
                lines.push(format!("    out{o}[i * {c} + {k}] = {};", cuda::store_conversion(d, v)));
            }
        }
    }
    lines.push("}".to_string());
    lines
}
