//! The evaluation loop: walks the live nodes in order, computes each one over whole tensors, and
//! drops every intermediate after its last use.
//!
//! Inputs arrive already bound (see `lib.rs`), either as f64 values or as host tensors that are
//! converted to f64 on first use, except that an input read only through component accesses
//! (`box[.., 0]`) is never converted as a whole. Values are shared through `Arc`, so inputs,
//! `x[.., None]` and same-kind casts cost no copy.

use std::sync::Arc;

use rayon::prelude::*;

use kfuse_ir::{
    DType, Graph, HostTensor, Kind, Literal, NodeId, Op, ReduceAxis, SymbolBindings, TensorData, TernaryOp,
};

use crate::broadcast::BroadcastView;
use crate::elementwise::{self, cast_dtype, cast_value, dec_i64, enc_i64, map1, map3, max_nan, min_nan, wrap_i32};
use crate::pool::BufferPool;
use crate::{layout, reduce, Evaluated, InterpError};

/// A computed tensor: its resolved shape and its values (see `elementwise` for the encoding).
#[derive(Clone, Debug)]
pub(crate) struct Value {
    pub(crate) shape: Vec<usize>,
    pub(crate) values: Arc<Vec<f64>>,
}

/// The element count of `shape`, or an error naming `what` when it overflows.
pub(crate) fn element_count(what: impl FnOnce() -> String, shape: &[usize]) -> Result<usize, InterpError> {
    shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| InterpError::SizeOverflow { what: what(), shape: shape.to_vec() })
}

/// An input's values as given to the evaluator.
pub(crate) enum InputValues<'a> {
    /// A caller's tensor, converted to f64 when first needed.
    Host(&'a HostTensor),
    /// Values already in f64.
    F64(Value),
}

/// Every element as the interpreter stores it, in parallel (exact for every dtype; `i64` as bits).
pub(crate) fn tensor_to_f64(data: &TensorData) -> Vec<f64> {
    match data {
        TensorData::F32(v) => v.par_iter().map(|&x| x as f64).collect(),
        TensorData::F16(v) => v.par_iter().map(|&x| x.to_f64()).collect(),
        TensorData::BF16(v) => v.par_iter().map(|&x| x.to_f64()).collect(),
        TensorData::I32(v) => v.par_iter().map(|&x| x as f64).collect(),
        TensorData::I64(v) => v.par_iter().map(|&x| enc_i64(x)).collect(),
        TensorData::Bool(v) => v.par_iter().map(|&x| if x { 1.0 } else { 0.0 }).collect(),
    }
}

/// Evaluates the graph's outputs, in `graph.outputs` order. `inputs[i]` holds input `i`'s values.
pub(crate) fn evaluate_bound(
    graph: &Graph,
    bindings: &SymbolBindings,
    inputs: &[InputValues],
    precision: Precision,
) -> Result<Vec<Evaluated>, InterpError> {
    let live = graph.live_nodes();
    // Nodes whose every live use is a component access `x[.., i]` (and that are no output).
    let mut only_components = vec![true; graph.nodes.len()];
    for (j, node) in graph.nodes.iter().enumerate() {
        if live[j] {
            node.op.for_each_operand(&graph.lists, |x| {
                if !matches!(node.op, Op::Component { x: cx, .. } if cx == x) {
                    only_components[x.index()] = false;
                }
            });
        }
    }
    for o in &graph.outputs {
        only_components[o.node.index()] = false;
    }
    // Remaining uses of each node by live nodes; outputs are pinned with one extra use.
    let mut remaining = vec![0u32; graph.nodes.len()];
    for (i, node) in graph.nodes.iter().enumerate() {
        if live[i] {
            node.op.for_each_operand(&graph.lists, |x| remaining[x.index()] += 1);
        }
    }
    for o in &graph.outputs {
        remaining[o.node.index()] += 1;
    }
    let mut env: Vec<Option<Value>> = vec![None; graph.nodes.len()];
    let mut pool = BufferPool::default();
    for i in 0..graph.nodes.len() {
        if !live[i] {
            continue;
        }
        let host_input = match graph.nodes[i].op {
            Op::Input(id) => matches!(inputs.get(id.0 as usize), Some(InputValues::Host(_))),
            _ => false,
        };
        let value = if only_components[i] && host_input {
            // Its users read the caller's tensor directly; only the shape is needed here.
            Value { shape: bindings.resolve(graph, &graph.nodes[i].shape), values: Arc::new(Vec::new()) }
        } else {
            eval_node(graph, bindings, inputs, &env, &mut pool, i)?
        };
        let mut value = value;
        let dtype = graph.nodes[i].dtype;
        if precision != Precision::F64 && dtype.kind() == Kind::Float && !value.values.is_empty() {
            // As the GPU computes: every float value rounded to f32 (reductions accumulate in f64
            // and round their result, as the GPU's accumulators do), and an output's rounded to
            // its dtype as stored, since a later kernel that uses it reads the stored tensor.
            let values = Arc::make_mut(&mut value.values);
            match precision {
                Precision::F32Upward => values.iter_mut().for_each(|v| *v = f64::from(f32_upward(*v))),
                _ => values.iter_mut().for_each(|v| *v = *v as f32 as f64),
            }
            if dtype != DType::F32 && graph.outputs.iter().any(|o| o.node.index() == i) {
                *values = HostTensor::from_f64(dtype, vec![values.len()], values).to_f64();
            }
        }
        env[i] = Some(value);
        graph.nodes[i].op.for_each_operand(&graph.lists, |x| {
            remaining[x.index()] -= 1;
            if remaining[x.index()] == 0 {
                // The last holder of shared values gets the buffer back for reuse.
                if let Some(dead) = env[x.index()].take() {
                    if let Ok(buffer) = Arc::try_unwrap(dead.values) {
                        pool.give(buffer);
                    }
                }
            }
        });
    }
    graph
        .outputs
        .iter()
        .map(|o| {
            let v = env[o.node.index()].clone().ok_or_else(|| missing(o.node))?;
            let values = Arc::try_unwrap(v.values).unwrap_or_else(|shared| (*shared).clone());
            Ok(Evaluated { name: o.name.clone(), shape: v.shape, values })
        })
        .collect()
}

/// How the interpreter rounds the float values inside a graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Precision {
    /// Computed in f64, never rounded inside the graph (the reference).
    F64,
    /// Every float node's values rounded to f32, as the generated kernels compute them, and an
    /// output's values rounded to its dtype, as stored (a later kernel that uses an output, a bias
    /// gradient's column sum of the input gradient, reads the stored tensor): the difference from
    /// [`Precision::F64`] shows how much the kernels' rounding alone moves a result (much more
    /// than its magnitude suggests where large terms cancel).
    F32,
    /// [`Precision::F32`] with every float node's values rounded upward (toward +∞) instead of to
    /// nearest: every rounding error has the same sign, so where a sum of computed terms cancels
    /// its result moves by about the sum of the errors' magnitudes. Nearest rounding's errors are
    /// random and may cancel by luck in any one evaluation (an output of one element is one
    /// sample of them); the kernels' own nearest-rounded errors, their f32 accumulators' included,
    /// add up far more slowly (as the square root of their count) than these do.
    F32Upward,
}

/// `v` rounded to the nearest f32 at or above it (NaN and infinities as they are).
fn f32_upward(v: f64) -> f32 {
    let r = v as f32;
    if f64::from(r) < v {
        r.next_up()
    } else {
        r
    }
}

fn missing(node: NodeId) -> InterpError {
    InterpError::Graph(kfuse_ir::IrError::Malformed(format!("v{} was used before it was computed", node.0)))
}

/// Computes node `i` from its (already computed) operands.
fn eval_node(
    graph: &Graph,
    bindings: &SymbolBindings,
    inputs: &[InputValues],
    env: &[Option<Value>],
    pool: &mut BufferPool,
    i: usize,
) -> Result<Value, InterpError> {
    let node = &graph.nodes[i];
    let id = i as u32;
    let shape = bindings.resolve(graph, &node.shape);
    let len = element_count(|| format!("v{i}"), &shape)?;
    let kind = node.dtype.kind();
    let operand = |x: NodeId| env.get(x.index()).and_then(|v| v.as_ref()).ok_or_else(|| missing(x));
    let view = |x: NodeId, target: &[usize]| -> Result<BroadcastView, InterpError> {
        let v = operand(x)?;
        BroadcastView::new(id, &v.values, &v.shape, target)
    };
    let fresh = |values: Vec<f64>| Value { shape: shape.clone(), values: Arc::new(values) };
    let out = |pool: &mut BufferPool| pool.take(len);
    let value = match node.op {
        Op::Input(input) => {
            let v = match inputs.get(input.0 as usize).ok_or_else(|| missing(NodeId(id)))? {
                InputValues::F64(v) => v.clone(),
                InputValues::Host(t) => Value { shape: t.shape.clone(), values: Arc::new(tensor_to_f64(&t.data)) },
            };
            if v.shape != shape {
                return Err(InterpError::Broadcast { node: id, operand: v.shape.clone(), target: shape });
            }
            v
        }
        Op::Const(lit) => {
            let v = match (lit, kind) {
                (Literal::Int(n), Kind::Int) if node.dtype == DType::I64 => enc_i64(n),
                (l, Kind::Int) if node.dtype == DType::I64 => cast_dtype(l.as_f64(), DType::F32, DType::I64),
                (Literal::Int(n), Kind::Int) => wrap_i32(n),
                (Literal::Float(_), Kind::Int) => cast_value(lit.as_f64(), Kind::Float, Kind::Int),
                (l, k) => cast_value(l.as_f64(), Kind::Float, k),
            };
            // A constant is a scalar; a hand-built graph could give it a larger (broadcast) shape.
            fresh(vec![v; len])
        }
        Op::Iota { axis } => {
            let axis = axis as usize;
            if axis >= shape.len() {
                return Err(InterpError::Graph(kfuse_ir::IrError::Malformed(format!(
                    "v{i}: iota axis {axis} out of range"
                ))));
            }
            let mut o = out(pool);
            layout::iota(&mut o, &shape, axis);
            fresh(o)
        }
        Op::Rand { seed } => {
            let s = operand(seed)?;
            let [bits] = s.values.as_slice() else {
                return Err(InterpError::Broadcast { node: id, operand: s.shape.clone(), target: Vec::new() });
            };
            let seed = dec_i64(*bits);
            let mut o = out(pool);
            o.par_iter_mut().enumerate().for_each(|(k, v)| *v = f64::from(kfuse_ir::philox::uniform(seed, k as u64)));
            fresh(o)
        }
        Op::Cast(x) => {
            let from_dtype = graph.node(x).dtype;
            let from = from_dtype.kind();
            let v = operand(x)?;
            let same_bits = if from_dtype == DType::I64 || node.dtype == DType::I64 {
                from_dtype == node.dtype
            } else {
                from == kind || matches!((from, kind), (Kind::Int | Kind::Bool, Kind::Float) | (Kind::Bool, Kind::Int))
            };
            if same_bits {
                // The value is unchanged: share it.
                Value { shape: v.shape.clone(), values: Arc::clone(&v.values) }
            } else {
                let x = view(x, &shape)?;
                let mut o = out(pool);
                let to = node.dtype;
                map1(&mut o, &x, |e| cast_dtype(e, from_dtype, to));
                fresh(o)
            }
        }
        Op::Unary(op, x) => {
            let operand_dtype = graph.node(x).dtype;
            let x = view(x, &shape)?;
            let mut o = out(pool);
            elementwise::unary(id, op, operand_dtype, &mut o, &x)?;
            fresh(o)
        }
        Op::Binary(op, a, b) => {
            let (va, vb) = (view(a, &shape)?, view(b, &shape)?);
            let mut o = out(pool);
            elementwise::binary(id, op, graph.node(a).dtype, &mut o, &va, &vb)?;
            fresh(o)
        }
        Op::Ternary(op, a, b, c) => {
            let (va, vb, vc) = (view(a, &shape)?, view(b, &shape)?, view(c, &shape)?);
            let mut o = out(pool);
            match op {
                TernaryOp::Select => map3(&mut o, &va, &vb, &vc, |c, x, y| if c != 0.0 { x } else { y }),
                TernaryOp::Clamp if node.dtype == DType::I64 => map3(&mut o, &va, &vb, &vc, elementwise::clamp_i64),
                TernaryOp::Fma if node.dtype == DType::I64 => map3(&mut o, &va, &vb, &vc, elementwise::fma_i64),
                TernaryOp::Clamp => map3(&mut o, &va, &vb, &vc, |x, lo, hi| min_nan(max_nan(x, lo), hi)),
                TernaryOp::Fma if node.dtype.kind() == Kind::Int => {
                    map3(&mut o, &va, &vb, &vc, |x, y, z| wrap_i32(x as i64 * y as i64 + z as i64))
                }
                TernaryOp::Fma => map3(&mut o, &va, &vb, &vc, f64::mul_add),
            }
            fresh(o)
        }
        Op::Component { x, index } => {
            let v = operand(x)?;
            let size = v.shape.last().copied().unwrap_or(0);
            if index as usize >= size || v.shape[..v.shape.len() - 1] != shape[..] {
                return Err(InterpError::Broadcast { node: id, operand: v.shape.clone(), target: shape });
            }
            let mut o = out(pool);
            let host = match graph.node(x).op {
                Op::Input(input) => match inputs.get(input.0 as usize) {
                    Some(InputValues::Host(t)) if v.values.len() != t.len() => Some(*t),
                    _ => None,
                },
                _ => None,
            };
            match host {
                // The input was left unconverted (see `evaluate_bound`).
                Some(t) => layout::component_of_host(&mut o, &t.data, size, index as usize),
                None => layout::component(&mut o, &v.values, size, index as usize),
            }
            fresh(o)
        }
        Op::Select { x, .. } | Op::Slice { x, .. } | Op::Transpose { x, .. } => {
            let v = operand(x)?;
            let Some((offset, strides)) = view_strides(node.op, &v.shape, &shape) else {
                return Err(InterpError::Broadcast { node: id, operand: v.shape.clone(), target: shape });
            };
            let mut o = out(pool);
            layout::strided(&mut o, &v.values, &shape, offset, &strides);
            fresh(o)
        }
        Op::Reshape(x) => {
            // Row-major values in another shape: the same values, shared.
            let v = operand(x)?;
            if v.values.len() != len {
                return Err(InterpError::Broadcast { node: id, operand: v.shape.clone(), target: shape });
            }
            Value { shape: shape.clone(), values: Arc::clone(&v.values) }
        }
        Op::Stack(list) => {
            let parts = graph.lists.get(list.0 as usize).ok_or_else(|| missing(NodeId(id)))?;
            let inner = &shape[..shape.len().saturating_sub(1)];
            if shape.last() != Some(&parts.len()) {
                return Err(InterpError::Broadcast { node: id, operand: inner.to_vec(), target: shape.clone() });
            }
            let views = parts.iter().map(|&p| view(p, inner)).collect::<Result<Vec<_>, _>>()?;
            let mut o = out(pool);
            layout::stack(&mut o, &views);
            fresh(o)
        }
        Op::ExpandLast(x) | Op::Unsqueeze { x, .. } => {
            let v = operand(x)?;
            Value { shape: shape.clone(), values: Arc::clone(&v.values) }
        }
        Op::Gather { x, index, axis } => {
            let (xv, iv) = (operand(x)?, operand(index)?);
            let a = axis as usize;
            let fits = a < xv.shape.len()
                && iv.shape == shape
                && (0..shape.len()).all(|d| d == a || xv.shape.get(d) == Some(&shape[d]));
            if !fits {
                return Err(InterpError::Broadcast { node: id, operand: xv.shape.clone(), target: shape });
            }
            let mut o = out(pool);
            let wide = graph.node(index).dtype == DType::I64;
            if let Err(bad) = layout::gather(&mut o, &xv.values, &xv.shape, &iv.values, &shape, a, wide) {
                return Err(InterpError::GatherIndex {
                    node: id,
                    value: bad.value,
                    position: unflatten(bad.position, &shape),
                    axis: a,
                    size: xv.shape[a],
                });
            }
            fresh(o)
        }
        Op::Reduce { op, axis, x, mask } => {
            let mut xv = operand(x)?;
            let x_kind = graph.node(x).dtype.kind();
            // An `i64` operand is reduced as f64 numbers, as the GPU's f64 accumulators do: exact
            // while values and partial sums stay within 2^53.
            let is_i64 = graph.node(x).dtype == DType::I64;
            let decoded;
            if is_i64 {
                decoded = Value {
                    shape: xv.shape.clone(),
                    values: Arc::new(xv.values.par_iter().map(|&v| dec_i64(v) as f64).collect()),
                };
                xv = &decoded;
            }
            let mask_view = mask.map(|m| view(m, &xv.shape)).transpose()?;
            let reduced = match axis {
                ReduceAxis::All => fresh(vec![reduce::reduce_all(op, x_kind, &xv.values, mask_view.as_ref()); len]),
                ReduceAxis::Last => {
                    let row_len = xv.shape.last().copied().unwrap_or(0);
                    if xv.shape.is_empty() || xv.shape[..xv.shape.len() - 1] != shape[..] {
                        return Err(InterpError::Broadcast { node: id, operand: xv.shape.clone(), target: shape });
                    }
                    let mut o = out(pool);
                    reduce::reduce_last(&mut o, op, x_kind, &xv.values, row_len, mask_view.as_ref());
                    fresh(o)
                }
                ReduceAxis::Axes { .. } => {
                    let rank = xv.shape.len();
                    let want = axis.result_shape(&kfuse_ir::Shape(vec![kfuse_ir::Dim::Const(1); rank]));
                    if want.is_none_or(|s| s.rank() != shape.len()) {
                        return Err(InterpError::Broadcast { node: id, operand: xv.shape.clone(), target: shape });
                    }
                    let mut o = out(pool);
                    let reduced = axis.axes(rank);
                    reduce::reduce_axes(&mut o, op, x_kind, &xv.values, &xv.shape, &reduced, mask_view.as_ref())?;
                    fresh(o)
                }
            };
            if is_i64 {
                let values = reduced.values.par_iter().map(|&v| enc_i64(v as i64)).collect();
                return Ok(Value { shape: reduced.shape, values: Arc::new(values) });
            }
            if node.dtype == kfuse_ir::DType::I32 {
                let range = f64::from(i32::MIN)..=f64::from(i32::MAX);
                if let Some(&value) = reduced.values.iter().find(|v| !range.contains(v)) {
                    return Err(InterpError::IntOverflow { node: id, op: op.name(), value });
                }
            }
            reduced
        }
    };
    Ok(value)
}

/// The coordinates of flat position `flat` in a dense tensor of `shape`.
fn unflatten(mut flat: usize, shape: &[usize]) -> Vec<usize> {
    let mut coords = vec![0; shape.len()];
    for (c, &d) in coords.iter_mut().zip(shape).rev() {
        *c = flat % d.max(1);
        flat /= d.max(1);
    }
    coords
}

/// The offset and strides (see `layout::strided`) of a selection, slice or transpose of an
/// operand of shape `xs` with result shape `shape`; `None` when they do not fit (a hand-built
/// graph: binding checked the sizes against the bounds).
fn view_strides(op: Op, xs: &[usize], shape: &[usize]) -> Option<(usize, Vec<usize>)> {
    let mut st = vec![1usize; xs.len()];
    for k in (0..xs.len().saturating_sub(1)).rev() {
        st[k] = st[k + 1] * xs[k + 1];
    }
    let (offset, strides) = match op {
        Op::Select { axis, index, .. } => {
            let (a, i) = (axis as usize, index as usize);
            if a >= xs.len() || i >= xs[a] {
                return None;
            }
            let mut s = st.clone();
            s.remove(a);
            (i * st[a], s)
        }
        Op::Slice { axis, start, step, .. } => {
            let (a, start, step) = (axis as usize, start as usize, step as usize);
            let len = *shape.get(a)?;
            if a >= xs.len() || (len > 0 && start + step * (len - 1) >= xs[a]) {
                return None;
            }
            let mut s = st.clone();
            s[a] *= step;
            (if len > 0 { start * st[a] } else { 0 }, s)
        }
        Op::Transpose { a, b, .. } => {
            let (a, b) = (a as usize, b as usize);
            if b >= xs.len() {
                return None;
            }
            let mut s = st.clone();
            s.swap(a, b);
            (0, s)
        }
        _ => return None,
    };
    let fits = strides.len() == shape.len()
        && match op {
            Op::Transpose { a, b, .. } => {
                let mut t = xs.to_vec();
                t.swap(a as usize, b as usize);
                t == shape
            }
            Op::Select { axis, .. } => {
                let mut t = xs.to_vec();
                t.remove(axis as usize);
                t == shape
            }
            _ => (0..xs.len()).all(|d| Some(&xs[d]) == shape.get(d) || d == slice_axis(op)),
        };
    fits.then_some((offset, strides))
}

fn slice_axis(op: Op) -> usize {
    match op {
        Op::Slice { axis, .. } => axis as usize,
        _ => usize::MAX,
    }
}
