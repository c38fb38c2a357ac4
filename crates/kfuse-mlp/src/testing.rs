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
    /// A generator seeded from `KFUSE_TEST_SEED` when it is set (to replay a run), else from
    /// the clock (fresh data per run); returns the seed, which it also prints (a test shows it
    /// when it fails). Panics on a `KFUSE_TEST_SEED` that is not an integer (a test fixture).
    pub fn from_time() -> (Rng, u64) {
        let seed = match std::env::var("KFUSE_TEST_SEED") {
            Ok(v) => v.trim().parse().unwrap_or_else(|_| panic!("KFUSE_TEST_SEED={v:?} is not a 64-bit integer")),
            Err(_) => std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0x5eed),
        };
        println!("seed {seed} (replay with KFUSE_TEST_SEED={seed})");
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

/// Standard deviations of the kernel's error that [`check_16bit`] allows on each value.
pub const SIGMAS: f64 = 8.0;

/// The largest relative error of rounding a value to `dtype` (half an ulp): 2⁻²⁴ for f32, 2⁻¹¹
/// for f16, 2⁻⁸ for bf16; 0 for the exact i32, i64 and bool.
pub fn unit_roundoff(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 2f64.powi(-24),
        DType::F16 => 2f64.powi(-11),
        DType::BF16 => 2f64.powi(-8),
        DType::I32 | DType::I64 | DType::Bool => 0.0,
    }
}

/// How a kernel's arithmetic departs from the f64 reference, for [`error_scales`]: what it
/// rounds to the model's dtype (the input, each hidden activation, the accumulators when they are
/// f16) and how the activations are computed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Numerics {
    /// Hidden sums accumulated in f16 (`HiddenAccumulator::F16`): rounded after every 16 terms.
    pub f16_accumulator: bool,
}

/// For each output value of `model` on `input` (`[rows, out]`, row-major), an estimate of the
/// standard deviation of the kernel's error against [`evaluate_cpu`](crate::evaluate_cpu): the
/// rounding errors of a 16-bit kernel (each at most [`unit_roundoff`] of the model's dtype times
/// the value rounded, taken at that maximum) propagated through the layers as independent errors
/// (the variance of `Σ w·(h + e)` is `Σ w²·var(e)`; an activation scales it by its slope there,
/// taken over ±1e-4 of the value). Counted: the input rounded to the model's dtype, each hidden
/// activation rounded to it, each activation's own approximation (a rounding of its input's and
/// its result's magnitudes together), and the f16
/// accumulators' rounding when [`Numerics::f16_accumulator`] is set. Not counted: the output's
/// rounding to its dtype (a relative error, see [`check_16bit`]) and the f32 accumulation
/// (2⁻²⁴, negligible beside the 16-bit steps).
///
/// This is an absolute scale for each value that holds where the value itself is near zero (a
/// row whose terms cancel keeps the rounding errors of those terms), unlike a relative bound.
pub fn error_scales(model: &MlpModel, input: &HostTensor, numerics: Numerics) -> Result<Vec<f64>> {
    let rows = crate::check_input(model, input)?;
    let u = unit_roundoff(model.dtype);
    let mut h = input.to_f64();
    // Variance of the error in h; the input is rounded to the model's dtype.
    let mut var: Vec<f64> = h.iter().map(|x| (u * x).powi(2)).collect();
    let mut k = model.input_width();
    let last = model.layers.len().saturating_sub(1);
    for (li, layer) in model.layers.iter().enumerate() {
        let n = layer.outputs;
        let (mut z, mut vz) = (vec![0.0f64; rows * n], vec![0.0f64; rows * n]);
        for r in 0..rows {
            let (hr, vr) = (&h[r * k..(r + 1) * k], &var[r * k..(r + 1) * k]);
            for j in 0..n {
                let w = &layer.weight[j * k..(j + 1) * k];
                let bias = layer.bias.as_ref().map_or(0.0, |b| f64::from(b[j]));
                let (mut acc, mut propagated, mut terms2) = (bias, 0.0f64, bias * bias);
                for ((&wi, &hi), &vi) in w.iter().zip(hr).zip(vr) {
                    let wi = f64::from(wi);
                    acc += wi * hi;
                    propagated += wi * wi * vi;
                    terms2 += (wi * hi).powi(2);
                }
                let accumulated = if numerics.f16_accumulator {
                    unit_roundoff(DType::F16).powi(2) * (k as f64 / 16.0 + 1.0) * terms2
                } else {
                    0.0
                };
                z[r * n + j] = acc;
                vz[r * n + j] = propagated + accumulated;
            }
        }
        let delta: Vec<f64> = z.iter().map(|v| 1e-4 * v.abs().max(1.0)).collect();
        let up: Vec<f64> = z.iter().zip(&delta).map(|(v, d)| v + d).collect();
        let down: Vec<f64> = z.iter().zip(&delta).map(|(v, d)| v - d).collect();
        let at = layer.activation.evaluate_f64(li, z.clone())?;
        let (at_up, at_down) = (layer.activation.evaluate_f64(li, up)?, layer.activation.evaluate_f64(li, down)?);
        // Hidden values are rounded to the model's dtype. Every activation is approximated, and
        // an approximation errs by a rounding of the terms it combines, which are of the size of
        // its input: SiLU's `h + h·tanh(h)` of a very negative `h` is near 0 while its error is a
        // few ulps of `|h|`.
        let rounded = if li == last { 0.0 } else { 1.0 };
        var = (0..rows * n)
            .map(|i| {
                let slope = ((at_up[i] - at[i]).abs().max((at[i] - at_down[i]).abs()) / delta[i]).max(1.0);
                let approximation = u * (z[i].abs() + at[i].abs());
                slope * slope * vz[i] + rounded * (u * at[i]).powi(2) + approximation.powi(2)
            })
            .collect();
        h = at;
        k = n;
    }
    Ok(var.into_iter().map(f64::sqrt).collect())
}

/// Checks a 16-bit kernel's output `got` against the interpreter's `want` (both `[rows, out]`,
/// row-major) value by value: no value non-finite where `want` is finite, and each within
/// `SIGMAS · scale + u_out · |want|`, where `scale` comes from [`error_scales`] (an absolute
/// error justified by the model's dtype and the magnitudes that make the value, so values near
/// zero are judged by what their terms' rounding gives) and `u_out` is the [`unit_roundoff`] of
/// `out_dtype` (the output's own rounding, relative). A wrong weight, bias or activation moves
/// values by a sizeable fraction of their terms, far past either part.
pub fn check_16bit(
    model: &MlpModel,
    input: &HostTensor,
    got: &[f64],
    want: &[f64],
    out_dtype: DType,
    numerics: Numerics,
    what: &str,
) -> std::result::Result<(), String> {
    let scales = error_scales(model, input, numerics).map_err(|e| format!("{what}: {e}"))?;
    check_values(got, want, &scales, out_dtype, model.output_width(), what)
}

/// The value-by-value test of [`check_16bit`] with the error `scales` given.
pub fn check_values(
    got: &[f64],
    want: &[f64],
    scales: &[f64],
    out_dtype: DType,
    width: usize,
    what: &str,
) -> std::result::Result<(), String> {
    if got.len() != want.len() || scales.len() != want.len() {
        return Err(format!("{what}: {} values, {} expected ({} error scales)", got.len(), want.len(), scales.len()));
    }
    let u_out = unit_roundoff(out_dtype);
    let mut worst: Option<(f64, usize, f64)> = None; // (error / bound, index, bound)
    for (i, ((&g, &w), &s)) in got.iter().zip(want).zip(scales).enumerate() {
        if !g.is_finite() && w.is_finite() {
            return Err(format!("{what}: value {i} (row {}) is {g}, {w} expected", i / width.max(1)));
        }
        let bound = SIGMAS * s * (1.0 + u_out) + u_out * w.abs();
        let err = if g == w || (g.is_nan() && w.is_nan()) { 0.0 } else { (g - w).abs() };
        let ratio = if bound > 0.0 {
            err / bound
        } else if err == 0.0 {
            0.0
        } else {
            f64::INFINITY
        };
        if worst.is_none_or(|(r, _, _)| ratio > r || ratio.is_nan()) {
            worst = Some((ratio, i, bound));
        }
    }
    match worst {
        Some((ratio, i, bound)) if ratio.is_nan() || ratio > 1.0 => {
            let report = crate::compare_rows(got, want, width);
            Err(format!(
                "{what}: value {i} (row {}, column {}) is {}, the interpreter's {}: error {:.3e} > bound {bound:.3e} \
                 ({SIGMAS} x error scale {:.3e} + {out_dtype} rounding); overall {report:?}",
                i / width.max(1),
                i % width.max(1),
                got[i],
                want[i],
                (got[i] - want[i]).abs(),
                scales[i],
            ))
        }
        _ => Ok(()),
    }
}

/// What a kernel that rounds like the GPU gives, computed on the CPU: the input and every hidden
/// activation rounded to the model's dtype, the output to `out_dtype`, all else in f64. For tests
/// of [`check_16bit`] (a result that only rounds must pass).
pub fn round_like_gpu(model: &MlpModel, input: &HostTensor, out_dtype: DType) -> Result<Vec<f64>> {
    let rows = crate::check_input(model, input)?;
    let round = |dtype: DType, v: Vec<f64>| {
        let n = v.len();
        HostTensor::from_f64(dtype, vec![n], &v).to_f64()
    };
    let mut h = round(model.dtype, input.to_f64());
    let mut k = model.input_width();
    let last = model.layers.len().saturating_sub(1);
    for (li, layer) in model.layers.iter().enumerate() {
        let n = layer.outputs;
        let mut z = vec![0.0f64; rows * n];
        for r in 0..rows {
            for j in 0..n {
                let w = &layer.weight[j * k..(j + 1) * k];
                let bias = layer.bias.as_ref().map_or(0.0, |b| f64::from(b[j]));
                z[r * n + j] =
                    bias + w.iter().zip(&h[r * k..(r + 1) * k]).map(|(&a, &b)| f64::from(a) * b).sum::<f64>();
            }
        }
        let a = layer.activation.evaluate_f64(li, z)?;
        h = round(if li == last { out_dtype } else { model.dtype }, a);
        k = n;
    }
    Ok(h)
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
