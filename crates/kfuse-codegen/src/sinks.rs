//! A kernel's sinks as actions: full reductions take partial slots in sink order, tensor
//! outputs become stores, and both are grouped by the predicate that guards them (so sinks
//! under the same mask share one branch). A one-pass kernel also takes the masked gradient's
//! store (the rows plan) or list append (the compacted plan).
//!
//! Not handled here: emitting the actions (see `actions`), where they run (see `shapes`).

use std::collections::HashMap;

use kfuse_ir::{Graph, NodeId, ReduceOp};

use crate::actions::{group_for, resolve_select, Action, Combine, Group};
use crate::analysis::{full_reduce, output_domain, slots_of, KernelInfo, SinkKind};
use crate::emit::{reduce_identity, Coord, Emitter};
use crate::onepass::OnePass;
use crate::CodegenError;

/// A kernel's sinks, as its shape's loop runs them.
pub(crate) struct Sinks {
    /// The partial slots of its full reductions: (combine, initial value, what it reduces).
    pub slots: Vec<(Combine, String, String)>,
    /// The actions, grouped by the predicate that guards them.
    pub groups: Vec<Group>,
    /// The actions run once per row of a row-wise kernel (its deferred row results), grouped
    /// the same way.
    pub row_groups: Vec<Group>,
    /// Per full reduction, the names its epilogue reads (`r<slot>`, or `kf_cntd`).
    pub slot_results: HashMap<NodeId, Vec<String>>,
    /// The header's `// sink:` lines.
    pub notes: Vec<String>,
}

/// The sinks of kernel `info` over the domain `dom`. `mask_counts` are the rows plan's counts
/// of the mask, which take no partial slot: the tail reads the count `kf_cntd` of the arrival
/// word (see `shapes::rows`).
pub(crate) fn collect(
    em: &mut Emitter,
    g: &Graph,
    info: &KernelInfo,
    dom: &[Coord],
    mask_counts: &[NodeId],
) -> Result<Sinks, CodegenError> {
    let mut slots: Vec<(Combine, String, String)> = Vec::new(); // (combine, init, what)
    let mut groups: Vec<Group> = Vec::new();
    let mut row_groups: Vec<Group> = Vec::new();
    let mut slot_results = HashMap::new();
    let mut sink_notes = Vec::new(); // the header's `// sink:` lines
    for sink in &info.sinks {
        let comps: Vec<Option<u64>> = match sink.comps {
            Some(c) => (0..u64::from(c)).map(Some).collect(),
            None => vec![None],
        };
        let ctx_of = |c: Option<u64>| {
            let mut ctx = dom.to_vec();
            ctx.extend(c.map(Coord::Const));
            ctx
        };
        match sink.kind {
            SinkKind::Reduce { node, .. } if mask_counts.contains(&node) => {
                slot_results.insert(node, vec!["kf_cntd".to_string()]);
                sink_notes.push(format!("full reduction n{}: the count of the mask, each block's sum of the clamped bounds (kf_cntd), no partial slot", node.0));
            }
            SinkKind::Reduce { node, .. } => {
                let (op, x, mask) = full_reduce(g, node)
                    .ok_or(CodegenError::Internal { node: node.0, what: "sink is not a reduction" })?;
                let xd = g.node(x).dtype;
                let slot = slots.len() as u32;
                let n_slots = slots_of(op);
                let accs: Vec<String> = (slot..slot + n_slots).map(|s| format!("acc{s}")).collect();
                slot_results.insert(node, (slot..slot + n_slots).map(|s| format!("r{s}")).collect::<Vec<_>>());
                let what = match mask {
                    Some(m) => format!("{} n{} where n{} (n{})", op.name(), x.0, m.0, node.0),
                    None => format!("{} n{} (n{})", op.name(), x.0, node.0),
                };
                slots.push((Combine::of(op), reduce_identity(op, xd), what.clone()));
                if op == ReduceOp::Mean {
                    slots.push((Combine::Sum, "0.0".into(), format!("count of {what}")));
                }
                // A row result deferred here (see `analysis::defer_row_results`): its operand is
                // the domain's rows, updated once per row.
                let per_row = g.node(x).shape.rank() + 1 == dom.len() && sink.comps.is_none();
                sink_notes.push(format!(
                    "full reduction n{} into partial slot {slot}{}{}",
                    node.0,
                    comps_note(sink.comps),
                    if per_row { ", once per row" } else { "" }
                ));
                if per_row {
                    let xctx = dom[..dom.len() - 1].to_vec();
                    let guard = em.reduce_guard(op, x, mask, &xctx);
                    group_for(&mut row_groups, guard).then.push(Action::Update { op, x, mask, xctx, accs });
                    continue;
                }
                for c in comps {
                    let xctx = ctx_of(c);
                    let guard = em.reduce_guard(op, x, mask, &xctx);
                    group_for(&mut groups, guard).then.push(Action::Update { op, x, mask, xctx, accs: accs.clone() });
                }
            }
            SinkKind::Output { index } => {
                let node = g.outputs[index].node;
                // A row result deferred here (see `analysis::defer_row_results`): one value per
                // row of the domain, stored once per row.
                let per_row = output_domain(g, node).0.len() + 1 == dom.len();
                sink_notes.push(format!(
                    "output {}{}{}",
                    g.outputs[index].name,
                    comps_note(sink.comps),
                    if per_row { ", once per row" } else { "" }
                ));
                if per_row {
                    let mut ctx = dom[..dom.len() - 1].to_vec();
                    ctx.extend(sink.comps.map(|_| Coord::Const(0)));
                    group_for(&mut row_groups, None)
                        .then
                        .push(Action::Store { output: index, values: vec![(node, ctx)] });
                    continue;
                }
                let selects: Vec<_> = comps
                    .iter()
                    .map(|&c| resolve_select(em, g, node, ctx_of(c)).map(|(gd, a, b)| (em.canonical(gd.0, gd.1), a, b)))
                    .collect();
                let first_guard = selects.first().and_then(|s| s.as_ref().map(|s| s.0.clone()));
                let shared =
                    first_guard.is_some() && selects.iter().all(|s| s.as_ref().map(|s| &s.0) == first_guard.as_ref());
                if shared {
                    let (then, otherwise): (Vec<_>, Vec<_>) = selects.into_iter().flatten().map(|s| (s.1, s.2)).unzip();
                    let grp = group_for(&mut groups, first_guard);
                    grp.then.push(Action::Store { output: index, values: then });
                    grp.otherwise.push(Action::Store { output: index, values: otherwise });
                } else {
                    let values = comps.iter().map(|&c| (node, ctx_of(c))).collect();
                    group_for(&mut groups, None).then.push(Action::Store { output: index, values });
                }
            }
        }
    }
    Ok(Sinks { slots, groups, row_groups, slot_results, notes: sink_notes })
}

/// One pass: kernel 0 also computes the masked output of `pass`, unscaled, under its guard:
/// stored where it holds (the rows plan) or appended to the block's list (the compacted plan),
/// and the `else` values stored.
pub(crate) fn add_one_pass(
    em: &mut Emitter,
    g: &Graph,
    dom: &[Coord],
    pass: &OnePass,
    groups: &mut Vec<Group>,
) -> Result<(), CodegenError> {
    em.substitutions = pass.substitutions.iter().cloned().collect();
    let out = g.outputs[pass.output].node;
    let (mut then, mut otherwise, mut guard) = (Vec::new(), Vec::new(), None);
    for c in 0..u64::from(pass.comps) {
        let mut ctx = dom.to_vec();
        ctx.push(Coord::Const(c));
        let (gd, a, b) = resolve_select(em, g, out, ctx)
            .ok_or(CodegenError::Internal { node: out.0, what: "one-pass output is not a select" })?;
        guard = Some(em.canonical(gd.0, gd.1));
        then.push(a);
        otherwise.push(b);
    }
    let grp = group_for(groups, guard);
    grp.then.push(match pass.rows {
        true => Action::Store { output: pass.output, values: then },
        false => Action::Append { values: then },
    });
    grp.otherwise.push(Action::Store { output: pass.output, values: otherwise });
    Ok(())
}

/// The header's note of a sink's components per element, if any.
fn comps_note(comps: Option<u32>) -> String {
    comps.map(|c| format!(" ({c} components per element)")).unwrap_or_default()
}
