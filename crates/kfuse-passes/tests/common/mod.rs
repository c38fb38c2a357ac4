//! Shared helpers for the autodiff tests: a small problem builder, and a gradient check against
//! central finite differences, both evaluated in f64 by the reference interpreter (the oracle).
#![allow(dead_code)]

use kfuse_ir::{DType, Dim, Graph, GraphBuilder, NodeId, Shape};

/// Relative tolerance of a gradient check.
pub const RTOL: f64 = 1e-6;
/// Absolute floor of a gradient check, scaled by `1 + |loss|` (finite differences of a sum of many
/// terms lose absolute, not relative, precision).
pub const ATOL: f64 = 1e-7;

/// Inputs with their run-time values and a builder for the computation over them.
pub struct Problem {
    pub b: GraphBuilder,
    inputs: Vec<(String, NodeId, Vec<usize>, Vec<f64>)>,
}

impl Default for Problem {
    fn default() -> Self {
        Self::new()
    }
}

impl Problem {
    pub fn new() -> Self {
        Problem { b: GraphBuilder::new(), inputs: Vec::new() }
    }

    /// Declares an `f32` input; `dims` are symbol names or constants ("B", "4"), `sizes` their
    /// run-time sizes.
    pub fn input(&mut self, name: &str, dims: &[&str], sizes: &[usize], values: Vec<f64>) -> NodeId {
        self.input_typed(name, DType::F32, dims, sizes, values)
    }

    pub fn input_typed(
        &mut self,
        name: &str,
        dtype: DType,
        dims: &[&str],
        sizes: &[usize],
        values: Vec<f64>,
    ) -> NodeId {
        assert_eq!(dims.len(), sizes.len(), "test bug: dims and sizes differ in rank");
        assert_eq!(sizes.iter().product::<usize>(), values.len(), "test bug: {name} has the wrong number of values");
        let shape = self.shape(dims);
        let id = self.b.input(name, dtype, shape).expect("input declares");
        self.inputs.push((name.to_string(), id, sizes.to_vec(), values));
        id
    }

    pub fn shape(&mut self, dims: &[&str]) -> Shape {
        Shape(
            dims.iter()
                .map(|d| d.parse::<u64>().map(Dim::Const).unwrap_or_else(|_| Dim::Sym(self.b.symbol(d))))
                .collect(),
        )
    }

    fn node_of(&self, name: &str) -> NodeId {
        self.inputs.iter().find(|i| i.0 == name).map(|i| i.1).expect("test bug: unknown input")
    }

    /// Adds outputs `loss` and `grad_<name>` for each of `wrt`, and returns the verified graph.
    pub fn graph(mut self, loss: NodeId, wrt: &[&str]) -> (Graph, Inputs) {
        self.b.output("loss", loss).expect("output");
        for name in wrt {
            let x = self.node_of(name);
            let g = kfuse_passes::grad(&mut self.b, loss, x).unwrap_or_else(|e| panic!("grad w.r.t. {name}: {e}"));
            let (gn, xn) = (self.b.node(g), self.b.node(x));
            assert_eq!((gn.dtype, &gn.shape), (xn.dtype, &xn.shape), "gradient w.r.t. {name} is not typed like it");
            self.b.output(&format!("grad_{name}"), g).expect("output");
        }
        let graph = self.b.finish().unwrap_or_else(|e| panic!("graph with gradients does not verify: {e}"));
        let inputs = self.inputs.into_iter().map(|(n, _, s, v)| (n, s, v)).collect();
        (graph, Inputs(inputs))
    }

    /// Gradients of `loss` w.r.t. each of `wrt`, evaluated by the interpreter.
    pub fn gradients(self, loss: NodeId, wrt: &[&str]) -> Vec<Vec<f64>> {
        let (graph, inputs) = self.graph(loss, wrt);
        let out = inputs.eval(&graph);
        wrt.iter()
            .map(|n| out.iter().find(|e| e.name == format!("grad_{n}")).expect("grad output").values.clone())
            .collect()
    }

    /// Checks the gradients of `loss` w.r.t. each of `wrt` against central finite differences.
    pub fn check(self, loss: NodeId, wrt: &[&str]) -> Result<(), String> {
        let (graph, inputs) = self.graph(loss, wrt);
        check_graph(&graph, &inputs, wrt)
    }
}

/// Run-time input values: `(name, shape, values)`.
#[derive(Clone)]
pub struct Inputs(pub Vec<(String, Vec<usize>, Vec<f64>)>);

impl Inputs {
    pub fn eval(&self, graph: &Graph) -> Vec<kfuse_interp::Evaluated> {
        let args: Vec<(&str, Vec<usize>, Vec<f64>)> =
            self.0.iter().map(|(n, s, v)| (n.as_str(), s.clone(), v.clone())).collect();
        kfuse_interp::evaluate_f64(graph, &args).unwrap_or_else(|e| panic!("interpreter: {e}"))
    }

    fn loss(&self, graph: &Graph) -> f64 {
        let out = self.eval(graph);
        out.iter().find(|e| e.name == "loss").expect("loss output").values[0]
    }
}

/// Compares every `grad_<name>` output of `graph` with central differences of its `loss` output.
pub fn check_graph(graph: &Graph, inputs: &Inputs, wrt: &[&str]) -> Result<(), String> {
    let out = inputs.eval(graph);
    let loss = out.iter().find(|e| e.name == "loss").expect("loss output").values[0];
    if !loss.is_finite() {
        return Err(format!("loss is {loss}; the test data is outside the function's domain"));
    }
    for name in wrt {
        let analytic = &out.iter().find(|e| e.name == format!("grad_{name}")).expect("grad output").values;
        let slot = inputs.0.iter().position(|i| i.0 == *name).expect("input");
        for (i, &a) in analytic.iter().enumerate() {
            let x = inputs.0[slot].2[i];
            let h = 1e-6 * x.abs().max(1.0);
            let mut plus = inputs.clone();
            plus.0[slot].2[i] = x + h;
            let mut minus = inputs.clone();
            minus.0[slot].2[i] = x - h;
            let fd = (plus.loss(graph) - minus.loss(graph)) / (2.0 * h);
            let tol = RTOL * a.abs().max(fd.abs()) + ATOL * (1.0 + loss.abs());
            // Written so that a NaN on either side fails the check.
            let within = (a - fd).abs() <= tol;
            if !within {
                return Err(format!(
                    "d loss / d {name}[{i}] at {x}: autodiff {a}, finite differences {fd} (tolerance {tol})\n{graph}"
                ));
            }
        }
    }
    Ok(())
}

/// `sum(w * y)`: a scalar whose gradient w.r.t. `y` is `w`, so each element's gradient differs.
pub fn weighted_sum(b: &mut GraphBuilder, w: NodeId, y: NodeId) -> NodeId {
    let p = b.binary(kfuse_ir::BinaryOp::Mul, w, y).expect("mul");
    b.reduce(kfuse_ir::ReduceOp::Sum, kfuse_ir::ReduceAxis::All, p, None).expect("sum")
}

/// The smallest distance between any value and any kink (for `prop_assume!`).
pub fn distance_to(values: &[f64], kink: impl Fn(f64) -> f64) -> f64 {
    values.iter().map(|&v| kink(v).abs()).fold(f64::INFINITY, f64::min)
}
