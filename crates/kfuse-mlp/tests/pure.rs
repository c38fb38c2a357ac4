//! Pure tier: model loading (every bad input gives a clear error naming the
//! layer or tensor), the CPU interpreter path against the independent f64 reference, the
//! kernel generator's determinism and a golden file of one model's kernel.

use std::path::{Path, PathBuf};

use kfuse_ir::{DType, HostTensor};
use kfuse_mlp::testing::{random_input, write_model, ModelSpec, Rng};
use kfuse_mlp::{
    compare_rows, emit_kernel, erf_f64, evaluate_cpu, reference_f64, run_cpu, MlpError, MlpKernelOptions, MlpModel,
};

fn write(dir: &Path, name: &str, spec: &ModelSpec) -> PathBuf {
    write_model(dir, name, spec).expect("write model")
}

/// Rewrites model.json through a closure on its JSON value.
fn edit_json(path: &Path, f: impl FnOnce(&mut serde_json::Value)) {
    let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).expect("read")).expect("json");
    f(&mut v);
    std::fs::write(path, serde_json::to_string(&v).expect("to string")).expect("write");
}

fn load_err(path: &Path) -> String {
    match MlpModel::load(path) {
        Ok(m) => panic!("expected an error, loaded {}", m.summary()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn loads_widths_and_dtypes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut spec = ModelSpec::new(&[5, 24, 3], "silu");
    spec.dtype = DType::BF16;
    spec.file_dtype = DType::F32; // f32 weights are rounded to the model dtype on load
    let m = MlpModel::load(write(dir.path(), "m", &spec)).expect("load");
    assert_eq!(m.widths(), vec![5, 24, 3]);
    assert_eq!(m.dtype, DType::BF16);
    assert_eq!(m.layers[0].activation.spec, "silu");
    assert_eq!(m.layers[1].activation.spec, "none");
    for v in &m.layers[0].weight {
        assert_eq!(*v, half::bf16::from_f32(*v).to_f32(), "weights must be bf16-exact");
    }
    assert!(m.layers[0].bias.is_some());
}

#[test]
fn every_bad_input_is_a_clear_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let spec = ModelSpec::new(&[8, 16, 16, 4], "relu");
    let fresh = |name: &str| write(dir.path(), name, &spec);

    // Missing weights file.
    let p = fresh("a");
    std::fs::remove_file(dir.path().join("a.safetensors")).expect("rm");
    let e = load_err(&p);
    assert!(e.contains("weights file") && e.contains("a.safetensors"), "{e}");

    // Unreadable (corrupt) weights file.
    let p = fresh("b");
    std::fs::write(dir.path().join("b.safetensors"), b"not a safetensors file").expect("write");
    let e = load_err(&p);
    assert!(e.contains("not a valid safetensors"), "{e}");

    // A tensor named in model.json but absent from the file.
    let p = fresh("c");
    edit_json(&p, |v| v["layers"][1]["weight"] = "9.weight".into());
    let e = load_err(&p);
    assert!(e.contains("layer 1") && e.contains("`9.weight`") && e.contains("2.weight"), "{e}");
    let p = fresh("c2");
    edit_json(&p, |v| v["layers"][2]["bias"] = "nope".into());
    let e = load_err(&p);
    assert!(e.contains("layer 2") && e.contains("`nope`") && e.contains("bias"), "{e}");

    // Widths that do not chain: layer 2 reads layer 0's weight ([16, 8]) after a 16-wide layer.
    let p = fresh("d");
    edit_json(&p, |v| {
        v["layers"][2]["weight"] = "0.weight".into();
        v["layers"][2]["bias"] = serde_json::Value::Null;
    });
    let e = load_err(&p);
    assert!(e.contains("layer 2") && e.contains("do not chain") && e.contains("layer 1 produces 16"), "{e}");

    // A wrong-rank tensor: a bias used as a weight.
    let p = fresh("e");
    edit_json(&p, |v| v["layers"][0]["weight"] = "0.bias".into());
    let e = load_err(&p);
    assert!(e.contains("layer 0") && e.contains("`0.bias`") && e.contains("rank 2"), "{e}");

    // Unknown activation name.
    let p = fresh("f");
    edit_json(&p, |v| v["layers"][1]["activation"] = "swishy".into());
    let e = load_err(&p);
    assert!(e.contains("layer 1") && e.contains("unknown activation `swishy`") && e.contains("gelu_tanh"), "{e}");

    // An expression that does not parse, and one that uses another variable.
    let p = fresh("g");
    edit_json(&p, |v| v["layers"][0]["activation"] = "x * (1 +".into());
    let e = load_err(&p);
    assert!(e.contains("layer 0") && e.contains("not a valid expression"), "{e}");
    let p = fresh("h");
    edit_json(&p, |v| v["layers"][1]["activation"] = "x * sigmoid(y)".into());
    let e = load_err(&p);
    assert!(e.contains("layer 1") && e.contains("not a valid expression"), "{e}");

    // Format and dtype fields, and an empty layer list.
    let p = fresh("i");
    edit_json(&p, |v| v["format"] = "kfuse-mlp/9".into());
    assert!(load_err(&p).contains("unsupported format"));
    let p = fresh("j");
    edit_json(&p, |v| v["dtype"] = "f64".into());
    assert!(load_err(&p).contains("unsupported weight dtype `f64`"));
    let p = fresh("k");
    edit_json(&p, |v| v["layers"] = serde_json::json!([]));
    assert!(load_err(&p).contains("no layers"));

    // Missing model.json.
    let e = load_err(&dir.path().join("absent.json"));
    assert!(e.contains("model description"), "{e}");

    // Inputs: wrong width, zero rows, wrong rank, int dtype.
    let m = MlpModel::load(fresh("ok")).expect("load");
    let bad_width = HostTensor::from_f64(DType::F32, vec![2, 7], &[0.0; 14]);
    let e = run_cpu(&m, &bad_width).expect_err("width").to_string();
    assert!(e.contains("7 columns") && e.contains("takes 8"), "{e}");
    let empty = HostTensor::from_f64(DType::F32, vec![0, 8], &[]);
    assert!(matches!(run_cpu(&m, &empty), Err(MlpError::EmptyBatch)));
    let rank3 = HostTensor::from_f64(DType::F32, vec![1, 1, 8], &[0.0; 8]);
    assert!(matches!(run_cpu(&m, &rank3), Err(MlpError::InputRank { .. })));
    let ints = HostTensor::from_f64(DType::I32, vec![1, 8], &[0.0; 8]);
    assert!(matches!(run_cpu(&m, &ints), Err(MlpError::InputDType { .. })));
}

#[test]
fn custom_expressions_and_named_activations_load() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut spec = ModelSpec::new(&[4, 8, 8, 2], "x * sigmoid(1.702 * x)");
    spec.activations[1] = "where(x > 0, x, 0.2 * x)".to_string();
    let m = MlpModel::load(write(dir.path(), "m", &spec)).expect("load");
    assert_eq!(m.layers[0].activation.expression, "x * sigmoid(1.702 * x)");
    let mut rng = Rng::new(3);
    let x = random_input(DType::F32, 5, 4, &mut rng);
    let got = evaluate_cpu(&m, &x).expect("cpu");
    let want = reference_f64(&m, &x).expect("reference");
    let e = compare_rows(&got, &want, 2);
    assert!(e.rel_err < 1e-12, "{e:?}");
}

#[test]
fn erf_matches_known_values() {
    for (x, want) in [
        (0.0, 0.0),
        (0.5, 0.5204998778130465),
        (1.0, 0.8427007929497149),
        (2.0, 0.9953222650189527),
        (-3.0, -0.9999779095030014),
    ] {
        assert!((erf_f64(x) - want).abs() < 1e-15, "erf({x}) = {} want {want}", erf_f64(x));
    }
}

#[test]
fn cpu_path_matches_f64_reference_for_widths_and_depths() {
    let dir = tempfile::tempdir().expect("tempdir");
    let acts = ["relu", "leaky_relu", "silu", "gelu", "gelu_tanh", "sigmoid", "tanh", "softplus", "sin", "exp", "none"];
    let (mut rng, _) = Rng::from_time();
    let mut case = 0;
    for (wi, &w) in [16usize, 24, 64, 100, 128, 256].iter().enumerate() {
        for depth in 1..=8usize {
            if (depth + wi) % 3 != 0 && depth != 1 && depth != 8 {
                continue; // a representative set: every width and every depth, not the full product
            }
            let mut widths = vec![w; depth + 1];
            widths[depth] = 1 + (depth * 7) % 17;
            let act = acts[case % acts.len()];
            case += 1;
            let mut spec = ModelSpec::new(&widths, act);
            spec.seed = rng.next_u64();
            spec.with_bias = depth % 2 == 1;
            let m = MlpModel::load(write(dir.path(), &format!("m{case}"), &spec)).expect("load");
            let rows = [1usize, 3, 129][case % 3];
            let x = random_input(DType::F32, rows, w, &mut rng);
            let got = evaluate_cpu(&m, &x).expect("cpu");
            let want = reference_f64(&m, &x).expect("reference");
            let e = compare_rows(&got, &want, m.output_width());
            assert!(e.rel_err < 1e-12 && e.non_finite == 0, "{} ({act}, {rows} rows): {e:?}", m.summary());
        }
    }
    assert!(case >= 20, "only {case} cases");
}

#[test]
fn generated_source_is_deterministic_and_matches_golden() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut spec = ModelSpec::new(&[24, 40, 5], "relu");
    spec.seed = 11;
    let m1 = MlpModel::load(write(dir.path(), "a", &spec)).expect("load");
    let m2 = MlpModel::load(write(dir.path(), "b", &spec)).expect("load");
    let opts = MlpKernelOptions { in_dtype: DType::F32, out_dtype: DType::BF16, ..MlpKernelOptions::default() };
    let k1 = emit_kernel(&m1, &opts).expect("emit");
    let k2 = emit_kernel(&m2, &opts).expect("emit");
    assert_eq!(k1.source, k2.source);
    assert_eq!(k1.params, k2.params);
    assert!(!k1.source.contains("#include"));
    assert!(k1.source.contains(&format!("KF_KERNEL_NAME {}", k1.name)));
    // Padded widths: 24 -> 32 in, 40 -> 48 hidden, 5 -> 8 out; params = weights + f32 bias quads
    // (4 floats per column pair: BiasOperand::Quads, the default).
    assert_eq!(k1.params.len(), 48 * 32 * 2 + 48 * 8 + 8 * 48 * 2 + 8 * 8); // no bias bytes
    let generated: String =
        k1.source.split("\n// kfuse fully fused MLP: device helpers").next().unwrap_or("").to_string();
    // The activation structs (after the prelude) and the generated layer chain.
    let forward: String =
        k1.source.split("\nstruct KfAct0").nth(1).and_then(|s| s.split("\n}\n").next()).unwrap_or("").to_string();
    golden_env();
    expect_test::expect_file!["golden/mlp_24_40_5_relu.cu.txt"].assert_eq(&format!(
        "{generated}\n// ...\nstruct KfAct0{forward}\n}}\n// NVRTC options: {:?}\n",
        k1.nvrtc_options
    ));
}

/// Golden files are found through CARGO_MANIFEST_DIR, which cargo sets; a test executable run
/// directly (as on the GPU machine, which has no Rust) gets the compile-time value instead.
fn golden_env() {
    if std::env::var_os("CARGO_MANIFEST_DIR").is_none() {
        std::env::set_var("CARGO_MANIFEST_DIR", env!("CARGO_MANIFEST_DIR"));
    }
}

#[test]
fn repeated_layers_loop_and_silu_half_weights() {
    use kfuse_mlp::{ActivationMath, RepeatedLayers};
    let dir = tempfile::tempdir().expect("tempdir");
    // Layers 0..=3 are 64→64 ReLU without bias: one loop of 4 when asked, 4 unrolled calls else.
    let mut spec = ModelSpec::new(&[64, 64, 64, 64, 64, 16], "relu");
    spec.with_bias = false;
    let m = MlpModel::load(write(dir.path(), "sq", &spec)).expect("load");
    let looped =
        emit_kernel(&m, &MlpKernelOptions { repeated_layers: RepeatedLayers::Loop, ..MlpKernelOptions::default() })
            .expect("emit");
    let unrolled = emit_kernel(&m, &MlpKernelOptions::default()).expect("emit");
    assert!(
        looped.source.contains("kf_hidden_loop<4, 4, 0, 8192, 0, 64, 0, KfAct0>(h4, smem, lane);"),
        "{}",
        looped.source
    );
    assert_eq!(looped.source.matches("    kf_hidden_layer<").count(), 0);
    assert_eq!(unrolled.source.matches("    kf_hidden_layer<").count(), 4);
    assert_eq!(looped.params, unrolled.params);
    // Packed SiLU halves hidden SiLU layers' weights and biases (h = x/2); the last layer and
    // the F32 form keep them.
    let mut spec = ModelSpec::new(&[16, 16, 8], "silu");
    spec.seed = 5;
    let m = MlpModel::load(write(dir.path(), "silu", &spec)).expect("load");
    let half = emit_kernel(&m, &MlpKernelOptions::default()).expect("emit").params;
    let full =
        emit_kernel(&m, &MlpKernelOptions { activation_math: ActivationMath::F32, ..MlpKernelOptions::default() })
            .expect("emit")
            .params;
    assert_eq!(half.len(), full.len());
    let f16_at = |b: &[u8], i: usize| half::f16::from_le_bytes([b[2 * i], b[2 * i + 1]]).to_f32();
    let layer0_weights = 16 * 16;
    let mut nonzero = 0;
    for i in 0..layer0_weights {
        assert_eq!(f16_at(&half, i), 0.5 * f16_at(&full, i), "weight {i}");
        nonzero += usize::from(f16_at(&full, i) != 0.0);
    }
    assert!(nonzero > 200);
    let bias = |b: &[u8], i: usize| {
        f32::from_le_bytes([
            b[2 * layer0_weights + 4 * i],
            b[2 * layer0_weights + 4 * i + 1],
            b[2 * layer0_weights + 4 * i + 2],
            b[2 * layer0_weights + 4 * i + 3],
        ])
    };
    // 16 biases as 8 quads of 4 floats.
    for i in 0..32 {
        assert_eq!(bias(&half, i), 0.5 * bias(&full, i), "bias {i}");
    }
    assert_eq!(half[2 * layer0_weights + 128..], full[2 * layer0_weights + 128..], "the last layer keeps its weights");
}

#[test]
fn bias_quads_repeat_the_column_pairs() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Hidden widths 40 (padded 48) and the last 5 (padded 8), with and without bias.
    for (n, with_bias) in [true, false].into_iter().enumerate() {
        let mut spec = ModelSpec::new(&[24, 40, 5], "silu");
        spec.with_bias = with_bias;
        spec.seed = 3 + n as u64;
        let m = MlpModel::load(write(dir.path(), &format!("q{n}"), &spec)).expect("load");
        let k = emit_kernel(&m, &MlpKernelOptions::default()).expect("emit");
        assert!(k.source.contains("#define KF_BIAS_QUADS 1"));
        // Walk the blob layer by layer: weights, then per column pair (b[c], b[c+1]) the quad
        // {b[c], b[c+1], b[c], b[c+1]}; the hidden SiLU layer's bias is halved (h = x/2).
        let layers = [(48 * 32 * 2, 48usize, 0.5f32, &m.layers[0]), (8 * 48 * 2, 8, 1.0, &m.layers[1])];
        let mut q = 0usize;
        let mut nonzero = 0;
        for (weight_bytes, n_pad, scale, layer) in layers {
            q += weight_bytes;
            let Some(bias) = &layer.bias else { continue };
            let f =
                |at: usize| f32::from_le_bytes([k.params[at], k.params[at + 1], k.params[at + 2], k.params[at + 3]]);
            let b = |i: usize| if i < layer.outputs { scale * bias[i] } else { 0.0 };
            for c in (0..n_pad).step_by(2) {
                let quad: Vec<f32> = (0..4).map(|i| f(q + 8 * c + 4 * i)).collect();
                assert_eq!(quad, [b(c), b(c + 1), b(c), b(c + 1)], "quad of columns {c}, {}", c + 1);
                nonzero += usize::from(b(c) != 0.0) + usize::from(b(c + 1) != 0.0);
            }
            q += 8 * n_pad;
            q = q.div_ceil(16) * 16;
        }
        assert_eq!(q, k.params.len());
        assert!(!with_bias || nonzero >= 40, "only {nonzero} nonzero biases");
    }
}
