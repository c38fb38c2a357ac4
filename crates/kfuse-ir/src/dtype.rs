//! Storage dtypes and their compute kinds.

use std::fmt;

/// How a tensor's elements are stored in memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    F32,
    F16,
    BF16,
    I32,
    I64,
    Bool,
}

/// How a value is computed: every float dtype computes as a float (f32 on the GPU, f64 in the
/// interpreter), `i32` and `i64` as 32- and 64-bit integers (the same kind: they differ only in
/// width), `bool` as a boolean.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    Float,
    Int,
    Bool,
}

impl DType {
    pub const ALL: [DType; 6] = [DType::F32, DType::F16, DType::BF16, DType::I32, DType::I64, DType::Bool];

    pub fn kind(self) -> Kind {
        match self {
            DType::F32 | DType::F16 | DType::BF16 => Kind::Float,
            DType::I32 | DType::I64 => Kind::Int,
            DType::Bool => Kind::Bool,
        }
    }

    pub fn is_float(self) -> bool {
        self.kind() == Kind::Float
    }

    /// `v` rounded to the nearest value of this dtype (ties to even) where it is f16 or bf16, as
    /// a store of it rounds; `v` itself for the other dtypes.
    pub fn round(self, v: f64) -> f64 {
        match self {
            DType::F16 => half::f16::from_f64(v).to_f64(),
            DType::BF16 => half::bf16::from_f64(v).to_f64(),
            _ => v,
        }
    }

    /// Bytes per element in memory (`bool` is one byte).
    pub fn size_bytes(self) -> usize {
        match self {
            DType::I64 => 8,
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::Bool => 1,
        }
    }

    /// The name used in `.kf` files, error messages and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::Bool => "bool",
        }
    }

    pub fn from_name(name: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.name() == name)
    }

    /// The dtype of `a op b` for arithmetic: the wider float wins; mixing `f16` with `bf16` gives
    /// `f32`; a float with an int gives the float; `i32` with `i64` gives `i64` (as in PyTorch).
    /// `None` when either side is `bool`.
    pub fn promote(a: DType, b: DType) -> Option<DType> {
        use DType::*;
        Some(match (a, b) {
            (Bool, _) | (_, Bool) => return None,
            (x, y) if x == y => x,
            (I32, I64) | (I64, I32) => I64,
            (I32 | I64, f) | (f, I32 | I64) => f,
            _ => F32, // two different float dtypes
        })
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
