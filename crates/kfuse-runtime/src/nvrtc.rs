//! NVRTC: compile CUDA C++ source to a cubin for one real architecture, keeping the PTX as a
//! fallback for newer GPUs. A thin safe wrapper over cudarc's `nvrtc::{sys, result}` layers
//! (cudarc's safe layer only returns PTX).
//!
//! Handles: library absence (an error value, never cudarc's panic), NUL bytes in inputs, the
//! program log on success and failure, RAII destruction of the NVRTC program on every path.
//! Does not handle: headers (kfuse sources are header-free), caching (see `cache`).

use std::cell::Cell;
use std::ffi::{c_char, CString};
use std::sync::OnceLock;

use cudarc::nvrtc::{result, sys};

use crate::key::{CacheKey, KeyParts, CACHE_FORMAT_VERSION, KFUSE_VERSION};
use crate::{Arch, RuntimeError};

/// Options of one compilation: the target and any extra NVRTC flags.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CompileOptions {
    /// The real architecture to produce a cubin for.
    pub arch: Arch,
    /// Extra NVRTC options appended after kfuse's fixed ones, in this order.
    pub extra: Vec<String>,
}

impl CompileOptions {
    /// Options for `arch` with no extra flags.
    pub fn for_arch(arch: Arch) -> CompileOptions {
        CompileOptions { arch, extra: Vec::new() }
    }

    /// The options kfuse compiles the kernels of programs with for `arch` ([`crate::Gpu::load_kernel`]'s):
    /// `--fmad=false`, and NVRTC's `--Ofast-compile` level when `KFUSE_FAST_COMPILE` asks for
    /// one. Without contraction of a multiply and an add into one FMA, a kernel's arithmetic is
    /// IEEE operations that every optimisation level must round alike, so its quickly compiled
    /// build ([`CompileOptions::quick`]) gives the same bits as its optimised one.
    pub fn for_kernels(arch: Arch) -> CompileOptions {
        CompileOptions { arch, extra: kernel_extras().to_vec() }
    }

    /// These options with NVRTC's `--Ofast-compile=max`: a build that compiles in about half the
    /// time and runs slower, the stand-in of a tiered compile while the optimised build compiles
    /// in the background. `None` when the options already hold an `--Ofast-compile` level.
    pub fn quick(&self) -> Option<CompileOptions> {
        if self.extra.iter().any(|o| o.starts_with("--Ofast-compile")) {
            return None;
        }
        let mut extra = self.extra.clone();
        extra.push("--Ofast-compile=max".to_string());
        Some(CompileOptions { arch: self.arch, extra })
    }

    /// The option list of the target asked for: `--gpu-architecture=sm_XY` (`sm_XYa` for an `a`
    /// target), `--std=c++17 -default-device` and then `extra`. Deterministic; part of the cache
    /// key. NVRTC gets the same list, with an older arch when it does not know `arch` (see
    /// [`compile`]).
    pub fn nvrtc_options(&self) -> Vec<String> {
        self.options_for(self.arch)
    }

    /// The options NVRTC `nvrtc` compiles with for `arch`: [`CompileOptions::nvrtc_options`]'s,
    /// then `--minimal` where NVRTC takes it (12.4 on). Generated sources use none of the CUDA
    /// runtime's device API, textures or device-side launches, which `--minimal` leaves out of
    /// NVRTC's implicit headers: the front end's share of a compile drops by a third, and the
    /// cubin is the same bytes (every unit of the examples with NVRTC 13.0), so the cache key
    /// leaves it out.
    fn compile_options(&self, arch: Arch, nvrtc: (i32, i32)) -> Vec<String> {
        let mut options = self.options_for(arch);
        if nvrtc >= MINIMAL_SINCE {
            options.push("--minimal".to_string());
        }
        options
    }

    fn options_for(&self, arch: Arch) -> Vec<String> {
        let mut options = Vec::with_capacity(3 + self.extra.len());
        options.push(format!("--gpu-architecture={arch}"));
        options.push("--std=c++17".to_string());
        options.push("-default-device".to_string());
        options.extend(self.extra.iter().cloned());
        options
    }
}

/// The extra options of [`CompileOptions::for_kernels`] (read once per process; an invalid
/// `KFUSE_FAST_COMPILE` is an error of [`crate::CacheConfig::from_env`], so of `Engine::new` and
/// the command-line tool; here it is warned about once and off).
pub(crate) fn kernel_extras() -> &'static [String] {
    static OPTIONS: OnceLock<Vec<String>> = OnceLock::new();
    OPTIONS.get_or_init(|| {
        let mut options = vec!["--fmad=false".to_string()];
        match crate::env::fast_compile() {
            Ok(level) => options.extend(level.map(|l| format!("--Ofast-compile={l}"))),
            Err(e) => eprintln!("kfuse: warning: {e}; kernels compile at NVRTC's default optimisation"),
        }
        options
    })
}

/// The result of one NVRTC compilation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompiledModule {
    /// The cache key of (source, options, arch, kfuse version, format).
    pub key: CacheKey,
    /// The architecture asked for (the key's).
    pub arch: Arch,
    /// The architecture the cubin is for: `arch`, or the newest one below it that NVRTC knows
    /// when it does not know `arch` (that cubin loads on no newer major; its PTX does).
    pub built_for: Arch,
    /// The (major, minor) version of the NVRTC that built it.
    pub nvrtc_version: (i32, i32),
    /// The cubin (an ELF image), loaded first.
    pub cubin: Vec<u8>,
    /// The PTX, the fallback when the cubin does not load.
    pub ptx: String,
    /// NVRTC's log (warnings; usually empty).
    pub log: String,
}

thread_local! {
    /// Calls into NVRTC made on this thread (see [`nvrtc_calls_on_this_thread`]).
    static CALLS: Cell<u64> = const { Cell::new(0) };
}

/// How many times this thread has asked for NVRTC (its presence, version, archs or a compile):
/// a lookup served by the cache asks for none, and tests check that with this count.
pub fn nvrtc_calls_on_this_thread() -> u64 {
    CALLS.with(Cell::get)
}

fn count_call() {
    CALLS.with(|calls| calls.set(calls.get() + 1));
}

/// Whether libnvrtc can be loaded; checked once per process because cudarc panics on a
/// missing library.
pub fn nvrtc_available() -> bool {
    count_call();
    static PRESENT: OnceLock<bool> = OnceLock::new();
    *PRESENT.get_or_init(|| {
        preload_named_library();
        // SAFETY: is_culib_present only tries to dlopen candidate library names and drops them;
        // it has no preconditions (cudarc marks every dynamic-loading entry point unsafe).
        unsafe { sys::is_culib_present() }
    })
}

/// Elsewhere the variable is not read: cudarc finds NVRTC by name.
#[cfg(not(unix))]
fn preload_named_library() {}

/// The variable that names the NVRTC library file to use (`.../libnvrtc.so.13`). The Python
/// package sets it to the `nvidia-cuda-nvrtc` wheel's copy when it is imported, without loading
/// the library: NVRTC is loaded on its first use, which a warm kernel cache never needs.
pub const NVRTC_LIBRARY_ENV: &str = "KFUSE_NVRTC_LIBRARY";

/// Loads the file named by [`NVRTC_LIBRARY_ENV`], if any, process-wide (`RTLD_GLOBAL`) and for
/// the rest of the process, so that cudarc's search by name finds it already loaded; first the
/// `libnvrtc-builtins` of the same folder, which NVRTC opens by name when it compiles. A file that
/// does not load is a warning, and the search by name goes on as without the variable.
#[cfg(unix)]
fn preload_named_library() {
    let Some(path) = std::env::var_os(NVRTC_LIBRARY_ENV).filter(|p| !p.is_empty()) else { return };
    let path = std::path::PathBuf::from(path);
    let open = |file: &std::path::Path| {
        let flags = libloading::os::unix::RTLD_NOW | libloading::os::unix::RTLD_GLOBAL;
        // SAFETY: loading NVRTC (or its builtins) runs only their initialisers, which have no
        // preconditions; the handle is leaked on purpose, so the library is never unloaded while
        // cudarc's function pointers into it live.
        unsafe { libloading::os::unix::Library::open(Some(file), flags) }.map(std::mem::forget)
    };
    if let Some(folder) = path.parent() {
        let mut builtins: Vec<std::path::PathBuf> = std::fs::read_dir(folder)
            .map(|entries| entries.filter_map(|e| e.ok().map(|e| e.path())).collect())
            .unwrap_or_default();
        builtins
            .retain(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("libnvrtc-builtins.so")));
        builtins.sort();
        if let Some(b) = builtins.first() {
            let _ = open(b);
        }
    }
    if let Err(e) = open(&path) {
        eprintln!(
            "kfuse: warning: {NVRTC_LIBRARY_ENV}={} does not load ({e}); looking for libnvrtc by name instead",
            path.display()
        );
    }
}

/// NVRTC's (major, minor) version, or [`RuntimeError::NvrtcMissing`] when libnvrtc is absent.
pub fn nvrtc_version() -> Result<(i32, i32), RuntimeError> {
    count_call();
    static VERSION: OnceLock<(i32, i32)> = OnceLock::new();
    if let Some(version) = VERSION.get() {
        return Ok(*version);
    }
    if !nvrtc_available() {
        return Err(RuntimeError::NvrtcMissing);
    }
    let mut major: i32 = 0;
    let mut minor: i32 = 0;
    // SAFETY: libnvrtc is loadable (checked just above, so cudarc's loader will not panic), and
    // nvrtcVersion writes two ints through the two valid, exclusive pointers it is given.
    unsafe { sys::nvrtcVersion(&mut major, &mut minor) }
        .result()
        .map_err(|code| RuntimeError::Nvrtc { call: "nvrtcVersion", code })?;
    Ok(*VERSION.get_or_init(|| (major, minor)))
}

/// The real architectures this NVRTC can target, ascending (asked once per process).
pub fn supported_archs() -> Result<Vec<Arch>, RuntimeError> {
    static ARCHS: OnceLock<Vec<Arch>> = OnceLock::new();
    nvrtc_version()?;
    if let Some(archs) = ARCHS.get() {
        return Ok(archs.clone());
    }
    let mut count: i32 = 0;
    // SAFETY: libnvrtc is loaded (nvrtc_version succeeded); the pointer is valid for one int.
    unsafe { sys::nvrtcGetNumSupportedArchs(&mut count) }
        .result()
        .map_err(|code| RuntimeError::Nvrtc { call: "nvrtcGetNumSupportedArchs", code })?;
    let mut raw = vec![0i32; usize::try_from(count).unwrap_or(0)];
    // SAFETY: `raw` holds exactly the `count` ints NVRTC just said it will write.
    unsafe { sys::nvrtcGetSupportedArchs(raw.as_mut_ptr()) }
        .result()
        .map_err(|code| RuntimeError::Nvrtc { call: "nvrtcGetSupportedArchs", code })?;
    let mut archs: Vec<Arch> =
        raw.into_iter().filter_map(|sm| u32::try_from(sm).ok()).map(|sm| Arch::new(sm / 10, sm % 10)).collect();
    archs.sort();
    Ok(ARCHS.get_or_init(|| archs).clone())
}

/// The cache key `compile(source, opts)` would produce, without compiling (and without NVRTC).
pub fn cache_key(source: &str, opts: &CompileOptions) -> CacheKey {
    CacheKey::from_parts(&KeyParts {
        source,
        options: &opts.nvrtc_options(),
        arch: opts.arch,
        kfuse_version: KFUSE_VERSION,
        format_version: CACHE_FORMAT_VERSION,
    })
}

/// The arch NVRTC builds for when asked for `target`: `target` itself when NVRTC knows it (or it
/// is an `a` target, which has no stand-in), else the newest known one below it (its cubin loads
/// on no newer major, but its PTX does, through the driver's JIT).
pub fn build_arch(target: Arch) -> Result<Arch, RuntimeError> {
    if target.accel {
        return Ok(target);
    }
    let archs = supported_archs()?;
    if archs.is_empty() || archs.contains(&target) {
        return Ok(target);
    }
    Ok(archs.iter().copied().filter(|a| *a <= target).max().unwrap_or(target))
}

/// The first NVRTC version that takes `--minimal`.
const MINIMAL_SINCE: (i32, i32) = (12, 4);

/// Compiles `source` with NVRTC to a cubin for `opts.arch` (or, when this NVRTC does not know
/// it, for [`build_arch`]'s stand-in), keeping the PTX. No caching.
pub fn compile(source: &str, opts: &CompileOptions) -> Result<CompiledModule, RuntimeError> {
    let nvrtc = nvrtc_version()?;
    let built_for = build_arch(opts.arch)?;
    let options = opts.compile_options(built_for, nvrtc);
    for option in &options {
        check_no_nul("an NVRTC option", option)?;
    }
    let key = cache_key(source, opts);
    let program = Program::create(source)?;
    // SAFETY: `program.handle` was created by nvrtcCreateProgram and is destroyed only by
    // Program's Drop, after this call; options were checked to contain no NUL (cudarc unwraps
    // CString::new on them).
    let compiled = unsafe { result::compile_program(program.handle, &options) };
    let log = program.log()?;
    if let Err(code) = compiled {
        return Err(RuntimeError::Compile { arch: built_for, options, log, code });
    }
    let cubin = program.cubin()?;
    let ptx = program.ptx()?;
    Ok(CompiledModule { key, arch: opts.arch, built_for, nvrtc_version: nvrtc, cubin, ptx, log })
}

pub(crate) fn check_no_nul(what: &'static str, text: &str) -> Result<(), RuntimeError> {
    match text.bytes().position(|b| b == 0) {
        Some(offset) => Err(RuntimeError::InteriorNul { what, offset }),
        None => Ok(()),
    }
}

/// An NVRTC program, destroyed when dropped (on every path, errors included).
struct Program {
    handle: sys::nvrtcProgram,
    // NVRTC may keep pointers into the source until the program is destroyed.
    _source: CString,
}

impl Program {
    fn create(source: &str) -> Result<Program, RuntimeError> {
        check_no_nul("the CUDA source", source)?;
        let source = CString::new(source)
            .map_err(|e| RuntimeError::InteriorNul { what: "the CUDA source", offset: e.nul_position() })?;
        let handle = result::create_program(&source, Some(c"kfuse.cu"))
            .map_err(|code| RuntimeError::Nvrtc { call: "nvrtcCreateProgram", code })?;
        Ok(Program { handle, _source: source })
    }

    fn log(&self) -> Result<String, RuntimeError> {
        // SAFETY: the handle is live (created in `create`, destroyed only in Drop).
        let raw = unsafe { result::get_program_log(self.handle) }
            .map_err(|code| RuntimeError::Nvrtc { call: "nvrtcGetProgramLog", code })?;
        Ok(c_chars_to_string(&raw))
    }

    fn ptx(&self) -> Result<String, RuntimeError> {
        // SAFETY: the handle is live and was compiled successfully.
        let raw = unsafe { result::get_ptx(self.handle) }
            .map_err(|code| RuntimeError::Nvrtc { call: "nvrtcGetPTX", code })?;
        Ok(c_chars_to_string(&raw))
    }

    fn cubin(&self) -> Result<Vec<u8>, RuntimeError> {
        let mut size: usize = 0;
        // SAFETY: the handle is live and compiled; `size` is a valid out-pointer.
        unsafe { sys::nvrtcGetCUBINSize(self.handle, &mut size) }
            .result()
            .map_err(|code| RuntimeError::Nvrtc { call: "nvrtcGetCUBINSize", code })?;
        let mut cubin = vec![0u8; size];
        // SAFETY: `cubin` holds exactly the `size` bytes NVRTC reported for this program.
        unsafe { sys::nvrtcGetCUBIN(self.handle, cubin.as_mut_ptr().cast::<c_char>()) }
            .result()
            .map_err(|code| RuntimeError::Nvrtc { call: "nvrtcGetCUBIN", code })?;
        Ok(cubin)
    }
}

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: the handle came from nvrtcCreateProgram and this is its only destruction.
        // A failure to destroy cannot be reported from Drop; it only leaks host memory.
        let _ = unsafe { result::destroy_program(self.handle) };
    }
}

/// Converts NVRTC's NUL-terminated char buffer to a String, dropping the terminator.
fn c_chars_to_string(raw: &[c_char]) -> String {
    let bytes: Vec<u8> = raw.iter().map(|&c| c.to_ne_bytes()[0]).take_while(|&b| b != 0).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minimal_goes_to_an_nvrtc_that_takes_it_and_never_into_the_key() {
        let opts = CompileOptions { arch: Arch::new(9, 0), extra: vec!["--use_fast_math".to_string()] };
        let keyed = opts.nvrtc_options();
        assert_eq!(opts.compile_options(Arch::new(9, 0), (12, 3)), keyed, "NVRTC 12.3 does not know --minimal");
        for nvrtc in [(12, 4), (12, 9), (13, 0)] {
            let options = opts.compile_options(Arch::new(9, 0), nvrtc);
            assert_eq!(options[..keyed.len()], keyed[..], "{nvrtc:?}");
            assert_eq!(options[keyed.len()..], ["--minimal".to_string()], "{nvrtc:?}");
        }
        assert!(!keyed.contains(&"--minimal".to_string()), "the key's options: {keyed:?}");
        let older = opts.compile_options(Arch::new(8, 6), (13, 0));
        assert_eq!(older[0], "--gpu-architecture=sm_86", "a stand-in arch keeps the rest: {older:?}");
    }

    #[test]
    fn kernels_compile_without_contraction_and_their_quick_build_adds_the_fast_level() {
        let full = CompileOptions::for_kernels(Arch::new(9, 0));
        assert_eq!(full.extra.first().map(String::as_str), Some("--fmad=false"), "{full:?}");
        let quick = full.quick().expect("a quick build");
        assert_eq!(quick.arch, full.arch);
        assert_eq!(quick.extra[..full.extra.len()], full.extra[..], "the quick build keeps every option");
        assert_eq!(quick.extra.last().map(String::as_str), Some("--Ofast-compile=max"));
        assert_ne!(cache_key("k", &quick), cache_key("k", &full), "the two builds are cached apart");
        assert_eq!(quick.quick(), None, "a build with a fast-compile level has no quicker one");
        let mid = CompileOptions { arch: Arch::new(9, 0), extra: vec!["--Ofast-compile=mid".to_string()] };
        assert_eq!(mid.quick(), None);
    }
}
