//! The `Mlp` class: a fused MLP (model.json + safetensors) on the CPU interpreter path.

use kfuse_ir::HostTensor;
use kfuse_mlp::{MlpError, MlpModel};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::errors::{self, Kind};
use crate::program::{dtype_name, parse_dtype};

/// A fused MLP loaded from its description.
#[pyclass(frozen, module = "kfuse._kfuse")]
pub struct Mlp {
    model: MlpModel,
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
        Ok(Mlp { model: MlpModel::load(&path).map_err(mlp_error)? })
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
        let out = py.detach(|| kfuse_mlp::run_cpu(model, &input)).map_err(mlp_error)?;
        Ok((PyBytes::new(py, &out.to_bytes()), dtype_name(out.dtype()), out.shape.clone()))
    }

    fn __repr__(&self) -> String {
        format!("<kfuse._kfuse.Mlp {}>", self.model.summary())
    }
}
