//! Whole-graph derivatives: [`kfuse_passes::vjp`] agrees with central finite differences of
//! `sum(output * upstream)` for non-scalar outputs, [`kfuse_passes::with_gradients`] builds the
//! same graph as the language's `grad`, and bad requests are errors that name what is wrong.

use kfuse_interp::evaluate_f64;
use kfuse_ir::{BinaryOp, DType, Dim, Graph, GraphBuilder, ReduceAxis, ReduceOp, Shape, UnaryOp};
use kfuse_passes::{vjp, with_gradients, DeriveError};

type Args = Vec<(String, Vec<usize>, Vec<f64>)>;

/// Inputs `x: f32[N, 3]`, `w: f32[3]`, `k: i32[N]`; outputs `y = x * w + sin(x)` (`[N, 3]`),
/// `row = sum(y * y) along the last axis * exp(w[.., 1])` (`[N]`), `s = mean(x * x)` (scalar) and
/// the integer `c = count(k > 0)`.
fn forward() -> Graph {
    let mut b = GraphBuilder::new();
    let n = b.symbol("N");
    let x = b.input("x", DType::F32, Shape(vec![Dim::Sym(n), Dim::Const(3)])).unwrap();
    let w = b.input("w", DType::F32, Shape(vec![Dim::Const(3)])).unwrap();
    let k = b.input("k", DType::I32, Shape(vec![Dim::Sym(n)])).unwrap();
    let xw = b.binary(BinaryOp::Mul, x, w).unwrap();
    let sx = b.unary(UnaryOp::Sin, x).unwrap();
    let y = b.binary(BinaryOp::Add, xw, sx).unwrap();
    let yy = b.binary(BinaryOp::Mul, y, y).unwrap();
    let r = b.reduce(ReduceOp::Sum, ReduceAxis::Last, yy, None).unwrap();
    let w1 = b.component(w, 1).unwrap();
    let e = b.unary(UnaryOp::Exp, w1).unwrap();
    let row = b.binary(BinaryOp::Mul, r, e).unwrap();
    let xx = b.binary(BinaryOp::Mul, x, x).unwrap();
    let s = b.reduce(ReduceOp::Mean, ReduceAxis::All, xx, None).unwrap();
    let zero = b.lit_int(0);
    let pos = b.binary(BinaryOp::Gt, k, zero).unwrap();
    let c = b.reduce(ReduceOp::Count, ReduceAxis::All, pos, None).unwrap();
    b.output("y", y).unwrap();
    b.output("row", row).unwrap();
    b.output("s", s).unwrap();
    b.output("c", c).unwrap();
    b.finish().unwrap()
}

/// Deterministic values in [-1.5, 1.5) (a small LCG; no kinks in this function).
fn values(seed: u64, n: usize) -> Vec<f64> {
    let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((state >> 11) as f64 / (1u64 << 53) as f64) * 3.0 - 1.5
        })
        .collect()
}

fn eval(graph: &Graph, args: &Args) -> Vec<(String, Vec<f64>)> {
    let a: Vec<(&str, Vec<usize>, Vec<f64>)> =
        args.iter().map(|(n, s, v)| (n.as_str(), s.clone(), v.clone())).collect();
    evaluate_f64(graph, &a)
        .unwrap_or_else(|e| panic!("interpreter: {e}"))
        .into_iter()
        .map(|e| (e.name, e.values))
        .collect()
}

fn get<'a>(out: &'a [(String, Vec<f64>)], name: &str) -> &'a [f64] {
    &out.iter().find(|o| o.0 == name).unwrap_or_else(|| panic!("no output `{name}`")).1
}

#[test]
fn vjp_matches_finite_differences_for_non_scalar_outputs() {
    let g = forward();
    let d = vjp(&g, &["x", "w"]).unwrap();
    // One upstream input per float output, after the forward inputs; the int output has none.
    let names: Vec<&str> = d.graph.inputs.iter().map(|i| i.name.as_str()).collect();
    assert_eq!(names, ["x", "w", "k", "grad_y", "grad_row", "grad_s"]);
    let outs: Vec<&str> = d.graph.outputs.iter().map(|o| o.name.as_str()).collect();
    assert_eq!(outs, ["grad_x", "grad_w"]);
    assert_eq!(d.upstream[1], ("row".to_string(), "grad_row".to_string()));
    assert_eq!(d.gradients[0], ("x".to_string(), "grad_x".to_string()));
    assert_eq!(d.graph.inputs[3].shape, g.inputs[0].shape, "grad_y is shaped like y");

    for n in [1usize, 3, 7] {
        let fwd: Args = vec![
            ("x".into(), vec![n, 3], values(1, n * 3)),
            ("w".into(), vec![3], values(2, 3)),
            ("k".into(), vec![n], (0..n).map(|i| (i % 3) as f64 - 1.0).collect()),
        ];
        let (gy, grow, gs) = (values(3, n * 3), values(4, n), values(5, 1));
        let mut bwd = fwd.clone();
        bwd.push(("grad_y".into(), vec![n, 3], gy.clone()));
        bwd.push(("grad_row".into(), vec![n], grow.clone()));
        bwd.push(("grad_s".into(), vec![], gs.clone()));
        let out = eval(&d.graph, &bwd);
        // The scalar whose gradient the VJP is: sum over outputs of <output, upstream>.
        let objective = |args: &Args| {
            let o = eval(&g, args);
            let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
            dot(get(&o, "y"), &gy) + dot(get(&o, "row"), &grow) + dot(get(&o, "s"), &gs)
        };
        for (slot, name) in [(0usize, "grad_x"), (1, "grad_w")] {
            let analytic = get(&out, name);
            assert_eq!(analytic.len(), fwd[slot].2.len());
            for (i, &a) in analytic.iter().enumerate() {
                let h = 1e-6;
                let mut plus = fwd.clone();
                plus[slot].2[i] += h;
                let mut minus = fwd.clone();
                minus[slot].2[i] -= h;
                let fd = (objective(&plus) - objective(&minus)) / (2.0 * h);
                let tol = 1e-6 * a.abs().max(fd.abs()) + 1e-6;
                assert!((a - fd).abs() <= tol, "N={n} {name}[{i}]: vjp {a}, finite differences {fd}");
            }
        }
    }
}

#[test]
fn vjp_of_an_unused_input_is_zero() {
    let mut b = GraphBuilder::new();
    let n = b.symbol("N");
    let x = b.input("x", DType::F32, Shape(vec![Dim::Sym(n)])).unwrap();
    let _unused = b.input("u", DType::F32, Shape(vec![Dim::Sym(n), Dim::Const(2)])).unwrap();
    let y = b.unary(UnaryOp::Exp, x).unwrap();
    b.output("y", y).unwrap();
    let g = b.finish().unwrap();
    let d = vjp(&g, &["u", "x"]).unwrap();
    let args: Args = vec![
        ("x".into(), vec![3], vec![0.0, 1.0, -1.0]),
        ("u".into(), vec![3, 2], values(9, 6)),
        ("grad_y".into(), vec![3], vec![2.0, 3.0, 4.0]),
    ];
    let out = eval(&d.graph, &args);
    assert_eq!(get(&out, "grad_u"), [0.0; 6]);
    let gx = get(&out, "grad_x");
    for (i, (&gv, xv)) in gx.iter().zip([0.0f64, 1.0, -1.0]).enumerate() {
        let want = [2.0, 3.0, 4.0][i] * xv.exp();
        assert!((gv - want).abs() < 1e-12, "grad_x[{i}] = {gv}, want {want}");
    }
}

/// The loss of `forward` alone, as a program with a scalar output.
fn scalar_loss() -> (Graph, kfuse_ir::NodeId, kfuse_ir::NodeId, GraphBuilder) {
    let mut b = GraphBuilder::new();
    let n = b.symbol("N");
    let x = b.input("x", DType::F32, Shape(vec![Dim::Sym(n), Dim::Const(4)])).unwrap();
    let t = b.input("t", DType::F32, Shape(vec![Dim::Sym(n), Dim::Const(4)])).unwrap();
    let diff = b.binary(BinaryOp::Sub, x, t).unwrap();
    let a = b.unary(UnaryOp::Abs, diff).unwrap();
    let s = b.unary(UnaryOp::Sigmoid, a).unwrap();
    let loss = b.reduce(ReduceOp::Mean, ReduceAxis::All, s, None).unwrap();
    b.output("loss", loss).unwrap();
    let plain = GraphBuilder::from_graph(b.graph().clone());
    (b.finish().unwrap(), loss, x, plain)
}

#[test]
fn with_gradients_builds_the_graph_that_grad_builds() {
    let (g, loss, x, mut b) = scalar_loss();
    let d = with_gradients(&g, "loss", &["x"]).unwrap();
    let gx = kfuse_passes::grad(&mut b, loss, x).unwrap();
    b.output("grad_x", gx).unwrap();
    let by_hand = b.finish().unwrap();
    assert_eq!(d.graph, by_hand);
    assert_eq!(d.gradients, [("x".to_string(), "grad_x".to_string())]);
    assert!(d.upstream.is_empty());
}

#[test]
fn vjp_of_a_scalar_loss_is_the_gradient_scaled_by_upstream() {
    let (g, ..) = scalar_loss();
    let both = with_gradients(&g, "loss", &["x", "t"]).unwrap();
    let back = vjp(&g, &["x", "t"]).unwrap();
    let fwd: Args = vec![("x".into(), vec![5, 4], values(11, 20)), ("t".into(), vec![5, 4], values(12, 20))];
    let o1 = eval(&both.graph, &fwd);
    let mut args = fwd.clone();
    args.push(("grad_loss".into(), vec![], vec![-2.5]));
    let o2 = eval(&back.graph, &args);
    for name in ["grad_x", "grad_t"] {
        for (a, b) in get(&o1, name).iter().zip(get(&o2, name)) {
            assert!((a * -2.5 - b).abs() <= 1e-12 * (1.0 + b.abs()), "{name}: {a} * -2.5 != {b}");
        }
    }
}

#[test]
fn bad_requests_are_errors_naming_what_is_wrong() {
    let g = forward();
    let e = vjp(&g, &["z"]).unwrap_err();
    assert_eq!(e.to_string(), "no input named `z` to differentiate with respect to (inputs: `x`, `w`, `k`)");
    let e = vjp(&g, &["k"]).unwrap_err();
    assert_eq!(e.to_string(), "input `k` is i32; only float inputs have gradients");
    let e = vjp(&g, &["x", "x"]).unwrap_err();
    assert!(matches!(e, DeriveError::Repeated { .. }), "{e}");
    let e = with_gradients(&g, "y", &["x"]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "the loss `y` must be a scalar float, but it is f32[N, 3] (reduce it with sum or mean first)"
    );
    let e = with_gradients(&g, "c", &["x"]).unwrap_err();
    assert!(e.to_string().starts_with("the loss `c` must be a scalar float, but it is i32"), "{e}");
    let e = with_gradients(&g, "nope", &["x"]).unwrap_err();
    assert_eq!(e.to_string(), "no output named `nope` (outputs: `y`, `row`, `s`, `c`)");

    // A name the derived graph needs is taken.
    let mut b = GraphBuilder::new();
    let x = b.input("x", DType::F32, Shape::scalar()).unwrap();
    let _ = b.input("grad_x", DType::F32, Shape::scalar()).unwrap();
    b.output("y", x).unwrap();
    let g = b.finish().unwrap();
    let e = vjp(&g, &["x"]).unwrap_err();
    assert_eq!(e.to_string(), "the derived graph needs the name `grad_x`, which the graph already uses");
}
