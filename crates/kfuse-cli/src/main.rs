#![forbid(unsafe_code)]
//! The `kfuse` command-line tool: a thin layer over the `kfuse` library.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};
use kfuse::mlp::MlpModel;
use kfuse::mlp::{self, MlpOptions, MlpProgram};
use kfuse::runtime::{Arch, CacheOutcome, CompileOptions, Gpu, KernelCache, VerifyAction};
use kfuse::{exec, Engine, HostTensor, Program};
use kfuse_cli::{bench, boxes, mlp_bench, npy};

/// Prints a line to stdout; a closed pipe (`kfuse cache list | head`) ends the program quietly
/// instead of panicking as `println!` would.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        if let Err(e) = writeln!(std::io::stdout().lock(), $($arg)*) {
            if e.kind() == std::io::ErrorKind::BrokenPipe {
                std::process::exit(0);
            }
        }
    }};
}

#[derive(Parser)]
#[command(
    name = "kfuse",
    version,
    about = "Run-time kernel fusion: .kf descriptions to fused CUDA kernels (with a CPU reference interpreter)"
)]
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

/// Code generation tuning (the defaults are what every other command uses).
#[derive(Args, Debug, Clone, Copy)]
struct Tuning {
    /// Threads per block of the generated kernels (a multiple of 32, 32..=1024).
    #[arg(long, default_value_t = 256)]
    block_size: u32,
    /// Elements per thread and iteration of batched grid-stride loops (1..=16), for loads of up to 4 registers an element; a kernel whose elements load more takes fewer (halved until the batch's loads hold at most 4 registers per element asked).
    #[arg(long, default_value_t = 4)]
    elems_per_thread: u32,
    /// Threads per multiprocessor promised by batched loops' launch bounds (registers per thread
    /// are capped at 65536 / this; a multiple of the block size, at most 2048).
    #[arg(long, default_value_t = 1024)]
    threads_per_sm: u32,
    /// How a scaled gradient under `mask(lengths)` is planned.
    #[arg(long, value_enum, default_value = "one-pass")]
    lengths_gradient: LengthsGradientArg,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum LengthsGradientArg {
    /// A reduction kernel, then a warp-per-row gradient kernel.
    TwoKernels,
    /// One launch: each block zero-fills its rows, counts the lengths itself and writes the
    /// valid columns' gradient.
    OnePass,
}

impl Tuning {
    fn options(self) -> kfuse::CodegenOptions {
        let lengths_gradient = match self.lengths_gradient {
            LengthsGradientArg::TwoKernels => kfuse::LengthsGradient::TwoKernels,
            LengthsGradientArg::OnePass => kfuse::LengthsGradient::OnePass,
        };
        kfuse::CodegenOptions {
            block_size: self.block_size,
            elems_per_thread: self.elems_per_thread,
            batched_threads_per_sm: self.threads_per_sm,
            lengths_gradient,
            strided_inputs: Vec::new(),
        }
    }
}

#[derive(Subcommand)]
enum Command {
    /// Parse and type-check a .kf file; print the typed graph.
    Check {
        file: PathBuf,
        /// Also print the plan: each kernel's shape (how its threads cover the work) and its sinks.
        #[arg(long)]
        plan: bool,
    },
    /// Print the generated CUDA source of a .kf file.
    Emit {
        file: PathBuf,
        #[command(flatten)]
        tuning: Tuning,
        /// Read input NAME through strides given at launch, as for a view that is not contiguous
        /// (repeat for each input).
        #[arg(long = "strided", value_name = "NAME")]
        strided: Vec<String>,
    },
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
    /// Time a .kf file on the GPU (CUDA events, warm-up, median) against the interpreter, in three
    /// modes: back to back on one buffer set, rotated over buffer sets that together exceed L2
    /// three times, and each launch alone after an L2 flush.
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
        /// Buffer sets the rotated mode cycles through (2..=64); default: the fewest whose inputs
        /// and outputs together reach 3× the L2 size.
        #[arg(long, value_name = "N")]
        rotate_sets: Option<usize>,
        /// Write the figures as JSON here too.
        #[arg(long)]
        json: Option<PathBuf>,
        #[command(flatten)]
        tuning: Tuning,
    },
    /// Generate data sets.
    Gen {
        #[command(subcommand)]
        what: GenCommand,
    },
    /// Compile a .kf file's kernels with NVRTC into the kernel cache; needs no GPU.
    Compile {
        file: PathBuf,
        /// Target architecture, e.g. sm_90 (default: the GPU's).
        #[arg(long)]
        arch: Option<String>,
    },
    /// Inspect and maintain the on-disk kernel cache ($KFUSE_CACHE_DIR, default ~/.cache/kfuse). kfuse
    /// tags its folder with a CACHEDIR.TAG and refuses a folder that holds anything else.
    Cache {
        #[command(subcommand)]
        what: CacheCommand,
    },
    /// Fully fused MLP inference from a PyTorch model (model.json + safetensors).
    Mlp {
        #[command(subcommand)]
        what: MlpCommand,
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
enum CacheCommand {
    /// Entries, bytes, hits, misses, repairs.
    Stats {
        #[arg(long)]
        json: bool,
    },
    /// Every entry with its arch, size and last use.
    List,
    /// Remove every entry (only kfuse's own files: anything else in the folder is left and listed).
    Clear,
    /// Check every entry; report and remove bad ones (files that are not kfuse's are reported and left).
    Verify,
    /// The seed scenario: 1000 builds of one fused op and 100 of each of 10, cold then warm (fresh
    /// process); compiles, lookup times, first GIoU result. Needs a GPU.
    Bench {
        /// Cache folder to use (default: a fresh temporary one).
        #[arg(long)]
        dir: Option<PathBuf>,
        #[arg(long)]
        json: Option<PathBuf>,
        /// Internal: run one phase and write its figures here.
        #[arg(long, hide = true)]
        phase_out: Option<PathBuf>,
    },
    /// Compile every .kf file of a folder into the cache.
    Warm {
        dir: PathBuf,
        #[arg(long)]
        arch: Option<String>,
    },
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum FloatArg {
    F32,
    F16,
    Bf16,
}

impl From<FloatArg> for kfuse::DType {
    fn from(f: FloatArg) -> kfuse::DType {
        match f {
            FloatArg::F32 => kfuse::DType::F32,
            FloatArg::F16 => kfuse::DType::F16,
            FloatArg::Bf16 => kfuse::DType::BF16,
        }
    }
}

#[derive(Subcommand)]
enum MlpCommand {
    /// Run a model on an input .npy ([rows, in] in f32, f16 or bf16). On a GPU, when the
    /// optimised kernel is not in the kernel cache yet, the result comes from a quickly compiled
    /// form and the command then waits for the optimised kernel's background compile to land in
    /// the disk cache (one line on stderr says so), so that the next run uses it.
    Run {
        model: PathBuf,
        #[arg(long)]
        input: PathBuf,
        #[arg(long)]
        output: PathBuf,
        /// Output dtype (default: the input's).
        #[arg(long, value_enum)]
        out_dtype: Option<FloatArg>,
        #[arg(long, value_enum, default_value = "auto")]
        device: DeviceArg,
    },
    /// Time the fused kernel on random rows, against the card's ceilings and the CPU path.
    /// Reports the first call (model load, prepare, first result; the fast-compiled form when the
    /// optimised kernel is not cached), the fast form's kernel time, when the optimised kernel
    /// was ready (background compile), and the optimised kernel's time (the headline). For cold
    /// compile figures run with CUDA_CACHE_DISABLE=1 (NVRTC 12.9+ has its own cache in the
    /// driver's compute cache) and a fresh KFUSE_CACHE_DIR.
    Bench {
        model: PathBuf,
        #[arg(long, default_value_t = 1 << 21)]
        batch: usize,
        #[arg(long, value_enum, default_value = "f16")]
        io_dtype: FloatArg,
        #[arg(long)]
        json: Option<PathBuf>,
        /// Compile the optimised kernel before the first call (no fast-compiled form).
        #[arg(long)]
        full_only: bool,
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
        /// Float dtype of the box files.
        #[arg(long, value_enum, default_value = "f32")]
        dtype: FloatArg,
    },
}

fn main() -> ExitCode {
    let result = run(Cli::parse());
    // Kernels a first call left compiling in the background finish (and reach the disk cache)
    // before the process exits.
    kfuse::KernelCache::wait_for_global_background();
    match result {
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
        Command::Check { file, plan } => {
            say!("{}", parse(&file)?);
            if plan {
                let p = load(&file)?;
                let kernels = &p.plan().kernels;
                for (k, kernel) in kernels.iter().enumerate() {
                    say!("kernel {} of {} ({}):", k + 1, kernels.len(), kernel.name);
                    for note in kernel.plan_notes() {
                        say!("    {note}");
                    }
                    if kernel.recompute > kfuse::RECOMPUTED_EXTENT_LIMIT {
                        let elements = match kernel.recompute {
                            u64::MAX => "a number known at run time".to_string(),
                            n => n.to_string(),
                        };
                        say!(
                            "    warning: reductions computed where they are used read {elements} elements again for each \
                             element of this kernel: its work grows with that times its elements (a reduction along the \
                             last axis is kept once per row where the kernel runs over its rows, and one along other \
                             axes is stored once; this one is neither)"
                        );
                    }
                }
            }
            Ok(())
        }
        Command::Emit { file, tuning, strided } => {
            let mut p = load(&file)?.with_codegen(tuning.options())?;
            if !strided.is_empty() {
                let inputs = &p.interface().inputs;
                let known = || inputs.iter().map(|d| d.name.as_str()).collect::<Vec<_>>().join(", ");
                let indices = strided
                    .iter()
                    .map(|name| match inputs.iter().position(|d| d.name == *name) {
                        Some(i) => Ok(i as u32),
                        None => Err(anyhow!("--strided {name}: no such input (inputs: {})", known())),
                    })
                    .collect::<Result<Vec<u32>>>()?;
                p = p.reading_strided(&indices)?;
            }
            for (source, _) in p.plan().kernels.iter().flat_map(|k| k.entries()) {
                say!("{source}");
            }
            Ok(())
        }
        Command::Run { file, inputs, output, device } => {
            let graph = parse(&file)?;
            if kfuse::Interface::of(&graph).outputs.iter().any(|o| !o.shape.is_empty()) {
                check_output_dir(&output)?;
            }
            let tensors = read_inputs(&inputs)?;
            let named: Vec<(&str, &HostTensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
            let outputs = match open_device(device)? {
                // The interpreter needs no kernel plan.
                None => kfuse::interpret(&graph, &named)?,
                // One run: the optimised kernels at once (quick builds would only add their compile).
                Some(gpu) => exec::CudaProgram::prepare_optimised(&gpu, &load(&file)?)?.run(&named)?,
            };
            write_outputs(&outputs, &output)
        }
        Command::Bench { file, inputs, dims, baseline, iters, rotate_sets, json, tuning } => {
            let opts = bench::BenchOptions { iters, baseline, rotate_sets };
            bench::check_options(&opts)?;
            let p = load(&file)?.with_codegen(tuning.options())?;
            let tensors = if dims.is_empty() {
                read_inputs(&inputs)?
            } else {
                if !inputs.is_empty() {
                    bail!("give either --input files or --dim sizes, not both");
                }
                let sizes = parse_dims(&dims)?;
                bench::random_inputs(p.graph(), &sizes, 0)?
            };
            let gpu = std::sync::Arc::new(kfuse::runtime::open_default().context("`kfuse bench` times the GPU")?);
            let report = bench::run(&gpu, &p, &tensors, &opts)?;
            say!("{report}");
            if let Some(path) = json {
                std::fs::write(&path, serde_json::to_string_pretty(&report)?)
                    .with_context(|| format!("writing {}", path.display()))?;
            }
            Ok(())
        }
        Command::Gen { what: GenCommand::Boxes { batch, max_boxes, out, seed, dtype } } => {
            let b = boxes::generate(batch, max_boxes, seed)?;
            std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
            for (name, t) in b.named() {
                npy::write_npy(&out.join(format!("{name}.npy")), &boxes::convert_floats(t, dtype.into()))?;
            }
            say!(
                "wrote {batch} images × {max_boxes} slots ({} valid boxes, {:.2} per image) to {}",
                b.valid_boxes(),
                b.valid_boxes() as f64 / batch.max(1) as f64,
                out.display()
            );
            say!("files: pred.npy target.npy (f32[B, N, 4]), lengths.npy (i32[B]), pred_packed.npy target_packed.npy (f32[T, 4]), offsets.npy (i32[B+1])");
            Ok(())
        }
        Command::Compile { file, arch } => {
            let p = load(&file)?;
            let arch = pick_arch(arch)?;
            let cache = KernelCache::try_global()?;
            cache.check_folder()?;
            for (source, entry) in p.plan().kernels.iter().flat_map(|k| k.entries()) {
                let t0 = Instant::now();
                let (m, outcome) = cache.get_or_compile(source, &CompileOptions::for_kernels(arch))?;
                say!(
                    "{} {arch} key {} {} ({:.1} ms, cubin {} bytes)",
                    entry,
                    m.key.to_hex(),
                    outcome_word(outcome),
                    t0.elapsed().as_secs_f64() * 1e3,
                    m.cubin.len()
                );
            }
            Ok(())
        }
        Command::Cache { what } => cache_command(what),
        Command::Mlp { what } => mlp_command(what),
        Command::Demo { batch, max_boxes, device } => {
            kfuse_cli::demo::run(batch, max_boxes, open_device(device)?.as_ref())
        }
    }
}

fn outcome_word(o: CacheOutcome) -> &'static str {
    match o {
        CacheOutcome::MemoryHit => "hit (memory)",
        CacheOutcome::DiskHit => "hit (disk)",
        CacheOutcome::Compiled => "miss (compiled)",
        CacheOutcome::Repaired => "miss (bad entry repaired)",
    }
}

/// The arch asked for, else the GPU's; without either, an error that says what to pass.
fn pick_arch(arch: Option<String>) -> Result<Arch> {
    match arch {
        Some(a) => Ok(a.parse()?),
        None => match kfuse::runtime::open_default() {
            Ok(gpu) => Ok(gpu.arch()),
            Err(e) => bail!("no GPU to take the architecture from ({e}); pass --arch, e.g. --arch sm_90"),
        },
    }
}

fn cache_command(what: CacheCommand) -> Result<()> {
    let cache = KernelCache::try_global()?;
    if !matches!(what, CacheCommand::Bench { .. }) {
        // A folder that is not kfuse's, or not a folder, is refused before anything is read.
        cache.check_folder()?;
    }
    match what {
        CacheCommand::Stats { json } => {
            let s = cache.stats();
            if json {
                say!("{}", serde_json::to_string_pretty(&s)?);
            } else {
                let dir = s.dir.as_ref().map(|d| d.display().to_string()).unwrap_or_else(|| "(none)".into());
                say!("folder:   {dir}{}", if s.bypassed { " (bypassed by KFUSE_NO_CACHE)" } else { "" });
                if s.max_bytes == 0 {
                    say!(
                        "entries:  {} ({} bytes; KFUSE_CACHE_MAX_BYTES=0 keeps nothing new on disk)",
                        s.entries,
                        s.bytes
                    );
                } else {
                    say!("entries:  {} ({} bytes of {} allowed)", s.entries, s.bytes, s.max_bytes);
                }
                let c = &s.persisted;
                say!(
                    "all processes: {} disk hits, {} misses (compiles), {} repairs, {} failed writes, {} evictions",
                    c.disk_hits,
                    c.compiles,
                    c.repairs,
                    c.write_failures,
                    c.evictions
                );
            }
        }
        CacheCommand::List => {
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
            for e in cache.list()? {
                let nvrtc =
                    e.nvrtc_version.map_or("NVRTC ?".to_string(), |(major, minor)| format!("NVRTC {major}.{minor}"));
                say!(
                    "{} {} {:>9} bytes  {nvrtc}  last used {}  {}",
                    e.arch,
                    e.key.to_hex(),
                    e.bytes,
                    kfuse_cli::when::date_and_age(e.last_used_unix_s, now),
                    e.path.display()
                );
            }
        }
        CacheCommand::Clear => {
            let r = cache.clear()?;
            for path in &r.left_alone {
                say!("left alone: {} (not kfuse's)", path.display());
            }
            say!("removed {} entries ({} bytes)", r.entries, r.bytes);
        }
        CacheCommand::Verify => {
            let r = cache.verify()?;
            let mut left_alone = 0;
            for p in &r.problems {
                let action = match &p.action {
                    VerifyAction::Removed => "removed".to_string(),
                    VerifyAction::RemoveFailed(why) => format!("could not remove: {why}"),
                    VerifyAction::LeftAlone => {
                        left_alone += 1;
                        "not kfuse's, left alone".to_string()
                    }
                };
                say!("{} — {} ({action})", p.path.display(), p.reason);
            }
            say!(
                "checked {} entries: {} valid, {} bad; {left_alone} files not kfuse's, left alone",
                r.checked,
                r.valid,
                r.problems.len() - left_alone
            );
        }
        CacheCommand::Bench { dir, json, phase_out } => {
            if let (Some(out), Some(dir)) = (&phase_out, &dir) {
                let gpu = kfuse_cli::cachebench::open_with_cache_dir(dir)?;
                let r = kfuse_cli::cachebench::run_phase(&gpu, "warm")?;
                std::fs::write(out, serde_json::to_string(&r)?)?;
                return Ok(());
            }
            let dir =
                dir.unwrap_or_else(|| std::env::temp_dir().join(format!("kfuse-cache-bench-{}", std::process::id())));
            // A cold start: kfuse's files go; a folder that is not kfuse's is refused.
            KernelCache::with_dir(&dir, kfuse::runtime::cache::DEFAULT_MAX_BYTES).clear()?;
            let gpu = kfuse_cli::cachebench::open_with_cache_dir(&dir).context("`kfuse cache bench` needs a GPU")?;
            let cold = kfuse_cli::cachebench::run_phase(&gpu, "cold")?;
            drop(gpu);
            // Beside the cache folder, not in it: only kfuse's cache files go there.
            let out = std::env::temp_dir().join(format!("kfuse-cache-bench-{}-warm.json", std::process::id()));
            let status = std::process::Command::new(std::env::current_exe()?)
                .args(["cache", "bench", "--dir"])
                .arg(&dir)
                .arg("--phase-out")
                .arg(&out)
                .status()?;
            if !status.success() {
                bail!("the warm phase (a fresh process) failed: {status}");
            }
            let warm: kfuse_cli::cachebench::PhaseReport = serde_json::from_str(&std::fs::read_to_string(&out)?)?;
            let _ = std::fs::remove_file(&out);
            let phases = [cold, warm];
            say!("{}", kfuse_cli::cachebench::render(&phases));
            if let Some(path) = json {
                std::fs::write(&path, serde_json::to_string_pretty(&phases)?)?;
            }
        }
        CacheCommand::Warm { dir, arch } => {
            let arch = pick_arch(arch)?;
            let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
                .with_context(|| format!("reading {}", dir.display()))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "kf"))
                .collect();
            files.sort();
            let bar = indicatif::ProgressBar::new(files.len() as u64);
            bar.set_style(
                indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} {msg}").expect("a valid template"),
            );
            let (mut compiled, mut hits, mut failed) = (0, 0, 0);
            for f in &files {
                bar.set_message(f.display().to_string());
                let result = load(f).and_then(|p| {
                    for (source, _) in p.plan().kernels.iter().flat_map(|k| k.entries()) {
                        match cache.get_or_compile(source, &CompileOptions::for_kernels(arch))?.1 {
                            CacheOutcome::Compiled | CacheOutcome::Repaired => compiled += 1,
                            _ => hits += 1,
                        }
                    }
                    Ok(())
                });
                if let Err(e) = result {
                    failed += 1;
                    // Printed whether or not stderr is a terminal (a hidden bar drops `println`).
                    bar.suspend(|| eprintln!("failed: {}: {e:#}", f.display()));
                }
                bar.inc(1);
            }
            bar.finish_and_clear();
            say!(
                "{} files for {arch}: {compiled} kernels compiled, {hits} already cached, {failed} files failed",
                files.len()
            );
            if failed > 0 {
                bail!("{failed} of {} .kf files in {} failed (each reason is above)", files.len(), dir.display());
            }
        }
    }
    Ok(())
}

fn mlp_command(what: MlpCommand) -> Result<()> {
    match what {
        MlpCommand::Run { model, input, output, out_dtype, device } => {
            let m = MlpModel::load(&model)?;
            let x = npy::read_npy(&input)?;
            let out_dtype = out_dtype.map(Into::into).unwrap_or(x.dtype());
            let summary = m.summary();
            let program = match open_device(device)? {
                None => None,
                Some(gpu) => Some(MlpProgram::new(m.clone(), gpu, MlpOptions::for_dtypes(x.dtype(), out_dtype))?),
            };
            let y = match &program {
                Some(program) => program.forward(&x)?,
                None => kfuse::mlp::run_cpu_as(&m, &x, out_dtype)?,
            };
            npy::write_npy(&output, &y)?;
            say!("{summary}: {:?} {} -> {}", y.shape, y.dtype(), output.display());
            if let Some(program) = &program {
                finish_optimised_compile(program);
            }
            Ok(())
        }
        MlpCommand::Bench { model, batch, io_dtype, json, full_only } => {
            let loading = std::time::Instant::now();
            let m = MlpModel::load(&model)?;
            let model_load_ms = loading.elapsed().as_secs_f64() * 1e3;
            let gpu = kfuse::runtime::open_default().context("`kfuse mlp bench` times the GPU")?;
            let d: kfuse::DType = io_dtype.into();
            let tiering = if full_only { mlp::Tiering::FullOnly } else { mlp::Tiering::Background };
            let opts = mlp_bench::BenchOptions { batch, in_dtype: d, out_dtype: d, tiering, ..Default::default() };
            let mut report = mlp_bench::bench_gpu(&gpu, &m, &opts)?;
            report.model_load_ms = Some(model_load_ms);
            say!("{}", report.render());
            if let Some(path) = json {
                std::fs::write(&path, serde_json::to_string_pretty(&report)?)
                    .with_context(|| format!("writing {}", path.display()))?;
            }
            Ok(())
        }
    }
}

/// After `kfuse mlp run` answered from the fast-compiled form: waits for the optimised kernel's
/// background compile (it lands in the disk cache, so the next run starts optimised) and says
/// so in one line on stderr. A failed background compile is a warning: the result is written.
fn finish_optimised_compile(program: &MlpProgram) {
    let gpu = program.gpu();
    if !program.prepared().was_tiered() {
        return;
    }
    if gpu.cache().dir().is_none() {
        eprintln!("kfuse: the result came from the fast-compiled kernel; with no kernel cache folder the optimised kernel would not be kept, so it is not waited for");
        return;
    }
    let waiting = std::time::Instant::now();
    match program.wait_optimized() {
        Ok(ready) => {
            let where_to = gpu.cache().dir().map(|d| d.display().to_string()).unwrap_or_default();
            eprintln!(
                "kfuse: the result came from the fast-compiled kernel; the optimised kernel compiled in the background ({:.0} ms, waited {:.0} ms more) and is in the kernel cache {where_to} for the next run",
                ready.background_compile_ms.unwrap_or(0.0),
                waiting.elapsed().as_secs_f64() * 1e3
            );
        }
        Err(e) => eprintln!("kfuse: warning: {e}"),
    }
}

/// Compiles a `.kf` file (parse, type-check, plan) with the kernel cache from the environment.
fn load(file: &Path) -> Result<Program> {
    Ok(Program::load(&Engine::new()?, file)?)
}

/// Parses and type-checks a `.kf` file, without planning kernels.
fn parse(file: &Path) -> Result<kfuse::Graph> {
    let source = kfuse::read_source(file)?;
    Ok(kfuse::lang::parse_program(&source, &file.display().to_string()).map_err(kfuse::Error::from)?)
}

/// The GPU to run on (opened once: opening costs a context), or `None` for the CPU interpreter.
fn open_device(d: DeviceArg) -> Result<Option<std::sync::Arc<Gpu>>> {
    Ok(match d {
        DeviceArg::Cpu => None,
        DeviceArg::Cuda => Some(std::sync::Arc::new(kfuse::runtime::open_default()?)),
        DeviceArg::Auto => match kfuse::runtime::open_default() {
            Ok(gpu) => Some(std::sync::Arc::new(gpu)),
            Err(e) => {
                eprintln!("kfuse: no GPU ({e}); running on the CPU interpreter");
                None
            }
        },
    })
}

fn read_inputs(specs: &[String]) -> Result<Vec<(String, HostTensor)>> {
    specs
        .iter()
        .map(|s| {
            let (name, path) = s.split_once('=').ok_or_else(|| anyhow!("--input `{s}` is not NAME=PATH.npy"))?;
            if name.trim().is_empty() || path.is_empty() {
                return Err(anyhow!("--input `{s}` is not NAME=PATH.npy: the name and the path must not be empty"));
            }
            let tensor = npy::read_npy(Path::new(path)).with_context(|| format!("--input {name}"))?;
            Ok((name.to_string(), tensor))
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

/// Makes sure tensor outputs can be written to `dir` before anything is computed: creates the
/// folder, then writes and removes an empty probe file in it.
fn check_output_dir(dir: &Path) -> Result<()> {
    let shown = dir.display();
    if dir.exists() && !dir.is_dir() {
        bail!("--output {shown}: it is a file, not a folder; give a folder for the tensor outputs");
    }
    std::fs::create_dir_all(dir).with_context(|| format!("--output {shown}: cannot create the folder"))?;
    let probe = dir.join(format!(".kfuse-write-check-{}", std::process::id()));
    std::fs::write(&probe, b"").with_context(|| format!("--output {shown}: cannot write in the folder"))?;
    std::fs::remove_file(&probe).with_context(|| format!("--output {shown}: cannot remove {}", probe.display()))?;
    Ok(())
}

fn write_outputs(outputs: &[(String, HostTensor)], dir: &Path) -> Result<()> {
    for (name, t) in outputs {
        if t.shape.is_empty() {
            say!("{name} = {}", format_scalar(t));
        } else {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
            let path = dir.join(format!("{name}.npy"));
            npy::write_npy(&path, t)?;
            say!("{name}: {}{:?} -> {}", t.dtype(), t.shape, path.display());
        }
    }
    Ok(())
}

fn format_scalar(t: &HostTensor) -> String {
    match t.dtype() {
        kfuse::DType::Bool => (t.to_f64()[0] != 0.0).to_string(),
        kfuse::DType::I32 => format!("{}", t.to_f64()[0] as i64),
        kfuse::DType::I64 => match &t.data {
            kfuse::TensorData::I64(v) => v.first().map_or_else(String::new, i64::to_string),
            _ => format!("{}", t.to_f64()[0] as i64),
        },
        _ => format!("{}", t.to_f64()[0]),
    }
}
