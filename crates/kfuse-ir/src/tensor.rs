//! Host tensors (the values that go in and come out of a graph) and the binding of their run-time
//! sizes to a graph's dimension symbols.

use half::{bf16, f16};

use crate::{BindError, DType, Graph, Interface, TensorDecl};

/// The elements of a host tensor, row-major.
#[derive(Clone, Debug, PartialEq)]
pub enum TensorData {
    F32(Vec<f32>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
    I32(Vec<i32>),
    I64(Vec<i64>),
    Bool(Vec<bool>),
}

/// A dense row-major tensor in host memory.
#[derive(Clone, Debug, PartialEq)]
pub struct HostTensor {
    pub shape: Vec<usize>,
    pub data: TensorData,
}

impl HostTensor {
    pub fn new(shape: Vec<usize>, data: TensorData) -> HostTensor {
        debug_assert_eq!(shape.iter().product::<usize>(), data.len());
        HostTensor { shape, data }
    }

    pub fn dtype(&self) -> DType {
        match self.data {
            TensorData::F32(_) => DType::F32,
            TensorData::F16(_) => DType::F16,
            TensorData::BF16(_) => DType::BF16,
            TensorData::I32(_) => DType::I32,
            TensorData::I64(_) => DType::I64,
            TensorData::Bool(_) => DType::Bool,
        }
    }

    pub fn len(&self) -> usize {
        self.data.len()
    }

    pub fn is_empty(&self) -> bool {
        self.data.len() == 0
    }

    /// Builds a tensor of `dtype` from f64 values, rounding to nearest (ints truncate toward
    /// zero, saturating at their range, NaN giving 0; bools are `!= 0`).
    pub fn from_f64(dtype: DType, shape: Vec<usize>, values: &[f64]) -> HostTensor {
        let data = match dtype {
            DType::F32 => TensorData::F32(values.iter().map(|&v| v as f32).collect()),
            DType::F16 => TensorData::F16(values.iter().map(|&v| f16::from_f64(v)).collect()),
            DType::BF16 => TensorData::BF16(values.iter().map(|&v| bf16::from_f64(v)).collect()),
            DType::I32 => TensorData::I32(values.iter().map(|&v| v as i32).collect()),
            DType::I64 => TensorData::I64(values.iter().map(|&v| v as i64).collect()),
            DType::Bool => TensorData::Bool(values.iter().map(|&v| v != 0.0).collect()),
        };
        HostTensor::new(shape, data)
    }

    /// Every element as f64 (exact for every dtype but `i64`, whose magnitudes above 2^53 round to
    /// the nearest f64).
    pub fn to_f64(&self) -> Vec<f64> {
        self.data.to_f64()
    }

    /// The single element of a scalar (or one-element) tensor.
    pub fn scalar_f64(&self) -> Option<f64> {
        (self.len() == 1).then(|| self.to_f64()[0])
    }

    /// The tensor's bytes as stored in memory (little-endian; bool as one byte 0/1).
    pub fn to_bytes(&self) -> Vec<u8> {
        match &self.data {
            TensorData::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            TensorData::F16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            TensorData::BF16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            TensorData::I32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            TensorData::I64(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            TensorData::Bool(v) => v.iter().map(|&b| b as u8).collect(),
        }
    }

    /// Rebuilds a tensor from its memory bytes; `None` when the byte count does not match.
    pub fn from_bytes(dtype: DType, shape: Vec<usize>, bytes: &[u8]) -> Option<HostTensor> {
        let n: usize = shape.iter().product();
        if bytes.len() != n * dtype.size_bytes() {
            return None;
        }
        let data = match dtype {
            DType::F32 => {
                TensorData::F32(bytes.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect())
            }
            DType::F16 => TensorData::F16(bytes.chunks_exact(2).map(|c| f16::from_le_bytes([c[0], c[1]])).collect()),
            DType::BF16 => TensorData::BF16(bytes.chunks_exact(2).map(|c| bf16::from_le_bytes([c[0], c[1]])).collect()),
            DType::I32 => {
                TensorData::I32(bytes.chunks_exact(4).map(|c| i32::from_le_bytes(c.try_into().unwrap())).collect())
            }
            DType::I64 => {
                TensorData::I64(bytes.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap())).collect())
            }
            DType::Bool => TensorData::Bool(bytes.iter().map(|&b| b != 0).collect()),
        };
        Some(HostTensor::new(shape, data))
    }
}

impl TensorData {
    pub fn len(&self) -> usize {
        match self {
            TensorData::F32(v) => v.len(),
            TensorData::F16(v) => v.len(),
            TensorData::BF16(v) => v.len(),
            TensorData::I32(v) => v.len(),
            TensorData::I64(v) => v.len(),
            TensorData::Bool(v) => v.len(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub fn to_f64(&self) -> Vec<f64> {
        match self {
            TensorData::F32(v) => v.iter().map(|&x| x as f64).collect(),
            TensorData::F16(v) => v.iter().map(|&x| x.to_f64()).collect(),
            TensorData::BF16(v) => v.iter().map(|&x| x.to_f64()).collect(),
            TensorData::I32(v) => v.iter().map(|&x| x as f64).collect(),
            TensorData::I64(v) => v.iter().map(|&x| x as f64).collect(),
            TensorData::Bool(v) => v.iter().map(|&x| x as u8 as f64).collect(),
        }
    }
}

/// Run-time sizes of a graph's symbols, checked against the inputs given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SymbolBindings {
    /// `sizes[sym]`, one per [`Graph::symbols`].
    pub sizes: Vec<u64>,
}

impl SymbolBindings {
    /// Binds each symbol to the size the inputs give it, checking dtypes, ranks, constant dims and
    /// agreement between inputs. `inputs` pairs names with tensors, in any order.
    pub fn bind(graph: &Graph, inputs: &[(&str, &HostTensor)]) -> Result<SymbolBindings, BindError> {
        SymbolBindings::bind_interface(&Interface::of(graph), inputs)
    }

    /// [`SymbolBindings::bind`] against an interface (see [`Interface::bind_shapes`]), then the
    /// values of every layout-constrained input are checked.
    pub fn bind_interface(interface: &Interface, inputs: &[(&str, &HostTensor)]) -> Result<SymbolBindings, BindError> {
        let shapes: Vec<(&str, DType, &[usize])> =
            inputs.iter().map(|(n, t)| (*n, t.dtype(), t.shape.as_slice())).collect();
        let bindings = SymbolBindings { sizes: interface.bind_shapes(&shapes)? };
        for decl in interface.inputs.iter().filter(|d| d.layout.is_some()) {
            bindings.check_constraint(interface, decl, inputs)?;
        }
        Ok(bindings)
    }

    /// Checks the values of a lengths/offsets input (its dtype and shape are already checked).
    fn check_constraint(
        &self,
        interface: &Interface,
        decl: &TensorDecl,
        inputs: &[(&str, &HostTensor)],
    ) -> Result<(), BindError> {
        let Some((_, t)) = inputs.iter().find(|(n, _)| *n == decl.name) else { return Ok(()) };
        // The dtype was checked against the declaration, and the verifier made that i32.
        let TensorData::I32(values) = &t.data else { return Ok(()) };
        interface.check_layout_values(decl, values, &t.shape, &self.sizes)
    }

    pub fn resolve(&self, graph: &Graph, shape: &crate::Shape) -> Vec<usize> {
        graph.resolve_shape(shape, &self.sizes)
    }
}
