//! Reductions over any axis or list of axes, with and without `keepdim` and masks, against a
//! direct loop over the elements (NumPy's `x.sum(axis=(..), keepdims=..)` written out).

mod common;

use common::*;
use kfuse_ir::{DType, Dim, GraphBuilder, HostTensor, ReduceOp};

/// Row-major strides of `shape`.
fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for a in (0..shape.len().saturating_sub(1)).rev() {
        s[a] = s[a + 1] * shape[a + 1];
    }
    s
}

/// `op` over `axes` of `x` (of `shape`), only where `mask` (already at `shape`) is true: the
/// kept axes' values in row-major order, by a plain loop.
fn reference(op: ReduceOp, x: &[f64], shape: &[usize], axes: &[usize], mask: Option<&[f64]>) -> Vec<f64> {
    let kept: Vec<usize> = (0..shape.len()).filter(|a| !axes.contains(a)).collect();
    let out_len: usize = kept.iter().map(|&a| shape[a]).product();
    let st = strides(shape);
    let mut acc = vec![Vec::new(); out_len];
    for (i, &v) in x.iter().enumerate() {
        if mask.is_some_and(|m| m[i] == 0.0) {
            continue;
        }
        let o = kept.iter().fold(0, |o, &a| o * shape[a] + (i / st[a]) % shape[a]);
        acc[o].push(v);
    }
    acc.iter()
        .map(|vals| match op {
            ReduceOp::Sum => vals.iter().sum(),
            ReduceOp::Mean => vals.iter().sum::<f64>() / vals.len() as f64,
            ReduceOp::Max => vals.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            ReduceOp::Min => vals.iter().copied().fold(f64::INFINITY, f64::min),
            ReduceOp::Count => vals.iter().filter(|&&v| v != 0.0).count() as f64,
            ReduceOp::Prod => vals.iter().product(),
        })
        .collect()
}

/// Deterministic values with few ties (`seed` varies them).
fn values(n: usize, seed: u64) -> Vec<f64> {
    (0..n).map(|i| (((i as u64 * 7919 + seed * 104_729) % 1009) as f64 - 504.0) / 37.0).collect()
}

/// Evaluates `op(x, axis: axes, keepdim: keepdim, where: mask)` with `x: f32[shape]` and a mask
/// of `mask_shape`; returns the result's shape and values.
fn run(
    op: ReduceOp,
    shape: &[usize],
    axes: &[i64],
    keepdim: bool,
    mask: Option<(&[usize], &[f64])>,
    x: &[f64],
) -> (Vec<usize>, Vec<f64>) {
    let dims = |s: &[usize]| kfuse_ir::Shape(s.iter().map(|&d| Dim::Const(d as u64)).collect());
    let mut b = GraphBuilder::new();
    let dtype = if op == ReduceOp::Count { DType::Bool } else { DType::F32 };
    let xn = b.input("x", dtype, dims(shape)).unwrap();
    let mn = mask.map(|(ms, _)| b.input("m", DType::Bool, dims(ms)).unwrap());
    let r = b.reduce_axes(op, xn, axes, keepdim, mn).unwrap();
    b.output("out", r).unwrap();
    let g = b.finish().unwrap();
    let xt = HostTensor::from_f64(dtype, shape.to_vec(), x);
    let out = match mask {
        Some((ms, mv)) => eval1(&g, &[("x", &xt), ("m", &t(DType::Bool, ms, mv))]),
        None => eval1(&g, &[("x", &xt)]),
    };
    (out.shape, out.values)
}

fn normalise(axes: &[i64], rank: usize) -> Vec<usize> {
    axes.iter().map(|&a| if a < 0 { (a + rank as i64) as usize } else { a as usize }).collect()
}

fn want_shape(shape: &[usize], axes: &[usize], keepdim: bool) -> Vec<usize> {
    (0..shape.len())
        .filter_map(|a| match axes.contains(&a) {
            false => Some(shape[a]),
            true => keepdim.then_some(1),
        })
        .collect()
}

/// Values of `f32` round-trip: the input is stored as f32, so compare with its rounded values.
fn as_f32(x: &[f64]) -> Vec<f64> {
    x.iter().map(|&v| v as f32 as f64).collect()
}

#[test]
fn every_axis_set_of_a_rank_3_tensor_matches_the_loop() {
    let shape = [3, 4, 5];
    let x = values(60, 1);
    let axis_sets: [&[i64]; 9] = [&[0], &[1], &[2], &[-2], &[0, 1], &[0, 2], &[1, 2], &[2, 0], &[0, 1, 2]];
    for op in [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min] {
        for axes in axis_sets {
            for keepdim in [false, true] {
                let (got_shape, got) = run(op, &shape, axes, keepdim, None, &x);
                let ax = normalise(axes, 3);
                let what = format!("{} axis {axes:?} keepdim {keepdim}", op.name());
                assert_eq!(got_shape, want_shape(&shape, &ax, keepdim), "{what}");
                let want = reference(op, &as_f32(&x), &shape, &ax, None);
                let want: Vec<f64> = want.iter().map(|&v| v as f32 as f64).collect();
                assert_close(&got, &want, 1e-5);
            }
        }
    }
}

#[test]
fn prod_over_every_axis_set_of_a_rank_3_tensor_matches_the_loop_with_and_without_a_mask() {
    let shape = [3, 4, 5];
    // Factors near 1 (a product of 60 stays far from overflow), and a zero.
    let mut x: Vec<f64> = values(60, 3).iter().map(|v| 1.0 + v / 64.0).collect();
    x[17] = 0.0;
    let mask: Vec<f64> = (0..60).map(|i| f64::from(i % 7 != 2)).collect();
    let axis_sets: [&[i64]; 6] = [&[0], &[2], &[-2], &[0, 2], &[2, 0], &[0, 1, 2]];
    for axes in axis_sets {
        for keepdim in [false, true] {
            for masked in [false, true] {
                let m = masked.then_some((&[3usize, 4, 5][..], &mask[..]));
                let (got_shape, got) = run(ReduceOp::Prod, &shape, axes, keepdim, m, &x);
                let ax = normalise(axes, 3);
                assert_eq!(got_shape, want_shape(&shape, &ax, keepdim), "prod axis {axes:?}");
                let want = reference(ReduceOp::Prod, &as_f32(&x), &shape, &ax, masked.then_some(&mask[..]));
                let want: Vec<f64> = want.iter().map(|&v| v as f32 as f64).collect();
                assert_close(&got, &want, 1e-6);
            }
        }
    }
}

#[test]
fn masks_broadcast_to_the_operand_on_every_axis() {
    let shape = [3, 4, 5];
    let x = values(60, 2);
    let full_mask = |ms: &[usize], mv: &[f64]| -> Vec<f64> {
        // The mask broadcast to [3, 4, 5] (aligned right).
        let off = 3 - ms.len();
        let ms_st = strides(ms);
        (0..60)
            .map(|i| {
                let idx = [i / 20, (i / 5) % 4, i % 5];
                let j: usize = (0..ms.len()).map(|d| if ms[d] == 1 { 0 } else { idx[d + off] * ms_st[d] }).sum();
                mv[j]
            })
            .collect()
    };
    let masks: [(&[usize], Vec<f64>); 3] = [
        (&[4, 5], (0..20).map(|i| f64::from(i % 3 != 0)).collect()),
        (&[3, 1, 5], (0..15).map(|i| f64::from(i % 4 != 1)).collect()),
        (&[5], vec![1.0, 0.0, 1.0, 1.0, 0.0]),
    ];
    for (ms, mv) in &masks {
        for axes in [&[0][..], &[1], &[0, 2], &[-1, 0]] {
            for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Mean] {
                let (_, got) = run(op, &shape, axes, true, Some((ms, mv)), &x);
                let m = full_mask(ms, mv);
                let want = reference(op, &as_f32(&x), &shape, &normalise(axes, 3), Some(&m));
                let want: Vec<f64> = want.iter().map(|&v| v as f32 as f64).collect();
                assert_close(&got, &want, 1e-5);
            }
            // count of the mask itself, along the same axes.
            let m = full_mask(ms, mv);
            let (_, got) = run(ReduceOp::Count, &shape, axes, false, None, &m);
            assert_same(&got, &reference(ReduceOp::Count, &m, &shape, &normalise(axes, 3), None));
        }
    }
}

#[test]
fn hand_computed_column_and_middle_sums() {
    // x = [[[0, 1], [2, 3], [4, 5]], [[6, 7], [8, 9], [10, 11]]]: shape [2, 3, 2].
    let x: Vec<f64> = (0..12).map(f64::from).collect();
    let (s, v) = run(ReduceOp::Sum, &[2, 3, 2], &[0], false, None, &x);
    assert_eq!(s, vec![3, 2]);
    assert_same(&v, &[6.0, 8.0, 10.0, 12.0, 14.0, 16.0]);
    let (s, v) = run(ReduceOp::Sum, &[2, 3, 2], &[1], true, None, &x);
    assert_eq!(s, vec![2, 1, 2]);
    assert_same(&v, &[6.0, 9.0, 24.0, 27.0]);
    let (s, v) = run(ReduceOp::Max, &[2, 3, 2], &[0, -1], false, None, &x);
    assert_eq!(s, vec![3]);
    assert_same(&v, &[7.0, 9.0, 11.0]);
    let (s, v) = run(ReduceOp::Mean, &[2, 3, 2], &[0, 2], true, None, &x);
    assert_eq!(s, vec![1, 3, 1]);
    assert_same(&v, &[3.5, 5.5, 7.5]);
}

#[test]
fn empty_reduced_axes_give_the_empty_results() {
    let nan = f64::NAN;
    for (op, want) in [
        (ReduceOp::Sum, 0.0),
        (ReduceOp::Mean, nan),
        (ReduceOp::Max, f64::NEG_INFINITY),
        (ReduceOp::Min, f64::INFINITY),
    ] {
        let (s, v) = run(op, &[3, 0, 5], &[1], false, None, &[]);
        assert_eq!(s, vec![3, 5]);
        assert_same(&v, &[want; 15]);
        let (s, v) = run(op, &[0, 4], &[0], true, None, &[]);
        assert_eq!(s, vec![1, 4]);
        assert_same(&v, &[want; 4]);
        // Kept axes of size 0: nothing to compute.
        let (s, v) = run(op, &[0, 4, 3], &[1], false, None, &[]);
        assert_eq!((s, v.len()), (vec![0, 3], 0));
    }
    let (_, v) = run(ReduceOp::Count, &[2, 0], &[0], false, None, &[]);
    assert!(v.is_empty());
    let (_, v) = run(ReduceOp::Count, &[0, 2], &[0], false, None, &[]);
    assert_same(&v, &[0.0, 0.0]);
}

#[test]
fn masked_out_nan_does_not_reach_a_column_sum() {
    let x = [1.0, f64::NAN, 2.0, 3.0, f64::NAN, 4.0];
    let m = [1.0, 1.0, 0.0];
    // x: [2, 3], m: [3] masks the middle column; sum over axis 0 keeps it NaN-free where masked.
    let (_, v) = run(ReduceOp::Sum, &[2, 3], &[0], false, Some((&[3], &m)), &x);
    assert_same(&v, &[4.0, f64::NAN, 0.0]);
    let m = [1.0, 0.0, 1.0];
    let (_, v) = run(ReduceOp::Sum, &[2, 3], &[0], false, Some((&[3], &m)), &x);
    assert_same(&v, &[4.0, 0.0, 6.0]);
}

#[test]
fn odd_sizes_and_long_columns_match_the_loop() {
    for (rows, cols) in [(1, 1), (3, 1), (1, 3), (33, 3), (1023, 5), (3, 1023)] {
        let shape = [rows, cols];
        let x = values(rows * cols, 3);
        for op in [ReduceOp::Sum, ReduceOp::Max] {
            let (_, got) = run(op, &shape, &[0], false, None, &x);
            let want: Vec<f64> = reference(op, &as_f32(&x), &shape, &[0], None);
            let want: Vec<f64> = want.iter().map(|&v| v as f32 as f64).collect();
            assert_close(&got, &want, 1e-3);
        }
    }
}

#[test]
fn the_builder_refuses_bad_axes_naming_the_axis_and_the_rank() {
    let mut b = GraphBuilder::new();
    let x = b.input("x", DType::F32, kfuse_ir::Shape(vec![Dim::Const(2), Dim::Const(3)])).unwrap();
    for (axes, axis, words) in
        [(&[2][..], 2, "out of range"), (&[-3], -3, "out of range"), (&[0, -2], -2, "named twice"), (&[], 0, "empty")]
    {
        let e = b.reduce_axes(ReduceOp::Sum, x, axes, false, None).unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, kfuse_ir::IrError::BadAxis { rank: 2, axis: a, .. } if a == axis), "{e:?}");
        assert!(msg.contains(words) && msg.contains("rank 2"), "{msg}");
    }
}

#[test]
fn the_builder_writes_axis_sets_in_their_normal_forms() {
    let mut b = GraphBuilder::new();
    let x = b.input("x", DType::F32, kfuse_ir::Shape(vec![Dim::Const(2), Dim::Const(3)])).unwrap();
    let all = b.reduce(ReduceOp::Sum, kfuse_ir::ReduceAxis::All, x, None).unwrap();
    let last = b.reduce(ReduceOp::Sum, kfuse_ir::ReduceAxis::Last, x, None).unwrap();
    assert_eq!(b.reduce_axes(ReduceOp::Sum, x, &[0, 1], false, None).unwrap(), all);
    assert_eq!(b.reduce_axes(ReduceOp::Sum, x, &[-1], false, None).unwrap(), last);
    let kept = b.reduce_axes(ReduceOp::Sum, x, &[1], true, None).unwrap();
    assert_eq!(b.node(kept).op, kfuse_ir::Op::ExpandLast(last));
    let col = b.reduce_axes(ReduceOp::Sum, x, &[0], true, None).unwrap();
    let op = b.node(col).op;
    assert!(matches!(op, kfuse_ir::Op::Reduce { axis: kfuse_ir::ReduceAxis::Axes { mask: 1, keepdim: true }, .. }));
    b.output("col", col).unwrap();
    let g = b.finish().unwrap();
    assert!(g.to_string().contains("sum(v0, axis: [0], keepdim: true)"), "{g}");
}
