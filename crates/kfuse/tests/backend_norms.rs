//! The norms' regions as the `torch.compile` backend lowers them (`tests/backend_norms/*.kf`,
//! written by `kfuse.explain` for `nn.BatchNorm2d`, `nn.GroupNorm` and `nn.LayerNorm` over
//! `(C, H, W)`, forward and backward, sizes above 16 made symbols): their plans read no
//! reduction again at every element, their stages run by the interpreter give the graph's
//! outputs, their kernels compile with NVRTC (skips without libnvrtc), and the GPU gives the
//! interpreter's values at odd sizes (skips without a GPU).

use kfuse::{DType, HostTensor, Program, RECOMPUTED_EXTENT_LIMIT};
use kfuse_runtime::testing::nvrtc_or_skip;
use kfuse_testing::gpu_or_skip;

mod common;
use common::{compare, error, program, random_inputs};

const NORMS: [(&str, &str); 7] = [
    ("batch_norm_forward", include_str!("backend_norms/batch_norm_forward.kf")),
    ("batch_norm_backward", include_str!("backend_norms/batch_norm_backward.kf")),
    ("group_norm_forward", include_str!("backend_norms/group_norm_forward.kf")),
    ("group_norm_apply", include_str!("backend_norms/group_norm_apply.kf")),
    ("group_norm_backward", include_str!("backend_norms/group_norm_backward.kf")),
    ("layer_norm_chw_forward", include_str!("backend_norms/layer_norm_chw_forward.kf")),
    ("layer_norm_chw_backward", include_str!("backend_norms/layer_norm_chw_backward.kf")),
];

/// The symbols' sizes of each case: odd, 1 included.
const SIZES: [[usize; 4]; 3] = [[1, 3, 5, 7], [3, 1, 9, 2], [5, 7, 3, 33]];

/// Random inputs of `p` at `sizes` (its symbols in order), floats in [0.5, 1.5): positive, as a
/// variance read by `rsqrt` is.
fn inputs(p: &Program, sizes: &[usize], seed: u64) -> Vec<(String, HostTensor)> {
    let positive = |t: HostTensor| match t.dtype() {
        DType::F32 => HostTensor::from_f64(
            DType::F32,
            t.shape.clone(),
            &t.to_f64().iter().map(|v| v.abs() + 0.5).collect::<Vec<_>>(),
        ),
        _ => t,
    };
    random_inputs(p, sizes, seed).into_iter().map(|(name, t)| (name, positive(t))).collect()
}

fn seed() -> u64 {
    let seed = std::env::var("KFUSE_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x5eed);
    println!("seed {seed} (KFUSE_TEST_SEED replays it)");
    seed
}

#[test]
fn no_norm_kernel_reads_a_reduction_again_at_every_element() {
    for (name, src) in NORMS {
        let p = program(src, name);
        for k in &p.plan().kernels {
            assert!(
                k.recompute <= RECOMPUTED_EXTENT_LIMIT,
                "{name}: {} reads {} again an element",
                k.name,
                k.recompute
            );
        }
    }
    // The statistics' forwards read the input once for the mean and the variance: one kernel
    // reduces each input's rows (the rest reduce what it stored, or apply them).
    for name in ["batch_norm_forward", "group_norm_forward", "layer_norm_chw_forward"] {
        let p = program(NORMS.iter().find(|(n, _)| *n == name).map(|(_, s)| *s).unwrap_or_default(), name);
        let first = p.plan().kernels[0].plan_notes().join("\n");
        assert!(first.contains("2 row reduction phase"), "{name}: the first part computes both statistics:\n{first}");
    }
}

#[test]
fn a_batch_norms_per_channel_outputs_come_from_its_column_kernels() {
    // The running statistics (forward) and the weight gradient (backward) are elementwise work on
    // the channels' sums: the column kernels that fold those sums compute them too, where a kernel
    // of their own would take a launch of its own.
    for name in ["batch_norm_forward", "batch_norm_backward"] {
        let p = program(NORMS.iter().find(|(n, _)| *n == name).map(|(_, s)| *s).unwrap_or_default(), name);
        let notes: Vec<String> = p.plan().kernels.iter().map(|k| k.plan_notes().join("\n")).collect();
        assert!(
            !notes.iter().any(|n| n.contains("one per iteration of a grid-stride loop")),
            "{name}: a per-channel kernel of its own:\n{}",
            notes.join("\n")
        );
        let columns = notes.iter().filter(|n| n.contains("over the leading axis")).count();
        assert!(columns >= 1, "{name}: no column kernel:\n{}", notes.join("\n"));
    }
}

#[test]
fn the_norms_stages_run_by_the_interpreter_give_the_graphs_outputs() {
    let seed = seed();
    for (name, src) in NORMS {
        let p = program(src, name);
        // Empty axes too: a mean over none is NaN in the stages as in the graph.
        for (k, sizes) in SIZES.iter().chain(&[[0, 3, 5, 7], [2, 3, 0, 4]]).enumerate() {
            let inputs = inputs(&p, sizes, seed + 100 * k as u64);
            let named: Vec<(&str, &HostTensor)> = inputs.iter().map(|(n, t)| (n.as_str(), t)).collect();
            let want = p.run_cpu(&named).expect("the interpreter runs");
            let Some(got) = kfuse_testing::run_stages(p.graph(), p.codegen(), &named).expect("the stages run") else {
                continue; // nothing stored: the kernels compute the graph as it is
            };
            for ((out, w), (_, g)) in want.iter().zip(&got) {
                let err = error(g, w);
                assert!(err <= 1e-4, "{name} {out} at {sizes:?}: error {err}");
            }
        }
    }
}

#[test]
fn the_norms_kernels_compile_for_sm80_and_sm90() {
    if nvrtc_or_skip("the_norms_kernels_compile_for_sm80_and_sm90").is_none() {
        return;
    }
    for (name, src) in NORMS {
        for k in &program(src, name).plan().kernels {
            for (source, entry) in k.entries() {
                kfuse_testing::assert_compiles_for_sm80_and_sm90(name, entry, source);
            }
        }
    }
}

#[test]
fn a_gpu_computes_the_norms_like_the_interpreter_at_odd_sizes() {
    let Some(gpu) = gpu_or_skip("a_gpu_computes_the_norms_like_the_interpreter_at_odd_sizes") else { return };
    let seed = seed();
    for (name, src) in NORMS {
        let p = program(src, name);
        for (k, sizes) in SIZES.iter().enumerate() {
            let inputs = inputs(&p, sizes, seed + 100 * k as u64);
            let named: Vec<(&str, &HostTensor)> = inputs.iter().map(|(n, t)| (n.as_str(), t)).collect();
            compare(&p, gpu.ordinal(), &named, &format!("{name} at {sizes:?}"), 1e-3);
        }
    }
}
