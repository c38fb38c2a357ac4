//! The `Program` class: a type-checked `.kf` program seen from Python.

use kfuse::{Constraint, DType, Dim, HostTensor, Shape};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::binding::Binding;
use crate::device::engine;
use crate::dtypes::{dtype_name, parse_dtype, ShapeArg};
use crate::errors::{self, Kind};

/// A dimension as Python sees it: a symbol's name or a constant.
#[derive(IntoPyObject)]
pub enum PyDim {
    Sym(String),
    Const(u64),
}

/// One declared tensor: `(name, dtype, shape)`.
type Decl = (String, &'static str, Vec<PyDim>);
/// One declared input: `(name, dtype, shape, layout)`, the layout `None` or `(kind, dim)` with
/// kind `"lengths"` or `"offsets"`.
type InputDecl = (String, &'static str, Vec<PyDim>, Option<(&'static str, PyDim)>);
/// Host data crossing the boundary: `(name, bytes, dtype, shape)`.
pub(crate) type HostArg<'py> = (String, Bound<'py, PyBytes>, String, Vec<usize>);
/// Host data returned: `(name, bytes, dtype, shape)`.
type HostOut<'py> = (String, Bound<'py, PyBytes>, &'static str, Vec<usize>);

/// A `.kf` program, type-checked: its declared interface, generated CUDA, derived programs, shape
/// inference and the CPU reference interpreter. Immutable; derived programs are new objects.
#[pyclass(frozen, module = "kfuse._kfuse")]
pub struct Program {
    program: kfuse::Program,
}

impl Program {
    fn new(program: kfuse::Program) -> Program {
        Program { program }
    }

    fn graph(&self) -> &kfuse::Graph {
        self.program.graph()
    }

    fn derived(&self, graph: kfuse::Graph, origin: &str) -> PyResult<Program> {
        let p = kfuse::Program::from_graph(engine()?, graph, origin).map_err(errors::kfuse)?;
        Ok(Program::new(p))
    }

    fn dim(&self, d: Dim) -> PyDim {
        match d {
            Dim::Const(c) => PyDim::Const(c),
            Dim::Sym(_) => PyDim::Sym(self.graph().dim_str(d)),
        }
    }

    fn shape(&self, s: &Shape) -> Vec<PyDim> {
        s.0.iter().map(|&d| self.dim(d)).collect()
    }

    /// Host data given as `(name, bytes, dtype, shape)`, as tensors (bytes checked against the shape).
    pub(crate) fn host_tensors(inputs: &[HostArg<'_>]) -> PyResult<Vec<(String, HostTensor)>> {
        inputs
            .iter()
            .map(|(name, bytes, dtype, shape)| {
                let dtype = parse_dtype(dtype)?;
                let bytes = bytes.as_bytes();
                let t = HostTensor::from_bytes(dtype, shape.clone(), bytes).ok_or_else(|| {
                    let n: usize = shape.iter().product();
                    errors::raise(
                        Kind::Input,
                        format!(
                            "input `{name}`: {} bytes given for a {dtype}{shape:?} tensor, which holds {}",
                            bytes.len(),
                            n * dtype.size_bytes()
                        ),
                    )
                })?;
                Ok((name.clone(), t))
            })
            .collect()
    }

    pub(crate) fn sizes(&self, inputs: &[ShapeArg]) -> PyResult<Vec<u64>> {
        let parsed: Vec<(&str, DType, &[usize])> =
            inputs.iter().map(|(n, d, s)| Ok((n.as_str(), parse_dtype(d)?, s.as_slice()))).collect::<PyResult<_>>()?;
        self.program.interface().bind_shapes(&parsed).map_err(|e| errors::bind(&e))
    }
}

#[pymethods]
impl Program {
    /// Parses and type-checks `.kf` source; `name` names it in messages (`<name>`).
    #[staticmethod]
    fn compile(source: &str, name: &str) -> PyResult<Program> {
        Ok(Program::new(kfuse::Program::compile(engine()?, source, name).map_err(errors::kfuse)?))
    }

    /// Reads, parses and type-checks a `.kf` file.
    #[staticmethod]
    fn load(path: std::path::PathBuf) -> PyResult<Program> {
        Ok(Program::new(kfuse::Program::load(engine()?, &path).map_err(errors::kfuse)?))
    }

    /// Where the program came from.
    #[getter]
    fn origin(&self) -> &str {
        self.program.origin()
    }

    /// The declared inputs: `(name, dtype, shape, layout)`.
    #[getter]
    fn inputs(&self) -> Vec<InputDecl> {
        let graph = self.graph();
        graph
            .inputs
            .iter()
            .enumerate()
            .map(|(i, inp)| {
                let layout = graph.constraint_of(kfuse::InputId(i as u32)).map(|c| {
                    let kind = match c {
                        Constraint::Lengths { .. } => "lengths",
                        Constraint::Offsets { .. } => "offsets",
                    };
                    (kind, self.dim(c.dim()))
                });
                (inp.name.clone(), dtype_name(inp.dtype), self.shape(&inp.shape), layout)
            })
            .collect()
    }

    /// The positions of the inputs declared `as lengths(..)` or `as offsets(..)` (cheap: what a
    /// call checks before a launch).
    #[getter]
    fn layout_inputs(&self) -> Vec<usize> {
        let graph = self.graph();
        (0..graph.inputs.len()).filter(|&i| graph.constraint_of(kfuse::InputId(i as u32)).is_some()).collect()
    }

    /// The declared outputs, in order: `(name, dtype, shape)`.
    #[getter]
    fn outputs(&self) -> Vec<Decl> {
        let graph = self.graph();
        graph
            .outputs
            .iter()
            .map(|o| {
                let n = graph.node(o.node);
                (o.name.clone(), dtype_name(n.dtype), self.shape(&n.shape))
            })
            .collect()
    }

    /// The typed graph, one node per line, as `kfuse check` prints it.
    fn graph_text(&self) -> String {
        self.graph().to_string()
    }

    /// The CUDA source of every kernel the program runs as.
    fn cuda_source(&self) -> String {
        self.program.cuda_source()
    }

    /// For each kernel of the plan, the most elements one of its elements reads again through
    /// reductions computed where they are used (`Kernel::recompute`: 2^64 - 1 for a count known
    /// only at run time, 0 for none).
    fn recompute(&self) -> Vec<u64> {
        self.program.plan().kernels.iter().map(|k| k.recompute).collect()
    }

    /// Makes the program's kernels ready in the kernel cache, for GPU `ordinal` or for `arch`
    /// (such as `"sm_90"`; NVRTC only, no GPU), one after the other: `(kernel name, "compiled",
    /// "disk", "memory" or "repaired", seconds)` each. Releases the GIL while NVRTC works.
    #[pyo3(signature = (ordinal=None, arch=None))]
    fn build_kernels(
        &self,
        py: Python<'_>,
        ordinal: Option<usize>,
        arch: Option<String>,
    ) -> PyResult<Vec<(String, &'static str, f64)>> {
        let target =
            match (ordinal, arch) {
                (Some(o), None) => kfuse::BuildTarget::Device(o),
                (None, Some(a)) => kfuse::BuildTarget::Arch(a.parse().map_err(|e: kfuse::ParseArchError| {
                    errors::raise(Kind::Input, format!("build_kernels: {e} (an architecture is written like sm_90)"))
                })?),
                _ => return Err(errors::raise(
                    Kind::Input,
                    "build_kernels takes a device ordinal or an architecture (such as arch=\"sm_90\"), one of the two",
                )),
            };
        let program = &self.program;
        let builds = py.detach(|| program.build_kernels(target)).map_err(errors::kfuse)?;
        Ok(builds
            .into_iter()
            .map(|b| {
                let how = match b.outcome {
                    kfuse::CacheOutcome::Compiled => "compiled",
                    kfuse::CacheOutcome::DiskHit => "disk",
                    kfuse::CacheOutcome::MemoryHit => "memory",
                    kfuse::CacheOutcome::Repaired => "repaired",
                };
                (b.name, how, b.seconds)
            })
            .collect())
    }

    /// The same program with some inputs declared at other dtypes (`[("pred", "bf16")]`); the
    /// whole program is typed again, as if its source said so.
    fn with_input_dtypes(&self, dtypes: Vec<(String, String)>) -> PyResult<Program> {
        let parsed: Vec<(String, DType)> =
            dtypes.into_iter().map(|(n, d)| Ok((n, parse_dtype(&d)?))).collect::<PyResult<_>>()?;
        let graph = self.graph();
        if let Some((name, _)) = parsed.iter().find(|(n, _)| graph.input_by_name(n).is_none()) {
            let known = graph.inputs.iter().map(|i| format!("`{}`", i.name)).collect::<Vec<_>>().join(", ");
            return Err(errors::raise(Kind::Input, format!("no input named `{name}` (inputs: {known})")));
        }
        let refs: Vec<(&str, DType)> = parsed.iter().map(|(n, d)| (n.as_str(), *d)).collect();
        Ok(Program::new(self.program.with_input_dtypes(&refs).map_err(errors::kfuse)?))
    }

    /// The vector–Jacobian product with respect to the inputs `wrt`: the derived program, the
    /// `(output, upstream input)` pairs and the `(input, gradient output)` pairs.
    #[allow(clippy::type_complexity)]
    fn vjp(&self, wrt: Vec<String>) -> PyResult<(Program, Vec<(String, String)>, Vec<(String, String)>)> {
        let names: Vec<&str> = wrt.iter().map(String::as_str).collect();
        let d = kfuse::vjp(self.graph(), &names).map_err(|e| errors::kfuse(e.into()))?;
        let origin = format!("vjp of {} w.r.t. {}", self.program.origin(), wrt.join(", "));
        Ok((self.derived(d.graph, &origin)?, d.upstream, d.gradients))
    }

    /// The program with, after its outputs, the gradient of its scalar output `loss` with respect
    /// to each of `wrt` (`grad_<input>`), in one fused program; and the `(input, output)` pairs.
    fn with_gradients(&self, loss: &str, wrt: Vec<String>) -> PyResult<(Program, Vec<(String, String)>)> {
        let names: Vec<&str> = wrt.iter().map(String::as_str).collect();
        let (program, gradients) = self.program.with_gradients(loss, &names).map_err(errors::kfuse)?;
        Ok((Program::new(program), gradients))
    }

    /// The program with only the outputs named (in that order); what they do not need is dropped.
    fn select_outputs(&self, names: Vec<String>) -> PyResult<Program> {
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        Ok(Program::new(self.program.select_outputs(&refs).map_err(errors::kfuse)?))
    }

    /// Checks the inputs' names, dtypes and shapes (`(name, dtype, shape)` each) and returns the
    /// program bound to those shapes: its outputs' shapes, the check of lengths/offsets values and
    /// the CUDA launch. `strides` holds `(name, strides)` of the inputs that are views which are
    /// not contiguous (strides in elements, as `Tensor.stride()` gives them): they are read in
    /// place by kernels planned for it (compiled on the first launch).
    #[pyo3(signature = (inputs, strides=Vec::new()))]
    fn bind(&self, inputs: Vec<ShapeArg>, strides: Vec<(String, Vec<usize>)>) -> PyResult<Binding> {
        let sizes = self.sizes(&inputs)?;
        Binding::new(self.program.clone(), &inputs, &strides, sizes)
    }

    /// Runs the CPU reference interpreter: `(name, bytes, dtype, shape)` in, the outputs the same
    /// way out, in declaration order. Releases the GIL while it computes. Every float value is
    /// rounded to f32 as the kernels compute it (`Program::run_cpu_f32`), not kept in f64: a value
    /// that one program stores and another computes again (the maximum a backward compares its
    /// operand with, to find the elements that attain it) is then the same in both.
    fn run_cpu<'py>(&self, py: Python<'py>, inputs: Vec<HostArg<'py>>) -> PyResult<Vec<HostOut<'py>>> {
        let tensors = Program::host_tensors(&inputs)?;
        let program = &self.program;
        let result = py.detach(|| {
            let refs: Vec<(&str, &HostTensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
            program.run_cpu_f32(&refs)
        });
        let outs = result.map_err(errors::kfuse)?;
        Ok(outs
            .into_iter()
            .map(|(name, t)| (name, PyBytes::new(py, &t.to_bytes()), dtype_name(t.dtype()), t.shape.clone()))
            .collect())
    }

    fn __repr__(&self) -> String {
        let graph = self.graph();
        let ins: Vec<String> =
            graph.inputs.iter().map(|i| format!("{}: {}{}", i.name, i.dtype, graph.shape_str(&i.shape))).collect();
        let outs: Vec<&str> = graph.outputs.iter().map(|o| o.name.as_str()).collect();
        format!("<kfuse.Program {} ({}) -> ({})>", self.program.origin(), ins.join(", "), outs.join(", "))
    }
}
