//! The kfuse intermediate representation: a typed, hash-consed graph of small `Copy` ops over
//! tensors with symbolic shapes.
//!
//! Everything that describes a computation (the `.kf` language, the Rust builder, the MLP model
//! loader, autodiff) produces a [`Graph`]; everything that executes one (the CPU interpreter, the
//! kernel planner and CUDA code generator) consumes it. This crate does no I/O and knows nothing of
//! GPUs.
//!
//! Semantics in one paragraph: every node has a storage [`DType`] and a symbolic [`Shape`].
//! Floating-point values (`f32`, `f16`, `bf16`) are *computed* in at least f32 (the GPU) or f64 (the
//! interpreter); the dtype only says how a value is stored when it is an output, so interior
//! `f16` values are never rounded. Binary ops broadcast like NumPy. The [`GraphBuilder`] holds every
//! typing rule; it inserts explicit [`Op::Cast`]s so that the operands of a binary op always share a
//! [`Kind`] (float, int or bool).
#![forbid(unsafe_code)]

mod builder;
mod dtype;
mod error;
mod graph;
mod hash;
mod interface;
pub mod philox;
mod shape;
mod tensor;
mod verify;

pub use builder::GraphBuilder;
pub use dtype::{DType, Kind};
pub use error::{BindError, IrError};
pub use graph::{
    BinaryOp, Constraint, Graph, Input, InputId, ListId, Literal, Node, NodeId, Op, Output, ReduceAxis, ReduceOp,
    TernaryOp, UnaryOp,
};
pub use hash::GraphHash;
pub use interface::{Interface, LayoutConstraint, MinSize, TensorDecl};
pub use shape::{broadcast_shapes, reshape_groups, Dim, ReshapeGroup, Shape, SymId};
pub use tensor::{HostTensor, SymbolBindings, TensorData};
pub use verify::verify;
