//! Times the fused kernel's tile and math variants on the three issue-5 benchmark models
//! (64→4×64→16 ReLU, 64→4×128→16 ReLU, 32→64→128→96→64→32→16 SiLU with bias; f16, batch 2^21)
//! on the first GPU, checking each against the CPU interpreter path, and prints one table.
//!
//! `mlp_tune [OUT.jsonl [MODEL_DIR]]`: one JSON report per line to OUT.jsonl when given; the
//! models (model.json + safetensors) are written to MODEL_DIR when given, for `kfuse mlp bench`. Run with a fresh
//! KFUSE_CACHE_DIR so that each variant's first call is a cold compile. Prints SKIPPED without
//! a GPU. Env: KF_MODEL runs one model only.

use std::io::Write;

use kfuse_mlp::testing::{write_model, ModelSpec};
use kfuse_mlp::{bench_gpu, ActivationMath, BenchOptions, CompileEffort, MlpModel, RepeatedLayers};

/// (warps, row tiles, activation math, compile effort, repeated layers); `None` = the generator's
/// default.
type Variant = (Option<u32>, Option<u32>, ActivationMath, CompileEffort, RepeatedLayers);

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let gpu = match kfuse_runtime::open_default() {
        Ok(g) => g,
        Err(e) => {
            println!("SKIPPED: no GPU ({e})");
            return Ok(());
        }
    };
    let mut out = match std::env::args().nth(1) {
        Some(p) => Some(std::fs::File::create(p)?),
        None => None,
    };
    let tmp = tempfile::tempdir()?;
    let dir = match std::env::args().nth(2) {
        Some(d) => {
            std::fs::create_dir_all(&d)?;
            std::path::PathBuf::from(d)
        }
        None => tmp.path().to_path_buf(),
    };
    use ActivationMath::{Packed, TanhF32};
    use CompileEffort::Full;
    use RepeatedLayers::{Loop, Unrolled};
    let d: Variant = (None, None, Packed, Full, Unrolled);
    let looped: Variant = (None, None, Packed, Full, Loop);
    let models: [(&str, Vec<usize>, &str, bool, Vec<Variant>); 3] = [
        ("mlp64x4_relu", vec![64, 64, 64, 64, 64, 16], "relu", false, vec![d, looped, d, looped]),
        ("mlp128x4_relu", vec![64, 128, 128, 128, 128, 16], "relu", false, vec![d, looped, d, looped]),
        ("mlp_silu_bias", vec![32, 64, 128, 96, 64, 32, 16], "silu", true, vec![d, (None, None, TanhF32, Full, Unrolled), d]),
    ];
    let only = std::env::var("KF_MODEL").ok();
    let mut table = Vec::new();
    for (name, widths, act, bias, variants) in models {
        if only.as_deref().is_some_and(|o| o != name) {
            continue;
        }
        let mut spec = ModelSpec::new(&widths, act);
        spec.with_bias = bias;
        let model = MlpModel::load(write_model(&dir, name, &spec)?)?;
        for (warps, r, math, effort, repeated) in variants {
            let opts = BenchOptions { warps, row_tiles_per_warp: r, activation_math: math, compile_effort: effort, repeated_layers: repeated, ..BenchOptions::default() };
            let label = format!("{name} w{} r{} {math:?} {effort:?} {repeated:?}", warps.map_or("-".into(), |w| w.to_string()), r.map_or("-".into(), |r| r.to_string()));
            match bench_gpu(&gpu, &model, &opts) {
                Ok(rep) => {
                    let line = format!(
                        "{label:52} {:2}x{:2} {:8.4} ms {:6.1} TF/s {:5.0} GB/s first {:6.0} ms rel {:.2e} worst row {:.2e} nonfinite {}",
                        rep.warps_per_block.unwrap_or(0),
                        rep.rows_per_warp.unwrap_or(0) / 16,
                        rep.kernel_ms_median,
                        rep.tflops,
                        rep.gbps,
                        rep.first_call_ms,
                        rep.check.rel_err,
                        rep.check.worst_row_rel_err,
                        rep.check.non_finite
                    );
                    println!("{line}");
                    table.push(line);
                    if let Some(f) = out.as_mut() {
                        writeln!(f, "{}", serde_json::json!({"variant": label, "report": rep}))?;
                    }
                }
                Err(e) => {
                    println!("{label:52} FAILED: {e}");
                    table.push(format!("{label:52} FAILED: {e}"));
                }
            }
        }
    }
    println!("\n{}", table.join("\n"));
    Ok(())
}
