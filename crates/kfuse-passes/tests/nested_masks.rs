//! Gradients that are zero outside several masks (a chain of `where`s): autodiff combines the
//! inner masks with `and` past two layers, which must keep the values (checked against finite
//! differences, masks of broadcast shapes included) and the exact zeros outside the masks even
//! where the rest of the expression is NaN or infinite.

mod common;

use common::{weighted_sum, Problem};
use kfuse_ir::{BinaryOp, Graph, Literal, NodeId, Op, ReduceAxis, ReduceOp, TernaryOp, UnaryOp};
use proptest::prelude::*;

fn cfg() -> ProptestConfig {
    ProptestConfig { cases: 24, failure_persistence: None, ..ProptestConfig::default() }
}

/// How many `where(m, _, 0)` layers sit directly around node `n`.
fn masked_layers(g: &Graph, mut n: NodeId) -> usize {
    let mut layers = 0;
    while let Op::Ternary(TernaryOp::Select, _, inner, zero) = g.nodes[n.index()].op {
        if !matches!(g.nodes[zero.index()].op, Op::Const(Literal::Float(bits)) if f64::from_bits(bits) == 0.0) {
            break;
        }
        layers += 1;
        n = inner;
    }
    layers
}

fn gradient_node(g: &Graph, name: &str) -> NodeId {
    g.outputs.iter().find(|o| o.name == name).map(|o| o.node).expect("the gradient output")
}

/// Masks of three shapes that broadcast against `[B, N]`: `[B, N]`, `[B, 1]` and `[N]`.
const MASK_DIMS: [&[&str]; 3] = [&["B", "N"], &["B", "1"], &["N"]];

proptest! {
    #![proptest_config(cfg())]

    #[test]
    fn chains_of_wheres_match_finite_differences(
        (b, n) in (1usize..4, 1usize..5),
        depth in 1usize..9,
        seed in any::<u64>(),
    ) {
        // v_0 = sin(x); v_j = where(t_j > 0, v_{j-1} * y, 0), or where(t_j > 0, 0, v_{j-1} * y) for
        // odd j; loss = sum(w * v_depth), checked w.r.t. x and y.
        let mut rng = seed;
        let mut next = move || {
            rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((rng >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
        };
        let mut p = Problem::new();
        let x = p.input("x", &["B", "N"], &[b, n], (0..b * n).map(|_| next()).collect());
        let y = p.input("y", &["B", "N"], &[b, n], (0..b * n).map(|_| 1.0 + 0.5 * next()).collect());
        let w = p.input("w", &["B", "N"], &[b, n], (0..b * n).map(|_| next()).collect());
        let zero = p.b.lit_float(0.0);
        let mut v = p.b.unary(UnaryOp::Sin, x).unwrap();
        for j in 1..=depth {
            let dims = MASK_DIMS[j % 3];
            let sizes = match dims { ["B", "N"] => vec![b, n], ["B", "1"] => vec![b, 1], _ => vec![n] };
            let count = sizes.iter().product();
            // Some masks are all true, some all false, most mixed.
            let bias = [0.0, 0.0, 0.0, 2.0, -2.0][j % 5];
            let t = p.input(&format!("t{j}"), dims, &sizes, (0..count).map(|_| next() + bias).collect());
            let c = p.b.binary(BinaryOp::Gt, t, zero).unwrap();
            let prod = p.b.binary(BinaryOp::Mul, v, y).unwrap();
            v = if j % 2 == 0 { p.b.select(c, prod, zero).unwrap() } else { p.b.select(c, zero, prod).unwrap() };
        }
        let loss = weighted_sum(&mut p.b, w, v);
        let (graph, inputs) = p.graph(loss, &["x", "y"]);
        for name in ["grad_x", "grad_y"] {
            let layers = masked_layers(&graph, gradient_node(&graph, name));
            prop_assert!(layers <= 2, "{name} has {layers} nested masks\n{graph}");
        }
        common::check_graph(&graph, &inputs, &["x", "y"]).map_err(TestCaseError::fail)?;
    }
}

#[test]
fn masked_out_elements_get_exact_zeros_through_many_masks_over_nan_and_infinity() {
    // v_j = where(t_j > 0, v_{j-1} * y, 0) from v_0 = x, four layers: element 0 is inside every
    // mask, elements 1-3 fall out at layers 1, 2 and 4, where x or y is NaN or infinite. (A y
    // that is infinite inside the later masks gives NaN, as in any framework: its adjoint times
    // the 0 that the earlier layer left.)
    let mut p = Problem::new();
    let x = p.input("x", &["N"], &[4], vec![3.0, f64::NAN, f64::INFINITY, f64::INFINITY]);
    let y = p.input("y", &["N"], &[4], vec![0.5, 2.0, 2.0, f64::NAN]);
    let masks = [[1.0, -1.0, 1.0, 1.0], [1.0, 1.0, -1.0, 1.0], [1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, -1.0]];
    let zero = p.b.lit_float(0.0);
    let mut v = x;
    for (j, m) in masks.iter().enumerate() {
        let t = p.input(&format!("t{j}"), &["N"], &[4], m.to_vec());
        let c = p.b.binary(BinaryOp::Gt, t, zero).unwrap();
        let prod = p.b.binary(BinaryOp::Mul, v, y).unwrap();
        v = p.b.select(c, prod, zero).unwrap();
    }
    let loss = p.b.reduce(ReduceOp::Sum, ReduceAxis::All, v, None).unwrap();
    let (graph, inputs) = p.graph(loss, &["x", "y"]);
    assert!(masked_layers(&graph, gradient_node(&graph, "grad_x")) <= 2, "{graph}");
    let out = inputs.eval(&graph);
    let get = |name: &str| out.iter().find(|e| e.name == name).expect("output").values.clone();
    // d/dx = y^4, d/dy = 4 x y^3 inside every mask; exactly 0 (not NaN, not -0) outside.
    for (name, want) in [("grad_x", [0.0625, 0.0, 0.0, 0.0]), ("grad_y", [1.5, 0.0, 0.0, 0.0])] {
        let got = get(name);
        assert_eq!(got, want, "{name}");
        assert!(got.iter().all(|v| v.is_sign_positive()), "{name}: {got:?}");
    }
}
