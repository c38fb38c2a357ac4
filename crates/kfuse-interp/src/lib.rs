//! The CPU reference interpreter: the executable meaning of every kfuse IR op and the oracle
//! that every GPU test compares against.
//!
//! A graph is evaluated node by node over whole tensors (one `Vec<f64>` per live node, dropped
//! after its last use), in parallel with rayon over fixed-size chunks.
//!
//! Semantics, in addition to those documented on [`kfuse_ir::Op`]:
//! - Every float, whatever its storage dtype, is computed in f64 and never rounded inside the
//!   graph; [`run`] rounds outputs to their dtype (to nearest, ties to even, for f16/bf16).
//!   [`run_in`] with [`Precision::F32`] rounds every float value to f32 instead, and an output
//!   that other values use to its dtype, as the kernels compute and store: tests compare the two
//!   to see how far the kernels' rounding alone moves an output ([`Precision::F32Upward`] rounds
//!   upward, so that the errors of a cancelling sum add up instead of cancelling by luck).
//! - `i32` arithmetic is two's-complement: results wrap to `i32` after every op.
//! - `min`/`max`/`clamp` propagate NaN (PyTorch's `torch.minimum`/`maximum`), as do the
//!   `max`/`min` reductions.
//! - `i64` arithmetic is two's-complement too, wrapping at 64 bits (values are kept exactly).
//! - Casts: float to int truncates toward zero and saturates at the target's range (`i32` or
//!   `i64`), NaN giving 0; `i64` to `i32` keeps the low 32 bits; anything to bool is `!= 0` (NaN is
//!   true); bool to a number is 0 or 1.
//! - Reductions of `i64` compute in f64, as the GPU's accumulators do: exact while the values and
//!   partial sums stay within ±2^53.
//! - Empty reductions: `sum`/`count` 0, `mean` NaN, float `max` -inf and `min` +inf, `i32` `max`
//!   `i32::MIN` and `min` `i32::MAX`.
//! - Reductions are bit-for-bit deterministic whatever the thread count (fixed chunks, pairwise
//!   sums in index order).
//!
//! Not handled here: graph transformations (kfuse-passes) and anything on a GPU.
#![forbid(unsafe_code)]

mod broadcast;
mod elementwise;
mod error;
mod eval;
mod layout;
mod pool;
mod reduce;
mod special;

use std::collections::HashSet;
use std::sync::Arc;

use rayon::prelude::*;

use kfuse_ir::{verify, DType, Graph, HostTensor, Op, SymbolBindings, TensorData};

pub use error::InterpError;
pub use eval::Precision;
use eval::{element_count, evaluate_bound, InputValues, Value};

/// One output of a graph as computed: unrounded f64 values (ints exact, but `i64` magnitudes
/// above 2^53 rounded to the nearest f64; bools 0/1), row-major.
#[derive(Clone, Debug, PartialEq)]
pub struct Evaluated {
    /// The output's name.
    pub name: String,
    /// The output's resolved shape.
    pub shape: Vec<usize>,
    /// The output's values in f64, before rounding to the output's dtype.
    pub values: Vec<f64>,
}

/// Evaluates `graph` on `inputs` (pairs of declared name and tensor, in any order) and returns
/// every output's unrounded f64 values, in `graph.outputs` order.
pub fn evaluate(graph: &Graph, inputs: &[(&str, &HostTensor)]) -> Result<Vec<Evaluated>, InterpError> {
    Ok(decode_outputs(graph, evaluate_stored(graph, inputs, Precision::F64)?))
}

/// [`evaluate`] with outputs as the evaluator stores them (`i64` as bits, see `elementwise`).
fn evaluate_stored(
    graph: &Graph,
    inputs: &[(&str, &HostTensor)],
    precision: Precision,
) -> Result<Vec<Evaluated>, InterpError> {
    check_graph(graph)?;
    check_unique(inputs.iter().map(|(n, _)| *n))?;
    for (name, t) in inputs {
        check_length(name, &t.shape, t.len())?;
    }
    let bindings = SymbolBindings::bind(graph, inputs)?;
    let values = graph
        .inputs
        .iter()
        .map(|decl| {
            // `bind` has checked that every declared input is present.
            match inputs.iter().find(|(n, _)| *n == decl.name) {
                Some((_, t)) => InputValues::Host(t),
                None => InputValues::F64(Value { shape: Vec::new(), values: Arc::new(Vec::new()) }),
            }
        })
        .collect::<Vec<_>>();
    evaluate_bound(graph, &bindings, &values, precision)
}

/// Evaluates `graph` like [`evaluate`], then stores each output in its node's dtype (floats
/// rounded to nearest-even, as [`HostTensor::from_f64`] does).
pub fn run(graph: &Graph, inputs: &[(&str, &HostTensor)]) -> Result<Vec<(String, HostTensor)>, InterpError> {
    run_in(graph, inputs, Precision::F64)
}

/// [`run`] with the float values inside the graph computed in `precision` (see [`Precision`]).
pub fn run_in(
    graph: &Graph,
    inputs: &[(&str, &HostTensor)],
    precision: Precision,
) -> Result<Vec<(String, HostTensor)>, InterpError> {
    let evaluated = evaluate_stored(graph, inputs, precision)?;
    Ok(graph
        .outputs
        .iter()
        .zip(evaluated)
        .map(|(o, e)| {
            let tensor = match graph.node(o.node).dtype {
                DType::I64 => HostTensor::new(
                    e.shape,
                    TensorData::I64(e.values.iter().map(|&v| elementwise::dec_i64(v)).collect()),
                ),
                dtype => HostTensor::from_f64(dtype, e.shape, &e.values),
            };
            (e.name, tensor)
        })
        .collect())
}

/// Turns the stored values of `i64` outputs into numbers.
fn decode_outputs(graph: &Graph, mut evaluated: Vec<Evaluated>) -> Vec<Evaluated> {
    for (o, e) in graph.outputs.iter().zip(&mut evaluated) {
        if graph.node(o.node).dtype == DType::I64 {
            e.values.iter_mut().for_each(|v| *v = elementwise::dec_i64(*v) as f64);
        }
    }
    evaluated
}

/// Same as [`evaluate`], but from f64 input values (for gradient checks by finite differences):
/// each input is `(name, shape, values)`. The dtype is taken from the input's declaration; float
/// inputs keep their f64 values unrounded, `i32` and `i64` inputs truncate toward zero
/// (saturating, NaN giving 0) and `bool` inputs are `!= 0`.
pub fn evaluate_f64(graph: &Graph, inputs: &[(&str, Vec<usize>, Vec<f64>)]) -> Result<Vec<Evaluated>, InterpError> {
    check_graph(graph)?;
    check_unique(inputs.iter().map(|(n, _, _)| *n))?;
    for (name, shape, values) in inputs {
        check_length(name, shape, values.len())?;
    }
    // Binding needs tensors of the declared dtype: their shapes bind the symbols, and the values of
    // i32 inputs are checked against layout constraints (lengths, offsets).
    let declared = |name: &str| graph.input_by_name(name).map_or(DType::F32, |id| graph.input(id).dtype);
    let placeholders: Vec<HostTensor> = inputs
        .iter()
        .map(|(name, shape, values)| {
            let dtype = declared(name);
            let values = if dtype == DType::I32 { values.clone() } else { vec![0.0; values.len()] };
            HostTensor::from_f64(dtype, shape.clone(), &values)
        })
        .collect();
    let named: Vec<(&str, &HostTensor)> = inputs.iter().zip(&placeholders).map(|((n, _, _), t)| (*n, t)).collect();
    let bindings = SymbolBindings::bind(graph, &named)?;
    let values = graph
        .inputs
        .iter()
        .map(|decl| {
            let given = inputs.iter().find(|(n, _, _)| *n == decl.name);
            let dtype = decl.dtype;
            let values: Vec<f64> = given
                .map(|(_, _, v)| v.par_iter().map(|&x| elementwise::cast_dtype(x, DType::F32, dtype)).collect())
                .unwrap_or_default();
            InputValues::F64(Value {
                shape: given.map(|(_, s, _)| s.clone()).unwrap_or_default(),
                values: Arc::new(values),
            })
        })
        .collect::<Vec<_>>();
    Ok(decode_outputs(graph, evaluate_bound(graph, &bindings, &values, Precision::F64)?))
}

/// Verifies the graph (after checking what the verifier itself would index out of range).
fn check_graph(graph: &Graph) -> Result<(), InterpError> {
    for (i, n) in graph.nodes.iter().enumerate() {
        if let Op::Stack(l) = n.op {
            if l.0 as usize >= graph.lists.len() {
                return Err(kfuse_ir::IrError::Malformed(format!("v{i}: stack list {} does not exist", l.0)).into());
            }
        }
    }
    verify(graph)?;
    Ok(())
}

fn check_unique<'a>(names: impl Iterator<Item = &'a str>) -> Result<(), InterpError> {
    let mut seen = HashSet::new();
    for name in names {
        if !seen.insert(name) {
            return Err(InterpError::DuplicateInput { name: name.to_string() });
        }
    }
    Ok(())
}

fn check_length(name: &str, shape: &[usize], got: usize) -> Result<(), InterpError> {
    let expected = element_count(|| format!("input {name}"), shape)?;
    if expected != got {
        return Err(InterpError::DataLength { name: name.to_string(), shape: shape.to_vec(), expected, got });
    }
    Ok(())
}
