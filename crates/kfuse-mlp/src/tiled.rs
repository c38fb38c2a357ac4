//! The tiled fallback for models the fused kernel cannot hold (weights over the shared-memory
//! limit, or layers too wide for register-resident activations): one generated kernel per layer
//! (`mlp_tiled.cuh`), f32 intermediates in global memory. Correct for any width; slow, and
//! [`TiledPlan::note`] says so.

use std::fmt::Write;

use half::{bf16, f16};

use kfuse_ir::DType;

use crate::error::{MlpError, Result};
use crate::kernel::io_kind;
use crate::model::MlpModel;

const TILED: &str = include_str!("mlp_tiled.cuh");

/// One layer's kernel in the tiled path.
#[derive(Clone, Debug, PartialEq)]
pub struct TiledLayerKernel {
    /// `kf_mlp_tiled_<hash>`.
    pub name: String,
    /// Header-free CUDA C++.
    pub source: String,
    /// The layer's weights as 16-bit values of the model dtype, `[out, in]` row-major.
    pub weight_bytes: Vec<u8>,
    /// The layer's f32 biases (empty without bias).
    pub bias_bytes: Vec<u8>,
    /// Input and output dtypes of this launch.
    pub x_dtype: DType,
    /// Output dtype of this launch.
    pub y_dtype: DType,
}

/// The tiled path for a whole model.
#[derive(Clone, Debug, PartialEq)]
pub struct TiledPlan {
    /// One kernel per layer, in order.
    pub layers: Vec<TiledLayerKernel>,
    /// Why the model is not fused, for the user.
    pub note: String,
}

/// Generates the per-layer kernels; `why` is the reason the fused kernel was not used.
pub fn emit_tiled(model: &MlpModel, in_dtype: DType, out_dtype: DType, why: &str) -> Result<TiledPlan> {
    let in_kind = io_kind(in_dtype).ok_or(MlpError::InputDType { dtype: in_dtype })?;
    let out_kind = io_kind(out_dtype).ok_or(MlpError::OutputDType { dtype: out_dtype })?;
    // Hidden layers pass f32 rows to each other.
    let f32_kind = 0;
    let last = model.layers.len().saturating_sub(1);
    let mut layers = Vec::with_capacity(model.layers.len());
    for (i, layer) in model.layers.iter().enumerate() {
        let x_dtype = if i == 0 { in_dtype } else { DType::F32 };
        let y_dtype = if i == last { out_dtype } else { DType::F32 };
        let mut src = String::new();
        let _ = writeln!(src, "// kfuse MLP tiled fallback, layer {i} of {}: {}", model.layers.len(), model.summary());
        let _ = writeln!(src, "#define KF_TILED_NAME KF_NAME_PLACEHOLDER");
        for (k, v) in [
            ("KF_K", layer.inputs),
            ("KF_N", layer.outputs),
            ("KF_X_KIND", if i == 0 { in_kind } else { f32_kind } as usize),
            ("KF_Y_KIND", if i == last { out_kind } else { f32_kind } as usize),
            ("KF_W_BF16", usize::from(model.dtype == DType::BF16)),
            ("KF_HAS_BIAS", usize::from(layer.bias.is_some())),
        ] {
            let _ = writeln!(src, "#define {k} {v}");
        }
        if layer.activation.is_identity() {
            src.push_str("__device__ __forceinline__ float kf_act(float x) { return x; }\n");
        } else {
            src.push_str(layer.activation.device_function(i, "kf_act")?.trim_end());
            src.push('\n');
        }
        src.push_str(TILED);
        let hash = blake3::hash(src.as_bytes()).to_hex();
        let name = format!("kf_mlp_tiled_{}", &hash.as_str()[..16]);
        let source = src.replace("KF_NAME_PLACEHOLDER", &name);
        let weight_bytes = layer
            .weight
            .iter()
            .flat_map(|&v| match model.dtype {
                DType::BF16 => bf16::from_f32(v).to_le_bytes(),
                _ => f16::from_f32(v).to_le_bytes(),
            })
            .collect();
        let bias_bytes =
            layer.bias.as_ref().map(|b| b.iter().flat_map(|v| v.to_le_bytes()).collect()).unwrap_or_default();
        layers.push(TiledLayerKernel { name, source, weight_bytes, bias_bytes, x_dtype, y_dtype });
    }
    Ok(TiledPlan {
        layers,
        note: format!(
            "note: {} is not fused into one kernel ({why}); running the slower tiled path, one kernel per layer",
            model.summary()
        ),
    })
}
