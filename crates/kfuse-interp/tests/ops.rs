//! Each op against hand-computed values on small, exact cases.

mod common;

use common::*;
use kfuse_ir::{BinaryOp, DType, Literal, TernaryOp, UnaryOp};

const NAN: f64 = f64::NAN;
const INF: f64 = f64::INFINITY;

fn unary_on(op: UnaryOp, xs: &[f64]) -> Vec<f64> {
    let g = graph1(|b| {
        let n = sym(b, "N");
        let x = b.input("x", DType::F32, shape(&[n])).unwrap();
        b.unary(op, x).unwrap()
    });
    let x = t(DType::F32, &[xs.len()], xs);
    eval1(&g, &[("x", &x)]).values
}

#[test]
fn float_unary_ops_match_hand_values() {
    let xs = [0.0, 0.5, -1.5, 4.0];
    assert_same(&unary_on(UnaryOp::Neg, &xs), &[-0.0, -0.5, 1.5, -4.0]);
    assert_same(&unary_on(UnaryOp::Abs, &xs), &[0.0, 0.5, 1.5, 4.0]);
    assert_same(&unary_on(UnaryOp::Floor, &xs), &[0.0, 0.0, -2.0, 4.0]);
    assert_same(&unary_on(UnaryOp::Sqrt, &xs), &[0.0, 0.5f64.sqrt(), NAN, 2.0]);
    assert_same(&unary_on(UnaryOp::Rsqrt, &[0.0, 0.25, -1.5, 4.0]), &[INF, 2.0, NAN, 0.5]);
    assert_same(&unary_on(UnaryOp::Log, &[0.0, 1.0, -1.0]), &[-INF, 0.0, NAN]);
    assert_same(&unary_on(UnaryOp::Exp, &[0.0, -INF, 1000.0]), &[1.0, 0.0, INF]);
    assert_same(&unary_on(UnaryOp::Sin, &[0.0]), &[0.0]);
    assert_same(&unary_on(UnaryOp::Cos, &[0.0]), &[1.0]);
    assert_same(&unary_on(UnaryOp::Sigmoid, &[0.0, -INF, INF, NAN]), &[0.5, 0.0, 1.0, NAN]);
    assert_close(&unary_on(UnaryOp::Sigmoid, &[2.0]), &[0.8807970779778823], 1e-15);
    assert_close(&unary_on(UnaryOp::Tanh, &[0.0, 0.5]), &[0.0, 0.46211715726000974], 1e-15);
    // Reference values from CPython's math.erf.
    assert_close(
        &unary_on(UnaryOp::Erf, &[0.0, 0.5, -1.5, INF]),
        &[0.0, 0.5204998778130465, -0.9661051464753108, 1.0],
        1e-15,
    );
}

#[test]
fn int_unary_ops_wrap_like_i32() {
    let g = graph1(|b| {
        let x = b.input("x", DType::I32, shape(&[c(3)])).unwrap();
        let n = b.unary(UnaryOp::Neg, x).unwrap();
        let a = b.unary(UnaryOp::Abs, x).unwrap();
        b.stack(&[n, a]).unwrap()
    });
    let x = t(DType::I32, &[3], &[i32::MIN as f64, -5.0, 7.0]);
    let m = i32::MIN as f64;
    assert_same(&eval1(&g, &[("x", &x)]).values, &[m, m, 5.0, 5.0, -7.0, 7.0]);
}

fn binary_on(op: BinaryOp, dtype: DType, xs: &[f64], ys: &[f64]) -> Vec<f64> {
    let g = graph1(|b| {
        let n = sym(b, "N");
        let x = b.input("x", dtype, shape(&[n])).unwrap();
        let y = b.input("y", dtype, shape(&[n])).unwrap();
        b.binary(op, x, y).unwrap()
    });
    let (x, y) = (t(dtype, &[xs.len()], xs), t(dtype, &[ys.len()], ys));
    eval1(&g, &[("x", &x), ("y", &y)]).values
}

#[test]
fn float_binary_ops_match_hand_values() {
    let f = DType::F32;
    let xs = [1.5, -2.0, 0.0, NAN];
    let ys = [0.5, 4.0, 0.0, 1.0];
    assert_same(&binary_on(BinaryOp::Add, f, &xs, &ys), &[2.0, 2.0, 0.0, NAN]);
    assert_same(&binary_on(BinaryOp::Sub, f, &xs, &ys), &[1.0, -6.0, 0.0, NAN]);
    assert_same(&binary_on(BinaryOp::Mul, f, &xs, &ys), &[0.75, -8.0, 0.0, NAN]);
    assert_same(&binary_on(BinaryOp::Div, f, &xs, &ys), &[3.0, -0.5, NAN, NAN]);
    assert_same(&binary_on(BinaryOp::Div, f, &[1.0, -1.0], &[0.0, 0.0]), &[INF, -INF]);
    assert_same(&binary_on(BinaryOp::Pow, f, &[2.0, 4.0, NAN, 1.0], &[3.0, 0.5, 0.0, NAN]), &[8.0, 2.0, 1.0, 1.0]);
    // PyTorch's minimum/maximum propagate NaN from either side.
    assert_same(&binary_on(BinaryOp::Min, f, &[1.0, NAN, 2.0], &[2.0, 1.0, NAN]), &[1.0, NAN, NAN]);
    assert_same(&binary_on(BinaryOp::Max, f, &[1.0, NAN, 2.0], &[2.0, 1.0, NAN]), &[2.0, NAN, NAN]);
}

#[test]
fn comparisons_follow_ieee_and_logic_ops_follow_truth_tables() {
    let f = DType::F32;
    let xs = [1.0, 2.0, 2.0, NAN];
    let ys = [2.0, 2.0, 1.0, NAN];
    assert_same(&binary_on(BinaryOp::Eq, f, &xs, &ys), &[0.0, 1.0, 0.0, 0.0]);
    assert_same(&binary_on(BinaryOp::Ne, f, &xs, &ys), &[1.0, 0.0, 1.0, 1.0]);
    assert_same(&binary_on(BinaryOp::Lt, f, &xs, &ys), &[1.0, 0.0, 0.0, 0.0]);
    assert_same(&binary_on(BinaryOp::Le, f, &xs, &ys), &[1.0, 1.0, 0.0, 0.0]);
    assert_same(&binary_on(BinaryOp::Gt, f, &xs, &ys), &[0.0, 0.0, 1.0, 0.0]);
    assert_same(&binary_on(BinaryOp::Ge, f, &xs, &ys), &[0.0, 1.0, 1.0, 0.0]);
    let (p, q) = ([0.0, 0.0, 1.0, 1.0], [0.0, 1.0, 0.0, 1.0]);
    assert_same(&binary_on(BinaryOp::And, DType::Bool, &p, &q), &[0.0, 0.0, 0.0, 1.0]);
    assert_same(&binary_on(BinaryOp::Or, DType::Bool, &p, &q), &[0.0, 1.0, 1.0, 1.0]);
    assert_same(&binary_on(BinaryOp::Eq, DType::Bool, &p, &q), &[1.0, 0.0, 0.0, 1.0]);
}

#[test]
fn int_binary_ops_wrap_and_division_is_true_division() {
    let i = DType::I32;
    let max = i32::MAX as f64;
    let min = i32::MIN as f64;
    assert_same(&binary_on(BinaryOp::Add, i, &[max, 3.0], &[1.0, -5.0]), &[min, -2.0]);
    assert_same(&binary_on(BinaryOp::Sub, i, &[min, 3.0], &[1.0, 5.0]), &[max, -2.0]);
    assert_same(&binary_on(BinaryOp::Mul, i, &[65536.0, -3.0], &[65536.0, 7.0]), &[0.0, -21.0]);
    assert_same(&binary_on(BinaryOp::Min, i, &[3.0, -3.0], &[2.0, 7.0]), &[2.0, -3.0]);
    assert_same(&binary_on(BinaryOp::Max, i, &[3.0, -3.0], &[2.0, 7.0]), &[3.0, 7.0]);
    // The builder casts ints to f32 for `/`: 7 / 2 is 3.5, and 1 / 0 is inf, not a crash.
    assert_same(&binary_on(BinaryOp::Div, i, &[7.0, 1.0, 0.0], &[2.0, 0.0, 0.0]), &[3.5, INF, NAN]);
    assert_same(&binary_on(BinaryOp::Lt, i, &[-1.0, 5.0], &[0.0, 5.0]), &[1.0, 0.0]);
}

#[test]
fn casts_truncate_saturate_and_test_nonzero() {
    let cast_to = |dtype: DType, from: DType, xs: &[f64]| {
        let g = graph1(|b| {
            let x = b.input("x", from, shape(&[c(xs.len() as u64)])).unwrap();
            b.cast(x, dtype)
        });
        let x = t(from, &[xs.len()], xs);
        eval1(&g, &[("x", &x)]).values
    };
    let xs = [-2.75, 2.75, NAN, -0.0, 3e9, -3e9];
    let (max, min) = (i32::MAX as f64, i32::MIN as f64);
    assert_same(&cast_to(DType::I32, DType::F32, &xs), &[-2.0, 2.0, 0.0, 0.0, max, min]);
    assert_same(&cast_to(DType::Bool, DType::F32, &xs), &[1.0, 1.0, 1.0, 0.0, 1.0, 1.0]);
    assert_same(&cast_to(DType::F32, DType::Bool, &[0.0, 1.0]), &[0.0, 1.0]);
    assert_same(&cast_to(DType::I32, DType::Bool, &[0.0, 1.0]), &[0.0, 1.0]);
    assert_same(&cast_to(DType::Bool, DType::I32, &[0.0, -4.0]), &[0.0, 1.0]);
    assert_same(&cast_to(DType::F16, DType::I32, &[-7.0, 70000.0]), &[-7.0, 70000.0]);
    // Float to float is exact inside the graph: an f16 node still holds the f32 input's value.
    let third = 1.0f32 / 3.0;
    assert_same(&cast_to(DType::F16, DType::F32, &[third as f64]), &[third as f64]);
}

#[test]
fn select_and_clamp_broadcast_and_propagate_nan() {
    let g = graph1(|b| {
        let n = sym(b, "N");
        let cnd = b.input("c", DType::Bool, shape(&[n])).unwrap();
        let x = b.input("x", DType::F32, shape(&[n])).unwrap();
        let zero = b.lit_float(0.0);
        b.select(cnd, x, zero).unwrap()
    });
    let cnd = t(DType::Bool, &[3], &[1.0, 0.0, 1.0]);
    let x = t(DType::F32, &[3], &[5.0, NAN, NAN]);
    assert_same(&eval1(&g, &[("c", &cnd), ("x", &x)]).values, &[5.0, 0.0, NAN]);

    let g = graph1(|b| {
        let n = sym(b, "N");
        let x = b.input("x", DType::F32, shape(&[n])).unwrap();
        let lo = b.input("lo", DType::F32, shape(&[n])).unwrap();
        let hi = b.lit_float(1.0);
        b.ternary(TernaryOp::Clamp, x, lo, hi).unwrap()
    });
    let x = t(DType::F32, &[5], &[-3.0, 0.5, 9.0, NAN, 0.5]);
    let lo = t(DType::F32, &[5], &[-1.0, -1.0, -1.0, -1.0, NAN]);
    assert_same(&eval1(&g, &[("x", &x), ("lo", &lo)]).values, &[-1.0, 0.5, 1.0, NAN, NAN]);

    let g = graph1(|b| {
        let x = b.input("x", DType::I32, shape(&[c(3)])).unwrap();
        let (lo, hi) = (b.lit_int(-2), b.lit_int(2));
        b.clamp(x, lo, hi).unwrap()
    });
    let x = t(DType::I32, &[3], &[-9.0, 1.0, 9.0]);
    assert_same(&eval1(&g, &[("x", &x)]).values, &[-2.0, 1.0, 2.0]);
}

#[test]
fn iota_indexes_along_its_axis_of_a_bound_shape() {
    let g = graph1(|b| {
        let bs = sym(b, "B");
        let x = b.input("x", DType::F32, shape(&[bs, c(3)])).unwrap();
        let i0 = b.iota(shape(&[bs, c(3)]), 0).unwrap();
        let i1 = b.iota(shape(&[bs, c(3)]), 1).unwrap();
        let s = b.stack(&[i0, i1]).unwrap();
        let s = b.cast(s, DType::F32);
        let xe = b.expand_last(x);
        b.binary(BinaryOp::Add, s, xe).unwrap()
    });
    let x = t(DType::F32, &[2, 3], &[0.5; 6]);
    let out = eval1(&g, &[("x", &x)]);
    assert_eq!(out.shape, vec![2, 3, 2]);
    assert_same(&out.values, &[0.5, 0.5, 0.5, 1.5, 0.5, 2.5, 1.5, 0.5, 1.5, 1.5, 1.5, 2.5]);
}

#[test]
fn component_stack_and_expand_last_move_values_where_expected() {
    let g = graph1(|b| {
        let bs = sym(b, "B");
        let x = b.input("x", DType::F32, shape(&[bs, c(3)])).unwrap();
        let first = b.component(x, 0).unwrap();
        let last = b.component(x, -1).unwrap();
        let seven = b.lit_float(7.0);
        // Parts of different shapes ([B] and a scalar) broadcast to [B].
        b.stack(&[last, seven, first]).unwrap()
    });
    let x = t(DType::F32, &[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let out = eval1(&g, &[("x", &x)]);
    assert_eq!(out.shape, vec![2, 3]);
    assert_same(&out.values, &[3.0, 7.0, 1.0, 6.0, 7.0, 4.0]);

    // x[.., None] * y: [B, 1] against [N] gives [B, N].
    let g = graph1(|b| {
        let (bs, n) = (sym(b, "B"), sym(b, "N"));
        let x = b.input("x", DType::F32, shape(&[bs])).unwrap();
        let y = b.input("y", DType::F32, shape(&[n])).unwrap();
        let xe = b.expand_last(x);
        b.binary(BinaryOp::Mul, xe, y).unwrap()
    });
    let x = t(DType::F32, &[2], &[1.0, 10.0]);
    let y = t(DType::F32, &[3], &[1.0, 2.0, 3.0]);
    let out = eval1(&g, &[("x", &x), ("y", &y)]);
    assert_eq!(out.shape, vec![2, 3]);
    assert_same(&out.values, &[1.0, 2.0, 3.0, 10.0, 20.0, 30.0]);
}

#[test]
fn constants_take_their_node_dtype() {
    let g = graph1(|b| {
        let x = b.input("x", DType::I32, shape(&[c(2)])).unwrap();
        let k = b.constant(Literal::float(2.9), DType::I32);
        b.binary(BinaryOp::Mul, x, k).unwrap()
    });
    let x = t(DType::I32, &[2], &[3.0, -4.0]);
    assert_same(&eval1(&g, &[("x", &x)]).values, &[6.0, -8.0]);
    let g = graph1(|b| b.lit_float(0.1));
    let out = eval1(&g, &[]);
    assert_eq!(out.shape, Vec::<usize>::new());
    assert_same(&out.values, &[0.1]);
}
