//! Shapes without data: the output shapes that bound symbols give, and the value checks of
//! lengths/offsets inputs copied to the host while the other inputs stay on the device.
//!
//! The messages are [`BindError`]'s, the same the interpreter and the GPU executor give.

use kfuse_ir::{BindError, Constraint, DType, Dim, Graph};

/// The outputs' `(name, dtype, shape)` in declaration order for symbol sizes `sizes`.
pub fn output_shapes(graph: &Graph, sizes: &[u64]) -> Vec<(String, DType, Vec<usize>)> {
    graph
        .outputs
        .iter()
        .map(|o| {
            let n = graph.node(o.node);
            (o.name.clone(), n.dtype, graph.resolve_shape(&n.shape, sizes))
        })
        .collect()
}

/// Checks the values of every lengths/offsets input given in `values` (flat, row-major) against
/// the symbol sizes; the first bad element is the error, naming the input and position.
pub fn check_layouts(graph: &Graph, sizes: &[u64], values: &[(&str, &[i32])]) -> Result<(), BindError> {
    for &c in &graph.constraints {
        let decl = graph.input(c.input());
        let Some(&(_, v)) = values.iter().find(|(n, _)| *n == decl.name) else { continue };
        let name = decl.name.clone();
        let bound = match c.dim() {
            Dim::Const(k) => k,
            Dim::Sym(s) => sizes.get(s.0 as usize).copied().unwrap_or(0),
        };
        let dim = graph.dim_str(c.dim());
        match c {
            Constraint::Lengths { .. } => {
                let shape: Vec<usize> = graph.resolve_shape(&decl.shape, sizes);
                for (i, &value) in v.iter().enumerate() {
                    if value < 0 {
                        return Err(BindError::LengthNegative { name, index: multi_index(i, &shape), value });
                    }
                    if value as u64 > bound {
                        let index = multi_index(i, &shape);
                        return Err(BindError::LengthTooLarge { name, index, value, dim, max: bound });
                    }
                }
            }
            Constraint::Offsets { .. } => {
                let Some(&first) = v.first() else { return Err(BindError::OffsetsEmpty { name }) };
                if first != 0 {
                    return Err(BindError::OffsetStart { name, value: first });
                }
                for (index, w) in v.windows(2).enumerate().map(|(i, w)| (i + 1, w)) {
                    let (prev, value) = (w[0], w[1]);
                    if value < prev {
                        return Err(BindError::OffsetDecrease { name, index, value, prev_index: index - 1, prev });
                    }
                    if value as u64 > bound {
                        return Err(BindError::OffsetPastEnd { name, index, value, dim, total: bound });
                    }
                }
                let index = v.len() - 1;
                let value = v[index];
                if value as u64 != bound {
                    return Err(BindError::OffsetEnd { name, index, value, dim, total: bound });
                }
            }
        }
    }
    Ok(())
}

/// The position of flat element `flat` of a row-major tensor of `shape`, written `3` or `1, 2`.
fn multi_index(flat: usize, shape: &[usize]) -> String {
    let mut rest = flat;
    let mut idx = vec![0usize; shape.len()];
    for (k, &n) in shape.iter().enumerate().rev() {
        if n > 0 {
            idx[k] = rest % n;
            rest /= n;
        }
    }
    if idx.is_empty() {
        return "0".into();
    }
    idx.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(", ")
}
