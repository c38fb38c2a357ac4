//! [`Program`]: a type-checked computation with its kernel plan, compiled through an [`Engine`],
//! that runs on the CPU interpreter, on host tensors on a GPU, or in place on a framework's device
//! memory and stream.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use kfuse_codegen::{CodegenOptions, Plan};
use kfuse_ir::{DType, Graph, HostTensor, Interface};
use kfuse_runtime::Stream;

use crate::exec::{CudaProgram, DeviceTensor, Workspace};
use crate::{Engine, Error, Result, Validation};

/// A type-checked computation and its fused kernel plan, ready to run on the CPU or any GPU of its
/// [`Engine`]. Cheap to clone; clones share the plan and the kernels loaded on each device.
/// `Send + Sync`: one program may serve many threads.
#[derive(Clone)]
pub struct Program {
    engine: Engine,
    /// Where it came from (a file name, or what the caller said), for messages.
    origin: Arc<str>,
    /// The `.kf` text, when it came from one (needed to change input dtypes).
    source: Option<Arc<str>>,
    /// Input dtypes that replace the declared ones.
    input_dtypes: Vec<(String, DType)>,
    graph: Arc<Graph>,
    plan: Arc<Plan>,
    codegen: CodegenOptions,
    devices: Arc<Mutex<HashMap<usize, Arc<OnDevice>>>>,
}

/// A program's kernels loaded on one device, with its workspace for in-place launches.
struct OnDevice {
    exec: CudaProgram,
    workspace: Mutex<Workspace>,
}

/// Reads a `.kf` file's text: a regular file (not a directory, FIFO or device) of at most
/// [`kfuse_lang::files::MAX_SOURCE_BYTES`], in UTF-8 (a byte that is not is a diagnostic with
/// its line and column).
pub fn read_source(path: &Path) -> Result<String> {
    let bytes = kfuse_lang::files::read_source_bytes(path)?;
    Ok(kfuse_lang::source_text(bytes, &path.display().to_string())?)
}

impl Program {
    /// Parses, type-checks and plans `.kf` source; `name` is how messages name it (a file name).
    pub fn compile(engine: &Engine, source: &str, name: &str) -> Result<Program> {
        let graph = kfuse_lang::parse_program(source, name)?;
        Program::build(engine, name.into(), Some(source.into()), Vec::new(), graph, CodegenOptions::default())
    }

    /// Reads ([`read_source`]) and compiles a `.kf` file.
    pub fn load(engine: &Engine, path: &Path) -> Result<Program> {
        let source = read_source(path)?;
        Program::compile(engine, &source, &path.display().to_string())
    }

    /// Plans a graph built another way (the Rust builder, autodiff); `origin` names it in messages.
    pub fn from_graph(engine: &Engine, graph: Graph, origin: &str) -> Result<Program> {
        kfuse_ir::verify(&graph)?;
        Program::build(engine, origin.into(), None, Vec::new(), graph, CodegenOptions::default())
    }

    fn build(
        engine: &Engine,
        origin: Arc<str>,
        source: Option<Arc<str>>,
        input_dtypes: Vec<(String, DType)>,
        graph: Graph,
        codegen: CodegenOptions,
    ) -> Result<Program> {
        let plan = Arc::new(kfuse_codegen::plan(&graph, &codegen)?);
        Ok(Program {
            engine: engine.clone(),
            origin,
            source,
            input_dtypes,
            graph: Arc::new(graph),
            plan,
            codegen,
            devices: Arc::new(Mutex::new(HashMap::new())),
        })
    }

    /// The same program planned with other code generation options.
    pub fn with_codegen(&self, opts: CodegenOptions) -> Result<Program> {
        let graph = Graph::clone(&self.graph);
        Program::build(&self.engine, self.origin.clone(), self.source.clone(), self.input_dtypes.clone(), graph, opts)
    }

    /// The same source with some inputs declared at other dtypes (for example an f32 description
    /// run on bf16 tensors), type-checked again as if the source said so. Earlier replacements
    /// stay unless `dtypes` names the same input. Needs a program compiled from `.kf` source.
    pub fn with_input_dtypes(&self, dtypes: &[(&str, DType)]) -> Result<Program> {
        let source = self.source.as_ref().ok_or_else(|| Error::NoSource { origin: self.origin.to_string() })?;
        let mut merged = self.input_dtypes.clone();
        for (name, dtype) in dtypes {
            match merged.iter_mut().find(|(n, _)| n == name) {
                Some(slot) => slot.1 = *dtype,
                None => merged.push((name.to_string(), *dtype)),
            }
        }
        let pairs: Vec<(&str, DType)> = merged.iter().map(|(n, d)| (n.as_str(), *d)).collect();
        let graph = kfuse_lang::parse_program_with_dtypes(source, &self.origin, &pairs)?;
        Program::build(&self.engine, self.origin.clone(), Some(source.clone()), merged, graph, self.codegen.clone())
    }

    /// The inputs and outputs: names, dtypes, shapes in symbols, layout constraints.
    pub fn interface(&self) -> &Interface {
        &self.plan.interface
    }

    /// The typed graph.
    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// The fused kernel plan.
    pub fn plan(&self) -> &Arc<Plan> {
        &self.plan
    }

    /// The code generation options the plan was made with.
    pub fn codegen(&self) -> &CodegenOptions {
        &self.codegen
    }

    /// Where the program came from (a file name, or what the caller said).
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// The engine it compiles and runs through.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The CUDA source of every kernel of the plan, in launch order, each followed by a newline.
    pub fn cuda_source(&self) -> String {
        self.plan.kernels.iter().map(|k| format!("{}\n", k.source)).collect()
    }

    /// Checks inputs described by name, dtype and shape against the declarations: every input
    /// given once, known names, dtypes, ranks, constant dims and symbols that agree.
    pub fn check_inputs(&self, shapes: &[(&str, DType, &[usize])]) -> Result<()> {
        self.interface().bind_shapes(shapes)?;
        Ok(())
    }

    /// The outputs' names, dtypes and shapes for inputs of these shapes (each input at its
    /// declared dtype), in declaration order.
    pub fn output_shapes(&self, shapes: &[(&str, &[usize])]) -> Result<Vec<(String, DType, Vec<usize>)>> {
        let interface = self.interface();
        let known = || interface.inputs.iter().map(|i| i.name.as_str()).collect::<Vec<_>>().join(", ");
        let typed = shapes
            .iter()
            .map(|&(name, shape)| match interface.input(name) {
                Some(decl) => Ok((name, decl.dtype, shape)),
                None => Err(kfuse_ir::BindError::Unknown { name: name.to_string(), known: known() }),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let sizes = interface.bind_shapes(&typed)?;
        interface
            .outputs
            .iter()
            .map(|o| {
                let shape = interface
                    .resolve(o, &sizes)
                    .ok_or_else(|| Error::TooLarge { what: format!("output `{}`", o.name), sizes: sizes.clone() })?;
                Ok((o.name.clone(), o.dtype, shape))
            })
            .collect()
    }

    /// Runs on the CPU reference interpreter; outputs in declaration order.
    pub fn run_cpu(&self, inputs: &[(&str, &HostTensor)]) -> Result<Vec<(String, HostTensor)>> {
        Ok(kfuse_interp::run(&self.graph, inputs)?)
    }

    /// Runs on GPU `ordinal`: uploads the inputs, launches on the device's own stream, waits and
    /// downloads the outputs (declaration order).
    pub fn run_gpu(&self, ordinal: usize, inputs: &[(&str, &HostTensor)]) -> Result<Vec<(String, HostTensor)>> {
        self.on_device(ordinal)?.exec.run(inputs)
    }

    /// Launches on `stream` of GPU `ordinal` with inputs and outputs already in that device's
    /// memory (typically a framework's tensors, borrowed with [`kfuse_runtime::Gpu::borrow_memory`]
    /// from [`Engine::device`]), outputs in declaration order with the shapes
    /// [`Program::output_shapes`] gives. Queues the kernels and returns: no host synchronisation.
    ///
    /// The plan's other buffers (temporaries, partial sums, counters) live in a workspace per
    /// (program, device), shared by clones of this program. It grows on the first call and when
    /// larger sizes come: growing waits for the whole device and for the allocation, so
    /// it must not happen while a stream is being captured into a CUDA graph: make one warm-up
    /// call at the largest sizes first. Launches of one program on one device share that
    /// workspace, so they must be ordered on the GPU (one stream, or streams the caller orders).
    ///
    /// The values of `lengths` / `offsets` inputs are on the device: with
    /// [`Validation::Deferred`] the kernels check each value they read, clamp it as always,
    /// record the first violation on the device and write NaN into the outputs it affects (the
    /// loss); the next launch on that device (any program) or
    /// [`Engine::check_errors`](crate::Engine::check_errors) returns it as
    /// [`Error::DeviceInput`](crate::Error::DeviceInput). [`Validation::Off`] checks nothing. To
    /// refuse bad values before launching, check them on the host first (copy them back and use
    /// [`Interface::check_layout_values`](kfuse_ir::Interface::check_layout_values)).
    pub fn launch(
        &self,
        ordinal: usize,
        stream: &Stream,
        inputs: &[(&str, DeviceTensor)],
        outputs: &[DeviceTensor],
        validation: Validation,
    ) -> Result<()> {
        // The caller's current device (its thread's CUDA context) is left as it was.
        kfuse_runtime::preserving_thread_context(|| {
            let on = self.on_device(ordinal)?;
            let mut workspace = on.workspace.lock().unwrap_or_else(|e| e.into_inner());
            on.exec.launch_device(stream, inputs, outputs, &mut workspace, validation)
        })
    }

    /// Whether the kernels are loaded on device `ordinal` already, so that a launch there only
    /// queues them (no load, no compile).
    pub fn is_loaded(&self, ordinal: usize) -> bool {
        self.devices.lock().unwrap_or_else(|e| e.into_inner()).contains_key(&ordinal)
    }

    /// The kernels loaded on device `ordinal` (loaded on the first call; the runtime compiles each
    /// kernel once per architecture through the cache).
    fn on_device(&self, ordinal: usize) -> Result<Arc<OnDevice>> {
        if let Some(on) = self.devices.lock().unwrap_or_else(|e| e.into_inner()).get(&ordinal) {
            return Ok(on.clone());
        }
        let gpu = self.engine.device(ordinal)?;
        let exec = CudaProgram::from_plan_named(&gpu, self.plan.clone(), &self.origin)?;
        let on = Arc::new(OnDevice { exec, workspace: Mutex::new(Workspace::default()) });
        let mut devices = self.devices.lock().unwrap_or_else(|e| e.into_inner());
        Ok(devices.entry(ordinal).or_insert(on).clone())
    }
}

impl std::fmt::Debug for Program {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Program")
            .field("origin", &self.origin)
            .field("interface", self.interface())
            .field("kernels", &self.plan.kernels.len())
            .field("codegen", &self.codegen)
            .finish_non_exhaustive()
    }
}

impl CudaProgram {
    /// Loads the kernels of `program`'s plan on `gpu` (compiled through the kernel cache).
    pub fn prepare(gpu: &Arc<kfuse_runtime::Gpu>, program: &Program) -> Result<CudaProgram> {
        CudaProgram::from_plan_named(gpu, program.plan().clone(), &program.origin)
    }
}
