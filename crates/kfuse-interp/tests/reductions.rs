//! Broadcasting, reductions (masked, empty, integer), zero-size batches and determinism.

mod common;

use common::*;
use kfuse_interp::{evaluate, Evaluated};
use kfuse_ir::{BinaryOp, DType, Graph, GraphBuilder, HostTensor, ReduceAxis, ReduceOp};

const NAN: f64 = f64::NAN;
const INF: f64 = f64::INFINITY;

#[test]
fn broadcasting_handles_scalars_rows_and_size_one_dims() {
    // [B, N] + [N] + scalar, and [B, 1] * [1, N].
    let mut b = GraphBuilder::new();
    let (bs, n) = (sym(&mut b, "B"), sym(&mut b, "N"));
    let x = b.input("x", DType::F32, shape(&[bs, n])).unwrap();
    let row = b.input("row", DType::F32, shape(&[n])).unwrap();
    let col = b.input("col", DType::F32, shape(&[bs, c(1)])).unwrap();
    let one_n = b.input("one_n", DType::F32, shape(&[c(1), n])).unwrap();
    let s = b.input("s", DType::F32, shape(&[])).unwrap();
    let xr = b.binary(BinaryOp::Add, x, row).unwrap();
    let xrs = b.binary(BinaryOp::Add, xr, s).unwrap();
    let outer = b.binary(BinaryOp::Mul, col, one_n).unwrap();
    b.output("sum", xrs).unwrap();
    b.output("outer", outer).unwrap();
    let g = b.finish().unwrap();
    let x = t(DType::F32, &[2, 3], &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
    let row = t(DType::F32, &[3], &[10.0, 20.0, 30.0]);
    let col = t(DType::F32, &[2, 1], &[1.0, -1.0]);
    let one_n = t(DType::F32, &[1, 3], &[1.0, 2.0, 3.0]);
    let s = t(DType::F32, &[], &[100.0]);
    let outs = evaluate(&g, &[("x", &x), ("row", &row), ("col", &col), ("one_n", &one_n), ("s", &s)]).unwrap();
    assert_eq!((outs[0].name.as_str(), outs[0].shape.as_slice()), ("sum", &[2, 3][..]));
    assert_same(&outs[0].values, &[110.0, 121.0, 132.0, 113.0, 124.0, 135.0]);
    assert_eq!(outs[1].shape, vec![2, 3]);
    assert_same(&outs[1].values, &[1.0, 2.0, 3.0, -1.0, -2.0, -3.0]);
}

/// `op` of x: f32[B, N] over `axis`, masked by m: bool[N] (broadcast) when `masked`.
fn reduce_graph(op: ReduceOp, axis: ReduceAxis, dtype: DType, mask: Option<DType>) -> Graph {
    graph1(|b| {
        let (bs, n) = (sym(b, "B"), sym(b, "N"));
        let x = b.input("x", dtype, shape(&[bs, n])).unwrap();
        let m = mask.map(|_| b.input("m", DType::Bool, shape(&[n])).unwrap());
        b.reduce(op, axis, x, m).unwrap()
    })
}

fn reduce_on(op: ReduceOp, axis: ReduceAxis, x: &HostTensor, m: Option<&HostTensor>) -> Evaluated {
    let g = reduce_graph(op, axis, x.dtype(), m.map(|m| m.dtype()));
    match m {
        Some(m) => eval1(&g, &[("x", x), ("m", m)]),
        None => eval1(&g, &[("x", x)]),
    }
}

#[test]
fn reductions_match_hand_values() {
    use ReduceAxis::{All, Last};
    let x = t(DType::F32, &[2, 3], &[1.0, -2.0, 4.0, 0.5, 8.0, -1.0]);
    assert_same(&reduce_on(ReduceOp::Sum, All, &x, None).values, &[10.5]);
    assert_same(&reduce_on(ReduceOp::Sum, Last, &x, None).values, &[3.0, 7.5]);
    assert_same(&reduce_on(ReduceOp::Mean, Last, &x, None).values, &[1.0, 2.5]);
    assert_same(&reduce_on(ReduceOp::Mean, All, &x, None).values, &[1.75]);
    assert_same(&reduce_on(ReduceOp::Max, Last, &x, None).values, &[4.0, 8.0]);
    assert_same(&reduce_on(ReduceOp::Min, Last, &x, None).values, &[-2.0, -1.0]);
    assert_same(&reduce_on(ReduceOp::Min, All, &x, None).values, &[-2.0]);
    assert_eq!(reduce_on(ReduceOp::Sum, Last, &x, None).shape, vec![2]);
    assert_eq!(reduce_on(ReduceOp::Sum, All, &x, None).shape, Vec::<usize>::new());
    let bits = t(DType::Bool, &[2, 3], &[1.0, 0.0, 1.0, 1.0, 1.0, 1.0]);
    let count = reduce_on(ReduceOp::Count, Last, &bits, None);
    assert_same(&count.values, &[2.0, 3.0]);
    // NaN in an included element propagates through every float reduction.
    let xn = t(DType::F32, &[1, 3], &[1.0, NAN, 3.0]);
    for op in [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min] {
        assert!(reduce_on(op, Last, &xn, None).values[0].is_nan(), "{op:?}");
    }
}

#[test]
fn masked_out_elements_are_excluded_even_when_nan() {
    use ReduceAxis::{All, Last};
    let x = t(DType::F32, &[2, 3], &[1.0, NAN, 4.0, 0.5, INF, -1.0]);
    let m = t(DType::Bool, &[3], &[1.0, 0.0, 1.0]);
    assert_same(&reduce_on(ReduceOp::Sum, Last, &x, Some(&m)).values, &[5.0, -0.5]);
    assert_same(&reduce_on(ReduceOp::Sum, All, &x, Some(&m)).values, &[4.5]);
    assert_same(&reduce_on(ReduceOp::Mean, Last, &x, Some(&m)).values, &[2.5, -0.25]);
    assert_same(&reduce_on(ReduceOp::Mean, All, &x, Some(&m)).values, &[1.125]);
    assert_same(&reduce_on(ReduceOp::Max, Last, &x, Some(&m)).values, &[4.0, 0.5]);
    assert_same(&reduce_on(ReduceOp::Min, All, &x, Some(&m)).values, &[-1.0]);
    let bits = t(DType::Bool, &[2, 3], &[1.0, 1.0, 0.0, 0.0, 1.0, 1.0]);
    assert_same(&reduce_on(ReduceOp::Count, Last, &bits, Some(&m)).values, &[1.0, 1.0]);
    assert_same(&reduce_on(ReduceOp::Count, All, &bits, Some(&m)).values, &[2.0]);
}

#[test]
fn empty_reductions_give_the_identities() {
    use ReduceAxis::{All, Last};
    // An all-false mask empties every row.
    let x = t(DType::F32, &[2, 2], &[1.0, NAN, 3.0, 4.0]);
    let none = t(DType::Bool, &[2], &[0.0, 0.0]);
    assert_same(&reduce_on(ReduceOp::Sum, Last, &x, Some(&none)).values, &[0.0, 0.0]);
    assert_same(&reduce_on(ReduceOp::Mean, Last, &x, Some(&none)).values, &[NAN, NAN]);
    assert_same(&reduce_on(ReduceOp::Max, All, &x, Some(&none)).values, &[-INF]);
    assert_same(&reduce_on(ReduceOp::Min, All, &x, Some(&none)).values, &[INF]);
    // N = 0: rows of length zero.
    let x0 = t(DType::F32, &[3, 0], &[]);
    assert_same(&reduce_on(ReduceOp::Sum, Last, &x0, None).values, &[0.0; 3]);
    assert_same(&reduce_on(ReduceOp::Mean, Last, &x0, None).values, &[NAN; 3]);
    assert_same(&reduce_on(ReduceOp::Max, Last, &x0, None).values, &[-INF; 3]);
    assert_same(&reduce_on(ReduceOp::Min, Last, &x0, None).values, &[INF; 3]);
    let b0 = t(DType::Bool, &[3, 0], &[]);
    assert_same(&reduce_on(ReduceOp::Count, Last, &b0, None).values, &[0.0; 3]);
    // B = 0: no rows at all, and a reduction over everything sees nothing.
    let xb0 = t(DType::F32, &[0, 4], &[]);
    assert_eq!(reduce_on(ReduceOp::Sum, Last, &xb0, None).values, Vec::<f64>::new());
    assert_same(&reduce_on(ReduceOp::Sum, All, &xb0, None).values, &[0.0]);
    assert_same(&reduce_on(ReduceOp::Mean, All, &xb0, None).values, &[NAN]);
    // i32 max/min of nothing are the i32 identities.
    let i0 = t(DType::I32, &[1, 0], &[]);
    assert_same(&reduce_on(ReduceOp::Max, Last, &i0, None).values, &[i32::MIN as f64]);
    assert_same(&reduce_on(ReduceOp::Min, Last, &i0, None).values, &[i32::MAX as f64]);
}

#[test]
fn integer_sums_are_exact_i64s() {
    // As torch sums integers and bools: into an i64, so a total beyond the i32 range is exact.
    let x = t(DType::I32, &[1, 3], &[i32::MAX as f64, 1.0, 5.0]);
    let g = reduce_graph(ReduceOp::Sum, ReduceAxis::Last, DType::I32, None);
    assert_eq!(g.node(g.outputs[0].node).dtype, DType::I64);
    assert_same(&eval1(&g, &[("x", &x)]).values, &[i32::MAX as f64 + 6.0]);
    let back = t(DType::I32, &[1, 3], &[i32::MAX as f64, 1.0, -5.0]);
    assert_same(&eval1(&g, &[("x", &back)]).values, &[i32::MAX as f64 - 4.0]);
    let y = t(DType::I32, &[2, 2], &[3.0, -7.0, 2.0, 9.0]);
    assert_same(&reduce_on(ReduceOp::Sum, ReduceAxis::All, &y, None).values, &[7.0]);
    assert_same(&reduce_on(ReduceOp::Max, ReduceAxis::All, &y, None).values, &[9.0]);
    let bools = reduce_graph(ReduceOp::Sum, ReduceAxis::Last, DType::Bool, None);
    assert_eq!(bools.node(bools.outputs[0].node).dtype, DType::I64);
    let b = t(DType::Bool, &[2, 3], &[1.0, 0.0, 1.0, 1.0, 1.0, 1.0]);
    assert_same(&eval1(&bools, &[("x", &b)]).values, &[2.0, 3.0]);
}

#[test]
fn zero_size_batches_give_empty_tensors() {
    let g = graph1(|b| {
        let (bs, n) = (sym(b, "B"), sym(b, "N"));
        let x = b.input("x", DType::F32, shape(&[bs, n, c(4)])).unwrap();
        let row = b.input("row", DType::F32, shape(&[n])).unwrap();
        let x0 = b.component(x, 0).unwrap();
        let y = b.binary(BinaryOp::Mul, x0, row).unwrap();
        let e = b.unary(kfuse_ir::UnaryOp::Exp, y).unwrap();
        b.stack(&[e, y]).unwrap()
    });
    let x = t(DType::F32, &[0, 5, 4], &[]);
    let row = t(DType::F32, &[5], &[1.0; 5]);
    let out = eval1(&g, &[("x", &x), ("row", &row)]);
    assert_eq!(out.shape, vec![0, 5, 2]);
    assert!(out.values.is_empty());
}

/// A large input with values of many magnitudes, so summation order shows in the low bits.
fn awkward(len: usize) -> Vec<f64> {
    (0..len).map(|i| ((i * 7919 % 10007) as f64 - 5000.0) * 10f64.powi((i % 9) as i32 - 4)).collect()
}

#[test]
fn reductions_are_bitwise_deterministic_across_runs_and_thread_counts() {
    let (rows, cols) = (3, 50_001);
    let x = t(DType::F32, &[rows, cols], &awkward(rows * cols));
    let m = t(DType::Bool, &[cols], &(0..cols).map(|i| (i % 3 != 0) as u8 as f64).collect::<Vec<_>>());
    let mut results: Vec<Vec<u64>> = Vec::new();
    for threads in [1, 2, 3, 7] {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        for _ in 0..2 {
            let bits: Vec<u64> = pool.install(|| {
                [ReduceAxis::All, ReduceAxis::Last]
                    .into_iter()
                    .flat_map(|axis| {
                        let a = reduce_on(ReduceOp::Sum, axis, &x, None).values;
                        let b = reduce_on(ReduceOp::Mean, axis, &x, Some(&m)).values;
                        a.into_iter().chain(b)
                    })
                    .map(f64::to_bits)
                    .collect()
            });
            results.push(bits);
        }
    }
    assert!(results.windows(2).all(|w| w[0] == w[1]), "results differ between runs or thread counts");
}

#[test]
fn long_sums_are_accurate() {
    // Multiples of 1/8 below 2^20: every partial sum is exact in f64, so any order must agree
    // with the exact integer total; this checks chunk and pairwise bookkeeping, not rounding.
    let len = 100_003;
    let vals: Vec<f64> = (0..len).map(|i| ((i * 31 % 1000) as f64 - 500.0) / 8.0).collect();
    let exact: i64 = (0..len).map(|i| (i * 31 % 1000) as i64 - 500).sum();
    let x = t(DType::F32, &[1, len], &vals);
    let want = exact as f64 / 8.0;
    assert_same(&reduce_on(ReduceOp::Sum, ReduceAxis::All, &x, None).values, &[want]);
    assert_same(&reduce_on(ReduceOp::Sum, ReduceAxis::Last, &x, None).values, &[want]);
}
