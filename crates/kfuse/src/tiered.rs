//! Tiered builds of a plan's kernels: a first call that must compile launches quickly compiled
//! builds while the optimised ones compile in the background.
//!
//! When loading a plan finds a kernel's optimised build neither in the memory nor in the disk
//! cache, it compiles the kernel's quick build ([`CompileOptions::quick`]: NVRTC's
//! `--Ofast-compile=max`, about half the compile time, a slower kernel) and launches that; only
//! once the quick builds are loaded does it start the optimised builds' compiles on background
//! threads ([`KernelCache::compile_in_background`](kfuse_runtime::KernelCache::compile_in_background)),
//! so that they never compete with the first call for the CPU; each thread also loads its module
//! on the device. The first launch after a kernel's compile ended switches to its optimised
//! build, for good.
//!
//! - **Same bits.** Kernels compile without FMA contraction (`--fmad=false`, see
//!   [`CompileOptions::for_kernels`]), so both builds round every operation alike and give the
//!   same bits: a result does not depend on which build ran it.
//! - **CUDA graphs.** A launch on a stream that is being captured waits for the optimised
//!   builds first: a graph never records a quick build.
//! - **Cooperative kernels.** Each build has its own residency; a launch whose grid was sized for
//!   the quick build and exceeds the optimised one's takes the quick build once more.
//! - A failed background compile is warned about once (stderr); the quick build keeps serving.
//! - `KFUSE_NO_TIERING=1` turns tiering off: loading compiles the optimised builds, as does a
//!   bypassed cache (`KFUSE_NO_CACHE=1`) or a fast-compile level asked for by
//!   `KFUSE_FAST_COMPILE` (then every build is a quick one).
//!
//! [`KernelCache::wait_for_background`](kfuse_runtime::KernelCache::wait_for_background) waits
//! for every background compile (benchmarks call it before they time anything).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use kfuse_runtime::{env, timing, BackgroundCompile, CompileOptions, Gpu, GpuFunction, Stream};

use crate::{Error, Result};

/// Whether loads may start with quick builds: `KFUSE_NO_TIERING` is not set.
pub(crate) fn tiering_enabled() -> Result<bool> {
    Ok(!env::flag("KFUSE_NO_TIERING").map_err(kfuse_runtime::RuntimeError::from)?)
}

/// One entry point of a plan, loaded: the build launches use now and, while the optimised build
/// compiles in the background, how to switch to it.
pub(crate) struct Build {
    /// The build loaded first: the optimised one, or the quick one of a tiered load.
    first: Loaded,
    /// The optimised build's compile, when `first` is the quick build.
    pending: Option<Pending>,
}

/// A loaded function and, for a cooperative launch, the most blocks the device holds at once.
struct Loaded {
    function: GpuFunction,
    resident: Option<u32>,
}

struct Pending {
    /// The compile (shared by the entry points of one source).
    job: Arc<BackgroundCompile>,
    source: String,
    name: String,
    /// Threads per block of a cooperative launch (for the optimised build's residency).
    cooperative_block: Option<u32>,
    /// The optimised build once loaded; `None` when its compile or load failed.
    optimised: OnceLock<Option<Loaded>>,
    /// Print the switch (`KFUSE_LOG_COMPILES=1`).
    log: bool,
}

/// Which builds a load launches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Builds {
    /// The optimised builds, with quick ones first where they must compile (the module docs).
    Tiered,
    /// The quick builds only (for comparisons: they give the optimised builds' bits).
    Quick,
    /// The optimised builds, compiled before the load returns (a one-shot run, which would
    /// otherwise wait for them at exit after its quick builds).
    Optimised,
}

/// The entry points to load, each as (source, name, threads per block of a cooperative launch).
pub(crate) type Entry<'a> = (&'a str, &'a str, Option<u32>);

/// Loads `entries` on `gpu` and prepares `companions` (source, name: kernels that later calls
/// load, compiled now and kept loaded): compiles those the cache holds neither in memory nor on
/// disk, one thread each (NVRTC is thread-safe; the cache compiles each key once), as quick
/// builds where tiering applies (the module docs), then starts the optimised builds' compiles.
/// The companions always get their optimised builds.
///
/// [`Builds::Quick`] loads every entry's quick build (cached or not) and compiles nothing in the
/// background.
pub(crate) fn load(
    gpu: &Arc<Gpu>,
    entries: &[Entry<'_>],
    companions: &[(&str, &str)],
    builds: Builds,
) -> Result<Vec<Build>> {
    let cache = gpu.cache();
    let full = gpu.kernel_options();
    let quick = match builds {
        Builds::Quick => Some(full.quick().unwrap_or_else(|| full.clone())),
        Builds::Tiered if !cache.is_bypassed() && tiering_enabled()? => full.quick(),
        _ => None,
    };
    // The sources to compile now, once each, with their options; those of entries that launch
    // their quick builds (every one for `Builds::Quick`, those the cache lacks when tiering).
    let mut missing: Vec<(&str, &CompileOptions)> = Vec::new();
    let mut tiered: Vec<&str> = Vec::new();
    let sources = entries.iter().map(|e| (e.0, true)).chain(companions.iter().map(|c| (c.0, false)));
    for (source, is_entry) in sources {
        if missing.iter().any(|(s, _)| *s == source) {
            continue;
        }
        let cached = builds != Builds::Quick && (cache.is_bypassed() || cache.get_cached(source, &full)?.is_some());
        if cached {
            continue;
        }
        match quick.as_ref().filter(|_| is_entry) {
            Some(quick) => {
                tiered.push(source);
                missing.push((source, quick));
            }
            None => missing.push((source, &full)),
        }
    }
    compile_in_parallel(gpu, &missing)?;
    let mut loaded = Vec::with_capacity(entries.len());
    for &(source, name, cooperative_block) in entries {
        let function = match (tiered.contains(&source), &quick) {
            (true, Some(quick)) => gpu.load_kernel_with_options(source, name, &quick.extra)?,
            _ => gpu.load_kernel(source, name)?,
        };
        let resident = residency(gpu, &function, cooperative_block)?;
        loaded.push(Build { first: Loaded { function, resident }, pending: None });
    }
    for (source, name) in companions {
        gpu.load_kernel(source, name)?;
    }
    if builds != Builds::Tiered {
        return Ok(loaded);
    }
    // The optimised builds compile from now on, one thread per source, and load on the device
    // there too: a switch then loads nothing (it may happen while a CUDA graph is captured).
    let log = cache.config().log_compiles;
    let mut jobs: HashMap<&str, Arc<BackgroundCompile>> = HashMap::new();
    for (build, &(source, name, cooperative_block)) in loaded.iter_mut().zip(entries) {
        if !tiered.contains(&source) {
            continue;
        }
        let job = jobs
            .entry(source)
            .or_insert_with(|| {
                let names: Vec<String> = entries.iter().filter(|e| e.0 == source).map(|e| e.1.to_string()).collect();
                let (gpu, cache, source, full) = (Arc::clone(gpu), Arc::clone(cache), source.to_string(), full.clone());
                Arc::new(cache.clone().in_background(move || {
                    cache.get_or_compile(&source, &full)?;
                    for name in &names {
                        gpu.load_kernel(&source, name)?;
                    }
                    Ok(())
                }))
            })
            .clone();
        if log {
            eprintln!("kfuse: {name}: launching its quick build while the optimised one compiles in the background");
        }
        build.pending = Some(Pending {
            job,
            source: source.to_string(),
            name: name.to_string(),
            cooperative_block,
            optimised: OnceLock::new(),
            log,
        });
    }
    Ok(loaded)
}

/// Compiles each (source, options) of `missing` through `gpu`'s cache, one thread each when
/// there are several (a single one is compiled by its load).
fn compile_in_parallel(gpu: &Gpu, missing: &[(&str, &CompileOptions)]) -> Result<()> {
    if missing.len() < 2 {
        return Ok(());
    }
    let cache = gpu.cache();
    let step = Instant::now();
    let compiled: Vec<Result<()>> = std::thread::scope(|scope| {
        let threads: Vec<_> = missing
            .iter()
            .map(|&(source, opts)| {
                scope.spawn(move || cache.get_or_compile(source, opts).map(|_| ()).map_err(Error::from))
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))).collect()
    });
    if timing::enabled() {
        timing::log(&format!("load: {} kernels compiled in parallel", missing.len()), step);
    }
    compiled.into_iter().collect()
}

/// For a cooperative launch of `block` threads: the most blocks of `f` the device holds at once
/// (an error when not even one fits).
fn residency(gpu: &Gpu, f: &GpuFunction, cooperative_block: Option<u32>) -> Result<Option<u32>> {
    let Some(block) = cooperative_block else { return Ok(None) };
    match gpu.max_resident_blocks(f, block, 0)? {
        0 => Err(Error::NotResident { kernel: f.name().to_string(), block, ordinal: gpu.ordinal() }),
        n => Ok(Some(n)),
    }
}

/// Waits for `job` and takes the optimised build it compiled and loaded (a lookup in the device's
/// loaded functions); `None`, warned about once, when the compile or the load failed.
fn load_optimised(gpu: &Gpu, pending: &Pending) -> Option<Loaded> {
    let outcome = pending.job.wait();
    let loaded = outcome.result.map_err(|failure| failure.to_string()).and_then(|ms| {
        let function = gpu.load_kernel(&pending.source, &pending.name).map_err(|e| e.to_string())?;
        let resident = residency(gpu, &function, pending.cooperative_block).map_err(|e| e.to_string())?;
        Ok((Loaded { function, resident }, ms))
    });
    match loaded {
        Ok((loaded, ms)) => {
            if pending.log {
                eprintln!(
                    "kfuse: {}: switched to the optimised build (compiled in the background in {ms:.0} ms)",
                    pending.name
                );
            }
            Some(loaded)
        }
        Err(why) => {
            static WARNED: AtomicBool = AtomicBool::new(false);
            if !WARNED.swap(true, Ordering::Relaxed) {
                eprintln!(
                    "kfuse: warning: {}: its optimised build is unavailable ({why}); its quick build keeps serving",
                    pending.name
                );
            }
            None
        }
    }
}

impl Build {
    /// The build launches use now, with its residency: the optimised one once loaded, else the
    /// first. Never waits and never switches (see [`Build::settle`]).
    fn current(&self) -> &Loaded {
        match self.pending.as_ref().and_then(|p| p.optimised.get()) {
            Some(Some(optimised)) => optimised,
            _ => &self.first,
        }
    }

    /// The function launches use now.
    pub(crate) fn function(&self) -> &GpuFunction {
        &self.current().function
    }

    /// The most blocks of the current build a cooperative launch may have.
    pub(crate) fn resident(&self) -> Option<u32> {
        self.current().resident
    }

    /// The function to launch with `grid` blocks: the current one, or the first build when `grid`
    /// was sized for it and the current build holds fewer blocks at once.
    pub(crate) fn for_grid(&self, grid: u32) -> &GpuFunction {
        let current = self.current();
        match current.resident {
            Some(r) if grid > r => &self.first.function,
            _ => &current.function,
        }
    }

    /// Whether launches use the optimised build (always, for a build loaded from the cache).
    pub(crate) fn is_optimised(&self) -> bool {
        self.pending.as_ref().is_none_or(|p| matches!(p.optimised.get(), Some(Some(_))))
    }

    /// Switches to the optimised build when its compile has ended, or, with `wait`, once it has.
    pub(crate) fn settle(&self, gpu: &Gpu, wait: bool) {
        if let Some(p) = &self.pending {
            if p.optimised.get().is_none() && (wait || p.job.is_finished()) {
                p.optimised.get_or_init(|| load_optimised(gpu, p));
            }
        }
    }

    /// Whether a switch is still to come.
    pub(crate) fn is_pending(&self) -> bool {
        self.pending.as_ref().is_some_and(|p| p.optimised.get().is_none())
    }
}

/// Switches `builds` to their optimised builds as far as their compiles have ended; when
/// `stream` is being captured into a CUDA graph, waits for them all first (a graph must not
/// record a quick build). Costs one atomic load per build once every switch is done.
pub(crate) fn settle<'a>(
    gpu: &Gpu,
    builds: impl Iterator<Item = &'a Build> + Clone,
    stream: Option<&Stream>,
) -> Result<()> {
    if !builds.clone().any(Build::is_pending) {
        return Ok(());
    }
    let wait = match stream {
        Some(s) => s.is_capturing()?,
        None => false,
    };
    for b in builds {
        b.settle(gpu, wait);
    }
    Ok(())
}
