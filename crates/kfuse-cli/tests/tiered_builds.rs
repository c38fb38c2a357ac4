//! Tiered builds: a first call that must compile launches quick builds (NVRTC's
//! `--Ofast-compile=max`) while the optimised builds compile in the background, then switches.
//! Both builds must give the same bits, since a result must not depend on which one ran it.
//!
//! NVRTC tier: the PTX of both builds of every example kernel holds no float operation that
//! ptxas may contract into an FMA, and no FMA the source did not write. GPU tier: every example,
//! in f32 and bf16, gives the same bits from its quick and optimised builds on fresh random data
//! at odd sizes; a cold load launches quick builds, switches once the background compiles end,
//! and leaves the optimised builds on disk for the next process.

use std::sync::Arc;

use kfuse::exec::CudaProgram;
use kfuse::runtime::{compile, Arch, CompileOptions, KernelCache};
use kfuse::{DType, Engine, HostTensor, Program};
use kfuse_cli::testdata;
use kfuse_testing as common;
use kfuse_testing::{gpu_or_skip, nvrtc_or_skip};

/// `src` compiled with its f32 inputs at `dtype`.
fn compile_at(engine: &Engine, src: &str, origin: &str, dtype: DType) -> Program {
    let p = Program::compile(engine, src, origin).unwrap_or_else(|e| panic!("{origin}: {e}"));
    let dtypes = common::float_inputs_as(p.interface(), dtype);
    let dtypes: Vec<(&str, DType)> = dtypes.iter().map(|(n, d)| (n.as_str(), *d)).collect();
    p.with_input_dtypes(&dtypes).unwrap_or_else(|e| panic!("{origin}: {e}"))
}

/// The PTX float instructions whose rounding ptxas may fuse into an FMA (a multiply, add or
/// subtract of f32/f64 without a rounding modifier), and the FMAs, of `ptx`.
fn contractible_and_fmas(ptx: &str) -> (Vec<String>, usize) {
    let mut contractible = Vec::new();
    let mut fmas = 0;
    for line in ptx.lines() {
        let Some(op) = line.split_whitespace().next() else { continue };
        let parts: Vec<&str> = op.trim_start_matches('@').split('.').collect();
        let float = parts.iter().any(|p| *p == "f32" || *p == "f64");
        let rounded = parts.iter().any(|p| matches!(*p, "rn" | "rz" | "rm" | "rp"));
        match parts.first().copied() {
            Some("mul" | "add" | "sub") if float && !rounded => contractible.push(line.trim().to_string()),
            Some("fma") if float => fmas += 1,
            _ => {}
        }
    }
    (contractible, fmas)
}

#[test]
fn no_build_of_an_example_kernel_leaves_ptxas_a_multiply_add_to_contract() {
    if nvrtc_or_skip("no_build_of_an_example_kernel_leaves_ptxas_a_multiply_add_to_contract").is_none() {
        return;
    }
    let engine = Engine::with_cache(Arc::new(KernelCache::memory_only()));
    let full = CompileOptions::for_kernels(Arch::new(9, 0));
    let quick = full.quick().expect("a quick build");
    let mut checked = 0;
    for stem in ["giou_train_lengths", "layer_norm_train", "softmax_xent_train", "elementwise_ops"] {
        let p = Program::compile(&engine, &common::example(stem), stem).expect("compiles");
        for (source, name) in p.device_kernels() {
            let written = source.matches("fmaf(").count();
            for opts in [&full, &quick] {
                let module = compile(source, opts).unwrap_or_else(|e| panic!("{stem} {name} {:?}: {e}", opts.extra));
                let (contractible, fmas) = contractible_and_fmas(&module.ptx);
                assert!(
                    contractible.is_empty(),
                    "{stem} {name} {:?}: ptxas may contract {} instructions, e.g. {:?}",
                    opts.extra,
                    contractible.len(),
                    &contractible[..contractible.len().min(3)]
                );
                // An FMA in the PTX comes from the source (fmaf) or from a math function's own
                // code, never from a multiply and an add of the kernel's arithmetic; with none
                // written and no math function, there is none.
                if written == 0 && stem == "giou_train_lengths" {
                    assert_eq!(fmas, 0, "{stem} {name} {:?}: {fmas} FMAs nobody wrote", opts.extra);
                }
                checked += 1;
            }
        }
    }
    assert!(checked >= 8, "{checked} builds checked");
}

fn seed() -> u64 {
    let seed = std::env::var("KFUSE_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
    });
    println!("tiered builds seed: {seed} (replay with KFUSE_TEST_SEED={seed})");
    seed
}

/// One run of `prog` on `inputs`, outputs poisoned first, as bytes per output.
fn run(prog: &CudaProgram, inputs: &[(&str, &HostTensor)]) -> Vec<(String, Vec<u8>)> {
    let bound = prog.bind(inputs).expect("binds");
    prog.poison_outputs(&bound, 0x7f).expect("poisons");
    prog.launch(&bound).expect("launches");
    prog.download(&bound).expect("downloads").into_iter().map(|(n, t)| (n, t.to_bytes())).collect()
}

#[test]
fn quick_builds_give_the_bits_of_the_optimised_builds() {
    let Some(gpu) = gpu_or_skip("quick_builds_give_the_bits_of_the_optimised_builds") else {
        return;
    };
    let gpu = Arc::new(gpu);
    let engine = Engine::with_cache(gpu.cache().clone());
    let seed = seed();
    let mut compared = 0;
    for (i, (stem, src)) in common::examples().iter().enumerate() {
        for dtype in [DType::F32, DType::BF16] {
            let p = compile_at(&engine, src, stem, dtype);
            let optimised = CudaProgram::prepare(&gpu, &p).unwrap_or_else(|e| panic!("{stem}: {e}"));
            optimised.wait_for_optimised();
            assert!(optimised.is_optimised(), "{stem} ({dtype})");
            let quick = CudaProgram::quick_builds(&gpu, p.plan().clone()).unwrap_or_else(|e| panic!("{stem}: {e}"));
            let symbols = p.graph().symbols.len();
            for sizes in [vec![3u64; symbols], vec![257; symbols], (0..symbols as u64).map(|s| 255 + 2 * s).collect()] {
                let seed = seed.wrapping_add(i as u64 * 1000 + sizes[0]);
                let inputs = testdata::random_inputs_for(p.graph(), &sizes, seed).expect("inputs");
                let named: Vec<(&str, &HostTensor)> = inputs.iter().map(|(n, t)| (n.as_str(), t)).collect();
                let want = run(&optimised, &named);
                let got = run(&quick, &named);
                for ((name, g), (_, w)) in got.iter().zip(&want) {
                    assert!(
                        g == w,
                        "{stem} ({dtype}) output {name} at sizes {sizes:?}, seed {seed}: the quick build's bits differ"
                    );
                }
                compared += 1;
            }
        }
    }
    assert!(compared >= 60, "{compared} comparisons");
}

#[test]
fn a_cold_load_launches_quick_builds_switches_and_leaves_the_optimised_ones_on_disk() {
    let Some(probe) = gpu_or_skip("a_cold_load_launches_quick_builds_switches_and_leaves_the_optimised_ones_on_disk")
    else {
        return;
    };
    drop(probe);
    let dir = tempfile::tempdir().expect("tempdir");
    let seed = seed();
    // A cooperative kernel (the ragged loss), a kernel with entries for rows in registers and a
    // fold (the layer norm).
    for stem in ["giou_train_lengths", "layer_norm_train"] {
        let cache = Arc::new(KernelCache::with_dir(dir.path(), 1 << 30));
        let engine = Engine::with_cache(cache.clone());
        let gpu = engine.device(0).expect("opens");
        let p = compile_at(&engine, &common::example(stem), stem, DType::F32);
        let sources: std::collections::HashSet<&str> = p.device_kernels().iter().map(|(s, _)| *s).collect();
        let sources = sources.len() as u64;
        let prog = CudaProgram::prepare(&gpu, &p).expect("loads");
        assert!(!prog.is_optimised(), "{stem}: a cold load starts with the quick builds");
        let sizes: Vec<u64> = (0..p.graph().symbols.len() as u64).map(|s| 257 + 2 * s).collect();
        let inputs = testdata::random_inputs_for(p.graph(), &sizes, seed).expect("inputs");
        let named: Vec<(&str, &HostTensor)> = inputs.iter().map(|(n, t)| (n.as_str(), t)).collect();
        let first = run(&prog, &named);
        prog.wait_for_optimised();
        assert!(prog.is_optimised(), "{stem}: switched after the background compiles");
        assert_eq!(run(&prog, &named), first, "{stem}: the optimised builds' bits differ from the quick ones'");
        cache.wait_for_background();
        assert_eq!(cache.stats().session.compiles, 2 * sources, "{stem}: a quick and an optimised build each");

        // A new process: the optimised builds come from disk, and nothing is tiered.
        let warm = Engine::with_cache(Arc::new(KernelCache::with_dir(dir.path(), 1 << 30)));
        let gpu = warm.device(0).expect("opens");
        let p = compile_at(&warm, &common::example(stem), stem, DType::F32);
        let prog = CudaProgram::prepare(&gpu, &p).expect("loads");
        assert!(prog.is_optimised(), "{stem}: a warm load launches the optimised builds at once");
        assert_eq!(run(&prog, &named), first, "{stem}: a warm process's bits");
        assert_eq!(warm.cache().stats().session.compiles, 0, "{stem}: a warm load compiles nothing");
    }
}
