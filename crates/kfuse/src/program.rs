//! [`Program`]: a type-checked computation with its kernel plan, compiled through an [`Engine`],
//! that runs on the CPU interpreter, on host tensors on a GPU, or in place on a framework's device
//! memory and stream.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use kfuse_codegen::{CodegenOptions, Plan};
use kfuse_ir::{DType, Graph, HostTensor, Interface};
use kfuse_runtime::{Arch, CacheOutcome, CompileOptions, Stream};

use crate::exec::{
    byte_count, contiguous_strides, is_aligned, misaligned, span_bytes, CudaProgram, DeviceTensor, Io, Workspace,
};
use crate::{Engine, Error, Result, Validation};

/// A kernel whose elements each read at most this many elements again through reductions computed
/// where they are used ([`kfuse_codegen::Kernel::recompute`]) is not warned of by `kfuse check
/// --plan`; the `torch.compile` backend leaves a region with more to PyTorch. The planner stores a
/// reduction along other axes than the last over more elements than this once.
pub use kfuse_codegen::RECOMPUTED_EXTENT_LIMIT;

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
    /// The (gradient, upstream) dtype pairs its backward scales with
    /// [`scale_by_upstream`](crate::scale_by_upstream): set for a [`Program::with_gradients`]
    /// program, whose device load then loads those scaling kernels too.
    scaled: Vec<(DType, DType)>,
    devices: Arc<Mutex<HashMap<usize, Arc<OnDevice>>>>,
    /// The same program planned to read some inputs through their strides (see
    /// [`Program::reading_strided`]), by those inputs' indices.
    strided: Arc<Mutex<HashMap<Vec<u32>, Program>>>,
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
            scaled: Vec::new(),
            devices: Arc::new(Mutex::new(HashMap::new())),
            strided: Arc::new(Mutex::new(HashMap::new())),
        })
    }

    /// The program with, after its outputs, the gradient of its scalar output `loss` with respect
    /// to each of `wrt` (`grad_<input>`), in one fused program ([`crate::with_gradients`]); and the
    /// `(input, gradient output)` pairs. Its backward scales the gradients by the loss's upstream
    /// gradient ([`crate::scale_by_upstream`]), so loading it on a device loads the scaling kernel
    /// of each (gradient, loss) dtype pair too, compiled in parallel with its own when not cached:
    /// the first backward then compiles nothing.
    pub fn with_gradients(&self, loss: &str, wrt: &[&str]) -> Result<(Program, Vec<(String, String)>)> {
        let derived = kfuse_passes::with_gradients(&self.graph, loss, wrt)?;
        let origin = format!("{} with gradients of `{loss}`", self.origin);
        let mut program = Program::from_graph(&self.engine, derived.graph, &origin)?;
        let interface = program.interface();
        let dtype_of = |name: &str| interface.outputs.iter().find(|o| o.name == name).map(|o| o.dtype);
        let mut scaled = Vec::new();
        if let Some(upstream) = dtype_of(loss) {
            for grad in derived.gradients.iter().filter_map(|(_, g)| dtype_of(g)) {
                if !scaled.contains(&(grad, upstream)) {
                    scaled.push((grad, upstream));
                }
            }
        }
        program.scaled = scaled;
        Ok((program, derived.gradients))
    }

    /// The kernels (CUDA source, name) that loading this program on a device compiles when the
    /// cache does not hold them: the plan's, then, for a [`Program::with_gradients`] program, the
    /// gradient-scaling kernel of each of its (gradient, loss) dtype pairs. None depends on sizes,
    /// so a new batch size compiles nothing.
    pub fn device_kernels(&self) -> Vec<(&str, &str)> {
        let plan = self.plan.kernels.iter().flat_map(|k| k.entries());
        plan.chain(self.scaling_kernels().map(|(s, n)| -> (&str, &str) { (s, n) })).collect()
    }

    /// Makes each kernel that loading this program compiles ([`Program::device_kernels`]) ready
    /// in the kernel cache for `target`, one after the other: NVRTC compiles those the cache holds
    /// neither in memory nor on disk. Says for each where it came from and how long that took
    /// (what `kfuse.explain` reports). [`BuildTarget::Arch`] needs libnvrtc and no GPU.
    pub fn build_kernels(&self, target: BuildTarget) -> Result<Vec<KernelBuild>> {
        let (opts, cache) = match target {
            BuildTarget::Device(ordinal) => {
                let gpu = self.engine.device(ordinal)?;
                (gpu.kernel_options(), gpu.cache().clone())
            }
            BuildTarget::Arch(arch) => (CompileOptions::for_kernels(arch), self.engine.cache().clone()),
        };
        self.device_kernels()
            .into_iter()
            .map(|(source, name)| {
                let started = std::time::Instant::now();
                let (_, outcome) = cache.get_or_compile(source, &opts)?;
                Ok(KernelBuild { name: name.to_string(), outcome, seconds: started.elapsed().as_secs_f64() })
            })
            .collect()
    }

    fn scaling_kernels(&self) -> impl Iterator<Item = (&'static str, &'static str)> + '_ {
        self.scaled.iter().filter_map(|&(g, u)| crate::scale::kernel(g, u)).map(|(s, n)| (s.as_str(), n.as_str()))
    }

    /// The same program planned with other code generation options.
    pub fn with_codegen(&self, opts: CodegenOptions) -> Result<Program> {
        let graph = Graph::clone(&self.graph);
        let mut program = Program::build(
            &self.engine,
            self.origin.clone(),
            self.source.clone(),
            self.input_dtypes.clone(),
            graph,
            opts,
        )?;
        program.scaled = self.scaled.clone();
        Ok(program)
    }

    /// This program, or the same one planned to read `inputs` (declared input indices,
    /// ascending) through strides given at launch as well as those it reads so already, so that
    /// views of those inputs that are not contiguous are read in place. Built once per set of
    /// inputs and kept (clones share it); any strides of those inputs then run the same kernels.
    pub fn reading_strided(&self, inputs: &[u32]) -> Result<Program> {
        let have = &self.codegen.strided_inputs;
        if inputs.iter().all(|i| have.contains(i)) {
            return Ok(self.clone());
        }
        let mut strided: Vec<u32> = have.iter().chain(inputs).copied().collect();
        strided.sort_unstable();
        strided.dedup();
        let mut variants = self.strided.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = variants.get(&strided) {
            return Ok(p.clone());
        }
        let opts = CodegenOptions { strided_inputs: strided.clone(), ..self.codegen.clone() };
        let program = self.with_codegen(opts)?;
        variants.insert(strided, program.clone());
        Ok(program)
    }

    /// The declared indices of the inputs among `given` (name, whether contiguous) that are not
    /// contiguous.
    fn strided_inputs<'n>(&self, given: impl Iterator<Item = (&'n str, bool)>) -> Vec<u32> {
        let inputs = &self.interface().inputs;
        let mut strided: Vec<u32> = given
            .filter(|(_, contiguous)| !contiguous)
            .filter_map(|(name, _)| inputs.iter().position(|d| d.name == name).map(|i| i as u32))
            .collect();
        strided.sort_unstable();
        strided
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

    /// The same computation with only the outputs named, in that order; what they do not need is
    /// dropped from the graph (and from its kernels).
    pub fn select_outputs(&self, names: &[&str]) -> Result<Program> {
        let graph = self.graph();
        let mut outputs = Vec::with_capacity(names.len());
        for name in names {
            let Some(o) = graph.output_by_name(name) else {
                let known = graph.outputs.iter().map(|o| format!("`{}`", o.name)).collect::<Vec<_>>().join(", ");
                return Err(Error::NoOutput { name: name.to_string(), known });
            };
            outputs.push(o.clone());
        }
        let mut selected = Graph::clone(graph);
        selected.outputs = outputs;
        let selected = kfuse_ir::GraphBuilder::from_graph(selected).finish()?;
        let origin = format!("{} (outputs {})", self.origin, names.join(", "));
        Program::build(&self.engine, origin.into(), None, Vec::new(), selected, self.codegen.clone())
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

    /// The CUDA source of every kernel of the plan, in launch order, each translation unit (a
    /// kernel's second entry point for rows in registers has its own) followed by a newline.
    pub fn cuda_source(&self) -> String {
        self.plan.kernels.iter().flat_map(|k| k.entries()).map(|(source, _)| format!("{source}\n")).collect()
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

    /// [`Program::run_cpu`] with every float value inside the program rounded to f32, as the
    /// kernels compute: its difference from `run_cpu` is how far f32 rounding alone moves each
    /// output (tests allow the GPU that much; see [`kfuse_interp::Precision`]).
    pub fn run_cpu_f32(&self, inputs: &[(&str, &HostTensor)]) -> Result<Vec<(String, HostTensor)>> {
        Ok(kfuse_interp::run_in(&self.graph, inputs, kfuse_interp::Precision::F32)?)
    }

    /// [`Program::run_cpu_f32`] rounding upward (toward +∞) instead of to nearest: its difference
    /// from `run_cpu` bounds how far f32 rounding in any order moves an output whose terms
    /// cancel, where one nearest-rounded evaluation may by luck move it little (see
    /// [`kfuse_interp::Precision::F32Upward`]).
    pub fn run_cpu_f32_upward(&self, inputs: &[(&str, &HostTensor)]) -> Result<Vec<(String, HostTensor)>> {
        Ok(kfuse_interp::run_in(&self.graph, inputs, kfuse_interp::Precision::F32Upward)?)
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
    /// Inputs may be views that are not contiguous ([`DeviceTensor::strides`]), or contiguous ones
    /// that do not start 16-byte aligned: they are read in place, by kernels planned to read them
    /// through strides ([`Program::reading_strided`], compiled on the first such call). Outputs
    /// are contiguous and 16-byte aligned. A view whose last axis is not dense (a transpose) is
    /// read an element at a time, one memory sector each: copying it contiguous first is faster
    /// for large inputs (the Python package does; see bench/RESULTS.md).
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
        let strided = self.strided_inputs(inputs.iter().map(|(n, t)| (*n, t.is_dense())));
        if !strided.is_empty() {
            let program = self.reading_strided(&strided)?;
            if program.codegen.strided_inputs != self.codegen.strided_inputs {
                return program.launch(ordinal, stream, inputs, outputs, validation);
            }
        }
        // The caller's current device (its thread's CUDA context) is left as it was.
        kfuse_runtime::preserving_thread_context(|| {
            let on = self.on_device(ordinal)?;
            let mut workspace = on.workspace.lock().unwrap_or_else(|e| e.into_inner());
            on.exec.launch_device(stream, inputs, outputs, &mut workspace, validation)
        })
    }

    /// Binds the program to inputs of these names, dtypes and shapes on GPU `ordinal`: checks
    /// them against the declarations, loads the kernels there (compiling through the cache), sizes
    /// the launch grids and makes the workspace large enough (this waits for the device, as a
    /// first [`Program::launch`] does). The result launches on device memory of those shapes
    /// with no further checks of shapes and no allocation: what a framework keeps per shape
    /// signature, so that a call on shapes seen before passes addresses only.
    pub fn bind_device(&self, ordinal: usize, inputs: &[(&str, DType, &[usize])]) -> Result<DeviceBinding> {
        self.bind_device_strided(ordinal, inputs, &[])
    }

    /// [`Program::bind_device`] where some inputs are views: `strides` holds `(name, strides in
    /// elements)` of each input to read through strides (a view that is not contiguous, or one
    /// whose start may not be 16-byte aligned). The binding then launches kernels that read them
    /// in place ([`Program::reading_strided`]), on buffers that hold each view's span, needing
    /// only element alignment of them; the other inputs and the outputs are contiguous and
    /// 16-byte aligned.
    pub fn bind_device_strided(
        &self,
        ordinal: usize,
        inputs: &[(&str, DType, &[usize])],
        strides: &[(&str, &[usize])],
    ) -> Result<DeviceBinding> {
        let interface = self.interface();
        let sizes = interface.bind_shapes(inputs)?;
        let strides_of = |name: &str| strides.iter().find(|(n, _)| *n == name).map(|(_, s)| *s);
        for (name, _, shape) in inputs {
            if let Some(s) = strides_of(name).filter(|s| s.len() != shape.len()) {
                let why = format!("{} strides given for a tensor of {} axes {shape:?}", s.len(), shape.len());
                return Err(Error::Strides { role: "input", name: name.to_string(), why });
            }
        }
        let strided = self.strided_inputs(inputs.iter().map(|(n, _, _)| (*n, strides_of(n).is_none())));
        if !strided.is_empty() {
            let program = self.reading_strided(&strided)?;
            if program.codegen.strided_inputs != self.codegen.strided_inputs {
                return program.bind_device_strided(ordinal, inputs, strides);
            }
        }
        let mut bytes = Vec::with_capacity(inputs.len() + interface.outputs.len());
        let too_big = |what: String| Error::TooLarge { what, sizes: sizes.clone() };
        for (name, dtype, shape) in inputs {
            let b = match strides_of(name) {
                Some(s) => span_bytes(*dtype, shape, s),
                None => byte_count(*dtype, shape),
            };
            bytes.push(b.ok_or_else(|| too_big(format!("input `{name}`")))?);
        }
        for o in &interface.outputs {
            let shape = interface.resolve(o, &sizes).ok_or_else(|| too_big(format!("output `{}`", o.name)))?;
            bytes.push(byte_count(o.dtype, &shape).ok_or_else(|| too_big(format!("output `{}`", o.name)))?);
        }
        // Plan inputs by declaration index -> position among the given inputs, and their strides.
        let mut positions = Vec::with_capacity(interface.inputs.len());
        let mut input_strides = Vec::with_capacity(interface.inputs.len());
        for (index, decl) in interface.inputs.iter().enumerate() {
            let at = inputs.iter().position(|(n, _, _)| *n == decl.name).ok_or(Error::PlanMissingInput { index })?;
            positions.push(at);
            input_strides.push(match strides_of(&decl.name) {
                Some(s) => s.iter().map(|&s| s as i64).collect(),
                None => contiguous_strides(inputs[at].2),
            });
        }
        kfuse_runtime::preserving_thread_context(|| {
            let on = self.on_device(ordinal)?;
            let grids = on.exec.grids(&sizes)?;
            on.exec.reserve(&mut on.workspace.lock().unwrap_or_else(|e| e.into_inner()), &sizes, &grids)?;
            Ok(DeviceBinding {
                on,
                origin: self.origin.clone(),
                ordinal,
                sizes,
                grids,
                bytes,
                positions,
                strides: input_strides,
                strided: inputs.iter().map(|(n, _, _)| strides_of(n).is_some()).collect(),
                inputs: inputs.len(),
            })
        })
    }

    /// Whether launches on device `ordinal` use the optimised build of every kernel: `Some(false)`
    /// while a first load's quick builds serve and the optimised ones compile in the background,
    /// `None` when nothing is loaded there.
    pub fn is_optimised(&self, ordinal: usize) -> Option<bool> {
        self.devices.lock().unwrap_or_else(|e| e.into_inner()).get(&ordinal).map(|on| on.exec.is_optimised())
    }

    /// Whether the kernels are loaded on device `ordinal` already, so that a launch there only
    /// queues them (no load, no compile).
    pub fn is_loaded(&self, ordinal: usize) -> bool {
        self.devices.lock().unwrap_or_else(|e| e.into_inner()).contains_key(&ordinal)
    }

    /// The kernels loaded on device `ordinal` (loaded on the first call, with the scaling kernels
    /// its backward will want; the runtime compiles each kernel once per architecture through the
    /// cache, the missing ones in parallel).
    fn on_device(&self, ordinal: usize) -> Result<Arc<OnDevice>> {
        if let Some(on) = self.devices.lock().unwrap_or_else(|e| e.into_inner()).get(&ordinal) {
            return Ok(on.clone());
        }
        let gpu = self.engine.device(ordinal)?;
        let scaling: Vec<(&str, &str)> = self.scaling_kernels().collect();
        let exec = CudaProgram::with_companions(&gpu, self.plan.clone(), &scaling, &self.origin)?;
        let on = Arc::new(OnDevice { exec, workspace: Mutex::new(Workspace::default()) });
        let mut devices = self.devices.lock().unwrap_or_else(|e| e.into_inner());
        Ok(devices.entry(ordinal).or_insert(on).clone())
    }
}

/// A [`Program`] bound to one set of input shapes on one GPU ([`Program::bind_device`]).
pub struct DeviceBinding {
    on: Arc<OnDevice>,
    origin: Arc<str>,
    ordinal: usize,
    sizes: Vec<u64>,
    grids: Vec<u32>,
    /// The bytes of each input (in the order given to `bind_device`), then of each output.
    bytes: Vec<u64>,
    /// For each declared input, its position among the given inputs, and its strides.
    positions: Vec<usize>,
    strides: Vec<Vec<i64>>,
    /// For each input (in the order given), whether it is read through its strides.
    strided: Vec<bool>,
    inputs: usize,
}

impl DeviceBinding {
    /// The GPU the kernels are loaded on.
    pub fn gpu(&self) -> &Arc<kfuse_runtime::Gpu> {
        self.on.exec.gpu()
    }

    /// The run-time size of each dimension symbol of the bound shapes.
    pub fn sizes(&self) -> &[u64] {
        &self.sizes
    }

    /// Queues the kernels on `stream` of the bound GPU over `buffers`: one per input (in the
    /// order given to [`Program::bind_device`]), then one per output (declaration order), each in
    /// that GPU's memory and at least as large as the bound shape needs. No host synchronisation
    /// and no allocation. As with [`Program::launch`], launches of one program on one device share
    /// its workspace, so they must be ordered on the GPU; the kernels check `lengths` / `offsets`
    /// values as `validation` says, and a violation pending on the device from an earlier call is
    /// returned before anything is queued.
    pub fn launch(
        &self,
        stream: &Stream,
        buffers: &[kfuse_runtime::DeviceBuffer],
        validation: crate::Validation,
    ) -> Result<()> {
        crate::checks::take_pending(self.gpu())?;
        if stream.ordinal() != self.ordinal {
            return Err(Error::WrongStream { got: stream.ordinal(), want: self.ordinal });
        }
        let bad = |why: String| Error::BoundBuffers { origin: self.origin.to_string(), why };
        if buffers.len() != self.bytes.len() {
            return Err(bad(format!(
                "{} buffers given for {} inputs and {} outputs",
                buffers.len(),
                self.inputs,
                self.bytes.len() - self.inputs
            )));
        }
        for (i, (buf, &want)) in buffers.iter().zip(&self.bytes).enumerate() {
            let (role, index) = if i < self.inputs { ("input", i) } else { ("output", i - self.inputs) };
            if buf.ordinal() != self.ordinal {
                return Err(Error::WrongDevice {
                    role,
                    name: format!("#{index}"),
                    got: buf.ordinal(),
                    want: self.ordinal,
                });
            }
            if (buf.bytes() as u64) < want {
                return Err(bad(format!("{role} #{index} holds {} bytes; its bound shape needs {want}", buf.bytes())));
            }
            if !self.strided.get(i).copied().unwrap_or(false) && !is_aligned(buf.address()) {
                return Err(misaligned(role, &format!("#{index}"), buf.address()));
            }
        }
        let (ins, outs) = buffers.split_at(self.inputs);
        let positions = &self.positions;
        let position = |id: kfuse_ir::InputId| {
            positions.get(id.0 as usize).copied().ok_or(Error::PlanMissingInput { index: id.0 as usize })
        };
        kfuse_runtime::preserving_thread_context(|| {
            let mut workspace = self.on.workspace.lock().unwrap_or_else(|e| e.into_inner());
            let io = Io { position, inputs: ins, outputs: outs, strides: &self.strides };
            self.on.exec.settle(Some(stream))?;
            self.on.exec.launch_reserved(stream, &self.sizes, &self.grids, &mut workspace, io, validation)
        })
    }
}

impl std::fmt::Debug for DeviceBinding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceBinding")
            .field("origin", &self.origin)
            .field("ordinal", &self.ordinal)
            .field("sizes", &self.sizes)
            .field("grids", &self.grids)
            .finish_non_exhaustive()
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
        CudaProgram::with_companions(gpu, program.plan().clone(), &[], &program.origin)
    }

    /// [`CudaProgram::prepare`] with the optimised builds of the kernels the cache lacks compiled
    /// before it returns, no quick builds first: for a one-shot run, which gains nothing from them
    /// (it would wait for the optimised builds at exit).
    pub fn prepare_optimised(gpu: &Arc<kfuse_runtime::Gpu>, program: &Program) -> Result<CudaProgram> {
        CudaProgram::load(gpu, program.plan().clone(), &[], &program.origin, crate::exec::Builds::Optimised)
    }
}

/// What [`Program::build_kernels`] builds for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BuildTarget {
    /// GPU `ordinal`: its architecture and the options its launches compile with.
    Device(usize),
    /// An architecture, with no GPU (NVRTC only).
    Arch(Arch),
}

/// How one kernel was made ready by [`Program::build_kernels`].
#[derive(Clone, Debug, PartialEq)]
pub struct KernelBuild {
    /// The kernel's entry point.
    pub name: String,
    /// Compiled by NVRTC just now, or found in the cache (in memory or on disk).
    pub outcome: CacheOutcome,
    /// How long getting it took, in seconds.
    pub seconds: f64,
}
