//! Symbolic shapes: each dimension is a named symbol bound at run time (`B`, `N`) or a constant.

use std::fmt;

/// Index of a dimension symbol in [`crate::Graph::symbols`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SymId(pub u32);

/// One dimension of a shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dim {
    /// A size known only at run time, shared by every tensor that names the same symbol.
    Sym(SymId),
    /// A size fixed in the description (`4` in `f32[B, N, 4]`).
    Const(u64),
}

/// A shape: outermost dimension first, row-major. Rank 0 is a scalar.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct Shape(pub Vec<Dim>);

impl Shape {
    pub fn scalar() -> Shape {
        Shape(Vec::new())
    }
    pub fn rank(&self) -> usize {
        self.0.len()
    }
    pub fn is_scalar(&self) -> bool {
        self.0.is_empty()
    }
    pub fn dims(&self) -> &[Dim] {
        &self.0
    }
    pub fn last(&self) -> Option<Dim> {
        self.0.last().copied()
    }
    /// The shape without its last axis.
    pub fn without_last(&self) -> Shape {
        let mut d = self.0.clone();
        d.pop();
        Shape(d)
    }
    /// The shape with one more axis at the end.
    pub fn with_last(&self, dim: Dim) -> Shape {
        let mut d = self.0.clone();
        d.push(dim);
        Shape(d)
    }
    /// The shape with new axes of size 1 where `axes` has a bit set (bit `a` = axis `a` of the
    /// result), this shape's axes filling the others in order; `None` when a bit is past the
    /// result's rank.
    pub fn unsqueezed(&self, axes: u32) -> Option<Shape> {
        let rank = self.rank() + axes.count_ones() as usize;
        if rank < 32 && axes >> rank != 0 {
            return None;
        }
        let mut rest = self.0.iter();
        let dims: Option<Vec<Dim>> = (0..rank)
            .map(|a| if a < 32 && axes >> a & 1 == 1 { Some(Dim::Const(1)) } else { rest.next().copied() })
            .collect();
        dims.map(Shape)
    }
    /// Writes the shape with symbol names, e.g. `[B, N, 4]`.
    pub fn display<'a>(&'a self, symbols: &'a [String]) -> ShapeDisplay<'a> {
        ShapeDisplay { shape: self, symbols }
    }
    /// Whether this shape broadcasts to `target` without changing `target`.
    pub fn broadcasts_to(&self, target: &Shape) -> bool {
        broadcast_shapes(self, target).as_ref() == Some(target)
    }
}

/// NumPy broadcasting over symbolic dims: dims are aligned from the right; equal dims match, a
/// constant 1 stretches to the other. Two different symbols do not broadcast (they may differ at
/// run time), nor does a symbol with a constant other than 1.
pub fn broadcast_shapes(a: &Shape, b: &Shape) -> Option<Shape> {
    let rank = a.rank().max(b.rank());
    let mut out = Vec::with_capacity(rank);
    for i in 0..rank {
        let da = if i + a.rank() >= rank { Some(a.0[i + a.rank() - rank]) } else { None };
        let db = if i + b.rank() >= rank { Some(b.0[i + b.rank() - rank]) } else { None };
        let d = match (da, db) {
            (Some(x), None) | (None, Some(x)) => x,
            (Some(x), Some(y)) if x == y => x,
            (Some(Dim::Const(1)), Some(y)) => y,
            (Some(x), Some(Dim::Const(1))) => x,
            _ => return None,
        };
        out.push(d);
    }
    Some(Shape(out))
}

/// One group of a reshape (see [`reshape_groups`]): axes `from` of the operand and axes `to` of
/// the result that hold the same elements in the same row-major order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReshapeGroup {
    pub from: std::ops::Range<usize>,
    pub to: std::ops::Range<usize>,
}

impl ReshapeGroup {
    /// Whether the group is one axis of the same size on both sides (a symbolic axis, or a
    /// constant that neither splits nor merges).
    pub fn is_whole(&self) -> bool {
        self.from.len() == 1 && self.to.len() == 1
    }
}

/// How a row-major reshape from `from` to `to` splits and merges axes: consecutive groups, in
/// order, each of axes of `from` and axes of `to` that hold the same elements. A symbolic axis is
/// a group of its own on both sides (its size is known at run time only, so it neither splits nor
/// merges); constant axes group until their products agree; an axis of size 1 on one side may be a
/// group with no axis on the other. `None` when no such grouping exists (the element counts differ,
/// or a symbolic axis would have to split or merge).
pub fn reshape_groups(from: &[Dim], to: &[Dim]) -> Option<Vec<ReshapeGroup>> {
    let (mut i, mut j) = (0, 0);
    let mut groups = Vec::new();
    let one = Dim::Const(1);
    while i < from.len() || j < to.len() {
        let (f, t) = (from.get(i).copied(), to.get(j).copied());
        if f.is_some() && f == t {
            groups.push(ReshapeGroup { from: i..i + 1, to: j..j + 1 });
            (i, j) = (i + 1, j + 1);
            continue;
        }
        if f == Some(one) {
            groups.push(ReshapeGroup { from: i..i + 1, to: j..j });
            i += 1;
            continue;
        }
        if t == Some(one) {
            groups.push(ReshapeGroup { from: i..i, to: j..j + 1 });
            j += 1;
            continue;
        }
        // Constant axes on both sides, until their products agree.
        let (Some(Dim::Const(a)), Some(Dim::Const(b))) = (f, t) else { return None };
        if a == 0 || b == 0 {
            return None;
        }
        let (i0, j0) = (i, j);
        let (mut pa, mut pb) = (a, b);
        (i, j) = (i + 1, j + 1);
        while pa != pb {
            if pa < pb {
                let Some(Dim::Const(c @ 1..)) = from.get(i).copied() else { return None };
                pa = pa.checked_mul(c)?;
                i += 1;
            } else {
                let Some(Dim::Const(c @ 1..)) = to.get(j).copied() else { return None };
                pb = pb.checked_mul(c)?;
                j += 1;
            }
        }
        groups.push(ReshapeGroup { from: i0..i, to: j0..j });
    }
    Some(groups)
}

pub struct ShapeDisplay<'a> {
    shape: &'a Shape,
    symbols: &'a [String],
}

impl fmt::Display for ShapeDisplay<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, d) in self.shape.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            match d {
                Dim::Const(c) => write!(f, "{c}")?,
                Dim::Sym(s) => match self.symbols.get(s.0 as usize) {
                    Some(name) => f.write_str(name)?,
                    None => write!(f, "?{}", s.0)?,
                },
            }
        }
        f.write_str("]")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    fn s(d: &[Dim]) -> Shape {
        Shape(d.to_vec())
    }
    #[test]
    fn broadcasting_follows_numpy_rules() {
        let b = Dim::Sym(SymId(0));
        let n = Dim::Sym(SymId(1));
        let one = Dim::Const(1);
        assert_eq!(broadcast_shapes(&s(&[b, n]), &s(&[n])), Some(s(&[b, n])));
        assert_eq!(broadcast_shapes(&s(&[b, one]), &s(&[b, n])), Some(s(&[b, n])));
        assert_eq!(broadcast_shapes(&s(&[]), &s(&[b, n])), Some(s(&[b, n])));
        assert_eq!(broadcast_shapes(&s(&[b]), &s(&[n])), None);
        assert_eq!(broadcast_shapes(&s(&[Dim::Const(3)]), &s(&[Dim::Const(4)])), None);
        assert_eq!(broadcast_shapes(&s(&[n, Dim::Const(4)]), &s(&[Dim::Const(4)])), Some(s(&[n, Dim::Const(4)])));
    }

    #[test]
    fn reshape_groups_split_and_merge_constant_axes_only() {
        let (b, n) = (Dim::Sym(SymId(0)), Dim::Sym(SymId(1)));
        let c = Dim::Const;
        let g = |from: std::ops::Range<usize>, to: std::ops::Range<usize>| ReshapeGroup { from, to };
        // Attention's heads: [B, N, 64] -> [B, N, 4, 16], and back.
        assert_eq!(
            reshape_groups(&[b, n, c(64)], &[b, n, c(4), c(16)]),
            Some(vec![g(0..1, 0..1), g(1..2, 1..2), g(2..3, 2..4)])
        );
        assert_eq!(reshape_groups(&[b, c(4), c(16)], &[b, c(64)]), Some(vec![g(0..1, 0..1), g(1..3, 1..2)]));
        // Neither side's axes a prefix of the other's: [6, 4] -> [4, 6] is one group.
        assert_eq!(reshape_groups(&[c(6), c(4)], &[c(4), c(6)]), Some(vec![g(0..2, 0..2)]));
        // Size-1 axes on either side.
        assert_eq!(
            reshape_groups(&[b, c(1), n], &[b, n, c(1)]),
            Some(vec![g(0..1, 0..1), g(1..2, 1..1), g(2..3, 1..2), g(3..3, 2..3)])
        );
        assert_eq!(reshape_groups(&[c(2), c(1), c(3)], &[c(6)]), Some(vec![g(0..3, 0..1)]));
        assert_eq!(reshape_groups(&[], &[c(1), c(1)]), Some(vec![g(0..0, 0..1), g(0..0, 1..2)]));
        // A symbolic axis never splits or merges; the element counts must agree.
        assert_eq!(reshape_groups(&[b, n], &[n, b]), None);
        assert_eq!(reshape_groups(&[b, c(4)], &[c(4), b]), None);
        assert_eq!(reshape_groups(&[c(6)], &[c(4)]), None);
        assert_eq!(reshape_groups(&[c(6), n], &[c(3), c(2)]), None);
        assert_eq!(reshape_groups(&[c(0), c(3)], &[c(3), c(0)]), None);
    }
}
