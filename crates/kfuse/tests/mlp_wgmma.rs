//! Hidden layers on wgmma (TensorInstructions::Wgmma, sm_90a): which layers take it (pure), that
//! the kernels compile for sm_90a without ptxas serialising or waiting on the asynchronous
//! products (NVRTC tier: its C7515-C7520 "Potential Performance Loss" notes), and that they match
//! the CPU interpreter (GPU tier, fresh random data, outputs poisoned; widths 16 to 256 including
//! padded ones and odd 16-column chunk counts, depths 1 to 8, bias or not, f16 and bf16 weights,
//! f32/f16/bf16 I/O, batches 1 to 20001 so that warps of a warpgroup run past the batch).

use kfuse::mlp::prepare_with;
use kfuse_ir::{DType, HostTensor};
use kfuse_mlp::testing::{random_input, write_model, ModelSpec, Numerics, Rng};

const PLAIN: Numerics = Numerics { f16_accumulator: false };
use kfuse_mlp::{
    compare_rows, emit_kernel, evaluate_cpu, ActivationMath, HiddenAccumulator, MlpKernelOptions, MlpModel,
    TensorInstructions,
};
use kfuse_runtime::testing::{gpu_or_skip, nvrtc_or_skip};
use kfuse_runtime::{compile, Arch, CompileOptions};

fn model(
    dir: &std::path::Path,
    name: &str,
    widths: &[usize],
    act: &str,
    dtype: DType,
    bias: bool,
    seed: u64,
) -> MlpModel {
    let mut spec = ModelSpec::new(widths, act);
    spec.dtype = dtype;
    spec.with_bias = bias;
    spec.seed = seed;
    MlpModel::load(write_model(dir, name, &spec).expect("write")).expect("load")
}

fn wg(opts: MlpKernelOptions) -> MlpKernelOptions {
    MlpKernelOptions { tensor_instructions: TensorInstructions::Wgmma, ..opts }
}

/// (widths, activation, weight dtype, input dtype, output dtype, bias, row tiles per warp)
type Case = (Vec<usize>, &'static str, DType, DType, DType, bool, Option<u32>);

/// Whether `source` has wgmma hidden layers (either form).
fn has_wgmma_layers(source: &str) -> bool {
    source.contains("    kf_hidden_layer_wg<") || source.contains("    kf_wg_issue<")
}

fn cases() -> Vec<Case> {
    use DType::*;
    vec![
        (vec![32, 64, 128, 96, 64, 32, 16], "silu", F16, F16, F16, true, Some(2)),
        (vec![32, 64, 128, 96, 64, 32, 16], "silu", F16, F16, F16, true, None),
        (vec![64, 64, 64, 64, 64, 16], "relu", F16, F16, F16, false, None),
        (vec![64, 128, 128, 128, 128, 16], "relu", BF16, BF16, BF16, false, None),
        (vec![16, 16], "none", F16, F16, F16, true, None),
        (vec![24, 24, 24, 5], "relu", BF16, BF16, F32, true, None),
        (vec![100, 100, 100, 100, 3], "gelu", F16, F32, F32, true, None),
        (vec![256, 256, 7], "tanh", F16, F16, F32, true, None),
        (vec![24, 16, 16, 16, 16, 16, 16, 16, 24], "silu", BF16, BF16, F16, true, None),
        (vec![3, 17, 1], "x * sigmoid(1.702 * x)", BF16, F32, BF16, true, None),
        (vec![40, 48, 80, 112, 9], "silu", F16, F16, F16, false, Some(2)),
        (vec![40, 48, 80, 112, 9], "silu", F16, F16, F16, false, None),
    ]
}

/// Cases with a share of SiLU pairs on the FMA pipe: (widths, eighths, row tiles per warp).
fn fma_cases() -> Vec<(Vec<usize>, u8, Option<u32>)> {
    vec![
        (vec![32, 64, 128, 96, 64, 32, 16], 2, None),
        (vec![32, 64, 128, 96, 64, 32, 16], 1, Some(1)),
        (vec![3, 24, 100, 5], 3, Some(1)),
    ]
}

#[test]
fn wgmma_takes_the_f32_hidden_layers_only() {
    let dir = tempfile::tempdir().expect("tempdir");
    let m = model(dir.path(), "silu", &[32, 64, 128, 96, 64, 32, 16], "silu", DType::F16, true, 1);
    let k = emit_kernel(&m, &wg(MlpKernelOptions { row_tiles_per_warp: Some(2), ..MlpKernelOptions::default() }))
        .expect("emit");
    // Two row tiles per warp: the row form, two issues per hidden layer.
    assert_eq!(k.row_tiles_per_warp, 2);
    assert_eq!(k.source.matches("    kf_wg_issue<").count(), 10, "every hidden layer, both row tiles");
    assert_eq!(k.source.matches("    kf_wg_act<").count(), 10);
    assert!(!k.source.contains("    kf_hidden_layer_wg<"));
    for n in [32, 64, 96, 128] {
        assert!(k.source.contains(&format!("struct KfWgmma<{n}> {{")), "KfWgmma<{n}>");
    }
    // SiLU (on the SFU) by default: one row tile per warp, 16 warps, the chunked form.
    let chunked = emit_kernel(&m, &wg(MlpKernelOptions::default())).expect("emit");
    assert_eq!((chunked.row_tiles_per_warp, chunked.warps), (1, 16));
    assert_eq!(chunked.source.matches("    kf_hidden_layer_wg<").count(), 5, "every hidden layer");
    assert!(!chunked.source.contains("    kf_wg_issue<"));
    assert!(k.source.contains("#define KF_WGMMA 1") && k.source.contains("kf_output_layer<"));
    assert_eq!(k.arch, Some(kfuse_mlp::WGMMA_ARCH));
    assert_eq!(k.warps % 4, 0, "warpgroups");
    let plain = emit_kernel(&m, &MlpKernelOptions::default()).expect("emit");
    assert!(plain.source.contains("#define KF_WGMMA 0") && !plain.source.contains("kf_hidden_layer_wg"));
    assert_eq!(plain.arch, None);
    assert_eq!(k.params, plain.params, "one parameter blob for both (the generic fast form reads it)");
    // f16 accumulators keep mma.sync: no wgmma layer is left, so no sm_90a either.
    let acc16 = emit_kernel(
        &m,
        &wg(MlpKernelOptions { hidden_accumulator: HiddenAccumulator::F16, ..MlpKernelOptions::default() }),
    )
    .expect("emit");
    assert!(acc16.source.contains("#define KF_WGMMA 0") && acc16.arch.is_none());
    // A share of SiLU on the FMA pipe reaches the wgmma activations (both forms).
    let fma = emit_kernel(
        &m,
        &wg(MlpKernelOptions {
            activation_math: ActivationMath::PackedFma { eighths: 2 },
            row_tiles_per_warp: Some(2),
            ..MlpKernelOptions::default()
        }),
    )
    .expect("emit");
    assert_eq!(fma.source.matches("KfAct0, 2>(kf_d0_").count(), 2, "row form: both row tiles of layer 0");
    let fma1 = emit_kernel(
        &m,
        &wg(MlpKernelOptions {
            activation_math: ActivationMath::PackedFma { eighths: 2 },
            row_tiles_per_warp: Some(1),
            ..MlpKernelOptions::default()
        }),
    )
    .expect("emit");
    assert_eq!(fma1.source.matches(", 2>(h").count(), 5, "chunked form: every hidden layer");
    // ReLU: the row form by default.
    let relu = model(dir.path(), "relu", &[64, 128, 128, 128, 128, 16], "relu", DType::F16, false, 2);
    let kr = emit_kernel(&relu, &wg(MlpKernelOptions::default())).expect("emit");
    assert_eq!(kr.row_tiles_per_warp, 2);
    assert_eq!(kr.source.matches("    kf_wg_issue<").count(), 8);
    // The tuning per device: wgmma and one eighth of SiLU on the FMA pipe on compute capability 9.0 only.
    let h100 = MlpKernelOptions::tuned_for(Arch::new(9, 0));
    assert_eq!(
        (h100.tensor_instructions, h100.activation_math),
        (TensorInstructions::Wgmma, ActivationMath::PackedFma { eighths: 1 })
    );
    assert_eq!(MlpKernelOptions::tuned_for(Arch::new(8, 0)), MlpKernelOptions::default());
    assert_eq!(MlpKernelOptions::tuned_for(Arch::new(10, 0)), MlpKernelOptions::default());
    // Warps must form warpgroups.
    let err =
        emit_kernel(&m, &wg(MlpKernelOptions { warps: Some(6), ..MlpKernelOptions::default() })).expect_err("6 warps");
    assert!(err.to_string().contains("multiple of 4"), "{err}");
}

#[test]
fn wgmma_kernels_compile_for_sm90a_without_serialisation() {
    if nvrtc_or_skip("wgmma_kernels_compile_for_sm90a_without_serialisation").is_none() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    for (n, (widths, act, wdtype, input, output, bias, rows)) in cases().into_iter().enumerate() {
        let m = model(dir.path(), &format!("c{n}"), &widths, act, wdtype, bias, n as u64);
        let k = emit_kernel(
            &m,
            &wg(MlpKernelOptions {
                in_dtype: input,
                out_dtype: output,
                row_tiles_per_warp: rows,
                ..MlpKernelOptions::default()
            }),
        )
        .expect("emit");
        let mut opts = CompileOptions::for_arch(k.target(Arch::new(9, 0)));
        opts.extra = k.nvrtc_options.clone();
        opts.extra.push("--ptxas-options=-v".to_string());
        let out = compile(&k.source, &opts).unwrap_or_else(|e| panic!("{} failed to compile: {e}", m.summary()));
        let notes: Vec<&str> =
            out.log.lines().filter(|l| l.contains("Potential Performance Loss") || l.contains("is injected")).collect();
        let regs = out
            .log
            .lines()
            .filter(|l| l.contains("registers") || l.contains("spill"))
            .map(str::trim)
            .collect::<Vec<_>>()
            .join(" ");
        let form = if k.source.contains("    kf_wg_issue<") { "row form" } else { "chunked form" };
        println!("{}: {} warps x {} row tiles, {form}; {regs}", m.summary(), k.warps, k.row_tiles_per_warp);
        // The MLP benchmark models must get the schedule as written; for others (e.g. an erf
        // activation's temporaries at 112 columns) ptxas may add waits, which costs speed only.
        if n < 4 {
            assert!(notes.is_empty(), "{}: ptxas serialises or waits on wgmma:\n{}", m.summary(), notes.join("\n"));
        } else if !notes.is_empty() {
            println!("  ptxas notes (speed only): {}", notes.join(" | "));
        }
    }
}

#[test]
fn wgmma_kernels_match_cpu_interpreter() {
    let Some(gpu) = gpu_or_skip("wgmma_kernels_match_cpu_interpreter") else { return };
    if gpu.compile_arch() != Arch::new(9, 0) {
        println!("SKIPPED: wgmma needs a compute capability 9.0 GPU, this one is {}", gpu.compile_arch());
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut rng, _) = Rng::from_time();
    let plain = cases().into_iter().map(|c| (c, ActivationMath::Packed));
    let fma = fma_cases().into_iter().map(|(w, q, t)| {
        ((w, "silu", DType::F16, DType::F16, DType::F16, true, t), ActivationMath::PackedFma { eighths: q })
    });
    for (n, ((widths, act, wdtype, input, output, bias, tiles), math)) in plain.chain(fma).enumerate() {
        let m = model(dir.path(), &format!("g{n}"), &widths, act, wdtype, bias, rng.next_u64());
        let opts = wg(MlpKernelOptions {
            in_dtype: input,
            out_dtype: output,
            shared_limit: gpu.max_shared_bytes(),
            row_tiles_per_warp: tiles,
            activation_math: math,
            ..MlpKernelOptions::default()
        });
        let (prepared, _) = prepare_with(&gpu, &m, &opts).expect("prepare");
        assert!(
            prepared.kernel().is_some_and(|k| has_wgmma_layers(&k.source) == (widths.len() > 2)),
            "{}: wgmma layers",
            m.summary()
        );
        for rows in [1usize, 127, 128, 129, 1023, 20001] {
            let x = random_input(input, rows, m.input_width(), &mut rng);
            let xb = gpu.upload(&x.to_bytes()).expect("upload");
            let out_w = m.output_width();
            let y = gpu.alloc_zeroed(rows * out_w * output.size_bytes()).expect("alloc");
            gpu.fill(&y, 0xff).expect("poison");
            prepared.launch(&gpu, &xb, &y, rows).expect("launch");
            let got =
                HostTensor::from_bytes(output, vec![rows, out_w], &gpu.download(&y).expect("download")).expect("size");
            let want = evaluate_cpu(&m, &x).expect("cpu");
            let e = compare_rows(&got.to_f64(), &want, out_w);
            println!(
                "{} r{tiles:?} {math:?} io {input}->{output} rows {rows}: rel {:.2e} worst row {:.2e} (row {})",
                m.summary(),
                e.rel_err,
                e.worst_row_rel_err,
                e.worst_row
            );
            let what = format!("{} rows {rows}", m.summary());
            kfuse_mlp::testing::check_16bit(&m, &x, &got.to_f64(), &want, output, PLAIN, &what)
                .unwrap_or_else(|why| panic!("{why}"));
        }
    }
}
