//! Every example program: its generated CUDA is pinned by a golden file (pure tier; refresh with
//! UPDATE_EXPECT=1 and review the diff like code), planning is deterministic, and every kernel
//! compiles with NVRTC for sm_80 and sm_90 in f32, f16 and bf16, and with its inputs read through
//! strides (NVRTC tier).

use std::sync::Arc;

use kfuse::{DType, Engine, KernelCache, Program};
use kfuse_runtime::{compile, Arch, CompileOptions};
use kfuse_testing as common;
use kfuse_testing::nvrtc_or_skip;

fn engine() -> Engine {
    Engine::with_cache(Arc::new(KernelCache::memory_only()))
}

#[test]
fn generated_source_of_every_example_is_pinned() {
    for (stem, src) in common::examples() {
        let p =
            Program::compile(&engine(), &src, &format!("examples/{stem}.kf")).unwrap_or_else(|e| panic!("{stem}: {e}"));
        let text = p.cuda_source();
        golden_env();
        expect_test::expect_file![format!("golden/{stem}.cu")].assert_eq(&text);
        // Deterministic: planning again gives the same bytes.
        let again = p.with_codegen(p.codegen().clone()).unwrap().cuda_source();
        assert_eq!(text, again, "{stem}");
        assert!(!text.contains("#include"), "{stem}: generated code must be header-free");
    }
}

/// Rows of 2-byte floats kept in registers are kept as the words they were loaded as (two
/// columns a word): pinned by golden files of the bf16 forms of two row programs.
#[test]
fn generated_source_of_the_bf16_row_programs_is_pinned() {
    for stem in ["gelu_bias_train", "layer_norm_train"] {
        let src = common::examples().into_iter().find(|(s, _)| s == stem).map(|(_, src)| src).unwrap();
        let p = Program::compile(&engine(), &src, &format!("examples/{stem}.kf")).unwrap();
        let dtypes = common::float_inputs_as(p.interface(), DType::BF16);
        let dtypes: Vec<(&str, DType)> = dtypes.iter().map(|(n, d)| (n.as_str(), *d)).collect();
        let text = p.with_input_dtypes(&dtypes).unwrap().cuda_source();
        assert!(text.contains("two columns a word"), "{stem}: a bf16 row kept in registers is kept packed");
        golden_env();
        expect_test::expect_file![format!("golden/{stem}.bf16.cu")].assert_eq(&text);
    }
}

#[test]
fn every_example_compiles_for_sm80_and_sm90_in_every_float_dtype() {
    if nvrtc_or_skip("every_example_compiles_for_sm80_and_sm90_in_every_float_dtype").is_none() {
        return;
    }
    let mut compiled = 0;
    for (stem, src) in common::examples() {
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let p = Program::compile(&engine(), &src, &format!("examples/{stem}.kf")).unwrap();
            let dtypes = common::float_inputs_as(p.interface(), dtype);
            let dtypes: Vec<(&str, DType)> = dtypes.iter().map(|(n, d)| (n.as_str(), *d)).collect();
            let p = p.with_input_dtypes(&dtypes).unwrap_or_else(|e| panic!("{stem} {dtype}: {e}"));
            for k in &p.plan().kernels {
                for arch in ["sm_80", "sm_90"] {
                    let arch: Arch = arch.parse().unwrap();
                    let m = compile(&k.source, &CompileOptions::for_arch(arch))
                        .unwrap_or_else(|e| panic!("{stem} {dtype} {arch}: {e}"));
                    assert_eq!(&m.cubin[..4], b"\x7fELF", "{stem} {dtype} {arch}");
                    assert!(m.ptx.contains(&format!(".entry {}", k.name)), "{stem}: PTX lacks the entry {}", k.name);
                    compiled += 1;
                }
            }
        }
    }
    assert!(compiled >= 12 * 3 * 2, "compiled {compiled} kernels");
}

/// `p` planned to read every input but its lengths and offsets through strides given at launch.
fn strided(p: &Program) -> Program {
    let constrained = |i: u32| p.interface().inputs[i as usize].layout.is_some();
    let inputs: Vec<u32> = (0..p.interface().inputs.len() as u32).filter(|&i| !constrained(i)).collect();
    p.reading_strided(&inputs).unwrap_or_else(|e| panic!("{}: {e}", p.origin()))
}

/// Inputs read through strides: the kernels take a stride per axis of each and read it with no
/// vector loads; the source of one program is pinned.
#[test]
fn kernels_that_read_inputs_through_strides_take_a_stride_per_axis() {
    for (stem, src) in common::examples() {
        let p = strided(&Program::compile(&engine(), &src, &format!("examples/{stem}.kf")).unwrap());
        for k in &p.plan().kernels {
            for (i, decl) in p.interface().inputs.iter().enumerate() {
                if !k.source.contains(&format!("__restrict__ in{i},")) || decl.layout.is_some() {
                    continue;
                }
                for axis in 0..decl.shape.len() {
                    let decl = format!("long long st{i}_{axis}");
                    let declared = k
                        .source
                        .match_indices(&decl)
                        .any(|(at, _)| !k.source[at + decl.len()..].starts_with(|c: char| c.is_ascii_digit()));
                    assert!(declared, "{stem} {}: no stride {axis} of `{}`", k.name, p.interface().inputs[i].name);
                }
                assert!(
                    !k.source.contains(&format!("*>(in{i}")),
                    "{stem} {}: a vector load of `{}`",
                    k.name,
                    decl.name
                );
            }
        }
        if stem == "layer_norm_train" {
            golden_env();
            expect_test::expect_file!["golden/layer_norm_train.strided.cu"].assert_eq(&p.cuda_source());
        }
    }
}

#[test]
fn every_example_compiles_with_its_inputs_read_through_strides() {
    if nvrtc_or_skip("every_example_compiles_with_its_inputs_read_through_strides").is_none() {
        return;
    }
    let mut compiled = 0;
    for (stem, src) in common::examples() {
        for dtype in [DType::F32, DType::BF16] {
            let p = Program::compile(&engine(), &src, &format!("examples/{stem}.kf")).unwrap();
            let dtypes = common::float_inputs_as(p.interface(), dtype);
            let dtypes: Vec<(&str, DType)> = dtypes.iter().map(|(n, d)| (n.as_str(), *d)).collect();
            let p = strided(&p.with_input_dtypes(&dtypes).unwrap_or_else(|e| panic!("{stem} {dtype}: {e}")));
            for (source, entry) in p.plan().kernels.iter().flat_map(|k| k.entries()) {
                let m = compile(source, &CompileOptions::for_arch(Arch::new(9, 0)))
                    .unwrap_or_else(|e| panic!("{stem} {dtype} {entry}: {e}\n{source}"));
                assert!(m.ptx.contains(&format!(".entry {entry}")), "{stem}: PTX lacks the entry {entry}");
                compiled += 1;
            }
        }
    }
    assert!(compiled >= 12 * 2, "compiled {compiled} kernels");
}

/// Golden files are found through CARGO_MANIFEST_DIR, which cargo sets; a test executable run
/// directly (as on the GPU machine, which has no Rust) gets the compile-time value instead.
fn golden_env() {
    if std::env::var_os("CARGO_MANIFEST_DIR").is_none() {
        std::env::set_var("CARGO_MANIFEST_DIR", env!("CARGO_MANIFEST_DIR"));
    }
}
