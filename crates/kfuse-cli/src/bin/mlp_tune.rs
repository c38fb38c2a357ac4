//! Times the fused kernel's tile and math variants on the three MLP benchmark models
//! (64→4×64→16 ReLU, 64→4×128→16 ReLU, 32→64→128→96→64→32→16 SiLU with bias; f16, batch 2^21)
//! on the first GPU, checking each against the CPU interpreter path, and prints one table.
//!
//! `mlp_tune [OUT.jsonl [MODEL_DIR]]`: one JSON report per line to OUT.jsonl when given; the
//! models (model.json + safetensors) are written to MODEL_DIR when given, for `kfuse mlp bench`. Run with a fresh
//! KFUSE_CACHE_DIR so that each variant's first call is a cold compile. Prints SKIPPED without
//! a GPU. Env: KF_MODEL runs one model only; KF_SILU_MATH lists the SiLU model's variants,
//! comma-separated, from `packed`, `tanhf32`, `f32`, `fma0`..`fma8` (ActivationMath::PackedFma,
//! eighths), each optionally followed by `@W` (W warps per block), `/R` (R row tiles per warp)
//! and any of the suffixes `+acc16` (HiddenAccumulator::F16), `+pipe` (ChunkOrder::Pipelined)
//! and `+wg` (TensorInstructions::Wgmma),
//! e.g. `fma2@12`, `packed@16/1`, `packed@12+acc16`; default
//! `packed,fma1,fma2,fma3,fma4,packed`; the ReLU models run their default twice, and
//! with KF_LOOP=1 also with looped repeated layers, and KF_RELU_VARIANTS
//! replaces their list (KF_SILU_MATH's syntax; the math part is ignored, e.g. `packed,packed+wg`); KF_DUMP=DIR writes
//! each variant's source and sm_90 cubin there first (the models KF_MODEL selects; NVRTC only,
//! for cuobjdump/nvdisasm; no GPU needed). KF_FULL_ONLY=1 compiles the optimised kernel before the
//! first call (Tiering::FullOnly), so that every launch is of the timed kernel (for ncu).
//!
//! A binary (not an example) so that it can be packed with the release binaries for a GPU machine.

#![forbid(unsafe_code)]

use std::io::Write;

use kfuse::mlp::testing::{write_model, ModelSpec};
use kfuse::mlp::{
    emit_kernel, ActivationMath, ChunkOrder, CompileEffort, HiddenAccumulator, MlpKernelOptions, MlpModel,
    RepeatedLayers, TensorInstructions, Tiering,
};
use kfuse_cli::mlp_bench::{bench_gpu, BenchOptions};

/// One kernel variant; `None` = the generator's default.
#[derive(Clone, Copy, Debug)]
struct Variant {
    warps: Option<u32>,
    rows: Option<u32>,
    math: ActivationMath,
    effort: CompileEffort,
    repeated: RepeatedLayers,
    acc: HiddenAccumulator,
    order: ChunkOrder,
    tensor: TensorInstructions,
}

impl Variant {
    /// The generator's defaults with `repeated`.
    fn default_with(repeated: RepeatedLayers) -> Self {
        let d = MlpKernelOptions::default();
        Variant {
            warps: None,
            rows: None,
            math: d.activation_math,
            effort: d.compile_effort,
            repeated,
            acc: d.hidden_accumulator,
            order: d.chunk_order,
            tensor: d.tensor_instructions,
        }
    }

    /// `MlpKernelOptions` for it.
    fn options(&self) -> MlpKernelOptions {
        MlpKernelOptions {
            activation_math: self.math,
            warps: self.warps,
            row_tiles_per_warp: self.rows,
            compile_effort: self.effort,
            repeated_layers: self.repeated,
            hidden_accumulator: self.acc,
            chunk_order: self.order,
            tensor_instructions: self.tensor,
            ..MlpKernelOptions::default()
        }
    }

    /// Warps, row tiles and [`Self::forms`], for tables.
    fn label(&self) -> String {
        format!(
            "w{} r{} {}",
            self.warps.map_or("-".into(), |w| w.to_string()),
            self.rows.map_or("-".into(), |r| r.to_string()),
            self.forms()
        )
    }

    /// The math and every option that differs from the default, e.g. `Packed Loop acc16`.
    fn forms(&self) -> String {
        let mut l = format!("{:?}", self.math);
        for (on, tag) in [
            (self.effort != CompileEffort::Full, format!(" {:?}", self.effort)),
            (self.repeated != RepeatedLayers::Unrolled, format!(" {:?}", self.repeated)),
            (self.acc != HiddenAccumulator::F32, " acc16".to_string()),
            (self.order == ChunkOrder::Pipelined, " pipe".to_string()),
            (self.tensor == TensorInstructions::Wgmma, " wg".to_string()),
        ] {
            if on {
                l.push_str(&tag);
            }
        }
        l
    }
}

/// (name, widths, hidden activation, biases, variants) of one benchmark model.
type ModelCase = (&'static str, Vec<usize>, &'static str, bool, Vec<Variant>);

/// One KF_SILU_MATH entry: `MATH[@W][/R][+acc16][+pipe][+wg]` (see the module docs).
fn parse_variant(entry: &str) -> Result<Variant, String> {
    let mut parts = entry.trim().split('+');
    let head = parts.next().unwrap_or_default();
    let mut v = Variant::default_with(RepeatedLayers::Unrolled);
    for suffix in parts {
        match suffix {
            "acc16" => v.acc = HiddenAccumulator::F16,
            "pipe" => v.order = ChunkOrder::Pipelined,
            "wg" => v.tensor = TensorInstructions::Wgmma,
            other => return Err(format!("KF_SILU_MATH: unknown suffix `+{other}` in `{entry}` (acc16, pipe, wg)")),
        }
    }
    let (head, rows) = head.split_once('/').map_or((head, None), |(e, r)| (e, Some(r)));
    let (math, warps) = head.split_once('@').map_or((head, None), |(m, w)| (m, Some(w)));
    let number = |v: Option<&str>, what: &str| {
        v.map(|v| v.parse::<u32>().map_err(|e| format!("KF_SILU_MATH: {what} in `{entry}`: {e}"))).transpose()
    };
    v.warps = number(warps, "warps")?;
    v.rows = number(rows, "row tiles")?;
    v.math = parse_math(math)?;
    Ok(v)
}

/// One SiLU math variant by name (see the module docs).
fn parse_math(name: &str) -> Result<ActivationMath, String> {
    match name {
        "packed" => Ok(ActivationMath::Packed),
        "tanhf32" => Ok(ActivationMath::TanhF32),
        "f32" => Ok(ActivationMath::F32),
        _ => name
            .strip_prefix("fma")
            .and_then(|n| n.parse::<u8>().ok())
            .map(|eighths| ActivationMath::PackedFma { eighths })
            .ok_or_else(|| format!("KF_SILU_MATH: unknown variant `{name}` (packed, tanhf32, f32, fma0..fma8)")),
    }
}

/// Writes the model's source and sm_90 cubin for each variant into `dir`.
fn dump(
    dir: &std::path::Path,
    name: &str,
    model: &MlpModel,
    variants: &[Variant],
) -> Result<(), Box<dyn std::error::Error>> {
    std::fs::create_dir_all(dir)?;
    for (n, v) in variants.iter().enumerate() {
        let kernel = emit_kernel(model, &v.options())?;
        let mut opts = kfuse::runtime::CompileOptions::for_arch(kernel.target(kfuse::runtime::Arch::new(9, 0)));
        opts.extra = kernel.nvrtc_options.clone();
        opts.extra.push("--ptxas-options=-v".to_string());
        let m = kfuse::runtime::compile(&kernel.source, &opts)?;
        let stem = format!(
            "{name}_{n}_w{}_r{}_{}",
            kernel.warps,
            kernel.row_tiles_per_warp,
            v.forms().replace(' ', "_").replace(['{', '}', ':', ','], "")
        );
        std::fs::write(dir.join(format!("{stem}.cu")), &kernel.source)?;
        std::fs::write(dir.join(format!("{stem}.cubin")), &m.cubin)?;
        let regs = m
            .log
            .lines()
            .filter(|l| l.contains("registers") || l.contains("spill"))
            .map(str::trim)
            .collect::<Vec<_>>()
            .join(" ");
        println!("dumped {stem}: {regs}");
    }
    Ok(())
}

/// A scratch folder under the system's temporary folder, removed when dropped.
struct ScratchDir(std::path::PathBuf);

impl ScratchDir {
    fn new() -> std::io::Result<ScratchDir> {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("kfuse-mlp-tune-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&path)?;
        Ok(ScratchDir(path))
    }
    fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let silu: Vec<Variant> = std::env::var("KF_SILU_MATH")
        .unwrap_or_else(|_| "packed,fma1,fma2,fma3,fma4,packed".to_string())
        .split(',')
        .map(parse_variant)
        .collect::<Result<_, _>>()?;
    use RepeatedLayers::{Loop, Unrolled};
    let d = Variant::default_with(Unrolled);
    let looped = Variant::default_with(Loop);
    let tiering =
        if std::env::var("KF_FULL_ONLY").is_ok_and(|v| v == "1") { Tiering::FullOnly } else { Tiering::Background };
    let mut relu =
        if std::env::var("KF_LOOP").is_ok_and(|v| v == "1") { vec![d, looped, d, looped] } else { vec![d, d] };
    if let Ok(list) = std::env::var("KF_RELU_VARIANTS") {
        relu = list.split(',').map(parse_variant).collect::<Result<_, _>>()?;
    }
    let models: [ModelCase; 3] = [
        ("mlp64x4_relu", vec![64, 64, 64, 64, 64, 16], "relu", false, relu.clone()),
        ("mlp128x4_relu", vec![64, 128, 128, 128, 128, 16], "relu", false, relu),
        ("mlp_silu_bias", vec![32, 64, 128, 96, 64, 32, 16], "silu", true, silu),
    ];
    let only = std::env::var("KF_MODEL").ok();
    if let Ok(d) = std::env::var("KF_DUMP") {
        let tmp = ScratchDir::new()?;
        for (name, widths, act, bias, variants) in &models {
            if only.as_deref().is_some_and(|o| o != *name) {
                continue;
            }
            let spec = ModelSpec { with_bias: *bias, ..ModelSpec::new(widths, act) };
            dump(std::path::Path::new(&d), name, &MlpModel::load(write_model(tmp.path(), name, &spec)?)?, variants)?;
        }
    }
    let gpu = match kfuse::runtime::open_default() {
        Ok(g) => g,
        Err(e) => {
            println!("SKIPPED: no GPU ({e})");
            return Ok(());
        }
    };
    let mut out = match std::env::args().nth(1) {
        Some(p) => Some(std::fs::File::create(p)?),
        None => None,
    };
    let tmp = ScratchDir::new()?;
    let dir = match std::env::args().nth(2) {
        Some(d) => {
            std::fs::create_dir_all(&d)?;
            std::path::PathBuf::from(d)
        }
        None => tmp.path().to_path_buf(),
    };
    let mut table = Vec::new();
    for (name, widths, act, bias, variants) in models {
        if only.as_deref().is_some_and(|o| o != name) {
            continue;
        }
        let mut spec = ModelSpec::new(&widths, act);
        spec.with_bias = bias;
        let model = MlpModel::load(write_model(&dir, name, &spec)?)?;
        for v in variants {
            let opts = BenchOptions { tiering, kernel: Some(v.options()), ..BenchOptions::default() };
            let label = format!("{name} {}", v.label());
            match bench_gpu(&gpu, &model, &opts) {
                Ok(rep) => {
                    let line = format!(
                        "{label:60} {:2}x{:2} {:8.4} ms {:6.1} TF/s {:5.0} GB/s first {:6.0} ms rel {:.2e} worst row {:.2e} nonfinite {}",
                        rep.warps_per_block.unwrap_or(0),
                        rep.rows_per_warp.unwrap_or(0) / 16,
                        rep.kernel_ms_median,
                        rep.tflops,
                        rep.gbps,
                        rep.first_call_ms,
                        rep.check.rel_err,
                        rep.check.worst_row_rel_err,
                        rep.check.non_finite
                    );
                    println!("{line}");
                    table.push(line);
                    if let Some(f) = out.as_mut() {
                        writeln!(f, "{}", serde_json::json!({"variant": label, "report": rep}))?;
                    }
                }
                Err(e) => {
                    println!("{label:60} FAILED: {e}");
                    table.push(format!("{label:60} FAILED: {e}"));
                }
            }
        }
    }
    println!("\n{}", table.join("\n"));
    Ok(())
}
