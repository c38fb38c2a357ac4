//! A grid-stride kernel indexes with 32 bits where its counts allow and with 64 bits past them:
//! the plan marks it, its source holds both index types, the executor's rule says which build a
//! launch takes, and on a GPU a domain of 2^31 elements (a broadcast product summed, inputs of
//! 2^16 and 2^15 elements) takes the 64-bit build and sums right, as a small one does through the
//! 32-bit build (against the interpreter). The GPU case skips, saying why, without a GPU; the
//! NVRTC case without NVRTC.

use std::sync::Arc;

use kfuse::{DType, Engine, HostTensor, KernelCache, Program};
use kfuse_codegen::{NARROW_INDEX_LIMIT, WIDE_INDEX_OPTION};
use kfuse_runtime::{compile, Arch, CompileOptions};
use kfuse_testing::{gpu_or_skip, nvrtc_or_skip, Rng, SeedableRng, StdRng};

const PROGRAM: &str = "input a: f32[M]\ninput b: f32[K]\noutput s = sum(a[.., None] * b)\n";
const SEED: u64 = 31;

fn program() -> Program {
    let engine = Engine::with_cache(Arc::new(KernelCache::memory_only()));
    Program::compile(&engine, PROGRAM, "index_width.kf").expect("compiles")
}

/// `n` values uniform in [0.5, 1.5) from `seed`, and their sum in f64.
fn positive(n: usize, seed: u64) -> (HostTensor, f64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let v: Vec<f64> = (0..n).map(|_| f64::from(rng.random_range(0.5f32..1.5f32))).collect();
    let sum = v.iter().sum();
    (HostTensor::from_f64(DType::F32, vec![n], &v), sum)
}

#[test]
fn a_grid_stride_kernel_states_both_index_types_and_when_each_serves() {
    let p = program();
    let [k] = p.plan().kernels.as_slice() else { panic!("one kernel: {:?}", p.plan().kernels.len()) };
    assert!(k.narrow_index, "a grid-stride kernel indexes with 32 bits by default");
    assert!(k
        .source
        .contains("#ifdef KF_WIDE_INDEX\n    typedef long long kf_index;\n#else\n    typedef int kf_index;"));
    assert!(k.source.contains("const kf_index n = (kf_index)(sz0 * sz1);"), "{}", k.source);
    assert_eq!(WIDE_INDEX_OPTION, "-DKF_WIDE_INDEX");
    // Buffers 0 and 1 are the inputs; the others the partial sums, the counter and the output.
    let small = |b: usize| Some(if b < 2 { 1000 } else { 64 });
    assert!(k.narrow_fits(&[1000, 1000], small));
    assert!(k.narrow_fits(&[1 << 15, (NARROW_INDEX_LIMIT >> 15) - 1], small));
    assert!(!k.narrow_fits(&[1 << 15, NARROW_INDEX_LIMIT >> 15], small), "a domain of 2^30 elements");
    assert!(!k.narrow_fits(&[1 << 16, 1 << 15], small), "a domain of 2^31 elements");
    assert!(!k.narrow_fits(&[10, 10], |b| Some(if b == 0 { NARROW_INDEX_LIMIT } else { 10 })), "a buffer of 2^30");
    assert!(!k.narrow_fits(&[10, 10], |b| (b != 1).then_some(10)), "a buffer of unknown size");
}

#[test]
fn kernels_of_other_shapes_keep_a_64_bit_index() {
    let engine = Engine::with_cache(Arc::new(KernelCache::memory_only()));
    let p = Program::compile(&engine, "input x: f32[B, D]\noutput y = x - max(x, axis: -1)[.., None]\n", "rows.kf")
        .expect("compiles");
    for k in &p.plan().kernels {
        assert!(!k.narrow_index, "{}", k.source);
        assert!(!k.narrow_fits(&[4, 4], |_| Some(16)));
        assert!(!k.source.contains("typedef int kf_index"), "{}", k.source);
    }
}

#[test]
fn both_builds_of_every_example_kernel_compile() {
    if nvrtc_or_skip("both_builds_of_every_example_kernel_compile").is_none() {
        return;
    }
    let engine = Engine::with_cache(Arc::new(KernelCache::memory_only()));
    let mut wide = 0;
    for (stem, src) in kfuse_testing::examples() {
        let p = Program::compile(&engine, &src, &format!("examples/{stem}.kf")).expect("compiles");
        for k in p.plan().kernels.iter().filter(|k| k.narrow_index) {
            let opts = CompileOptions { arch: Arch::new(9, 0), extra: vec![WIDE_INDEX_OPTION.to_string()] };
            let m = compile(&k.source, &opts).unwrap_or_else(|e| panic!("{stem} {} wide: {e}", k.name));
            assert!(m.ptx.contains(&format!(".entry {}", k.name)));
            wide += 1;
        }
    }
    assert!(wide >= 4, "{wide} grid-stride kernels among the examples");
}

#[test]
fn a_gpu_sums_a_domain_past_the_32_bit_range_with_the_64_bit_build() {
    let Some(gpu) = gpu_or_skip("a_gpu_sums_a_domain_past_the_32_bit_range_with_the_64_bit_build") else { return };
    let p = program();
    // Small: the 32-bit build, checked against the interpreter.
    let (a, _) = positive(1023, SEED);
    let (b, _) = positive(33, SEED + 1);
    let want = p.run_cpu(&[("a", &a), ("b", &b)]).expect("runs on the CPU")[0].1.to_f64()[0];
    let got = p.run_gpu(gpu.ordinal(), &[("a", &a), ("b", &b)]).expect("runs on the GPU")[0].1.to_f64()[0];
    assert!((got - want).abs() <= 1e-6 * want.abs(), "seed {SEED}: {got} vs {want}");
    // 2^16 x 2^15 = 2^31 elements: a 32-bit index would wrap; the sum is sum(a) * sum(b).
    let (a, sa) = positive(1 << 16, SEED + 2);
    let (b, sb) = positive(1 << 15, SEED + 3);
    let got = p.run_gpu(gpu.ordinal(), &[("a", &a), ("b", &b)]).expect("runs on the GPU")[0].1.to_f64()[0];
    let want = sa * sb;
    assert!((got - want).abs() <= 1e-6 * want, "seed {SEED}: {got} vs {want} over 2^31 elements");
}
