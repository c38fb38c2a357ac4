//! Reductions along axes other than the last, read back at the elements they reduce (a batch
//! norm's statistics, a layer norm over several trailing axes, a centring over the batch), are
//! stored once by a stage of their own and read back, instead of being computed again at every
//! element: the plans (no kernel reads elements again, the stages' kernels in order), the
//! kernels compiled by NVRTC (skips without libnvrtc), and the GPU against the interpreter at odd
//! sizes, gradients included (skips without a GPU).

use kfuse::{BufferKind, DType, RECOMPUTED_EXTENT_LIMIT};
use kfuse_runtime::testing::nvrtc_or_skip;
use kfuse_testing::{gpu_or_skip, random_tensor};

mod common;
use common::{compare, error, get, program, random_inputs, t};

/// Centring over the batch, with and without `keepdim`, and a maximum read back.
const CENTER: &str = "\
input x: f32[B, C]
output centered = x - mean(x, axis: 0, keepdim: true)
output scaled = x / max(abs(x), axis: 0)
";

/// A batch norm's training step over constant spatial sizes: its statistics over the batch and
/// the rows of each channel, in two parts (the rows' sums, then the batch's), and its gradients.
const BATCH_NORM: &str = "\
input x: f32[N, 12, 7, 9]
input w: f32[12]
input g: f32[N, 12, 7, 9]
let m = mean(x, axis: [0, 2, 3], keepdim: true)
let d = x - m
let v = mean(d * d, axis: [0, 2, 3], keepdim: true)
let y = d * rsqrt(v + 1e-5) * w[:, None, None]
output mean = m
output var = v
output out = y
output loss = sum(y * g)
output dx = grad(loss, x)
output dw = grad(loss, w)
";

/// The same over symbolic spatial sizes: no reshape merges them, so the statistics reduce the
/// axes as they are.
const BATCH_NORM_SYMBOLIC: &str = "\
input x: f32[N, C, H, W]
input g: f32[N, C, H, W]
let m = mean(x, axis: [0, 2, 3], keepdim: true)
let d = x - m
let y = d * rsqrt(mean(d * d, axis: [0, 2, 3], keepdim: true) + 1e-5)
output loss = sum(y * g)
output dx = grad(loss, x)
";

/// A layer norm over `(C, H, W)`: trailing axes alone, merged into rows.
const LAYER_NORM_CHW: &str = "\
input x: f32[N, 6, 11, 13]
input g: f32[N, 6, 11, 13]
let m = mean(x, axis: [1, 2, 3], keepdim: true)
let d = x - m
let y = d * rsqrt(mean(d * d, axis: [1, 2, 3], keepdim: true) + 1e-5)
output out = y
output loss = sum(y * g)
output dx = grad(loss, x)
";

/// Half-precision operands (the first parts are kept in f32), a masked sum, a minimum in parts,
/// middle axes, a mean of rows' sums, a last-axis mean of a transpose read back at the rows, and
/// a bf16 layer norm over a symbolic last axis (its variance reduced by the mean's parts).
const MIXED: &str = "\
input h: bf16[B, 80]
input x: f32[B, 8, 5, 16]
input m: bool[B, 8, 5, 16]
input r: f32[B, 8, 100]
input s: bf16[B, 6, W]
let sd = s - mean(s, axis: [1, 2], keepdim: true)
output snorm = sd * rsqrt(mean(sd * sd, axis: [1, 2], keepdim: true) + 1e-5)
output hc = h - mean(h, axis: 0, keepdim: true)
output parts = x - min(x, axis: [0, 2, 3], keepdim: true)
output masked = x * sum(x, axis: [0, 2], keepdim: true, where: m)
output middle = x - mean(x, axis: [1, 2], keepdim: true)
output rows = r * mean(sum(r, axis: -1), axis: 0, keepdim: true)[.., None]
output across = h - transpose(mean(transpose(h, 0, 1), axis: -1, keepdim: true), 0, 1)
";

/// A group norm's backward as the backend lowers it: the rows' sums of each channel, summed over
/// the channels of a group, read back at every element of the group's rows. A row-wise kernel
/// over those rows runs its per-row code in every lane of a row: the rows' sums are stored, not
/// summed again by each lane of each row of the group.
const GROUP_NORM: &str = "\
input x: f32[N, 4, 3, 130]
input g: f32[N, 4, 3, 130]
input w: f32[4, 3]
let s = sum(x * g, axis: -1)
let t = sum(s * w, axis: -1)
let m = mean(x, axis: [2, 3], keepdim: true)
let d = x - m
output dx = x * t[.., None, None] + g * sum(s, axis: -1)[.., None, None]
output y = d * rsqrt(mean(d * d, axis: [2, 3], keepdim: true) + 1e-5) * w[.., None]
";

const ALL: [&str; 6] = [CENTER, BATCH_NORM, BATCH_NORM_SYMBOLIC, LAYER_NORM_CHW, MIXED, GROUP_NORM];

#[test]
fn no_kernel_reads_a_reduction_again_at_every_element() {
    for src in ALL {
        let p = program(src, "stored.kf");
        let plan = p.plan();
        for k in &plan.kernels {
            assert!(
                k.recompute <= RECOMPUTED_EXTENT_LIMIT,
                "{} reads {} again an element:\n{src}",
                k.name,
                k.recompute
            );
        }
        let stored = plan.buffers.iter().filter(|b| b.kind == BufferKind::Temp).count();
        assert!(stored > 0, "no value stored:\n{src}");
    }
    // The batch norm: the rows' sums, the batch's, for the mean and the variance, then the
    // normalised output and the loss; its backward's two channel sums likewise.
    let p = program(BATCH_NORM, "stored.kf");
    let notes: Vec<String> = p.plan().kernels.iter().flat_map(|k| k.plan_notes()).map(str::to_string).collect();
    let parts = notes.iter().filter(|n| n.starts_with("output part")).count();
    let columns = notes.iter().filter(|n| n.contains("as columns")).count();
    assert!(parts >= 2 && columns >= 2, "the statistics in two parts each:\n{notes:#?}");
    // The statistics that are outputs are stored there, not copied there again.
    for name in ["mean", "var"] {
        let writers = notes.iter().filter(|n| *n == &format!("output {name}")).count();
        assert_eq!(writers, 1, "output {name} written once:\n{notes:#?}");
    }
    assert_eq!(p.plan().buffers.iter().filter(|b| b.kind == BufferKind::Temp).count(), 4, "{notes:#?}");
    // The group norm: the rows' sums of each channel are stored by a kernel over the rows.
    let p = program(GROUP_NORM, "stored.kf");
    let rows_stored = p.plan().kernels.iter().any(|k| {
        let notes = k.plan_notes();
        notes.first().is_some_and(|n| n.starts_with("[N, 4, 3] elements"))
            && notes.iter().any(|n| n.starts_with("output stored"))
    });
    assert!(
        rows_stored,
        "the rows' sums stored:\n{:#?}",
        p.plan().kernels.iter().map(|k| k.plan_notes()).collect::<Vec<_>>()
    );
}

#[test]
fn long_or_symbolic_trailing_axes_are_reduced_in_parts_by_rows() {
    let domains = |src: &str| -> Vec<String> {
        let p = program(src, "stored.kf");
        let notes: Vec<String> = p.plan().kernels.iter().flat_map(|k| k.plan_notes()).map(str::to_string).collect();
        notes
            .iter()
            .filter(|n| n.contains("rows of the last reduced axis"))
            .map(|n| n[..n.find(" elements").unwrap_or(0)].to_string())
            .collect()
    };
    // A layer norm over (64, 28, 28): rows of 784 (the merged spatial axes), then of 64; not
    // 50176-element rows, a group of lanes each. The variance is reduced by the mean's parts:
    // each part's kernel computes both (two passes over its rows, kept in registers), so `x` is
    // read once for the statistics.
    let ln = "input x: f32[N, 64, 28, 28]\nlet d = x - mean(x, axis: [1, 2, 3], keepdim: true)\n\
              output y = d * rsqrt(mean(d * d, axis: [1, 2, 3], keepdim: true) + 1e-5)\n";
    assert_eq!(domains(ln), ["[N, 64]", "[N]"]);
    let p = program(ln, "stored.kf");
    let first = p.plan().kernels[0].plan_notes().join("\n");
    assert!(first.contains("rows kept in registers") && first.contains("2 row reduction phase"), "{first}");
    // Symbolic spatial axes: one row reduction per axis, then the batch's columns.
    assert_eq!(domains(BATCH_NORM_SYMBOLIC)[..2], ["[N, C, H]", "[N, C]"]);
    // A variance about another value than the mean is reduced on its own.
    let other = "input x: f32[N, 64, 28, 28]\nlet d = x - max(x, axis: [1, 2, 3], keepdim: true)\n\
                 output y = d * rsqrt(mean(d * d, axis: [1, 2, 3], keepdim: true) + 1e-5)\n";
    assert_eq!(domains(other), ["[N, 64]", "[N]", "[N, 64]", "[N]"]);
}

#[test]
fn the_stages_run_by_the_interpreter_give_the_graphs_outputs() {
    let seed: u64 = std::env::var("KFUSE_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x5eed);
    println!("seed {seed} (KFUSE_TEST_SEED replays it)");
    for src in ALL {
        let p = program(src, "stored.kf");
        // Empty axes too: a mean over none is NaN in the stages as in the graph.
        for (k, sizes) in [[1, 2, 3, 4], [3, 5, 7, 2], [37, 3, 1, 66], [0, 2, 3, 4], [2, 0, 3, 0]].iter().enumerate() {
            let inputs = random_inputs(&p, &sizes[..p.graph().symbols.len()], seed + 100 * k as u64);
            let named: Vec<(&str, &kfuse::HostTensor)> = inputs.iter().map(|(n, t)| (n.as_str(), t)).collect();
            let want = p.run_cpu(&named).expect("the interpreter runs");
            let got = kfuse_testing::run_stages(p.graph(), p.codegen(), &named)
                .unwrap_or_else(|e| panic!("{e}:\n{src}"))
                .expect("the plan stores values");
            for ((name, w), (gname, g)) in want.iter().zip(&got) {
                assert_eq!((gname, &g.shape), (name, &w.shape), "{sizes:?}:\n{src}");
                // Values are stored in their dtype (parts in f32): its rounding, relative to the
                // larger of the value and 1.
                let tol = if w.dtype() == DType::F32 { 1e-4 } else { 2e-2 };
                let err = error(g, w);
                assert!(err <= tol, "{name} at sizes {sizes:?}: error {err}\n{src}");
            }
        }
    }
}

/// The statistics in parts keep f32's precision where the values sit far from zero: each part's
/// variance is about its own mean, not a difference of squares (which loses it at 1000 ± 1).
#[test]
fn variances_in_parts_hold_values_far_from_zero() {
    let p = program(LAYER_NORM_CHW, "stored.kf");
    let shape = [5, 6, 11, 13];
    let x = random_tensor(DType::F32, &shape, 7);
    let x = kfuse::HostTensor::from_f64(
        DType::F32,
        shape.to_vec(),
        &x.to_f64().iter().map(|v| 1000.0 + v).collect::<Vec<_>>(),
    );
    let g = random_tensor(DType::F32, &shape, 8);
    let inputs = [("x", &x), ("g", &g)];
    let want = p.run_cpu(&inputs).expect("the interpreter runs");
    let got = kfuse_testing::run_stages(p.graph(), p.codegen(), &inputs).expect("the stages run").expect("stored");
    for ((name, w), (_, g)) in want.iter().zip(&got) {
        let err = error(g, w);
        assert!(err <= 1e-3, "{name}: error {err}");
    }
}

#[test]
fn stored_reductions_give_the_hand_values() {
    let p = program(CENTER, "stored.kf");
    let out = p.run_cpu(&[("x", &t(&[3, 2], &[0.0, -8.0, 2.0, 4.0, 4.0, 1.0]))]).expect("runs");
    assert_eq!(get(&out, "centered"), (vec![3, 2], vec![-2.0, -7.0, 0.0, 5.0, 2.0, 2.0]));
    assert_eq!(get(&out, "scaled"), (vec![3, 2], vec![0.0, -1.0, 0.5, 0.5, 1.0, 0.125]));
}

#[test]
fn staged_kernels_compile_for_sm80_and_sm90() {
    if nvrtc_or_skip("staged_kernels_compile_for_sm80_and_sm90").is_none() {
        return;
    }
    for src in ALL {
        let p = program(src, "stored.kf");
        for k in &p.plan().kernels {
            for (source, entry) in k.entries() {
                kfuse_testing::assert_compiles_for_sm80_and_sm90("stored", entry, source);
            }
        }
    }
}

#[test]
fn a_gpu_stores_reductions_like_the_interpreter_at_odd_sizes() {
    let Some(gpu) = gpu_or_skip("a_gpu_stores_reductions_like_the_interpreter_at_odd_sizes") else { return };
    let seed: u64 = std::env::var("KFUSE_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x5eed);
    println!("seed {seed} (KFUSE_TEST_SEED replays it)");
    let rand = |dtype, shape: &[usize], k: u64| random_tensor(dtype, shape, seed + k);
    let center = program(CENTER, "stored.kf");
    for (k, (b, c)) in [(1, 1), (3, 5), (1025, 3), (67, 1023), (4099, 96)].into_iter().enumerate() {
        let x = rand(DType::F32, &[b, c], k as u64);
        compare(&center, gpu.ordinal(), &[("x", &x)], &format!("center [{b}, {c}]"), 1e-4);
    }
    let bn = program(BATCH_NORM, "stored.kf");
    for (k, n) in [1, 3, 37].into_iter().enumerate() {
        let (x, g) = (rand(DType::F32, &[n, 12, 7, 9], 10 + k as u64), rand(DType::F32, &[n, 12, 7, 9], 20 + k as u64));
        let w = rand(DType::F32, &[12], 30 + k as u64);
        compare(&bn, gpu.ordinal(), &[("x", &x), ("w", &w), ("g", &g)], &format!("batch norm N={n}"), 1e-3);
    }
    let bns = program(BATCH_NORM_SYMBOLIC, "stored.kf");
    for (k, shape) in [[2, 3, 5, 7], [5, 33, 3, 1], [1, 2, 65, 33]].into_iter().enumerate() {
        let (x, g) = (rand(DType::F32, &shape, 40 + k as u64), rand(DType::F32, &shape, 50 + k as u64));
        compare(&bns, gpu.ordinal(), &[("x", &x), ("g", &g)], &format!("batch norm {shape:?}"), 1e-3);
    }
    let ln = program(LAYER_NORM_CHW, "stored.kf");
    for (k, n) in [1, 5, 67].into_iter().enumerate() {
        let (x, g) =
            (rand(DType::F32, &[n, 6, 11, 13], 60 + k as u64), rand(DType::F32, &[n, 6, 11, 13], 70 + k as u64));
        compare(&ln, gpu.ordinal(), &[("x", &x), ("g", &g)], &format!("layer norm N={n}"), 1e-3);
    }
    let gn = program(GROUP_NORM, "stored.kf");
    for (k, n) in [1, 3, 33].into_iter().enumerate() {
        let k = k as u64;
        let (x, g) = (rand(DType::F32, &[n, 4, 3, 130], 120 + k), rand(DType::F32, &[n, 4, 3, 130], 130 + k));
        let w = rand(DType::F32, &[4, 3], 140 + k);
        compare(&gn, gpu.ordinal(), &[("x", &x), ("g", &g), ("w", &w)], &format!("group norm N={n}"), 1e-3);
    }
    let mixed = program(MIXED, "stored.kf");
    for (k, b) in [1, 7, 131].into_iter().enumerate() {
        let k = k as u64;
        let inputs = [
            ("h", rand(DType::BF16, &[b, 80], 80 + k)),
            ("x", rand(DType::F32, &[b, 8, 5, 16], 90 + k)),
            ("m", rand(DType::Bool, &[b, 8, 5, 16], 100 + k)),
            ("r", rand(DType::F32, &[b, 8, 100], 110 + k)),
            ("s", rand(DType::BF16, &[b, 6, 2 * b + 1], 150 + k)),
        ];
        let named: Vec<(&str, &kfuse::HostTensor)> = inputs.iter().map(|(n, v)| (*n, v)).collect();
        compare(&mixed, gpu.ordinal(), &named, &format!("mixed B={b}"), 2e-2);
    }
}
