//! The `kfuse` command-line tool: a thin layer over the `kfuse` library.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{anyhow, bail, Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use kfuse::{bench, boxes, exec, npy, Device, HostTensor, Program};

#[derive(Parser)]
#[command(name = "kfuse", version, about = "Run-time kernel fusion: .kf descriptions to fused CUDA kernels (with a CPU reference interpreter)")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum DeviceArg {
    /// The GPU when one is found, else the CPU.
    Auto,
    Cpu,
    Cuda,
}

#[derive(Subcommand)]
enum Command {
    /// Parse and type-check a .kf file; print the typed graph.
    Check { file: PathBuf },
    /// Print the generated CUDA source of a .kf file.
    Emit { file: PathBuf },
    /// Run a .kf file: tensor outputs go to DIR/NAME.npy, scalars are printed as `NAME = VALUE`.
    Run {
        file: PathBuf,
        /// An input as NAME=PATH.npy (repeat for each input).
        #[arg(long = "input", value_name = "NAME=PATH")]
        inputs: Vec<String>,
        /// Folder for tensor outputs.
        #[arg(long, default_value = ".")]
        output: PathBuf,
        #[arg(long, value_enum, default_value = "auto")]
        device: DeviceArg,
    },
    /// Time a .kf file on the GPU (CUDA events, warm-up, median) against the interpreter.
    Bench {
        file: PathBuf,
        /// An input as NAME=PATH.npy (repeat for each input).
        #[arg(long = "input", value_name = "NAME=PATH")]
        inputs: Vec<String>,
        /// Random inputs of these sizes instead of files: SYMBOL=SIZE (repeat).
        #[arg(long = "dim", value_name = "SYM=SIZE")]
        dims: Vec<String>,
        /// Also time the hand-written baseline kernel of this name (`giou`).
        #[arg(long)]
        baseline: Option<String>,
        /// Timed runs per figure.
        #[arg(long, default_value_t = 200)]
        iters: usize,
        /// Write the figures as JSON here too.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// Generate data sets.
    Gen {
        #[command(subcommand)]
        what: GenCommand,
    },
    /// The main job for a newcomer: a ragged batch through the fused GIoU loss, GPU when found.
    Demo {
        #[arg(long, default_value_t = 1024)]
        batch: usize,
        #[arg(long, default_value_t = 256)]
        max_boxes: usize,
        #[arg(long, value_enum, default_value = "auto")]
        device: DeviceArg,
    },
}

#[derive(Subcommand)]
enum GenCommand {
    /// A ragged batch of boxes with the GIoU seed's statistics, in every layout.
    Boxes {
        #[arg(long)]
        batch: usize,
        #[arg(long)]
        max_boxes: usize,
        #[arg(long)]
        out: PathBuf,
        #[arg(long, default_value_t = 0)]
        seed: u64,
    },
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // Diagnostics from the language come fully rendered; everything else gets a prefix.
            let msg = format!("{e:#}");
            if msg.starts_with("error") {
                eprintln!("{msg}");
            } else {
                eprintln!("error: {msg}");
            }
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Check { file } => {
            let p = load(&file)?;
            print!("{}", p.graph);
            Ok(())
        }
        Command::Emit { file } => {
            let p = load(&file)?;
            let plan = p.plan()?;
            for k in &plan.kernels {
                println!("{}", k.source);
            }
            Ok(())
        }
        Command::Run { file, inputs, output, device } => {
            let p = load(&file)?;
            let tensors = read_inputs(&inputs)?;
            let named: Vec<(&str, &HostTensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
            let device = pick_device(device)?;
            let outputs = match device {
                Device::Cpu => p.run_cpu(&named)?,
                Device::Cuda => {
                    let gpu = kfuse_runtime::open_default()?;
                    exec::CudaProgram::prepare(&gpu, &p)?.run(&named)?
                }
            };
            write_outputs(&outputs, &output)
        }
        Command::Bench { file, inputs, dims, baseline, iters, json } => {
            let p = load(&file)?;
            let tensors = if dims.is_empty() {
                read_inputs(&inputs)?
            } else {
                if !inputs.is_empty() {
                    bail!("give either --input files or --dim sizes, not both");
                }
                let sizes = parse_dims(&dims)?;
                bench::random_inputs(&p.graph, &sizes, 0)?
            };
            let gpu = kfuse_runtime::open_default().context("`kfuse bench` times the GPU")?;
            let opts = bench::BenchOptions { iters, baseline };
            let report = bench::run(&gpu, &p, &tensors, &opts)?;
            print!("{report}");
            if let Some(path) = json {
                std::fs::write(&path, serde_json::to_string_pretty(&report)?).with_context(|| format!("writing {}", path.display()))?;
            }
            Ok(())
        }
        Command::Gen { what: GenCommand::Boxes { batch, max_boxes, out, seed } } => {
            let b = boxes::generate(batch, max_boxes, seed)?;
            std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
            for (name, t) in b.named() {
                npy::write_npy(&out.join(format!("{name}.npy")), t)?;
            }
            println!(
                "wrote {batch} images × {max_boxes} slots ({} valid boxes, {:.2} per image) to {}",
                b.valid_boxes(),
                b.valid_boxes() as f64 / batch.max(1) as f64,
                out.display()
            );
            println!("files: pred.npy target.npy (f32[B, N, 4]), lengths.npy (i32[B]), pred_packed.npy target_packed.npy (f32[T, 4]), offsets.npy (i32[B+1])");
            Ok(())
        }
        Command::Demo { batch, max_boxes, device } => kfuse::demo::run(batch, max_boxes, pick_device(device)?),
    }
}

fn load(file: &Path) -> Result<Program> {
    Ok(Program::from_file(file)?)
}

fn pick_device(d: DeviceArg) -> Result<Device> {
    Ok(match d {
        DeviceArg::Cpu => Device::Cpu,
        DeviceArg::Cuda => Device::Cuda,
        DeviceArg::Auto => match kfuse_runtime::open_default() {
            Ok(_) => Device::Cuda,
            Err(e) => {
                eprintln!("kfuse: no GPU ({e}); running on the CPU interpreter");
                Device::Cpu
            }
        },
    })
}

fn read_inputs(specs: &[String]) -> Result<Vec<(String, HostTensor)>> {
    specs
        .iter()
        .map(|s| {
            let (name, path) = s.split_once('=').ok_or_else(|| anyhow!("--input `{s}` is not NAME=PATH.npy"))?;
            Ok((name.to_string(), npy::read_npy(Path::new(path))?))
        })
        .collect()
}

fn parse_dims(specs: &[String]) -> Result<Vec<(String, u64)>> {
    specs
        .iter()
        .map(|s| {
            let (name, v) = s.split_once('=').ok_or_else(|| anyhow!("--dim `{s}` is not SYMBOL=SIZE"))?;
            let v: u64 = v.parse().map_err(|_| anyhow!("--dim `{s}`: `{v}` is not a size"))?;
            Ok((name.to_string(), v))
        })
        .collect()
}

fn write_outputs(outputs: &[(String, HostTensor)], dir: &Path) -> Result<()> {
    for (name, t) in outputs {
        if t.shape.is_empty() {
            println!("{name} = {}", format_scalar(t));
        } else {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
            let path = dir.join(format!("{name}.npy"));
            npy::write_npy(&path, t)?;
            println!("{name}: {}{:?} -> {}", t.dtype(), t.shape, path.display());
        }
    }
    Ok(())
}

fn format_scalar(t: &HostTensor) -> String {
    match t.dtype() {
        kfuse::DType::Bool => (t.to_f64()[0] != 0.0).to_string(),
        kfuse::DType::I32 => format!("{}", t.to_f64()[0] as i64),
        _ => format!("{}", t.to_f64()[0]),
    }
}
