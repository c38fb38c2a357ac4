//! Host tensors (the values that go in and come out of a graph) and the binding of their run-time
//! sizes to a graph's dimension symbols.

use half::{bf16, f16};

use crate::{Constraint, DType, Dim, Graph, Interface, TensorDecl};

/// The elements of a host tensor, row-major.
#[derive(Clone, Debug, PartialEq)]
pub enum TensorData {
    F32(Vec<f32>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
    I32(Vec<i32>),
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
    /// zero, bools are `!= 0`).
    pub fn from_f64(dtype: DType, shape: Vec<usize>, values: &[f64]) -> HostTensor {
        let data = match dtype {
            DType::F32 => TensorData::F32(values.iter().map(|&v| v as f32).collect()),
            DType::F16 => TensorData::F16(values.iter().map(|&v| f16::from_f64(v)).collect()),
            DType::BF16 => TensorData::BF16(values.iter().map(|&v| bf16::from_f64(v)).collect()),
            DType::I32 => TensorData::I32(values.iter().map(|&v| v as i32).collect()),
            DType::Bool => TensorData::Bool(values.iter().map(|&v| v != 0.0).collect()),
        };
        HostTensor::new(shape, data)
    }

    /// Every element as f64 (exact for every dtype kfuse has).
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

/// Why a set of input tensors does not fit a graph. Every message names the input.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BindError {
    #[error("missing input `{name}` (declared as {decl})")]
    Missing { name: String, decl: String },
    #[error("unknown input `{name}`; the inputs are: {known}")]
    Unknown { name: String, known: String },
    #[error("input `{name}` has dtype {got}, but is declared as {want}")]
    DType { name: String, got: DType, want: DType },
    #[error("input `{name}` has {got} axes (shape {shape:?}), but is declared with {want}: {decl}")]
    Rank { name: String, got: usize, want: usize, shape: Vec<usize>, decl: String },
    #[error("input `{name}` has size {got} on axis {axis}, but the declaration {decl} fixes it at {want}")]
    ConstDim { name: String, axis: usize, got: usize, want: u64, decl: String },
    #[error("input `{name}` has {sym} = {got} (axis {axis}), but `{first}` already set {sym} = {want}")]
    SymbolClash { name: String, axis: usize, sym: String, got: usize, want: u64, first: String },
    /// A `lengths` input holds a negative count. `index` is written `3` or `1, 2`.
    #[error("input `{name}`: {name}[{index}] = {value} is negative (a length counts valid rows, from 0)")]
    LengthNegative { name: String, index: String, value: i32 },
    /// A `lengths` input holds a count above its declared maximum.
    #[error("input `{name}`: {name}[{index}] = {value} is greater than {dim} = {max}")]
    LengthTooLarge { name: String, index: String, value: i32, dim: String, max: u64 },
    /// An `offsets` input with no element at all.
    #[error("input `{name}` is empty, but offsets need at least one element (offsets[0] = 0; B rows need B + 1)")]
    OffsetsEmpty { name: String },
    /// An `offsets` input whose first element is not 0.
    #[error("input `{name}`: {name}[0] = {value}, but must be 0")]
    OffsetStart { name: String, value: i32 },
    /// An `offsets` input that decreases somewhere.
    #[error("input `{name}`: {name}[{index}] = {value} is less than {name}[{prev_index}] = {prev} (offsets must not decrease)")]
    OffsetDecrease { name: String, index: usize, value: i32, prev_index: usize, prev: i32 },
    /// An `offsets` input with a boundary beyond the packed row count.
    #[error("input `{name}`: {name}[{index}] = {value} is past the end ({dim} = {total})")]
    OffsetPastEnd { name: String, index: usize, value: i32, dim: String, total: u64 },
    /// An `offsets` input whose last boundary is not the packed row count.
    #[error("input `{name}`: the last offset {name}[{index}] = {value} must equal {dim} = {total}")]
    OffsetEnd { name: String, index: usize, value: i32, dim: String, total: u64 },
    /// A declaration whose shape names a symbol the interface does not have (a hand-built
    /// interface; graphs from the builder never do this).
    #[error("input `{name}` names dimension symbol ?{sym} on axis {axis}, which the interface does not declare")]
    UnknownSymbol { name: String, axis: usize, sym: u32 },
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
        for decl in &interface.inputs {
            if let Some(c) = decl.layout {
                bindings.check_constraint(interface, decl, c, inputs)?;
            }
        }
        Ok(bindings)
    }

    /// The run-time size of one dimension.
    fn dim_size(&self, dim: Dim) -> u64 {
        match dim {
            Dim::Const(c) => c,
            Dim::Sym(s) => self.sizes.get(s.0 as usize).copied().unwrap_or(0),
        }
    }

    /// Checks the values of a lengths/offsets input (its dtype and shape are already checked).
    fn check_constraint(
        &self,
        interface: &Interface,
        decl: &TensorDecl,
        c: Constraint,
        inputs: &[(&str, &HostTensor)],
    ) -> Result<(), BindError> {
        let Some((_, t)) = inputs.iter().find(|(n, _)| *n == decl.name) else { return Ok(()) };
        // The dtype was checked against the declaration, and the verifier made that i32.
        let TensorData::I32(values) = &t.data else { return Ok(()) };
        let name = decl.name.clone();
        let bound = self.dim_size(c.dim());
        let dim = interface.dim_str(c.dim());
        match c {
            Constraint::Lengths { .. } => {
                for (i, &value) in values.iter().enumerate() {
                    if value < 0 {
                        return Err(BindError::LengthNegative { name, index: multi_index(i, &t.shape), value });
                    }
                    if value as u64 > bound {
                        let index = multi_index(i, &t.shape);
                        return Err(BindError::LengthTooLarge { name, index, value, dim, max: bound });
                    }
                }
            }
            Constraint::Offsets { .. } => {
                let Some(&first) = values.first() else { return Err(BindError::OffsetsEmpty { name }) };
                if first != 0 {
                    return Err(BindError::OffsetStart { name, value: first });
                }
                for (index, w) in values.windows(2).enumerate().map(|(i, w)| (i + 1, w)) {
                    let (prev, value) = (w[0], w[1]);
                    if value < prev {
                        return Err(BindError::OffsetDecrease { name, index, value, prev_index: index - 1, prev });
                    }
                    if value as u64 > bound {
                        return Err(BindError::OffsetPastEnd { name, index, value, dim, total: bound });
                    }
                }
                let index = values.len() - 1;
                let value = values[index];
                if value as u64 != bound {
                    return Err(BindError::OffsetEnd { name, index, value, dim, total: bound });
                }
            }
        }
        Ok(())
    }

    pub fn resolve(&self, graph: &Graph, shape: &crate::Shape) -> Vec<usize> {
        graph.resolve_shape(shape, &self.sizes)
    }
}

/// The position of flat element `flat` of a row-major tensor of `shape`, written `3` or `1, 2`.
fn multi_index(flat: usize, shape: &[usize]) -> String {
    let mut rest = flat;
    let mut idx = vec![0usize; shape.len()];
    for (k, &n) in shape.iter().enumerate().rev() {
        if n > 0 {
            idx[k] = rest % n;
            rest /= n;
        }
    }
    if idx.is_empty() {
        return "0".into();
    }
    idx.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(", ")
}
