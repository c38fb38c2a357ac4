//! Whole-graph derivatives: the vector–Jacobian product of a graph ([`vjp`]) and a scalar loss
//! together with its gradients ([`with_gradients`]), each a new graph that runs like any other.

use kfuse_ir::{Graph, GraphBuilder, IrError, NodeId};

use crate::autodiff::backprop;
use crate::emit::Emitter;

/// A graph derived from another, with the correspondence between their names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Derived {
    pub graph: Graph,
    /// `(output, upstream input)`: for each differentiable output of the forward graph, the input
    /// of the derived graph that receives the gradient flowing into it (`grad_<output>`). Empty
    /// for [`with_gradients`].
    pub upstream: Vec<(String, String)>,
    /// `(input, gradient output)`: for each input differentiated, the output of the derived graph
    /// that holds its gradient (`grad_<input>`).
    pub gradients: Vec<(String, String)>,
}

/// A derivative that cannot be built.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DeriveError {
    #[error("no input named `{name}` to differentiate with respect to (inputs: {known})")]
    UnknownInput { name: String, known: String },
    #[error("no output named `{name}` (outputs: {known})")]
    UnknownOutput { name: String, known: String },
    #[error("input `{name}` is {dtype}; only float inputs have gradients")]
    NotFloatInput { name: String, dtype: kfuse_ir::DType },
    #[error("input `{name}` is listed twice")]
    Repeated { name: String },
    #[error("the loss `{name}` must be a scalar float, but it is {ty} (reduce it with sum or mean first)")]
    NotScalarLoss { name: String, ty: String },
    #[error("the derived graph needs the name `{name}`, which the graph already uses")]
    NameClash { name: String },
    #[error("the graph has no float output to differentiate")]
    NoFloatOutput,
    #[error(transparent)]
    Ir(#[from] IrError),
}

fn names<'a>(it: impl Iterator<Item = &'a str>) -> String {
    let v: Vec<_> = it.map(|n| format!("`{n}`")).collect();
    if v.is_empty() {
        "none".into()
    } else {
        v.join(", ")
    }
}

/// The nodes that read the inputs named in `wrt`.
fn wrt_nodes(b: &mut GraphBuilder, wrt: &[&str]) -> Result<Vec<NodeId>, DeriveError> {
    let mut out = Vec::with_capacity(wrt.len());
    for (i, &name) in wrt.iter().enumerate() {
        if wrt[..i].contains(&name) {
            return Err(DeriveError::Repeated { name: name.into() });
        }
        let g = b.graph();
        let Some(id) = g.input_by_name(name) else {
            let known = names(g.inputs.iter().map(|i| i.name.as_str()));
            return Err(DeriveError::UnknownInput { name: name.into(), known });
        };
        let input = g.input(id).clone();
        if !input.dtype.is_float() {
            return Err(DeriveError::NotFloatInput { name: name.into(), dtype: input.dtype });
        }
        let Some(node) = g.input_node(id) else {
            return Err(DeriveError::Ir(IrError::Malformed(format!("no node reads input `{name}`"))));
        };
        out.push(node);
    }
    Ok(out)
}

fn grad_name(g: &Graph, name: &str) -> Result<String, DeriveError> {
    let n = format!("grad_{name}");
    if g.input_by_name(&n).is_some() || g.output_by_name(&n).is_some() {
        return Err(DeriveError::NameClash { name: n });
    }
    Ok(n)
}

/// The vector–Jacobian product of `graph` with respect to the inputs `wrt`.
///
/// The derived graph's inputs are the forward inputs (same names, order, layouts) followed by one
/// upstream gradient `grad_<output>` per float output (typed and shaped like that output); its
/// outputs are `grad_<input>` for each of `wrt`, in order: the sum over the outputs of
/// `grad_outputᵀ · ∂output/∂input`, typed and shaped like the input. Non-float outputs carry no
/// gradient and get no upstream input. This is the backward pass of `graph` as PyTorch's autograd
/// calls it.
pub fn vjp(graph: &Graph, wrt: &[&str]) -> Result<Derived, DeriveError> {
    let mut b = GraphBuilder::from_graph(graph.clone());
    let xs = wrt_nodes(&mut b, wrt)?;
    let mut seeds = Vec::new();
    let mut upstream = Vec::new();
    for out in &graph.outputs {
        let node = b.node(out.node).clone();
        if !node.dtype.is_float() {
            continue;
        }
        let name = grad_name(graph, &out.name)?;
        let seed = b.input(&name, node.dtype, node.shape.clone())?;
        seeds.push((out.node, seed));
        upstream.push((out.name.clone(), name));
    }
    if seeds.is_empty() {
        return Err(DeriveError::NoFloatOutput);
    }
    let grads = backprop(&mut b, &seeds, &xs)?;
    // The derived graph outputs only the gradients.
    let mut g = b.graph().clone();
    g.outputs.clear();
    let mut b = GraphBuilder::from_graph(g);
    let mut gradients = Vec::new();
    for (&name, &gnode) in wrt.iter().zip(&grads) {
        let out = grad_name(graph, name)?;
        b.output(&out, gnode)?;
        gradients.push((name.to_string(), out));
    }
    Ok(Derived { graph: b.finish()?, upstream, gradients })
}

/// `graph` with, after its own outputs, `grad_<input>` for each of `wrt`: the gradient of the
/// scalar float output `loss` with respect to that input (as the language's `grad(loss, input)`
/// computes it). The loss and its gradients then run as one fused program.
pub fn with_gradients(graph: &Graph, loss: &str, wrt: &[&str]) -> Result<Derived, DeriveError> {
    let Some(out) = graph.output_by_name(loss) else {
        let known = names(graph.outputs.iter().map(|o| o.name.as_str()));
        return Err(DeriveError::UnknownOutput { name: loss.into(), known });
    };
    let of = out.node;
    let n = graph.node(of);
    if !n.dtype.is_float() || !n.shape.is_scalar() {
        return Err(DeriveError::NotScalarLoss {
            name: loss.into(),
            ty: format!("{}{}", n.dtype, graph.shape_str(&n.shape)),
        });
    }
    let mut b = GraphBuilder::from_graph(graph.clone());
    let xs = wrt_nodes(&mut b, wrt)?;
    let one = Emitter { b: &mut b }.lit(1.0);
    let grads = backprop(&mut b, &[(of, one)], &xs)?;
    let mut gradients = Vec::new();
    for (&name, &gnode) in wrt.iter().zip(&grads) {
        let out = grad_name(graph, name)?;
        b.output(&out, gnode)?;
        gradients.push((name.to_string(), out));
    }
    Ok(Derived { graph: b.finish()?, upstream: Vec::new(), gradients })
}
