//! The `Mlp` class: a fused MLP (model.json + safetensors, or a description and its tensors in
//! memory) on the CPU interpreter path, and as the fused kernel on CUDA devices (one
//! `kfuse::mlp::MlpProgram` per device and dtype).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use kfuse::mlp::{MlpError, MlpModel};
use kfuse::mlp::{MlpOptions, MlpProgram};
use kfuse::{DType, HostTensor};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::device::{self, engine};
use crate::dtypes::{dtype_name, parse_dtype};
use crate::errors::{self, Kind};
use crate::program::{HostArg, Program};

/// A fused MLP loaded from its description.
#[pyclass(frozen, module = "kfuse._kfuse")]
pub struct Mlp {
    model: MlpModel,
    /// The model compiled and uploaded per (device ordinal, input and output dtype), on first use.
    programs: Mutex<HashMap<(usize, DType), Arc<MlpProgram>>>,
}

impl Mlp {
    /// The program for device `ordinal` and rows of `dtype` (in and out), compiled on first use
    /// (tiered: the first calls may run a quickly compiled form while the optimised kernel
    /// compiles in the background). The GIL is released while it compiles.
    fn program(&self, py: Python<'_>, ordinal: usize, dtype: DType) -> PyResult<Arc<MlpProgram>> {
        if let Some(p) = self.programs.lock().unwrap_or_else(|e| e.into_inner()).get(&(ordinal, dtype)) {
            return Ok(p.clone());
        }
        device::device(ordinal)?;
        let engine = engine()?;
        let model = self.model.clone();
        let made = py
            .detach(|| MlpProgram::on_engine(engine, ordinal, model, MlpOptions::for_dtypes(dtype, dtype)))
            .map_err(errors::kfuse)?;
        let mut programs = self.programs.lock().unwrap_or_else(|e| e.into_inner());
        Ok(programs.entry((ordinal, dtype)).or_insert_with(|| Arc::new(made)).clone())
    }
}

fn mlp_error(e: MlpError) -> PyErr {
    let kind = match e {
        MlpError::InputDType { .. } | MlpError::InputRank { .. } | MlpError::InputWidth { .. } => Kind::Input,
        _ => Kind::Error,
    };
    errors::raise(kind, e.to_string())
}

#[pymethods]
impl Mlp {
    /// Loads `model.json` and the weights it names.
    #[staticmethod]
    fn load(path: std::path::PathBuf) -> PyResult<Mlp> {
        Ok(Mlp { model: MlpModel::load(&path).map_err(mlp_error)?, programs: Mutex::new(HashMap::new()) })
    }

    /// Builds a model from model.json's text and its tensors as `(name, bytes, dtype, shape)`
    /// (a module's parameters, read in memory: no file is written or read); `label` names the
    /// model in errors.
    #[staticmethod]
    fn from_tensors(description: &str, tensors: Vec<HostArg<'_>>, label: &str) -> PyResult<Mlp> {
        let tensors = Program::host_tensors(&tensors)?;
        let refs: Vec<(&str, &HostTensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
        let model = MlpModel::from_tensors(description, &refs, label).map_err(mlp_error)?;
        Ok(Mlp { model, programs: Mutex::new(HashMap::new()) })
    }

    #[getter]
    fn in_features(&self) -> usize {
        self.model.input_width()
    }

    #[getter]
    fn out_features(&self) -> usize {
        self.model.output_width()
    }

    /// The layer widths, input first.
    #[getter]
    fn widths(&self) -> Vec<usize> {
        self.model.widths()
    }

    /// Runs `[rows, in_features]` input bytes of `dtype` through the CPU path (f64 inside);
    /// returns the `[rows, out_features]` output bytes in the same dtype. Releases the GIL.
    fn run_cpu<'py>(
        &self,
        py: Python<'py>,
        data: &[u8],
        dtype: &str,
        shape: Vec<usize>,
    ) -> PyResult<(Bound<'py, PyBytes>, &'static str, Vec<usize>)> {
        let dt = parse_dtype(dtype)?;
        let input = HostTensor::from_bytes(dt, shape.clone(), data).ok_or_else(|| {
            errors::raise(Kind::Input, format!("{} bytes given for a {dt}{shape:?} input", data.len()))
        })?;
        let model = &self.model;
        let out = py.detach(|| kfuse::mlp::run_cpu(model, &input)).map_err(mlp_error)?;
        Ok((PyBytes::new(py, &out.to_bytes()), dtype_name(out.dtype()), out.shape.clone()))
    }

    /// Queues the model on CUDA device `ordinal`, stream `stream` (a `cudaStream_t` of that
    /// device, 0 for the legacy default stream): `rows` rows of `dtype` at `input` (`in_bytes`
    /// bytes) into `output` (`out_bytes` bytes), memory that the caller keeps alive for the call.
    /// No host synchronisation for the fused kernel. The first call per device and dtype compiles
    /// (GIL released).
    #[allow(clippy::too_many_arguments)]
    fn launch(
        &self,
        py: Python<'_>,
        ordinal: usize,
        stream: u64,
        input: u64,
        in_bytes: u64,
        output: u64,
        out_bytes: u64,
        rows: usize,
        dtype: &str,
    ) -> PyResult<()> {
        let dt = parse_dtype(dtype)?;
        let size = dt.size_bytes() as u64;
        let rows_u = rows as u64;
        for (role, bytes, width) in
            [("input", in_bytes, self.model.input_width()), ("output", out_bytes, self.model.output_width())]
        {
            let want = rows_u.saturating_mul(width as u64).saturating_mul(size);
            if bytes < want {
                return Err(errors::raise(
                    Kind::Input,
                    format!("the {role} holds {bytes} bytes; {rows} rows of {width} {dt} need {want}"),
                ));
            }
        }
        if rows == 0 {
            return Ok(());
        }
        device::check_aligned([("input", "x", input), ("output", "out", output)])?;
        let program = self.program(py, ordinal, dt)?;
        let gpu = program.gpu().clone();
        let (stream, buffers) = device::borrow(&gpu, stream, &[(input, in_bytes), (output, out_bytes)])?;
        py.detach(|| program.launch(&stream, &buffers[0], &buffers[1], rows)).map_err(errors::kfuse)
    }

    /// Blocks until every compiled program (device and dtype) uses its optimised kernel; returns
    /// how many there are.
    fn wait_optimized(&self, py: Python<'_>) -> PyResult<usize> {
        let programs: Vec<Arc<MlpProgram>> =
            self.programs.lock().unwrap_or_else(|e| e.into_inner()).values().cloned().collect();
        py.detach(|| programs.iter().try_for_each(|p| p.wait_optimized().map(|_| ()))).map_err(errors::kfuse)?;
        Ok(programs.len())
    }

    fn __repr__(&self) -> String {
        format!("<kfuse._kfuse.Mlp {}>", self.model.summary())
    }
}
