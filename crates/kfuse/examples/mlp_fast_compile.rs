//! Times NVRTC (sm_90) on tiered compilation's fast forms of the three MLP benchmark models (64→4×64→16
//! ReLU, 64→4×128→16 ReLU, 32→64→128→96→64→32→16 SiLU with bias) and two others (a GELU
//! expression model, a bf16 SiLU model with f32 I/O): the generic fast form
//! (`emit_fast_form` = `emit_generic`, code independent of the widths) against the looped form
//! (`--Ofast-compile=mid`, repeated layers looped, one row tile per warp: the fast form
//! before the generic one), alternating, KF_RUNS times each (default 5); prints the
//! ptxas resource line; wall time and the thread's CPU time, each as min / median / max.
//! No GPU needed, only libnvrtc; run with `CUDA_CACHE_DISABLE=1`.
//!
//! `cargo run --release -p kfuse --example mlp_fast_compile [-- "OPTS" ...]`: each argument
//! is one whitespace-separated option set, timed as a further variant of the generic form (its
//! options plus these). KF_MODEL selects one model; KF_DUMP=DIR writes the generic sources and every variant's cubin
//! there (for nvdisasm).

use std::time::Instant;

use kfuse_ir::DType;
use kfuse_mlp::testing::{write_model, ModelSpec};
use kfuse_mlp::{emit_fast_form, emit_kernel, CompileEffort, MlpKernelOptions, MlpModel, RepeatedLayers};
use kfuse_runtime::{compile, nvrtc_version, Arch, CompileOptions};

/// CPU time this thread has run, ms (`/proc/thread-self/schedstat`; Linux), or `None`. NVRTC
/// compiles on the calling thread, so this is the compile's CPU time, unaffected by how many
/// other processes share the cores (wall time on this 2-core machine varies by ±25% or more).
fn thread_cpu_ms() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    Some(s.split_whitespace().next()?.parse::<f64>().ok()? / 1e6)
}

fn stats(v: &mut [f64]) -> String {
    v.sort_by(f64::total_cmp);
    format!("{:4.0} {:4.0} {:4.0} ms", v[0], v[v.len() / 2], v[v.len() - 1])
}

/// (name, widths, hidden activation, bias, weight dtype, I/O dtype).
type ModelRow = (&'static str, Vec<usize>, &'static str, bool, DType, DType);

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if !kfuse_runtime::nvrtc_available() {
        println!("SKIPPED: libnvrtc not found");
        return Ok(());
    }
    let runs: usize = std::env::var("KF_RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(5).max(1);
    let extra_sets: Vec<Vec<String>> =
        std::env::args().skip(1).map(|a| a.split_whitespace().map(str::to_string).collect()).collect();
    let dir = tempfile::tempdir()?;
    let nvrtc = nvrtc_version()?;
    let models: [ModelRow; 5] = [
        ("mlp64x4_relu", vec![64, 64, 64, 64, 64, 16], "relu", false, DType::F16, DType::F16),
        ("mlp128x4_relu", vec![64, 128, 128, 128, 128, 16], "relu", false, DType::F16, DType::F16),
        ("mlp_silu_bias", vec![32, 64, 128, 96, 64, 32, 16], "silu", true, DType::F16, DType::F16),
        ("gelu_odd", vec![100, 100, 100, 100, 3], "gelu", true, DType::F16, DType::F32),
        ("silu_bf16_f32io", vec![24, 256, 48, 16, 7], "silu", true, DType::BF16, DType::F32),
    ];
    let only = std::env::var("KF_MODEL").ok();
    let mut summary = Vec::new();
    // The process's first NVRTC compile also loads and initialises the library: timed apart, so
    // that it does not land on whichever variant comes first.
    let t = Instant::now();
    compile(
        "extern \"C\" __global__ void kf_warm_up(float* p) { p[threadIdx.x] = 1.f; }",
        &CompileOptions::for_arch(Arch::new(9, 0)),
    )?;
    summary.push(format!(
        "first NVRTC compile in the process (a 1-line kernel): {:.0} ms",
        t.elapsed().as_secs_f64() * 1e3
    ));
    // The floor: the same 1-line kernel again, with the fast forms' options.
    let mut floor = (Vec::new(), Vec::new());
    for _ in 0..runs {
        let opts = CompileOptions {
            arch: Arch::new(9, 0),
            extra: ["-ftz=true", "--Ofast-compile=mid", "-minimal"].map(String::from).to_vec(),
        };
        let (t, c) = (Instant::now(), thread_cpu_ms());
        compile("extern \"C\" __global__ void kf_floor(float* p) { p[threadIdx.x] = 2.f; }", &opts)?;
        floor.0.push(t.elapsed().as_secs_f64() * 1e3);
        if let (Some(c0), Some(c1)) = (c, thread_cpu_ms()) {
            floor.1.push(c1 - c0);
        }
    }
    let floor_cpu = if floor.1.is_empty() { "-".to_string() } else { stats(&mut floor.1) };
    summary.push(format!(
        "{:16} {:30} wall {} cpu {floor_cpu} ({runs} runs)",
        "1-line kernel",
        "(the floor)",
        stats(&mut floor.0)
    ));
    for (name, widths, act, bias, dtype, io) in models {
        if only.as_deref().is_some_and(|o| o != name) {
            continue;
        }
        let spec = ModelSpec { with_bias: bias, dtype, ..ModelSpec::new(&widths, act) };
        let model = MlpModel::load(write_model(dir.path(), name, &spec)?)?;
        let opts = MlpKernelOptions { in_dtype: io, out_dtype: io, ..MlpKernelOptions::default() };
        let full = emit_kernel(&model, &opts)?;
        let generic = emit_fast_form(&model, &opts, &full, nvrtc).ok_or("no fast form")?;
        let looped_opts = MlpKernelOptions {
            compile_effort: CompileEffort::Fast,
            repeated_layers: RepeatedLayers::Loop,
            row_tiles_per_warp: Some(1),
            ..opts.clone()
        };
        let mut looped = emit_kernel(&model, &looped_opts)?;
        if nvrtc >= (12, 4) {
            looped.nvrtc_options.push("-minimal".to_string());
        }
        if let Ok(d) = std::env::var("KF_DUMP") {
            std::fs::write(format!("{d}/{name}_generic.cu"), &generic.source)?;
        }
        let mut variants: Vec<(String, &str, Vec<String>)> = vec![
            ("looped".to_string(), &looped.source, looped.nvrtc_options.clone()),
            ("generic".to_string(), &generic.source, generic.nvrtc_options.clone()),
        ];
        for set in &extra_sets {
            variants.push((
                format!("generic {set:?}"),
                &generic.source,
                generic.nvrtc_options.iter().chain(set).cloned().collect(),
            ));
        }
        let mut times: Vec<Vec<f64>> = vec![Vec::new(); variants.len()];
        let mut cpu: Vec<Vec<f64>> = vec![Vec::new(); variants.len()];
        let mut logs = vec![String::new(); variants.len()];
        for _ in 0..runs {
            for (i, (_, source, options)) in variants.iter().enumerate() {
                let copts = CompileOptions { arch: Arch::new(9, 0), extra: options.clone() };
                let (t, c) = (Instant::now(), thread_cpu_ms());
                compile(source, &copts)?;
                times[i].push(t.elapsed().as_secs_f64() * 1e3);
                if let (Some(c0), Some(c1)) = (c, thread_cpu_ms()) {
                    cpu[i].push(c1 - c0);
                }
            }
        }
        for (i, (label, source, options)) in variants.iter().enumerate() {
            let mut copts = CompileOptions { arch: Arch::new(9, 0), extra: options.clone() };
            copts.extra.push("--ptxas-options=-v".to_string());
            let m = compile(source, &copts)?;
            if let Ok(d) = std::env::var("KF_DUMP") {
                std::fs::write(
                    format!("{d}/{name}_{}.cubin", label.replace([' ', '"', '[', ']', ',', '='], "")),
                    &m.cubin,
                )?;
            }
            logs[i] = m
                .log
                .lines()
                .filter(|l| l.contains("registers") || l.contains("spill"))
                .map(str::trim)
                .collect::<Vec<_>>()
                .join(" ");
        }
        println!(
            "{name}: generic {} warps, {} B shared; looped {} warps",
            generic.warps, generic.shared_bytes, looped.warps
        );
        for (i, (label, _, _)) in variants.iter().enumerate() {
            let cpu_stats = if cpu[i].is_empty() { "-".to_string() } else { stats(&mut cpu[i]) };
            let line = format!(
                "{name:16} {label:30} wall {} cpu {cpu_stats} ({runs} runs) | {}",
                stats(&mut times[i]),
                logs[i]
            );
            println!("{line}");
            summary.push(line);
        }
    }
    println!(
        "\nNVRTC {}.{}, sm_90, CUDA_CACHE_DISABLE={}:",
        nvrtc.0,
        nvrtc.1,
        std::env::var("CUDA_CACHE_DISABLE").unwrap_or_default()
    );
    for l in summary {
        println!("{l}");
    }
    Ok(())
}
