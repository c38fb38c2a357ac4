//! The compile-once benchmark of the cache seed (MXNet's fused ops): build the same fused op 1000
//! times and 10 different ops 100 times each in one process, then again in a fresh process with a
//! warm disk cache; count the compiles, time the memory lookups, and time the first GIoU result
//! from a ready CUDA context.
//!
//! A "build" is what a framework does when it creates a fused op: parse the description, plan and
//! generate the CUDA source, and get the loaded function (`Gpu::load_kernel`, which goes through
//! the memory tier, then the disk tier, then NVRTC).
//!
//! Also reported, separately from the first result: the time `Gpu::open` took (context creation,
//! stream and attributes), the driver first-use probe (one 16 B allocation, a 4 KB upload and its
//! download before the first result: a fresh context's first device-memory use, about 9-10 ms of
//! driver work on an H100 whatever the sizes; `KFUSE_BENCH_DRIVER_PROBE=0` skips it, and the
//! first result then includes it), and a second run in the same process (the steady state).
//! `KFUSE_LOG_TIMING=1` prints a step-by-step breakdown to stderr.

use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use kfuse::runtime::{timing, Gpu, KernelCache};
use serde::{Deserialize, Serialize};

use kfuse::exec::CudaProgram;
use kfuse::{Engine, Program};

use crate::{boxes, demo::GIOU_KF, Error};

const SAME_BUILDS: usize = 1000;
const DISTINCT_OPS: usize = 10;
const DISTINCT_BUILDS: usize = 100;

/// One phase's figures.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PhaseReport {
    pub phase: String,
    pub device: String,
    pub builds: usize,
    pub compiles: u64,
    pub disk_hits: u64,
    pub total_ms: f64,
    /// One build after the first of its op: parse + plan + memory lookup.
    pub build_median_us: f64,
    /// The memory lookup alone (`Gpu::load_kernel` of a kernel already loaded).
    pub lookup_median_us: f64,
    pub lookup_p99_us: f64,
    /// From a ready CUDA context to the GIoU loss on the host (B=1024, N=256).
    pub first_result_ms: f64,
    /// Its parts: parse + plan, kernel load (cache or NVRTC), bind + launch + download.
    pub first_parse_plan_ms: f64,
    pub first_load_ms: f64,
    pub first_run_ms: f64,
    /// How long `Gpu::open` took in this process (context, stream, attributes).
    #[serde(default)]
    pub open_ms: f64,
    /// The driver first-use probe before the first result (0 when skipped).
    #[serde(default)]
    pub driver_probe_ms: f64,
    /// A second bind + launch + download of the same inputs in the same process.
    #[serde(default)]
    pub second_run_ms: f64,
}

/// `Gpu::open`'s duration in this process, set by [`open_with_cache_dir`].
static OPEN_MS: OnceLock<f64> = OnceLock::new();

/// One small allocation, upload and download: a fresh context's first device-memory use.
fn driver_probe(gpu: &Gpu) -> Result<f64, Error> {
    let started = Instant::now();
    let zeroed = gpu.alloc_zeroed(16)?;
    timing::log("driver probe: first allocation (16 B, zeroed)", started);
    let step = Instant::now();
    let uploaded = gpu.upload(&[1u8; 4096])?;
    timing::log("driver probe: first upload (4 KB, allocation + pageable copy)", step);
    let step = Instant::now();
    let back = gpu.download(&uploaded)?;
    gpu.synchronize()?;
    timing::log("driver probe: first download (4 KB)", step);
    if back.len() != 4096 || back.iter().any(|&b| b != 1) || gpu.download(&zeroed)?.iter().any(|&b| b != 0) {
        return Err(Error::DriverProbe);
    }
    Ok(ms(started.elapsed()))
}

/// The GIoU program with its epsilon changed: `variant` 0 is the shipped one; others are distinct
/// fused ops with distinct kernels.
fn giou_variant(variant: usize) -> String {
    if variant == 0 {
        GIOU_KF.to_string()
    } else {
        GIOU_KF.replace("let eps = 1e-7", &format!("let eps = {}e-7", variant + 1))
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Runs one phase on `gpu` (whose cache decides cold or warm).
pub fn run_phase(gpu: &Arc<Gpu>, phase: &str) -> Result<PhaseReport, Error> {
    let data = boxes::generate(1024, 256, 0)?;
    let inputs = [("pred", &data.pred), ("target", &data.target)];
    let probe = match std::env::var_os("KFUSE_BENCH_DRIVER_PROBE") {
        Some(v) if !v.is_empty() => {
            kfuse::runtime::env::flag("KFUSE_BENCH_DRIVER_PROBE").map_err(kfuse::runtime::RuntimeError::from)?
        }
        _ => true,
    };
    let driver_probe_ms = if probe { driver_probe(gpu)? } else { 0.0 };

    let t0 = Instant::now();
    let engine = Engine::with_cache(gpu.cache().clone());
    let program = Program::compile(&engine, &giou_variant(0), "examples/giou.kf")?;
    let t1 = Instant::now();
    let prog = CudaProgram::prepare(gpu, &program)?;
    let t2 = Instant::now();
    let out = prog.run(&inputs)?;
    let t3 = Instant::now();
    if out.first().and_then(|(_, t)| t.scalar_f64()).is_none() {
        return Err(Error::NoScalar { name: "loss".into() });
    }
    let s0 = Instant::now();
    let again = prog.run(&inputs)?;
    let second_run_ms = ms(s0.elapsed());
    if again.first().and_then(|(_, t)| t.scalar_f64()) != out.first().and_then(|(_, t)| t.scalar_f64()) {
        return Err(Error::RepeatDiffers { what: "the GIoU program" });
    }

    let started = Instant::now();
    let mut builds = Vec::new();
    let mut lookups = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let order =
        (0..SAME_BUILDS).map(|_| 0).chain((0..DISTINCT_OPS).flat_map(|v| std::iter::repeat_n(v, DISTINCT_BUILDS)));
    for v in order {
        let b0 = Instant::now();
        let p = Program::compile(&engine, &giou_variant(v), "giou variant")?;
        let plan = p.plan();
        let l0 = Instant::now();
        for (source, entry) in plan.kernels.iter().flat_map(|k| k.entries()) {
            gpu.load_kernel(source, entry)?;
        }
        let l = l0.elapsed();
        if !seen.insert(v) || v == 0 {
            builds.push(b0.elapsed());
            lookups.push(l);
        }
    }
    let total = started.elapsed();
    builds.sort();
    lookups.sort();
    let pct = |v: &[Duration], q: f64| v[((v.len() - 1) as f64 * q).round() as usize].as_secs_f64() * 1e6;
    // The optimised builds a cold first call left compiling: counted, and on disk for the warm phase.
    gpu.cache().wait_for_background();
    let stats = gpu.cache().stats();
    Ok(PhaseReport {
        phase: phase.to_string(),
        device: format!("{} ({})", gpu.name(), gpu.arch()),
        builds: SAME_BUILDS + DISTINCT_OPS * DISTINCT_BUILDS,
        compiles: stats.session.compiles,
        disk_hits: stats.session.disk_hits,
        total_ms: ms(total),
        build_median_us: pct(&builds, 0.5),
        lookup_median_us: pct(&lookups, 0.5),
        lookup_p99_us: pct(&lookups, 0.99),
        first_result_ms: ms(t3 - t0),
        first_parse_plan_ms: ms(t1 - t0),
        first_load_ms: ms(t2 - t1),
        first_run_ms: ms(t3 - t2),
        open_ms: OPEN_MS.get().copied().unwrap_or(0.0),
        driver_probe_ms,
        second_run_ms,
    })
}

/// Opens the default GPU with a cache in `dir` (created empty for the cold phase by the caller).
pub fn open_with_cache_dir(dir: &Path) -> Result<Arc<Gpu>, Error> {
    let cache = Arc::new(KernelCache::with_dir(dir, kfuse::runtime::cache::DEFAULT_MAX_BYTES));
    let ordinal = std::env::var("KFUSE_DEVICE").ok().and_then(|v| v.trim().parse().ok()).unwrap_or(0);
    let started = Instant::now();
    let gpu = Gpu::open_with_cache(ordinal, cache)?;
    let _ = OPEN_MS.set(ms(started.elapsed()));
    Ok(Arc::new(gpu))
}

/// The table `kfuse cache bench` prints.
pub fn render(phases: &[PhaseReport]) -> String {
    let mut s = String::new();
    if let Some(p) = phases.first() {
        s += &format!("kfuse cache bench on {}: {} builds per phase (1 op x {SAME_BUILDS}, {DISTINCT_OPS} ops x {DISTINCT_BUILDS}; the first op is one of the ten)\n", p.device, p.builds);
    }
    s += "| phase | compiles | disk hits | total ms | build p50 µs | lookup p50 µs | lookup p99 µs | first GIoU result ms (parse+plan / load / run) | Gpu::open ms | driver probe ms | 2nd run ms |\n";
    s += "|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|\n";
    for p in phases {
        s += &format!(
            "| {} | {} | {} | {:.1} | {:.1} | {:.2} | {:.2} | {:.2} ({:.2} / {:.2} / {:.2}) | {:.1} | {} | {:.2} |\n",
            p.phase,
            p.compiles,
            p.disk_hits,
            p.total_ms,
            p.build_median_us,
            p.lookup_median_us,
            p.lookup_p99_us,
            p.first_result_ms,
            p.first_parse_plan_ms,
            p.first_load_ms,
            p.first_run_ms,
            p.open_ms,
            if p.driver_probe_ms > 0.0 { format!("{:.2}", p.driver_probe_ms) } else { "skipped".to_string() },
            p.second_run_ms
        );
    }
    s
}
