//! Reductions (`sum`, `mean`, `max`, `min`, `count`, `prod`) over every element, along the last axis or
//! over any set of axes, optionally masked, computed in f64 with an order that does not depend on
//! the thread count.
//!
//! Order: a row (or a fixed chunk of `CHUNK` elements, for a reduction over everything) is
//! summed pairwise by index halves; chunk results are combined pairwise in index order. Chunk
//! boundaries are fixed, so results are bit-identical whatever rayon's pool size. A reduction
//! over a set of axes moves them last (kept axes first, each group in its order) and reduces
//! the rows so formed, in row-major order of the reduced axes.
//!
//! A product multiplies in index order (each chunk's, then the chunks' products in order).
//! Masked-out elements are skipped before any arithmetic, so NaN there does not propagate.
//! Empty reductions: `sum` and `count` give 0, `prod` 1, `mean` NaN (0/0), float `max` -inf and `min` +inf.
//! `i32` `max`/`min` of nothing give `i32::MIN`/`i32::MAX` (the identities an `i32` can hold).
//! `i32` counts are exact (64-bit) here (a `sum` of `i32` is an `i64`: its operand is cast); one
//! outside the `i32` range is refused by the evaluator ([`crate::InterpError::IntOverflow`]),
//! never wrapped. Not handled here: broadcasting of `x` itself (a reduction's operand is always a
//! whole tensor).

use rayon::prelude::*;

use kfuse_ir::{Kind, ReduceOp};

use crate::broadcast::BroadcastView;
use crate::elementwise::{max_nan, min_nan, CHUNK};

/// Below this many elements a pairwise sum adds sequentially.
const PAIRWISE_LEAF: usize = 32;

/// What one slice of a reduction contributes.
#[derive(Clone, Copy, Debug)]
struct Partial {
    /// Sum of the included float values.
    sum: f64,
    /// Wrapping sum of the included integer values.
    int_sum: i64,
    /// How many elements the mask lets in.
    included: u64,
    /// How many included elements are non-zero (`count`).
    trues: u64,
    /// NaN-propagating max / min of the included values.
    max: f64,
    min: f64,
    /// Product of the included values, in index order.
    prod: f64,
}

impl Partial {
    const EMPTY: Partial =
        Partial { sum: 0.0, int_sum: 0, included: 0, trues: 0, max: f64::NEG_INFINITY, min: f64::INFINITY, prod: 1.0 };
}

/// Pairwise sum of `x[i]` where `mask[i]` is non-zero (or of all of `x`).
fn pairwise_sum(x: &[f64], mask: Option<&[f64]>) -> f64 {
    if x.len() <= PAIRWISE_LEAF {
        return match mask {
            None => x.iter().fold(0.0, |s, &v| s + v),
            Some(m) => x.iter().zip(m).filter(|(_, &k)| k != 0.0).fold(0.0, |s, (&v, _)| s + v),
        };
    }
    let half = x.len() / 2;
    let (lo, hi) = x.split_at(half);
    let (mlo, mhi) = match mask {
        None => (None, None),
        Some(m) => {
            let (a, b) = m.split_at(half);
            (Some(a), Some(b))
        }
    };
    pairwise_sum(lo, mlo) + pairwise_sum(hi, mhi)
}

/// The partial result of `op` over one contiguous slice (`mask` of equal length).
fn reduce_slice(op: ReduceOp, kind: Kind, x: &[f64], mask: Option<&[f64]>) -> Partial {
    let included_values = || x.iter().zip(0..).filter(move |(_, i)| mask.is_none_or(|m| m[*i] != 0.0)).map(|(&v, _)| v);
    let included = match mask {
        None => x.len() as u64,
        Some(m) => m.iter().filter(|&&k| k != 0.0).count() as u64,
    };
    let mut p = Partial { included, ..Partial::EMPTY };
    match (op, kind) {
        (ReduceOp::Sum | ReduceOp::Mean, Kind::Int) => {
            p.int_sum = included_values().fold(0i64, |s, v| s.wrapping_add(v as i64));
        }
        (ReduceOp::Sum | ReduceOp::Mean, _) => p.sum = pairwise_sum(x, mask),
        (ReduceOp::Max, _) => p.max = included_values().fold(f64::NEG_INFINITY, max_nan),
        (ReduceOp::Min, _) => p.min = included_values().fold(f64::INFINITY, min_nan),
        (ReduceOp::Count, _) => p.trues = included_values().filter(|&v| v != 0.0).count() as u64,
        (ReduceOp::Prod, _) => p.prod = included_values().fold(1.0, |s, v| s * v),
    }
    p
}

/// Combines partials in index order (sums pairwise).
fn combine(parts: &[Partial]) -> Partial {
    parts.iter().fold(Partial { sum: pairwise_partial_sum(parts), ..Partial::EMPTY }, |acc, p| Partial {
        sum: acc.sum,
        int_sum: acc.int_sum.wrapping_add(p.int_sum),
        included: acc.included + p.included,
        trues: acc.trues + p.trues,
        max: max_nan(acc.max, p.max),
        min: min_nan(acc.min, p.min),
        prod: acc.prod * p.prod,
    })
}

/// Pairwise sum of the partials' float sums, without allocating.
fn pairwise_partial_sum(parts: &[Partial]) -> f64 {
    if parts.len() <= PAIRWISE_LEAF {
        return parts.iter().fold(0.0, |s, p| s + p.sum);
    }
    let (lo, hi) = parts.split_at(parts.len() / 2);
    pairwise_partial_sum(lo) + pairwise_partial_sum(hi)
}

/// The final value of `op` from its combined partial, for an operand of compute kind `kind`.
fn finish(op: ReduceOp, kind: Kind, p: Partial) -> f64 {
    match (op, kind) {
        // Exact: the evaluator refuses a result outside the i32 range.
        (ReduceOp::Sum, Kind::Int) => p.int_sum as f64,
        (ReduceOp::Sum, _) => p.sum,
        // The builder casts ints to f32 before a mean; an int mean would still mean this.
        (ReduceOp::Mean, Kind::Int) => p.int_sum as f64 / p.included as f64,
        (ReduceOp::Mean, _) => p.sum / p.included as f64,
        (ReduceOp::Max, Kind::Int) if p.included == 0 => i32::MIN as f64,
        (ReduceOp::Min, Kind::Int) if p.included == 0 => i32::MAX as f64,
        (ReduceOp::Max, _) => p.max,
        (ReduceOp::Min, _) => p.min,
        (ReduceOp::Count, _) => p.trues as f64,
        (ReduceOp::Prod, _) => p.prod,
    }
}

/// `op` over every element of `x` (a dense tensor), with `mask` viewed at `x`'s shape.
pub(crate) fn reduce_all(op: ReduceOp, kind: Kind, x: &[f64], mask: Option<&BroadcastView>) -> f64 {
    let parts: Vec<Partial> = x
        .par_chunks(CHUNK)
        .enumerate()
        .map(|(c, xs)| {
            let m = mask.map(|m| m.chunk(c * CHUNK, xs.len()));
            reduce_slice(op, kind, xs, m.as_deref())
        })
        .collect();
    finish(op, kind, combine(&parts))
}

/// Writes `op` along the last axis (of length `row_len`) of `x` into `out` (one element per
/// row), with `mask` viewed at `x`'s shape.
pub(crate) fn reduce_last(
    out: &mut [f64],
    op: ReduceOp,
    kind: Kind,
    x: &[f64],
    row_len: usize,
    mask: Option<&BroadcastView>,
) {
    let rows_per_task = (CHUNK / row_len.max(1)).max(1);
    out.par_chunks_mut(rows_per_task).enumerate().for_each(|(c, dst)| {
        for (j, d) in dst.iter_mut().enumerate() {
            let start = (c * rows_per_task + j) * row_len;
            let xs = &x[start..start + row_len];
            let m = mask.map(|m| m.chunk(start, row_len));
            let combined = if row_len <= CHUNK {
                combine(std::slice::from_ref(&reduce_slice(op, kind, xs, m.as_deref())))
            } else {
                // Long rows use the same fixed chunking as `reduce_all`, so a [1, n] row and an
                // [n] reduction over everything give the same bits.
                let parts: Vec<Partial> = xs
                    .chunks(CHUNK)
                    .enumerate()
                    .map(|(k, part)| {
                        let mp = m.as_deref().map(|mm| &mm[k * CHUNK..k * CHUNK + part.len()]);
                        reduce_slice(op, kind, part, mp)
                    })
                    .collect();
                combine(&parts)
            };
            *d = finish(op, kind, combined);
        }
    });
}

/// Writes `op` over the axes `reduced` (in order) of `x` (of `shape`) into `out` (one element per
/// combination of the other axes, in their order), with `mask` viewed at `x`'s shape.
pub(crate) fn reduce_axes(
    out: &mut [f64],
    op: ReduceOp,
    kind: Kind,
    x: &[f64],
    shape: &[usize],
    reduced: &[usize],
    mask: Option<&BroadcastView>,
) -> Result<(), crate::InterpError> {
    let perm: Vec<usize> = (0..shape.len()).filter(|a| !reduced.contains(a)).chain(reduced.iter().copied()).collect();
    let moved: Vec<usize> = perm.iter().map(|&a| shape[a]).collect();
    let row_len = reduced.iter().map(|&a| shape[a]).product::<usize>();
    let xt = crate::layout::permute(x, shape, &perm);
    let mt = mask.map(|m| crate::layout::permute(&m.chunk(0, x.len()), shape, &perm));
    let mv = mt.as_deref().map(|m| BroadcastView::new(0, m, &moved, &moved)).transpose()?;
    if row_len == 0 {
        // Every row is empty: each result is the empty reduction.
        out.fill(finish(op, kind, Partial::EMPTY));
        return Ok(());
    }
    reduce_last(out, op, kind, &xt, row_len, mv.as_ref());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairwise_sum_skips_masked_nan() {
        let x: Vec<f64> = (0..100).map(|i| if i % 7 == 0 { f64::NAN } else { i as f64 }).collect();
        let m: Vec<f64> = (0..100).map(|i| if i % 7 == 0 { 0.0 } else { 1.0 }).collect();
        let want: f64 = (0..100).filter(|i| i % 7 != 0).map(|i| i as f64).sum();
        assert_eq!(pairwise_sum(&x, Some(&m)), want);
        assert!(pairwise_sum(&x, None).is_nan());
    }

    #[test]
    fn empty_partials_finish_to_the_identities() {
        let p = combine(&[]);
        assert_eq!(finish(ReduceOp::Sum, Kind::Float, p), 0.0);
        assert!(finish(ReduceOp::Mean, Kind::Float, p).is_nan());
        assert_eq!(finish(ReduceOp::Max, Kind::Float, p), f64::NEG_INFINITY);
        assert_eq!(finish(ReduceOp::Min, Kind::Float, p), f64::INFINITY);
        assert_eq!(finish(ReduceOp::Max, Kind::Int, p), i32::MIN as f64);
        assert_eq!(finish(ReduceOp::Count, Kind::Bool, p), 0.0);
    }
}
