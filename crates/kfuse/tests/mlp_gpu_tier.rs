//! GPU tier: the fused kernel (and the tiled fallback) against the CPU interpreter path on fresh
//! random data, outputs poisoned before each run (run_gpu fills them with 0xFF = NaN), for widths
//! 16, 24, 64, 100, 128, 256, depths 1..8, batches 1, 127, 128, 129 (2^21 for one model is
//! in the CLI's `mlp_bench` tests), f16 and bf16 weights and f32/f16/bf16 I/O. Prints each case's
//! per-row worst relative error; the repeated-layer loop, the f32 SiLU forms and the FMA-pipe
//! SiLU form (ActivationMath::PackedFma) and a 12-warp SiLU kernel
//! (168-register cap) through prepare_with. Skips without a GPU unless KFUSE_REQUIRE_GPU=1.

use kfuse::mlp::{prepare, prepare_with, run_gpu};
use kfuse_ir::{DType, HostTensor};
use kfuse_mlp::testing::{random_input, write_model, ModelSpec, Rng};
use kfuse_mlp::{
    compare_rows, evaluate_cpu, ActivationMath, ChunkOrder, HiddenAccumulator, MlpKernelOptions, MlpModel,
    RepeatedLayers,
};
use kfuse_runtime::testing::gpu_or_skip;

struct Case {
    widths: Vec<usize>,
    act: &'static str,
    wdtype: DType,
    io: (DType, DType),
    bias: bool,
}

fn check_case(gpu: &kfuse_runtime::Gpu, dir: &std::path::Path, n: usize, case: &Case, rows: &[usize], rng: &mut Rng) {
    let mut spec = ModelSpec::new(&case.widths, case.act);
    spec.dtype = case.wdtype;
    spec.with_bias = case.bias;
    spec.seed = rng.next_u64();
    let model = MlpModel::load(write_model(dir, &format!("m{n}"), &spec).expect("write")).expect("load");
    for &r in rows {
        let x = random_input(case.io.0, r, model.input_width(), rng);
        let got = run_gpu(gpu, &model, &x, case.io.1).expect("run_gpu");
        let want = evaluate_cpu(&model, &x).expect("cpu");
        let e = compare_rows(&got.to_f64(), &want, model.output_width());
        println!(
            "{} io {}->{} rows {r}: rel {:.2e} max abs {:.2e} worst row {:.2e} (row {})",
            model.summary(),
            case.io.0,
            case.io.1,
            e.rel_err,
            e.max_abs_err,
            e.worst_row_rel_err,
            e.worst_row
        );
        let what = format!("{} rows {r}", model.summary());
        let plain = kfuse_mlp::testing::Numerics { f16_accumulator: false };
        kfuse_mlp::testing::check_16bit(&model, &x, &got.to_f64(), &want, case.io.1, plain, &what)
            .unwrap_or_else(|why| panic!("{why}"));
    }
}

#[test]
fn fused_mlp_matches_cpu_interpreter() {
    let Some(gpu) = gpu_or_skip("fused_mlp_matches_cpu_interpreter") else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut rng, _) = Rng::from_time();
    use DType::*;
    let cases = [
        Case { widths: vec![16, 16], act: "none", wdtype: F16, io: (F16, F16), bias: true },
        Case { widths: vec![24, 24, 24, 5], act: "relu", wdtype: BF16, io: (BF16, F32), bias: true },
        Case { widths: vec![64, 64, 64, 64, 64, 16], act: "relu", wdtype: F16, io: (F16, F16), bias: false },
        Case { widths: vec![100, 100, 100, 100, 3], act: "gelu", wdtype: F16, io: (F32, F32), bias: true },
        Case { widths: vec![64, 128, 128, 128, 128, 16], act: "relu", wdtype: BF16, io: (BF16, BF16), bias: false },
        Case { widths: vec![32, 64, 128, 96, 64, 32, 16], act: "silu", wdtype: F16, io: (F16, F16), bias: true },
        Case { widths: vec![256, 256, 7], act: "tanh", wdtype: F16, io: (F16, F32), bias: true },
        Case {
            widths: vec![24, 16, 16, 16, 16, 16, 16, 16, 24],
            act: "leaky_relu",
            wdtype: F16,
            io: (BF16, F16),
            bias: true,
        },
        Case { widths: vec![3, 17, 1], act: "x * sigmoid(1.702 * x)", wdtype: BF16, io: (F32, BF16), bias: true },
        Case { widths: vec![128, 64, 2], act: "softplus", wdtype: F16, io: (F16, F16), bias: true },
        Case { widths: vec![16, 24, 16], act: "gelu_tanh", wdtype: BF16, io: (F16, F32), bias: false },
    ];
    for (n, case) in cases.iter().enumerate() {
        check_case(&gpu, dir.path(), n, case, &[1, 127, 128, 129, 1023], &mut rng);
    }
}

#[test]
fn tiled_fallback_matches_cpu_interpreter() {
    let Some(gpu) = gpu_or_skip("tiled_fallback_matches_cpu_interpreter") else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut rng, _) = Rng::from_time();
    let mut spec = ModelSpec::new(&[40, 256, 256, 256, 7], "silu");
    spec.seed = rng.next_u64();
    let model = MlpModel::load(write_model(dir.path(), "wide", &spec).expect("write")).expect("load");
    let (prepared, _) = prepare(&gpu, &model, DType::F16, DType::F32).expect("prepare");
    let note = prepared.note().expect("this model must take the tiled path").to_string();
    println!("{note}");
    assert!(note.contains("tiled"));
    check_case(
        &gpu,
        dir.path(),
        99,
        &Case {
            widths: vec![40, 256, 256, 256, 7],
            act: "silu",
            wdtype: DType::F16,
            io: (DType::F16, DType::F32),
            bias: true,
        },
        &[1, 129, 255],
        &mut rng,
    );
}

#[test]
fn layer_loop_and_silu_forms_match_cpu_interpreter() {
    let Some(gpu) = gpu_or_skip("layer_loop_and_silu_forms_match_cpu_interpreter") else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut rng, _) = Rng::from_time();
    let loop_opts = |math| MlpKernelOptions {
        repeated_layers: RepeatedLayers::Loop,
        activation_math: math,
        ..MlpKernelOptions::default()
    };
    let acc16 = |o: MlpKernelOptions| MlpKernelOptions { hidden_accumulator: HiddenAccumulator::F16, ..o };
    let pipe = |o: MlpKernelOptions| MlpKernelOptions { chunk_order: ChunkOrder::Pipelined, ..o };
    let cases: [(Vec<usize>, &str, DType, bool, MlpKernelOptions); 18] = [
        (vec![64, 64, 64, 64, 64, 16], "relu", DType::F16, false, loop_opts(ActivationMath::Packed)),
        (vec![64, 128, 128, 128, 128, 16], "relu", DType::BF16, false, loop_opts(ActivationMath::Packed)),
        (vec![24, 16, 16, 16, 16, 16, 16, 24], "silu", DType::F16, true, loop_opts(ActivationMath::Packed)),
        (vec![32, 64, 128, 96, 64, 32, 16], "silu", DType::F16, true, loop_opts(ActivationMath::TanhF32)),
        // SiLU pairs on the FMA pipe (kf_silu_half_f16x2_fma): a share, all of them, per layer.
        (
            vec![32, 64, 128, 96, 64, 32, 16],
            "silu",
            DType::F16,
            true,
            loop_opts(ActivationMath::PackedFma { eighths: 3 }),
        ),
        (
            vec![32, 64, 128, 96, 64, 32, 16],
            "silu",
            DType::F16,
            true,
            loop_opts(ActivationMath::PackedFma { eighths: 8 }),
        ),
        (
            vec![24, 16, 16, 16, 16, 16, 16, 24],
            "silu",
            DType::F16,
            true,
            loop_opts(ActivationMath::PackedFma { eighths: 5 }),
        ),
        // bf16 in the loop.
        (vec![24, 16, 16, 16, 16, 16, 16, 24], "silu", DType::BF16, true, loop_opts(ActivationMath::Packed)),
        (
            vec![32, 64, 128, 96, 64, 32, 16],
            "silu",
            DType::F16,
            true,
            MlpKernelOptions { warps: Some(12), ..MlpKernelOptions::default() },
        ),
        // f16 accumulators (HiddenAccumulator::F16): unrolled at 8 and 12 warps and 3 row tiles,
        // in the loop, ReLU, padded widths; bf16 and the FMA share keep f32 (checked below).
        (vec![32, 64, 128, 96, 64, 32, 16], "silu", DType::F16, true, acc16(MlpKernelOptions::default())),
        (
            vec![32, 64, 128, 96, 64, 32, 16],
            "silu",
            DType::F16,
            true,
            acc16(MlpKernelOptions { warps: Some(12), ..MlpKernelOptions::default() }),
        ),
        (
            vec![32, 64, 128, 96, 64, 32, 16],
            "silu",
            DType::F16,
            true,
            acc16(MlpKernelOptions { row_tiles_per_warp: Some(3), ..MlpKernelOptions::default() }),
        ),
        (vec![24, 16, 16, 16, 16, 16, 16, 24], "silu", DType::F16, true, acc16(loop_opts(ActivationMath::Packed))),
        (vec![64, 128, 128, 128, 128, 16], "relu", DType::F16, true, acc16(loop_opts(ActivationMath::Packed))),
        (vec![3, 24, 100, 5], "silu", DType::F16, true, acc16(MlpKernelOptions::default())),
        (vec![3, 24, 100, 5], "silu", DType::BF16, true, acc16(MlpKernelOptions::default())),
        // Pipelined chunk order (ChunkOrder::Pipelined), padded widths.
        (vec![32, 64, 128, 96, 64, 32, 16], "silu", DType::F16, true, pipe(MlpKernelOptions::default())),
        (vec![3, 24, 100, 5], "silu", DType::F16, true, pipe(MlpKernelOptions::default())),
    ];
    for (n, (widths, act, dtype, bias, opts)) in cases.into_iter().enumerate() {
        let mut spec = ModelSpec::new(&widths, act);
        spec.dtype = dtype;
        spec.with_bias = bias;
        spec.seed = rng.next_u64();
        let model = MlpModel::load(write_model(dir.path(), &format!("l{n}"), &spec).expect("write")).expect("load");
        let opts = MlpKernelOptions { in_dtype: dtype, out_dtype: dtype, shared_limit: gpu.max_shared_bytes(), ..opts };
        let (prepared, _) = prepare_with(&gpu, &model, &opts).expect("prepare");
        let looped = opts.repeated_layers == RepeatedLayers::Loop;
        assert!(prepared.kernel().is_some_and(|k| !looped
            || !widths[1..].windows(2).any(|w| w[0] == w[1])
            || k.source.contains("kf_hidden_loop<")
            || k.source.contains("kf_hidden_loop_h<")));
        let f16_acc = opts.hidden_accumulator == HiddenAccumulator::F16 && dtype == DType::F16;
        assert!(
            prepared.kernel().is_some_and(|k| (k.source.contains("kf_hidden_layer_h<")
                || k.source.contains("kf_hidden_loop_h<"))
                == f16_acc),
            "f16 accumulators exactly when asked for and possible"
        );
        let pipelined = opts.chunk_order == ChunkOrder::Pipelined;
        assert!(
            prepared.kernel().is_some_and(|k| k.source.contains("kf_hidden_layer_p<") == pipelined),
            "the pipelined form exactly when asked for"
        );
        assert!(prepared.kernel().is_some_and(|k| k.source.contains("#define KF_BIAS_QUADS 1")));
        let fma_form = matches!(opts.activation_math, ActivationMath::PackedFma { eighths: 1.. });
        assert!(
            prepared.kernel().is_some_and(|k| k.source.contains("return kf_silu_half_f16x2_fma(lo, hi);") == fma_form),
            "the FMA form must be used exactly when asked for"
        );
        for rows in [1usize, 255, 1023] {
            let x = random_input(dtype, rows, model.input_width(), &mut rng);
            let xb = gpu.upload(&x.to_bytes()).expect("upload");
            let out_w = model.output_width();
            let y = gpu.alloc_zeroed(rows * out_w * dtype.size_bytes()).expect("alloc");
            gpu.fill(&y, 0xff).expect("poison");
            prepared.launch(&gpu, &xb, &y, rows).expect("launch");
            let got =
                HostTensor::from_bytes(dtype, vec![rows, out_w], &gpu.download(&y).expect("download")).expect("size");
            let want = evaluate_cpu(&model, &x).expect("cpu");
            let e = compare_rows(&got.to_f64(), &want, out_w);
            println!(
                "{} {:?} {:?} {:?} {:?} w{:?} r{:?} rows {rows}: rel {:.2e} worst row {:.2e} (row {})",
                model.summary(),
                opts.repeated_layers,
                opts.activation_math,
                opts.hidden_accumulator,
                opts.chunk_order,
                opts.warps,
                opts.row_tiles_per_warp,
                e.rel_err,
                e.worst_row_rel_err,
                e.worst_row
            );
            let numerics = kfuse_mlp::testing::Numerics { f16_accumulator: f16_acc };
            let what = format!("{} rows {rows}", model.summary());
            kfuse_mlp::testing::check_16bit(&model, &x, &got.to_f64(), &want, dtype, numerics, &what)
                .unwrap_or_else(|why| panic!("{why}"));
        }
    }
}
