//! Loading an MLP: a `model.json` description next to a safetensors file holding a PyTorch
//! `state_dict`, or the same description with its tensors in memory, checked layer by layer.
//!
//! Handles: weights stored as F16, BF16 or F32 (each weight is rounded to the model's `dtype`
//! on load, so the CPU and GPU paths compute the same function; biases keep their stored values
//! in f32), optional biases, named or expression activations, widths taken from the weights and
//! checked to chain. Does not handle: layers other than `Linear` (no convolutions, norms or
//! residual connections), weights in other dtypes (f64, ints, fp8).

use std::path::{Path, PathBuf};

use half::{bf16, f16};
use safetensors::{Dtype, SafeTensors};
use serde::{Deserialize, Serialize};

use kfuse_ir::{DType, HostTensor};
use kfuse_lang::files;

use crate::activation::Activation;
use crate::error::{MlpError, Result};

/// The `format` string of model.json files this crate reads and writes.
pub const MODEL_FORMAT: &str = "kfuse-mlp/1";

/// model.json, as written by `tools/export_mlp.py`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelDescription {
    /// Always [`MODEL_FORMAT`].
    pub format: String,
    /// The safetensors file, relative to model.json's folder (or absolute).
    pub weights: String,
    /// The weights' dtype in the kernel: "f16" or "bf16".
    pub dtype: String,
    /// The layers, input side first.
    pub layers: Vec<LayerDescription>,
}

/// One `Linear` layer followed by an activation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LayerDescription {
    /// Name of the `[out, in]` weight tensor in the safetensors file.
    pub weight: String,
    /// Name of the `[out]` bias tensor, if the layer has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bias: Option<String>,
    /// A named activation or a `.kf` expression in `x`; absent means "none".
    #[serde(default = "default_activation")]
    pub activation: String,
}

fn default_activation() -> String {
    "none".to_string()
}

/// One loaded layer: `y = activation(x · Wᵀ + b)`.
#[derive(Clone, Debug, PartialEq)]
pub struct MlpLayer {
    /// The weight tensor's name (for messages).
    pub weight_name: String,
    /// Input width (`in_features`).
    pub inputs: usize,
    /// Output width (`out_features`).
    pub outputs: usize,
    /// `[outputs, inputs]` row-major, as PyTorch stores it; values exactly representable in the
    /// model's dtype.
    pub weight: Vec<f32>,
    /// `[outputs]`, or `None` for a layer without bias.
    pub bias: Option<Vec<f32>>,
    /// The activation applied after the bias.
    pub activation: Activation,
}

/// A loaded, checked MLP.
#[derive(Clone, Debug, PartialEq)]
pub struct MlpModel {
    /// Weight dtype in the kernel ([`DType::F16`] or [`DType::BF16`]).
    pub dtype: DType,
    /// The layers, input side first; widths chain.
    pub layers: Vec<MlpLayer>,
}

/// The largest `model.json` read (a description of layers: kilobytes).
const MAX_DESCRIPTION_BYTES: u64 = 64 << 20;
/// The largest weights file read (16 GiB: far more than a fused or tiled MLP can hold).
const MAX_WEIGHTS_BYTES: u64 = 16 << 30;

/// Parses "f16" / "bf16" (the model's dtype).
fn model_dtype(path: &Path, name: &str) -> Result<DType> {
    match name {
        "f16" => Ok(DType::F16),
        "bf16" => Ok(DType::BF16),
        other => Err(MlpError::ModelDType { path: path.to_path_buf(), found: other.to_string() }),
    }
}

/// Rounds an f32 to the model's dtype (exact for values already in it).
pub(crate) fn round_to(dtype: DType, v: f32) -> f32 {
    match dtype {
        DType::BF16 => bf16::from_f32(v).to_f32(),
        _ => f16::from_f32(v).to_f32(),
    }
}

/// The tensor's elements as f32 (exact for F16, BF16 and F32 storage).
fn tensor_values(layer: usize, name: &str, view: &safetensors::tensor::TensorView<'_>) -> Result<Vec<f32>> {
    let bytes = view.data();
    Ok(match view.dtype() {
        Dtype::F32 => bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
        Dtype::F16 => bytes.chunks_exact(2).map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
        Dtype::BF16 => bytes.chunks_exact(2).map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
        other => return Err(MlpError::TensorDType { layer, tensor: name.to_string(), dtype: format!("{other:?}") }),
    })
}

/// Checks what a description says besides its layers; returns the model's dtype.
fn check_description(desc: &ModelDescription, path: &Path) -> Result<DType> {
    if desc.format != MODEL_FORMAT {
        return Err(MlpError::Format { path: path.to_path_buf(), found: desc.format.clone() });
    }
    let dtype = model_dtype(path, &desc.dtype)?;
    if desc.layers.is_empty() {
        return Err(MlpError::NoLayers { path: path.to_path_buf() });
    }
    Ok(dtype)
}

/// A layer's tensor that `path` lacks; the message lists (some of) the names it holds.
fn missing(layer: usize, role: &'static str, name: &str, path: &Path, mut names: Vec<&str>) -> MlpError {
    names.sort();
    let shown: Vec<&str> = names.iter().take(24).copied().collect();
    let more = names.len().saturating_sub(shown.len());
    let available = if more > 0 {
        format!("{} (and {more} more)", shown.join(", "))
    } else if shown.is_empty() {
        "no tensors".to_string()
    } else {
        shown.join(", ")
    };
    MlpError::MissingTensor { layer, role, tensor: name.to_string(), path: path.to_path_buf(), available }
}

/// A tensor as a layer reads it: its shape and its values as f32.
type Found = (Vec<usize>, Vec<f32>);

/// Builds the layers of `desc`, reading each tensor through `get(layer, role, name)`, and checks
/// that ranks, widths and biases fit.
fn build(
    desc: &ModelDescription,
    dtype: DType,
    get: impl Fn(usize, &'static str, &str) -> Result<Found>,
) -> Result<MlpModel> {
    let mut layers: Vec<MlpLayer> = Vec::with_capacity(desc.layers.len());
    for (i, ld) in desc.layers.iter().enumerate() {
        let (shape, weight) = get(i, "weight", &ld.weight)?;
        if shape.len() != 2 {
            return Err(MlpError::TensorRank {
                layer: i,
                role: "weight",
                tensor: ld.weight.clone(),
                shape,
                want: 2,
                layout: "[out_features, in_features], as nn.Linear stores it",
            });
        }
        if shape.contains(&0) {
            return Err(MlpError::EmptyTensor { layer: i, tensor: ld.weight.clone(), shape });
        }
        let (outputs, inputs) = (shape[0], shape[1]);
        if let Some(prev) = layers.last() {
            if prev.outputs != inputs {
                return Err(MlpError::WidthChain {
                    layer: i,
                    tensor: ld.weight.clone(),
                    input: inputs,
                    prev: i - 1,
                    prev_out: prev.outputs,
                });
            }
        }
        let weight: Vec<f32> = weight.into_iter().map(|v| round_to(dtype, v)).collect();
        let bias = match &ld.bias {
            None => None,
            Some(name) => {
                let (shape, values) = get(i, "bias", name)?;
                if shape.len() != 1 {
                    return Err(MlpError::TensorRank {
                        layer: i,
                        role: "bias",
                        tensor: name.clone(),
                        shape,
                        want: 1,
                        layout: "[out_features]",
                    });
                }
                if values.len() != outputs {
                    return Err(MlpError::BiasShape {
                        layer: i,
                        tensor: name.clone(),
                        got: values.len(),
                        want: outputs,
                    });
                }
                Some(values)
            }
        };
        let activation = Activation::resolve(i, &ld.activation)?;
        layers.push(MlpLayer { weight_name: ld.weight.clone(), inputs, outputs, weight, bias, activation });
    }
    Ok(MlpModel { dtype, layers })
}

impl MlpModel {
    /// Loads `json_path` and the safetensors file it names, checking every layer.
    pub fn load(json_path: impl AsRef<Path>) -> Result<MlpModel> {
        let json_path = json_path.as_ref();
        let bytes = files::read_regular(json_path, MAX_DESCRIPTION_BYTES, "model description")?;
        let desc: ModelDescription = serde_json::from_slice(&bytes)
            .map_err(|e| MlpError::Json { path: json_path.to_path_buf(), message: e.to_string() })?;
        let folder = json_path.parent().unwrap_or(Path::new("."));
        MlpModel::from_description(&desc, json_path, &folder.join(&desc.weights))
    }

    /// Builds a model from a parsed description and the path of its weights file; `json_path`
    /// only labels errors.
    pub fn from_description(desc: &ModelDescription, json_path: &Path, weights_path: &Path) -> Result<MlpModel> {
        let dtype = check_description(desc, json_path)?;
        let bytes = files::read_regular(weights_path, MAX_WEIGHTS_BYTES, "weights file")?;
        let tensors = SafeTensors::deserialize(&bytes)
            .map_err(|e| MlpError::Safetensors { path: weights_path.to_path_buf(), message: e.to_string() })?;
        build(desc, dtype, |layer, role, name| {
            let view = tensors.tensor(name).map_err(|_| missing(layer, role, name, weights_path, tensors.names()))?;
            Ok((view.shape().to_vec(), tensor_values(layer, name, &view)?))
        })
    }

    /// Builds a model from model.json's text and its tensors in memory, by name (as a framework
    /// holds a module's parameters): no file is read, and the description's `weights` is not
    /// used. Tensors are F16, BF16 or F32, checked as [`MlpModel::load`] checks a file's;
    /// `label` names the model in errors.
    pub fn from_tensors(description: &str, tensors: &[(&str, &HostTensor)], label: &str) -> Result<MlpModel> {
        let label = Path::new(label);
        let desc: ModelDescription = serde_json::from_str(description)
            .map_err(|e| MlpError::Json { path: label.to_path_buf(), message: e.to_string() })?;
        let dtype = check_description(&desc, label)?;
        build(&desc, dtype, |layer, role, name| {
            let Some((_, t)) = tensors.iter().find(|(n, _)| *n == name) else {
                return Err(missing(layer, role, name, label, tensors.iter().map(|(n, _)| *n).collect()));
            };
            match t.dtype() {
                DType::F32 | DType::F16 | DType::BF16 => {
                    Ok((t.shape.clone(), t.to_f64().into_iter().map(|v| v as f32).collect()))
                }
                other => Err(MlpError::TensorDType { layer, tensor: name.to_string(), dtype: other.to_string() }),
            }
        })
    }

    /// The widths along the model: input width, then each layer's output width.
    pub fn widths(&self) -> Vec<usize> {
        let mut w = Vec::with_capacity(self.layers.len() + 1);
        if let Some(first) = self.layers.first() {
            w.push(first.inputs);
        }
        w.extend(self.layers.iter().map(|l| l.outputs));
        w
    }

    /// Input width of the first layer.
    pub fn input_width(&self) -> usize {
        self.layers.first().map_or(0, |l| l.inputs)
    }

    /// Output width of the last layer.
    pub fn output_width(&self) -> usize {
        self.layers.last().map_or(0, |l| l.outputs)
    }

    /// Multiply-adds per row (the FLOP count per row is twice this).
    pub fn macs_per_row(&self) -> u64 {
        self.layers.iter().map(|l| (l.inputs as u64) * (l.outputs as u64)).sum()
    }

    /// A one-line summary, e.g. `f16 64→64→16 [relu, none]`.
    pub fn summary(&self) -> String {
        let widths: Vec<String> = self.widths().iter().map(|w| w.to_string()).collect();
        let acts: Vec<&str> = self.layers.iter().map(|l| l.activation.spec.as_str()).collect();
        format!("{} {} [{}]", self.dtype, widths.join("→"), acts.join(", "))
    }
}

/// The path of a model's weights file as model.json names it (for tools that copy models).
pub fn weights_path(json_path: &Path, desc: &ModelDescription) -> PathBuf {
    json_path.parent().unwrap_or(Path::new(".")).join(&desc.weights)
}
