//! A helper process for the kernel cache's cross-process tests: compiles one small kernel
//! through a cache folder and prints a single JSON line with the outcome, the key and a hash of
//! the cubin. Not a user tool.
//!
//! Usage: `kfuse-cache-probe --dir DIR [--arch sm_90] [--variant N] [--start-file PATH]`;
//! with `--start-file` it waits (up to 30 s) for that file to exist, so that many probes can be
//! released at the same moment.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use kfuse_runtime::{Arch, CompileOptions, KernelCache};

struct Args {
    dir: PathBuf,
    arch: Arch,
    variant: u32,
    start_file: Option<PathBuf>,
}

fn parse_args() -> Result<Args, String> {
    let mut dir = None;
    let mut arch = Arch::new(9, 0);
    let mut variant = 0;
    let mut start_file = None;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--dir" => dir = Some(PathBuf::from(value()?)),
            "--arch" => arch = value()?.parse().map_err(|e| format!("{e}"))?,
            "--variant" => variant = value()?.parse().map_err(|e| format!("--variant: {e}"))?,
            "--start-file" => start_file = Some(PathBuf::from(value()?)),
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(Args { dir: dir.ok_or("--dir is required")?, arch, variant, start_file })
}

/// The probe's kernel; `variant` changes a constant so tests can ask for distinct keys.
pub fn probe_source(variant: u32) -> String {
    format!(
        "extern \"C\" __global__ void probe(float* out, const float* x, long long n) {{\n    \
         long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n    \
         if (i < n) {{ out[i] = x[i] * {variant}.5f + 1.0f; }}\n}}\n"
    )
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(args) => args,
        Err(e) => {
            eprintln!("kfuse-cache-probe: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(start) = &args.start_file {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !start.exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    let cache = KernelCache::with_dir(&args.dir, kfuse_runtime::cache::DEFAULT_MAX_BYTES);
    let opts = CompileOptions::for_arch(args.arch);
    match cache.get_or_compile(&probe_source(args.variant), &opts) {
        Ok((module, outcome)) => {
            println!(
                "{{\"outcome\":\"{outcome:?}\",\"key\":\"{}\",\"cubin_blake3\":\"{}\",\"pid\":{}}}",
                module.key,
                blake3::hash(&module.cubin).to_hex(),
                std::process::id()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("kfuse-cache-probe: {e}");
            ExitCode::FAILURE
        }
    }
}
