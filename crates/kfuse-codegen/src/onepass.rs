//! One-pass masked gradients: recognises a second kernel whose only work is a masked tensor
//! output `where(m, v, 0)` with `v` linear in the scalars of the first kernel's reductions
//! (typically `v = s * h(inputs)` with `s = 1 / max(count(m), 1)`), and plans it as
//!
//! one cooperative kernel (every block resident at once):
//!
//! - before its grid barrier, the reduction kernel's loop: under `m` it also computes `h = v`
//!   evaluated with the scale `s = 1` and appends `(flat index, h)` to its block's segment of a
//!   compact list (any order within the segment: a shared-memory slot counter, one atomic per
//!   warp; no global atomics). The segment of block `b` starts at the count of elements the
//!   threads of blocks `< b` own in the grid-stride loop, so it always fits. Where `m` fails it
//!   stores the zeros (in row mode, the lengths layout: one zero fill per row's padding).
//! - the barrier: the last block to take the reduction ticket folds the partials, writes the
//!   scalar outputs and the scale, and releases the others by bumping a generation counter.
//! - after it: each block writes `out[index] = s * h` for the entries it listed itself.
//!
//! So the predicate's inputs (e.g. `target` under `target[.., 3] != 0`) are read once instead of
//! twice, and a loss with its gradient is one launch instead of two. The values are
//! deterministic (each entry's value does not depend on the list order), so runs are
//! bit-identical for a given grid; they round as `s * h(1)` instead of `h(s)` (a few f32 ulps
//! apart).
//!
//! Not handled (the two-kernel plan is kept): more than one crossing scale that is not a constant
//! multiple of the first, anything non-linear in the scale, a non-zero `else` value, outputs
//! without a small component axis, graphs with more kernels or other sinks in the second kernel,
//! and lengths masks unless `CodegenOptions::lengths_gradient` asks for one pass (measured slower
//! on the H100 so far: the warp-per-row second kernel already touches only what it must).

use std::collections::HashMap;

use kfuse_ir::{BinaryOp, Graph, Kind, NodeId, Op, TernaryOp, UnaryOp};

use crate::analysis::{Analysis, SinkKind};
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
    /// Every crossing scalar and the f32 literal it takes when `s = 1`.
    pub substitutions: Vec<(NodeId, String)>,
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
        if guard.as_ref().is_some_and(|x| *x != gd) || (lengths == crate::LengthsGradient::TwoKernels && is_lengths_mask(g, gd.0)) {
            return None;
        }
        guard = Some(gd);
        if degree(g, b, &crossing, &mut degs)? != Deg::Zero || degree(g, a, &crossing, &mut degs)? == Deg::Free {
            return None;
        }
    }
    let (m, _) = guard?;
    if degree(g, m, &crossing, &mut degs)? != Deg::Free {
        return None;
    }
    Some(OnePass { output: *index, comps, scale, substitutions })
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
    /// `u64` flat domain indices of the listed entries.
    pub index: usize,
    /// `f32` unscaled values, `comps` per entry.
    pub values: usize,
}

/// The code after a one-pass kernel's grid barrier: the block writes `out[index] = s * h` for
/// the entries of its own list segment (`kf_list_base`, `kf_list_n`), with the scale `s` that the
/// last block wrote before releasing the barrier (read volatile: it was written during this
/// launch).
pub(crate) fn rescale_lines(g: &Graph, an: &Analysis, pass: &OnePass) -> Result<Vec<String>, crate::CodegenError> {
    use crate::cuda;
    let o = pass.output;
    let d = g.node(g.outputs[o].node).dtype;
    let t = *an.temps.get(&pass.scale).ok_or(crate::CodegenError::Internal { node: pass.scale.0, what: "scale without a temp" })?;
    let c = pass.comps as usize;
    let lanes = ["x", "y", "z", "w"];
    let hv = cuda::vector_type(kfuse_ir::DType::F32, c as u64);
    let vals: Vec<String> = (0..c)
        .map(|k| match hv {
            Some(_) => format!("kf_s * kf_h.{}", lanes[k]),
            None => format!("kf_s * list_values[j * {c} + {k}]"),
        })
        .collect();
    let mut lines = vec![
        format!("// After the barrier: the scale n{} is final; each block rescales the entries it listed.", pass.scale.0),
        format!("const float kf_s = ((volatile float*)tmp{t})[0];"),
        "for (long long kf_j = threadIdx.x; kf_j < (long long)kf_list_n; kf_j += blockDim.x) {".to_string(),
        "    const long long j = kf_list_base + kf_j;".to_string(),
        "    const unsigned long long i = list_index[j];".to_string(),
    ];
    if let Some(vty) = hv {
        lines.push(format!("    const {vty} kf_h = reinterpret_cast<const {vty}*>(list_values)[j];"));
    }
    match cuda::vector_type(d, c as u64) {
        Some(vty) => lines.push(format!("    reinterpret_cast<{vty}*>(out{o})[i] = {}; // {}", cuda::vector_pack(d, &vals), g.outputs[o].name)),
        None => {
            for (k, v) in vals.iter().enumerate() {
                lines.push(format!("    out{o}[i * {c} + {k}] = {};", cuda::store_conversion(d, v)));
            }
        }
    }
    lines.push("}".to_string());
    Ok(lines)
}
