//! Times NVRTC on the fused kernels of the three MLP benchmark models (64→4×64→16 ReLU,
//! 64→4×128→16 ReLU, 32→…→16 SiLU with bias) for sm_90, once per NVRTC option set, and prints
//! the ptxas resource report, then one line per model with the two tiers' compile times (the
//! fast form `emit_fast_form` that serves a cold first call, and the fully optimised kernel
//! compiled in the background), then the fast form again while the optimised kernel compiles on
//! another thread (what a first call would pay if the two overlapped). No GPU needed: only
//! libnvrtc. For cold figures run it with `CUDA_CACHE_DISABLE=1` (NVRTC 12.9+ keeps its own
//! cache in the driver's compute cache).
//!
//! `cargo run --release -p kfuse --example mlp_compile_time [-- "OPTS" ...]`: each argument
//! is one whitespace-separated option set added to the optimised kernel's options (the
//! optimised and the fast tier are always measured first). Env:
//! KF_MODEL (one model's name), KF_WARPS, KF_R (tile choices), KF_MATH=f32|tanhf32 (SiLU math),
//! KF_UNROLL=1 / KF_LOOP=1 (the optimised kernel's repeated layers unrolled / looped),
//! KF_DUMP=DIR (writes each model's source and cubin there, for nvdisasm).

use std::time::Instant;

use kfuse_mlp::testing::{write_model, ModelSpec};
use kfuse_mlp::{emit_fast_form, emit_kernel, ActivationMath, MlpKernelOptions, MlpModel, RepeatedLayers};
use kfuse_runtime::{compile, nvrtc_version, Arch, CompileOptions};

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
    let extra_sets: Vec<Vec<String>> =
        std::env::args().skip(1).map(|a| a.split_whitespace().map(str::to_string).collect()).collect();
    let mut summary: Vec<String> = Vec::new();
    let only: Option<String> = std::env::var("KF_MODEL").ok();
    for (name, widths, act, bias) in models {
        if only.as_deref().is_some_and(|o| o != name) {
            continue;
        }
        let mut spec = ModelSpec::new(&widths, act);
        spec.with_bias = bias;
        let model = MlpModel::load(write_model(dir.path(), name, &spec)?)?;
        let env = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<u32>().ok());
        let mut kopts =
            MlpKernelOptions { warps: env("KF_WARPS"), row_tiles_per_warp: env("KF_R"), ..MlpKernelOptions::default() };
        match std::env::var("KF_MATH").as_deref() {
            Ok("f32") => kopts.activation_math = ActivationMath::F32,
            Ok("tanhf32") => kopts.activation_math = ActivationMath::TanhF32,
            _ => {}
        }
        if std::env::var("KF_UNROLL").is_ok_and(|v| v == "1") {
            kopts.repeated_layers = RepeatedLayers::Unrolled;
        }
        if std::env::var("KF_LOOP").is_ok_and(|v| v == "1") {
            kopts.repeated_layers = RepeatedLayers::Loop;
        }
        let kernel = emit_kernel(&model, &kopts)?;
        let fast = emit_fast_form(&model, &kopts, &kernel, nvrtc_version()?)
            .ok_or("no fast form shares the kernel's parameters")?;
        println!(
            "{name}: {} warps x {} row tiles, {} B shared",
            kernel.warps, kernel.row_tiles_per_warp, kernel.shared_bytes
        );
        println!(
            "{name} fast form: {} warps x {} row tiles, {} B shared, {:?}",
            fast.warps, fast.row_tiles_per_warp, fast.shared_bytes, fast.nvrtc_options
        );
        // (label, source, full option list): the two tiers, then the optimised kernel's options
        // plus each extra set.
        let mut sets: Vec<(String, &str, Vec<String>)> = vec![
            ("full".to_string(), &kernel.source, kernel.nvrtc_options.clone()),
            ("fast".to_string(), &fast.source, fast.nvrtc_options.clone()),
        ];
        for set in &extra_sets {
            sets.push((format!("{set:?}"), &kernel.source, kernel.nvrtc_options.iter().chain(set).cloned().collect()));
        }
        let mut tier_ms = [0.0f64; 3];
        for (i, (label, source, options)) in sets.iter().enumerate() {
            let mut opts = CompileOptions::for_arch(Arch::new(9, 0));
            opts.extra = options.clone();
            opts.extra.push("--ptxas-options=-v".to_string());
            let t = Instant::now();
            let m = compile(source, &opts)?;
            let ms = t.elapsed().as_secs_f64() * 1e3;
            if let Ok(d) = std::env::var("KF_DUMP") {
                std::fs::write(format!("{d}/{name}.cu"), &kernel.source)?;
                std::fs::write(format!("{d}/{name}.cubin"), &m.cubin)?;
            }
            let regs = m
                .log
                .lines()
                .filter(|l| l.contains("registers") || l.contains("spill"))
                .map(str::trim)
                .collect::<Vec<_>>()
                .join(" ");
            let ptxas = m.log.lines().find(|l| l.contains("Compile time")).unwrap_or("").trim().to_string();
            println!("{name:14} {label:40} {ms:7.0} ms cubin {:6} B | {regs} | {ptxas}", m.cubin.len());
            if let Some(slot) = tier_ms.get_mut(i) {
                *slot = ms;
            }
        }
        // The fast form again, with the optimised kernel compiling on another thread meanwhile.
        let full_opts = CompileOptions { arch: Arch::new(9, 0), extra: kernel.nvrtc_options.clone() };
        let fast_opts = CompileOptions { arch: Arch::new(9, 0), extra: fast.nvrtc_options.clone() };
        let background_source = kernel.source.clone();
        let background = std::thread::spawn(move || compile(&background_source, &full_opts).map(|_| ()));
        let t = Instant::now();
        compile(&fast.source, &fast_opts)?;
        tier_ms[2] = t.elapsed().as_secs_f64() * 1e3;
        background.join().map_err(|_| "the background compile panicked")??;
        summary.push(format!(
            "{name:14} fast tier {:6.0} ms alone {:6.0} ms beside the full compile   full tier {:6.0} ms",
            tier_ms[1], tier_ms[2], tier_ms[0]
        ));
    }
    println!(
        "\ncompile time per tier (sm_90, this CPU; CUDA_CACHE_DISABLE={}):",
        std::env::var("CUDA_CACHE_DISABLE").unwrap_or_default()
    );
    for line in summary {
        println!("{line}");
    }
    Ok(())
}
