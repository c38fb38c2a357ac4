//! Graph-to-graph passes over the kfuse IR (autodiff; more to come).
#![forbid(unsafe_code)]

use kfuse_ir::{GraphBuilder, IrError, NodeId};

/// Appends to `b` the gradient of the scalar float node `of` with respect to the input node `wrt`
/// and returns the gradient node (shaped and typed like `wrt`).
///
/// Work in progress: reverse-mode autodiff is being written (issue 4); until then every call
/// returns [`IrError::NotDifferentiable`].
pub fn grad(b: &mut GraphBuilder, of: NodeId, wrt: NodeId) -> Result<NodeId, IrError> {
    let _ = (b, of, wrt);
    Err(IrError::NotDifferentiable { what: "grad".into(), why: "autodiff is not implemented yet".into() })
}
