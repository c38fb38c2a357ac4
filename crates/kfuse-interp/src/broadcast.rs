//! Broadcast views: reading an operand as if it had a larger (NumPy-broadcast) shape, one chunk
//! of the target's row-major flat indices at a time, without materialising the whole broadcast.
//!
//! Handles operands of the target's exact shape (borrowed, no copy), single-element operands
//! (filled) and general strided broadcasts (gathered with an odometer over the target's index).
//! Does not handle non-contiguous source storage: every tensor in the interpreter is dense
//! row-major.

use std::borrow::Cow;

use crate::InterpError;

/// How an operand's elements map onto a target shape.
#[derive(Clone, Debug)]
enum Layout {
    /// The operand has exactly the target's shape.
    Same,
    /// The operand has one element, repeated everywhere.
    Single,
    /// One stride per target axis (0 where the operand is broadcast along it).
    Strided(Vec<usize>),
}

/// An operand viewed with a target shape.
#[derive(Clone, Debug)]
pub(crate) struct BroadcastView<'a> {
    values: &'a [f64],
    target: Vec<usize>,
    layout: Layout,
}

impl<'a> BroadcastView<'a> {
    /// Views `values` (of `shape`) with `target`; `node` only names the node in errors.
    pub(crate) fn new(node: u32, values: &'a [f64], shape: &[usize], target: &[usize]) -> Result<Self, InterpError> {
        let mismatch = || InterpError::Broadcast { node, operand: shape.to_vec(), target: target.to_vec() };
        if shape.len() > target.len() {
            return Err(mismatch());
        }
        let layout = if shape == target {
            Layout::Same
        } else {
            let offset = target.len() - shape.len();
            for (d, &size) in shape.iter().enumerate() {
                if size != 1 && size != target[d + offset] {
                    return Err(mismatch());
                }
            }
            if values.len() == 1 {
                Layout::Single
            } else {
                let mut strides = vec![0usize; target.len()];
                let mut stride = 1usize;
                for (d, &size) in shape.iter().enumerate().rev() {
                    if size != 1 {
                        strides[d + offset] = stride;
                    }
                    stride = stride.saturating_mul(size);
                }
                Layout::Strided(strides)
            }
        };
        Ok(BroadcastView { values, target: target.to_vec(), layout })
    }

    /// The operand's values at target flat indices `start..start + len` (in bounds of the target).
    pub(crate) fn chunk(&self, start: usize, len: usize) -> Cow<'a, [f64]> {
        match &self.layout {
            Layout::Same => Cow::Borrowed(&self.values[start..start + len]),
            Layout::Single => Cow::Owned(vec![self.values[0]; len]),
            Layout::Strided(strides) => Cow::Owned(gather(self.values, strides, &self.target, start, len)),
        }
    }
}

/// Gathers `len` elements starting at target flat index `start`, walking the target's index like
/// an odometer: one division per chunk, then runs along the last axis.
fn gather(values: &[f64], strides: &[usize], target: &[usize], start: usize, len: usize) -> Vec<f64> {
    let mut out = Vec::with_capacity(len);
    if len == 0 {
        return out;
    }
    let rank = target.len();
    if rank == 0 {
        out.push(values[0]);
        return out;
    }
    let mut index = vec![0usize; rank];
    let mut rest = start;
    for d in (0..rank).rev() {
        index[d] = rest % target[d];
        rest /= target[d];
    }
    let mut offset: usize = index.iter().zip(strides).map(|(i, s)| i * s).sum();
    let last = rank - 1;
    let (n_last, s_last) = (target[last], strides[last]);
    while out.len() < len {
        let run = (n_last - index[last]).min(len - out.len());
        if s_last == 0 {
            out.extend(std::iter::repeat_n(values[offset], run));
        } else {
            // A dense operand's last stride, when not broadcast, is 1.
            out.extend_from_slice(&values[offset..offset + run]);
        }
        index[last] += run;
        offset += run * s_last;
        if index[last] == n_last {
            offset -= n_last * s_last;
            index[last] = 0;
            for d in (0..last).rev() {
                index[d] += 1;
                offset += strides[d];
                if index[d] < target[d] {
                    break;
                }
                offset -= target[d] * strides[d];
                index[d] = 0;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gathers_a_row_broadcast_over_columns_and_rows() {
        // [2, 1] broadcast to [2, 3]: each row repeats its one value.
        let v = [1.0, 2.0];
        let view = BroadcastView::new(0, &v, &[2, 1], &[2, 3]).unwrap();
        assert_eq!(&*view.chunk(0, 6), &[1.0, 1.0, 1.0, 2.0, 2.0, 2.0]);
        assert_eq!(&*view.chunk(2, 3), &[1.0, 2.0, 2.0]);
        // [3] broadcast to [2, 3]: the row repeats.
        let w = [1.0, 2.0, 3.0];
        let view = BroadcastView::new(0, &w, &[3], &[2, 3]).unwrap();
        assert_eq!(&*view.chunk(1, 4), &[2.0, 3.0, 1.0, 2.0]);
        assert!(BroadcastView::new(0, &w, &[3], &[2, 4]).is_err());
    }
}
