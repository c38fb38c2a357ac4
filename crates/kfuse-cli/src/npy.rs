//! `.npy` files in and out, through the `npyz` crate.
//!
//! Handles C-order arrays of `float32`, `float16`, `int32`, `bool`, and bfloat16 as NumPy's
//! `ml_dtypes` writes it (`'<V2'`, two raw bytes per element: load it in Python with
//! `np.load(p).view(ml_dtypes.bfloat16)`). Fortran order, pickled object arrays and other dtypes
//! are clear errors naming the file.

use std::fs::File;
use std::io::{BufReader, BufWriter};
use std::path::{Path, PathBuf};

use half::{bf16, f16};
use kfuse_ir::{DType, HostTensor, TensorData};
use npyz::WriterBuilder;

/// Why an `.npy` file could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum NpyError {
    #[error("cannot open {path}: {source}")]
    Open { path: PathBuf, source: std::io::Error },
    #[error("{path} is not a valid .npy file: {source}")]
    Corrupt { path: PathBuf, source: std::io::Error },
    #[error("{path} holds dtype '{descr}', which kfuse does not read (it reads float32 '<f4', float16 '<f2', bfloat16 '<V2', int32 '<i4' and bool '|b1')")]
    UnsupportedDType { path: PathBuf, descr: String },
    #[error("{path} is in Fortran order; save it C-ordered (np.ascontiguousarray)")]
    FortranOrder { path: PathBuf },
    #[error("cannot write {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
}

/// Reads an `.npy` file into a host tensor of the dtype the file holds.
pub fn read_npy(path: &Path) -> Result<HostTensor, NpyError> {
    let p = || path.to_path_buf();
    let file = File::open(path).map_err(|source| NpyError::Open { path: p(), source })?;
    let npy = npyz::NpyFile::new(BufReader::new(file)).map_err(|source| NpyError::Corrupt { path: p(), source })?;
    if npy.order() == npyz::Order::Fortran {
        return Err(NpyError::FortranOrder { path: p() });
    }
    let shape: Vec<usize> = npy.shape().iter().map(|&d| d as usize).collect();
    let descr = match npy.dtype() {
        npyz::DType::Plain(ts) => ts.to_string(),
        other => return Err(NpyError::UnsupportedDType { path: p(), descr: format!("{other:?}") }),
    };
    let corrupt = |source| NpyError::Corrupt { path: p(), source };
    let data = match descr.as_str() {
        "<f4" => TensorData::F32(npy.into_vec::<f32>().map_err(corrupt)?),
        "<f2" => TensorData::F16(npy.into_vec::<f16>().map_err(corrupt)?),
        "<i4" => TensorData::I32(npy.into_vec::<i32>().map_err(corrupt)?),
        "|b1" => TensorData::Bool(npy.into_vec::<bool>().map_err(corrupt)?),
        "<V2" | "|V2" => {
            let raw = npy.into_vec::<npyz::FixedSizeBytes<2>>().map_err(corrupt)?;
            TensorData::BF16(raw.into_iter().map(|b| bf16::from_le_bytes(b.0)).collect())
        }
        _ => return Err(NpyError::UnsupportedDType { path: p(), descr }),
    };
    let expected: usize = shape.iter().product();
    if data.len() != expected {
        let msg = format!("header promises {expected} elements, the file holds {}", data.len());
        return Err(NpyError::Corrupt {
            path: p(),
            source: std::io::Error::new(std::io::ErrorKind::UnexpectedEof, msg),
        });
    }
    Ok(HostTensor::new(shape, data))
}

/// Writes a host tensor as a C-order `.npy` file (bf16 as `'<V2'`, see the module docs).
pub fn write_npy(path: &Path, t: &HostTensor) -> Result<(), NpyError> {
    let werr = |source| NpyError::Write { path: path.to_path_buf(), source };
    let file = File::create(path).map_err(werr)?;
    let shape: Vec<u64> = t.shape.iter().map(|&d| d as u64).collect();
    let w = BufWriter::new(file);
    match &t.data {
        TensorData::F32(v) => write_typed(w, &shape, v.iter().copied()),
        TensorData::F16(v) => write_typed(w, &shape, v.iter().copied()),
        TensorData::I32(v) => write_typed(w, &shape, v.iter().copied()),
        TensorData::Bool(v) => write_typed(w, &shape, v.iter().copied()),
        TensorData::BF16(v) => write_bf16(w, &shape, v),
    }
    .map_err(werr)
}

fn write_bf16(w: BufWriter<File>, shape: &[u64], v: &[bf16]) -> std::io::Result<()> {
    let descr = "<V2".parse().map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("{e}")))?;
    let mut out = npyz::WriteOptions::<npyz::FixedSizeBytes<2>>::new()
        .dtype(npyz::DType::Plain(descr))
        .shape(shape)
        .writer(w)
        .begin_nd()?;
    out.extend(v.iter().map(|x| npyz::FixedSizeBytes(x.to_le_bytes())))?;
    out.finish()
}

fn write_typed<T: npyz::AutoSerialize>(
    w: BufWriter<File>,
    shape: &[u64],
    items: impl Iterator<Item = T>,
) -> std::io::Result<()> {
    let mut out = npyz::WriteOptions::<T>::new().default_dtype().shape(shape).writer(w).begin_nd()?;
    out.extend(items)?;
    out.finish()
}

/// The dtype a `.npy` would be read as (for messages).
pub fn dtype_name(d: DType) -> &'static str {
    match d {
        DType::F32 => "float32",
        DType::F16 => "float16",
        DType::BF16 => "bfloat16",
        DType::I32 => "int32",
        DType::Bool => "bool",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_every_dtype() {
        let dir = tempfile::tempdir().unwrap();
        let vals = [1.5, -2.0, 0.0, 3.25, 7.0, -0.5];
        for d in DType::ALL {
            let t = HostTensor::from_f64(d, vec![2, 3], &vals);
            let p = dir.path().join(format!("{d}.npy"));
            write_npy(&p, &t).unwrap();
            assert_eq!(read_npy(&p).unwrap(), t, "{d}");
        }
    }

    #[test]
    fn corrupt_and_foreign_files_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.npy");
        std::fs::write(&p, b"not an npy file at all").unwrap();
        assert!(matches!(read_npy(&p), Err(NpyError::Corrupt { .. })));
        let t = HostTensor::from_f64(DType::F32, vec![4, 4], &[1.0; 16]);
        write_npy(&p, &t).unwrap();
        let bytes = std::fs::read(&p).unwrap();
        std::fs::write(&p, &bytes[..bytes.len() - 10]).unwrap();
        let e = read_npy(&p).unwrap_err();
        assert!(matches!(e, NpyError::Corrupt { .. }), "{e}");
        assert!(matches!(read_npy(&dir.path().join("missing.npy")), Err(NpyError::Open { .. })));
    }
}
