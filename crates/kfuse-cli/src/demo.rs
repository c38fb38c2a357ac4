//! `kfuse demo`: the main job for a newcomer. Builds a ragged batch like the GIoU seed's, runs the
//! fused GIoU loss on the GPU when one is found (else on the CPU interpreter), and prints the loss,
//! the time and the agreement with the interpreter.

use std::time::Instant;

use kfuse::{DType, HostTensor};

use kfuse::runtime::Gpu;

use kfuse::exec::CudaProgram;
use kfuse::{Engine, Program};
use std::sync::Arc;

use crate::{boxes, Error};

/// The GIoU loss shipped with kfuse (a copy of `examples/giou.kf`, kept equal by a test), embedded
/// so the demo runs anywhere.
pub const GIOU_KF: &str = include_str!("giou.kf");

/// Runs the demo on `gpu`, or on the CPU interpreter when there is none; prints as it goes.
pub fn run(batch: usize, max_boxes: usize, gpu: Option<&Arc<Gpu>>) -> anyhow::Result<()> {
    println!("kfuse demo: the GIoU box loss over a ragged batch, fused into one kernel");
    let t0 = Instant::now();
    let data = boxes::generate(batch, max_boxes, 0)?;
    println!(
        "batch: {batch} images × {max_boxes} box slots, {} valid boxes ({:.1}% of slots; padding is skipped, not computed) [{:.0} ms to generate]",
        data.valid_boxes(),
        100.0 * data.valid_boxes() as f64 / (batch * max_boxes).max(1) as f64,
        t0.elapsed().as_secs_f64() * 1e3
    );
    let engine = match gpu {
        Some(gpu) => Engine::with_cache(gpu.cache().clone()),
        None => Engine::new()?,
    };
    let program = Program::compile(&engine, GIOU_KF, "examples/giou.kf")?;
    let inputs: [(&str, &HostTensor); 2] = [("pred", &data.pred), ("target", &data.target)];

    let t0 = Instant::now();
    let cpu = program.run_cpu(&inputs)?;
    let cpu_ms = t0.elapsed().as_secs_f64() * 1e3;
    let cpu_loss = scalar(&cpu, "loss")?;
    match gpu {
        None => {
            println!("device: CPU (reference interpreter, f64)");
            println!("loss = {cpu_loss:.7}   [{cpu_ms:.1} ms]");
            println!("(no GPU here: with one, the same file runs as one fused CUDA kernel)");
        }
        Some(gpu) => {
            let t0 = Instant::now();
            let prog = CudaProgram::prepare(gpu, &program)?;
            let bound = prog.bind(&inputs)?;
            prog.launch(&bound)?;
            let out = prog.download(&bound)?;
            let first_ms = t0.elapsed().as_secs_f64() * 1e3;
            let gpu_loss = scalar(&out, "loss")?;
            // A cold first call launched quick builds: time the optimised ones.
            prog.wait_for_optimised();
            let bound = prog.bind(&inputs)?;
            let a = gpu.record_event()?;
            let reps = 100;
            for _ in 0..reps {
                prog.launch(&bound)?;
            }
            let b = gpu.record_event()?;
            gpu.synchronize()?;
            let us = gpu.elapsed_ms(&a, &b)? as f64 * 1e3 / reps as f64;
            println!("device: {} ({}), {} kernel launch(es)", gpu.name(), gpu.arch(), prog.plan().kernels.len());
            println!(
                "loss = {gpu_loss:.7} (GPU)   {cpu_loss:.7} (interpreter)   relative difference {:.1e}",
                ((gpu_loss - cpu_loss) / cpu_loss.abs().max(1e-30)).abs()
            );
            println!("time: {us:.1} µs per loss on the GPU (mean of {reps} back-to-back runs); first run incl. compile or cache load {first_ms:.1} ms; interpreter {cpu_ms:.1} ms");
        }
    }
    println!("next: kfuse emit examples/giou.kf  (the generated CUDA)   kfuse bench examples/giou.kf --dim B=16384 --dim N=256");
    println!();
    mlp_section(gpu.map(|g| &**g))
}

/// The MLP part: a model like a user's (widths 32→64→128→96→64→32→16, SiLU, biases, f16
/// weights) written as model.json + safetensors, run as one fused tensor-core kernel.
fn mlp_section(gpu: Option<&Gpu>) -> anyhow::Result<()> {
    use kfuse::mlp::testing::{random_input, write_model, ModelSpec, Rng};
    println!("kfuse demo: a fully fused MLP (model.json + safetensors, as tools/export_mlp.py writes from PyTorch)");
    let dir = std::env::temp_dir().join(format!("kfuse-demo-mlp-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let mut spec = ModelSpec::new(&[32, 64, 128, 96, 64, 32, 16], "silu");
    spec.with_bias = true;
    let path = write_model(&dir, "demo", &spec)?;
    let model = kfuse::mlp::MlpModel::load(&path)?;
    let rows = 16_385; // not a multiple of any tile: the tail is masked, not padded by the caller
    let x = random_input(DType::F16, rows, model.input_width(), &mut Rng::new(1));
    println!("model: {}; {rows} rows in f16", model.summary());
    let t0 = Instant::now();
    let cpu = kfuse::mlp::evaluate_cpu(&model, &x)?;
    let cpu_ms = t0.elapsed().as_secs_f64() * 1e3;
    match gpu {
        None => println!(
            "CPU interpreter path: {cpu_ms:.0} ms (no GPU here: with one, the model runs as one generated kernel)"
        ),
        Some(gpu) => {
            let t0 = Instant::now();
            let y = kfuse::mlp::run_gpu(gpu, &model, &x, DType::F16)?;
            let first_ms = t0.elapsed().as_secs_f64() * 1e3;
            let e = kfuse::mlp::compare_rows(&y.to_f64(), &cpu, model.output_width());
            println!(
                "GPU: first call {first_ms:.1} ms incl. compile or cache load; vs CPU interpreter: rel err {:.2e}, max abs err {:.2e}, worst row {:.2e}",
                e.rel_err, e.max_abs_err, e.worst_row_rel_err
            );
            println!("next: kfuse mlp bench {} --batch 2097152", path.display());
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

fn scalar(outputs: &[(String, HostTensor)], name: &str) -> Result<f64, Error> {
    outputs
        .iter()
        .find(|(n, _)| n == name)
        .and_then(|(_, t)| t.scalar_f64())
        .ok_or_else(|| Error::NoScalar { name: name.to_string() })
}
