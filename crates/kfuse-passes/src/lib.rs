//! Graph-to-graph passes over the kfuse IR: reverse-mode autodiff ([`grad`]).
//!
//! Passes append to or rewrite a graph through [`kfuse_ir::GraphBuilder`], so their output obeys
//! the same typing rules as hand-built graphs. They do no I/O and know nothing of GPUs.
#![forbid(unsafe_code)]

mod autodiff;
mod emit;
mod unbroadcast;

pub use autodiff::grad;
