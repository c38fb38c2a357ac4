//! Test helpers, usable without PyTorch: random models written as safetensors + model.json into a
//! folder, random inputs, and a small deterministic random number generator.
//!
//! Weights are drawn like PyTorch's `nn.Linear` default (uniform in ±1/√in), so activations
//! stay of order one through deep models. Not for production models.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use half::{bf16, f16};
use safetensors::tensor::TensorView;
use safetensors::Dtype;

use kfuse_ir::{DType, HostTensor};

use crate::error::{MlpError, Result};
use crate::model::{LayerDescription, ModelDescription, MODEL_FORMAT};
use crate::{emit_generic, emit_kernel, ActivationMath, MlpKernel, MlpKernelOptions, MlpModel};

/// SplitMix64: tiny, deterministic, good enough for test data.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    /// A generator seeded from the clock (fresh data per run); returns the seed to print.
    pub fn from_time() -> (Rng, u64) {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0x5eed);
        (Rng(seed), seed)
    }
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [lo, hi).
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        let u = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        lo + (hi - lo) * u
    }
}

/// What [`write_model`] writes.
#[derive(Clone, Debug)]
pub struct ModelSpec {
    /// Model dtype written into model.json (f16 or bf16).
    pub dtype: DType,
    /// Dtype the tensors are stored with in the safetensors file (f16, bf16 or f32).
    pub file_dtype: DType,
    /// Input width, then each layer's output width.
    pub widths: Vec<usize>,
    /// One activation per layer.
    pub activations: Vec<String>,
    /// Whether each layer gets a bias.
    pub with_bias: bool,
    /// Seed of the weights.
    pub seed: u64,
}

impl ModelSpec {
    /// `widths` with `hidden` after every layer but the last (which gets none), f16, with biases.
    pub fn new(widths: &[usize], hidden: &str) -> ModelSpec {
        let n = widths.len().saturating_sub(1);
        let activations = (0..n).map(|i| if i + 1 == n { "none".to_string() } else { hidden.to_string() }).collect();
        ModelSpec {
            dtype: DType::F16,
            file_dtype: DType::F16,
            widths: widths.to_vec(),
            activations,
            with_bias: true,
            seed: 1,
        }
    }
}

fn encode(dtype: DType, values: &[f32]) -> (Dtype, Vec<u8>) {
    match dtype {
        DType::F32 => (Dtype::F32, values.iter().flat_map(|v| v.to_le_bytes()).collect()),
        DType::BF16 => (Dtype::BF16, values.iter().flat_map(|v| bf16::from_f32(*v).to_le_bytes()).collect()),
        _ => (Dtype::F16, values.iter().flat_map(|v| f16::from_f32(*v).to_le_bytes()).collect()),
    }
}

/// Writes `<dir>/<name>.json` and `<dir>/<name>.safetensors` for `spec`; returns the json path.
/// Tensors are named like an `nn.Sequential` of Linear + activation modules (`0.weight`,
/// `2.weight`, ...).
pub fn write_model(dir: &Path, name: &str, spec: &ModelSpec) -> Result<PathBuf> {
    let mut rng = Rng::new(spec.seed);
    let mut blobs: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
    let mut layers = Vec::new();
    for (i, pair) in spec.widths.windows(2).enumerate() {
        let (inp, out) = (pair[0], pair[1]);
        let bound = 1.0 / (inp as f64).sqrt();
        let w: Vec<f32> = (0..inp * out).map(|_| rng.uniform(-bound, bound) as f32).collect();
        let (dt, bytes) = encode(spec.file_dtype, &w);
        let wname = format!("{}.weight", 2 * i);
        blobs.push((wname.clone(), dt, vec![out, inp], bytes));
        let bias = if spec.with_bias {
            let b: Vec<f32> = (0..out).map(|_| rng.uniform(-bound, bound) as f32).collect();
            let (dt, bytes) = encode(spec.file_dtype, &b);
            let bname = format!("{}.bias", 2 * i);
            blobs.push((bname.clone(), dt, vec![out], bytes));
            Some(bname)
        } else {
            None
        };
        let activation = spec.activations.get(i).cloned().unwrap_or_else(|| "none".to_string());
        layers.push(LayerDescription { weight: wname, bias, activation });
    }
    let weights_file = format!("{name}.safetensors");
    let views = blobs
        .iter()
        .map(|(n, dt, shape, bytes)| {
            TensorView::new(*dt, shape.clone(), bytes)
                .map(|v| (n.clone(), v))
                .map_err(|e| MlpError::Safetensors { path: dir.join(&weights_file), message: e.to_string() })
        })
        .collect::<Result<Vec<_>>>()?;
    let st_path = dir.join(&weights_file);
    safetensors::serialize_to_file(views, None::<HashMap<String, String>>, &st_path)
        .map_err(|e| MlpError::Safetensors { path: st_path.clone(), message: e.to_string() })?;
    let desc = ModelDescription {
        format: MODEL_FORMAT.to_string(),
        weights: weights_file,
        dtype: spec.dtype.name().to_string(),
        layers,
    };
    let json_path = dir.join(format!("{name}.json"));
    let text = serde_json::to_string_pretty(&desc)
        .map_err(|e| MlpError::Json { path: json_path.clone(), message: e.to_string() })?;
    std::fs::write(&json_path, text).map_err(|error| MlpError::Io {
        what: "model description",
        path: json_path.clone(),
        error,
    })?;
    Ok(json_path)
}

/// A `[rows, cols]` input of uniform values in [-1, 1), stored in `dtype`.
pub fn random_input(dtype: DType, rows: usize, cols: usize, rng: &mut Rng) -> HostTensor {
    let values: Vec<f64> = (0..rows * cols).map(|_| rng.uniform(-1.0, 1.0)).collect();
    HostTensor::from_f64(dtype, vec![rows, cols], &values)
}

/// The GPU tests' tolerance for f16/bf16 storage between layers: relative error at
/// most 1e-2 over the compared values.
pub const TOL_16BIT: f64 = 1e-2;

/// Checks a GPU result's [`crate::ErrorReport`] against the interpreter's with the 16-bit
/// tolerance, `bf16` when the weights or the output are bf16: no non-finite values; each row
/// within 10 × [`TOL_16BIT`] (40 × for bf16, which keeps 3 fewer mantissa bits: a row whose value
/// nearly cancels, e.g. a width-1 output, has a large relative error from storage rounding alone;
/// seen: 1.03e-1 on one row of a 3→17→1 bf16 model whose overall error was 2e-3); and the error
/// over all values within [`TOL_16BIT`], unless there are fewer than 4 of them (one row of an
/// output 1 to 3 wide: then that row is the whole figure, and seed 1795362809054387706 gave
/// 1.48e-2 on a single row of that model, max abs error 8.2e-4; such a result gets the row bound).
pub fn check_16bit(e: &crate::ErrorReport, bf16: bool, values: usize, what: &str) -> std::result::Result<(), String> {
    let row_bound = if bf16 { 40.0 * TOL_16BIT } else { 10.0 * TOL_16BIT };
    let overall = if values >= 4 { TOL_16BIT } else { row_bound };
    if e.non_finite != 0 {
        return Err(format!("{what}: {} unwritten or non-finite outputs", e.non_finite));
    }
    if !(e.rel_err <= overall && e.worst_row_rel_err <= row_bound) {
        return Err(format!("{what}: {e:?} (bounds: overall {overall:.0e}, per row {row_bound:.0e})"));
    }
    Ok(())
}

/// One model of the MLP emitter tests: widths, activations (one per layer), weight dtype, bias.
pub struct Case {
    pub widths: Vec<usize>,
    pub acts: Vec<&'static str>,
    pub dtype: DType,
    pub bias: bool,
    pub io: (DType, DType),
    pub math: ActivationMath,
}

impl Case {
    /// `hidden` after every layer but the last (none), f16 I/O, default kernel choices.
    pub fn new(widths: &[usize], hidden: &'static str, dtype: DType, bias: bool) -> Case {
        let n = widths.len() - 1;
        let acts = (0..n).map(|i| if i + 1 == n { "none" } else { hidden }).collect();
        Case { widths: widths.to_vec(), acts, dtype, bias, io: (DType::F16, DType::F16), math: ActivationMath::Packed }
    }
    /// The same model with other input and output dtypes.
    pub fn io(self, input: DType, output: DType) -> Case {
        Case { io: (input, output), ..self }
    }
    /// The same model with `act` after the last layer.
    pub fn last(mut self, act: &'static str) -> Case {
        if let Some(a) = self.acts.last_mut() {
            *a = act;
        }
        self
    }
    /// Writes the model with random weights (`seed`) into `dir` and loads it; panics on failure
    /// (a test fixture).
    pub fn model(&self, dir: &std::path::Path, name: &str, seed: u64) -> MlpModel {
        let mut spec = ModelSpec::new(&self.widths, "none");
        spec.activations = self.acts.iter().map(|a| a.to_string()).collect();
        spec.dtype = self.dtype;
        spec.with_bias = self.bias;
        spec.seed = seed;
        MlpModel::load(write_model(dir, name, &spec).expect("write model")).expect("load model")
    }
    /// Kernel options for this case's I/O dtypes and activation math, with `shared_limit` when
    /// given.
    pub fn options(&self, shared_limit: Option<u32>) -> MlpKernelOptions {
        let base = MlpKernelOptions {
            in_dtype: self.io.0,
            out_dtype: self.io.1,
            activation_math: self.math,
            ..MlpKernelOptions::default()
        };
        MlpKernelOptions { shared_limit: shared_limit.unwrap_or(base.shared_limit), ..base }
    }
}

/// The optimised kernel of `model` and its generic fast form; panics when either cannot be
/// emitted (a test fixture).
pub fn both(model: &MlpModel, opts: &MlpKernelOptions) -> (MlpKernel, MlpKernel) {
    let full = emit_kernel(model, opts).expect("emit the optimised kernel");
    match emit_generic(model, opts, &full) {
        Ok(generic) => (full, generic),
        Err(why) => panic!("{}: no generic form: {why:?}", model.summary()),
    }
}
