//! Views: slices with steps, selections on any axis, `transpose` and `permute`, end to end: hand
//! values and gradients on the CPU, the errors of bad bounds and axes (at build and at bind
//! time), the kernels compiled by NVRTC (skips without libnvrtc), and the GPU against the
//! interpreter at odd sizes (skips without a GPU).

use std::sync::Arc;

use kfuse::{DType, Engine, KernelCache, Program};
use kfuse_runtime::testing::nvrtc_or_skip;
use kfuse_testing::{gpu_or_skip, random_tensor};

mod common;
use common::{compare, get, iota, program, t};

/// Views of a constant-size tensor and of one with symbolic sizes, with row reductions over them.
const VIEWS: &str = "\
input x: f32[3, 4]
input s: f32[N, M]
output row = x[1, ..]
output last_row = x[-1, ..]
output cols = x[.., 1:3]
output even = x[.., ::2]
output corner = x[0:3:2, 1]
output xt = transpose(x, 0, 1)
output lead = x[None, 1:2, ..]
output window = s[.., 2:5]
output srow = s[1, ..]
output strided = s[:, 0:5:2]
output wsum = sum(s[.., 1:5:3], axis: -1)
output st = transpose(s, -1, -2)
";

/// Gradients through every view, on a tensor of symbolic leading size.
const GRADS: &str = "\
input x: f32[B, 3, 6]
let a = x[:, 1:6:2, :]
let b = permute(x, [2, 0, 1])
let c = x[:, 2]
let d = transpose(x, 0, 2)[4, ..]
output loss = sum(a * a) + sum(b[1:4, ..] * 3.0) + sum(c * c * c) + sum(d[.., 0:1] * 0.5)
output dx = grad(loss, x)
";

#[test]
fn views_give_the_hand_values() {
    let p = program(VIEWS, "views.kf");
    // x[i, j] = 4i + j; s[i, j] = 10i + j over [2, 6].
    let s: Vec<f64> = (0..2).flat_map(|i| (0..6).map(move |j| (10 * i + j) as f64)).collect();
    let out = p.run_cpu(&[("x", &t(&[3, 4], &iota(12))), ("s", &t(&[2, 6], &s))]).expect("runs");
    assert_eq!(get(&out, "row"), (vec![4], vec![4.0, 5.0, 6.0, 7.0]));
    assert_eq!(get(&out, "last_row"), (vec![4], vec![8.0, 9.0, 10.0, 11.0]));
    assert_eq!(get(&out, "cols"), (vec![3, 2], vec![1.0, 2.0, 5.0, 6.0, 9.0, 10.0]));
    assert_eq!(get(&out, "even"), (vec![3, 2], vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0]));
    assert_eq!(get(&out, "corner"), (vec![2], vec![1.0, 9.0]));
    let xt: Vec<f64> = (0..4).flat_map(|j| (0..3).map(move |i| (4 * i + j) as f64)).collect();
    assert_eq!(get(&out, "xt"), (vec![4, 3], xt));
    assert_eq!(get(&out, "lead"), (vec![1, 1, 4], vec![4.0, 5.0, 6.0, 7.0]));
    assert_eq!(get(&out, "window"), (vec![2, 3], vec![2.0, 3.0, 4.0, 12.0, 13.0, 14.0]));
    assert_eq!(get(&out, "srow"), (vec![6], (10..16).map(f64::from).collect()));
    assert_eq!(get(&out, "strided"), (vec![2, 3], vec![0.0, 2.0, 4.0, 10.0, 12.0, 14.0]));
    assert_eq!(get(&out, "wsum"), (vec![2], vec![1.0 + 4.0, 11.0 + 14.0]));
    let st: Vec<f64> = (0..6).flat_map(|j| (0..2).map(move |i| (10 * i + j) as f64)).collect();
    assert_eq!(get(&out, "st"), (vec![6, 2], st));
}

#[test]
fn gradients_place_the_upstream_gradient_back_where_each_view_read() {
    let p = program(GRADS, "views.kf");
    let (b, n, d) = (2usize, 3usize, 6usize);
    let x: Vec<f64> = (0..b * n * d).map(|i| (i as f64 * 0.37).sin()).collect();
    let out = p.run_cpu(&[("x", &t(&[b, n, d], &x))]).expect("runs");
    let at = |i: usize, j: usize, k: usize| (i * n + j) * d + k;
    // loss = sum(x[:, 1:6:2, :]^2)           (axis 1 has 3 elements, so j = 1 only)
    //      + 3 sum(permute(x)[1:4]) = 3 sum over k in 1..4 of x[:, :, k]
    //      + sum(x[:, 2, :]^3)
    //      + 0.5 sum(x^T[4, :, 0:1]) = 0.5 sum over j of x[0, j, 4]
    let mut dx = vec![0.0; x.len()];
    let mut loss = 0.0;
    for i in 0..b {
        for j in 0..n {
            for k in 0..d {
                let v = x[at(i, j, k)];
                if j == 1 {
                    dx[at(i, j, k)] += 2.0 * v;
                    loss += v * v;
                }
                if (1..4).contains(&k) {
                    dx[at(i, j, k)] += 3.0;
                    loss += 3.0 * v;
                }
                if j == 2 {
                    dx[at(i, j, k)] += 3.0 * v * v;
                    loss += v * v * v;
                }
                if i == 0 && k == 4 {
                    dx[at(i, j, k)] += 0.5;
                    loss += 0.5 * v;
                }
            }
        }
    }
    let (shape, got) = get(&out, "dx");
    assert_eq!(shape, vec![b, n, d]);
    for (k, (g, w)) in got.iter().zip(&dx).enumerate() {
        assert!((g - w).abs() <= 1e-5 * w.abs().max(1.0), "dx[{k}] = {g}, want {w}");
    }
    let l = get(&out, "loss").1[0];
    assert!((l - loss).abs() <= 1e-5 * loss.abs().max(1.0), "loss {l}, want {loss}");
}

#[test]
fn a_slice_gradient_matches_finite_differences() {
    let src = "input x: f32[2, 7]\n\
               output loss = sum(exp(x[.., 1:7:3]) * x[1, 0:2]) + sum(transpose(x, 0, 1)[2:5, ..] * x[0, 3])\n\
               output dx = grad(loss, x)\n";
    let p = program(src, "views.kf");
    let x: Vec<f64> = (0..14).map(|i| ((i * 7 % 5) as f64 - 2.0) * 0.3).collect();
    let loss = |x: &[f64]| -> f64 {
        let out = p.run_cpu(&[("x", &t(&[2, 7], x))]).expect("runs");
        get(&out, "loss").1[0]
    };
    let out = p.run_cpu(&[("x", &t(&[2, 7], &x))]).expect("runs");
    let dx = get(&out, "dx").1;
    let h = 1e-2;
    for k in 0..x.len() {
        let (mut up, mut down) = (x.clone(), x.clone());
        up[k] += h;
        down[k] -= h;
        let fd = (loss(&up) - loss(&down)) / (2.0 * h);
        assert!((fd - dx[k]).abs() <= 2e-3 * fd.abs().max(1.0), "dx[{k}] = {}, finite difference {fd}", dx[k]);
    }
}

/// The error of compiling `body` after a header of inputs.
fn compile_error(body: &str) -> String {
    let src = format!("input x: f32[3, 4]\ninput s: f32[N, M]\n{body}");
    let engine = Engine::with_cache(Arc::new(KernelCache::memory_only()));
    match Program::compile(&engine, &src, "bad.kf") {
        Ok(_) => panic!("expected an error for {body:?}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn bad_indices_slices_and_axes_are_clear_errors() {
    let cases: &[(&str, &[&str])] = &[
        ("output y = x[3, ..]\n", &["select", "index 3 is out of range", "from -3 to 2"]),
        ("output y = x[.., 4]\n", &["component index 4 is out of range", "from -4 to 3"]),
        ("output y = x[.., 0:4:0]\n", &["step 0 is not positive"]),
        ("output y = x[.., 0:4:-1]\n", &["step -1 is not positive"]),
        ("output y = s[.., 2:]\n", &["symbolic size M", "needs a constant end"]),
        ("output y = s[-1, ..]\n", &["counts from the end", "symbolic size"]),
        ("output y = s[.., -3:5]\n", &["count from the end", "symbolic size M"]),
        ("output y = x[0, 0, 0]\n", &["3 axes are indexed", "2 axes"]),
        ("output y = x[.., 0, ..]\n", &["at most one `..`"]),
        ("output y = transpose(x, 0, 2)\n", &["transpose", "axis 2", "out of range"]),
        ("output y = permute(x, [0, 0])\n", &["permute", "named twice"]),
        ("output y = permute(x, [0])\n", &["permute", "each of the 2 axes once"]),
        ("output y = x[.., 1:a]\n", &["unexpected name `a`", "`]`"]),
    ];
    for (body, words) in cases {
        let e = compile_error(body);
        for w in *words {
            assert!(e.contains(w), "the error for {body:?} lacks {w:?}:\n{e}");
        }
    }
}

#[test]
fn a_symbolic_axis_shorter_than_a_slice_or_index_needs_is_refused_at_binding() {
    let p = program("input s: f32[N, M]\noutput y = s[.., 2:7:2] * 2.0\noutput r = s[3, ..]\n", "views.kf");
    let ok = p.run_cpu(&[("s", &t(&[4, 7], &iota(28)))]).expect("M = 7 and N = 4 are large enough");
    assert_eq!(get(&ok, "y").1, vec![4.0, 8.0, 12.0, 18.0, 22.0, 26.0, 32.0, 36.0, 40.0, 46.0, 50.0, 54.0]);
    let e = p.run_cpu(&[("s", &t(&[4, 6], &iota(24)))]).expect_err("M = 6 is too small").to_string();
    for w in ["M = 6", "element 6", "at least 7", "slice 2:7:2"] {
        assert!(e.contains(w), "the error lacks {w:?}: {e}");
    }
    let e = p.run_cpu(&[("s", &t(&[3, 7], &iota(21)))]).expect_err("N = 3 is too small").to_string();
    for w in ["N = 3", "index 3", "at least 4"] {
        assert!(e.contains(w), "the error lacks {w:?}: {e}");
    }
    // Binding a device program checks the same, before anything runs.
    let e = p.interface().bind_shapes(&[("s", DType::F32, &[4, 6])]).expect_err("M = 6").to_string();
    assert!(e.contains("at least 7"), "{e}");
}

/// Programs whose kernels read views in each planner shape: elementwise, row reductions of a
/// sliced or transposed tensor (row-wise kernels), column reductions, and gradients.
const KERNELS: &[&str] = &[
    VIEWS,
    GRADS,
    "input x: f32[R, C]\nlet t = transpose(x, 0, 1)\nlet e = exp(t - max(t, axis: -1, keepdim: true))\n\
     output sm = e / sum(e, axis: -1, keepdim: true)\noutput cs = sum(x[.., 1:9:2], axis: 0)\n",
    "input x: f32[B, N, D]\ninput w: f32[D]\nlet y = x[:, 1:5] * w\n\
     output loss = sum(y * y) / size(B)\noutput dx = grad(loss, x)\noutput dw = grad(loss, w)\n",
];

#[test]
fn kernels_reading_views_compile_for_sm80_and_sm90() {
    if nvrtc_or_skip("kernels_reading_views_compile_for_sm80_and_sm90").is_none() {
        return;
    }
    for src in KERNELS {
        let p = program(src, "views.kf");
        for k in &p.plan().kernels {
            kfuse_testing::assert_compiles_for_sm80_and_sm90("views", &k.name, &k.source);
        }
    }
}

#[test]
fn a_gpu_reads_views_like_the_interpreter_at_odd_sizes() {
    let Some(gpu) = gpu_or_skip("a_gpu_reads_views_like_the_interpreter_at_odd_sizes") else { return };
    let seed: u64 = std::env::var("KFUSE_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x5eed);
    println!("seed {seed} (KFUSE_TEST_SEED replays it)");
    let views = program(VIEWS, "views.kf");
    // `s[1, ..]` reads row 1 and `s[.., 2:5]` column 4: at least 2 rows and 5 columns.
    for (k, (n, m)) in [(2, 5), (4, 33), (33, 1025), (2, 7)].into_iter().enumerate() {
        let x = random_tensor(DType::F32, &[3, 4], seed + k as u64);
        let s = random_tensor(DType::F32, &[n, m], seed + 50 + k as u64);
        compare(&views, gpu.ordinal(), &[("x", &x), ("s", &s)], &format!("views [{n}, {m}]"), 1e-4);
    }
    let grads = program(GRADS, "views.kf");
    for (k, b) in [1, 3, 33, 1025].into_iter().enumerate() {
        let x = random_tensor(DType::F32, &[b, 3, 6], seed + 100 + k as u64);
        compare(&grads, gpu.ordinal(), &[("x", &x)], &format!("grads [{b}, 3, 6]"), 1e-4);
    }
    let rows = program(KERNELS[2], "views.kf");
    // `x[.., 1:9:2]` reads column 7: at least 8 columns.
    for (k, (r, c)) in [(9, 8), (33, 9), (1025, 17), (3, 4099)].into_iter().enumerate() {
        let x = random_tensor(DType::F32, &[r, c], seed + 200 + k as u64);
        compare(&rows, gpu.ordinal(), &[("x", &x)], &format!("rows [{r}, {c}]"), 1e-4);
    }
    let bias = program(KERNELS[3], "views.kf");
    for (k, (b, n, d)) in [(1, 5, 1), (3, 7, 33), (33, 5, 1025)].into_iter().enumerate() {
        let x = random_tensor(DType::F32, &[b, n, d], seed + 300 + k as u64);
        let w = random_tensor(DType::F32, &[d], seed + 400 + k as u64);
        compare(&bias, gpu.ordinal(), &[("x", &x), ("w", &w)], &format!("bias [{b}, {n}, {d}]"), 1e-4);
    }
}
