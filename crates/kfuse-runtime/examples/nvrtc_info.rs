//! Compiles a CUDA C++ file with NVRTC (no GPU needed) and prints the compile time and ptxas's
//! resource report (registers, spills, shared memory) of every kernel in it: a developer's look
//! at what generated code costs before a GPU run.
//!
//! `cargo run --release -p kfuse-runtime --example nvrtc_info -- FILE.cu [sm_90] [NVRTC options...]`

use std::time::Instant;

use kfuse_runtime::{compile, Arch, CompileOptions};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let Some(path) = args.next() else {
        return Err("usage: nvrtc_info FILE.cu [sm_XY] [NVRTC options...]".into());
    };
    if !kfuse_runtime::nvrtc_available() {
        println!("SKIPPED: libnvrtc not found");
        return Ok(());
    }
    let source = std::fs::read_to_string(&path).map_err(|e| format!("reading {path}: {e}"))?;
    let rest: Vec<String> = args.collect();
    let (arch, extra) = match rest.first().and_then(|a| a.strip_prefix("sm_")) {
        Some(digits) => {
            let n: u32 = digits.parse().map_err(|_| format!("bad arch sm_{digits}"))?;
            (Arch::new(n / 10, n % 10), rest[1..].to_vec())
        }
        None => (Arch::new(9, 0), rest),
    };
    let mut opts = CompileOptions::for_arch(arch);
    opts.extra = extra;
    opts.extra.push("--ptxas-options=-v".to_string());
    let start = Instant::now();
    let module = compile(&source, &opts)?;
    println!(
        "{path}: sm_{}{} in {:.0} ms, cubin {} B",
        arch.major,
        arch.minor,
        start.elapsed().as_secs_f64() * 1e3,
        module.cubin.len()
    );
    for line in
        module.log.lines().filter(|l| l.contains("Compiling entry") || l.contains("Used") || l.contains("spill"))
    {
        println!("  {}", line.trim());
    }
    Ok(())
}
