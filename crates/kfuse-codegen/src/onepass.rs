//! One-pass masked gradients: recognises a second kernel whose only work is a masked tensor
//! output `where(m, v, 0)` with `v` linear in the scalars of the first kernel's reductions
//! (typically `v = s * h(inputs)` with `s = 1 / max(count(m), 1)`), and plans it as
//!
//! - kernel 0 (the reduction kernel): under `m` it also computes `h = v` evaluated with the scale
//!   `s = 1` and appends `(flat index, h)` to its block's segment of a compact list (any order
//!   within the segment: a shared-memory slot counter, one atomic per warp; no global atomics).
//!   The segment of block `b` starts at the count of elements the threads of blocks `< b` own in
//!   the grid-stride loop, so it always fits; each block stores its segment's length in an extra
//!   partial slot, and the last block records the grid size. Where `m` fails it stores the zeros.
//! - kernel 1: `out[index] = s * h` for the listed entries only, walking the segments (block
//!   `b` takes segments `b, b + grid, ...`, so any grid is correct).
//!
//! So the predicate's inputs (e.g. `target` under `target[.., 3] != 0`) are read once instead of
//! twice. The values are deterministic (each entry's value does not depend on the list order), so
//! runs are bit-identical; they round as `s * h(1)` instead of `h(s)` (a few f32 ulps apart).
//!
//! Not handled (the two-kernel plan is kept): more than one crossing scale that is not a constant
//! multiple of the first, anything non-linear in the scale, a non-zero `else` value, outputs
//! without a small component axis, row-mode (lengths) masks (their second kernel already touches
//! only what it must), and graphs with more kernels or other sinks in the second kernel.

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
pub(crate) fn detect(g: &Graph, an: &Analysis) -> Option<OnePass> {
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
        if guard.as_ref().is_some_and(|x| *x != gd) || is_lengths_mask(g, gd.0) {
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

/// `iota(last) < bound`: the row-mode predicate, whose second kernel needs no list.
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
    /// `u64` Temp: kernel 0's grid size (one list segment per block), written by its last block.
    pub grid: usize,
    /// Kernel 0's partials: slot `length_slot` of block `b` holds the length of `b`'s segment
    /// (the bits of a `u64` in the `f64` slot).
    pub partials: usize,
    pub length_slot: u32,
}

/// Kernel 1 of a one-pass plan: `out[index] = s * h` over the listed entries.
pub(crate) fn emit_rescale_kernel(
    g: &Graph,
    an: &Analysis,
    bufs: &OnePassBuffers,
    opts: &crate::CodegenOptions,
    hash: &kfuse_ir::GraphHash,
    temps_base: usize,
) -> Result<crate::Kernel, crate::CodegenError> {
    use crate::cuda;
    use std::fmt::Write as _;
    let pass = &bufs.pass;
    let name = format!("kf_{}_1", hash.short());
    let o = pass.output;
    let out = g.node(g.outputs[o].node);
    let d = out.dtype;
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
    let mut helpers = std::collections::BTreeSet::new();
    match d {
        kfuse_ir::DType::F16 => {
            helpers.insert(cuda::Helper::F16);
        }
        kfuse_ir::DType::BF16 => {
            helpers.insert(cuda::Helper::BF16);
        }
        _ => {}
    }
    let block = opts.block_size;
    let mut src = String::new();
    let _ = writeln!(src, "// Generated by kfuse-codegen; do not edit.");
    let _ = writeln!(src, "// kernel {name} (2 of 2) of graph {hash}");
    let _ = writeln!(src, "// options: block_size={block}; reduction level 1");
    let _ = writeln!(src, "// one-pass rescale: output {} = n{} * h at the entries kernel 0 listed (h computed there with the scale at 1)", g.outputs[o].name, pass.scale.0);
    src.push('\n');
    for h in &helpers {
        src.push_str(&cuda::helper_source(*h));
    }
    let _ = writeln!(src, "\nextern \"C\" __global__ void __launch_bounds__({block}) {name}(");
    let _ = writeln!(src, "    {}* __restrict__ out{o}, // output {} {}{}", cuda::storage_type(d), g.outputs[o].name, d, g.shape_str(&out.shape));
    let _ = writeln!(src, "    const float* __restrict__ tmp{t}, // n{} f32 scalar from an earlier kernel (the scale)", pass.scale.0);
    src.push_str("    const unsigned long long* __restrict__ list_index, // flat domain indices listed by kernel 0\n");
    let _ = writeln!(src, "    const float* __restrict__ list_values, // {c} unscaled f32 values per entry");
    let _ = writeln!(src, "    const double* __restrict__ partials, // kernel 0's partials: slot {} holds each segment's length (u64 bits)", bufs.length_slot);
    src.push_str("    const unsigned long long* __restrict__ list_grid, // kernel 0's grid size: one list segment per block\n");
    let mut em = Emitter::new(g, Some(an), Mode::Element { kernel: 1 }, an.kernels[1].dims.clone(), 0);
    let n_expr = em.product(&an.kernels[1].dims);
    let syms: Vec<kfuse_ir::SymId> = em.uses.syms.iter().copied().collect();
    for (j, s) in syms.iter().enumerate() {
        let sep = if j + 1 < syms.len() { "," } else { "" };
        let _ = writeln!(src, "    long long sz{}{sep} // size {}", s.0, g.symbols[s.0 as usize]);
    }
    src.push_str(")\n{\n");
    let _ = writeln!(src, "    const long long n = {n_expr};");
    let _ = writeln!(src, "    const float kf_s = tmp{t}[0];");
    src.push_str("    const unsigned long long kf_grid0 = list_grid[0];\n");
    let _ = writeln!(src, "    // Kernel 0 ran kf_grid0 blocks of {block} threads; its thread t owned elements t, t + S, ... (S threads).");
    let _ = writeln!(src, "    const long long kf_s0 = (long long)kf_grid0 * {block}ll, kf_q = n / kf_s0, kf_r = n % kf_s0;");
    src.push_str("    for (unsigned long long seg = blockIdx.x; seg < kf_grid0; seg += gridDim.x) {\n");
    let _ = writeln!(src, "        const long long kf_t = (long long)seg * {block}ll;");
    src.push_str("        const long long kf_base = kf_t * kf_q + (kf_t < kf_r ? kf_t : kf_r); // the segment's first entry\n");
    let _ = writeln!(src, "        const long long kf_len = __double_as_longlong(partials[{}ull * kf_grid0 + seg]);", bufs.length_slot);
    src.push_str("        for (long long kf_j = threadIdx.x; kf_j < kf_len; kf_j += blockDim.x) {\n");
    src.push_str("            const long long j = kf_base + kf_j;\n");
    src.push_str("            const unsigned long long i = list_index[j];\n");
    if let Some(vty) = hv {
        let _ = writeln!(src, "            const {vty} kf_h = reinterpret_cast<const {vty}*>(list_values)[j];");
    }
    match cuda::vector_type(d, c as u64) {
        Some(vty) => {
            let _ = writeln!(src, "            reinterpret_cast<{vty}*>(out{o})[i] = {};", cuda::vector_pack(d, &vals));
        }
        None => {
            for (k, v) in vals.iter().enumerate() {
                let _ = writeln!(src, "            out{o}[i * {c} + {k}] = {};", cuda::store_conversion(d, v));
            }
        }
    }
    src.push_str("        }\n    }\n}\n");
    let dims = &an.kernels[1].dims;
    let mut params = vec![
        crate::Param::Buffer(g.inputs.len() + o),
        crate::Param::Buffer(temps_base + t),
        crate::Param::Buffer(bufs.index),
        crate::Param::Buffer(bufs.values),
        crate::Param::Buffer(bufs.partials),
        crate::Param::Buffer(bufs.grid),
    ];
    params.extend(syms.into_iter().map(crate::Param::Size));
    Ok(crate::Kernel {
        name,
        source: src,
        params,
        block,
        // One block per segment of kernel 0 when the grids agree (kernel 0's batched grid: one
        // resident wave of `1024 / block` blocks per SM); any other grid is also correct.
        grid: crate::GridSpec::Work { work: crate::kernel::size_expr(dims)?, per_block: u64::from(block), max_blocks_per_sm: (1024 / block).max(1) },
        lazy_inputs: Vec::new(),
    })
}
