//! The `Binding` class: a program bound to one set of input shapes, as the Python glue caches it
//! per shape signature, so that a call on tensors of shapes seen before crosses the boundary with
//! addresses only.

use std::sync::{Arc, RwLock};

use kfuse::{DType, DeviceTensor};
use pyo3::prelude::*;

use crate::device;
use crate::dtypes::{dtype_name, parse_dtype, ShapeArg};
use crate::errors::{self, Kind};
use crate::shapes;

/// One tensor of a binding: its name, dtype, shape, strides (a view that is not contiguous)
/// and the bytes it spans.
struct Slot {
    name: String,
    dtype: DType,
    shape: Vec<usize>,
    strides: Option<Vec<usize>>,
    bytes: u64,
}

impl Slot {
    fn new(name: String, dtype: DType, shape: Vec<usize>) -> PyResult<Slot> {
        Slot::strided(name, dtype, shape, None)
    }

    fn strided(name: String, dtype: DType, shape: Vec<usize>, strides: Option<Vec<usize>>) -> PyResult<Slot> {
        let bytes = match &strides {
            Some(s) if s.len() == shape.len() => kfuse::exec::span_bytes(dtype, &shape, s),
            Some(s) => {
                let why = format!("`{name}`: {} strides given for a tensor of shape {shape:?}", s.len());
                return Err(errors::raise(Kind::Input, why));
            }
            None => kfuse::exec::byte_count(dtype, &shape),
        };
        let bytes = bytes
            .ok_or_else(|| errors::raise(Kind::Input, format!("`{name}`: a {dtype}{shape:?} tensor is too large")))?;
        Ok(Slot { name, dtype, shape, strides, bytes })
    }
}

/// A program bound to input shapes (checked against its declarations): the outputs' dtypes and
/// shapes, the check of lengths/offsets values, and the launch on CUDA memory that the caller
/// owns. Immutable.
#[pyclass(frozen, module = "kfuse._kfuse")]
pub struct Binding {
    program: kfuse::Program,
    sizes: Vec<u64>,
    /// The inputs (declaration order), then the outputs (declaration order).
    slots: Vec<Slot>,
    inputs: usize,
    /// The program bound on each device launched on so far (usually one).
    devices: RwLock<Vec<(usize, Arc<kfuse::DeviceBinding>)>>,
}

impl Binding {
    /// The program bound on device `ordinal`, when a launch there has bound it already.
    fn on_device(&self, ordinal: usize) -> Option<Arc<kfuse::DeviceBinding>> {
        let bound = self.devices.read().unwrap_or_else(|e| e.into_inner());
        bound.iter().find(|(o, _)| *o == ordinal).map(|(_, b)| b.clone())
    }

    /// Binds the program on device `ordinal` (opening it, loading the kernels, sizing the
    /// workspace) and keeps the result for later launches there.
    fn bind_device(&self, ordinal: usize) -> PyResult<Arc<kfuse::DeviceBinding>> {
        // Opening the device through the module's engine makes it count in `cache_info()`.
        device::device(ordinal)?;
        let inputs = &self.slots[..self.inputs];
        let shapes: Vec<(&str, kfuse::DType, &[usize])> =
            inputs.iter().map(|s| (s.name.as_str(), s.dtype, s.shape.as_slice())).collect();
        let strides: Vec<(&str, &[usize])> =
            inputs.iter().filter_map(|s| Some((s.name.as_str(), s.strides.as_deref()?))).collect();
        let bound = Arc::new(self.program.bind_device_strided(ordinal, &shapes, &strides).map_err(errors::kfuse)?);
        let mut devices = self.devices.write().unwrap_or_else(|e| e.into_inner());
        if let Some((_, existing)) = devices.iter().find(|(o, _)| *o == ordinal) {
            return Ok(existing.clone());
        }
        devices.push((ordinal, bound.clone()));
        Ok(bound)
    }

    /// Binds `program` to `inputs` (`(name, dtype, shape)`, in declaration order), whose symbol
    /// sizes `sizes` were checked and bound already; `strides` gives the strides (elements) of
    /// the inputs that are views which are not contiguous, by name: they are read in place.
    pub fn new(
        program: kfuse::Program,
        inputs: &[ShapeArg],
        strides: &[(String, Vec<usize>)],
        sizes: Vec<u64>,
    ) -> PyResult<Binding> {
        let mut slots = Vec::with_capacity(inputs.len() + program.interface().outputs.len());
        for (name, dtype, shape) in inputs {
            let st = strides.iter().find(|(n, _)| n == name).map(|(_, s)| s.clone());
            slots.push(Slot::strided(name.clone(), parse_dtype(dtype)?, shape.clone(), st)?);
        }
        for (name, dtype, shape) in shapes::output_shapes(program.interface(), &sizes) {
            slots.push(Slot::new(name, dtype, shape)?);
        }
        Ok(Binding { program, sizes, slots, inputs: inputs.len(), devices: RwLock::new(Vec::new()) })
    }
}

#[pymethods]
impl Binding {
    /// The outputs' `(dtype, shape)`, in declaration order.
    #[getter]
    fn outputs(&self) -> Vec<(&'static str, Vec<usize>)> {
        self.slots[self.inputs..].iter().map(|s| (dtype_name(s.dtype), s.shape.clone())).collect()
    }

    /// Checks the values of lengths/offsets inputs: `values` holds the `(name, bytes)` of the i32
    /// metadata inputs (host copies, little-endian).
    fn check_layouts(&self, values: Vec<(String, Vec<u8>)>) -> PyResult<()> {
        let ints: Vec<(String, Vec<i32>)> = values
            .into_iter()
            .map(|(n, b)| (n, b.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()))
            .collect();
        let refs: Vec<(&str, &[i32])> = ints.iter().map(|(n, v)| (n.as_str(), v.as_slice())).collect();
        shapes::check_layouts(self.program.interface(), &self.sizes, &refs).map_err(|e| errors::bind(&e))
    }

    /// Launches the program on CUDA device `ordinal` and stream `stream` (a `cudaStream_t` of
    /// that device, 0 for the legacy default stream) over memory that the caller owns and keeps
    /// alive for the call: `addresses` holds one 16-byte aligned address per input, then per
    /// output, of tensors of the bound shapes (an input bound with strides: element-aligned, the
    /// start of its view). Queues the kernels and returns: no host
    /// synchronisation. The first launch on a device loads the kernels (compiling them with NVRTC
    /// when the cache has none) with the GIL released; later launches only queue them. `validate`
    /// 0 gives the kernels no error record (no checks); otherwise they check the lengths/offsets
    /// values they read and record a violation on the device, which this launch, like any later
    /// kfuse call on the device, raises first (`InputError`) when it is pending.
    #[pyo3(signature = (ordinal, stream, addresses, validate=1))]
    fn launch(&self, py: Python<'_>, ordinal: usize, stream: u64, addresses: Vec<u64>, validate: i64) -> PyResult<()> {
        if addresses.len() != self.slots.len() {
            return Err(errors::raise(
                Kind::Input,
                format!("{} addresses given for {} inputs and outputs", addresses.len(), self.slots.len()),
            ));
        }
        let roles =
            self.slots.iter().enumerate().map(|(i, s)| if i < self.inputs { ("input", s) } else { ("output", s) });
        let (dense, strided): (Vec<_>, Vec<_>) = roles.zip(&addresses).partition(|((_, s), _)| s.strides.is_none());
        device::check_aligned(dense.into_iter().map(|((role, s), &a)| (role, s.name.as_str(), a)))?;
        for ((role, s), &a) in strided {
            if a % s.dtype.size_bytes() as u64 != 0 {
                let why =
                    format!("{role} `{}` starts at {a:#x}, which is not aligned to its {} elements", s.name, s.dtype);
                return Err(errors::raise(Kind::Input, why));
            }
        }
        let bound = match self.on_device(ordinal) {
            Some(bound) => bound,
            // The first launch on a device loads the kernels, compiling them when the cache has
            // none: other Python threads run meanwhile.
            None => py.detach(|| self.bind_device(ordinal))?,
        };
        let memory: Vec<(u64, u64)> = addresses.iter().zip(&self.slots).map(|(&a, s)| (a, s.bytes)).collect();
        let (stream, buffers) = device::borrow(bound.gpu(), stream, &memory)?;
        // Queuing kernels takes microseconds: the GIL is kept, so that a call does not wait for
        // it behind other Python threads.
        let mode = if validate == 0 { kfuse::Validation::Off } else { kfuse::Validation::Deferred };
        bound.launch(&stream, &buffers, mode).map_err(errors::kfuse)
    }

    fn __repr__(&self) -> String {
        let shapes: Vec<String> = self.slots.iter().map(|s| format!("{}: {}{:?}", s.name, s.dtype, s.shape)).collect();
        format!("<kfuse.Binding of {} ({})>", self.program.origin(), shapes.join(", "))
    }
}

/// Scales a gradient (`grad`: address, dtype, element count; the caller's memory, 16-byte
/// aligned) in place by a one-element upstream gradient (`upstream`: address, dtype) on CUDA
/// device `ordinal` and stream `stream`; nothing is written when the upstream gradient is exactly
/// 1, which the kernel reads on the device (no host synchronisation). The backward of a loss
/// computed together with its gradients.
#[pyfunction]
pub fn scale_by_upstream(
    ordinal: usize,
    stream: u64,
    grad: (u64, String, u64),
    upstream: (u64, String),
) -> PyResult<()> {
    let (grad_dtype, up_dtype) = (parse_dtype(&grad.1)?, parse_dtype(&upstream.1)?);
    let g = Slot::new("grad".to_string(), grad_dtype, vec![usize::try_from(grad.2).unwrap_or(usize::MAX)])?;
    let u = Slot::new("upstream".to_string(), up_dtype, vec![])?;
    let gpu = device::device(ordinal)?;
    device::engine()?.take_pending_error(ordinal).map_err(errors::kfuse)?;
    device::check_aligned([("gradient", g.name.as_str(), grad.0)])?;
    let (stream, buffers) = device::borrow(&gpu, stream, &[(grad.0, g.bytes), (upstream.0, u.bytes)])?;
    let mut buffers = buffers.into_iter();
    let (Some(gb), Some(ub)) = (buffers.next(), buffers.next()) else {
        return Err(errors::raise(Kind::Error, "two buffers borrowed, fewer came back".to_string()));
    };
    let grad = DeviceTensor::contiguous(gb, g.dtype, g.shape);
    let up = DeviceTensor::contiguous(ub, u.dtype, u.shape);
    kfuse::scale_by_upstream(device::engine()?, ordinal, &stream, &grad, &up).map_err(errors::kfuse)
}
