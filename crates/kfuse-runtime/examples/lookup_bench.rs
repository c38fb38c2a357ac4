//! Micro-benchmark of the in-memory kernel lookup ("a kernel found in memory in under
//! 5 µs"), no GPU needed. Times, per repeated lookup of one kernel among `--kernels` loaded ones:
//!
//! - `blake3 key path`: what `Gpu::load_kernel` did on a hit before the first-level map (build the
//!   NVRTC option list, blake3 over options + source, lock a mutex, two map lookups, clone);
//! - `SourceMap::get`: today's `Gpu::load_kernel` hit path (fast hash, read lock, one probe, one
//!   source comparison, clone of a three-`Arc` value like `GpuFunction`);
//! - `KernelCache::get_or_compile` memory hit (needs NVRTC to fill the cache; skipped without).
//!
//! Usage: `cargo run --release -p kfuse-runtime --example lookup_bench -- [--source FILE]
//! [--kernels N] [--reps N]`. Without `--source` it uses a synthetic 8 KB kernel.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use kfuse_runtime::lookup::{LookupKey, SourceMap};
use kfuse_runtime::{cache_key, nvrtc_available, Arch, CacheKey, CompileOptions, KernelCache};

/// Stands in for `GpuFunction`'s clone cost: three reference-counted handles.
type Value = (Arc<str>, Arc<u32>, Arc<u64>);

fn synthetic_source(variant: usize) -> String {
    let mut s = format!("extern \"C\" __global__ void k(float* out, const float* x, long long n) {{\n  const float eps = {variant}e-7f;\n");
    while s.len() < 8000 {
        s += "  { long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; if (i < n) out[i] += x[i] * eps; }\n";
    }
    s + "}\n"
}

fn percentiles(mut ns: Vec<f64>) -> (f64, f64, f64) {
    ns.sort_by(f64::total_cmp);
    let at = |q: f64| ns[((ns.len() - 1) as f64 * q).round() as usize] / 1e3;
    (at(0.5), at(0.99), ns.iter().sum::<f64>() / ns.len() as f64 / 1e3)
}

/// Times `reps` calls one by one (each timed alone, like the cache bench's lookups).
fn time_each(reps: usize, mut f: impl FnMut()) -> (f64, f64, f64) {
    for _ in 0..reps.min(1000) {
        f();
    }
    let ns = (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_nanos() as f64
        })
        .collect();
    percentiles(ns)
}

fn main() -> Result<(), String> {
    let mut file: Option<PathBuf> = None;
    let mut kernels = 11usize;
    let mut reps = 100_000usize;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--source" => file = Some(PathBuf::from(value()?)),
            "--kernels" => kernels = value()?.parse().map_err(|e| format!("--kernels: {e}"))?,
            "--reps" => reps = value()?.parse().map_err(|e| format!("--reps: {e}"))?,
            other => return Err(format!("unknown argument {other}")),
        }
    }
    let base = match &file {
        Some(path) => std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?,
        None => synthetic_source(0),
    };
    // Distinct kernels of the same length: the base one plus variants with one byte changed.
    let sources: Vec<String> =
        (0..kernels.max(1)).map(|v| if v == 0 { base.clone() } else { format!("// v{v:04}\n{base}") }).collect();
    let probe = sources[0].clone(); // a separate allocation, as a freshly generated source is
    let name = "k";
    let arch = Arch::new(9, 0);
    let opts = CompileOptions::for_arch(arch);
    println!("lookup bench: {} B source, {} kernels loaded, {reps} timed lookups each", probe.len(), sources.len());

    // Old path: blake3 key over options + source, mutex, two maps.
    let old: Mutex<HashMap<CacheKey, HashMap<String, Value>>> = Mutex::new(HashMap::new());
    for (i, s) in sources.iter().enumerate() {
        let key = cache_key(s, &opts);
        let value: Value = (Arc::from(name), Arc::new(i as u32), Arc::new(0));
        old.lock().map_err(|e| e.to_string())?.entry(key).or_default().insert(name.to_string(), value);
    }
    let (p50, p99, mean) = time_each(reps, || {
        let key = Some(cache_key(&probe, &CompileOptions::for_arch(arch)));
        let guard = old.lock().unwrap_or_else(|e| e.into_inner());
        let hit = key.and_then(|k| guard.get(&k)).and_then(|m| m.get(name)).cloned();
        assert!(hit.is_some_and(|v| *v.1 == 0));
    });
    println!("blake3 key path (before)      p50 {p50:.3} µs  p99 {p99:.3} µs  mean {mean:.3} µs");

    let map: SourceMap<Value> = SourceMap::new();
    let none: Vec<String> = Vec::new();
    for (i, s) in sources.iter().enumerate() {
        map.insert(
            &LookupKey { source: s, name, arch, extra: &none },
            (Arc::from(name), Arc::new(i as u32), Arc::new(0)),
        );
    }
    let (p50, p99, mean) = time_each(reps, || {
        let hit = map.get(&LookupKey { source: &probe, name, arch, extra: &none });
        assert!(hit.is_some_and(|v| *v.1 == 0));
    });
    println!("SourceMap::get (after)        p50 {p50:.3} µs  p99 {p99:.3} µs  mean {mean:.3} µs");

    if nvrtc_available() {
        let cache = KernelCache::memory_only();
        for s in sources.iter().take(2) {
            cache.get_or_compile(s, &opts).map_err(|e| e.to_string())?;
        }
        let (p50, p99, mean) = time_each(reps, || {
            let hit = cache.get_or_compile(&probe, &opts);
            assert!(hit.is_ok());
        });
        println!("KernelCache memory hit (after) p50 {p50:.3} µs  p99 {p99:.3} µs  mean {mean:.3} µs");
    }
    Ok(())
}
