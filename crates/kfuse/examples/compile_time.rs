//! How long NVRTC takes to compile the kernels a program loads on a device (no GPU needed, no
//! cache): each kernel alone, one after another, then all at once on one thread each (what a
//! program's first load does when the cache holds none of them).
//!
//! Usage: `cargo run -p kfuse --example compile_time -- FILE.kf [--grad LOSS:INPUT,...] [--arch sm_90] [--reps 3]
//! [--extra NVRTC-OPTION]...`;
//! with `--grad` the program is the one `with_gradients` makes (its kernels and the
//! gradient-scaling kernel its backward loads). Prints the best of `--reps` runs of each figure.

use std::path::PathBuf;
use std::time::Instant;

use kfuse::{Engine, KernelCache, Program};
use kfuse_runtime::{compile, Arch, CompileOptions};

fn best_ms(reps: usize, mut f: impl FnMut() -> Result<(), String>) -> Result<f64, String> {
    let mut best = f64::INFINITY;
    for _ in 0..reps {
        let started = Instant::now();
        f()?;
        best = best.min(started.elapsed().as_secs_f64() * 1e3);
    }
    Ok(best)
}

fn main() -> Result<(), String> {
    let mut args = std::env::args().skip(1);
    let mut file = None;
    let mut grad = None;
    let mut arch = Arch::new(9, 0);
    let mut reps = 3;
    let mut extra = Vec::new();
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or(format!("{arg} needs a value"));
        match arg.as_str() {
            "--grad" => grad = Some(value()?),
            "--arch" => arch = value()?.parse().map_err(|e| format!("{e}"))?,
            "--extra" => extra.push(value()?),
            "--reps" => reps = value()?.parse().map_err(|e| format!("--reps: {e}"))?,
            other => file = Some(PathBuf::from(other)),
        }
    }
    let file = file.ok_or("usage: compile_time FILE.kf [--grad LOSS:INPUT,...] [--arch sm_90] [--reps 3]")?;
    let engine = Engine::with_cache(std::sync::Arc::new(KernelCache::memory_only()));
    let mut program = Program::load(&engine, &file).map_err(|e| e.to_string())?;
    if let Some(spec) = grad {
        let (loss, wrt) = spec.split_once(':').ok_or("--grad takes LOSS:INPUT,INPUT")?;
        let wrt: Vec<&str> = wrt.split(',').collect();
        program = program.with_gradients(loss, &wrt).map_err(|e| e.to_string())?.0;
    }
    let kernels = program.device_kernels();
    let opts = CompileOptions { arch, extra };
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!("{} for {arch}: {} kernels, {threads} hardware threads", file.display(), kernels.len());
    let mut serial = 0.0;
    for (source, name) in &kernels {
        let ms = best_ms(reps, || compile(source, &opts).map(|_| ()).map_err(|e| e.to_string()))?;
        serial += ms;
        println!("  {name}: {} B source, {ms:.1} ms", source.len());
    }
    let parallel = best_ms(reps, || {
        std::thread::scope(|scope| {
            let running: Vec<_> =
                kernels.iter().map(|(source, _)| scope.spawn(|| compile(source, &opts).map(|_| ()))).collect();
            running
                .into_iter()
                .try_for_each(|t| t.join().map_err(|_| "a compile panicked".to_string())?.map_err(|e| e.to_string()))
        })
    })?;
    println!("one after another: {serial:.1} ms; all at once: {parallel:.1} ms");
    Ok(())
}
