//! `reshape`: constant axes split and merged between whole symbolic axes, end to end: hand values,
//! `-1`, gradients against finite differences on the CPU, the errors of reshapes that would split
//! a symbolic axis or change the element count, the kernels compiled by NVRTC (skips without
//! libnvrtc), and the GPU against the interpreter at odd sizes (skips without a GPU).

use std::sync::Arc;

use kfuse::{DType, Engine, HostTensor, KernelCache, Program};
use kfuse_runtime::testing::nvrtc_or_skip;
use kfuse_testing::{gpu_or_skip, random_tensor};

mod common;
use common::{compare, get, iota, program, t};

/// Splits and merges of constant axes, beside symbolic ones.
const VALUES: &str = "\
input x: f32[B, 12]
input y: f32[2, 3, 4]
output heads = reshape(x, [B, 3, 4])
output pairs = reshape(x, [B, -1, 2])
output flat = reshape(y, [24])
output swapped = reshape(y, [4, 6])
output ones = reshape(x, [1, B, 1, 12, 1])
output back = reshape(reshape(x, [B, 2, 6]), [B, 12])
";

/// Attention-style heads: a softmax over each head's columns of a wide axis, then the heads merged
/// again, with the gradient through both reshapes.
const HEADS: &str = "\
input x: f32[B, N, 64]
input w: f32[16]
let h = reshape(x, [B, N, 4, 16])
let p = softmax(h * w, axis: -1)
output probs = p
output loss = sum(reshape(p, [B, N, 64]) * x)
output dx = grad(loss, x)
output dw = grad(loss, w)
";

#[test]
fn reshapes_keep_the_row_major_order() {
    let p = program(VALUES, "reshape.kf");
    let out = p.run_cpu(&[("x", &t(&[2, 12], &iota(24))), ("y", &t(&[2, 3, 4], &iota(24)))]).expect("runs");
    assert_eq!(get(&out, "heads"), (vec![2, 3, 4], iota(24)));
    assert_eq!(get(&out, "pairs"), (vec![2, 6, 2], iota(24)));
    assert_eq!(get(&out, "flat"), (vec![24], iota(24)));
    assert_eq!(get(&out, "swapped"), (vec![4, 6], iota(24)));
    assert_eq!(get(&out, "ones"), (vec![1, 2, 1, 12, 1], iota(24)));
    assert_eq!(get(&out, "back"), (vec![2, 12], iota(24)));
}

#[test]
fn a_reshape_of_a_reshape_is_one_and_the_identity_is_none() {
    let p = program(
        "input x: f32[B, 12]\noutput y = reshape(reshape(x, [B, 2, 6]), [B, 3, 4])\noutput z = reshape(x, [B, 12])\n",
        "reshape.kf",
    );
    let g = p.graph();
    let reshapes = g.nodes.iter().filter(|n| matches!(n.op, kfuse_ir::Op::Reshape(_))).count();
    assert_eq!(reshapes, 1, "the two reshapes are one, and the identity none:\n{g:?}");
    let z = g.outputs.iter().find(|o| o.name == "z").expect("z").node;
    assert!(matches!(g.node(z).op, kfuse_ir::Op::Input(_)), "reshape(x, its own shape) is x");
}

#[test]
fn heads_softmax_gradients_match_finite_differences() {
    let p = program(HEADS, "reshape.kf");
    let (b, n) = (2usize, 1usize);
    let x: Vec<f64> = (0..b * n * 64).map(|i| ((i * 37 % 23) as f64 - 11.0) * 0.1).collect();
    let w: Vec<f64> = (0..16).map(|i| 0.5 + 0.1 * i as f64).collect();
    let run = |x: &[f64], w: &[f64]| p.run_cpu(&[("x", &t(&[b, n, 64], x)), ("w", &t(&[16], w))]).expect("runs");
    let out = run(&x, &w);
    // Each head's probabilities sum to one.
    let (shape, probs) = get(&out, "probs");
    assert_eq!(shape, vec![b, n, 4, 16]);
    for head in probs.chunks(16) {
        let s: f64 = head.iter().sum();
        assert!((s - 1.0).abs() < 1e-6, "a head's probabilities sum to {s}");
    }
    let (dx, dw) = (get(&out, "dx").1, get(&out, "dw").1);
    let loss = |x: &[f64], w: &[f64]| get(&run(x, w), "loss").1[0];
    let h = 1e-2;
    let check = |k: usize, analytic: f64, fd: f64, what: &str| {
        assert!((fd - analytic).abs() <= 3e-3 * fd.abs().max(1.0), "{what}[{k}] = {analytic}, finite difference {fd}");
    };
    for k in (0..x.len()).step_by(5) {
        let (mut up, mut down) = (x.clone(), x.clone());
        up[k] += h;
        down[k] -= h;
        check(k, dx[k], (loss(&up, &w) - loss(&down, &w)) / (2.0 * h), "dx");
    }
    for k in 0..w.len() {
        let (mut up, mut down) = (w.clone(), w.clone());
        up[k] += h;
        down[k] -= h;
        check(k, dw[k], (loss(&x, &up) - loss(&x, &down)) / (2.0 * h), "dw");
    }
}

#[test]
fn reshapes_that_split_a_symbolic_axis_or_change_the_count_are_clear_errors() {
    let cases: &[(&str, &[&str])] = &[
        ("output y = reshape(s, [M, N])\n", &["reshape", "symbolic axes must stay whole and in order"]),
        ("output y = reshape(s, [N, 2, -1])\n", &["reshape", "symbolic axes must stay whole"]),
        ("output y = reshape(x, [5, 2])\n", &["reshape", "from [3, 4] to [5, 2]", "12 elements here and 10 there"]),
        ("output y = reshape(x, [5, -1])\n", &["reshape", "no size for -1"]),
        ("output y = reshape(x, [-1, -1])\n", &["at most one size may be -1"]),
        ("output y = reshape(x, [Q, 12])\n", &["`Q` is not a dimension symbol"]),
        ("output y = reshape(x, [2.5, 12])\n", &["a dimension symbol, a size >= 0 or -1"]),
        ("output y = reshape(t, [3, N, 4])\n", &["reshape", "a symbolic axis would split or merge"]),
    ];
    for (body, words) in cases {
        let src = format!("input x: f32[3, 4]\ninput s: f32[N, M]\ninput t: f32[N, 3, 4]\n{body}");
        let engine = Engine::with_cache(Arc::new(KernelCache::memory_only()));
        let e = match Program::compile(&engine, &src, "bad.kf") {
            Ok(_) => panic!("expected an error for {body:?}"),
            Err(e) => e.to_string(),
        };
        for w in *words {
            assert!(e.contains(w), "the error for {body:?} lacks {w:?}:\n{e}");
        }
    }
}

/// A softmax over each head's columns, written as one row of the merged heads.
const MERGED_HEADS: &str = "\
input x: f32[B, N, 64]
output probs = reshape(softmax(reshape(x, [B, N, 4, 16]), axis: -1), [B, N, 64])
";

#[test]
fn an_output_that_merges_heads_is_stored_by_the_kernel_of_the_heads_rows() {
    // The output's bytes are the heads' values in order: the kernel's domain is the heads' rows
    // (each row's maximum and sum once), not the merged axis (each element re-reducing its head).
    let p = program(MERGED_HEADS, "reshape.kf");
    let notes: Vec<&str> = p.plan().kernels.iter().flat_map(|k| k.plan_notes()).collect();
    assert!(notes.iter().any(|n| n.starts_with("[B, N, 4, 16] elements; rows of the last reduced axis")), "{notes:#?}");
    let (b, n) = (2usize, 3usize);
    let x: Vec<f64> = (0..b * n * 64).map(|i| ((i * 13 % 17) as f64 - 8.0) * 0.25).collect();
    let out = p.run_cpu(&[("x", &t(&[b, n, 64], &x))]).expect("runs");
    let (shape, probs) = get(&out, "probs");
    assert_eq!(shape, vec![b, n, 64], "the declared shape of the output");
    for (head, (got, xs)) in probs.chunks(16).zip(x.chunks(16)).enumerate() {
        let m = xs.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let sum: f64 = xs.iter().map(|v| (v - m).exp()).sum();
        for (k, (g, v)) in got.iter().zip(xs).enumerate() {
            let want = (v - m).exp() / sum;
            assert!((g - want).abs() <= 1e-6, "head {head} column {k}: {g}, want {want}");
        }
    }
}

/// A group norm's scale: a per-row value (one per batch and group) times a reshape of a
/// per-channel weight, broadcast over each row of a row-wise kernel. The reshape's coordinate of
/// the weight reads no column, so the weight is read once per row, beside the value it multiplies
/// (it was once read in the column loop while that product sat outside it: CUDA that NVRTC
/// refused, "identifier is undefined").
const ROW_SCALE: &str = "\
input x: f32[B, 256, 40]
input w: f32[256]
input r: f32[B, 32, 1, 1]
let g = reshape(w, [1, 32, 8])
let s = rsqrt(r[:, :, 0, 0] + 1e-5)[.., None] * g
output y = reshape(x, [B, 32, 8, 40]) * s[.., None]
";

/// Rows merged from trailing axes of an input by a reshape, with two passes over each row (a
/// softmax): the entry for rows in registers loads the input's memory as those rows.
const MERGED_ROWS: &str = "\
input x: f32[B, 7, 20]
let r = reshape(x, [B, 140])
let e = exp(r - max(r, axis: -1, keepdim: true))
output y = e / sum(e, axis: -1, keepdim: true)
";

#[test]
fn rows_merged_by_a_reshape_of_an_input_are_kept_in_registers() {
    let p = program(MERGED_ROWS, "reshape.kf");
    let notes = p.plan().kernels[0].plan_notes().join("\n");
    assert!(notes.contains("rows kept in registers"), "{notes}");
    // The register entry reads the row from the lane's registers, not `in0` at each pass.
    let sources: Vec<&str> = p.plan().kernels[0].entries().map(|(source, _)| source).collect();
    assert!(sources.iter().any(|s| s.contains("as rows of a reshape")), "{sources:#?}");
}

/// Programs whose kernels read reshaped values in each planner shape: elementwise, row reductions
/// of a reshaped tensor (row-wise kernels), a column reduction, and gradients.
const KERNELS: &[&str] = &[
    VALUES,
    HEADS,
    MERGED_HEADS,
    MERGED_ROWS,
    "input x: f32[R, 48]\nlet h = reshape(x, [R, 3, 16])\noutput cs = sum(h, axis: 0)\n\
     output m = max(reshape(x, [R, 6, 8]), axis: -1)\noutput total = sum(reshape(x, [R, 2, 24]) * 0.5)\n",
    ROW_SCALE,
];

#[test]
fn kernels_reading_reshapes_compile_for_sm80_and_sm90() {
    if nvrtc_or_skip("kernels_reading_reshapes_compile_for_sm80_and_sm90").is_none() {
        return;
    }
    for src in KERNELS {
        let p = program(src, "reshape.kf");
        for k in &p.plan().kernels {
            for (source, entry) in k.entries() {
                kfuse_testing::assert_compiles_for_sm80_and_sm90("reshape", entry, source);
            }
        }
    }
}

#[test]
fn a_gpu_reads_reshapes_like_the_interpreter_at_odd_sizes() {
    let Some(gpu) = gpu_or_skip("a_gpu_reads_reshapes_like_the_interpreter_at_odd_sizes") else { return };
    let seed: u64 = std::env::var("KFUSE_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x5eed);
    println!("seed {seed} (KFUSE_TEST_SEED replays it)");
    let values = program(VALUES, "reshape.kf");
    for (k, b) in [1, 3, 33, 1025].into_iter().enumerate() {
        let x = random_tensor(DType::F32, &[b, 12], seed + k as u64);
        let y = random_tensor(DType::F32, &[2, 3, 4], seed + 50 + k as u64);
        compare(&values, gpu.ordinal(), &[("x", &x), ("y", &y)], &format!("values [{b}, 12]"), 1e-4);
    }
    let heads = program(HEADS, "reshape.kf");
    for (k, (b, n)) in [(1, 1), (3, 5), (33, 31), (2, 1023)].into_iter().enumerate() {
        let x = random_tensor(DType::F32, &[b, n, 64], seed + 100 + k as u64);
        let w = random_tensor(DType::F32, &[16], seed + 150 + k as u64);
        compare(&heads, gpu.ordinal(), &[("x", &x), ("w", &w)], &format!("heads [{b}, {n}, 64]"), 1e-4);
    }
    let merged = program(MERGED_HEADS, "reshape.kf");
    for (k, (b, n)) in [(1, 1), (3, 31), (1025, 3)].into_iter().enumerate() {
        let x = random_tensor(DType::F32, &[b, n, 64], seed + 170 + k as u64);
        compare(&merged, gpu.ordinal(), &[("x", &x)], &format!("merged heads [{b}, {n}, 64]"), 1e-4);
    }
    let rows = program(KERNELS[4], "reshape.kf");
    for (k, r) in [1, 3, 255, 4097].into_iter().enumerate() {
        let x = random_tensor(DType::F32, &[r, 48], seed + 200 + k as u64);
        compare(&rows, gpu.ordinal(), &[("x", &x)], &format!("rows [{r}, 48]"), 1e-4);
    }
    let merged_rows = program(MERGED_ROWS, "reshape.kf");
    for (k, b) in [1, 3, 33, 4099].into_iter().enumerate() {
        let x = random_tensor(DType::F32, &[b, 7, 20], seed + 250 + k as u64);
        compare(&merged_rows, gpu.ordinal(), &[("x", &x)], &format!("merged rows [{b}, 7, 20]"), 1e-5);
    }
    let scale = program(ROW_SCALE, "reshape.kf");
    for (k, b) in [1, 3, 33].into_iter().enumerate() {
        let x = random_tensor(DType::F32, &[b, 256, 40], seed + 300 + k as u64);
        let w = random_tensor(DType::F32, &[256], seed + 350 + k as u64);
        // Positive statistics: rsqrt of a variance.
        let r = HostTensor::from_f64(
            DType::F32,
            vec![b, 32, 1, 1],
            &random_tensor(DType::F32, &[b, 32, 1, 1], seed + 370 + k as u64)
                .to_f64()
                .iter()
                .map(|v| v.abs() + 0.5)
                .collect::<Vec<_>>(),
        );
        compare(&scale, gpu.ordinal(), &[("x", &x), ("w", &w), ("r", &r)], &format!("row scale [{b}, 256, 40]"), 1e-4);
    }
}
