//! Shapes without data: binding a program's symbols from its inputs' dtypes and shapes, the
//! output shapes that follow, and the value checks of lengths/offsets inputs given only those.
//!
//! The messages are [`BindError`]'s, the same the interpreter and the GPU executor give.

use kfuse_ir::{BindError, Constraint, DType, Dim, Graph};

/// One input as the caller describes it: name, dtype, shape.
pub type ShapeArg<'a> = (&'a str, DType, &'a [usize]);

/// The size of each symbol of `graph`, checked against the inputs' names, dtypes, ranks, constant
/// dimensions and agreement between inputs (every input must be given, no unknown ones).
pub fn bind_shapes(graph: &Graph, inputs: &[ShapeArg<'_>]) -> Result<Vec<u64>, BindError> {
    let known = || graph.inputs.iter().map(|i| i.name.as_str()).collect::<Vec<_>>().join(", ");
    for (name, ..) in inputs {
        if graph.input_by_name(name).is_none() {
            return Err(BindError::Unknown { name: name.to_string(), known: known() });
        }
    }
    let mut sizes: Vec<Option<(u64, String)>> = vec![None; graph.symbols.len()];
    for decl in &graph.inputs {
        let decl_str = format!("{}{}", decl.dtype, graph.shape_str(&decl.shape));
        let Some(&(_, dtype, shape)) = inputs.iter().find(|(n, ..)| *n == decl.name) else {
            return Err(BindError::Missing { name: decl.name.clone(), decl: decl_str });
        };
        if dtype != decl.dtype {
            return Err(BindError::DType { name: decl.name.clone(), got: dtype, want: decl.dtype });
        }
        if shape.len() != decl.shape.rank() {
            return Err(BindError::Rank {
                name: decl.name.clone(),
                got: shape.len(),
                want: decl.shape.rank(),
                shape: shape.to_vec(),
                decl: decl_str,
            });
        }
        for (axis, (d, &got)) in decl.shape.0.iter().zip(shape).enumerate() {
            match *d {
                Dim::Const(c) if c as usize != got => {
                    return Err(BindError::ConstDim { name: decl.name.clone(), axis, got, want: c, decl: decl_str });
                }
                Dim::Const(_) => {}
                Dim::Sym(s) => match &sizes[s.0 as usize] {
                    Some((want, first)) if *want != got as u64 => {
                        return Err(BindError::SymbolClash {
                            name: decl.name.clone(),
                            axis,
                            sym: graph.symbols[s.0 as usize].clone(),
                            got,
                            want: *want,
                            first: first.clone(),
                        });
                    }
                    Some(_) => {}
                    None => sizes[s.0 as usize] = Some((got as u64, decl.name.clone())),
                },
            }
        }
    }
    Ok(sizes.into_iter().map(|s| s.map_or(0, |(v, _)| v)).collect())
}

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
