//! A graph's interface: what goes in and what comes out (names, dtypes, shapes in symbols, layout
//! constraints), without the nodes in between. It is all that running a compiled plan needs to
//! bind run-time sizes, check inputs and size outputs.

use crate::{BindError, Constraint, DType, Dim, Graph, Shape};

/// The layout constraint of a ragged-metadata input (`as lengths(N)`, `as offsets(T)`).
pub type LayoutConstraint = Constraint;

/// One declared tensor: an input or an output.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorDecl {
    /// The name the description gives it.
    pub name: String,
    /// Its storage dtype.
    pub dtype: DType,
    /// Its shape, outermost first: constants and symbols (indices into [`Interface::symbols`]).
    pub shape: Vec<Dim>,
    /// For an input that carries ragged metadata, the values it promises.
    pub layout: Option<LayoutConstraint>,
}

/// The inputs and outputs of a graph, in declaration order.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Interface {
    /// Dimension symbol names, indexed by [`crate::SymId`].
    pub symbols: Vec<String>,
    pub inputs: Vec<TensorDecl>,
    pub outputs: Vec<TensorDecl>,
    /// The least size of symbols whose axes are sliced or indexed with constant bounds
    /// (`x[.., 2:7]` of an axis `N` needs `N >= 7`), checked by [`Interface::bind_shapes`].
    pub min_sizes: Vec<MinSize>,
}

/// A symbol's least size: a slice or an index of an axis of that size reads element `min - 1`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct MinSize {
    pub sym: crate::SymId,
    pub min: u64,
    /// What reads it, for the error (`a slice 2:7:1 of axis 1 of f32[B, N]`).
    pub why: String,
}

impl Interface {
    /// The interface of `graph`.
    pub fn of(graph: &Graph) -> Interface {
        let inputs = graph
            .inputs
            .iter()
            .enumerate()
            .map(|(i, inp)| TensorDecl {
                name: inp.name.clone(),
                dtype: inp.dtype,
                shape: inp.shape.0.clone(),
                layout: graph.constraint_of(crate::InputId(i as u32)),
            })
            .collect();
        let outputs = graph
            .outputs
            .iter()
            .map(|o| {
                let n = graph.node(o.node);
                TensorDecl { name: o.name.clone(), dtype: n.dtype, shape: n.shape.0.clone(), layout: None }
            })
            .collect();
        Interface { symbols: graph.symbols.clone(), inputs, outputs, min_sizes: min_sizes(graph) }
    }

    /// The input named `name`.
    pub fn input(&self, name: &str) -> Option<&TensorDecl> {
        self.inputs.iter().find(|d| d.name == name)
    }

    /// The output named `name`.
    pub fn output(&self, name: &str) -> Option<&TensorDecl> {
        self.outputs.iter().find(|d| d.name == name)
    }

    /// Writes one dimension with the symbol names (`N`, `4`).
    pub fn dim_str(&self, dim: Dim) -> String {
        match dim {
            Dim::Const(c) => c.to_string(),
            Dim::Sym(s) => self.symbols.get(s.0 as usize).cloned().unwrap_or_else(|| format!("?{}", s.0)),
        }
    }

    /// Writes a declaration's type, e.g. `f32[B, N, 4]`.
    pub fn decl_str(&self, decl: &TensorDecl) -> String {
        format!("{}{}", decl.dtype, Shape(decl.shape.clone()).display(&self.symbols))
    }

    /// Binds each symbol to the size the inputs' shapes give it, checking names, dtypes, ranks,
    /// constant dims and agreement between inputs (not the values of layout-constrained inputs:
    /// see [`crate::SymbolBindings::bind`]). Returns `sizes[sym]`; a symbol no input mentions binds
    /// to 0.
    pub fn bind_shapes(&self, inputs: &[(&str, DType, &[usize])]) -> Result<Vec<u64>, BindError> {
        let known = || self.inputs.iter().map(|i| i.name.as_str()).collect::<Vec<_>>().join(", ");
        for (name, _, _) in inputs {
            if self.input(name).is_none() {
                return Err(BindError::Unknown { name: name.to_string(), known: known() });
            }
        }
        let mut sizes: Vec<Option<(u64, String)>> = vec![None; self.symbols.len()];
        for decl in &self.inputs {
            let decl_str = self.decl_str(decl);
            let &(_, dtype, shape) = inputs
                .iter()
                .find(|(n, _, _)| *n == decl.name)
                .ok_or_else(|| BindError::Missing { name: decl.name.clone(), decl: decl_str.clone() })?;
            if dtype != decl.dtype {
                return Err(BindError::DType { name: decl.name.clone(), got: dtype, want: decl.dtype });
            }
            if shape.len() != decl.shape.len() {
                return Err(BindError::Rank {
                    name: decl.name.clone(),
                    got: shape.len(),
                    want: decl.shape.len(),
                    shape: shape.to_vec(),
                    decl: decl_str,
                });
            }
            for (axis, (d, &got)) in decl.shape.iter().zip(shape).enumerate() {
                match *d {
                    Dim::Const(c) if c != got as u64 => {
                        return Err(BindError::ConstDim { name: decl.name.clone(), axis, got, want: c, decl: decl_str })
                    }
                    Dim::Const(_) => {}
                    Dim::Sym(s) => match sizes.get_mut(s.0 as usize) {
                        Some(Some((want, first))) if *want != got as u64 => {
                            return Err(BindError::SymbolClash {
                                name: decl.name.clone(),
                                axis,
                                sym: self.dim_str(*d),
                                got,
                                want: *want,
                                first: first.clone(),
                            })
                        }
                        Some(Some(_)) => {}
                        Some(slot) => *slot = Some((got as u64, decl.name.clone())),
                        None => return Err(BindError::UnknownSymbol { name: decl.name.clone(), axis, sym: s.0 }),
                    },
                }
            }
        }
        let sizes: Vec<u64> = sizes.into_iter().map(|s| s.map_or(0, |(v, _)| v)).collect();
        for m in &self.min_sizes {
            let size = sizes.get(m.sym.0 as usize).copied().unwrap_or(0);
            if size < m.min {
                return Err(BindError::SizeTooSmall {
                    sym: self.dim_str(Dim::Sym(m.sym)),
                    size,
                    min: m.min,
                    last: m.min - 1,
                    why: m.why.clone(),
                });
            }
        }
        Ok(sizes)
    }

    /// Checks the values of the lengths/offsets input `decl` (`values` flat, row-major over
    /// `shape`) against the sizes bound to the symbols: the first bad element is the error, naming
    /// the input and its position. An input without a layout constraint passes.
    pub fn check_layout_values(
        &self,
        decl: &TensorDecl,
        values: &[i32],
        shape: &[usize],
        sizes: &[u64],
    ) -> Result<(), BindError> {
        let Some(c) = decl.layout else { return Ok(()) };
        let name = decl.name.clone();
        let bound = match c.dim() {
            Dim::Const(k) => k,
            Dim::Sym(s) => sizes.get(s.0 as usize).copied().unwrap_or(0),
        };
        let dim = self.dim_str(c.dim());
        match c {
            Constraint::Lengths { .. } => {
                for (i, &value) in values.iter().enumerate() {
                    if value < 0 {
                        return Err(BindError::LengthNegative { name, index: multi_index(i, shape), value });
                    }
                    if value as u64 > bound {
                        let index = multi_index(i, shape);
                        return Err(BindError::LengthTooLarge { name, index, value, dim, max: bound });
                    }
                }
            }
            Constraint::Offsets { .. } => {
                let Some(&first) = values.first() else { return Err(BindError::OffsetsEmpty { name }) };
                if first != 0 {
                    return Err(BindError::OffsetStart { name, value: first });
                }
                for (index, w) in values.windows(2).enumerate().map(|(i, w)| (i + 1, w)) {
                    let (prev, value) = (w[0], w[1]);
                    if value < prev {
                        return Err(BindError::OffsetDecrease { name, index, value, prev_index: index - 1, prev });
                    }
                    if value as u64 > bound {
                        return Err(BindError::OffsetPastEnd { name, index, value, dim, total: bound });
                    }
                }
                let index = values.len() - 1;
                let value = values[index];
                if value as u64 != bound {
                    return Err(BindError::OffsetEnd { name, index, value, dim, total: bound });
                }
            }
        }
        Ok(())
    }

    /// The concrete shape of `decl` for run-time `sizes` (`None` when a symbol has no size or a
    /// size does not fit in `usize`).
    pub fn resolve(&self, decl: &TensorDecl, sizes: &[u64]) -> Option<Vec<usize>> {
        decl.shape
            .iter()
            .map(|d| match *d {
                Dim::Const(c) => usize::try_from(c).ok(),
                Dim::Sym(s) => sizes.get(s.0 as usize).and_then(|&v| usize::try_from(v).ok()),
            })
            .collect()
    }
}

/// The least sizes that the slices and indices of `graph` on axes of symbolic size need, the
/// largest per symbol (the first node that needs it names it).
fn min_sizes(graph: &Graph) -> Vec<MinSize> {
    let mut out: Vec<MinSize> = Vec::new();
    for n in &graph.nodes {
        let (x, axis, min, what) = match n.op {
            crate::Op::Select { x, axis, index } => (x, axis, u64::from(index) + 1, format!("index {index}")),
            crate::Op::Slice { x, axis, start, step } => {
                let len = match n.shape.dims().get(axis as usize) {
                    Some(Dim::Const(len)) if *len > 0 => *len,
                    _ => continue,
                };
                let last = u64::from(start) + u64::from(step) * (len - 1);
                (x, axis, last + 1, format!("slice {start}:{}:{step}", last + 1))
            }
            _ => continue,
        };
        let xs = &graph.node(x).shape;
        let Some(Dim::Sym(sym)) = xs.dims().get(axis as usize).copied() else { continue };
        let why = format!("the {what} of axis {axis} of a {}", graph.shape_str(xs));
        match out.iter_mut().find(|m| m.sym == sym) {
            Some(m) if m.min < min => *m = MinSize { sym, min, why },
            Some(_) => {}
            None => out.push(MinSize { sym, min, why }),
        }
    }
    out
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::GraphBuilder;

    fn graph() -> Graph {
        let mut b = GraphBuilder::new();
        let n = Dim::Sym(b.symbol("N"));
        let x = b.input("x", DType::F32, Shape(vec![n, Dim::Const(4)])).unwrap();
        let y = b.input("y", DType::F32, Shape(vec![n])).unwrap();
        let c = b.component(x, 0).unwrap();
        let s = b.binary(crate::BinaryOp::Add, c, y).unwrap();
        b.output("s", s).unwrap();
        b.finish().unwrap()
    }

    #[test]
    fn interface_lists_declarations_and_binds_shapes() {
        let i = Interface::of(&graph());
        assert_eq!(i.symbols, ["N"]);
        assert_eq!(i.inputs.iter().map(|d| i.decl_str(d)).collect::<Vec<_>>(), ["f32[N, 4]", "f32[N]"]);
        assert_eq!(i.decl_str(&i.outputs[0]), "f32[N]");
        let sizes = i.bind_shapes(&[("y", DType::F32, &[5]), ("x", DType::F32, &[5, 4])]).unwrap();
        assert_eq!(sizes, [5]);
        assert_eq!(i.resolve(&i.outputs[0], &sizes), Some(vec![5]));
        let err = i.bind_shapes(&[("x", DType::F32, &[5, 4]), ("y", DType::F32, &[6])]).unwrap_err();
        assert!(matches!(err, BindError::SymbolClash { ref sym, .. } if sym == "N"), "{err}");
        let err = i.bind_shapes(&[("x", DType::F32, &[5, 3]), ("y", DType::F32, &[5])]).unwrap_err();
        assert!(matches!(err, BindError::ConstDim { axis: 1, .. }), "{err}");
        let err = i.bind_shapes(&[("x", DType::F16, &[5, 4]), ("y", DType::F32, &[5])]).unwrap_err();
        assert!(matches!(err, BindError::DType { .. }), "{err}");
        let err = i.bind_shapes(&[("x", DType::F32, &[5, 4])]).unwrap_err();
        assert!(matches!(err, BindError::Missing { ref name, .. } if name == "y"), "{err}");
    }
}
