//! Activations: each layer's activation is a `.kf` expression in `x` (a named activation is just
//! a fixed expression from [`NAMED_ACTIVATIONS`]), so one mechanism serves both: the expression is
//! parsed by kfuse-lang, evaluated on the CPU by kfuse-interp and inlined into the fused kernel as
//! a `__device__` function emitted by kfuse-codegen.
//!
//! Handles: named activations, arbitrary elementwise expressions of `x` (constants, arithmetic,
//! comparisons, `where`, math functions). Does not handle: expressions of other variables, of
//! several elements (reductions, component access), or non-float results; each is an error
//! naming the layer.

use kfuse_ir::{DType, Dim, Graph, Shape};

use crate::error::{MlpError, Result};

/// The named activations and the `.kf` expressions that define them (PyTorch's definitions:
/// `leaky_relu` uses slope 0.01, `softplus` beta 1 with threshold 20, `gelu` the exact erf form).
pub const NAMED_ACTIVATIONS: [(&str, &str); 11] = [
    ("none", "x"),
    ("relu", "max(x, 0)"),
    ("leaky_relu", "where(x > 0, x, 0.01 * x)"),
    ("silu", "x * sigmoid(x)"),
    ("gelu", "0.5 * x * (1 + erf(x * 0.7071067811865476))"),
    ("gelu_tanh", "0.5 * x * (1 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))"),
    ("sigmoid", "sigmoid(x)"),
    ("tanh", "tanh(x)"),
    ("softplus", "where(x > 20, x, log(1 + exp(x)))"),
    ("sin", "sin(x)"),
    ("exp", "exp(x)"),
];

/// How the fused kernel evaluates an activation: the two that dominate real models get
/// hand-written packed forms (see `mlp_prelude.cuh`); every other expression goes through the
/// f32 device function that kfuse-codegen emits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActivationKind {
    /// `x`: nothing to do.
    Identity,
    /// Exactly the `relu` expression, `max(x, 0)`.
    Relu,
    /// Exactly the `silu` expression, `x * sigmoid(x)`.
    Silu,
    /// Any other expression.
    Expression,
}

/// One layer's activation: what the user wrote and the expression it stands for.
#[derive(Clone, Debug, PartialEq)]
pub struct Activation {
    /// The text from model.json (a name or an expression).
    pub spec: String,
    /// The `.kf` expression in `x` (equal to `spec` for a custom expression).
    pub expression: String,
    /// The expression parsed with a scalar f32 `x`; its output `y` is the activation.
    pub graph: Graph,
}

fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Parses `expression` with `x: f32<shape>` and checks that it yields one float per element.
fn parse(layer: usize, expression: &str, shape: Shape) -> Result<Graph> {
    let graph = kfuse_lang::parse_expression(expression, &[("x", DType::F32, shape.clone())])
        .map_err(|d| MlpError::ActivationParse { layer, expression: expression.to_string(), message: d.to_string() })?;
    let out = graph.outputs.first().map(|o| graph.node(o.node));
    match out {
        Some(node) if node.dtype.is_float() && node.shape.broadcasts_to(&shape) => Ok(graph),
        Some(node) => Err(MlpError::ActivationType {
            layer,
            expression: expression.to_string(),
            found: format!("{}{}", node.dtype, graph.shape_str(&node.shape)),
        }),
        None => {
            Err(MlpError::ActivationType { layer, expression: expression.to_string(), found: "no output".to_string() })
        }
    }
}

impl Activation {
    /// Resolves layer `layer`'s activation text: a name from [`NAMED_ACTIVATIONS`] or an
    /// expression in `x`. A bare identifier that is neither a known name nor `x` is reported as
    /// an unknown name (with the list of known ones) rather than as an undefined variable.
    pub fn resolve(layer: usize, spec: &str) -> Result<Activation> {
        let spec = spec.trim();
        let expression = if is_identifier(spec) && spec != "x" {
            match NAMED_ACTIVATIONS.iter().find(|(n, _)| *n == spec) {
                Some((_, e)) => e.to_string(),
                None => {
                    let known = NAMED_ACTIVATIONS.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(" ");
                    return Err(MlpError::UnknownActivation { layer, name: spec.to_string(), known });
                }
            }
        } else {
            spec.to_string()
        };
        let graph = parse(layer, &expression, Shape::scalar())?;
        Ok(Activation { spec: spec.to_string(), expression, graph })
    }

    /// Whether this is the identity (`none` or `x`); the kernel then skips the call.
    pub fn is_identity(&self) -> bool {
        self.expression.trim() == "x"
    }

    /// Which evaluation the fused kernel uses: the hand-written relu or silu when the expression
    /// is exactly the named one's (however it was written in model.json), else the generic one.
    pub fn kind(&self) -> ActivationKind {
        let e = self.expression.trim();
        let named = |n: &str| NAMED_ACTIVATIONS.iter().find(|(name, _)| *name == n).map(|(_, x)| *x);
        if e == "x" {
            ActivationKind::Identity
        } else if Some(e) == named("relu") {
            ActivationKind::Relu
        } else if Some(e) == named("silu") {
            ActivationKind::Silu
        } else {
            ActivationKind::Expression
        }
    }

    /// Evaluates the activation on every element of `values` with the CPU interpreter, in f64.
    /// `layer` only labels errors.
    pub fn evaluate_f64(&self, layer: usize, values: Vec<f64>) -> Result<Vec<f64>> {
        if self.is_identity() {
            return Ok(values);
        }
        let n = values.len();
        let eval_err =
            |message: String| MlpError::ActivationEval { layer, expression: self.expression.clone(), message };
        let n64 = u64::try_from(n).map_err(|_| eval_err(format!("{n} elements")))?;
        // The expression is re-parsed with a 1-D `x` of exactly this length, so the interpreter
        // evaluates the whole chunk in one call (a scalar `x` would need one call per element).
        let graph = parse(layer, &self.expression, Shape(vec![Dim::Const(n64)]))?;
        let mut outs =
            kfuse_interp::evaluate_f64(&graph, &[("x", vec![n], values)]).map_err(|e| eval_err(e.to_string()))?;
        let out = outs.pop().ok_or_else(|| eval_err("the expression has no output".to_string()))?;
        if out.values.len() == n {
            Ok(out.values)
        } else if out.values.len() == 1 {
            // A constant expression (e.g. "0") broadcasts to every element.
            Ok(vec![out.values[0]; n])
        } else {
            Err(eval_err(format!("produced {} values for {n} inputs", out.values.len())))
        }
    }

    /// The activation as a header-free `__device__ __forceinline__ float <fn_name>(float x)`.
    pub fn device_function(&self, layer: usize, fn_name: &str) -> Result<String> {
        kfuse_codegen::emit_device_function(&self.graph, fn_name).map_err(|e| MlpError::ActivationCodegen {
            layer,
            expression: self.expression.clone(),
            message: e.to_string(),
        })
    }
}
