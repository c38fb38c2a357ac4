//! Runs a fused kernel plan on a GPU: allocates the plan's buffers for the run-time sizes, uploads
//! the inputs, launches the kernels in order on the device's stream and downloads the outputs.
//!
//! Not here: compilation and caching (kfuse-runtime's `Gpu::load_kernel` does both), and timing
//! (the `bench` module drives [`CudaProgram::launch`] between CUDA events).

use std::time::Instant;

use half::slice::HalfFloatSliceExt;
use kfuse_codegen::{BufferKind, Launch, Param, Plan};
use kfuse_ir::{Graph, HostTensor, SymbolBindings, TensorData};
use kfuse_runtime::{timing, DeviceBuffer, Gpu, GpuFunction, KernelArg};

use crate::{Error, Program};

/// A program compiled and loaded for one GPU, ready to run on any sizes.
pub struct CudaProgram<'g> {
    gpu: &'g Gpu,
    graph: Graph,
    plan: Plan,
    functions: Vec<GpuFunction>,
    /// Per kernel: for a cooperative launch, the most blocks the device holds at once.
    resident: Vec<Option<u32>>,
}

/// The device buffers and launch geometry of one set of inputs.
pub struct BoundRun {
    sizes: Vec<u64>,
    grids: Vec<u32>,
    buffers: Vec<DeviceBuffer>,
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

impl<'g> CudaProgram<'g> {
    /// Plans the program and loads every kernel (compiled through the kernel cache).
    pub fn prepare(gpu: &'g Gpu, program: &Program) -> Result<CudaProgram<'g>, Error> {
        CudaProgram::from_plan(gpu, program, program.plan()?)
    }

    /// Loads the kernels of a plan already made from `program`.
    pub fn from_plan(gpu: &'g Gpu, program: &Program, plan: Plan) -> Result<CudaProgram<'g>, Error> {
        let functions =
            plan.kernels.iter().map(|k| gpu.load_kernel(&k.source, &k.name)).collect::<Result<Vec<_>, _>>()?;
        let resident = plan
            .kernels
            .iter()
            .zip(&functions)
            .map(|(k, f)| match k.launch {
                Launch::Plain => Ok(None),
                Launch::Cooperative => match gpu.max_resident_blocks(f, k.block, 0)? {
                    0 => Err(Error::Exec(format!(
                        "kernel {} cannot have even one block of {} threads resident on this device",
                        k.name, k.block
                    ))),
                    n => Ok(Some(n)),
                },
            })
            .collect::<Result<Vec<_>, Error>>()?;
        Ok(CudaProgram { gpu, graph: program.graph.clone(), plan, functions, resident })
    }

    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// Checks the inputs against the declarations, allocates every buffer and uploads the inputs.
    pub fn bind(&self, inputs: &[(&str, &HostTensor)]) -> Result<BoundRun, Error> {
        let step = Instant::now();
        let sizes = SymbolBindings::bind(&self.graph, inputs)?.sizes;
        timing::log("bind: symbol bindings", step);
        let sm = self.gpu.sm_count().max(1);
        let grids =
            self.plan
                .kernels
                .iter()
                .zip(&self.resident)
                .map(|(k, resident)| {
                    let blocks = k.grid.blocks(&sizes, sm).ok_or_else(|| {
                        Error::Exec(format!("kernel {} needs too many blocks for these sizes", k.name))
                    })?;
                    // A cooperative kernel's grid-stride loop covers any grid: cap it at one resident wave.
                    Ok(resident.map_or(blocks, |r| blocks.min(r)))
                })
                .collect::<Result<Vec<u32>, Error>>()?;
        let mut buffers = Vec::with_capacity(self.plan.buffers.len());
        for decl in &self.plan.buffers {
            let grid = match decl.kind {
                BufferKind::Partials { kernel, .. } => u64::from(grids[kernel]),
                _ => 0,
            };
            let too_big = || Error::Exec(format!("a buffer of {:?} for these sizes does not fit in memory", decl.kind));
            let elems = decl.elem_count(&sizes, grid).ok_or_else(too_big)?;
            let bytes =
                elems.checked_mul(decl.elem.size_bytes()).and_then(|b| usize::try_from(b).ok()).ok_or_else(too_big)?;
            let step = Instant::now();
            let buf = match decl.kind {
                BufferKind::Input(id) => {
                    let name = &self.graph.input(id).name;
                    let t = inputs
                        .iter()
                        .find(|(n, _)| n == name)
                        .map(|(_, t)| *t)
                        .ok_or_else(|| Error::Exec(format!("missing input `{name}`")))?;
                    if t.is_empty() {
                        self.gpu.alloc_zeroed(16)?
                    } else {
                        upload_tensor(self.gpu, t)?
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
        Ok(BoundRun { sizes, grids, buffers })
    }

    /// Enqueues every kernel of the plan (asynchronous).
    pub fn launch(&self, run: &BoundRun) -> Result<(), Error> {
        for (i, (k, f)) in self.plan.kernels.iter().zip(&self.functions).enumerate() {
            let args: Vec<KernelArg<'_>> = k
                .params
                .iter()
                .map(|p| match *p {
                    Param::Buffer(b) => KernelArg::Buffer(&run.buffers[b]),
                    Param::Size(s) => KernelArg::I64(run.sizes[s.0 as usize] as i64),
                })
                .collect();
            let step = Instant::now();
            match k.launch {
                Launch::Plain => self.gpu.launch(f, run.grids[i], k.block, 0, &args)?,
                Launch::Cooperative => self.gpu.launch_cooperative(f, run.grids[i], k.block, 0, &args)?,
            }
            if timing::enabled() {
                timing::log(&format!("launch {} (grid {}, block {})", k.name, run.grids[i], k.block), step);
            }
        }
        Ok(())
    }

    /// Fills every output buffer with `byte` (tests poison outputs to catch unwritten elements).
    pub fn poison_outputs(&self, run: &BoundRun, byte: u8) -> Result<(), Error> {
        for (decl, buf) in self.plan.buffers.iter().zip(&run.buffers) {
            if matches!(decl.kind, BufferKind::Output(_)) {
                self.gpu.fill(buf, byte)?;
            }
        }
        Ok(())
    }

    /// Waits for the GPU and copies the outputs back, in the graph's output order.
    pub fn download(&self, run: &BoundRun) -> Result<Vec<(String, HostTensor)>, Error> {
        let step = Instant::now();
        self.gpu.synchronize()?;
        timing::log("download: synchronize (waits for the kernels)", step);
        let step = Instant::now();
        let mut out = Vec::with_capacity(self.graph.outputs.len());
        for (i, o) in self.graph.outputs.iter().enumerate() {
            let (bi, _) = self
                .plan
                .buffers
                .iter()
                .enumerate()
                .find(|(_, d)| d.kind == BufferKind::Output(i))
                .ok_or_else(|| Error::Exec(format!("the plan has no buffer for output `{}`", o.name)))?;
            let node = self.graph.node(o.node);
            let shape = self.graph.resolve_shape(&node.shape, &run.sizes);
            let n: usize = shape.iter().product();
            let mut bytes = self.gpu.download(&run.buffers[bi])?;
            bytes.truncate(n * node.dtype.size_bytes());
            let t = HostTensor::from_bytes(node.dtype, shape, &bytes)
                .ok_or_else(|| Error::Exec(format!("output `{}` came back with {} bytes", o.name, bytes.len())))?;
            out.push((o.name.clone(), t));
        }
        timing::log("download: copy outputs back", step);
        Ok(out)
    }

    /// Binds, launches and downloads: one whole run.
    pub fn run(&self, inputs: &[(&str, &HostTensor)]) -> Result<Vec<(String, HostTensor)>, Error> {
        let bound = self.bind(inputs)?;
        self.launch(&bound)?;
        self.download(&bound)
    }

    pub fn gpu(&self) -> &Gpu {
        self.gpu
    }
}

/// Uploads a host tensor straight from its elements (no intermediate byte vector: `to_bytes`
/// would copy, and page-fault in, a second full-size buffer).
fn upload_tensor(gpu: &Gpu, t: &HostTensor) -> Result<DeviceBuffer, Error> {
    Ok(match &t.data {
        TensorData::F32(v) => gpu.upload_slice(v)?,
        TensorData::F16(v) => gpu.upload_slice(v.reinterpret_cast())?,
        TensorData::BF16(v) => gpu.upload_slice(v.reinterpret_cast())?,
        TensorData::I32(v) => gpu.upload_slice(v)?,
        TensorData::Bool(v) => gpu.upload_slice(v)?,
    })
}
