//! Tiered compilation's pieces (issue 5, first call under 0.3 s): the choice ([`Tiering`]), the
//! two kernels' names ([`KernelTier`]), the fast form's generation ([`emit_fast_form`]: less code
//! and cheaper NVRTC options than the optimised kernel, the same parameters), and
//! [`BackgroundCompile`], one background thread that compiles the fully optimised kernel with
//! NVRTC into kfuse-runtime's kernel cache (memory and disk) while launches run the quickly
//! compiled one.
//!
//! The thread does CPU work only (NVRTC, cache files): it needs no GPU context. Loading the
//! module happens later on the launching thread, through the cache, which then hits (see
//! `gpu.rs`). A failed compile, or a panic on the thread, is kept as a [`BackgroundFailure`] and
//! reported by [`BackgroundCompile::wait`]; it never panics the caller. Does not handle:
//! cancelling a compile (a dropped handle lets the thread finish; the kernel still lands in the
//! cache), more than one kernel per thread.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

use kfuse_runtime::{CompileOptions, KernelCache, RuntimeError};

use crate::generic::emit_generic;
use crate::kernel::{emit_kernel, CompileEffort, MlpKernel, MlpKernelOptions, RepeatedLayers};
use crate::model::MlpModel;

/// The first NVRTC version that knows `-minimal` (CUDA 12.4).
const NVRTC_MINIMAL_SINCE: (i32, i32) = (12, 4);

/// The stand-in kernel that serves a cold first call while `full` (emitted from `model` and
/// `opts`) compiles in the background, or `None` when no form shares `full`'s parameter blob and
/// I/O dtypes (then there is no tiering). Tried in order, the first that shares them wins:
/// 0. the generic kernel ([`crate::emit_generic`], generic.rs): code independent of the widths
///    and the depth (run-time loops over a layer table), `--Ofast-compile=mid`; refused when
///    its two 16-row activation buffers per warp do not fit next to the weights, or when the
///    blob's layout is not the one it knows;
/// 1. `--Ofast-compile=mid`, identical hidden layers as one run-time loop
///    ([`RepeatedLayers::Loop`]) and one 16-row tile per warp: the least code for NVRTC; its
///    launch geometry (warps, block, shared memory, rows per block) is its own;
/// 2. `full`'s source with `--Ofast-compile=mid` (the same geometry).
///
/// With NVRTC 12.4 or later (`nvrtc_version`), `-minimal` is added to the options: it leaves out
/// the runtime-API declarations a header-free kernel never uses (the cubin is byte-identical on
/// the issue-5 models with NVRTC 13.0).
///
/// Compile times, dev machine (2 shared cores, no GPU, NVRTC 13.0, sm_90, `CUDA_CACHE_DISABLE=1`,
/// 2026-11-22; `KF_RUNS=7 cargo run --release -p kfuse-mlp --example mlp_fast_compile`, the forms
/// alternating; min/median/max wall ms of two such runs; other builds shared the cores, runs vary
/// by ±25%), issue-5 models 64→4×64→16 ReLU / 64→4×128→16 ReLU / 32→64→128→96→64→32→16
/// SiLU+bias: form 0 (generic) 70/74/94 and 64/77/78, 64/67/73 and 59/76/82, 55/57/73 and
/// 71/75/86; form 1 (the fast form until then) 79/119/168 and 85/114/125, 107/120/161 and
/// 132/142/158, 160/187/206 and 190/214/257; a 1-line kernel with the same options 23-36 ms
/// (NVRTC's floor). The generic form is 1.5-3.3× quicker to compile (medians) and about the same
/// for every model (GELU 100→…→3 with f32 I/O and a bf16 SiLU model: 70-85 and 75-79 ms median,
/// against 109-155 and 169-175 for form 1): NVRTC's time grows with the code it optimises, and the
/// generic code holds one copy of each piece (483 sm_90 SASS instructions for the SiLU model
/// against 1019 for form 1). Earlier, for form 1: 84-113 / 96-116 / 169-214 ms; form 2:
/// 135-206 / 134-204 / 173-252 ms; the optimised kernel
/// 326-579 / 1027-1220 / 707-1181 ms; `-minimal` saves 15-35 ms, the layer loop 40-60 ms on the
/// ReLU models, one row tile per warp 30-70 ms on SiLU; `--Ofast-compile=max` saves nothing
/// measurable (and makes a 9× larger cubin), `-G` doubles the time, `--split-compile=0` changes
/// nothing. For the generic form, four n8 tiles per step (sharing each A fragment) cost 40-60%
/// more compile time; `--Ofast-compile=0` (full optimisation) 10-15 ms more, `=min` the same,
/// `=max` nothing less (3478 SASS instructions, 280 bytes of stack).
pub fn emit_fast_form(
    model: &MlpModel,
    opts: &MlpKernelOptions,
    full: &MlpKernel,
    nvrtc_version: (i32, i32),
) -> Option<MlpKernel> {
    let minimal = nvrtc_version >= NVRTC_MINIMAL_SINCE;
    if let Ok(mut generic) = emit_generic(model, opts, full) {
        if minimal {
            generic.nvrtc_options.push("-minimal".to_string());
        }
        return Some(generic);
    }
    let fast = MlpKernelOptions { compile_effort: CompileEffort::Fast, ..opts.clone() };
    let smallest =
        MlpKernelOptions { repeated_layers: RepeatedLayers::Loop, row_tiles_per_warp: Some(1), ..fast.clone() };
    let mut chosen = [smallest, fast].iter().filter_map(|o| emit_kernel(model, o).ok()).find(|k| {
        k.params == full.params
            && (k.in_dtype, k.out_dtype) == (full.in_dtype, full.out_dtype)
            && k.nvrtc_options != full.nvrtc_options
    })?;
    if minimal {
        chosen.nvrtc_options.push("-minimal".to_string());
    }
    Some(chosen)
}

/// Whether [`crate::prepare_tiered`] may start with a quickly compiled kernel.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub enum Tiering {
    /// When the fully optimised kernel is not in the kernel cache (memory or disk), compile the
    /// [`crate::CompileEffort::Fast`] form now, run with it, and compile the optimised one on a
    /// background thread; launches switch to it once it is ready. Applies only when the
    /// requested effort is [`crate::CompileEffort::Full`] and the cache is not bypassed.
    #[default]
    Background,
    /// Compile exactly the requested kernel before returning (the first call waits for it).
    FullOnly,
}

/// Which of a prepared model's kernels a launch uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum KernelTier {
    /// The stand-in ([`emit_fast_form`], compiled with `--Ofast-compile=mid`) because the
    /// requested kernel was not cached: quick to compile, slower to run.
    Fast,
    /// The kernel of the requested options (the fully optimised one by default), or the tiled
    /// path's kernels.
    Full,
}

impl KernelTier {
    /// `"fast"` or `"full"`.
    pub fn as_str(self) -> &'static str {
        match self {
            KernelTier::Fast => "fast",
            KernelTier::Full => "full",
        }
    }
}

/// Why a background compile produced no kernel.
#[derive(Clone, Debug)]
pub enum BackgroundFailure {
    /// NVRTC or the cache reported an error.
    Compile(Arc<RuntimeError>),
    /// The thread ended without a result (a panic in the compile).
    Panicked,
    /// No thread could be started.
    Spawn(String),
}

impl std::fmt::Display for BackgroundFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BackgroundFailure::Compile(e) => write!(f, "{e}"),
            BackgroundFailure::Panicked => f.write_str("the compile thread panicked"),
            BackgroundFailure::Spawn(why) => write!(f, "no compile thread could be started: {why}"),
        }
    }
}

/// When the background compile ended and how.
#[derive(Clone, Debug)]
pub struct BackgroundOutcome {
    /// When the thread finished (the kernel was in the cache, or the compile had failed).
    pub finished_at: Instant,
    /// Milliseconds the compile took on the thread (cache write included), or why it failed.
    pub result: Result<f64, BackgroundFailure>,
}

/// The state shared with the thread.
struct Shared {
    finished: AtomicBool,
    outcome: Mutex<Option<BackgroundOutcome>>,
    done: Condvar,
}

impl Shared {
    fn finish(&self, result: Result<f64, BackgroundFailure>) {
        let mut outcome = self.outcome.lock().unwrap_or_else(|e| e.into_inner());
        if outcome.is_none() {
            *outcome = Some(BackgroundOutcome { finished_at: Instant::now(), result });
        }
        self.finished.store(true, Ordering::Release);
        self.done.notify_all();
    }
}

/// Records a panic of the job as a failure, so that waiters never wait forever.
struct FinishOnUnwind(Arc<Shared>);

impl Drop for FinishOnUnwind {
    fn drop(&mut self) {
        if !self.0.finished.load(Ordering::Acquire) {
            self.0.finish(Err(BackgroundFailure::Panicked));
        }
    }
}

/// A job running on its own thread; see the module docs.
pub struct BackgroundCompile {
    shared: Arc<Shared>,
    started_at: Instant,
}

impl BackgroundCompile {
    /// Compiles `source` with `opts` into `cache` on a new thread (a no-op when it is already
    /// there: `get_or_compile` then hits).
    pub fn spawn_compile(cache: Arc<KernelCache>, source: String, opts: CompileOptions) -> BackgroundCompile {
        BackgroundCompile::spawn(move || cache.get_or_compile(&source, &opts).map(|_| ()))
    }

    /// Runs `job` on a new thread named `kfuse-mlp-full`; its duration or error becomes the
    /// outcome. When no thread can be started the outcome is [`BackgroundFailure::Spawn`].
    pub fn spawn<F>(job: F) -> BackgroundCompile
    where
        F: FnOnce() -> Result<(), RuntimeError> + Send + 'static,
    {
        let shared =
            Arc::new(Shared { finished: AtomicBool::new(false), outcome: Mutex::new(None), done: Condvar::new() });
        let started_at = Instant::now();
        let for_thread = shared.clone();
        let spawned = std::thread::Builder::new().name("kfuse-mlp-full".to_string()).spawn(move || {
            let guard = FinishOnUnwind(for_thread);
            let started = Instant::now();
            let result = job()
                .map(|()| started.elapsed().as_secs_f64() * 1e3)
                .map_err(|e| BackgroundFailure::Compile(Arc::new(e)));
            guard.0.finish(result);
        });
        if let Err(e) = spawned {
            shared.finish(Err(BackgroundFailure::Spawn(e.to_string())));
        }
        BackgroundCompile { shared, started_at }
    }

    /// Whether the job has ended (one atomic load: cheap enough for every launch).
    pub fn is_finished(&self) -> bool {
        self.shared.finished.load(Ordering::Acquire)
    }

    /// When the job was started.
    pub fn started_at(&self) -> Instant {
        self.started_at
    }

    /// The outcome if the job has ended, without waiting.
    pub fn outcome(&self) -> Option<BackgroundOutcome> {
        if !self.is_finished() {
            return None;
        }
        self.shared.outcome.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Blocks until the job has ended; returns its outcome.
    pub fn wait(&self) -> BackgroundOutcome {
        let mut outcome = self.shared.outcome.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(done) = outcome.as_ref() {
                return done.clone();
            }
            outcome = self.shared.done.wait(outcome).unwrap_or_else(|e| e.into_inner());
        }
    }
}

impl std::fmt::Debug for BackgroundCompile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BackgroundCompile").field("finished", &self.is_finished()).finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_job_is_unfinished_until_it_ends_then_reports_its_time() {
        let (go, gate) = mpsc::channel::<()>();
        let job = BackgroundCompile::spawn(move || {
            gate.recv().map_err(|_| RuntimeError::NoCacheDir)?;
            std::thread::sleep(Duration::from_millis(20));
            Ok(())
        });
        assert!(!job.is_finished());
        assert!(job.outcome().is_none());
        go.send(()).expect("send");
        let done = job.wait();
        assert!(job.is_finished());
        let ms = done.result.expect("the job succeeded");
        assert!(ms >= 19.0, "{ms} ms for a 20 ms job");
        assert!(done.finished_at >= job.started_at());
        assert!(job.outcome().is_some_and(|o| o.result.is_ok()));
    }

    #[test]
    fn an_error_is_kept_not_lost() {
        let job = BackgroundCompile::spawn(|| Err(RuntimeError::NoCacheDir));
        match job.wait().result {
            Err(BackgroundFailure::Compile(e)) => assert!(matches!(*e, RuntimeError::NoCacheDir), "{e}"),
            other => panic!("expected the compile error, got {other:?}"),
        }
        // A second wait gives the same answer.
        assert!(matches!(job.wait().result, Err(BackgroundFailure::Compile(_))));
    }

    #[test]
    fn a_panicking_job_is_a_failure_not_a_hang() {
        let job = BackgroundCompile::spawn(|| panic!("a deliberate panic inside the job"));
        assert!(matches!(job.wait().result, Err(BackgroundFailure::Panicked)));
        assert!(job.is_finished());
    }

    #[test]
    fn the_cache_can_be_shared_with_a_thread() {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<KernelCache>();
        send_sync::<BackgroundCompile>();
    }
}
