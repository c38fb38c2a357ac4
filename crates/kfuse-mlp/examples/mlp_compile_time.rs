//! Times NVRTC on the fused kernels of the three issue-5 benchmark models (64→4×64→16 ReLU,
//! 64→4×128→16 ReLU, 32→…→16 SiLU with bias) for sm_90, once per NVRTC option set, and prints
//! the ptxas resource report. No GPU needed: only libnvrtc.
//!
//! `cargo run --release -p kfuse-mlp --example mlp_compile_time [-- "OPTS" ...]`: each argument
//! is one whitespace-separated option set (the empty set is always measured first). Env:
//! KF_MODEL (one model's name), KF_WARPS, KF_R (tile choices), KF_MATH=f32|tanhf32 (SiLU math),
//! KF_UNROLL=1 (repeated layers unrolled instead of looped),
//! KF_DUMP=DIR (writes each model's source and cubin there, for nvdisasm).

use std::time::Instant;

use kfuse_mlp::testing::{write_model, ModelSpec};
use kfuse_mlp::{emit_kernel, ActivationMath, MlpKernelOptions, MlpModel, RepeatedLayers};
use kfuse_runtime::{compile, Arch, CompileOptions};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if !kfuse_runtime::nvrtc_available() {
        println!("SKIPPED: libnvrtc not found");
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let models: [(&str, Vec<usize>, &str, bool); 3] = [
        ("mlp64x4_relu", vec![64, 64, 64, 64, 64, 16], "relu", false),
        ("mlp128x4_relu", vec![64, 128, 128, 128, 128, 16], "relu", false),
        ("mlp_silu_bias", vec![32, 64, 128, 96, 64, 32, 16], "silu", true),
    ];
    let mut sets: Vec<Vec<String>> = vec![Vec::new()];
    sets.extend(std::env::args().skip(1).map(|a| a.split_whitespace().map(str::to_string).collect()));
    let only: Option<String> = std::env::var("KF_MODEL").ok();
    for (name, widths, act, bias) in models {
        if only.as_deref().is_some_and(|o| o != name) {
            continue;
        }
        let mut spec = ModelSpec::new(&widths, act);
        spec.with_bias = bias;
        let model = MlpModel::load(write_model(dir.path(), name, &spec)?)?;
        let env = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<u32>().ok());
        let mut kopts = MlpKernelOptions { warps: env("KF_WARPS"), row_tiles_per_warp: env("KF_R"), ..MlpKernelOptions::default() };
        match std::env::var("KF_MATH").as_deref() {
            Ok("f32") => kopts.activation_math = ActivationMath::F32,
            Ok("tanhf32") => kopts.activation_math = ActivationMath::TanhF32,
            _ => {}
        }
        if std::env::var("KF_UNROLL").is_ok_and(|v| v == "1") {
            kopts.repeated_layers = RepeatedLayers::Unrolled;
        }
        let kernel = emit_kernel(&model, &kopts)?;
        println!("{name}: {} warps x {} row tiles, {} B shared", kernel.warps, kernel.row_tiles_per_warp, kernel.shared_bytes);
        for set in &sets {
            let mut opts = CompileOptions::for_arch(Arch::new(9, 0));
            opts.extra = kernel.nvrtc_options.clone();
            opts.extra.extend(set.iter().cloned());
            opts.extra.push("--ptxas-options=-v".to_string());
            let t = Instant::now();
            let m = compile(&kernel.source, &opts)?;
            let ms = t.elapsed().as_secs_f64() * 1e3;
            if let Ok(d) = std::env::var("KF_DUMP") {
                std::fs::write(format!("{d}/{name}.cu"), &kernel.source)?;
                std::fs::write(format!("{d}/{name}.cubin"), &m.cubin)?;
            }
            let regs = m.log.lines().filter(|l| l.contains("registers") || l.contains("spill")).map(str::trim).collect::<Vec<_>>().join(" ");
            let ptxas = m.log.lines().find(|l| l.contains("Compile time")).unwrap_or("").trim().to_string();
            println!("{name:14} {:40} {ms:7.0} ms cubin {:6} B | {regs} | {ptxas}", format!("{set:?}"), m.cubin.len());
        }
    }
    Ok(())
}
