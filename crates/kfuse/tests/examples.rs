//! Every example program: its generated CUDA is pinned by a golden file (pure tier; refresh with
//! UPDATE_EXPECT=1 and review the diff like code), planning is deterministic, and every kernel
//! compiles with NVRTC for sm_80 and sm_90 in f32, f16 and bf16 (NVRTC tier).

mod common;

use kfuse::{testdata::with_float_dtype, DType, Program};
use kfuse_runtime::{compile, testing::nvrtc_or_skip, Arch, CompileOptions};

#[test]
fn generated_source_of_every_example_is_pinned() {
    for (stem, src) in common::examples() {
        let p = Program::from_source(&src, &format!("examples/{stem}.kf")).unwrap();
        let plan = p.plan().unwrap_or_else(|e| panic!("{stem}: {e}"));
        let text: String = plan.kernels.iter().map(|k| format!("{}\n", k.source)).collect();
        golden_env();
        expect_test::expect_file![format!("golden/{stem}.cu")].assert_eq(&text);
        // Deterministic: planning again gives the same bytes.
        let again: String = p.plan().unwrap().kernels.iter().map(|k| format!("{}\n", k.source)).collect();
        assert_eq!(text, again, "{stem}");
        assert!(!text.contains("#include"), "{stem}: generated code must be header-free");
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
            let src = with_float_dtype(&src, dtype);
            let p = Program::from_source(&src, &format!("examples/{stem}.kf"))
                .unwrap_or_else(|e| panic!("{stem} {dtype}: {e}"));
            for k in p.plan().unwrap().kernels {
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

/// Golden files are found through CARGO_MANIFEST_DIR, which cargo sets; a test executable run
/// directly (as on the GPU machine, which has no Rust) gets the compile-time value instead.
fn golden_env() {
    if std::env::var_os("CARGO_MANIFEST_DIR").is_none() {
        std::env::set_var("CARGO_MANIFEST_DIR", env!("CARGO_MANIFEST_DIR"));
    }
}
