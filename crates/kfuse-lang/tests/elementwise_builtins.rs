//! The elementwise builtins named as in PyTorch (log1p .. cosh, lgamma, digamma, trigamma, erfinv,
//! erfc, sign, rounding, NaN tests, atan2, remainder, fmod, hypot, copysign, floor_div, bitwise
//! ops, shifts, fma): what they lower to, their result dtypes, and the diagnostics for wrong dtypes
//! and arities.

use kfuse_ir::{BinaryOp, DType, Op, TernaryOp, UnaryOp};
use kfuse_lang::{parse_program, Diagnostic, DiagnosticKind};

const HEADER: &str = "input x: f32[N]\ninput k: i32[N]\ninput valid: bool[N]\n";

fn graph(body: &str) -> kfuse_ir::Graph {
    let src = format!("{HEADER}{body}");
    parse_program(&src, "t.kf").unwrap_or_else(|d| panic!("{body:?} should parse:\n{d}"))
}

fn error(body: &str) -> Diagnostic {
    let src = format!("{HEADER}{body}");
    match parse_program(&src, "t.kf") {
        Ok(g) => panic!("expected an error for {body:?}, got a graph:\n{g}"),
        Err(d) => d,
    }
}

/// The dtype and op of output `y` of `body`.
fn lowered(body: &str) -> (DType, Op) {
    let g = graph(body);
    let out = g.output_by_name("y").map(|o| g.node(o.node)).expect("an output y");
    (out.dtype, out.op)
}

#[test]
fn unary_builtins_lower_to_their_ops_with_pytorchs_dtypes() {
    for (name, op) in [
        ("log1p", UnaryOp::Log1p),
        ("expm1", UnaryOp::Expm1),
        ("atan", UnaryOp::Atan),
        ("tan", UnaryOp::Tan),
        ("asin", UnaryOp::Asin),
        ("acos", UnaryOp::Acos),
        ("sinh", UnaryOp::Sinh),
        ("asinh", UnaryOp::Asinh),
        ("acosh", UnaryOp::Acosh),
        ("atanh", UnaryOp::Atanh),
        ("cosh", UnaryOp::Cosh),
        ("lgamma", UnaryOp::Lgamma),
        ("digamma", UnaryOp::Digamma),
        ("trigamma", UnaryOp::Trigamma),
        ("erfinv", UnaryOp::Erfinv),
        ("erfc", UnaryOp::Erfc),
        ("sign", UnaryOp::Sign),
        ("round", UnaryOp::Round),
        ("trunc", UnaryOp::Trunc),
        ("ceil", UnaryOp::Ceil),
    ] {
        let (dtype, got) = lowered(&format!("output y = {name}(x)\n"));
        assert_eq!(dtype, DType::F32, "{name}");
        assert!(matches!(got, Op::Unary(o, _) if o == op), "{name} lowers to {got:?}");
    }
    for name in ["isnan", "isinf", "isfinite"] {
        assert_eq!(lowered(&format!("output y = {name}(x)\n")).0, DType::Bool, "{name}");
        assert_eq!(lowered(&format!("output y = {name}(k)\n")).0, DType::Bool, "{name} of an int");
    }
    // Math of an int is f32; sign, rounding and bitwise_not of an int stay i32.
    assert_eq!(lowered("output y = atan(k)\n").0, DType::F32);
    for name in ["sign", "round", "trunc", "ceil", "floor", "bitwise_not"] {
        assert_eq!(lowered(&format!("output y = {name}(k)\n")).0, DType::I32, "{name}");
    }
    for name in ["round", "trunc", "ceil", "floor"] {
        assert!(matches!(lowered(&format!("output y = {name}(k)\n")).1, Op::Input(_)), "{name} of an int is the int");
    }
    assert!(matches!(lowered("output y = bitwise_not(valid)\n").1, Op::Unary(UnaryOp::Not, _)));
}

#[test]
fn binary_builtins_lower_to_their_ops_with_pytorchs_dtypes() {
    for (call, op, dtype) in [
        ("atan2(x, 2.0)", BinaryOp::Atan2, DType::F32),
        ("atan2(k, k)", BinaryOp::Atan2, DType::F32),
        ("remainder(x, 3)", BinaryOp::Remainder, DType::F32),
        ("remainder(k, 3)", BinaryOp::Remainder, DType::I32),
        ("fmod(x, -2.5)", BinaryOp::Fmod, DType::F32),
        ("fmod(k, 3)", BinaryOp::Fmod, DType::I32),
        ("fmod(k, x)", BinaryOp::Fmod, DType::F32),
        ("hypot(x, 3.0)", BinaryOp::Hypot, DType::F32),
        ("hypot(k, k)", BinaryOp::Hypot, DType::F32),
        ("hypot(k, 4)", BinaryOp::Hypot, DType::F32),
        ("copysign(x, -1.0)", BinaryOp::Copysign, DType::F32),
        ("copysign(k, k)", BinaryOp::Copysign, DType::F32),
        ("copysign(3, x)", BinaryOp::Copysign, DType::F32),
        ("floor_div(x, -2.5)", BinaryOp::FloorDiv, DType::F32),
        ("floor_div(k, k)", BinaryOp::FloorDiv, DType::I32),
        ("bitwise_and(k, 255)", BinaryOp::BitAnd, DType::I32),
        ("bitwise_or(k, 1)", BinaryOp::BitOr, DType::I32),
        ("bitwise_xor(k, k + 1)", BinaryOp::BitXor, DType::I32),
        ("bitwise_left_shift(k, 3)", BinaryOp::Shl, DType::I32),
        ("bitwise_right_shift(k, 33)", BinaryOp::Shr, DType::I32),
        ("bitwise_and(valid, x > 0)", BinaryOp::And, DType::Bool),
        ("bitwise_or(valid, x > 0)", BinaryOp::Or, DType::Bool),
        ("bitwise_xor(valid, x > 0)", BinaryOp::Ne, DType::Bool),
    ] {
        let (d, got) = lowered(&format!("output y = {call}\n"));
        assert_eq!(d, dtype, "{call}");
        assert!(matches!(got, Op::Binary(o, _, _) if o == op), "{call} lowers to {got:?}");
    }
    let (d, got) = lowered("output y = fma(x, 2.0, k)\n");
    assert_eq!(d, DType::F32);
    assert!(matches!(got, Op::Ternary(TernaryOp::Fma, ..)));
    assert_eq!(lowered("output y = fma(k, k, 1)\n").0, DType::I32);
}

#[test]
fn wrong_dtypes_and_arities_are_reported_at_the_call() {
    use DiagnosticKind::{Arguments, Type};
    let d = error("output y = bitwise_and(x, 1)\n");
    assert_eq!(d.kind, Type, "{d}");
    assert!(d.message.contains("`bitwise_and` does not accept f32"), "{d}");
    assert!(d.expected.as_deref().unwrap_or("").contains("i32, i64 or bool"), "{d}");
    let d = error("output y = bitwise_left_shift(valid, valid)\n");
    assert_eq!(d.kind, Type, "{d}");
    assert!(d.message.contains("`bitwise_left_shift` does not accept bool operands (it takes i32 or i64)"), "{d}");
    let d = error("output y = bitwise_not(x)\n");
    assert!(d.message.contains("`bitwise_not` does not accept f32"), "{d}");
    let d = error("output y = sign(valid)\n");
    assert!(d.kind == Type && d.message.contains("`sign` does not accept bool"), "{d}");
    let d = error("output y = fma(valid, valid, valid)\n");
    assert!(d.kind == Type && d.message.contains("`fma` does not accept bool"), "{d}");
    let d = error("output y = remainder(x, valid)\n");
    assert!(d.kind == Type && d.message.contains("got f32 and bool"), "{d}");
    let d = error("output y = atan2(x)\n");
    assert_eq!(d.kind, Arguments, "{d}");
    assert!(d.message.contains("`atan2` takes 2 arguments, got 1"), "{d}");
    assert_eq!(d.expected.as_deref(), Some("atan2(y, x)"));
    for (call, name) in
        [("fmod(k, valid)", "fmod"), ("hypot(valid, x)", "hypot"), ("copysign(valid, valid)", "copysign")]
    {
        let d = error(&format!("output y = {call}\n"));
        assert_eq!(d.kind, Type, "{call}: {d}");
        assert!(d.message.contains(&format!("`{name}`")), "{call}: {d}");
    }
    for (call, signature) in
        [("fmod(x)", "fmod(a, b)"), ("hypot(x, x, x)", "hypot(a, b)"), ("copysign()", "copysign(a, b)")]
    {
        let d = error(&format!("output y = {call}\n"));
        assert_eq!(d.kind, Arguments, "{call}: {d}");
        assert_eq!(d.expected.as_deref(), Some(signature), "{call}");
    }
    let d = error("output y = fma(x, x)\n");
    assert!(d.kind == Arguments && d.message.contains("`fma` takes 3 arguments"), "{d}");
    let d = error("output y = floor_divide(x, 2)\n");
    assert!(d.expected.as_deref().unwrap_or("").contains("floor_div"), "{d}");
}

#[test]
fn infix_operators_are_the_named_functions_with_pythons_precedence() {
    // Each operator builds exactly the graph of the function it stands for.
    for (infix, named) in [
        ("k % 3", "remainder(k, 3)"),
        ("x // 2", "floor_div(x, 2)"),
        ("k & 3", "bitwise_and(k, 3)"),
        ("k | 3", "bitwise_or(k, 3)"),
        ("k ^ 3", "bitwise_xor(k, 3)"),
        ("~k", "bitwise_not(k)"),
        ("~valid", "bitwise_not(valid)"),
        ("k << 2", "bitwise_left_shift(k, 2)"),
        ("k >> 1", "bitwise_right_shift(k, 1)"),
        ("valid & (x > 0)", "bitwise_and(valid, x > 0)"),
        // Precedence: | < ^ < & < shifts < + - < * / // % < unary - ~, all above comparisons.
        ("k | k ^ k & k", "bitwise_or(k, bitwise_xor(k, bitwise_and(k, k)))"),
        ("k & k << 1 + 1", "bitwise_and(k, bitwise_left_shift(k, 1 + 1))"),
        ("k + k % 3 * 2", "k + remainder(k, 3) * 2"),
        ("-k // 2", "floor_div(-k, 2)"),
        ("~k & 7", "bitwise_and(bitwise_not(k), 7)"),
        ("k | 1 == 3", "bitwise_or(k, 1) == 3"),
        ("k >> 1 >> 1", "bitwise_right_shift(bitwise_right_shift(k, 1), 1)"),
    ] {
        let (a, b) = (graph(&format!("output y = {infix}\n")), graph(&format!("output y = {named}\n")));
        assert_eq!(a.to_string(), b.to_string(), "{infix} should be {named}");
    }
    // Wrong dtypes are the functions' errors, at the operator.
    let d = error("output y = x & 1\n");
    assert!(d.kind == DiagnosticKind::Type && d.message.contains("bitwise_and"), "{d}");
    // Comparisons bind looser, as in Python: this chains two comparisons.
    let d = error("output y = x > 0 & x < 1\n");
    assert!(d.message.contains("comparisons do not chain"), "{d}");
}

#[test]
fn c_style_logical_operators_point_at_the_words() {
    for (body, hint) in [("output y = valid && valid\n", "`and`"), ("output y = valid || valid\n", "`or`")] {
        let d = error(body);
        assert_eq!(d.kind, DiagnosticKind::Syntax, "{d}");
        assert!(d.expected.as_deref().unwrap_or("").contains(hint), "{body:?}: {d}");
    }
}

#[test]
fn fmod_hypot_and_copysign_of_ints_cast_to_f32_and_fmod_of_ints_stays_an_int() {
    // The int operands of hypot and copysign become f32 casts (as torch promotes them); fmod keeps
    // i32 (and i64) operands as they are.
    for call in ["hypot(k, k)", "copysign(k, 2)"] {
        let g = graph(&format!("output y = {call}\n"));
        let out = g.node(g.output_by_name("y").unwrap().node);
        let Op::Binary(_, a, _) = out.op else { panic!("{call} lowers to {:?}", out.op) };
        assert!(matches!(g.node(a).op, Op::Cast(_)) && g.node(a).dtype == DType::F32, "{call}: {:?}", g.node(a));
    }
    let g = graph("output y = fmod(k, k)\n");
    let out = g.node(g.output_by_name("y").unwrap().node);
    assert!(matches!(out.op, Op::Binary(BinaryOp::Fmod, a, b) if matches!(g.node(a).op, Op::Input(_)) && a == b));
    let src = "input a: i64[N]\ninput b: i32[N]\noutput y = fmod(a, b)\n";
    let g = parse_program(src, "t.kf").unwrap_or_else(|d| panic!("{d}"));
    assert_eq!(g.node(g.output_by_name("y").unwrap().node).dtype, DType::I64);
    // f16 and bf16 operands keep their dtype (computed in f32, as every float op).
    for dt in ["f16", "bf16"] {
        let src =
            format!("input h: {dt}[N]\noutput f = fmod(h, 2)\noutput n = hypot(h, h)\noutput c = copysign(h, -1.0)\n");
        let g = parse_program(&src, "t.kf").unwrap_or_else(|d| panic!("{d}"));
        for o in ["f", "n", "c"] {
            assert_eq!(g.node(g.output_by_name(o).unwrap().node).dtype.to_string(), dt, "{o} of {dt}");
        }
    }
}

#[test]
fn fmod_hypot_and_copysign_compute_torchs_values() {
    let src = "input a: f32[N]\ninput b: f32[N]\ninput i: i32[N]\ninput j: i32[N]\n\
               output f = fmod(a, b)\noutput h = hypot(a, b)\noutput c = copysign(a, b)\noutput fi = fmod(i, j)\n";
    let g = parse_program(src, "t.kf").unwrap_or_else(|d| panic!("{d}"));
    let f32s = |v: &[f32]| kfuse_ir::HostTensor::new(vec![v.len()], kfuse_ir::TensorData::F32(v.to_vec()));
    let i32s = |v: &[i32]| kfuse_ir::HostTensor::new(vec![v.len()], kfuse_ir::TensorData::I32(v.to_vec()));
    let (a, b) = (f32s(&[7.5, -7.5, 3.0, -0.0]), f32s(&[2.0, 2.0, -4.0, 1.0]));
    let (i, j) = (i32s(&[7, -7, 7, i32::MIN]), i32s(&[-3, 3, 0, -1]));
    let outs = kfuse_interp::run(&g, &[("a", &a), ("b", &b), ("i", &i), ("j", &j)]).unwrap_or_else(|e| panic!("{e}"));
    let out = |name: &str| outs.iter().find(|(n, _)| n == name).unwrap().1.to_f64();
    assert_eq!(out("f"), [1.5, -1.5, 3.0, -0.0]);
    assert!(out("f")[3].is_sign_negative(), "fmod keeps the dividend's -0.0");
    assert_eq!(out("h"), [7.5f64.hypot(2.0) as f32 as f64, 7.5f64.hypot(2.0) as f32 as f64, 5.0, 1.0]);
    assert_eq!(out("c"), [7.5, 7.5, -3.0, 0.0]);
    assert!(out("c")[3].is_sign_positive(), "copysign(-0.0, 1.0) is +0.0");
    // C's truncated remainder; by 0 gives 0 and i32::MIN by -1 gives 0.
    assert_eq!(out("fi"), [1.0, -1.0, 0.0, 0.0]);
}

#[test]
fn special_functions_of_ints_cast_to_f32_and_half_floats_keep_their_dtype() {
    // As torch.lgamma/digamma/polygamma/erfinv/erfc promote integer tensors to the default float.
    for name in ["lgamma", "digamma", "trigamma", "erfinv", "erfc"] {
        let g = graph(&format!("output y = {name}(k)\n"));
        let out = g.node(g.output_by_name("y").unwrap().node);
        assert_eq!(out.dtype, DType::F32, "{name} of an i32");
        let Op::Unary(_, a) = out.op else { panic!("{name} lowers to {:?}", out.op) };
        assert!(matches!(g.node(a).op, Op::Cast(_)) && g.node(a).dtype == DType::F32, "{name}: {:?}", g.node(a));
        let src = format!("input n: i64[N]\noutput y = {name}(n)\n");
        let g = parse_program(&src, "t.kf").unwrap_or_else(|d| panic!("{d}"));
        assert_eq!(g.node(g.output_by_name("y").unwrap().node).dtype, DType::F32, "{name} of an i64");
        for dt in ["f16", "bf16"] {
            let src = format!("input h: {dt}[N]\noutput y = {name}(h)\n");
            let g = parse_program(&src, "t.kf").unwrap_or_else(|d| panic!("{d}"));
            assert_eq!(g.node(g.output_by_name("y").unwrap().node).dtype.to_string(), dt, "{name} of {dt}");
        }
        let d = error(&format!("output y = {name}(valid)\n"));
        assert!(d.kind == DiagnosticKind::Type && d.message.contains(&format!("`{name}` does not accept bool")), "{d}");
        let d = error(&format!("output y = {name}(x, x)\n"));
        assert_eq!(d.kind, DiagnosticKind::Arguments, "{name}: {d}");
    }
    for (typo, name) in [("lgama", "lgamma"), ("digama", "digamma"), ("erf_inv", "erfinv"), ("erfcc", "erfc")] {
        let d = error(&format!("output y = {typo}(x)\n"));
        assert!(d.expected.as_deref().unwrap_or("").contains(name), "{typo}: {d}");
    }
}

#[test]
fn special_functions_compute_torchs_values_and_grad_through_trigamma_is_refused() {
    let src = "input x: f32[N]\ninput k: i32[N]\ninput u: f32[N]\n\
               output l = lgamma(x)\noutput d = digamma(x)\noutput t = trigamma(x)\noutput e = erfinv(u)\n\
               output lk = lgamma(k)\n";
    let g = parse_program(src, "t.kf").unwrap_or_else(|d| panic!("{d}"));
    let f32s = |v: &[f32]| kfuse_ir::HostTensor::new(vec![v.len()], kfuse_ir::TensorData::F32(v.to_vec()));
    let x = f32s(&[1.0, 0.5, 0.0, -1.0]);
    let u = f32s(&[0.5, -1.0, 1.5, 0.0]);
    let k = kfuse_ir::HostTensor::new(vec![4], kfuse_ir::TensorData::I32(vec![1, 4, 0, -2]));
    let outs = kfuse_interp::run(&g, &[("x", &x), ("k", &k), ("u", &u)]).unwrap_or_else(|e| panic!("{e}"));
    let out = |name: &str| outs.iter().find(|(n, _)| n == name).unwrap().1.to_f64();
    let (inf, r) = (f64::INFINITY, |v: f64| v as f32 as f64);
    // ln Γ(1) = 0, ln Γ(1/2) = ln √π; Γ has poles at 0 and the negative integers.
    assert_eq!(out("l"), [0.0, r(std::f64::consts::PI.sqrt().ln()), inf, inf]);
    assert_eq!(out("lk"), [0.0, r(6f64.ln()), inf, inf]);
    let d = out("d");
    assert_eq!(d[..3], [r(-0.5772156649015329), r(-1.9635100260214235), -inf]);
    assert!(d[3].is_nan(), "digamma at a negative integer is NaN: {d:?}");
    let pi2 = std::f64::consts::PI * std::f64::consts::PI;
    assert_eq!(out("t"), [r(pi2 / 6.0), r(pi2 / 2.0), inf, inf]);
    let e = out("e");
    assert_eq!(e[..2], [r(0.4769362762044699), -inf]);
    assert!(e[2].is_nan() && e[3] == 0.0, "erfinv outside [-1, 1] is NaN, of 0 is 0: {e:?}");
    // PyTorch's gradient of polygamma(1, x) is polygamma(2, x), which kfuse lacks: an error, not a wrong value.
    let d = error("output y = grad(sum(trigamma(x)), x)\n");
    assert_eq!(d.kind, DiagnosticKind::Grad, "{d}");
    assert!(d.message.contains("trigamma"), "{d}");
    graph("output y = grad(sum(lgamma(x) + digamma(x) + erfinv(x)), x)\n");
}

#[test]
fn erfc_computes_torchs_values_where_one_minus_erf_cancels() {
    let src = "input x: f32[N]\ninput k: i32[N]\n\
               output c = erfc(x)\noutput d = 1.0 - erf(x)\noutput ck = erfc(k)\n";
    let g = parse_program(src, "t.kf").unwrap_or_else(|d| panic!("{d}"));
    let x =
        kfuse_ir::HostTensor::new(vec![6], kfuse_ir::TensorData::F32(vec![0.0, 0.5, 5.0, 10.0, -1.0, f32::INFINITY]));
    let k = kfuse_ir::HostTensor::new(vec![6], kfuse_ir::TensorData::I32(vec![0, 1, 5, 10, -1, -6]));
    let outs = kfuse_interp::run(&g, &[("x", &x), ("k", &k)]).unwrap_or_else(|e| panic!("{e}"));
    let out = |name: &str| outs.iter().find(|(n, _)| n == name).unwrap().1.to_f64();
    let r = |v: f64| v as f32 as f64;
    // torch.erfc in float64 (SciPy's erfc agrees), rounded to f32: erfc(10), about 2.09e-45,
    // rounds to the smallest f32 subnormal, where 1 - erf(10) is 0 (erf(10) is 1 even in f64).
    let c = out("c");
    assert_eq!(
        c,
        [1.0, r(0.4795001221869535), r(1.537459794428035e-12), r(2.088487583762545e-45), r(1.8427007929497148), 0.0]
    );
    assert_eq!(c[3], f32::from_bits(1) as f64, "erfc(10) in f32 is the smallest subnormal, not 0");
    let d = out("d");
    assert_eq!(d[3], 0.0, "1 - erf(10) cancels to 0: {d:?}");
    let ck = out("ck");
    assert_eq!(
        ck[..5],
        [1.0, r(0.15729920705028513), r(1.537459794428035e-12), r(2.088487583762545e-45), r(1.8427007929497148)]
    );
    assert_eq!(ck[5], 2.0, "erfc(-6) rounds to 2");
    graph("output y = grad(sum(erfc(x) * x), x)\n");
}

#[test]
fn rounded_rounds_half_floats_to_their_dtype_and_leaves_other_dtypes_alone() {
    let src = "input h: f16[N]\ninput b: bf16[N]\ninput x: f32[N]\ninput k: i32[N]\n\
               output rh = rounded(h * 1.1)\noutput uh = h * 1.1\noutput rb = rounded(b * 1.1)\n\
               output rx = rounded(x * 1.1)\noutput rk = rounded(k)\noutput c = rounded(b * 0.0 + 0.1)\n\
               output g = grad(sum(rounded(b * 3.0) * b), b)\n";
    let g = parse_program(src, "t.kf").unwrap_or_else(|d| panic!("{d}"));
    // `rounded` stays only where it rounds: of f16 and bf16 values computed in the graph.
    let kept = g.nodes.iter().filter(|n| matches!(n.op, Op::Unary(UnaryOp::Rounded, _))).count();
    assert_eq!(kept, 4, "rh, rb, c and g's rounded(b * 3.0)");
    let t = |dtype: DType, v: Vec<f64>| kfuse_ir::HostTensor::from_f64(dtype, vec![v.len()], &v);
    let (h, b) = (t(DType::F16, vec![1.0, 3.0]), t(DType::BF16, vec![1.0, 3.0]));
    let (x, k) = (t(DType::F32, vec![1.0, 3.0]), t(DType::I32, vec![-2.0, 7.0]));
    let outs = kfuse_interp::run(&g, &[("h", &h), ("b", &b), ("x", &x), ("k", &k)]).unwrap_or_else(|e| panic!("{e}"));
    let out = |name: &str| outs.iter().find(|(n, _)| n == name).unwrap().1.to_f64();
    // f16's and bf16's nearest values to 1.1 and 3.3 (ties to even), as torch rounds `h * 1.1`.
    assert_eq!(out("rh"), [1.099609375, 3.30078125]);
    assert_eq!(out("rb"), [1.1015625, 3.296875]);
    assert_eq!(out("rx"), [1.1f32 as f64, (3.0f64 * 1.1) as f32 as f64]);
    assert_eq!(out("rk"), [-2.0, 7.0]);
    assert_eq!(out("c"), [0.10009765625, 0.10009765625], "bf16's 0.1");
    // The gradient passes through unchanged: d/db sum(rounded(3b) * b) = rounded(3b) + 3b.
    assert_eq!(out("g"), [6.0, 18.0]);
    // Of a bool, as of an int or an f32, the value itself.
    assert!(matches!(lowered("output y = rounded(valid)\n"), (DType::Bool, Op::Input(_))));
}
