//! The `i64` dtype from source to the interpreter: declarations, casts, promotion, wrapping
//! arithmetic at 2^63, floor division, remainder and fmod with PyTorch's signs, shifts, reductions, and
//! the diagnostics of what does not apply to it.

use kfuse_ir::{DType, HostTensor, TensorData};
use kfuse_lang::{parse_program, DiagnosticKind};

fn longs(v: &[i64]) -> HostTensor {
    HostTensor::new(vec![v.len()], TensorData::I64(v.to_vec()))
}

/// Runs `src` on the named inputs and returns its outputs by name.
fn run(src: &str, inputs: &[(&str, &HostTensor)]) -> Vec<(String, HostTensor)> {
    let g = parse_program(src, "t.kf").unwrap_or_else(|d| panic!("{d}"));
    kfuse_interp::run(&g, inputs).unwrap_or_else(|e| panic!("{e}"))
}

fn out_i64(outs: &[(String, HostTensor)], name: &str) -> Vec<i64> {
    match &outs.iter().find(|(n, _)| n == name).unwrap_or_else(|| panic!("no output {name}")).1.data {
        TensorData::I64(v) => v.clone(),
        other => panic!("{name} is not i64: {other:?}"),
    }
}

fn out_f64(outs: &[(String, HostTensor)], name: &str) -> Vec<f64> {
    outs.iter().find(|(n, _)| n == name).unwrap_or_else(|| panic!("no output {name}")).1.to_f64()
}

#[test]
fn i64_arithmetic_wraps_at_two_to_the_63_and_keeps_every_bit() {
    let x = longs(&[i64::MAX, i64::MIN, (1 << 53) + 1, -7]);
    let outs = run(
        "input x: i64[N]\noutput a = x + 1\noutput s = x - 1\noutput m = x * 3\noutput n = -x\noutput b = abs(x)\n\
         output same = x\n",
        &[("x", &x)],
    );
    assert_eq!(out_i64(&outs, "a"), [i64::MIN, i64::MIN + 1, (1 << 53) + 2, -6]);
    assert_eq!(out_i64(&outs, "s"), [i64::MAX - 1, i64::MAX, 1 << 53, -8]);
    assert_eq!(out_i64(&outs, "m"), [i64::MAX.wrapping_mul(3), i64::MIN.wrapping_mul(3), 3 * ((1 << 53) + 1), -21]);
    assert_eq!(out_i64(&outs, "n"), [-i64::MAX, i64::MIN, -(1 << 53) - 1, 7]);
    assert_eq!(out_i64(&outs, "b"), [i64::MAX, i64::MIN, (1 << 53) + 1, 7]);
    assert_eq!(out_i64(&outs, "same"), [i64::MAX, i64::MIN, (1 << 53) + 1, -7]);
}

#[test]
fn floor_division_and_remainder_take_the_signs_torch_gives() {
    let a = longs(&[7, -7, 7, -7, i64::MIN, 5, 1 << 40]);
    let b = longs(&[2, 2, -2, -2, -1, 0, 3]);
    let outs = run("input a: i64[N]\ninput b: i64[N]\noutput q = a // b\noutput r = a % b\n", &[("a", &a), ("b", &b)]);
    // torch.floor_divide / torch.remainder; by 0 gives 0, i64::MIN // -1 wraps.
    assert_eq!(out_i64(&outs, "q"), [3, -4, -4, 3, i64::MIN, 0, (1 << 40) / 3]);
    assert_eq!(out_i64(&outs, "r"), [1, 1, -1, -1, 0, 0, (1 << 40) % 3]);
}

#[test]
fn fmod_of_i64_takes_the_sign_of_the_dividend() {
    let a = longs(&[7, -7, 7, -7, i64::MIN, 5, i64::MIN, 1 << 40]);
    let b = longs(&[2, 2, -2, -2, -1, 0, i64::MAX, 3]);
    let outs = run("input a: i64[N]\ninput b: i64[N]\noutput r = fmod(a, b)\n", &[("a", &a), ("b", &b)]);
    // torch.fmod (C's truncated remainder); by 0 gives 0, i64::MIN by -1 gives 0.
    assert_eq!(out_i64(&outs, "r"), [1, -1, 1, -1, 0, 0, -1, (1 << 40) % 3]);
}

#[test]
fn bitwise_ops_shifts_comparisons_min_max_where_and_clamp_of_i64() {
    let x = longs(&[0x0f0f_0f0f_0f0f_0f0f, -1, 1 << 62, 5]);
    let n = longs(&[4, 63, 1, 64]);
    let outs = run(
        "input x: i64[N]\ninput n: i64[N]\n\
         output band = x & 255\noutput bor = x | n\noutput bxor = x ^ n\noutput bnot = ~x\n\
         output shl = x << n\noutput shr = x >> n\n\
         output lt = where(x < n, 1, 0)\noutput lo = min(x, n)\noutput hi = max(x, n)\n\
         output c = clamp(x, -3, 1 << 20)\noutput w = where(x > 0, x, n)\n",
        &[("x", &x), ("n", &n)],
    );
    assert_eq!(out_i64(&outs, "band"), [0x0f, 0xff, 0, 5]);
    assert_eq!(out_i64(&outs, "bor"), [0x0f0f_0f0f_0f0f_0f0f, -1, (1 << 62) | 1, 69]);
    assert_eq!(out_i64(&outs, "bxor"), [0x0f0f_0f0f_0f0f_0f0b, !63, (1 << 62) | 1, 69]);
    assert_eq!(out_i64(&outs, "bnot"), [!0x0f0f_0f0f_0f0f_0f0f, 0, !(1 << 62), !5]);
    // Bits shifted out are lost; a count of 64 or more gives 0 (left) or the sign (right).
    assert_eq!(out_i64(&outs, "shl"), [0x0f0f_0f0f_0f0f_0f0fi64 << 4, i64::MIN, i64::MIN, 0]);
    assert_eq!(out_i64(&outs, "shr"), [0x00f0_f0f0_f0f0_f0f0, -1, 1 << 61, 0]);
    assert_eq!(out_f64(&outs, "lt"), [0.0, 1.0, 0.0, 1.0]);
    assert_eq!(out_i64(&outs, "lo"), [4, -1, 1, 5]);
    assert_eq!(out_i64(&outs, "hi"), [0x0f0f_0f0f_0f0f_0f0f, 63, 1 << 62, 64]);
    assert_eq!(out_i64(&outs, "c"), [1 << 20, -1, 1 << 20, 5]);
    assert_eq!(out_i64(&outs, "w"), [0x0f0f_0f0f_0f0f_0f0f, 63, 1 << 62, 5]);
}

#[test]
fn i32_meets_i64_at_i64_and_floats_win_over_both() {
    let x = longs(&[1 << 40, -3]);
    let k = HostTensor::new(vec![2], TensorData::I32(vec![i32::MAX, 2]));
    let src = "input x: i64[N]\ninput k: i32[N]\noutput s = x + k\noutput kk = k + k\noutput f = x * 0.5\n\
               output d = x / k\noutput big = i64(k) * 4\n";
    let g = parse_program(src, "t.kf").expect("parses");
    let dtypes: Vec<DType> = g.outputs.iter().map(|o| g.node(o.node).dtype).collect();
    assert_eq!(dtypes, [DType::I64, DType::I32, DType::F32, DType::F32, DType::I64]);
    let outs = run(src, &[("x", &x), ("k", &k)]);
    assert_eq!(out_i64(&outs, "s"), [(1 << 40) + i32::MAX as i64, -1]);
    assert_eq!(out_f64(&outs, "kk"), [-2.0, 4.0], "i32 + i32 still wraps at 32 bits");
    assert_eq!(out_f64(&outs, "f"), [(1u64 << 39) as f64, -1.5]);
    assert_eq!(out_f64(&outs, "d")[1], -1.5);
    assert_eq!(out_i64(&outs, "big"), [4 * i32::MAX as i64, 8]);
}

#[test]
fn casts_to_and_from_i64_truncate_wrap_and_saturate_as_documented() {
    let f = HostTensor::new(vec![6], TensorData::F32(vec![2.9, -2.9, 1e20, -1e20, f32::NAN, 0.0]));
    let outs = run("input f: f32[N]\noutput l = i64(f)\noutput b = bool(i64(f))\n", &[("f", &f)]);
    assert_eq!(out_i64(&outs, "l"), [2, -2, i64::MAX, i64::MIN, 0, 0]);
    assert_eq!(out_f64(&outs, "b"), [1.0, 1.0, 1.0, 1.0, 0.0, 0.0]);
    let x = longs(&[(1 << 32) + 5, -1, 1 << 31, (1 << 53) + 1]);
    let outs = run("input x: i64[N]\noutput i = i32(x)\noutput f = f32(x)\noutput back = i64(i32(x))\n", &[("x", &x)]);
    // i64 to i32 keeps the low 32 bits, as torch's .to(torch.int32).
    assert_eq!(out_f64(&outs, "i"), [5.0, -1.0, i32::MIN as f64, 1.0]);
    // Rounded to nearest when stored as f32.
    assert_eq!(out_f64(&outs, "f"), [((1u64 << 32) + 5) as f32 as f64, -1.0, (1u64 << 31) as f64, (1u64 << 53) as f64]);
    assert_eq!(out_i64(&outs, "back"), [5, -1, i32::MIN as i64, 1]);
    let b = HostTensor::new(vec![2], TensorData::Bool(vec![true, false]));
    let outs = run("input b: bool[N]\noutput l = i64(b) + 10\n", &[("b", &b)]);
    assert_eq!(out_i64(&outs, "l"), [11, 10]);
}

#[test]
fn reductions_of_i64_are_exact_within_two_to_the_53() {
    let big = 1i64 << 52;
    let x = HostTensor::new(vec![2, 3], TensorData::I64(vec![big, big - 1, -5, 1, 2, 3]));
    let outs = run(
        "input x: i64[B, C]\noutput s = sum(x)\noutput rows = sum(x, axis: -1)\noutput hi = max(x, axis: -1)\n\
         output lo = min(x)\noutput m = mean(x, axis: -1)\noutput pos = count(x > 1, axis: -1)\n",
        &[("x", &x)],
    );
    assert_eq!(out_i64(&outs, "s"), [2 * big - 1 - 5 + 6]);
    assert_eq!(out_i64(&outs, "rows"), [2 * big - 6, 6]);
    assert_eq!(out_i64(&outs, "hi"), [big, 3]);
    assert_eq!(out_i64(&outs, "lo"), [-5]);
    assert_eq!(out_f64(&outs, "m")[1], 2.0);
    assert_eq!(out_f64(&outs, "pos"), [2.0, 2.0]);
    let g = parse_program("input x: i64[N]\noutput m = mean(x)\noutput c = count(x > 0)\n", "t.kf").expect("parses");
    let dtypes: Vec<DType> = g.outputs.iter().map(|o| g.node(o.node).dtype).collect();
    assert_eq!(dtypes, [DType::F32, DType::I32], "mean gives f32 and count i32, as for i32 operands");
}

#[test]
fn a_one_hot_from_iota_and_i64_labels_picks_each_rows_label() {
    let logits = HostTensor::new(vec![2, 3], TensorData::F32(vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]));
    let labels = longs(&[2, 0]);
    let outs = run(
        "input logits: f32[B, C]\ninput labels: i64[B]\n\
         output picked = sum(where(iota(logits, axis: -1) == labels[.., None], logits, 0.0), axis: -1)\n",
        &[("logits", &logits), ("labels", &labels)],
    );
    assert_eq!(out_f64(&outs, "picked"), [3.0, 4.0]);
}

#[test]
fn what_does_not_apply_to_i64_is_a_diagnostic_naming_it() {
    let err = |src: &str| parse_program(src, "t.kf").expect_err("an error");
    let d = err("input x: i64[N]\noutput y = x & 1.5\n");
    assert_eq!(d.kind, DiagnosticKind::Type, "{d}");
    assert!(d.message.contains("f32") && d.message.contains("i64"), "{d}");
    let d = err("input x: bool[N]\noutput y = x << true\n");
    assert!(d.message.contains("it takes i32 or i64"), "{d}");
    let d = err("input x: i64[N]\noutput y = x + true\n");
    assert!(d.message.contains("i64") && d.message.contains("bool"), "{d}");
    let d = err("input x: i65[N]\noutput y = x\n");
    assert!(d.message.contains("unknown dtype `i65`"), "{d}");
    assert!(d.to_string().contains("i64"), "the dtypes listed name i64: {d}");
    // Float math of an i64 computes in f32, as for i32.
    let g = parse_program("input x: i64[N]\noutput y = exp(x)\n", "t.kf").expect("parses");
    assert_eq!(g.node(g.outputs[0].node).dtype, DType::F32);
}

#[test]
fn the_cross_entropy_example_is_torchs_smoothed_mean_over_labels_not_ignored() {
    let src = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/cross_entropy_train.kf"))
        .expect("the example");
    let (b, c) = (5usize, 3usize);
    let logits: Vec<f32> = (0..b * c).map(|i| ((i * 7 % 11) as f32 - 5.0) * 0.7).collect();
    let labels = [2i64, -100, 0, 1, -100];
    let lt = HostTensor::new(vec![b, c], TensorData::F32(logits.clone()));
    let outs = run(&src, &[("logits", &lt), ("labels", &longs(&labels))]);
    // torch: (1 - e) * nll_mean + e / C * sum(-sum_c log_probs, kept) / kept, with e = 0.1.
    let (mut nll, mut smooth, mut kept) = (0.0, 0.0, 0.0);
    for (row, &label) in logits.chunks(c).zip(&labels) {
        let row: Vec<f64> = row.iter().map(|&v| f64::from(v)).collect();
        let m = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let lse = m + row.iter().map(|v| (v - m).exp()).sum::<f64>().ln();
        if label != -100 {
            nll -= row[label as usize] - lse;
            smooth -= row.iter().map(|v| v - lse).sum::<f64>();
            kept += 1.0;
        }
    }
    let want = 0.9 * nll / kept + 0.1 / c as f64 * smooth / kept;
    let got = out_f64(&outs, "loss")[0];
    assert!((got - want).abs() <= 1e-6 * want.abs(), "loss {got} vs torch's formula {want}");
    // Ignored rows get no gradient; each kept row's gradient sums to 0 (softmax minus a target
    // distribution).
    let d = out_f64(&outs, "dlogits");
    for (row, &label) in d.chunks(c).zip(&labels) {
        let s: f64 = row.iter().sum();
        if label == -100 {
            assert!(row.iter().all(|&v| v == 0.0), "{row:?}");
        } else {
            assert!(s.abs() < 1e-6, "{row:?}");
        }
    }
}

#[test]
fn reductions_of_i64_over_leading_and_listed_axes_keep_i64() {
    // [2, 3]: rows [1, -2, 3] and [40, 50, -60].
    let x = HostTensor::new(vec![2, 3], TensorData::I64(vec![1, -2, 3, 40, 50, -60]));
    let outs = run(
        "input x: i64[R, C]\noutput cols = sum(x, axis: 0)\noutput hi = max(x, axis: -2, keepdim: true)\n\
         output all = sum(x, axis: [0, 1])\noutput lo = min(x, axis: [1])\n",
        &[("x", &x)],
    );
    assert_eq!(out_i64(&outs, "cols"), vec![41, 48, -57]);
    assert_eq!(out_i64(&outs, "hi"), vec![40, 50, 3]);
    assert_eq!(out_i64(&outs, "all"), vec![32]);
    assert_eq!(out_i64(&outs, "lo"), vec![-2, -60]);
}
