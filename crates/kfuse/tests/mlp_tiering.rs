//! Tiered compilation. NVRTC tier: the fast form (`emit_fast_form`: the generic kernel of
//! generic.rs, `--Ofast-compile=mid`, one row tile per warp) compiles for sm_80 and sm_90 for several widths,
//! activations and dtypes and shares the optimised kernel's parameters, and a background compile
//! lands in the kernel cache (memory, and disk for a fresh process). GPU tier (skips without a
//! GPU unless KFUSE_REQUIRE_GPU=1): a cold
//! prepare runs the fast form, which matches the CPU interpreter; after `wait_optimized` the
//! optimised kernel is in use and matches too; a warm prepare (same cache, or a new cache on the
//! same folder) compiles no fast form; `FullOnly` never tiers.

use std::sync::Arc;

use kfuse::mlp::{prepare, prepare_tiered, PreparedMlp};
use kfuse_ir::{DType, HostTensor};
use kfuse_mlp::testing::{random_input, write_model, ModelSpec, Rng};
use kfuse_mlp::{
    compare_rows, emit_fast_form, emit_kernel, evaluate_cpu, CompileEffort, KernelTier, MlpKernelOptions, MlpModel,
    RepeatedLayers, Tiering,
};
use kfuse_runtime::testing::{gpu_or_skip, nvrtc_or_skip};
use kfuse_runtime::{compile, Arch, CacheOutcome, CompileOptions, Gpu, KernelCache};

fn model(
    dir: &std::path::Path,
    name: &str,
    widths: &[usize],
    act: &str,
    dtype: DType,
    bias: bool,
    seed: u64,
) -> MlpModel {
    let mut spec = ModelSpec::new(widths, act);
    spec.dtype = dtype;
    spec.with_bias = bias;
    spec.seed = seed;
    MlpModel::load(write_model(dir, name, &spec).expect("write model")).expect("load model")
}

#[test]
fn fast_form_compiles_for_sm80_and_sm90_and_shares_the_kernel() {
    if nvrtc_or_skip("fast_form_compiles_for_sm80_and_sm90_and_shares_the_kernel").is_none() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    // (name, widths, activation, weight dtype, I/O dtype, bias)
    type Case = (&'static str, Vec<usize>, &'static str, DType, DType, bool);
    let cases: [Case; 5] = [
        ("relu64", vec![64, 64, 64, 64, 64, 16], "relu", DType::F16, DType::F16, false),
        ("silu-bias", vec![32, 64, 128, 96, 64, 32, 16], "silu", DType::F16, DType::F16, true),
        ("gelu-odd", vec![3, 24, 100, 5], "gelu", DType::BF16, DType::F32, true),
        ("expr", vec![16, 40, 24], "x * sigmoid(1.702 * x)", DType::F16, DType::BF16, true),
        ("w256", vec![256, 256, 32], "tanh", DType::BF16, DType::BF16, false),
    ];
    for (name, widths, act, wd, io, bias) in cases {
        let m = model(dir.path(), name, &widths, act, wd, bias, 3);
        let full_opts = MlpKernelOptions { in_dtype: io, out_dtype: io, ..MlpKernelOptions::default() };
        let full = emit_kernel(&m, &full_opts).expect("emit full");
        let nvrtc = kfuse_runtime::nvrtc_version().expect("version");
        let fast = emit_fast_form(&m, &full_opts, &full, nvrtc).expect("a fast form");
        // Tiering shares the parameter blob and the I/O dtypes; the geometry is the fast form's
        // own (one row tile per warp); the form is the generic kernel (generic.rs) wherever it fits.
        assert_eq!(fast.params, full.params, "{name}");
        assert_eq!((fast.in_dtype, fast.out_dtype), (full.in_dtype, full.out_dtype), "{name}");
        assert_eq!(fast.row_tiles_per_warp, 1, "{name}");
        assert_eq!(fast.rows_per_block, 16 * fast.warps, "{name}");
        assert!(
            fast.name.starts_with("kf_mlp_generic_") && fast.source.contains("__constant__ int kg_table["),
            "{name}: the generic form"
        );
        assert!(fast.nvrtc_options.iter().any(|o| o == "--Ofast-compile=mid"), "{name}: {:?}", fast.nvrtc_options);
        assert_eq!(
            fast.nvrtc_options.iter().any(|o| o == "-minimal"),
            nvrtc >= (12, 4),
            "{name}: {:?}",
            fast.nvrtc_options
        );
        assert!(
            !full.nvrtc_options.iter().any(|o| o.starts_with("--Ofast-compile")),
            "{name}: {:?}",
            full.nvrtc_options
        );
        // An old NVRTC gets no -minimal; the optimised kernel's own loop form shares the blob too.
        let old = emit_fast_form(&m, &full_opts, &full, (12, 3)).expect("a fast form");
        assert!(!old.nvrtc_options.iter().any(|o| o == "-minimal"), "{name}: {:?}", old.nvrtc_options);
        let looped_opts = MlpKernelOptions { repeated_layers: RepeatedLayers::Loop, ..full_opts.clone() };
        let looped = emit_kernel(&m, &looped_opts).expect("emit looped");
        assert_eq!(
            emit_fast_form(&m, &looped_opts, &looped, nvrtc).map(|k| k.source),
            Some(fast.source.clone()),
            "{name}"
        );
        for arch in [Arch::new(8, 0), Arch::new(9, 0)] {
            let t = std::time::Instant::now();
            let out =
                compile(&fast.source, &CompileOptions { arch: fast.target(arch), extra: fast.nvrtc_options.clone() });
            match out {
                Ok(module) => {
                    println!(
                        "{name} fast {arch}: {} B cubin in {:.0} ms",
                        module.cubin.len(),
                        t.elapsed().as_secs_f64() * 1e3
                    );
                    assert!(!module.cubin.is_empty(), "{name} {arch}");
                }
                Err(e) => panic!("{name}: the fast form failed to compile for {arch}: {e}"),
            }
        }
    }
}

#[test]
fn background_compile_lands_in_memory_and_disk_cache() {
    if nvrtc_or_skip("background_compile_lands_in_memory_and_disk_cache").is_none() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let m = model(dir.path(), "bg", &[64, 64, 64, 16], "relu", DType::F16, true, 5);
    let kernel = emit_kernel(&m, &MlpKernelOptions::default()).expect("emit");
    let opts = CompileOptions { arch: kernel.target(Arch::new(9, 0)), extra: kernel.nvrtc_options.clone() };
    let cache = Arc::new(KernelCache::with_dir(dir.path().join("cache"), 1 << 30));
    assert!(cache.get_cached(&kernel.source, &opts).expect("probe").is_none());
    let job = cache.compile_in_background(kernel.source.clone(), opts.clone());
    let done = job.wait();
    let ms = done.result.expect("the background compile succeeds");
    println!("background compile: {ms:.0} ms");
    assert!(ms > 0.0);
    assert!(job.is_finished());
    let found = cache.get_cached(&kernel.source, &opts).expect("probe").map(|(_, o)| o);
    assert_eq!(found, Some(CacheOutcome::MemoryHit));
    assert_eq!(cache.stats().session.compiles, 1);
    // A later process (a new cache on the same folder) finds it on disk without compiling.
    let later = KernelCache::with_dir(dir.path().join("cache"), 1 << 30);
    let found = later.get_cached(&kernel.source, &opts).expect("probe").map(|(_, o)| o);
    assert_eq!(found, Some(CacheOutcome::DiskHit));
    assert_eq!(later.stats().session.compiles, 0);
}

/// Launches `tier` (or the default choice with `None`) on fresh random rows, poisoned output,
/// and compares with the CPU interpreter.
fn check_against_cpu(
    gpu: &Gpu,
    prepared: &PreparedMlp,
    m: &MlpModel,
    tier: Option<KernelTier>,
    io: DType,
    rng: &mut Rng,
    what: &str,
) {
    for rows in [1usize, 3, 255, 256, 1023] {
        let x = random_input(io, rows, m.input_width(), rng);
        let xb = gpu.upload(&x.to_bytes()).expect("upload");
        let out_w = m.output_width();
        let y = gpu.alloc_zeroed(rows * out_w * io.size_bytes()).expect("alloc");
        gpu.fill(&y, 0xff).expect("poison");
        match tier {
            Some(t) => prepared.launch_tier(gpu, t, &xb, &y, rows).expect("launch tier"),
            None => prepared.launch(gpu, &xb, &y, rows).expect("launch"),
        }
        let got = HostTensor::from_bytes(io, vec![rows, out_w], &gpu.download(&y).expect("download")).expect("size");
        let want = evaluate_cpu(m, &x).expect("cpu");
        let e = compare_rows(&got.to_f64(), &want, out_w);
        println!(
            "{what} {} rows {rows}: rel {:.2e} worst row {:.2e} (row {})",
            m.summary(),
            e.rel_err,
            e.worst_row_rel_err,
            e.worst_row
        );
        let plain = kfuse_mlp::testing::Numerics { f16_accumulator: false };
        kfuse_mlp::testing::check_16bit(m, &x, &got.to_f64(), &want, io, plain, &format!("{what} rows {rows}"))
            .unwrap_or_else(|why| panic!("{why}"));
    }
}

#[test]
fn cold_prepare_runs_the_fast_form_then_switches_to_the_optimised_kernel() {
    let Some(default_gpu) = gpu_or_skip("cold_prepare_runs_the_fast_form_then_switches_to_the_optimised_kernel") else {
        return;
    };
    let ordinal = default_gpu.ordinal();
    drop(default_gpu);
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut rng, _) = Rng::from_time();
    let cache_dir = dir.path().join("cache");
    let cases: [(Vec<usize>, &str, DType, bool); 2] = [
        (vec![64, 64, 64, 64, 64, 16], "relu", DType::F16, false),
        (vec![32, 64, 128, 96, 64, 32, 16], "silu", DType::BF16, true),
    ];
    for (n, (widths, act, dtype, bias)) in cases.into_iter().enumerate() {
        let m = model(dir.path(), &format!("t{n}"), &widths, act, dtype, bias, rng.next_u64());
        let gpu = Gpu::open_with_cache(ordinal, Arc::new(KernelCache::with_dir(&cache_dir, 1 << 30))).expect("open");
        let (prepared, ms) = prepare(&gpu, &m, dtype, dtype).expect("prepare");
        println!("{}: cold prepare {ms:.0} ms", m.summary());
        assert!(prepared.was_tiered(), "a cold cache must give the fast form first");
        check_against_cpu(&gpu, &prepared, &m, Some(KernelTier::Fast), dtype, &mut rng, "fast");
        let ready = prepared.wait_optimized(&gpu).expect("the optimised kernel compiles");
        println!(
            "optimised ready after {:.0} ms (background compile {:?} ms)",
            ready.ready_ms, ready.background_compile_ms
        );
        assert!(ready.background_compile_ms.is_some());
        assert!(prepared.is_optimized());
        assert_eq!(prepared.active_tier(), KernelTier::Full);
        check_against_cpu(&gpu, &prepared, &m, None, dtype, &mut rng, "full (default launch)");
        check_against_cpu(&gpu, &prepared, &m, Some(KernelTier::Full), dtype, &mut rng, "full");
        // A warm prepare (memory cache) compiles nothing and uses the optimised kernel at once.
        let compiles = gpu.cache().stats().session.compiles;
        let (warm, _) = prepare(&gpu, &m, dtype, dtype).expect("warm prepare");
        assert!(!warm.was_tiered() && warm.is_optimized());
        assert_eq!(gpu.cache().stats().session.compiles, compiles, "a warm prepare compiled something");
        assert!(warm
            .launch_tier(
                &gpu,
                KernelTier::Fast,
                &gpu.alloc_zeroed(16).expect("a"),
                &gpu.alloc_zeroed(16).expect("b"),
                1
            )
            .is_err());
        drop((warm, prepared, gpu));
        // A new process (a new cache on the same folder): a disk hit, no fast form, no compile.
        let gpu = Gpu::open_with_cache(ordinal, Arc::new(KernelCache::with_dir(&cache_dir, 1 << 30))).expect("open");
        let (again, _) = prepare(&gpu, &m, dtype, dtype).expect("disk-warm prepare");
        assert!(!again.was_tiered() && again.is_optimized());
        let stats = gpu.cache().stats().session;
        assert_eq!((stats.compiles, stats.disk_hits), (0, 1), "{stats:?}");
        check_against_cpu(&gpu, &again, &m, None, dtype, &mut rng, "disk-warm");
    }
}

#[test]
fn full_only_and_explicit_efforts_never_tier() {
    let Some(default_gpu) = gpu_or_skip("full_only_and_explicit_efforts_never_tier") else { return };
    let ordinal = default_gpu.ordinal();
    drop(default_gpu);
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut rng, _) = Rng::from_time();
    let m = model(dir.path(), "f", &[24, 48, 48, 8], "gelu", DType::F16, true, rng.next_u64());
    let gpu =
        Gpu::open_with_cache(ordinal, Arc::new(KernelCache::with_dir(dir.path().join("c1"), 1 << 30))).expect("open");
    let opts = MlpKernelOptions { shared_limit: gpu.max_shared_bytes(), ..MlpKernelOptions::default() };
    let (full_only, _) = prepare_tiered(&gpu, &m, &opts, Tiering::FullOnly).expect("prepare");
    assert!(!full_only.was_tiered() && full_only.is_optimized());
    check_against_cpu(&gpu, &full_only, &m, Some(KernelTier::Full), DType::F16, &mut rng, "full only");
    let gpu =
        Gpu::open_with_cache(ordinal, Arc::new(KernelCache::with_dir(dir.path().join("c2"), 1 << 30))).expect("open");
    let fast_opts = MlpKernelOptions { compile_effort: CompileEffort::Fast, ..opts };
    let (fast_asked, _) = prepare_tiered(&gpu, &m, &fast_opts, Tiering::Background).expect("prepare");
    assert!(!fast_asked.was_tiered(), "an explicitly requested effort is compiled as asked");
    check_against_cpu(&gpu, &fast_asked, &m, None, DType::F16, &mut rng, "fast asked");
}
