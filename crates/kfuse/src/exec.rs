//! Runs a fused kernel plan on a GPU, from the plan alone (its [`kfuse_ir::Interface`] binds the
//! sizes and sizes the outputs): either on host tensors (allocate the plan's buffers, upload,
//! launch on the device's own stream, download), or on device tensors that a framework owns
//! (launch on its stream into its output tensors, with a workspace for the plan's other buffers).
//!
//! Loading a plan compiles the kernels the cache does not hold in parallel, one thread each, then
//! loads them all; a first call that must compile launches quick builds while the optimised ones
//! compile in the background (see `tiered`). Not here: compilation and caching themselves
//! (kfuse-runtime's `Gpu::load_kernel` does both).

use std::borrow::Borrow;
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use half::slice::HalfFloatSliceExt;
use kfuse_codegen::{BufferDecl, BufferKind, FoldEntry, Launch, Param, Plan, WIDE_INDEX_OPTION};
use kfuse_ir::{DType, HostTensor, SymbolBindings, TensorData};
use kfuse_runtime::{timing, DeviceBuffer, Gpu, GpuFunction, KernelArg, KernelLaunch, Stream};

pub(crate) use crate::tiered::Builds;
use crate::tiered::{self, Build};
use crate::{Error, Result, Validation};

/// A tensor in device memory: a buffer (usually borrowed from a framework with
/// [`Gpu::borrow_memory`]), its dtype, its shape and, for a view that is not contiguous and
/// row-major (transposed, sliced, expanded with stride 0), its strides. Outputs are contiguous.
#[derive(Debug)]
pub struct DeviceTensor {
    pub buffer: DeviceBuffer,
    pub dtype: DType,
    pub shape: Vec<usize>,
    /// The stride of each axis, in elements, from the buffer's start; `None`: contiguous and
    /// row-major.
    pub strides: Option<Vec<usize>>,
}

impl DeviceTensor {
    /// A contiguous, row-major tensor.
    pub fn contiguous(buffer: DeviceBuffer, dtype: DType, shape: Vec<usize>) -> DeviceTensor {
        DeviceTensor { buffer, dtype, shape, strides: None }
    }

    /// Whether its elements are contiguous and row-major (see [`is_contiguous`]).
    pub fn is_contiguous(&self) -> bool {
        self.strides.as_ref().is_none_or(|s| is_contiguous(&self.shape, s))
    }

    /// Whether kernels can read it as a contiguous array: contiguous, and starting at a 16-byte
    /// aligned address (they load small trailing axes as vectors; see `BufferDecl`).
    pub fn is_dense(&self) -> bool {
        self.is_contiguous() && is_aligned(self.buffer.address())
    }

    /// Its strides, row-major ones when it has none.
    fn stride_values(&self) -> Vec<i64> {
        match &self.strides {
            Some(s) => s.iter().map(|&s| s as i64).collect(),
            None => contiguous_strides(&self.shape),
        }
    }
}

/// Whether a buffer at `address` is aligned as kernels that read or write it as a contiguous
/// array need (16 bytes; a null address, an empty tensor's, too).
pub fn is_aligned(address: u64) -> bool {
    address.is_multiple_of(16)
}

/// The error of a contiguous buffer that does not start 16-byte aligned.
pub(crate) fn misaligned(role: &'static str, name: &str, address: u64) -> Error {
    let why = format!(
        "it starts at {address:#x}, which is not 16-byte aligned, and these kernels read and write it as a contiguous \
         array (vectors of its trailing axes); give its strides to have it read through them"
    );
    Error::Strides { role, name: name.to_string(), why }
}

/// The row-major strides of a contiguous tensor of `shape`, in elements.
pub fn contiguous_strides(shape: &[usize]) -> Vec<i64> {
    let mut strides = vec![0i64; shape.len()];
    let mut next = 1i64;
    for (s, &d) in strides.iter_mut().zip(shape).rev() {
        *s = next;
        next = next.saturating_mul(d as i64);
    }
    strides
}

/// Whether `strides` (elements) lay a tensor of `shape` out contiguously and row-major. As in
/// PyTorch, an axis of size 1 takes any stride, and so does every axis of an empty tensor.
pub fn is_contiguous(shape: &[usize], strides: &[usize]) -> bool {
    if shape.contains(&0) {
        return true;
    }
    let mut next = 1usize;
    for (&d, &s) in shape.iter().zip(strides).rev() {
        if d != 1 && s != next {
            return false;
        }
        next = next.saturating_mul(d);
    }
    true
}

/// The bytes from the start of a tensor of `dtype` and `shape` laid out by `strides` to the end
/// of its last element (0 when it is empty); `None` when that overflows.
pub fn span_bytes(dtype: DType, shape: &[usize], strides: &[usize]) -> Option<u64> {
    if shape.contains(&0) {
        return Some(0);
    }
    let last = shape
        .iter()
        .zip(strides)
        .try_fold(0u64, |acc, (&d, &s)| (d as u64 - 1).checked_mul(s as u64).and_then(|x| acc.checked_add(x)))?;
    last.checked_add(1)?.checked_mul(dtype.size_bytes() as u64)
}

/// A plan with its kernels loaded on one GPU, ready to run on any sizes.
pub struct CudaProgram {
    gpu: Arc<Gpu>,
    plan: Arc<Plan>,
    /// Per kernel: its loaded build (with, for a cooperative launch, the most blocks the device
    /// holds at once).
    functions: Vec<Build>,
    /// Per kernel: the entry point for rows kept in registers, where it has one (see
    /// [`kfuse_codegen::RegisterRows`]).
    register_rows: Vec<Option<Build>>,
    /// Per kernel: the entry point that folds column sums an earlier kernel took, where it has
    /// one (see [`kfuse_codegen::FoldEntry`]).
    folds: Vec<Option<Build>>,
    /// Per kernel: its build with a 64-bit flat index, loaded by the first launch that needs it
    /// (see [`kfuse_codegen::Kernel::narrow_index`]).
    wide: Vec<OnceLock<GpuFunction>>,
    /// The tag a violation of an input's layout is recorded with (see `checks`).
    tag: u32,
}

/// The device buffers and launch geometry of one set of host inputs.
pub struct BoundRun {
    sizes: Vec<u64>,
    grids: Vec<u32>,
    buffers: Vec<DeviceBuffer>,
    /// Per declared input, its (row-major) strides.
    strides: Vec<Vec<i64>>,
}

impl BoundRun {
    /// Launch geometry chosen for each kernel (blocks).
    pub fn grids(&self) -> &[u32] {
        &self.grids
    }
    /// Run-time size of each dimension symbol.
    pub fn sizes(&self) -> &[u64] {
        &self.sizes
    }
}

/// The buffers of a plan other than its inputs and outputs (temporaries, partials, counters,
/// scratch) for launches on device tensors; it grows to the largest sizes seen. Buffers that a
/// growth replaces are kept until the workspace drops: a CUDA graph recorded at an earlier, smaller
/// shape holds their addresses and replays into them, never into freed memory.
#[derive(Default)]
pub struct Workspace {
    /// Per plan buffer: the allocation, `None` for inputs and outputs.
    buffers: Vec<Option<DeviceBuffer>>,
    /// The buffers earlier growths replaced (see above).
    retired: Vec<DeviceBuffer>,
    /// The device, once a launch has used the buffers.
    used_on: Option<Arc<Gpu>>,
}

impl Drop for Workspace {
    fn drop(&mut self) {
        // The buffers are freed on the Gpu's own stream; kernels queued on another stream may
        // still use them. A failure here has no one to report to: the device is already broken.
        if let Some(gpu) = &self.used_on {
            // The caller's current device (its thread's CUDA context) is left as it was.
            kfuse_runtime::preserving_thread_context(|| gpu.synchronize_device()).ok();
        }
    }
}

impl CudaProgram {
    /// Loads the kernels of a plan; a violation its kernels record names it `kernels <hash>`.
    pub fn from_plan(gpu: &Arc<Gpu>, plan: Arc<Plan>) -> Result<CudaProgram> {
        let origin: Arc<str> = format!("kernels {}", plan.graph_hash.short()).into();
        CudaProgram::with_companions(gpu, plan, &[], &origin)
    }

    /// Loads the quick builds of a plan's kernels only (NVRTC's `--Ofast-compile=max`), compiling
    /// nothing in the background: slower kernels that give the optimised builds' bits, for
    /// comparing the two (see `tiered`).
    pub fn quick_builds(gpu: &Arc<Gpu>, plan: Arc<Plan>) -> Result<CudaProgram> {
        let origin: Arc<str> = format!("kernels {}", plan.graph_hash.short()).into();
        CudaProgram::load(gpu, plan, &[], &origin, Builds::Quick)
    }

    /// Loads the kernels of a plan and `companions` (source, name), kernels that later calls will
    /// want on this device (the gradient-scaling kernel of a backward): those the cache does not
    /// hold compile in parallel with the plan's. The companions stay loaded on `gpu` (its
    /// `load_kernel` of them is then a lookup in memory). A violation its kernels record names it
    /// `origin`.
    pub fn with_companions(
        gpu: &Arc<Gpu>,
        plan: Arc<Plan>,
        companions: &[(&str, &str)],
        origin: &Arc<str>,
    ) -> Result<CudaProgram> {
        CudaProgram::load(gpu, plan, companions, origin, Builds::Tiered)
    }

    pub(crate) fn load(
        gpu: &Arc<Gpu>,
        plan: Arc<Plan>,
        companions: &[(&str, &str)],
        origin: &Arc<str>,
        builds: Builds,
    ) -> Result<CudaProgram> {
        // Each kernel's entry points, in `Kernel::entries` order: the kernel (with the block of a
        // cooperative launch, whose residency bounds its grid), its rows in registers, its fold.
        let entries: Vec<tiered::Entry<'_>> = plan
            .kernels
            .iter()
            .flat_map(|k| {
                let cooperative = (k.launch == Launch::Cooperative).then_some(k.block);
                k.entries().enumerate().map(move |(e, (source, name))| (source, name, cooperative.filter(|_| e == 0)))
            })
            .collect();
        let mut builds = tiered::load(gpu, &entries, companions, builds)?.into_iter();
        let n = plan.kernels.len();
        let (mut functions, mut register_rows, mut folds) =
            (Vec::with_capacity(n), Vec::with_capacity(n), Vec::with_capacity(n));
        for k in &plan.kernels {
            let Some(kernel) = builds.next() else { break }; // one build per entry point
            functions.push(kernel);
            register_rows.push(k.register_rows.as_ref().and_then(|_| builds.next()));
            folds.push(k.fold.as_ref().and_then(|_| builds.next()));
        }
        let tag = crate::checks::register(origin, &plan.graph_hash, &plan.interface);
        let wide = plan.kernels.iter().map(|_| OnceLock::new()).collect();
        Ok(CudaProgram { gpu: gpu.clone(), plan, functions, register_rows, folds, wide, tag })
    }

    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    fn builds(&self) -> impl Iterator<Item = &Build> + Clone {
        self.functions.iter().chain(self.register_rows.iter().flatten()).chain(self.folds.iter().flatten())
    }

    /// Switches kernels whose optimised builds finished compiling in the background to them (see
    /// `tiered`); on a `stream` being captured into a CUDA graph, waits for them all first.
    pub(crate) fn settle(&self, stream: Option<&Stream>) -> Result<()> {
        tiered::settle(&self.gpu, self.builds(), stream)
    }

    /// Whether every kernel launches its optimised build: `false` while a first load's quick
    /// builds serve and the optimised ones compile in the background (see `tiered`).
    pub fn is_optimised(&self) -> bool {
        self.builds().all(Build::is_optimised)
    }

    /// Waits until the optimised builds of every kernel have compiled and switches to them (at
    /// once when nothing compiles in the background). A failed compile is warned about and leaves
    /// its quick build serving.
    pub fn wait_for_optimised(&self) {
        for b in self.builds() {
            b.settle(&self.gpu, true);
        }
    }

    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    /// The grid of each kernel for run-time `sizes`.
    pub(crate) fn grids(&self, sizes: &[u64]) -> Result<Vec<u32>> {
        let sm = self.gpu.sm_count().max(1);
        // A cooperative kernel's grid-stride loop covers any grid: cap it at one resident wave.
        let cap =
            |k: usize, blocks: u32| self.functions.get(k).and_then(Build::resident).map_or(blocks, |r| blocks.min(r));
        self.plan.grids(sizes, sm, cap).map_err(|k| Error::GridTooLarge {
            kernel: self.plan.kernels.get(k).map_or_else(String::new, |kernel| kernel.name.clone()),
            sizes: sizes.to_vec(),
        })
    }

    /// The bytes buffer `decl` needs for `sizes` and `grids`.
    fn buffer_bytes(decl: &BufferDecl, sizes: &[u64], grids: &[u32]) -> Result<usize> {
        let grid = match decl.kind {
            BufferKind::Partials { kernel, .. } | BufferKind::ColumnPartials { kernel } => {
                grids.get(kernel).map_or(0, |&g| u64::from(g))
            }
            _ => 0,
        };
        let too_big = || Error::TooLarge { what: format!("a buffer of {:?}", decl.kind), sizes: sizes.to_vec() };
        let elems = decl.elem_count(sizes, grid).ok_or_else(too_big)?;
        elems.checked_mul(decl.elem.size_bytes()).and_then(|b| usize::try_from(b).ok()).ok_or_else(too_big)
    }

    /// Checks the inputs against the declarations, allocates every buffer and uploads the inputs.
    pub fn bind(&self, inputs: &[(&str, &HostTensor)]) -> Result<BoundRun> {
        let step = Instant::now();
        let sizes = SymbolBindings::bind_interface(&self.plan.interface, inputs)?.sizes;
        timing::log("bind: symbol bindings", step);
        self.settle(None)?;
        let grids = self.grids(&sizes)?;
        let mut buffers = Vec::with_capacity(self.plan.buffers.len());
        for decl in &self.plan.buffers {
            let bytes = CudaProgram::buffer_bytes(decl, &sizes, &grids)?;
            let step = Instant::now();
            let buf = match decl.kind {
                BufferKind::Input(id) => {
                    // Binding checked that every declared input is given.
                    let name = self.plan.interface.inputs.get(id.0 as usize).map_or("", |d| d.name.as_str());
                    match inputs.iter().find(|(n, _)| *n == name) {
                        Some((_, t)) if !t.is_empty() => upload_tensor(&self.gpu, t)?,
                        _ => self.gpu.alloc_zeroed(16)?,
                    }
                }
                // Zero-sized tensors still get a valid pointer; no kernel touches it.
                _ => self.gpu.alloc_zeroed(bytes.max(16))?,
            };
            if timing::enabled() {
                timing::log(&format!("bind: buffer {:?} ({} B)", decl.kind, buf.bytes()), step);
            }
            buffers.push(buf);
        }
        let strides = self
            .plan
            .interface
            .inputs
            .iter()
            .map(|d| {
                inputs.iter().find(|(n, _)| *n == d.name).map_or_else(Vec::new, |(_, t)| contiguous_strides(&t.shape))
            })
            .collect();
        Ok(BoundRun { sizes, grids, buffers, strides })
    }

    /// Enqueues every kernel of the plan on the device's own stream (asynchronous). The inputs
    /// were checked on the host by [`CudaProgram::bind`]; the kernels check again on the device
    /// (see [`Validation::Deferred`]), and [`CudaProgram::download`] takes what they found. A
    /// violation pending on the device from an earlier call is returned first.
    pub fn launch(&self, run: &BoundRun) -> Result<()> {
        crate::checks::take_pending(&self.gpu)?;
        let buffers: Vec<&DeviceBuffer> = run.buffers.iter().collect();
        self.launch_buffers(
            &self.gpu.default_stream(),
            &run.sizes,
            &run.grids,
            &buffers,
            &run.strides,
            Validation::Deferred,
        )
    }

    /// Enqueues every kernel on `stream` with the plan's buffers in `buffers` (plan order) and
    /// the strides of each declared input in `strides`.
    fn launch_buffers(
        &self,
        stream: &Stream,
        sizes: &[u64],
        grids: &[u32],
        buffers: &[&DeviceBuffer],
        strides: &[Vec<i64>],
        validation: Validation,
    ) -> Result<()> {
        let checks = validation == Validation::Deferred;
        // Which kernels took their entry point for rows in registers (it sums a later kernel's
        // columns as it goes, where the plan says so).
        let mut in_registers = vec![false; self.plan.kernels.len()];
        // The elements each buffer holds, for the choice of a kernel's index width.
        let elems = |b: usize| {
            let size = self.plan.buffers.get(b)?.elem.size_bytes();
            buffers.get(b).map(|buf| buf.bytes() as u64 / size.max(1))
        };
        for (i, ((k, f), wide)) in self.plan.kernels.iter().zip(&self.functions).zip(&self.wide).enumerate() {
            // Rows that fit the lanes' registers take the kernel's entry point for them.
            let address = |p: usize| match k.params.get(p) {
                Some(Param::Buffer(b)) => buffers.get(*b).map(|buf| buf.address()),
                _ => None,
            };
            let (f, params, grid, block) =
                match (&k.register_rows, self.register_rows.get(i), &k.fold, self.folds.get(i)) {
                    (Some(r), Some(Some(rf)), _, _) if r.applies(&k.grid, sizes, address, strides) => {
                        in_registers[i] = true;
                        (rf.function(), &k.params, grids[i], k.launch_block(sizes))
                    }
                    // The column sums were taken by the rows' kernel: fold them, over its grid's rows.
                    (_, _, Some(fold), Some(Some(ff))) if in_registers.get(fold.after) == Some(&true) => {
                        let parts = grids[fold.after];
                        let blocks = FoldEntry::blocks(&k.grid, sizes, self.gpu.sm_count().max(1), parts)
                            .ok_or_else(|| Error::GridTooLarge { kernel: fold.entry.clone(), sizes: sizes.to_vec() })?;
                        (ff.function(), &fold.params, blocks.min(grids[i]), k.block)
                    }
                    // Counts a 32-bit index would not cover: the kernel's 64-bit build.
                    _ if k.narrow_index && !k.narrow_fits(sizes, elems) => {
                        (self.wide_function(k, wide)?, &k.params, grids[i], k.block)
                    }
                    _ => (f.for_grid(grids[i]), &k.params, grids[i], k.block),
                };
            let args = params
                .iter()
                .map(|p| match *p {
                    Param::Buffer(b) => Ok(KernelArg::Buffer(buffers[b])),
                    Param::Size(s) => Ok(KernelArg::I64(sizes[s.0 as usize] as i64)),
                    Param::ErrorRecord => Ok(KernelArg::ErrorRecord(checks)),
                    Param::CheckTag => Ok(KernelArg::U32(self.tag)),
                    Param::Grid(k) => Ok(KernelArg::I64(i64::from(grids[k]))),
                    Param::Stride { input, axis } => strides
                        .get(input.0 as usize)
                        .and_then(|s| s.get(axis as usize))
                        .map(|&s| KernelArg::I64(s))
                        .ok_or(Error::PlanMissingInput { index: input.0 as usize }),
                })
                .collect::<Result<Vec<KernelArg<'_>>>>()?;
            let launch = match k.launch {
                Launch::Plain => KernelLaunch::new(grid, block),
                Launch::Cooperative => KernelLaunch::new(grid, block).cooperative(),
            };
            enqueue(&self.gpu, stream, f, launch, &args)?;
        }
        Ok(())
    }

    /// Kernel `k`'s build with a 64-bit flat index (`-DKF_WIDE_INDEX`), from `slot` or compiled
    /// through the kernel cache and loaded into it now: with the options of every other build.
    fn wide_function<'a>(&self, k: &kfuse_codegen::Kernel, slot: &'a OnceLock<GpuFunction>) -> Result<&'a GpuFunction> {
        if let Some(f) = slot.get() {
            return Ok(f);
        }
        let mut extra = self.gpu.kernel_options().extra;
        extra.push(WIDE_INDEX_OPTION.to_string());
        let f = self.gpu.load_kernel_with_options(&k.source, &k.name, &extra)?;
        Ok(slot.get_or_init(|| f))
    }

    /// Fills every output buffer with `byte` (tests poison outputs to catch unwritten elements).
    pub fn poison_outputs(&self, run: &BoundRun, byte: u8) -> Result<()> {
        for (decl, buf) in self.plan.buffers.iter().zip(&run.buffers) {
            if matches!(decl.kind, BufferKind::Output(_)) {
                self.gpu.fill(buf, byte)?;
            }
        }
        Ok(())
    }

    /// Waits for the GPU and copies the outputs back, in the plan's output order.
    pub fn download(&self, run: &BoundRun) -> Result<Vec<(String, HostTensor)>> {
        let step = Instant::now();
        self.gpu.synchronize()?;
        timing::log("download: synchronize (waits for the kernels)", step);
        crate::checks::take_pending(&self.gpu)?;
        let step = Instant::now();
        let interface = &self.plan.interface;
        let mut out = Vec::with_capacity(interface.outputs.len());
        for (i, o) in interface.outputs.iter().enumerate() {
            let bi = self
                .plan
                .buffers
                .iter()
                .position(|d| d.kind == BufferKind::Output(i))
                .ok_or_else(|| Error::PlanMissingOutput { name: o.name.clone() })?;
            let shape = interface
                .resolve(o, &run.sizes)
                .ok_or_else(|| Error::TooLarge { what: format!("output `{}`", o.name), sizes: run.sizes.clone() })?;
            let want = shape.iter().product::<usize>() * o.dtype.size_bytes();
            let mut bytes = self.gpu.download(&run.buffers[bi])?;
            if bytes.len() < want {
                return Err(Error::OutputBytes { name: o.name.clone(), bytes: bytes.len(), want });
            }
            bytes.truncate(want);
            let t = HostTensor::from_bytes(o.dtype, shape, &bytes).ok_or_else(|| Error::OutputBytes {
                name: o.name.clone(),
                bytes: bytes.len(),
                want,
            })?;
            out.push((o.name.clone(), t));
        }
        timing::log("download: copy outputs back", step);
        Ok(out)
    }

    /// Binds, launches and downloads: one whole run.
    pub fn run(&self, inputs: &[(&str, &HostTensor)]) -> Result<Vec<(String, HostTensor)>> {
        let bound = self.bind(inputs)?;
        self.launch(&bound)?;
        self.download(&bound)
    }

    /// Launches the plan on `stream` with inputs and outputs already in device memory: checks
    /// names, dtypes, shapes, buffer sizes and devices, then queues the kernels. No host
    /// synchronisation and no allocation, except when `workspace` must grow (see
    /// [`Program::launch`](crate::Program::launch)). The values of `lengths` / `offsets` inputs
    /// are checked by the kernels as they read them when `validation` is
    /// [`Validation::Deferred`]; a violation pending on the device from an earlier call is
    /// returned before anything is queued.
    pub fn launch_device(
        &self,
        stream: &Stream,
        inputs: &[(&str, DeviceTensor)],
        outputs: &[DeviceTensor],
        workspace: &mut Workspace,
        validation: Validation,
    ) -> Result<()> {
        crate::checks::take_pending(&self.gpu)?;
        let ordinal = self.gpu.ordinal();
        if stream.ordinal() != ordinal {
            return Err(Error::WrongStream { got: stream.ordinal(), want: ordinal });
        }
        let interface = &self.plan.interface;
        let shapes: Vec<(&str, DType, &[usize])> =
            inputs.iter().map(|(n, t)| (*n, t.dtype, t.shape.as_slice())).collect();
        let sizes = interface.bind_shapes(&shapes)?;
        for (name, t) in inputs {
            check_tensor("input", name, t, ordinal)?;
            let declared = interface.inputs.iter().position(|d| d.name == *name);
            if !declared.is_some_and(|i| self.plan.strided_inputs.contains(&(i as u32))) {
                if !t.is_contiguous() {
                    return Err(not_contiguous("input", name));
                }
                if !is_aligned(t.buffer.address()) {
                    return Err(misaligned("input", name, t.buffer.address()));
                }
            }
        }
        if outputs.len() != interface.outputs.len() {
            let names = interface.outputs.iter().map(|o| o.name.as_str()).collect::<Vec<_>>().join(", ");
            return Err(Error::OutputCount {
                origin: format!("kernels {}", self.plan.graph_hash.short()),
                got: outputs.len(),
                want: interface.outputs.len(),
                names,
            });
        }
        for (position, (decl, t)) in interface.outputs.iter().zip(outputs).enumerate() {
            if t.dtype != decl.dtype {
                return Err(Error::OutputDType { name: decl.name.clone(), position, got: t.dtype, want: decl.dtype });
            }
            let want = interface
                .resolve(decl, &sizes)
                .ok_or_else(|| Error::TooLarge { what: format!("output `{}`", decl.name), sizes: sizes.clone() })?;
            if t.shape != want {
                return Err(Error::OutputShape { name: decl.name.clone(), position, got: t.shape.clone(), want });
            }
            check_tensor("output", &decl.name, t, ordinal)?;
            if !is_aligned(t.buffer.address()) {
                return Err(misaligned("output", &decl.name, t.buffer.address()));
            }
            if !t.is_contiguous() {
                return Err(Error::Strides {
                    role: "output",
                    name: decl.name.clone(),
                    why: "outputs are written contiguous and row-major; this one has other strides".to_string(),
                });
            }
        }
        self.settle(Some(stream))?;
        let grids = self.grids(&sizes)?;
        self.reserve(workspace, &sizes, &grids)?;
        let position = |id: kfuse_ir::InputId| {
            // Binding checked that every declared input is given.
            interface
                .inputs
                .get(id.0 as usize)
                .and_then(|d| inputs.iter().position(|(n, _)| *n == d.name))
                .ok_or(Error::PlanMissingInput { index: id.0 as usize })
        };
        let strides = interface
            .inputs
            .iter()
            .enumerate()
            .map(|(i, _)| Ok(inputs[position(kfuse_ir::InputId(i as u32))?].1.stride_values()))
            .collect::<Result<Vec<_>>>()?;
        let ins: Vec<&DeviceBuffer> = inputs.iter().map(|(_, t)| &t.buffer).collect();
        let outs: Vec<&DeviceBuffer> = outputs.iter().map(|t| &t.buffer).collect();
        let io = Io { position, inputs: &ins, outputs: &outs, strides: &strides };
        self.launch_reserved(stream, &sizes, &grids, workspace, io, validation)
    }

    /// Launches every kernel on `stream` with the caller's buffers (`io`), the plan's other
    /// buffers from `workspace`, which [`CudaProgram::reserve`] made large enough for `sizes` and
    /// `grids`; the kernels check lengths/offsets values as `validation` says. The caller settles
    /// the builds first ([`CudaProgram::settle`]).
    pub(crate) fn launch_reserved<P, B>(
        &self,
        stream: &Stream,
        sizes: &[u64],
        grids: &[u32],
        workspace: &mut Workspace,
        io: Io<'_, P, B>,
        validation: Validation,
    ) -> Result<()>
    where
        P: Fn(kfuse_ir::InputId) -> Result<usize>,
        B: Borrow<DeviceBuffer>,
    {
        let Io { position, inputs, outputs, strides } = io;
        let mut buffers: Vec<&DeviceBuffer> = Vec::with_capacity(self.plan.buffers.len());
        for (decl, slot) in self.plan.buffers.iter().zip(&workspace.buffers) {
            let buf = match (decl.kind, slot) {
                (BufferKind::Input(id), _) => inputs[position(id)?].borrow(),
                (BufferKind::Output(i), _) => outputs[i].borrow(),
                (_, Some(buf)) => buf,
                (_, None) => {
                    return Err(Error::TooLarge {
                        what: "the plan's workspace (its partial sums, counters and temporaries)".to_string(),
                        sizes: sizes.to_vec(),
                    })
                }
            };
            buffers.push(buf);
        }
        self.launch_buffers(stream, sizes, grids, &buffers, strides, validation)?;
        if workspace.used_on.is_none() {
            workspace.used_on = Some(self.gpu.clone());
        }
        Ok(())
    }

    /// Makes `workspace` large enough for `sizes`. Growing waits for the whole device (kernels on
    /// any stream may still use the old buffers), allocates with plain `cuMemAlloc`
    /// ([`Gpu::alloc_long_lived`]: a framework's process never sets up the driver's stream-ordered
    /// pool for kfuse), zeroes on the device's own stream (counters start at 0) and waits for that,
    /// so the new buffers are ready for any stream. The old buffers are kept (a CUDA graph recorded
    /// with them may replay) and freed with the last ones when the workspace drops (which
    /// synchronises the device first).
    pub(crate) fn reserve(&self, workspace: &mut Workspace, sizes: &[u64], grids: &[u32]) -> Result<()> {
        let mut needed = Vec::with_capacity(self.plan.buffers.len());
        let mut grow = workspace.buffers.len() != self.plan.buffers.len();
        for (i, decl) in self.plan.buffers.iter().enumerate() {
            let bytes = match decl.kind {
                BufferKind::Input(_) | BufferKind::Output(_) => None,
                _ => Some(CudaProgram::buffer_bytes(decl, sizes, grids)?.max(16)),
            };
            if let Some(b) = bytes {
                let have = workspace.buffers.get(i).and_then(|s| s.as_ref()).map_or(0, |buf| buf.bytes());
                grow |= have < b;
            }
            needed.push(bytes);
        }
        if !grow {
            return Ok(());
        }
        self.gpu.synchronize_device()?;
        let mut buffers = Vec::with_capacity(needed.len());
        for (i, bytes) in needed.into_iter().enumerate() {
            let have = workspace.buffers.get(i).and_then(|s| s.as_ref()).map_or(0, |buf| buf.bytes());
            buffers.push(match bytes {
                None => None,
                Some(b) => Some(self.gpu.alloc_long_lived(b.max(have))?),
            });
        }
        self.gpu.synchronize()?;
        let replaced = std::mem::replace(&mut workspace.buffers, buffers);
        workspace.retired.extend(replaced.into_iter().flatten());
        Ok(())
    }
}

/// The caller's side of an in-place launch ([`CudaProgram::launch_reserved`]): its input buffers
/// (found for each declared input by `position`), its output buffers (declaration order), and the
/// strides of each declared input (row-major ones for contiguous inputs).
pub(crate) struct Io<'a, P, B> {
    pub position: P,
    pub inputs: &'a [B],
    pub outputs: &'a [B],
    pub strides: &'a [Vec<i64>],
}

/// The error of a view that is not contiguous given for input `name` of kernels that read it as
/// a contiguous array.
pub(crate) fn not_contiguous(role: &'static str, name: &str) -> Error {
    Error::Strides {
        role,
        name: name.to_string(),
        why: "this view is not contiguous, and these kernels read it as a contiguous array (launch through \
              `Program`, which picks kernels that read it through its strides)"
            .to_string(),
    }
}

/// Queues kernel `f` on `stream` as `launch` says: the one launch path of every kernel the facade
/// runs (a program's fused kernels, the MLP's fused, generic and tiled forms, the gradient
/// scaling), through the runtime's one launch call, with a `KFUSE_TIMING` line for each.
pub(crate) fn enqueue(
    gpu: &Gpu,
    stream: &Stream,
    f: &GpuFunction,
    launch: KernelLaunch,
    args: &[KernelArg<'_>],
) -> Result<()> {
    let step = Instant::now();
    gpu.launch(stream, f, launch, args)?;
    if timing::enabled() {
        let KernelLaunch { grid, block, shared_bytes, .. } = launch;
        timing::log(&format!("launch {} (grid {grid}, block {block}, {shared_bytes} B shared)", f.name()), step);
    }
    Ok(())
}

/// The bytes a contiguous tensor of `dtype` and `shape` holds; `None` when that overflows.
pub fn byte_count(dtype: DType, shape: &[usize]) -> Option<u64> {
    shape.iter().try_fold(dtype.size_bytes() as u64, |acc, &d| acc.checked_mul(d as u64))
}

/// Checks that a device tensor's buffer is on device `ordinal` and holds its shape and dtype
/// (laid out by its strides, which must have one per axis).
pub(crate) fn check_tensor(role: &'static str, name: &str, t: &DeviceTensor, ordinal: usize) -> Result<()> {
    if t.buffer.ordinal() != ordinal {
        return Err(Error::WrongDevice { role, name: name.to_string(), got: t.buffer.ordinal(), want: ordinal });
    }
    let want = match &t.strides {
        None => byte_count(t.dtype, &t.shape),
        Some(s) if s.len() == t.shape.len() => span_bytes(t.dtype, &t.shape, s),
        Some(s) => {
            let why = format!("{} strides given for a tensor of {} axes {:?}", s.len(), t.shape.len(), t.shape);
            return Err(Error::Strides { role, name: name.to_string(), why });
        }
    }
    .unwrap_or(u64::MAX);
    if (t.buffer.bytes() as u64) < want {
        return Err(Error::BufferTooSmall {
            role,
            name: name.to_string(),
            dtype: t.dtype,
            shape: t.shape.clone(),
            want,
            bytes: t.buffer.bytes(),
        });
    }
    Ok(())
}

/// Uploads a host tensor straight from its elements (no intermediate byte vector: `to_bytes`
/// would copy, and page-fault in, a second full-size buffer).
fn upload_tensor(gpu: &Gpu, t: &HostTensor) -> Result<DeviceBuffer> {
    Ok(match &t.data {
        TensorData::F32(v) => gpu.upload_slice(v)?,
        TensorData::F16(v) => gpu.upload_slice(v.reinterpret_cast())?,
        TensorData::BF16(v) => gpu.upload_slice(v.reinterpret_cast())?,
        TensorData::I32(v) => gpu.upload_slice(v)?,
        TensorData::I64(v) => gpu.upload_slice(v)?,
        TensorData::Bool(v) => gpu.upload_slice(v)?,
    })
}
