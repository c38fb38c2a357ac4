//! Benchmark of the kernel cache for the compile-once scenario: build the same kernel
//! source 1000 times and 10 different sources 100 times each in one process through
//! `Gpu::load_kernel`; then again in a fresh process with the disk cache warm. Reports compiles
//! performed, total time, per-lookup time in memory (target < 5 µs) and the time from a ready
//! CUDA context to the first result.
//!
//! Without a GPU it runs the compile-only part (`KernelCache::get_or_compile`, no launch) and
//! says so. Usage:
//! `cargo run --release -p kfuse-runtime --example cache_bench -- [--dir DIR] [--arch sm_90]
//!  [--no-warm] [--json PATH]`

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kfuse_runtime::{testing, Arch, CompileOptions, Gpu, KernelArg, KernelCache, KernelLaunch};

const SAME_REPEATS: usize = 1000;
const DISTINCT_SOURCES: u32 = 10;
const DISTINCT_REPEATS: usize = 100;
const N: usize = 1 << 16;

#[derive(serde::Serialize, serde::Deserialize, Clone)]
struct PhaseResult {
    phase: String,
    mode: String,
    device: String,
    lookups: usize,
    compiles: u64,
    disk_hits: u64,
    total_ms: f64,
    memory_lookup_mean_us: f64,
    memory_lookup_p50_us: f64,
    memory_lookup_p99_us: f64,
    first_result_ms: f64,
}

struct Args {
    dir: Option<PathBuf>,
    arch: Arch,
    warm: bool,
    phase: String,
    json: Option<PathBuf>,
    result_out: Option<PathBuf>,
}

fn parse_args() -> Result<Args, String> {
    let mut parsed =
        Args { dir: None, arch: Arch::new(9, 0), warm: true, phase: "cold".into(), json: None, result_out: None };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--dir" => parsed.dir = Some(PathBuf::from(value()?)),
            "--arch" => parsed.arch = value()?.parse().map_err(|e| format!("{e}"))?,
            "--no-warm" => parsed.warm = false,
            "--phase" => parsed.phase = value()?,
            "--json" => parsed.json = Some(PathBuf::from(value()?)),
            "--result-out" => parsed.result_out = Some(PathBuf::from(value()?)),
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(parsed)
}

/// A 40-line elementwise kernel (a smooth-L1-like loss), distinct per `variant`.
fn source(variant: u32) -> String {
    format!(
        r#"// kfuse cache bench kernel, variant {variant}
__device__ __forceinline__ float smooth(float d, float beta) {{
    float a = fabsf(d);
    return a < beta ? 0.5f * a * a / beta : a - 0.5f * beta;
}}
extern "C" __global__ void __launch_bounds__(256) bench_kernel(
    float* out,
    const float* pred,
    const float* target,
    long long n) {{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) {{ return; }}
    float p = pred[i];
    float t = target[i];
    float d = p - t;
    float s = smooth(d, {variant}.5f + 1.0f);
    float w = t != 0.0f ? 1.0f : 0.0f;
    out[i] = s * w + {variant}.0f * 1e-7f;
}}
"#
    )
}

fn percentile(sorted: &[Duration], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let index = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[index].as_secs_f64() * 1e6
}

/// Runs the lookups; `lookup` performs one build of `source(variant)`.
fn run_lookups(mut lookup: impl FnMut(u32) -> Result<(), String>) -> Result<(Duration, Vec<Duration>), String> {
    let started = Instant::now();
    let mut memory_lookups = Vec::with_capacity(SAME_REPEATS + DISTINCT_REPEATS * DISTINCT_SOURCES as usize);
    let mut first_seen = std::collections::HashSet::new();
    let mut timed = |variant: u32, lookup: &mut dyn FnMut(u32) -> Result<(), String>| -> Result<(), String> {
        let t = Instant::now();
        lookup(variant)?;
        let elapsed = t.elapsed();
        // The first build of each source may compile or read disk; later ones are memory hits.
        if !first_seen.insert(variant) {
            memory_lookups.push(elapsed);
        }
        Ok(())
    };
    for _ in 0..SAME_REPEATS {
        timed(0, &mut lookup)?;
    }
    for variant in 1..=DISTINCT_SOURCES {
        for _ in 0..DISTINCT_REPEATS {
            timed(variant, &mut lookup)?;
        }
    }
    memory_lookups.sort();
    Ok((started.elapsed(), memory_lookups))
}

fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn run_gpu(gpu: &Gpu, phase: &str) -> Result<PhaseResult, String> {
    // Time to first result: from a ready context to the downloaded output of kernel 0.
    let first = Instant::now();
    let f = gpu.load_kernel(&source(0), "bench_kernel").map_err(|e| e.to_string())?;
    let pred: Vec<f32> = (0..N).map(|i| (i % 97) as f32 * 0.01).collect();
    let target: Vec<f32> = (0..N).map(|i| (i % 13) as f32 * 0.02).collect();
    let (p, t) = (
        gpu.upload(&f32_bytes(&pred)).map_err(|e| e.to_string())?,
        gpu.upload(&f32_bytes(&target)).map_err(|e| e.to_string())?,
    );
    let out = gpu.alloc_zeroed(N * 4).map_err(|e| e.to_string())?;
    let n = i64::try_from(N).map_err(|e| e.to_string())?;
    let grid = u32::try_from(N.div_ceil(256)).map_err(|e| e.to_string())?;
    gpu.launch(
        &gpu.default_stream(),
        &f,
        KernelLaunch::new(grid, 256),
        &[KernelArg::Buffer(&out), KernelArg::Buffer(&p), KernelArg::Buffer(&t), KernelArg::I64(n)],
    )
    .map_err(|e| e.to_string())?;
    let result = gpu.download(&out).map_err(|e| e.to_string())?;
    let first_result = first.elapsed();
    if result.len() != N * 4 {
        return Err("short download".into());
    }
    let (total, memory) = run_lookups(|variant| {
        gpu.load_kernel(&source(variant), "bench_kernel").map(|_| ()).map_err(|e| e.to_string())
    })?;
    let stats = gpu.cache().stats();
    Ok(summarize(
        phase,
        "gpu: Gpu::load_kernel",
        &format!("{} ({})", gpu.name(), gpu.arch()),
        total,
        &memory,
        stats.session.compiles,
        stats.session.disk_hits,
        first_result,
    ))
}

fn run_compile_only(cache: &KernelCache, arch: Arch, phase: &str) -> Result<PhaseResult, String> {
    let opts = CompileOptions::for_arch(arch);
    let first = Instant::now();
    cache.get_or_compile(&source(0), &opts).map_err(|e| e.to_string())?;
    let first_result = first.elapsed();
    let (total, memory) =
        run_lookups(|variant| cache.get_or_compile(&source(variant), &opts).map(|_| ()).map_err(|e| e.to_string()))?;
    let stats = cache.stats();
    Ok(summarize(
        phase,
        "compile-only (no GPU): KernelCache::get_or_compile",
        &format!("none ({arch} target)"),
        total,
        &memory,
        stats.session.compiles,
        stats.session.disk_hits,
        first_result,
    ))
}

#[allow(clippy::too_many_arguments)]
fn summarize(
    phase: &str,
    mode: &str,
    device: &str,
    total: Duration,
    memory: &[Duration],
    compiles: u64,
    disk_hits: u64,
    first: Duration,
) -> PhaseResult {
    let mean = if memory.is_empty() {
        0.0
    } else {
        memory.iter().map(|d| d.as_secs_f64()).sum::<f64>() / memory.len() as f64 * 1e6
    };
    PhaseResult {
        phase: phase.to_string(),
        mode: mode.to_string(),
        device: device.to_string(),
        lookups: SAME_REPEATS + DISTINCT_REPEATS * DISTINCT_SOURCES as usize,
        compiles,
        disk_hits,
        total_ms: total.as_secs_f64() * 1e3,
        memory_lookup_mean_us: mean,
        memory_lookup_p50_us: percentile(memory, 0.5),
        memory_lookup_p99_us: percentile(memory, 0.99),
        first_result_ms: first.as_secs_f64() * 1e3,
    }
}

fn run_phase(args: &Args, dir: &PathBuf) -> Result<PhaseResult, String> {
    let cache = Arc::new(KernelCache::with_dir(dir, kfuse_runtime::cache::DEFAULT_MAX_BYTES));
    let ordinal = std::env::var("KFUSE_DEVICE").ok().and_then(|v| v.trim().parse().ok()).unwrap_or(0);
    match Gpu::open_with_cache(ordinal, cache.clone()) {
        Ok(gpu) => run_gpu(&gpu, &args.phase),
        Err(why) => {
            eprintln!("cache_bench: no GPU ({why}); running the compile-only part");
            run_compile_only(&cache, args.arch, &args.phase)
        }
    }
}

fn main() -> Result<(), String> {
    let args = parse_args()?;
    if testing::nvrtc_or_skip("cache_bench").is_none() {
        return Err("NVRTC is required".into());
    }
    let dir = match &args.dir {
        Some(dir) => dir.clone(),
        None => std::env::temp_dir().join(format!("kfuse-cache-bench-{}", std::process::id())),
    };
    if args.phase == "cold" && args.dir.is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    let result = run_phase(&args, &dir)?;
    if let Some(out) = &args.result_out {
        let json = serde_json::to_string(&result).map_err(|e| e.to_string())?;
        return std::fs::write(out, json).map_err(|e| e.to_string());
    }
    let mut results = vec![result];
    if args.warm {
        let out = dir.join("warm-result.json");
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let status = Command::new(exe)
            .args(["--phase", "warm", "--arch", &args.arch.to_string(), "--dir"])
            .arg(&dir)
            .arg("--result-out")
            .arg(&out)
            .status()
            .map_err(|e| e.to_string())?;
        if !status.success() {
            return Err(format!("warm phase failed: {status}"));
        }
        let text = std::fs::read_to_string(&out).map_err(|e| e.to_string())?;
        results.push(serde_json::from_str(&text).map_err(|e| e.to_string())?);
        let _ = std::fs::remove_file(&out);
    }
    println!("kfuse cache bench: {} builds per phase (1 source x {SAME_REPEATS}, {DISTINCT_SOURCES} sources x {DISTINCT_REPEATS}); cache folder {}", results[0].lookups, dir.display());
    println!("mode: {}; device: {}", results[0].mode, results[0].device);
    println!("| phase | compiles | disk hits | total ms | mem lookup mean µs | p50 µs | p99 µs | first result ms |");
    println!("|-------|---------:|----------:|---------:|-------------------:|-------:|-------:|----------------:|");
    for r in &results {
        println!(
            "| {:5} | {:8} | {:9} | {:8.2} | {:18.2} | {:6.2} | {:6.2} | {:15.2} |",
            r.phase,
            r.compiles,
            r.disk_hits,
            r.total_ms,
            r.memory_lookup_mean_us,
            r.memory_lookup_p50_us,
            r.memory_lookup_p99_us,
            r.first_result_ms
        );
    }
    if results[0].mode.starts_with("gpu") {
        println!("(first result, from a ready context: cold = compile + cubin load + launch + download; warm = disk read + cubin load + launch + download)");
    } else {
        println!("(first result: cold = NVRTC compile + disk write; warm = disk read; no GPU, so no load or launch)");
    }
    if let Some(path) = &args.json {
        let json = serde_json::to_string_pretty(&results).map_err(|e| e.to_string())?;
        std::fs::write(path, json).map_err(|e| e.to_string())?;
    }
    if args.dir.is_none() && args.warm {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(())
}
