//! Layout ops: `iota`, component access `x[.., i]`, `stack` along a new last axis and `gather`.
//! (`x[.., None]` needs no work: the values are shared unchanged.) Does not handle arithmetic.

use kfuse_ir::TensorData;
use rayon::prelude::*;

use crate::broadcast::BroadcastView;
use crate::elementwise::{dec_i64, enc_i64, CHUNK};

/// Writes the index along `axis` of every element of a tensor of `shape` (`axis < shape.len()`).
pub(crate) fn iota(out: &mut [f64], shape: &[usize], axis: usize) {
    let inner: usize = shape[axis + 1..].iter().product();
    let size = shape[axis];
    out.par_chunks_mut(CHUNK).enumerate().for_each(|(c, dst)| {
        for (j, d) in dst.iter_mut().enumerate() {
            *d = ((c * CHUNK + j) / inner % size) as f64;
        }
    });
}

/// Writes `x[.., index]` of a dense `x` whose last axis has `size` elements.
pub(crate) fn component(out: &mut [f64], x: &[f64], size: usize, index: usize) {
    component_of(out, x, size, index, |v| v);
}

/// `x[.., index]` read straight from an input tensor's storage, so that a large input used only
/// through its components is never converted to f64 as a whole.
pub(crate) fn component_of_host(out: &mut [f64], x: &TensorData, size: usize, index: usize) {
    match x {
        TensorData::F32(v) => component_of(out, v, size, index, f64::from),
        TensorData::F16(v) => component_of(out, v, size, index, |h| h.to_f64()),
        TensorData::BF16(v) => component_of(out, v, size, index, |h| h.to_f64()),
        TensorData::I32(v) => component_of(out, v, size, index, f64::from),
        TensorData::I64(v) => component_of(out, v, size, index, enc_i64),
        TensorData::Bool(v) => component_of(out, v, size, index, |b| if b { 1.0 } else { 0.0 }),
    }
}

fn component_of<T: Copy + Sync>(out: &mut [f64], x: &[T], size: usize, index: usize, to_f64: impl Fn(T) -> f64 + Sync) {
    out.par_chunks_mut(CHUNK).enumerate().for_each(|(c, dst)| {
        let base = c * CHUNK;
        for (j, d) in dst.iter_mut().enumerate() {
            *d = to_f64(x[(base + j) * size + index]);
        }
    });
}

/// Writes `parts` (each viewed at the stack's shape without its last axis) stacked along a new
/// last axis; `out` has `parts.len()` elements per inner element.
pub(crate) fn stack(out: &mut [f64], parts: &[BroadcastView]) {
    let k = parts.len();
    if k == 0 {
        return;
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
}

/// `x` (dense, of `shape`) with its axes reordered: axis `k` of the result is axis `perm[k]` of
/// `x` (`torch.permute`), written densely.
pub(crate) fn permute(x: &[f64], shape: &[usize], perm: &[usize]) -> Vec<f64> {
    let mut strides = vec![1usize; shape.len()];
    for a in (0..shape.len().saturating_sub(1)).rev() {
        strides[a] = strides[a + 1] * shape[a + 1];
    }
    let (dims, steps): (Vec<usize>, Vec<usize>) = perm.iter().map(|&a| (shape[a], strides[a])).unzip();
    let mut out = Vec::with_capacity(x.len());
    if x.is_empty() {
        return out;
    }
    let mut index = vec![0usize; dims.len()];
    let mut offset = 0usize;
    for _ in 0..x.len() {
        out.push(x[offset]);
        // The odometer: the last axis moves fastest.
        for d in (0..dims.len()).rev() {
            index[d] += 1;
            offset += steps[d];
            if index[d] < dims[d] {
                break;
            }
            offset -= dims[d] * steps[d];
            index[d] = 0;
        }
    }
    out
}

/// An index of a gather outside its axis: the flat position in the index tensor and the value.
pub(crate) struct BadIndex {
    pub position: usize,
    pub value: i64,
}

/// Writes `torch.gather(x, axis, index)`: `x` of shape `xs` (dense), `index` of shape `is`
/// (equal to `xs` but on `axis`; `i64` values as their bits when `wide`). The first index (in
/// flat order) outside `0..xs[axis]` is returned as an error, and `out` is then unspecified.
pub(crate) fn gather(
    out: &mut [f64],
    x: &[f64],
    xs: &[usize],
    index: &[f64],
    is: &[usize],
    axis: usize,
    wide: bool,
) -> Result<(), BadIndex> {
    let inner: usize = is[axis + 1..].iter().product();
    let (k, size) = (is[axis], xs[axis]);
    let value = |v: f64| if wide { dec_i64(v) } else { v as i64 };
    if let Some(position) = index.par_iter().position_first(|&v| !(0..size as i64).contains(&value(v))) {
        return Err(BadIndex { position, value: value(index[position]) });
    }
    out.par_chunks_mut(CHUNK).enumerate().for_each(|(c, dst)| {
        for (j, d) in dst.iter_mut().enumerate() {
            let e = c * CHUNK + j;
            let (outer, t) = (e / inner / k.max(1), e % inner);
            *d = x[(outer * size + value(index[e]) as usize) * inner + t];
        }
    });
    Ok(())
}

/// A view of `x` (row-major): element `c` of the result (of `shape`) is `x[offset + Σ c_k
/// strides_k]`. Selections, slices and transposes are such views; the caller checks that every
/// element read lies in `x`.
pub(crate) fn strided(out: &mut [f64], x: &[f64], shape: &[usize], offset: usize, strides: &[usize]) {
    out.par_chunks_mut(CHUNK).enumerate().for_each(|(c, dst)| {
        let base = c * CHUNK;
        for (j, d) in dst.iter_mut().enumerate() {
            let (mut rest, mut at) = (base + j, offset);
            for (&n, &s) in shape.iter().zip(strides).rev() {
                if n > 0 {
                    at += rest % n * s;
                    rest /= n;
                }
            }
            *d = x[at];
        }
    });
}
