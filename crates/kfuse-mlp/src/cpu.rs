//! The CPU paths: [`run_cpu`], the "CPU interpreter path" (f64 matrix products in parallel, each
//! activation evaluated by kfuse-interp from its `.kf` expression), and [`reference_f64`], an
//! independent, straightforward f64 evaluation used to test the former.
//!
//! Both compute in f64 from the stored (f16/bf16-exact) weights and never round between layers;
//! the GPU rounds activations to the model dtype between layers, which is what the tolerances of
//! GPU tests allow for. Neither is fast: they are oracles.

use rayon::prelude::*;

use kfuse_ir::{DType, HostTensor};

use crate::error::{MlpError, Result};
use crate::model::MlpModel;

/// Rows per interpreter call: bounds memory and gives rayon work to share.
const CPU_CHUNK_ROWS: usize = 2048;

/// Checks that `input` is a non-empty `[rows, in]` float matrix for `model`; returns `rows`.
pub fn check_input(model: &MlpModel, input: &HostTensor) -> Result<usize> {
    let want = model.input_width();
    if !matches!(input.dtype(), DType::F32 | DType::F16 | DType::BF16) {
        return Err(MlpError::InputDType { dtype: input.dtype() });
    }
    if input.shape.len() != 2 {
        return Err(MlpError::InputRank { shape: input.shape.clone(), want });
    }
    if input.shape[1] != want {
        return Err(MlpError::InputWidth { got: input.shape[1], want });
    }
    if input.shape[0] == 0 {
        return Err(MlpError::EmptyBatch);
    }
    Ok(input.shape[0])
}

/// One layer's affine part on `rows` rows: `x · Wᵀ + b` in f64.
fn affine(layer: &crate::model::MlpLayer, x: &[f64], rows: usize) -> Vec<f64> {
    let (k, n) = (layer.inputs, layer.outputs);
    let w: Vec<f64> = layer.weight.iter().map(|&v| v as f64).collect();
    let mut out = vec![0.0f64; rows * n];
    out.par_chunks_mut(n).zip(x.par_chunks(k)).for_each(|(o, xr)| {
        for (j, oj) in o.iter_mut().enumerate() {
            let wr = &w[j * k..(j + 1) * k];
            let mut acc = 0.0f64;
            for (a, b) in xr.iter().zip(wr) {
                acc += a * b;
            }
            *oj = acc + layer.bias.as_ref().map_or(0.0, |b| b[j] as f64);
        }
    });
    out
}

/// The model on `input` through the CPU interpreter path, as unrounded f64 `[rows, out]` values.
pub fn evaluate_cpu(model: &MlpModel, input: &HostTensor) -> Result<Vec<f64>> {
    let rows = check_input(model, input)?;
    let x = input.to_f64();
    let k0 = model.input_width();
    let chunks: Vec<Result<Vec<f64>>> = x
        .par_chunks(CPU_CHUNK_ROWS * k0)
        .map(|chunk| {
            let r = chunk.len() / k0;
            let mut h = chunk.to_vec();
            for (i, layer) in model.layers.iter().enumerate() {
                let z = affine(layer, &h, r);
                h = layer.activation.evaluate_f64(i, z)?;
            }
            Ok(h)
        })
        .collect();
    let mut out = Vec::with_capacity(rows * model.output_width());
    for c in chunks {
        out.extend(c?);
    }
    Ok(out)
}

/// The model on `input` through the CPU interpreter path, stored in the input's dtype.
pub fn run_cpu(model: &MlpModel, input: &HostTensor) -> Result<HostTensor> {
    run_cpu_as(model, input, input.dtype())
}

/// The model on `input` through the CPU interpreter path, stored in `out_dtype`.
pub fn run_cpu_as(model: &MlpModel, input: &HostTensor, out_dtype: DType) -> Result<HostTensor> {
    check_input(model, input)?;
    if !matches!(out_dtype, DType::F32 | DType::F16 | DType::BF16) {
        return Err(MlpError::OutputDType { dtype: out_dtype });
    }
    let values = evaluate_cpu(model, input)?;
    let rows = values.len() / model.output_width().max(1);
    Ok(HostTensor::from_f64(out_dtype, vec![rows, model.output_width()], &values))
}

/// erf in f64 by its everywhere-convergent series `2/√π · e^(-x²) · Σ 2ⁿ x^(2n+1) / (2n+1)!!`
/// (all terms positive, so no cancellation); |x| ≥ 6 gives ±1 (erfc(6) ≈ 2e-17).
pub fn erf_f64(x: f64) -> f64 {
    if x.is_nan() {
        return x;
    }
    if x.abs() >= 6.0 {
        return x.signum();
    }
    let x2 = x * x;
    let mut term = x;
    let mut sum = x;
    let mut n = 0.0f64;
    while term.abs() > 1e-17 * sum.abs() {
        n += 1.0;
        term *= 2.0 * x2 / (2.0 * n + 1.0);
        sum += term;
    }
    2.0 / std::f64::consts::PI.sqrt() * (-x2).exp() * sum
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// A named activation written out in Rust, independent of the `.kf` expression table.
fn named_activation_f64(name: &str, x: f64) -> Option<f64> {
    Some(match name {
        "none" | "x" => x,
        "relu" => x.max(0.0),
        "leaky_relu" => {
            if x > 0.0 {
                x
            } else {
                0.01 * x
            }
        }
        "silu" => x * sigmoid(x),
        "gelu" => 0.5 * x * (1.0 + erf_f64(x / std::f64::consts::SQRT_2)),
        "gelu_tanh" => 0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh()),
        "sigmoid" => sigmoid(x),
        "tanh" => x.tanh(),
        "softplus" => {
            if x > 20.0 {
                x
            } else {
                x.exp().ln_1p()
            }
        }
        "sin" => x.sin(),
        "exp" => x.exp(),
        _ => return None,
    })
}

/// A straightforward f64 evaluation of the model (triple loop, one row at a time), independent
/// of [`run_cpu`]: named activations are written out in Rust; only custom expressions go through
/// the interpreter. Returns `[rows, out]` values row-major.
pub fn reference_f64(model: &MlpModel, input: &HostTensor) -> Result<Vec<f64>> {
    let rows = check_input(model, input)?;
    let mut h = input.to_f64();
    let mut width = model.input_width();
    for (li, layer) in model.layers.iter().enumerate() {
        let mut z = vec![0.0f64; rows * layer.outputs];
        for r in 0..rows {
            for j in 0..layer.outputs {
                let mut acc = 0.0f64;
                for k in 0..width {
                    acc += h[r * width + k] * layer.weight[j * width + k] as f64;
                }
                if let Some(b) = &layer.bias {
                    acc += b[j] as f64;
                }
                z[r * layer.outputs + j] = acc;
            }
        }
        let spec = layer.activation.spec.as_str();
        h = if named_activation_f64(spec, 0.0).is_some() {
            z.into_iter().map(|v| named_activation_f64(spec, v).unwrap_or(f64::NAN)).collect()
        } else {
            layer.activation.evaluate_f64(li, z)?
        };
        width = layer.outputs;
    }
    Ok(h)
}

/// Comparison of a result with a reference, row by row.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct ErrorReport {
    /// ‖got − want‖₂ / ‖want‖₂ over all compared values.
    pub rel_err: f64,
    /// max |got − want|.
    pub max_abs_err: f64,
    /// The worst row's ‖Δrow‖₂ / max(‖want row‖₂, 1e-3 · RMS row norm): the floor keeps rows whose
    /// reference is nearly zero (all-negative ReLU inputs) from dividing by zero.
    pub worst_row_rel_err: f64,
    /// Index of that row (in the compared rows).
    pub worst_row: usize,
    /// Values that are NaN or infinite in `got` where `want` is finite.
    pub non_finite: usize,
    /// Rows compared.
    pub rows: usize,
}

/// Compares `got` with `want`, both `[rows, width]` row-major.
pub fn compare_rows(got: &[f64], want: &[f64], width: usize) -> ErrorReport {
    let width = width.max(1);
    let rows = want.len() / width;
    let (mut num, mut den, mut max_abs, mut non_finite) = (0.0f64, 0.0f64, 0.0f64, 0usize);
    let mut row_norms = Vec::with_capacity(rows);
    let mut row_diffs = Vec::with_capacity(rows);
    for r in 0..rows {
        let (mut d2, mut w2) = (0.0f64, 0.0f64);
        for c in 0..width {
            let (g, w) = (got.get(r * width + c).copied().unwrap_or(f64::NAN), want[r * width + c]);
            if !g.is_finite() && w.is_finite() {
                non_finite += 1;
            }
            let d = if g.is_finite() || !w.is_finite() { g - w } else { f64::INFINITY };
            let d = if d.is_nan() { f64::INFINITY } else { d };
            d2 += d * d;
            w2 += w * w;
            max_abs = max_abs.max(d.abs());
        }
        num += d2;
        den += w2;
        row_norms.push(w2.sqrt());
        row_diffs.push(d2.sqrt());
    }
    let rms = (den / rows.max(1) as f64).sqrt();
    // A row's error is measured against its own norm, but never against less than 5% of the
    // typical row's: a row whose outputs nearly cancel carries the absolute rounding error of
    // the partial sums that made it (at the scale of ordinary rows), which no storage format avoids.
    let floor = (0.05 * rms).max(f64::MIN_POSITIVE);
    let (mut worst, mut worst_row) = (0.0f64, 0usize);
    for r in 0..rows {
        let e = row_diffs[r] / row_norms[r].max(floor);
        if e > worst || e.is_nan() {
            worst = e;
            worst_row = r;
        }
    }
    let rel_err = if den > 0.0 {
        (num / den).sqrt()
    } else if num == 0.0 {
        0.0
    } else {
        f64::INFINITY
    };
    ErrorReport { rel_err, max_abs_err: max_abs, worst_row_rel_err: worst, worst_row, non_finite, rows }
}
