//! Dtypes and shapes as they cross the boundary: kfuse's dtype names (`"f32"`, `"bf16"`, ...)
//! and `(name, dtype, shape)` triples.

use kfuse::DType;
use pyo3::prelude::*;

use crate::errors::{self, Kind};

/// A shape crossing the boundary: `(name, dtype, shape)`.
pub(crate) type ShapeArg = (String, String, Vec<usize>);

/// The dtype of a kfuse dtype name; any other name is a `kfuse.InputError` listing them.
pub fn parse_dtype(s: &str) -> PyResult<DType> {
    Ok(match s {
        "f32" => DType::F32,
        "f16" => DType::F16,
        "bf16" => DType::BF16,
        "i32" => DType::I32,
        "i64" => DType::I64,
        "bool" => DType::Bool,
        _ => {
            return Err(errors::raise(
                Kind::Input,
                format!("unknown dtype `{s}`; kfuse has f32, f16, bf16, i32, i64, bool"),
            ))
        }
    })
}

/// kfuse's name of a dtype (what `parse_dtype` reads).
pub fn dtype_name(d: DType) -> &'static str {
    match d {
        DType::F32 => "f32",
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        DType::I32 => "i32",
        DType::I64 => "i64",
        DType::Bool => "bool",
    }
}
