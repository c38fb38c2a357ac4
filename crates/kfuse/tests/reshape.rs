//! `reshape`: constant axes split and merged between whole symbolic axes, end to end: hand values,
//! `-1`, gradients against finite differences on the CPU, the errors of reshapes that would split
//! a symbolic axis or change the element count, the kernels compiled by NVRTC (skips without
//! libnvrtc), and the GPU against the interpreter at odd sizes (skips without a GPU).

use std::sync::Arc;

use kfuse::{DType, Engine, HostTensor, KernelCache, Program};
use kfuse_runtime::testing::nvrtc_or_skip;
use kfuse_testing::{gpu_or_skip, random_tensor};

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

fn program(src: &str) -> Program {
    let engine = Engine::with_cache(Arc::new(KernelCache::memory_only()));
    Program::compile(&engine, src, "reshape.kf").unwrap_or_else(|e| panic!("compiles: {e}"))
}

fn t(shape: &[usize], v: &[f64]) -> HostTensor {
    HostTensor::from_f64(DType::F32, shape.to_vec(), v)
}

fn iota(n: usize) -> Vec<f64> {
    (0..n).map(|i| i as f64).collect()
}

fn get(out: &[(String, HostTensor)], name: &str) -> (Vec<usize>, Vec<f64>) {
    out.iter().find(|(n, _)| n == name).map(|(_, v)| (v.shape.clone(), v.to_f64())).expect("an output of that name")
}

#[test]
fn reshapes_keep_the_row_major_order() {
    let p = program(VALUES);
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
    );
    let g = p.graph();
    let reshapes = g.nodes.iter().filter(|n| matches!(n.op, kfuse_ir::Op::Reshape(_))).count();
    assert_eq!(reshapes, 1, "the two reshapes are one, and the identity none:\n{g:?}");
    let z = g.outputs.iter().find(|o| o.name == "z").expect("z").node;
    assert!(matches!(g.node(z).op, kfuse_ir::Op::Input(_)), "reshape(x, its own shape) is x");
}

#[test]
fn heads_softmax_gradients_match_finite_differences() {
    let p = program(HEADS);
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

/// Programs whose kernels read reshaped values in each planner shape: elementwise, row reductions
/// of a reshaped tensor (row-wise kernels), a column reduction, and gradients.
const KERNELS: &[&str] = &[
    VALUES,
    HEADS,
    "input x: f32[R, 48]\nlet h = reshape(x, [R, 3, 16])\noutput cs = sum(h, axis: 0)\n\
     output m = max(reshape(x, [R, 6, 8]), axis: -1)\noutput total = sum(reshape(x, [R, 2, 24]) * 0.5)\n",
];

#[test]
fn kernels_reading_reshapes_compile_for_sm80_and_sm90() {
    if nvrtc_or_skip("kernels_reading_reshapes_compile_for_sm80_and_sm90").is_none() {
        return;
    }
    for src in KERNELS {
        let p = program(src);
        for k in &p.plan().kernels {
            kfuse_testing::assert_compiles_for_sm80_and_sm90("reshape", &k.name, &k.source);
        }
    }
}

#[test]
fn a_gpu_reads_reshapes_like_the_interpreter_at_odd_sizes() {
    let Some(gpu) = gpu_or_skip("a_gpu_reads_reshapes_like_the_interpreter_at_odd_sizes") else { return };
    let seed: u64 = std::env::var("KFUSE_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x5eed);
    println!("seed {seed} (KFUSE_TEST_SEED replays it)");
    let values = program(VALUES);
    for (k, b) in [1, 3, 33, 1025].into_iter().enumerate() {
        let x = random_tensor(DType::F32, &[b, 12], seed + k as u64);
        let y = random_tensor(DType::F32, &[2, 3, 4], seed + 50 + k as u64);
        compare(&values, gpu.ordinal(), &[("x", &x), ("y", &y)], &format!("values [{b}, 12]"));
    }
    let heads = program(HEADS);
    for (k, (b, n)) in [(1, 1), (3, 5), (33, 31), (2, 1023)].into_iter().enumerate() {
        let x = random_tensor(DType::F32, &[b, n, 64], seed + 100 + k as u64);
        let w = random_tensor(DType::F32, &[16], seed + 150 + k as u64);
        compare(&heads, gpu.ordinal(), &[("x", &x), ("w", &w)], &format!("heads [{b}, {n}, 64]"));
    }
    let rows = program(KERNELS[2]);
    for (k, r) in [1, 3, 255, 4097].into_iter().enumerate() {
        let x = random_tensor(DType::F32, &[r, 48], seed + 200 + k as u64);
        compare(&rows, gpu.ordinal(), &[("x", &x)], &format!("rows [{r}, 48]"));
    }
}

fn compare(p: &Program, ordinal: usize, inputs: &[(&str, &HostTensor)], what: &str) {
    let want = p.run_cpu(inputs).expect("the interpreter runs");
    let got = p.run_gpu(ordinal, inputs).expect("the GPU runs");
    for ((name, w), (_, g)) in want.iter().zip(&got) {
        assert_eq!(g.shape, w.shape, "{what} {name}");
        let err = g.to_f64().iter().zip(w.to_f64()).map(|(a, b)| (a - b).abs() / b.abs().max(1.0)).fold(0.0, f64::max);
        assert!(err <= 1e-4, "{what} {name}: error {err}");
    }
}
