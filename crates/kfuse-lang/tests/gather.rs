//! `gather(x, index, axis: A)`: torch.gather from the source text to the interpreter (values and
//! gradients against PyTorch in float64, computed sources, every axis, i32 and i64 indices), the
//! interpreter's error for an index outside the axis, and the diagnostics of bad calls.

use kfuse_ir::{HostTensor, TensorData};
use kfuse_lang::{parse_program, DiagnosticKind};

fn floats(shape: Vec<usize>, v: &[f64]) -> HostTensor {
    HostTensor::new(shape, TensorData::F32(v.iter().map(|&x| x as f32).collect()))
}

fn run(src: &str, inputs: &[(&str, &HostTensor)]) -> Vec<(String, HostTensor)> {
    let g = parse_program(src, "t.kf").unwrap_or_else(|d| panic!("{d}"));
    kfuse_interp::run(&g, inputs).unwrap_or_else(|e| panic!("{e}"))
}

fn out(outs: &[(String, HostTensor)], name: &str) -> Vec<f64> {
    outs.iter().find(|(n, _)| n == name).unwrap_or_else(|| panic!("no output {name}")).1.to_f64()
}

fn close(got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{got:?} vs {want:?}");
    for (g, w) in got.iter().zip(want) {
        assert!((g - w).abs() <= tol * (1.0 + w.abs()), "{got:?} vs {want:?}");
    }
}

#[test]
fn gather_along_the_first_axis_and_its_gradient_match_torch() {
    // torch.gather(x, 0, idx) with x = arange(12).reshape(3, 4) * 0.5 - 1, and the gradient of
    // sum(w * y), which adds up where an index repeats.
    let x: Vec<f64> = (0..12).map(|i| i as f64 * 0.5 - 1.0).collect();
    let x = floats(vec![3, 4], &x);
    let idx = HostTensor::new(vec![2, 4], TensorData::I32(vec![2, 0, 1, 2, 2, 2, 0, 1]));
    let w = floats(vec![2, 4], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]);
    let outs = run(
        "input x: f32[R, C]\ninput idx: i32[K, C]\ninput w: f32[K, C]\nlet g = gather(x, idx, axis: 0)\n\
         output y = g\noutput loss = sum(w * g)\noutput dx = grad(loss, x)\n",
        &[("x", &x), ("idx", &idx), ("w", &w)],
    );
    assert_eq!(out(&outs, "y"), [3.0, -0.5, 2.0, 4.5, 3.0, 3.5, 0.0, 2.5]);
    assert_eq!(out(&outs, "dx"), [0.0, 2.0, 7.0, 0.0, 0.0, 0.0, 3.0, 8.0, 6.0, 6.0, 0.0, 4.0]);
}

#[test]
fn gather_along_a_middle_axis_with_i64_indices_matches_torch() {
    let x: Vec<f64> = (0..24).map(f64::from).collect();
    let x = floats(vec![2, 3, 4], &x);
    let idx = HostTensor::new(vec![2, 2, 4], TensorData::I64(vec![0, 1, 2, 0, 2, 2, 1, 0, 1, 1, 1, 1, 0, 2, 0, 2]));
    let outs = run(
        "input x: f32[A, B, C]\ninput idx: i64[A, K, C]\noutput y = gather(x, idx, axis: 1)\n",
        &[("x", &x), ("idx", &idx)],
    );
    let y = &outs[0].1;
    assert_eq!(y.shape, vec![2, 2, 4]);
    assert_eq!(y.to_f64(), [0.0, 5.0, 10.0, 3.0, 8.0, 9.0, 6.0, 3.0, 16.0, 17.0, 18.0, 19.0, 12.0, 21.0, 14.0, 23.0]);
}

#[test]
fn gather_of_a_computed_source_keeps_the_source_dtype_and_reads_it_at_the_index() {
    // The last axis (the default), an i64 source (exact past 2^53), and a bool source.
    let x = HostTensor::new(vec![2, 3], TensorData::I64(vec![(1 << 60) + 1, 2, 3, 4, 5, -6]));
    let idx = HostTensor::new(vec![2, 1], TensorData::I64(vec![0, 2]));
    let outs = run(
        "input x: i64[B, C]\ninput idx: i64[B, K]\noutput y = gather(x * 2 + 1, idx)\n\
         output neg = gather(x < 0, idx, axis: -1)\n",
        &[("x", &x), ("idx", &idx)],
    );
    match &outs[0].1.data {
        TensorData::I64(v) => assert_eq!(v, &[(1i64 << 61) + 3, -11]),
        other => panic!("y is not i64: {other:?}"),
    }
    match &outs[1].1.data {
        TensorData::Bool(v) => assert_eq!(v, &[false, true]),
        other => panic!("neg is not bool: {other:?}"),
    }
}

#[test]
fn the_gather_nll_example_matches_torch_nll_loss_in_float64() {
    // torch: nll_loss(log_softmax(x, -1), labels, ignore_index=-100) and x.grad, in float64.
    let src = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/gather_nll.kf")).unwrap();
    let g = parse_program(&src, "gather_nll.kf").unwrap_or_else(|d| panic!("{d}"));
    let x = [0.5, -1.25, 2.0, 0.75, -0.5, 1.5, 0.25, -2.0, 3.0, 0.0, -0.75, 0.5, 1.25, -1.5, 2.5];
    let args = [("logits", vec![3, 5], x.to_vec()), ("labels", vec![3], vec![2.0, -100.0, 4.0])];
    let args: Vec<(&str, Vec<usize>, Vec<f64>)> = args.into_iter().collect();
    let outs = kfuse_interp::evaluate_f64(&g, &args).unwrap_or_else(|e| panic!("{e}"));
    let by = |n: &str| outs.iter().find(|e| e.name == n).unwrap().values.clone();
    close(&by("loss"), &[0.44010097024528305], 1e-12);
    let dx = [
        0.06842409042248725,
        0.011890324019725442,
        -0.19334450180571544,
        0.0878582712162139,
        0.025171816147288847,
        0.0,
        0.0,
        0.0,
        0.0,
        0.0,
        0.013108872546506077,
        0.04575446097296236,
        0.09686219463986528,
        0.0061921929351144,
        -0.16191772109444807,
    ];
    close(&by("dlogits"), &dx, 1e-12);
}

#[test]
fn an_index_outside_the_axis_is_an_interpreter_error_naming_it() {
    let g = parse_program("input x: f32[B, C]\ninput idx: i64[B, K]\noutput y = gather(x, idx)\n", "t.kf").unwrap();
    let x = floats(vec![2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    for (bad, value) in [(3i64, "3"), (-1, "-1")] {
        let idx = HostTensor::new(vec![2, 2], TensorData::I64(vec![0, 1, 2, bad]));
        let e = kfuse_interp::run(&g, &[("x", &x), ("idx", &idx)]).unwrap_err();
        assert!(matches!(e, kfuse_interp::InterpError::GatherIndex { .. }), "{e:?}");
        let msg = e.to_string();
        for needle in [&format!("index {value}"), "position [1, 1]", "axis 1", "size 3", "0..3"] {
            assert!(msg.contains(needle), "{msg} lacks {needle}");
        }
    }
}

#[test]
fn bad_gather_calls_are_diagnostics_at_the_spot() {
    let cases: [(&str, DiagnosticKind, &[&str]); 7] = [
        ("output y = gather(x, i, axis: 2)\n", DiagnosticKind::Axis, &["`gather`", "axis 2", "out of range"]),
        ("output y = gather(x, i, axis: k)\n", DiagnosticKind::Axis, &["integer literal"]),
        ("output y = gather(x, x)\n", DiagnosticKind::Type, &["`gather`", "f32", "i32 or i64"]),
        ("output y = gather(x, i > 0)\n", DiagnosticKind::Type, &["bool", "i32 or i64"]),
        ("output y = gather(x, j)\n", DiagnosticKind::Shape, &["`gather` along axis 1", "[B]", "[B, C]"]),
        ("output y = gather(x, i, axis: 0)\n", DiagnosticKind::Shape, &["axis 0", "[B, K]", "[B, C]"]),
        ("output y = gather(x)\n", DiagnosticKind::Arguments, &["takes 2 arguments"]),
    ];
    for (body, kind, needles) in cases {
        let src = format!("input x: f32[B, C]\ninput i: i64[B, K]\ninput j: i64[B]\ninput k: i32[]\n{body}");
        let d = parse_program(&src, "t.kf").unwrap_err();
        assert_eq!(d.kind, kind, "{body}: {d}");
        let text = d.to_string();
        for n in needles {
            assert!(text.contains(n), "{body}: `{n}` missing from\n{text}");
        }
    }
    // A scalar source has no axis to gather along.
    let d = parse_program("input s: f32[]\ninput i: i64[]\noutput y = gather(s, i)\n", "t.kf").unwrap_err();
    assert_eq!(d.kind, DiagnosticKind::Shape, "{d}");
    assert!(d.to_string().contains("rank 1"), "{d}");
}
