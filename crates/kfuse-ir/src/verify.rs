//! The verifier: checks that a graph obeys the rules the builder enforces, so that a pass that
//! edits a graph by hand (or a bug) is caught before execution. Run it after every pass in tests.

use std::collections::HashSet;

use crate::{
    broadcast_shapes, Constraint, DType, Dim, Graph, IrError, Kind, Op, ReduceAxis, ReduceOp, Shape, TernaryOp,
};

/// Checks operand order, dtypes, shapes, reductions, masks, names and input constraints.
pub fn verify(g: &Graph) -> Result<(), IrError> {
    let bad = |i: usize, why: String| Err(IrError::Malformed(format!("v{i}: {why}")));
    let mut names = HashSet::new();
    for inp in &g.inputs {
        if !names.insert(inp.name.as_str()) {
            return Err(IrError::DuplicateName(inp.name.clone()));
        }
        check_symbols(g, &inp.shape)?;
    }
    let mut constrained = HashSet::new();
    for &c in &g.constraints {
        check_constraint(g, c)?;
        if !constrained.insert(c.input()) {
            let name = g.inputs.get(c.input().0 as usize).map_or(String::new(), |i| i.name.clone());
            return Err(IrError::BadConstraint {
                input: name,
                layout: c.name(),
                why: "it already has a layout".into(),
            });
        }
    }
    let mut out_names = HashSet::new();
    for o in &g.outputs {
        if !out_names.insert(o.name.as_str()) {
            return Err(IrError::DuplicateName(o.name.clone()));
        }
        if o.node.index() >= g.nodes.len() {
            return Err(IrError::Malformed(format!("output {} names a missing node", o.name)));
        }
    }
    for (i, n) in g.nodes.iter().enumerate() {
        let mut early = None;
        n.op.for_each_operand(&g.lists, |x| {
            if x.index() >= i {
                early = Some(x)
            }
        });
        if let Some(x) = early {
            return bad(i, format!("operand v{} does not precede it", x.0));
        }
        check_symbols(g, &n.shape)?;
        let node = |x: crate::NodeId| g.node(x);
        let bshape = |a: &Shape, b: &Shape| broadcast_shapes(a, b);
        let ok = match n.op {
            Op::Input(id) => {
                let decl = g.inputs.get(id.0 as usize);
                decl.is_some_and(|d| d.dtype == n.dtype && d.shape == n.shape)
            }
            Op::Const(_) => n.shape.is_scalar(),
            Op::Iota { axis } => n.dtype == DType::I32 && (axis as usize) < n.shape.rank(),
            Op::Rand { seed } => {
                n.dtype == DType::F32 && node(seed).dtype == DType::I64 && node(seed).shape.is_scalar()
            }
            Op::Cast(x) => node(x).shape == n.shape,
            Op::Unary(op, x) => {
                let d = node(x).dtype;
                node(x).shape == n.shape
                    && if op.is_predicate() { n.dtype == DType::Bool } else { d == n.dtype }
                    && match op {
                        crate::UnaryOp::Not => d == DType::Bool,
                        crate::UnaryOp::BitNot => d.kind() == Kind::Int,
                        op if op.is_float_math() => d.is_float(),
                        _ => d != DType::Bool,
                    }
            }
            Op::Binary(op, a, b) => {
                let (da, db) = (node(a).dtype, node(b).dtype);
                let kind_ok = computes_alike(da, db);
                let dtype_ok = if op.is_comparison() {
                    n.dtype == DType::Bool
                } else if op.is_logical() {
                    da == DType::Bool && n.dtype == DType::Bool
                } else if op.is_bitwise() {
                    da.kind() == Kind::Int && n.dtype.kind() == Kind::Int
                } else {
                    da != DType::Bool && computes_alike(n.dtype, da) && !(op.is_float_only() && da.kind() == Kind::Int)
                };
                kind_ok && dtype_ok && bshape(&node(a).shape, &node(b).shape).as_ref() == Some(&n.shape)
            }
            Op::Ternary(op, a, b, c) => {
                let s = bshape(&node(a).shape, &node(b).shape).and_then(|s| bshape(&s, &node(c).shape));
                let kinds = match op {
                    TernaryOp::Select => {
                        node(a).dtype == DType::Bool
                            && computes_alike(node(b).dtype, node(c).dtype)
                            && computes_alike(node(b).dtype, n.dtype)
                    }
                    TernaryOp::Clamp | TernaryOp::Fma => {
                        [a, b, c].iter().all(|&x| computes_alike(node(x).dtype, n.dtype)) && n.dtype != DType::Bool
                    }
                };
                kinds && s.as_ref() == Some(&n.shape)
            }
            Op::Component { x, index } => {
                let xs = &node(x).shape;
                matches!(xs.last(), Some(Dim::Const(c)) if (index as u64) < c)
                    && xs.without_last() == n.shape
                    && node(x).dtype == n.dtype
            }
            Op::Select { x, axis, index } => {
                let xs = node(x).shape.dims();
                let a = axis as usize;
                a < xs.len()
                    && !matches!(xs[a], Dim::Const(c) if u64::from(index) >= c)
                    && n.shape.dims().len() + 1 == xs.len()
                    && (0..xs.len()).all(|d| d == a || xs[d] == n.shape.dims()[d - usize::from(d > a)])
                    && node(x).dtype == n.dtype
            }
            Op::Slice { x, axis, start, step } => {
                let (xs, ys) = (node(x).shape.dims(), n.shape.dims());
                let a = axis as usize;
                let fits = |len: u64| match xs[a] {
                    Dim::Const(c) => len == 0 || u64::from(start) + u64::from(step) * (len - 1) < c,
                    Dim::Sym(_) => true,
                };
                a < xs.len()
                    && step >= 1
                    && ys.len() == xs.len()
                    && matches!(ys[a], Dim::Const(len) if fits(len))
                    && (0..xs.len()).all(|d| d == a || xs[d] == ys[d])
                    && node(x).dtype == n.dtype
            }
            Op::Transpose { x, a, b } => {
                let mut xs = node(x).shape.dims().to_vec();
                let ok = a < b && (b as usize) < xs.len();
                if ok {
                    xs.swap(a as usize, b as usize);
                }
                ok && xs == n.shape.dims() && node(x).dtype == n.dtype
            }
            Op::Stack(l) => {
                let parts = g.lists.get(l.0 as usize).map(|v| v.as_slice()).unwrap_or(&[]);
                !parts.is_empty()
                    && parts.iter().all(|&p| p.index() < i && computes_alike(node(p).dtype, n.dtype))
                    && n.shape.last() == Some(Dim::Const(parts.len() as u64))
                    && parts.iter().all(|&p| node(p).shape.broadcasts_to(&n.shape.without_last()))
            }
            Op::ExpandLast(x) => node(x).shape.with_last(Dim::Const(1)) == n.shape && node(x).dtype == n.dtype,
            Op::Reshape(x) => {
                crate::reshape_groups(node(x).shape.dims(), n.shape.dims()).is_some() && node(x).dtype == n.dtype
            }
            Op::Unsqueeze { x, axes } => {
                axes != 0 && node(x).shape.unsqueezed(axes).as_ref() == Some(&n.shape) && node(x).dtype == n.dtype
            }
            Op::Gather { x, index, axis } => {
                let (xs, is) = (&node(x).shape, &node(index).shape);
                let a = axis as usize;
                matches!(node(index).dtype, DType::I32 | DType::I64)
                    && a < xs.rank()
                    && is.rank() == xs.rank()
                    && (0..xs.rank()).all(|d| d == a || is.dims()[d] == xs.dims()[d])
                    && n.shape == *is
                    && n.dtype == node(x).dtype
            }
            Op::Reduce { op, axis, x, mask } => {
                let xs = &node(x).shape;
                let shape_ok = !matches!(axis, ReduceAxis::Axes { mask: 0, .. })
                    && axis.result_shape(xs).as_ref() == Some(&n.shape);
                let dtype_ok = match op {
                    ReduceOp::Count => node(x).dtype == DType::Bool && n.dtype == DType::I32,
                    ReduceOp::Mean | ReduceOp::Prod => node(x).dtype.is_float() && n.dtype == node(x).dtype,
                    _ => node(x).dtype != DType::Bool && n.dtype == node(x).dtype,
                };
                let mask_ok = mask.is_none_or(|m| node(m).dtype == DType::Bool && node(m).shape.broadcasts_to(xs));
                shape_ok && dtype_ok && mask_ok
            }
        };
        if !ok {
            return bad(
                i,
                format!(
                    "{:?} with dtype {} and shape {} breaks the typing rules",
                    n.op,
                    n.dtype,
                    g.shape_str(&n.shape)
                ),
            );
        }
    }
    Ok(())
}

/// Checks one constraint on its own: the input exists, is `i32`, is rank 1 for offsets, and the
/// bounding dimension names a symbol of the graph.
pub(crate) fn check_constraint(g: &Graph, c: Constraint) -> Result<(), IrError> {
    let Some(inp) = g.inputs.get(c.input().0 as usize) else {
        return Err(IrError::Malformed(format!("a {} constraint names missing input in{}", c.name(), c.input().0)));
    };
    let bad = |why: String| Err(IrError::BadConstraint { input: inp.name.clone(), layout: c.name(), why });
    if inp.dtype != DType::I32 {
        return bad(format!("it is {}, and {} must be i32", inp.dtype, c.name()));
    }
    if matches!(c, Constraint::Offsets { .. }) && inp.shape.rank() != 1 {
        return bad(format!("it has shape {}, and offsets must have one axis, as in i32[S]", g.shape_str(&inp.shape)));
    }
    check_symbols(g, &Shape(vec![c.dim()]))
}

fn check_symbols(g: &Graph, s: &Shape) -> Result<(), IrError> {
    for d in &s.0 {
        if let Dim::Sym(sym) = d {
            if sym.0 as usize >= g.symbols.len() {
                return Err(IrError::UnknownSymbol(format!("?{}", sym.0)));
            }
        }
    }
    Ok(())
}

/// Whether values of `a` and `b` are computed alike: the same kind and, for integers, the same
/// width (every float dtype computes as one float type; `i32` and `i64` do not mix).
fn computes_alike(a: DType, b: DType) -> bool {
    a.kind() == b.kind() && (a.kind() != Kind::Int || a == b)
}
