//! kfuse: run-time kernel fusion.
//!
//! A `.kf` description (or a graph built with [`kfuse_ir::GraphBuilder`]) is type-checked into an
//! IR graph, fused into CUDA kernels generated at run time, compiled with NVRTC for the GPU that is
//! found, cached on disk and in memory, and launched. The same graph runs on the CPU through the
//! reference interpreter, which is also the oracle of every GPU test.
//!
//! This crate is the facade: [`Program`] ties the layers together, [`exec`] runs a kernel plan on
//! a GPU, [`bench`] times it, [`npy`] and [`boxes`] feed it data. The command-line tool `kfuse` is
//! a thin layer over this crate.
#![forbid(unsafe_code)]

pub mod bench;
pub mod boxes;
pub mod cachebench;
pub mod demo;
pub mod exec;
pub mod mlp;
pub mod npy;
pub mod testdata;

use std::path::Path;

pub use kfuse_ir::{DType, Graph, HostTensor};

/// Everything that can go wrong between a description and its results.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read {path}: {source}")]
    Read { path: String, source: std::io::Error },
    /// Boxed: a diagnostic carries its source line and is much larger than the other errors.
    #[error(transparent)]
    Parse(Box<kfuse_lang::Diagnostic>),
    #[error(transparent)]
    Ir(#[from] kfuse_ir::IrError),
    #[error(transparent)]
    Bind(#[from] kfuse_ir::BindError),
    #[error(transparent)]
    Interp(#[from] kfuse_interp::InterpError),
    #[error(transparent)]
    Codegen(#[from] kfuse_codegen::CodegenError),
    #[error(transparent)]
    Runtime(#[from] kfuse_runtime::RuntimeError),
    #[error(transparent)]
    Mlp(#[from] kfuse_mlp::MlpError),
    #[error(transparent)]
    Npy(#[from] npy::NpyError),
    #[error(transparent)]
    Gen(#[from] boxes::GenError),
    #[error("{0}")]
    Exec(String),
}

impl From<kfuse_lang::Diagnostic> for Error {
    fn from(d: kfuse_lang::Diagnostic) -> Error {
        Error::Parse(Box::new(d))
    }
}

/// A type-checked computation, ready to run on either device.
#[derive(Clone, Debug)]
pub struct Program {
    /// Where it came from (a file name, or `<builder>`), for messages.
    pub origin: String,
    pub graph: Graph,
    /// Code generation choices (block size, elements per thread); the defaults unless a caller
    /// tunes them.
    pub codegen: kfuse_codegen::CodegenOptions,
}

impl Program {
    /// Parses and type-checks a `.kf` file.
    pub fn from_file(path: &Path) -> Result<Program, Error> {
        let source =
            std::fs::read_to_string(path).map_err(|source| Error::Read { path: path.display().to_string(), source })?;
        Program::from_source(&source, &path.display().to_string())
    }

    /// Parses and type-checks `.kf` source; `file_name` appears in diagnostics.
    pub fn from_source(source: &str, file_name: &str) -> Result<Program, Error> {
        let graph = kfuse_lang::parse_program(source, file_name)?;
        Ok(Program { origin: file_name.to_string(), graph, codegen: Default::default() })
    }

    /// Wraps a graph built with the Rust builder.
    pub fn from_graph(graph: Graph) -> Program {
        Program { origin: "<builder>".into(), graph, codegen: Default::default() }
    }

    /// The fused kernel plan (generated CUDA included); pure, needs no GPU.
    pub fn plan(&self) -> Result<kfuse_codegen::Plan, Error> {
        Ok(kfuse_codegen::plan(&self.graph, &self.codegen)?)
    }

    /// Runs on the CPU reference interpreter; outputs in declaration order.
    pub fn run_cpu(&self, inputs: &[(&str, &HostTensor)]) -> Result<Vec<(String, HostTensor)>, Error> {
        Ok(kfuse_interp::run(&self.graph, inputs)?)
    }
}
