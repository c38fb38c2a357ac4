//! The facade's API without a GPU (pure tier, plus one NVRTC-tier check): an engine and programs
//! compiled through it, their interface, output shapes, input checks with structured errors,
//! dtypes given as values, CPU runs, and the thread-safety the bindings rely on.

use std::sync::Arc;

use kfuse::{DType, Dim, Engine, Error, KernelCache, Program};
use kfuse_ir::BindError;
use kfuse_testing::{example, float_inputs_as, max_rel_err, nvrtc_or_skip, random_tensor};

const AXPY: &str = "\
input x: f32[N, 4]
input y: f32[N]
input w: f32[B, M]
input lengths: i32[B] as lengths(M)
input scale: f32
output s = x[.., 0] * scale + y
output total = sum(y)
output m: f16 = where(mask(lengths), w, 0.0)
";

fn engine() -> Engine {
    Engine::with_cache(Arc::new(KernelCache::memory_only()))
}

fn axpy() -> Program {
    Program::compile(&engine(), AXPY, "axpy.kf").unwrap()
}

#[test]
fn programs_and_engines_can_be_shared_between_threads() {
    fn shared<T: Send + Sync + Clone + 'static>() {}
    shared::<Program>();
    shared::<Engine>();
    shared::<kfuse::Stream>();
}

#[test]
fn the_interface_lists_inputs_and_outputs_with_symbolic_shapes_and_layouts() {
    let p = axpy();
    let i = p.interface();
    assert_eq!(i.symbols, ["N", "B", "M"]);
    let inputs: Vec<String> = i.inputs.iter().map(|d| format!("{} {}", d.name, i.decl_str(d))).collect();
    assert_eq!(inputs, ["x f32[N, 4]", "y f32[N]", "w f32[B, M]", "lengths i32[B]", "scale f32[]"]);
    let outputs: Vec<String> = i.outputs.iter().map(|d| format!("{} {}", d.name, i.decl_str(d))).collect();
    assert_eq!(outputs, ["s f32[N]", "total f32[]", "m f16[B, M]"]);
    let lengths = i.input("lengths").unwrap();
    assert!(matches!(lengths.layout, Some(kfuse::LayoutConstraint::Lengths { max: Dim::Sym(_), .. })));
    assert!(i.input("x").unwrap().layout.is_none());
    // The plan carries the same interface: it runs without the graph.
    assert_eq!(&p.plan().interface, i);
    assert!(!p.cuda_source().is_empty());
    assert_eq!(p.cuda_source(), p.plan().kernels.iter().map(|k| format!("{}\n", k.source)).collect::<String>());
}

#[test]
fn output_shapes_follow_the_bound_symbols() {
    let p = axpy();
    let shapes =
        p.output_shapes(&[("x", &[7, 4]), ("y", &[7]), ("w", &[3, 5]), ("lengths", &[3]), ("scale", &[])]).unwrap();
    assert_eq!(
        shapes,
        [
            ("s".to_string(), DType::F32, vec![7]),
            ("total".to_string(), DType::F32, vec![]),
            ("m".to_string(), DType::F16, vec![3, 5]),
        ]
    );
    let err =
        p.output_shapes(&[("x", &[7, 4]), ("y", &[8]), ("w", &[3, 5]), ("lengths", &[3]), ("scale", &[])]).unwrap_err();
    assert!(matches!(&err, Error::Bind(BindError::SymbolClash { sym, got: 8, want: 7, .. }) if sym == "N"), "{err}");
    let err = p.output_shapes(&[("z", &[1])]).unwrap_err();
    assert!(matches!(&err, Error::Bind(BindError::Unknown { name, .. }) if name == "z"), "{err}");
}

#[test]
fn check_inputs_names_the_input_and_what_is_wrong() {
    let p = axpy();
    let ok: [(&str, DType, &[usize]); 5] = [
        ("x", DType::F32, &[5, 4]),
        ("y", DType::F32, &[5]),
        ("w", DType::F32, &[2, 3]),
        ("lengths", DType::I32, &[2]),
        ("scale", DType::F32, &[]),
    ];
    p.check_inputs(&ok).unwrap();

    let mut missing = ok.to_vec();
    missing.remove(1);
    let err = p.check_inputs(&missing).unwrap_err();
    assert!(matches!(&err, Error::Bind(BindError::Missing { name, .. }) if name == "y"), "{err}");
    assert!(err.to_string().contains("f32[N]"), "{err}");

    let mut dtype = ok.to_vec();
    dtype[0].1 = DType::BF16;
    let err = p.check_inputs(&dtype).unwrap_err();
    assert!(
        matches!(&err, Error::Bind(BindError::DType { name, got: DType::BF16, want: DType::F32 }) if name == "x"),
        "{err}"
    );

    let mut rank = ok.to_vec();
    rank[1].2 = &[5, 1];
    let err = p.check_inputs(&rank).unwrap_err();
    assert!(matches!(&err, Error::Bind(BindError::Rank { name, got: 2, want: 1, .. }) if name == "y"), "{err}");

    let mut constant = ok.to_vec();
    constant[0].2 = &[5, 3];
    let err = p.check_inputs(&constant).unwrap_err();
    assert!(matches!(&err, Error::Bind(BindError::ConstDim { axis: 1, got: 3, want: 4, .. })), "{err}");

    let mut clash = ok.to_vec();
    clash[1].2 = &[6];
    let err = p.check_inputs(&clash).unwrap_err();
    assert!(matches!(&err, Error::Bind(BindError::SymbolClash { name, first, .. }) if name == "y" && first == "x"));
}

#[test]
fn run_cpu_checks_lengths_values_and_computes() {
    let p = axpy();
    let x = random_tensor(DType::F32, &[3, 4], 1);
    let y = random_tensor(DType::F32, &[3], 2);
    let scale = kfuse::HostTensor::from_f64(DType::F32, vec![], &[2.0]);
    let w = random_tensor(DType::F32, &[2, 3], 3);
    let lengths = kfuse::HostTensor::from_f64(DType::I32, vec![2], &[1.0, -1.0]);
    let inputs = [("x", &x), ("y", &y), ("w", &w), ("lengths", &lengths), ("scale", &scale)];
    let err = p.run_cpu(&inputs).unwrap_err();
    assert!(
        matches!(&err, Error::Interp(kfuse_interp::InterpError::Bind(BindError::LengthNegative { name, value: -1, .. })) if name == "lengths"),
        "{err}"
    );
    let lengths = kfuse::HostTensor::from_f64(DType::I32, vec![2], &[0.0, 3.0]);
    let inputs = [("x", &x), ("y", &y), ("w", &w), ("lengths", &lengths), ("scale", &scale)];
    let out = p.run_cpu(&inputs).unwrap();
    let (xs, ys) = (x.to_f64(), y.to_f64());
    let want: Vec<f64> = (0..3).map(|r| xs[r * 4] * 2.0 + ys[r]).collect();
    let got = out[0].1.to_f64();
    assert!(got.iter().zip(&want).all(|(g, w)| (g - w).abs() < 1e-6), "{got:?} vs {want:?}");
    assert_eq!(out[2].1.shape, [2, 3]);
    let (m, ws) = (out[2].1.to_f64(), w.to_f64());
    assert_eq!(&m[..3], [0.0; 3], "row 0 has no valid element");
    assert!(m[3..].iter().zip(&ws[3..]).all(|(g, w)| (g - w).abs() <= 1e-3 * w.abs().max(1.0)), "{m:?}");
}

#[test]
fn input_dtypes_are_values_and_match_rewriting_the_source() {
    for stem in ["giou", "giou_train_lengths", "smooth_l1_train_packed"] {
        let src = example(stem);
        let p = Program::compile(&engine(), &src, &format!("{stem}.kf")).unwrap();
        for dtype in [DType::F16, DType::BF16] {
            let pairs = float_inputs_as(p.interface(), dtype);
            let pairs: Vec<(&str, DType)> = pairs.iter().map(|(n, d)| (n.as_str(), *d)).collect();
            let q = p.with_input_dtypes(&pairs).unwrap();
            // The same program written with those dtypes in its text.
            let text: String = src
                .lines()
                .map(|l| {
                    if l.trim_start().starts_with("input") {
                        l.replace("f32[", &format!("{dtype}["))
                    } else {
                        l.into()
                    }
                })
                .map(|l| l + "\n")
                .collect();
            let r = Program::compile(&engine(), &text, &format!("{stem}.kf")).unwrap();
            assert_eq!(q.graph(), r.graph(), "{stem} {dtype}");
            assert_eq!(q.cuda_source(), r.cuda_source(), "{stem} {dtype}");
            assert!(q.interface().inputs.iter().any(|d| d.dtype == dtype), "{stem}");
        }
    }
    let p = axpy();
    let err = p.with_input_dtypes(&[("nope", DType::F16)]).unwrap_err();
    assert!(matches!(&err, Error::Parse(d) if d.message.contains("`nope`")), "{err}");
    // Earlier replacements stay: y stays bf16 after x changes.
    let q = p.with_input_dtypes(&[("y", DType::BF16)]).unwrap().with_input_dtypes(&[("x", DType::F16)]).unwrap();
    let dtypes: Vec<DType> = q.interface().inputs.iter().map(|d| d.dtype).collect();
    assert_eq!(dtypes, [DType::F16, DType::BF16, DType::F32, DType::I32, DType::F32]);
    // A graph from the builder has no source to retype.
    let g = Program::from_graph(&engine(), p.graph().clone(), "<builder>").unwrap();
    assert!(matches!(g.with_input_dtypes(&[("x", DType::F16)]), Err(Error::NoSource { .. })));
}

#[test]
fn codegen_options_are_honoured_or_refused() {
    let p = axpy();
    let q = p.with_codegen(kfuse::CodegenOptions { block_size: 128, ..Default::default() }).unwrap();
    assert_eq!(q.codegen().block_size, 128);
    assert!(q.plan().kernels.iter().all(|k| k.block == 128));
    let err = p.with_codegen(kfuse::CodegenOptions { block_size: 100, ..Default::default() }).unwrap_err();
    assert!(matches!(err, Error::Codegen(_)), "{err}");
}

#[test]
fn a_bf16_run_of_an_f32_example_agrees_with_it_on_the_cpu() {
    // Pure: the interpreter on f32 and bf16 of the same example (bf16 rounds its inputs).
    let p = Program::compile(&engine(), &example("smooth_l1"), "smooth_l1.kf").unwrap();
    let pred = random_tensor(DType::F32, &[3, 5, 4], 7);
    let target = random_tensor(DType::F32, &[3, 5, 4], 8);
    let want = p.run_cpu(&[("pred", &pred), ("target", &target)]).unwrap();
    let q = p.with_input_dtypes(&[("pred", DType::BF16), ("target", DType::BF16)]).unwrap();
    let to_bf16 = |t: &kfuse::HostTensor| kfuse::HostTensor::from_f64(DType::BF16, t.shape.clone(), &t.to_f64());
    let got = q.run_cpu(&[("pred", &to_bf16(&pred)), ("target", &to_bf16(&target))]).unwrap();
    assert!(max_rel_err(&got[0].1, &want[0].1) < 2e-2, "{:?} vs {:?}", got[0].1, want[0].1);
}

#[test]
fn every_kernel_of_a_retyped_program_compiles() {
    if nvrtc_or_skip("every_kernel_of_a_retyped_program_compiles").is_none() {
        return;
    }
    let p = axpy().with_input_dtypes(&[("x", DType::BF16), ("y", DType::F16)]).unwrap();
    let arch: kfuse_runtime::Arch = "sm_80".parse().unwrap();
    for k in &p.plan().kernels {
        let m = kfuse_runtime::compile(&k.source, &kfuse_runtime::CompileOptions::for_arch(arch)).unwrap();
        assert!(m.ptx.contains(&format!(".entry {}", k.name)), "{}", k.name);
    }
}
