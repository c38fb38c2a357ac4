//! The generic fast form (`emit_generic`, tiered compilation's stand-in kernel). Pure tier: its
//! code is the same for models of any widths and depth with the same dtypes and activations (only
//! the layer table differs), it is deterministic, shares the optimised kernel's parameter blob,
//! refuses a blob it does not understand or too little shared memory (and `emit_fast_form` then
//! falls back to the looped form), a golden file of one model's generated part, and a CPU
//! emulation of one 16-row tile that reads the layer table and the blob with the kernel's address
//! formulas and matches the interpreter. The NVRTC and GPU
//! tiers of the same kernels are in the `kfuse` crate's `mlp_generic` tests.

use kfuse_ir::DType;
use kfuse_mlp::testing::{both, random_input, Case, Rng};
use kfuse_mlp::{
    compare_rows, emit_fast_form, emit_generic, emit_kernel, evaluate_cpu, ActivationMath, GenericRefusal,
    HiddenAccumulator, MlpKernel, MlpKernelOptions, MlpModel,
};

/// Named tolerance: per-row worst relative error for f16/bf16 storage between layers (as in
/// gpu_tier.rs).
const TOL_16BIT: f64 = 1e-2;

/// The source without the model's data: the layer table, the name (a hash of the whole source)
/// and the comment lines naming the model.
fn code(source: &str) -> String {
    let (pre, rest) =
        source.split_once("__constant__ int kg_table[").unwrap_or_else(|| panic!("no layer table in:\n{source}"));
    let post = rest
        .split_once("\n};\n")
        .map(|(_, post)| post)
        .unwrap_or_else(|| panic!("an unterminated layer table:\n{source}"));
    let pre: Vec<&str> = pre
        .lines()
        .filter(|l| !(l.starts_with("// model:") || l.starts_with("// input ") || l.starts_with("#define KG_NAME")))
        .collect();
    format!("{}\n{post}", pre.join("\n"))
}

fn cases() -> Vec<Case> {
    use DType::*;
    let mut fma8 = Case::new(&[32, 64, 128, 96, 64, 32, 16], "silu", F16, true);
    fma8.math = ActivationMath::PackedFma { eighths: 8 };
    let mut tanh32 = Case::new(&[24, 40, 24], "silu", BF16, true).io(F32, F32);
    tanh32.math = ActivationMath::TanhF32;
    let mut f32math = Case::new(&[100, 100, 100, 100, 3], "silu", F16, true).io(F32, BF16);
    f32math.math = ActivationMath::F32;
    let mut fma = Case::new(&[32, 64, 128, 96, 64, 32, 16], "silu", F16, true);
    fma.math = ActivationMath::PackedFma { eighths: 2 };
    vec![
        Case::new(&[16, 16], "none", F16, true),
        Case::new(&[16, 16], "none", BF16, false).io(F32, F32).last("relu"),
        Case::new(&[24, 24, 24, 24, 24, 24, 24, 24, 5], "relu", BF16, true).io(F32, F32),
        Case::new(&[24, 16, 16, 16, 16, 16, 16, 16, 24], "leaky_relu", F16, true).io(BF16, F16),
        Case::new(&[100, 100, 100, 3], "gelu", F16, true).io(F32, F16),
        Case::new(&[256, 256, 32], "tanh", BF16, false).io(BF16, BF16),
        Case::new(&[256, 100, 24, 16], "silu", F16, true).io(F32, F32).last("sigmoid"),
        Case::new(&[64, 64, 64, 64, 64, 16], "relu", F16, false),
        Case::new(&[64, 128, 128, 128, 128, 16], "relu", BF16, false),
        Case::new(&[32, 64, 128, 96, 64, 32, 16], "silu", F16, true),
        Case::new(&[32, 64, 128, 96, 64, 32, 16], "silu", BF16, true).io(F32, F32),
        Case::new(&[3, 17, 1], "x * sigmoid(1.702 * x)", BF16, true).io(F32, BF16),
        fma8,
        tanh32,
        f32math,
        fma,
    ]
}

#[test]
fn generic_code_depends_on_dtypes_and_activations_not_on_widths() {
    let dir = tempfile::tempdir().expect("tempdir");
    let relu = |widths: &[usize], bias: bool, name: &str| {
        Case::new(widths, "relu", DType::F16, bias).model(dir.path(), name, 7)
    };
    let models = [
        relu(&[64, 64, 64, 64, 64, 16], false, "a"),
        relu(&[64, 128, 128, 128, 128, 16], false, "b"),
        relu(&[3, 24, 100, 5], true, "c"),
        relu(&[256, 24, 8], true, "d"),
    ];
    let opts = MlpKernelOptions::default();
    let kernels: Vec<(MlpKernel, MlpKernel)> = models.iter().map(|m| both(m, &opts)).collect();
    for (m, (full, generic)) in models.iter().zip(&kernels) {
        let what = m.summary();
        assert!(code(&generic.source) == code(&kernels[0].1.source), "{what}: the code differs from the first model's");
        assert!(
            generic.name.starts_with("kf_mlp_generic_")
                && generic.source.contains(&format!("#define KG_NAME {}", generic.name)),
            "{what}"
        );
        assert!(!generic.source.contains("#include"), "{what}");
        assert_eq!(generic.params, full.params, "{what}: the blob is shared with the optimised kernel");
        assert_eq!((generic.in_dtype, generic.out_dtype), (full.in_dtype, full.out_dtype));
        assert_eq!(
            (generic.row_tiles_per_warp, generic.rows_per_warp, generic.rows_per_block),
            (1, 16, 16 * generic.warps),
            "{what}"
        );
        assert!((1..=16).contains(&generic.warps) && generic.block == 32 * generic.warps, "{what}");
        assert!(
            generic.shared_bytes as usize > generic.params.len() && generic.shared_bytes <= opts.shared_limit,
            "{what}"
        );
        assert!(
            generic.nvrtc_options.iter().any(|o| o == "--Ofast-compile=mid"),
            "{what}: {:?}",
            generic.nvrtc_options
        );
        // Deterministic: the same model again gives the same bytes.
        assert_eq!(&both(m, &opts).1, generic, "{what}");
    }
    // The dtypes and the activations do change the code.
    let silu = Case::new(&[64, 64, 64, 64, 64, 16], "silu", DType::F16, false).model(dir.path(), "e", 7);
    let bf16 = Case::new(&[64, 64, 64, 64, 64, 16], "relu", DType::BF16, false).model(dir.path(), "f", 7);
    let f32_io = MlpKernelOptions { in_dtype: DType::F32, ..opts.clone() };
    for other in [both(&silu, &opts).1, both(&bf16, &opts).1, both(&models[0], &f32_io).1] {
        assert!(code(&other.source) != code(&kernels[0].1.source), "{}: the same code as another model's", other.name);
    }
}

#[test]
fn generic_refuses_a_foreign_blob_or_too_little_shared_memory_and_tiering_falls_back() {
    let dir = tempfile::tempdir().expect("tempdir");
    let m = Case::new(&[64, 64, 64, 64, 64, 16], "relu", DType::F16, false).model(dir.path(), "r", 3);
    let opts = MlpKernelOptions::default();
    // A blob of another layout (here: f16 accumulators, whose biases are f16 pairs) is refused,
    // never misread; tiering then falls back to a looped form that shares it.
    let acc16 = MlpKernelOptions { hidden_accumulator: HiddenAccumulator::F16, ..opts.clone() };
    let full16 = emit_kernel(&m, &acc16).expect("emit");
    assert!(matches!(emit_generic(&m, &acc16, &full16), Err(GenericRefusal::Layout)));
    let fallback = emit_fast_form(&m, &acc16, &full16, (13, 0)).expect("a looped form");
    assert!(!fallback.name.starts_with("kf_mlp_generic_") && fallback.params == full16.params, "{}", fallback.name);
    // So is a kernel whose SiLU layers are not halved as the options' activation forms expect.
    let silu = Case::new(&[64, 64, 64, 16], "silu", DType::F16, true).model(dir.path(), "s", 3);
    let unhalved =
        emit_kernel(&silu, &MlpKernelOptions { activation_math: ActivationMath::F32, ..opts.clone() }).expect("emit");
    assert!(matches!(emit_generic(&silu, &opts, &unhalved), Err(GenericRefusal::Layout)));
    let full = emit_kernel(&m, &opts).expect("emit");
    // Too little shared memory for the weights plus one warp's two 16-row buffers.
    let tight =
        MlpKernelOptions { shared_limit: u32::try_from(full.params.len()).expect("size") + 1024, ..opts.clone() };
    match emit_generic(&m, &tight, &full) {
        Err(GenericRefusal::SharedMemory { needed }) => assert_eq!(needed, full.params.len() + 2 * 16 * (2 * 64 + 16)),
        other => panic!("expected a shared-memory refusal, got {other:?}"),
    }
    let fast = emit_fast_form(&m, &opts, &full, (13, 0)).expect("a fast form");
    assert!(
        fast.name.starts_with("kf_mlp_generic_") && fast.nvrtc_options.iter().any(|o| o == "-minimal"),
        "{:?}",
        fast.nvrtc_options
    );
    // A wide hidden layer: the generic form's two buffers per warp hold 256 columns, the looped
    // form's input stages only 16, so with little shared memory only the looped form fits, and
    // tiering uses it.
    let wide = Case::new(&[16, 256, 16], "relu", DType::F16, true).model(dir.path(), "w", 3);
    let params = emit_kernel(&wide, &opts).expect("emit").params.len();
    let tight = MlpKernelOptions { shared_limit: u32::try_from(params + 8192).expect("size"), ..opts.clone() };
    let full = emit_kernel(&wide, &tight).expect("the optimised kernel fits with one warp");
    assert!(matches!(emit_generic(&wide, &tight, &full), Err(GenericRefusal::SharedMemory { .. })));
    let fast = emit_fast_form(&wide, &tight, &full, (13, 0)).expect("a fast form");
    assert!(fast.name.starts_with("kf_mlp_") && !fast.name.starts_with("kf_mlp_generic_"), "{}", fast.name);
    assert!(fast.nvrtc_options.iter().any(|o| o == "--Ofast-compile=mid") && fast.params == full.params);
}

#[test]
fn generic_generated_part_matches_golden() {
    let dir = tempfile::tempdir().expect("tempdir");
    let m = Case::new(&[24, 40, 5], "relu", DType::F16, true).last("gelu").model(dir.path(), "g", 11);
    let opts = MlpKernelOptions { in_dtype: DType::F32, out_dtype: DType::BF16, ..MlpKernelOptions::default() };
    let (_, generic) = both(&m, &opts);
    // The generated head (defines, layer table, activation functions) and the dispatchers.
    let head = generic.source.split("// ---------------------------------------------------------------------------------------------\n// PTX helpers").next().unwrap_or("");
    let head: String = head.split("// kfuse generic MLP kernel: the quick-to-compile").next().unwrap_or("").to_string();
    let dispatch = generic
        .source
        .split("(they use the helpers above).\n")
        .nth(1)
        .and_then(|s| s.split("\n// Converts this warp").next())
        .unwrap_or("");
    if std::env::var_os("CARGO_MANIFEST_DIR").is_none() {
        std::env::set_var("CARGO_MANIFEST_DIR", env!("CARGO_MANIFEST_DIR"));
    }
    // The name is a hash of the whole source (template included): masked, so that editing the
    // template's comments does not change this file.
    let head = head.replace(&generic.name, "kf_mlp_generic_<hash of the source>");
    expect_test::expect_file!["golden/generic_24_40_5_relu_gelu.cu.txt"]
        .assert_eq(&format!("{head}// ... mlp_generic.cuh's helpers ...\n{dispatch}// ... mlp_generic.cuh's layers and kernel ...\n// NVRTC options: {:?}\n", generic.nvrtc_options));
}

/// The layer table `kg_table` of a generic kernel's source.
fn table(source: &str) -> Vec<i64> {
    let body = source
        .split_once("__constant__ int kg_table[")
        .and_then(|(_, r)| r.split_once("= {"))
        .and_then(|(_, r)| r.split_once("};"))
        .map(|(b, _)| b);
    body.unwrap_or_else(|| panic!("no layer table"))
        .split(',')
        .map(|v| v.trim().parse::<i64>().unwrap_or_else(|e| panic!("table value `{v}`: {e}")))
        .collect()
}

/// Rounds to the model's compute dtype, as the kernel's packed pairs do.
fn round16(dtype: DType, v: f64) -> f64 {
    match dtype {
        DType::BF16 => half::bf16::from_f64(v).to_f64(),
        _ => half::f16::from_f64(v).to_f64(),
    }
}

/// The generic kernel on the CPU for one 16-row tile, reading the table and the blob exactly as
/// mlp_generic.cuh does (its address formulas transcribed, the mma fragments gathered lane by
/// lane), with the activations of the model evaluated in f64 (SiLU layers whose weights the blob
/// halves get 2h). Returns the 16 rows of f64 outputs.
fn emulate_tile(model: &MlpModel, kernel: &MlpKernel, halved: &[bool], x: &[f64]) -> Vec<f64> {
    let t = table(&kernel.source);
    let blob = &kernel.params;
    let half = |addr: i64| -> f64 {
        let a = usize::try_from(addr).expect("address");
        let bits = u16::from_le_bytes([blob[a], blob[a + 1]]);
        match model.dtype {
            DType::BF16 => half::bf16::from_bits(bits).to_f64(),
            _ => half::f16::from_bits(bits).to_f64(),
        }
    };
    let float = |addr: i64| -> f64 {
        let a = usize::try_from(addr).expect("address");
        f64::from(f32::from_le_bytes([blob[a], blob[a + 1], blob[a + 2], blob[a + 3]]))
    };
    let (layers, in_w, in_pairs, out_w) = (t[0] as usize, t[2] as usize, t[3] as usize, t[4] as usize);
    assert_eq!((t[1] * 16) as usize, blob.len(), "parameter bytes");
    // Buffer 0: the input rows in the compute dtype, zero past the input width.
    let mut a: Vec<Vec<f64>> = (0..16)
        .map(|r| {
            (0..2 * in_pairs).map(|c| if c < in_w { round16(model.dtype, x[r * in_w + c]) } else { 0.0 }).collect()
        })
        .collect();
    let mut out = vec![0.0; 16 * out_w];
    for l in 0..layers {
        let e = &t[8 + 8 * l..16 + 8 * l];
        let (kt, nt8, gs, w_off, b_off, b_mult, n_real) = (e[0], e[1] as usize, e[2], e[3], e[4], e[5], e[6] as usize);
        assert_eq!(a[0].len(), 16 * kt as usize, "layer {l}: the input width is the table's");
        let mut z = vec![vec![0.0f64; 8 * nt8]; 16];
        for tile in 0..nt8 {
            // Lane (g, q) holds C rows g, g + 8, columns c, c + 1: bias plus A[m][k] * B[k][n] over k,
            // each B value read from the lane whose fragment holds it (the kernel's address formula).
            for lane in 0..32i64 {
                let (g, q) = ((lane / 4) as usize, (lane % 4) as usize);
                let c = 8 * tile + 2 * q;
                let (b0, b1) = if b_off >= 0 {
                    (float(b_off + 4 * c as i64 * b_mult), float(b_off + 4 * c as i64 * b_mult + 4))
                } else {
                    (0.0, 0.0)
                };
                for (m, n, bias) in [(g, c, b0), (g, c + 1, b1), (g + 8, c, b0), (g + 8, c + 1, b1)] {
                    let mut acc = bias;
                    for kk in 0..kt {
                        // Column n's B values come from lane 4 * (n % 8) + qq: its b0 holds
                        // k = 2qq, 2qq + 1 and its b1 k = 2qq + 8, 2qq + 9 of chunk kk.
                        for k in 0..16usize {
                            let qq = ((k % 8) / 2) as i64;
                            let owner = 4 * (n % 8) as i64 + qq;
                            let wo = w_off
                                + (((tile as i64) >> gs) * kt * 32 + owner) * (8 << gs)
                                + ((tile as i64) & ((1 << gs) - 1)) * 8;
                            let b = half(wo + kk * (256 << gs) + if k < 8 { 0 } else { 4 } + 2 * (k % 2) as i64);
                            acc += a[m][16 * kk as usize + k] * b;
                        }
                    }
                    z[m][n] = acc;
                }
            }
        }
        let last = l + 1 == layers;
        let scale = if halved[l] { 2.0 } else { 1.0 };
        let act = |v: Vec<f64>| {
            model.layers[l].activation.evaluate_f64(l, v.into_iter().map(|x| scale * x).collect()).expect("activation")
        };
        if last {
            for (m, row) in z.iter().enumerate() {
                let y = act(row[..out_w].to_vec());
                out[m * out_w..(m + 1) * out_w].copy_from_slice(&y);
            }
        } else {
            // Padding columns forced to 0, the rest rounded to the compute dtype.
            a = z
                .iter()
                .map(|row| {
                    act(row.clone())
                        .into_iter()
                        .enumerate()
                        .map(|(c, v)| if c < n_real { round16(model.dtype, v) } else { 0.0 })
                        .collect()
                })
                .collect();
        }
    }
    out
}

#[test]
fn generic_table_and_addressing_reproduce_the_model_on_the_cpu() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut rng = Rng::new(99);
    for (n, case) in cases().iter().enumerate() {
        let m = case.model(dir.path(), &format!("e{n}"), rng.next_u64());
        let opts = case.options(None);
        let (_, generic) = both(&m, &opts);
        let last = m.layers.len() - 1;
        let half_silu = (m.dtype == DType::F16
            && matches!(case.math, ActivationMath::Packed | ActivationMath::PackedFma { .. }))
            || case.math == ActivationMath::TanhF32;
        let halved: Vec<bool> = m
            .layers
            .iter()
            .enumerate()
            .map(|(i, l)| i != last && half_silu && l.activation.kind() == kfuse_mlp::ActivationKind::Silu)
            .collect();
        let x = random_input(DType::F32, 16, m.input_width(), &mut rng);
        let got = emulate_tile(&m, &generic, &halved, &x.to_f64());
        let want = evaluate_cpu(&m, &x).expect("cpu");
        let e = compare_rows(&got, &want, m.output_width());
        println!("{} {:?}: rel {:.2e} worst row {:.2e}", m.summary(), case.math, e.rel_err, e.worst_row_rel_err);
        assert!(e.non_finite == 0 && e.rel_err <= TOL_16BIT, "{}: {e:?}", m.summary());
    }
}
