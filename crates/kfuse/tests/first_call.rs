//! A program's first call: which kernels its device load compiles (the plan's and its backward's
//! gradient-scaling kernel, nothing that depends on sizes, only what a new dtype needs), and that
//! a warm cache serves them without asking NVRTC anything. Pure, NVRTC and GPU tiers; compiles are
//! counted, never timed.

use std::collections::HashSet;
use std::sync::Arc;

use kfuse::{DType, DeviceTensor, Engine, KernelCache, Program};
use kfuse_runtime::{nvrtc_calls_on_this_thread, Arch, CacheOutcome, CompileOptions};
use kfuse_testing::{example, gpu_or_skip, nvrtc_or_skip};

fn engine(cache: KernelCache) -> Engine {
    Engine::with_cache(Arc::new(cache))
}

/// giou_lengths.kf with its inputs at `dtype`, and the program with the loss's gradient w.r.t. `pred`.
fn giou(engine: &Engine, dtype: DType) -> (Program, Program) {
    let p = Program::compile(engine, &example("giou_lengths"), "giou_lengths.kf").expect("compiles");
    let p = if dtype == DType::F32 {
        p
    } else {
        p.with_input_dtypes(&[("pred", dtype), ("target", dtype)]).expect("retyped")
    };
    let (g, pairs) = p.with_gradients("loss", &["pred"]).expect("derives");
    assert_eq!(pairs, vec![("pred".to_string(), "grad_pred".to_string())]);
    (p, g)
}

fn names(p: &Program) -> Vec<String> {
    p.device_kernels().iter().map(|(_, name)| name.to_string()).collect()
}

#[test]
fn a_gradient_program_loads_the_scaling_kernel_of_its_own_dtypes_only() {
    let engine = engine(KernelCache::memory_only());
    for (dtype, scale) in [(DType::F32, "kf_scale_f32_by_f32"), (DType::BF16, "kf_scale_bf16_by_bf16")] {
        let (plain, with_gradients) = giou(&engine, dtype);
        let plan: Vec<String> = with_gradients.plan().kernels.iter().map(|k| k.name.clone()).collect();
        let mut want = plan.clone();
        want.push(scale.to_string());
        assert_eq!(names(&with_gradients), want, "{dtype}");
        // A program without gradients has no backward to prepare for.
        assert!(!names(&plain).iter().any(|n| n.starts_with("kf_scale_")), "{dtype}: {:?}", names(&plain));
        // Other code generation options keep what the backward needs.
        let retuned = with_gradients.with_codegen(with_gradients.codegen().clone()).expect("replans");
        assert_eq!(names(&retuned).last().map(String::as_str), Some(scale));
    }
}

#[test]
fn a_new_dtype_compiles_only_its_own_kernels_and_a_warm_cache_asks_nvrtc_nothing() {
    if nvrtc_or_skip("a_new_dtype_compiles_only_its_own_kernels_and_a_warm_cache_asks_nvrtc_nothing").is_none() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let cache = KernelCache::with_dir(dir.path(), 1 << 30);
    let opts = CompileOptions::for_arch(Arch::new(9, 0));
    let engine = engine(KernelCache::memory_only());
    let (_, f32_program) = giou(&engine, DType::F32);
    let (_, bf16_program) = giou(&engine, DType::BF16);
    let compile_all = |p: &Program| {
        let before = cache.stats().session.compiles;
        for (source, name) in p.device_kernels() {
            cache.get_or_compile(source, &opts).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
        cache.stats().session.compiles - before
    };
    let f32_kernels = f32_program.device_kernels().len() as u64;
    assert_eq!(compile_all(&f32_program), f32_kernels);
    assert_eq!(compile_all(&f32_program), 0, "the same dtype again compiles nothing");
    let f32_sources: HashSet<&str> = f32_program.device_kernels().iter().map(|(s, _)| *s).collect();
    assert!(bf16_program.device_kernels().iter().all(|(s, _)| !f32_sources.contains(s)));
    assert_eq!(compile_all(&bf16_program), bf16_program.device_kernels().len() as u64, "bf16: its kernels only");
    assert_eq!(compile_all(&f32_program), 0, "f32 is still cached");

    // A new process (a fresh cache on the same folder) reads every kernel from disk, NVRTC unasked.
    let fresh = KernelCache::with_dir(dir.path(), 1 << 30);
    let before = nvrtc_calls_on_this_thread();
    for p in [&f32_program, &bf16_program] {
        for (source, name) in p.device_kernels() {
            let (_, outcome) = fresh.get_or_compile(source, &opts).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(outcome, CacheOutcome::DiskHit, "{name}");
        }
    }
    assert_eq!(nvrtc_calls_on_this_thread(), before, "a warm lookup asked NVRTC something");
    assert_eq!(fresh.stats().session.compiles, 0);
}

/// Zeroed device tensors for giou_lengths at `b` images of `n` boxes (no box valid), the outputs
/// of `p` for them, and the buffers that hold them.
fn launch(p: &Program, gpu: &kfuse::Gpu, b: usize, n: usize) -> Vec<DeviceTensor> {
    let dtype = p.interface().input("pred").expect("pred").dtype;
    let tensor = |dtype: DType, shape: Vec<usize>| {
        let bytes = shape.iter().product::<usize>() * dtype.size_bytes();
        DeviceTensor::contiguous(gpu.alloc_zeroed(bytes.max(16)).expect("allocates"), dtype, shape)
    };
    let inputs = vec![
        ("pred", tensor(dtype, vec![b, n, 4])),
        ("target", tensor(dtype, vec![b, n, 4])),
        ("lengths", tensor(DType::I32, vec![b])),
    ];
    let shapes: Vec<(&str, &[usize])> = inputs.iter().map(|(name, t)| (*name, t.shape.as_slice())).collect();
    let outputs: Vec<DeviceTensor> =
        p.output_shapes(&shapes).expect("shapes").into_iter().map(|(_, dtype, shape)| tensor(dtype, shape)).collect();
    p.launch(gpu.ordinal(), &gpu.default_stream(), &inputs, &outputs, kfuse::Validation::Deferred).expect("launches");
    gpu.synchronize().expect("runs");
    outputs
}

#[test]
fn a_warm_first_call_asks_nvrtc_nothing_and_new_sizes_compile_nothing() {
    let Some(probe) = gpu_or_skip("a_warm_first_call_asks_nvrtc_nothing_and_new_sizes_compile_nothing") else {
        return;
    };
    let ordinal = probe.ordinal();
    drop(probe);
    let dir = tempfile::tempdir().expect("tempdir");
    let cold = engine(KernelCache::with_dir(dir.path(), 1 << 30));
    let (_, g) = giou(&cold, DType::F32);
    let gpu = cold.device(ordinal).expect("opens");
    launch(&g, &gpu, 3, 8);
    // The load compiled the plan's kernels (quick builds, then their optimised builds in the
    // background) and the backward's scaling kernel (optimised at once), in parallel.
    cold.cache().wait_for_background();
    let plan = g.plan().kernels.iter().flat_map(|k| k.entries()).count() as u64;
    assert_eq!(cold.cache().stats().session.compiles, g.device_kernels().len() as u64 + plan);

    // A new process: a fresh engine and cache on the same folder.
    let warm = engine(KernelCache::with_dir(dir.path(), 1 << 30));
    let (_, g) = giou(&warm, DType::F32);
    let before = nvrtc_calls_on_this_thread();
    let gpu = warm.device(ordinal).expect("opens");
    let outputs = launch(&g, &gpu, 3, 8);
    let grad = outputs.iter().find(|t| t.shape.len() == 3).expect("the gradient output");
    let upstream = DeviceTensor::contiguous(gpu.alloc_zeroed(16).expect("allocates"), DType::F32, vec![]);
    kfuse::scale_by_upstream(&warm, ordinal, &gpu.default_stream(), grad, &upstream).expect("scales");
    gpu.synchronize().expect("runs");
    assert_eq!(nvrtc_calls_on_this_thread(), before, "a warm first call asked NVRTC something");
    let loaded = gpu.loaded_functions();
    assert_eq!(loaded, g.device_kernels().len());
    // New batch sizes and box counts reuse what is loaded.
    launch(&g, &gpu, 17, 5);
    launch(&g, &gpu, 1, 300);
    let stats = warm.cache().stats().session;
    assert_eq!((stats.compiles, stats.disk_hits), (0, g.device_kernels().len() as u64));
    assert_eq!(gpu.loaded_functions(), loaded);
}
