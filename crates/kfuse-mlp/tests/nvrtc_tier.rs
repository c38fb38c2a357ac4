//! NVRTC tier: generated kernels for several shapes and dtypes compile for sm_80 and sm_90
//! (runs where libnvrtc loads; prints SKIPPED otherwise). Most template bugs surface here.

use kfuse_ir::DType;
use kfuse_mlp::testing::{write_model, ModelSpec};
use kfuse_mlp::{emit_kernel, emit_tiled, MlpKernelOptions, MlpModel};
use kfuse_runtime::{compile, testing::nvrtc_or_skip, Arch, CompileOptions};

fn model(dir: &std::path::Path, name: &str, widths: &[usize], act: &str, dtype: DType, bias: bool) -> MlpModel {
    let mut spec = ModelSpec::new(widths, act);
    spec.dtype = dtype;
    spec.with_bias = bias;
    let path = write_model(dir, name, &spec).expect("write model");
    MlpModel::load(path).expect("load model")
}

fn compile_both(source: &str, extra: &[String], what: &str) {
    for arch in [Arch::new(8, 0), Arch::new(9, 0)] {
        let t = std::time::Instant::now();
        let mut opts = CompileOptions::for_arch(arch);
        opts.extra = extra.to_vec();
        if std::env::var("KF_PTXAS_V").is_ok() {
            opts.extra.push("--ptxas-options=-v".to_string());
        }
        let out = compile(source, &opts);
        match out {
            Ok(m) => {
                println!(
                    "{what} {arch}: {} bytes cubin in {:.0} ms; log: {}",
                    m.cubin.len(),
                    t.elapsed().as_secs_f64() * 1e3,
                    m.log.trim()
                );
                assert!(!m.cubin.is_empty());
            }
            Err(e) => panic!("{what} failed to compile for {arch}: {e}\n--- source ---\n{source}"),
        }
    }
}

#[test]
fn fused_kernels_compile_for_sm80_and_sm90() {
    if nvrtc_or_skip("fused_kernels_compile_for_sm80_and_sm90").is_none() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let acts = std::env::var("KF_TEST_ACT").unwrap_or_else(|_| "relu".to_string());
    use kfuse_mlp::{
        ActivationMath::PackedFma, ActivationMath::PackedFmaBalanced, ActivationMath::TanhF32, ActivationMath::F32,
        CompileEffort::Reduced, RepeatedLayers::Loop,
    };
    use kfuse_mlp::{ChunkOrder::Pipelined, HiddenAccumulator::F16 as F16Acc};
    let base = MlpKernelOptions::default();
    // (name, widths, activation, weight dtype, in, out, bias, kernel choices)
    type Case<'a> = (&'a str, Vec<usize>, &'a str, DType, DType, DType, bool, MlpKernelOptions);
    let cases: Vec<Case> = vec![
        ("bench1", vec![64, 64, 64, 64, 64, 16], &acts, DType::F16, DType::F16, DType::F16, false, base.clone()),
        ("bench2", vec![64, 128, 128, 128, 128, 16], &acts, DType::F16, DType::F16, DType::F16, false, base.clone()),
        ("bench3", vec![32, 64, 128, 96, 64, 32, 16], "silu", DType::F16, DType::F16, DType::F16, true, base.clone()),
        (
            "bench3-bias-pairs",
            vec![32, 64, 128, 96, 64, 32, 16],
            "silu",
            DType::F16,
            DType::F16,
            DType::F16,
            true,
            MlpKernelOptions { bias_operand: kfuse_mlp::BiasOperand::Pairs, ..base.clone() },
        ),
        (
            "odd-bias-pairs-bf16",
            vec![3, 24, 100, 5],
            "gelu",
            DType::BF16,
            DType::F32,
            DType::F16,
            true,
            MlpKernelOptions { bias_operand: kfuse_mlp::BiasOperand::Pairs, repeated_layers: Loop, ..base.clone() },
        ),
        (
            "bench3-f32math",
            vec![32, 64, 128, 96, 64, 32, 16],
            "silu",
            DType::F16,
            DType::F16,
            DType::F16,
            true,
            MlpKernelOptions { activation_math: F32, ..base.clone() },
        ),
        (
            "bench1-16w",
            vec![64, 64, 64, 64, 64, 16],
            "relu",
            DType::F16,
            DType::F16,
            DType::F16,
            false,
            MlpKernelOptions { warps: Some(16), row_tiles_per_warp: Some(2), ..base.clone() },
        ),
        (
            "bench1-loop",
            vec![64, 64, 64, 64, 64, 16],
            "relu",
            DType::F16,
            DType::F16,
            DType::F16,
            false,
            MlpKernelOptions { repeated_layers: Loop, ..base.clone() },
        ),
        (
            "bench2-loop",
            vec![64, 128, 128, 128, 128, 16],
            "relu",
            DType::F16,
            DType::F16,
            DType::F16,
            false,
            MlpKernelOptions { repeated_layers: Loop, ..base.clone() },
        ),
        (
            "deep16-loop-silu",
            vec![24, 16, 16, 16, 16, 16, 24],
            "silu",
            DType::BF16,
            DType::F16,
            DType::F32,
            true,
            MlpKernelOptions { repeated_layers: Loop, activation_math: TanhF32, ..base.clone() },
        ),
        (
            "bench3-tanhf32",
            vec![32, 64, 128, 96, 64, 32, 16],
            "silu",
            DType::F16,
            DType::F16,
            DType::F16,
            true,
            MlpKernelOptions { activation_math: TanhF32, ..base.clone() },
        ),
        (
            "bench3-fma2",
            vec![32, 64, 128, 96, 64, 32, 16],
            "silu",
            DType::F16,
            DType::F16,
            DType::F16,
            true,
            MlpKernelOptions { activation_math: PackedFma { eighths: 2 }, ..base.clone() },
        ),
        (
            "bench3-fma8",
            vec![32, 64, 128, 96, 64, 32, 16],
            "silu",
            DType::F16,
            DType::F16,
            DType::F16,
            true,
            MlpKernelOptions { activation_math: PackedFma { eighths: 8 }, ..base.clone() },
        ),
        (
            "bench3-fma-balanced",
            vec![32, 64, 128, 96, 64, 32, 16],
            "silu",
            DType::F16,
            DType::F16,
            DType::F16,
            true,
            MlpKernelOptions { activation_math: PackedFmaBalanced, ..base.clone() },
        ),
        (
            "deep16-loop-fma",
            vec![24, 16, 16, 16, 16, 16, 24],
            "silu",
            DType::F16,
            DType::F32,
            DType::F16,
            true,
            MlpKernelOptions { repeated_layers: Loop, activation_math: PackedFma { eighths: 3 }, ..base.clone() },
        ),
        (
            "odd-silu-fma-bf16",
            vec![3, 24, 100, 5],
            "silu",
            DType::BF16,
            DType::F32,
            DType::F32,
            true,
            MlpKernelOptions { activation_math: PackedFmaBalanced, ..base.clone() },
        ),
        (
            "bench3-acc16",
            vec![32, 64, 128, 96, 64, 32, 16],
            "silu",
            DType::F16,
            DType::F16,
            DType::F16,
            true,
            MlpKernelOptions { hidden_accumulator: F16Acc, ..base.clone() },
        ),
        (
            "bench3-acc16-12w",
            vec![32, 64, 128, 96, 64, 32, 16],
            "silu",
            DType::F16,
            DType::F16,
            DType::F16,
            true,
            MlpKernelOptions { hidden_accumulator: F16Acc, warps: Some(12), ..base.clone() },
        ),
        (
            "deep16-loop-acc16",
            vec![24, 16, 16, 16, 16, 16, 24],
            "silu",
            DType::F16,
            DType::F32,
            DType::F16,
            true,
            MlpKernelOptions { hidden_accumulator: F16Acc, repeated_layers: Loop, ..base.clone() },
        ),
        (
            "odd-relu-acc16",
            vec![3, 24, 100, 5],
            "relu",
            DType::F16,
            DType::F32,
            DType::F32,
            true,
            MlpKernelOptions { hidden_accumulator: F16Acc, ..base.clone() },
        ),
        (
            "bench3-pipe",
            vec![32, 64, 128, 96, 64, 32, 16],
            "silu",
            DType::F16,
            DType::F16,
            DType::F16,
            true,
            MlpKernelOptions { chunk_order: Pipelined, ..base.clone() },
        ),
        (
            "odd-gelu-pipe-pairs-bf16",
            vec![3, 24, 100, 5],
            "gelu",
            DType::BF16,
            DType::F32,
            DType::F16,
            true,
            MlpKernelOptions { chunk_order: Pipelined, bias_operand: kfuse_mlp::BiasOperand::Pairs, ..base.clone() },
        ),
        (
            "bench2-fastcompile",
            vec![64, 128, 128, 128, 128, 16],
            "relu",
            DType::F16,
            DType::F16,
            DType::F16,
            false,
            MlpKernelOptions { compile_effort: Reduced, ..base.clone() },
        ),
        ("odd", vec![3, 24, 100, 5], &acts, DType::BF16, DType::F32, DType::F32, true, base.clone()),
        ("odd-silu", vec![3, 24, 100, 5], "silu", DType::F16, DType::F32, DType::F32, true, base.clone()),
        ("bf16-silu", vec![24, 40, 24], "silu", DType::BF16, DType::BF16, DType::F32, true, base.clone()),
        ("gelu", vec![16, 40, 24], "gelu", DType::F16, DType::F16, DType::F32, true, base.clone()),
        ("w256", vec![256, 256, 32], &acts, DType::BF16, DType::BF16, DType::BF16, true, base.clone()),
        ("one", vec![16, 1], &acts, DType::F16, DType::BF16, DType::F16, true, base.clone()),
        ("mixed", vec![24, 16, 24], &acts, DType::F16, DType::BF16, DType::BF16, false, base.clone()),
    ];
    for (name, widths, act, wd, ind, outd, bias, kopts) in cases {
        let m = model(dir.path(), name, &widths, act, wd, bias);
        let k = emit_kernel(&m, &MlpKernelOptions { in_dtype: ind, out_dtype: outd, ..kopts }).expect("emit");
        println!(
            "{name}: warps {} rows/warp {} shared {} fast {} options {:?}",
            k.warps, k.rows_per_warp, k.shared_bytes, k.fast_input, k.nvrtc_options
        );
        compile_both(&k.source, &k.nvrtc_options, name);
    }
    let m = model(dir.path(), "tiled", &[40, 256, 256, 256, 7], &acts, DType::F16, true);
    match emit_kernel(&m, &MlpKernelOptions::default()) {
        Ok(k) => panic!("three 256-wide layers (288 KiB of f16 weights) should not fit; got {} bytes", k.shared_bytes),
        Err(err) => assert!(err.to_string().contains("shared memory"), "{err}"),
    }
    let plan = emit_tiled(&m, DType::F32, DType::F16, "test").expect("tiled");
    for l in &plan.layers {
        compile_both(&l.source, &[], "tiled layer");
    }
}
