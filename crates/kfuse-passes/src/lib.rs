//! Graph-to-graph passes over the kfuse IR: reverse-mode autodiff ([`grad`], [`backprop`]) and
//! whole-graph derivatives ([`vjp`], [`with_gradients`]).
//!
//! Passes append to or rewrite a graph through [`kfuse_ir::GraphBuilder`], so their output obeys
//! the same typing rules as hand-built graphs. They do no I/O and know nothing of GPUs.
#![forbid(unsafe_code)]

mod autodiff;
mod derive;
mod emit;
mod unbroadcast;

pub use autodiff::{backprop, grad};
pub use derive::{vjp, with_gradients, DeriveError, Derived};
