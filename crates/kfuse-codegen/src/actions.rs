//! The actions of a kernel's element loop: reduction updates, stores and one-pass list appends,
//! grouped under the predicate that guards them, and how they are emitted for one element. Also
//! the structural questions about a graph's outputs that the shapes ask (the select that decides
//! an output, the row bound of a lengths mask).
//!
//! Not handled here: where the loop runs (see `shapes`), zero fills (see `fill`).

use kfuse_ir::{BinaryOp, DType, Dim, Graph, NodeId, Op, ReduceOp, TernaryOp};

use crate::cuda::{self, Helper};
use crate::emit::{Coord, Emitter};
use crate::CodegenError;

/// An action of the loop body, run under its group's predicate (or its negation).
#[derive(Clone)]
pub(crate) enum Action {
    Update {
        op: ReduceOp,
        x: NodeId,
        mask: Option<NodeId>,
        xctx: Vec<Coord>,
        accs: Vec<String>,
    },
    Store {
        output: usize,
        values: Vec<(NodeId, Vec<Coord>)>,
    },
    /// Appends `(i, values)` to the block's one-pass list: slot `kf_ln + threadIdx.x` of a
    /// compaction drain (see `onepass`), in shared memory or past its capacity in the block's
    /// global segment.
    Append {
        values: Vec<(NodeId, Vec<Coord>)>,
    },
}

pub(crate) type Guard = Option<(NodeId, Vec<Coord>)>;

pub(crate) struct Group {
    pub guard: Guard,
    pub then: Vec<Action>,
    pub otherwise: Vec<Action>,
}

/// How the final reduction combines one slot.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Combine {
    Sum,
    Max,
    Min,
    Prod,
}

impl Combine {
    /// How the partial results of reduction `op` combine (a mean's sum and count add).
    pub(crate) fn of(op: ReduceOp) -> Combine {
        match op {
            ReduceOp::Max => Combine::Max,
            ReduceOp::Min => Combine::Min,
            ReduceOp::Prod => Combine::Prod,
            ReduceOp::Sum | ReduceOp::Mean | ReduceOp::Count => Combine::Sum,
        }
    }

    /// The C expression of the f64 values `a` and `b` combined (NaN-propagating for max and min).
    pub(crate) fn expr(self, a: &str, b: &str) -> String {
        match self {
            Combine::Sum => format!("{a} + {b}"),
            Combine::Max => format!("kf_max_f64({a}, {b})"),
            Combine::Min => format!("kf_min_f64({a}, {b})"),
            Combine::Prod => format!("{a} * {b}"),
        }
    }

    /// The statement that combines `b` into the accumulator `a`.
    pub(crate) fn update(self, a: &str, b: &str) -> String {
        match self {
            Combine::Sum => format!("{a} += {b};"),
            Combine::Prod => format!("{a} *= {b};"),
            _ => format!("{a} = {};", self.expr(a, b)),
        }
    }

    /// The combine's name in helper functions (`kf_block_<name>`, `kf_row_<name>`).
    pub(crate) fn name(self) -> &'static str {
        match self {
            Combine::Sum => "sum",
            Combine::Max => "max",
            Combine::Min => "min",
            Combine::Prod => "prod",
        }
    }

    /// Whether the combine calls the f64 minimum and maximum helpers.
    pub(crate) fn uses_min_max(self) -> bool {
        matches!(self, Combine::Max | Combine::Min)
    }
}

pub(crate) fn run_actions(em: &mut Emitter, g: &Graph, actions: &[Action]) -> Result<(), CodegenError> {
    for a in actions {
        match a {
            Action::Update { op, x, mask, xctx, accs } => em.reduce_update(*op, *x, *mask, xctx, accs)?,
            Action::Append { values } => {
                let mut vals = Vec::with_capacity(values.len());
                for (n, ctx) in values {
                    let v = em.eval(*n, ctx)?;
                    vals.push(crate::check::poisoned(em.checks, DType::F32, &v));
                }
                for l in append_lines(&vals) {
                    em.push_stmt(l);
                }
            }
            Action::Store { output, values } => {
                let node = g.node(g.outputs[*output].node);
                let d = node.dtype;
                em.note_conversion(d);
                let mut vals = Vec::with_capacity(values.len());
                for (n, ctx) in values {
                    let v = em.eval(*n, ctx)?;
                    vals.push(crate::check::poisoned(em.checks, d, &v));
                }
                let name = &g.outputs[*output].name;
                if !has_component_axis(g, *output) {
                    let line = match em.group_store(*output, d, &vals[0]) {
                        Some(kept) => format!("{kept} // {name}"),
                        None => format!("out{output}[i] = {}; // {name}", cuda::store_conversion(d, &vals[0])),
                    };
                    em.push_stmt(line);
                } else if let Some(vty) = cuda::vector_type(d, vals.len() as u64) {
                    if em.row_mode && !em.plain_stores {
                        em.uses.helpers.insert(Helper::StoreStreaming);
                        em.push_stmt(format!(
                            "kf_st_cs(reinterpret_cast<{vty}*>(out{output}) + i, {}); // {name}",
                            cuda::vector_pack(d, &vals)
                        ));
                    } else {
                        em.push_stmt(format!(
                            "reinterpret_cast<{vty}*>(out{output})[i] = {}; // {name}",
                            cuda::vector_pack(d, &vals)
                        ));
                    }
                } else {
                    let c = vals.len();
                    for (k, v) in vals.iter().enumerate() {
                        em.push_stmt(format!(
                            "out{output}[i * {c} + {k}] = {}; // {name}",
                            cuda::store_conversion(d, v)
                        ));
                    }
                }
            }
        }
    }
    Ok(())
}

/// A compacted drain's append of `(i, vals)` as entry `kf_ln + threadIdx.x` of the block's list
/// (see `shapes::compacted`).
fn append_lines(vals: &[String]) -> Vec<String> {
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

/// Whether output `o` was split into a domain and a small component axis.
pub(crate) fn has_component_axis(g: &Graph, o: usize) -> bool {
    crate::analysis::output_domain(g, g.outputs[o].node).1.is_some()
}

/// The `where(c, a, b)` that decides a tensor output's value at `ctx`, looking through stacking
/// and component access: `(guard, then, else)` with their contexts.
#[allow(clippy::type_complexity)]
pub(crate) fn resolve_select(
    em: &Emitter,
    g: &Graph,
    mut n: NodeId,
    mut ctx: Vec<Coord>,
) -> Option<((NodeId, Vec<Coord>), (NodeId, Vec<Coord>), (NodeId, Vec<Coord>))> {
    loop {
        let node = g.node(n);
        let dims = node.shape.dims().to_vec();
        match node.op {
            Op::Ternary(TernaryOp::Select, c, a, b) => {
                let cc = em.operand_ctx(&dims, &ctx, c);
                let ac = em.operand_ctx(&dims, &ctx, a);
                let bc = em.operand_ctx(&dims, &ctx, b);
                return Some(((c, cc), (a, ac), (b, bc)));
            }
            Op::Stack(l) => {
                let Some(Coord::Const(k)) = ctx.last().cloned() else { return None };
                let p = *g.list(l).get(k as usize)?;
                let inner = &dims[..dims.len() - 1];
                ctx = em.operand_ctx(inner, &ctx[..ctx.len() - 1], p);
                n = p;
            }
            Op::Component { x, index } => {
                ctx.push(Coord::Const(u64::from(index)));
                n = x;
            }
            _ => return None,
        }
    }
}

/// Row mode applies when the domain has at least two axes and all sinks share one predicate of
/// the form `iota(last axis) < b` (what `mask(lengths)` lowers to) with an `i32` bound `b` that
/// does not depend on the last coordinate: `b` and its context, evaluated once per row.
pub(crate) fn row_mode_bound(
    em: &Emitter,
    g: &Graph,
    dims: &[Dim],
    dom: &[Coord],
    groups: &[Group],
) -> Option<(NodeId, Vec<Coord>)> {
    let [grp] = groups else { return None };
    let (m, mctx) = grp.guard.as_ref()?;
    if dims.len() < 2 || mctx.as_slice() != dom {
        return None;
    }
    let node = g.node(*m);
    let Op::Binary(BinaryOp::Lt, a, b) = node.op else { return None };
    let Op::Iota { axis } = g.node(a).op else { return None };
    let last = Coord::Dom(dims.len() as u32 - 1);
    let mdims = node.shape.dims();
    if em.operand_ctx(mdims, mctx, a).get(axis as usize) != Some(&last) {
        return None;
    }
    let bctx = em.operand_ctx(mdims, mctx, b);
    if bctx.contains(&last) || g.node(b).dtype != DType::I32 {
        return None;
    }
    Some((b, bctx))
}

pub(crate) fn group_for(groups: &mut Vec<Group>, guard: Guard) -> &mut Group {
    let pos = match groups.iter().position(|g| g.guard == guard) {
        Some(p) => p,
        None => {
            groups.push(Group { guard, then: Vec::new(), otherwise: Vec::new() });
            groups.len() - 1
        }
    };
    &mut groups[pos]
}
