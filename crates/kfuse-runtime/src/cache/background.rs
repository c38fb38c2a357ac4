//! Compiling into the cache on a background thread: [`KernelCache::compile_in_background`]
//! returns a [`BackgroundCompile`] handle at once; whoever launches polls it with one atomic load
//! ([`BackgroundCompile::is_finished`]) and, once it is done, loads the module through the cache
//! (then a memory hit). A tiered launcher runs a quickly compiled kernel meanwhile.
//!
//! The thread does CPU work only (NVRTC, cache files): it needs no GPU context. A failed compile,
//! or a panic on the thread, is kept as a [`BackgroundFailure`] and reported by
//! [`BackgroundCompile::wait`]; it never panics the caller. Does not handle: cancelling a compile
//! (a dropped handle lets the thread finish; the module still lands in the cache), more than one
//! module per thread.
//!
//! The cache counts the compiles it runs in the background, so that whoever needs the optimised
//! kernels (a benchmark, before it times anything) can wait for all of them:
//! [`KernelCache::wait_for_background`]. The process counts them too, and waits for them when it
//! exits (an `atexit` hook registered with the first one): a job cut off by the exit would run
//! NVRTC or the driver while their libraries are torn down, which crashes the process.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex, Once};
use std::time::{Duration, Instant};

use crate::nvrtc::CompileOptions;
use crate::RuntimeError;

use super::KernelCache;

impl KernelCache {
    /// Compiles `source` with `opts` into this cache (memory and disk) on a new thread and
    /// returns its handle at once; a no-op job when the module is already cached
    /// (`get_or_compile` then hits).
    pub fn compile_in_background(self: &Arc<Self>, source: String, opts: CompileOptions) -> BackgroundCompile {
        let cache = Arc::clone(self);
        self.in_background(move || cache.get_or_compile(&source, &opts).map(|_| ()))
    }

    /// Runs `job` (a compile through this cache and whatever goes with it, such as loading the
    /// module on a device) on a new thread, counted among this cache's background compiles until
    /// it ends ([`KernelCache::wait_for_background`]).
    pub fn in_background<F>(&self, job: F) -> BackgroundCompile
    where
        F: FnOnce() -> Result<(), RuntimeError> + Send + 'static,
    {
        let in_flight = InFlightGuard::enter(Arc::clone(&self.background));
        BackgroundCompile::spawn(move || {
            let _in_flight = in_flight; // left when the job ends, by any path
            job()
        })
    }

    /// How many compiles [`KernelCache::compile_in_background`] started that have not ended.
    pub fn background_compiles(&self) -> usize {
        *self.background.count.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Blocks until every compile this cache runs in the background has ended (at once when
    /// none runs). What they compiled is then in the cache; failures are reported by their
    /// handles.
    pub fn wait_for_background(&self) {
        self.background.wait(None);
    }
}

/// The count of background compiles that have not ended (of one cache, or of the process).
#[derive(Default)]
pub(crate) struct InFlight {
    count: Mutex<usize>,
    idle: Condvar,
    /// The process that counted them: a child forked meanwhile inherits the count but not the
    /// threads, and does not wait for them.
    owner: AtomicU32,
}

impl InFlight {
    const fn new() -> InFlight {
        InFlight { count: Mutex::new(0), idle: Condvar::new(), owner: AtomicU32::new(0) }
    }

    fn enter(&self) {
        let mut count = self.count.lock().unwrap_or_else(|e| e.into_inner());
        *count += 1;
        self.owner.store(std::process::id(), Ordering::Relaxed);
    }

    fn leave(&self) {
        let mut count = self.count.lock().unwrap_or_else(|e| e.into_inner());
        *count = count.saturating_sub(1);
        if *count == 0 {
            self.idle.notify_all();
        }
    }

    /// Waits until the count is 0 or `limit` has passed (at once in a forked child).
    fn wait(&self, limit: Option<Duration>) {
        if self.owner.load(Ordering::Relaxed) != std::process::id() {
            return;
        }
        let deadline = limit.map(|l| Instant::now() + l);
        let mut count = self.count.lock().unwrap_or_else(|e| e.into_inner());
        while *count > 0 {
            count = match deadline {
                None => self.idle.wait(count).unwrap_or_else(|e| e.into_inner()),
                Some(d) => {
                    let Some(left) = d.checked_duration_since(Instant::now()) else { return };
                    self.idle.wait_timeout(count, left).unwrap_or_else(|e| e.into_inner()).0
                }
            };
        }
    }
}

/// Every background compile of the process, of any cache: what the exit hook waits for.
static PROCESS: InFlight = InFlight::new();

/// The longest the exit hook waits (a compile takes well under a second; NVRTC never hangs, but an
/// exit must not depend on it).
const EXIT_WAIT: Duration = Duration::from_secs(60);

/// Waits for the process's background compiles; run by `exit` (see the module docs). Returns at
/// once on a compile thread itself (an exit from there must not wait for its own job), and never
/// unwinds into the C caller.
extern "C" fn wait_at_exit() {
    if std::thread::current().name() == Some(THREAD_NAME) {
        return;
    }
    let _ = std::panic::catch_unwind(|| PROCESS.wait(Some(EXIT_WAIT)));
}

fn register_exit_wait() {
    static REGISTERED: Once = Once::new();
    REGISTERED.call_once(|| {
        // SAFETY: `wait_at_exit` is a plain `extern "C" fn()` that never unwinds and touches only
        // `PROCESS`, a static that outlives every exit handler. A failed registration (the
        // handler table is full) leaves exits as they were.
        unsafe {
            libc::atexit(wait_at_exit);
        }
    });
}

/// One compile counted in its cache's [`InFlight`] and the process's from its start until the
/// guard drops.
struct InFlightGuard(Arc<InFlight>);

impl InFlightGuard {
    fn enter(in_flight: Arc<InFlight>) -> InFlightGuard {
        register_exit_wait();
        PROCESS.enter();
        in_flight.enter();
        InFlightGuard(in_flight)
    }
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        self.0.leave();
        PROCESS.leave();
    }
}

/// The name of the threads background compiles run on.
const THREAD_NAME: &str = "kfuse-compile";

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
    /// Runs `job` on a new thread named `kfuse-compile`; its duration or error becomes the
    /// outcome. When no thread can be started the outcome is [`BackgroundFailure::Spawn`].
    pub fn spawn<F>(job: F) -> BackgroundCompile
    where
        F: FnOnce() -> Result<(), RuntimeError> + Send + 'static,
    {
        let shared =
            Arc::new(Shared { finished: AtomicBool::new(false), outcome: Mutex::new(None), done: Condvar::new() });
        let started_at = Instant::now();
        let for_thread = shared.clone();
        let spawned = std::thread::Builder::new().name(THREAD_NAME.to_string()).spawn(move || {
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
    use crate::KernelCache;

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
    fn the_cache_waits_for_its_background_compiles() {
        let cache = Arc::new(KernelCache::memory_only());
        cache.wait_for_background(); // none: returns at once
        let (go, gate) = mpsc::channel::<()>();
        let job = cache.in_background(move || gate.recv().map_err(|_| RuntimeError::NoCacheDir));
        assert_eq!(cache.background_compiles(), 1);
        go.send(()).expect("send");
        cache.wait_for_background();
        assert_eq!(cache.background_compiles(), 0);
        assert!(job.wait().result.is_ok());
    }

    #[test]
    fn the_cache_can_be_shared_with_a_thread() {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<KernelCache>();
        send_sync::<BackgroundCompile>();
    }
}
