//! Layout ops: `iota`, component access `x[.., i]` and `stack` along a new last axis.
//! (`x[.., None]` needs no work: the values are shared unchanged.) Does not handle arithmetic.

use rayon::prelude::*;

use crate::broadcast::BroadcastView;
use crate::elementwise::CHUNK;

/// The index along `axis` of every element of a tensor of `shape` (`axis < shape.len()`).
pub(crate) fn iota(shape: &[usize], axis: usize) -> Vec<f64> {
    let len: usize = shape.iter().product();
    let inner: usize = shape[axis + 1..].iter().product();
    let size = shape[axis];
    let mut out = vec![0.0; len];
    out.par_chunks_mut(CHUNK).enumerate().for_each(|(c, dst)| {
        for (j, d) in dst.iter_mut().enumerate() {
            *d = ((c * CHUNK + j) / inner % size) as f64;
        }
    });
    out
}

/// `x[.., index]` of a dense `x` whose last axis has `size` elements; `len` results.
pub(crate) fn component(x: &[f64], size: usize, index: usize, len: usize) -> Vec<f64> {
    let mut out = vec![0.0; len];
    out.par_chunks_mut(CHUNK).enumerate().for_each(|(c, dst)| {
        let base = c * CHUNK;
        for (j, d) in dst.iter_mut().enumerate() {
            *d = x[(base + j) * size + index];
        }
    });
    out
}

/// Stacks `parts` (each viewed at the stack's shape without its last axis, `inner_len` elements)
/// along a new last axis.
pub(crate) fn stack(parts: &[BroadcastView], inner_len: usize) -> Vec<f64> {
    let k = parts.len();
    let mut out = vec![0.0; inner_len * k];
    if k == 0 {
        return out;
    }
    out.par_chunks_mut(CHUNK * k).enumerate().for_each(|(c, dst)| {
        let (start, n) = (c * CHUNK, dst.len() / k);
        for (p, part) in parts.iter().enumerate() {
            let values = part.chunk(start, n);
            for (j, &v) in values.iter().enumerate() {
                dst[j * k + p] = v;
            }
        }
    });
    out
}
