//! Pure tests of the alternative hidden-layer forms (mlp_layer_forms.cuh): f16 accumulators
//! (`HiddenAccumulator::F16`) and the pipelined chunk order (`ChunkOrder::Pipelined`) appear in
//! the generated source exactly when asked for and applicable, the default source does not
//! change, and f16-accumulating layers get their biases as duplicated f16 pairs. The NVRTC and
//! GPU tiers compile and run these forms (nvrtc_tier.rs, gpu_tier.rs); the pipelined form with an
//! FMA share is compiled and run against the CPU interpreter here (NVRTC and GPU tiers, gated at
//! run time).

use half::f16;
use kfuse::mlp::prepare_with;
use kfuse_ir::DType;
use kfuse_ir::HostTensor;
use kfuse_mlp::testing::{check_16bit, random_input, Numerics, Rng};
use kfuse_mlp::testing::{write_model, ModelSpec};
use kfuse_mlp::{
    compare_rows, emit_kernel, evaluate_cpu, ActivationMath, ChunkOrder, HiddenAccumulator, MlpKernelOptions, MlpModel,
};
use kfuse_runtime::testing::{gpu_or_skip, nvrtc_or_skip};
use kfuse_runtime::{compile, Arch, CompileOptions};

fn load(dir: &std::path::Path, name: &str, widths: &[usize], dtype: DType) -> MlpModel {
    let spec = ModelSpec { dtype, ..ModelSpec::new(widths, "silu") };
    MlpModel::load(write_model(dir, name, &spec).expect("write")).expect("load")
}

fn acc16(o: MlpKernelOptions) -> MlpKernelOptions {
    MlpKernelOptions { hidden_accumulator: HiddenAccumulator::F16, ..o }
}

/// Lines of `src` that call `call` (e.g. `kf_hidden_layer_h<`).
fn calls<'a>(src: &'a str, call: &str) -> Vec<&'a str> {
    src.lines().map(str::trim_start).filter(|l| l.starts_with(call)).collect()
}

#[test]
fn layer_forms_appear_only_when_asked_for() {
    let dir = tempfile::tempdir().expect("tempdir");
    let widths = [32, 64, 128, 96, 64, 32, 16];
    let (f16_model, bf16_model) =
        (load(dir.path(), "f16", &widths, DType::F16), load(dir.path(), "bf16", &widths, DType::BF16));
    let emit = |m: &MlpModel, o: MlpKernelOptions| emit_kernel(m, &o).expect("emit").source;
    let pipe = |o: MlpKernelOptions| MlpKernelOptions { chunk_order: ChunkOrder::Pipelined, ..o };
    let d = MlpKernelOptions::default();
    assert_eq!((d.hidden_accumulator, d.chunk_order), (HiddenAccumulator::F32, ChunkOrder::Sequential));
    // The default: none of the alternative forms in the source.
    let default = emit(&f16_model, d.clone());
    assert!(!default.contains("kf_hidden_layer_h_at") && !default.contains("kf_hidden_layer_p"));
    assert_eq!(calls(&default, "kf_hidden_layer<").len(), 5);
    // f16 accumulators: every hidden layer of an f16 model; none of a bf16 model, none with an
    // FMA share (those keep f32, and the kernel is then the same as without the option).
    let h = emit(&f16_model, acc16(d.clone()));
    assert_eq!(calls(&h, "kf_hidden_layer_h<").len(), 5, "{h}");
    assert!(calls(&h, "kf_hidden_layer<").is_empty());
    assert_eq!(h.matches("return kf_silu_half_h2(h);").count(), 5);
    assert_eq!(emit(&bf16_model, acc16(d.clone())), emit(&bf16_model, d.clone()));
    let fma = MlpKernelOptions { activation_math: ActivationMath::PackedFma { eighths: 3 }, ..d.clone() };
    assert_eq!(emit(&f16_model, acc16(fma.clone())), emit(&f16_model, fma.clone()));
    // Pipelined: every hidden layer, with the FMA share as its last template argument.
    let p = emit(&f16_model, pipe(d.clone()));
    assert_eq!(calls(&p, "kf_hidden_layer_p<").len(), 5, "{p}");
    let pf = emit(&f16_model, pipe(fma.clone()));
    let pf_calls = calls(&pf, "kf_hidden_layer_p<");
    assert_eq!(pf_calls.len(), 5, "{pf}");
    assert!(pf_calls.iter().all(|c| c.contains(", 3>(h")), "{pf_calls:?}");
    assert!(pf.contains("return kf_silu_half_f16x2_fma(lo, hi);"));
    assert_ne!(pf, emit(&f16_model, fma));
    // Repeated layers in a loop: the f16 loop template.
    let deep = load(dir.path(), "deep", &[24, 16, 16, 16, 16, 24], DType::F16);
    let looped = MlpKernelOptions { repeated_layers: kfuse_mlp::RepeatedLayers::Loop, ..d };
    let l = emit(&deep, acc16(looped));
    assert_eq!(calls(&l, "kf_hidden_loop_h<").len(), 1, "{l}");
    assert!(calls(&l, "kf_hidden_loop<").is_empty());
}

#[test]
fn f16_accumulator_biases_are_duplicated_halved_pairs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = load(dir.path(), "b", &[16, 40, 8], DType::F16);
    let k = emit_kernel(&model, &acc16(MlpKernelOptions::default())).expect("emit");
    // kf_hidden_layer_h<KT, NT16, W_OFF, B_OFF, N_REAL, HAS_BIAS, Act>: the bias offset.
    let call = calls(&k.source, "kf_hidden_layer_h<");
    assert_eq!(call.len(), 1, "{}", k.source);
    let args: Vec<usize> = call[0]
        .split(['<', '>'])
        .nth(1)
        .expect("template arguments")
        .split(", ")
        .take(6)
        .map(|a| a.parse().expect("a number"))
        .collect();
    assert_eq!((args[0], args[1], args[4], args[5]), (1, 3, 40, 1), "{}", call[0]);
    let b_off = args[3];
    let bias = model.layers[0].bias.as_ref().expect("bias");
    let at = |off: usize| f16::from_le_bytes([k.params[off], k.params[off + 1]]);
    // SiLU's h = x/2: the bias is halved; padded columns (40..48) are zero.
    let want = |c: usize| if c < 40 { f16::from_f32(0.5 * bias[c]) } else { f16::ZERO };
    // Per k16 chunk j and lane quad q: {p(2j), p(2j), p(2j + 1), p(2j + 1)}, p(t) the pair of
    // columns 8t + 2q and 8t + 2q + 1.
    for j in 0..3 {
        for q in 0..4 {
            for (slot, t) in [2 * j, 2 * j, 2 * j + 1, 2 * j + 1].into_iter().enumerate() {
                let off = b_off + (j * 4 + q) * 16 + slot * 4;
                assert_eq!(
                    (at(off), at(off + 2)),
                    (want(8 * t + 2 * q), want(8 * t + 2 * q + 1)),
                    "chunk {j} quad {q} slot {slot}"
                );
            }
        }
    }
    // The output layer's weights follow the 192 bias bytes (16-byte aligned).
    let out = calls(&k.source, "kf_output_layer<");
    assert!(out[0].contains(&format!(", {}, ", b_off + 192)), "{}", out[0]);
}

/// The pipelined chunk order with an FMA share: (widths, options) for the NVRTC and GPU tiers.
fn pipe_fma_cases() -> Vec<(Vec<usize>, MlpKernelOptions)> {
    let pipe = |eighths| MlpKernelOptions {
        chunk_order: ChunkOrder::Pipelined,
        activation_math: ActivationMath::PackedFma { eighths },
        ..MlpKernelOptions::default()
    };
    vec![
        (vec![32, 64, 128, 96, 64, 32, 16], pipe(1)),
        (vec![32, 64, 128, 96, 64, 32, 16], pipe(2)),
        (vec![3, 24, 100, 5], pipe(3)),
        (vec![32, 64, 128, 96, 64, 32, 16], pipe(8)),
    ]
}

#[test]
fn pipelined_fma_share_compiles_for_sm90() {
    if nvrtc_or_skip("pipelined_fma_share_compiles_for_sm90").is_none() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    for (n, (widths, opts)) in pipe_fma_cases().into_iter().enumerate() {
        let k = emit_kernel(&load(dir.path(), &format!("c{n}"), &widths, DType::F16), &opts).expect("emit");
        let mut c = CompileOptions::for_arch(k.target(Arch::new(9, 0)));
        c.extra = k.nvrtc_options.clone();
        let m = compile(&k.source, &c).unwrap_or_else(|e| panic!("{widths:?} {opts:?}: {e}"));
        assert!(!m.cubin.is_empty());
    }
}

#[test]
fn pipelined_fma_share_matches_cpu_interpreter() {
    let Some(gpu) = gpu_or_skip("pipelined_fma_share_matches_cpu_interpreter") else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut rng, _) = Rng::from_time();
    for (n, (widths, opts)) in pipe_fma_cases().into_iter().enumerate() {
        let spec = ModelSpec { with_bias: true, seed: rng.next_u64(), ..ModelSpec::new(&widths, "silu") };
        let model = MlpModel::load(write_model(dir.path(), &format!("g{n}"), &spec).expect("write")).expect("load");
        let opts = MlpKernelOptions { shared_limit: gpu.max_shared_bytes(), ..opts };
        let (prepared, _) = prepare_with(&gpu, &model, &opts).expect("prepare");
        assert!(prepared.kernel().is_some_and(
            |k| k.source.contains("kf_hidden_layer_p<") && k.source.contains("kf_silu_half_f16x2_fma(lo, hi)")
        ));
        for rows in [1usize, 3, 255, 256, 1023] {
            let x = random_input(DType::F16, rows, model.input_width(), &mut rng);
            let xb = gpu.upload(&x.to_bytes()).expect("upload");
            let out_w = model.output_width();
            let y = gpu.alloc_zeroed(rows * out_w * 2).expect("alloc");
            gpu.fill(&y, 0xff).expect("poison");
            prepared.launch(&gpu, &xb, &y, rows).expect("launch");
            let got = HostTensor::from_bytes(DType::F16, vec![rows, out_w], &gpu.download(&y).expect("download"))
                .expect("size");
            let want = evaluate_cpu(&model, &x).expect("cpu");
            let e = compare_rows(&got.to_f64(), &want, out_w);
            println!(
                "{} {:?} pipe rows {rows}: rel {:.2e} worst row {:.2e}",
                model.summary(),
                opts.activation_math,
                e.rel_err,
                e.worst_row_rel_err
            );
            let numerics = Numerics { f16_accumulator: opts.hidden_accumulator == HiddenAccumulator::F16 };
            let what = format!("{} rows {rows}", model.summary());
            check_16bit(&model, &x, &got.to_f64(), &want, DType::F16, numerics, &what)
                .unwrap_or_else(|why| panic!("{why}"));
        }
    }
}
