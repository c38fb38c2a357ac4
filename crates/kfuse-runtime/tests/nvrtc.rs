//! NVRTC tier: compiling header-free kernels to cubin + PTX without a GPU.

use kfuse_runtime::testing::nvrtc_or_skip;
use kfuse_runtime::{compile, nvrtc_version, Arch, CompileOptions, RuntimeError};

const AXPY: &str = r#"
extern "C" __global__ void axpy(float* out, const float* x, float a, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { out[i] = a * x[i] + out[i]; }
}
"#;

#[test]
fn version_is_reported() {
    let Some(()) = nvrtc_or_skip("version_is_reported") else { return };
    let (major, minor) = nvrtc_version().expect("NVRTC loaded");
    assert!(major >= 11, "NVRTC {major}.{minor}");
}

#[test]
fn compiles_to_cubin_and_ptx_for_sm80_and_sm90() {
    let Some(()) = nvrtc_or_skip("compiles_to_cubin_and_ptx_for_sm80_and_sm90") else { return };
    for arch in [Arch::new(8, 0), Arch::new(9, 0)] {
        let module = compile(AXPY, &CompileOptions::for_arch(arch)).expect("compiles");
        assert_eq!(&module.cubin[..4], b"\x7fELF", "{arch}: cubin is not an ELF image");
        assert!(
            module.ptx.contains(&format!(".target {arch}")),
            "{arch}: PTX lacks `.target {arch}`:\n{}",
            &module.ptx[..module.ptx.len().min(400)]
        );
        assert!(module.ptx.contains(".entry axpy"), "{arch}: PTX lacks the entry");
        assert_eq!(module.arch, arch);
    }
}

#[test]
fn compilation_is_deterministic_and_keyed_by_arch() {
    let Some(()) = nvrtc_or_skip("compilation_is_deterministic_and_keyed_by_arch") else { return };
    let a = compile(AXPY, &CompileOptions::for_arch(Arch::new(9, 0))).expect("compiles");
    let b = compile(AXPY, &CompileOptions::for_arch(Arch::new(9, 0))).expect("compiles");
    let c = compile(AXPY, &CompileOptions::for_arch(Arch::new(8, 0))).expect("compiles");
    assert_eq!(a.key, b.key);
    assert_eq!(a.ptx, b.ptx);
    assert_ne!(a.key, c.key);
}

#[test]
fn syntax_error_reports_the_nvrtc_log() {
    let Some(()) = nvrtc_or_skip("syntax_error_reports_the_nvrtc_log") else { return };
    let broken = "extern \"C\" __global__ void broken(float* out) { out[0] = 1.0f +; }";
    let err = compile(broken, &CompileOptions::for_arch(Arch::new(9, 0))).expect_err("must fail");
    let message = err.to_string();
    match &err {
        RuntimeError::Compile { log, options, arch, .. } => {
            assert!(log.contains("expected an expression"), "log: {log}");
            assert!(message.contains(log.as_str()), "message lacks the log: {message}");
            assert!(options.iter().any(|o| o == "--gpu-architecture=sm_90"), "{options:?}");
            assert_eq!(*arch, Arch::new(9, 0));
        }
        other => panic!("expected RuntimeError::Compile, got {other:?}"),
    }
}

#[test]
fn nul_in_source_or_option_is_an_error_not_a_panic() {
    let Some(()) = nvrtc_or_skip("nul_in_source_or_option_is_an_error_not_a_panic") else { return };
    let err = compile("extern \"C\" __global__ void k() {}\0", &CompileOptions::for_arch(Arch::new(9, 0)))
        .expect_err("NUL in source");
    assert!(matches!(err, RuntimeError::InteriorNul { .. }), "{err:?}");
    let opts = CompileOptions { arch: Arch::new(9, 0), extra: vec!["-D X\0".to_string()] };
    let err = compile(AXPY, &opts).expect_err("NUL in option");
    assert!(matches!(err, RuntimeError::InteriorNul { .. }), "{err:?}");
}

#[test]
fn extra_options_reach_nvrtc() {
    let Some(()) = nvrtc_or_skip("extra_options_reach_nvrtc") else { return };
    let source = "extern \"C\" __global__ void k(int* o) { o[0] = VALUE; }";
    let without = compile(source, &CompileOptions::for_arch(Arch::new(9, 0)));
    assert!(matches!(without, Err(RuntimeError::Compile { .. })), "VALUE is undefined");
    let opts = CompileOptions { arch: Arch::new(9, 0), extra: vec!["-DVALUE=7".to_string()] };
    let module = compile(source, &opts).expect("compiles with -DVALUE=7");
    assert!(module.ptx.contains("7;"), "PTX should store the constant 7");
}

#[test]
fn extra_options_are_part_of_the_key() {
    let Some(()) = nvrtc_or_skip("extra_options_are_part_of_the_key") else { return };
    let plain = CompileOptions::for_arch(Arch::new(9, 0));
    let fast = CompileOptions { arch: Arch::new(9, 0), extra: vec!["--use_fast_math".to_string()] };
    let fast_twice = CompileOptions {
        arch: Arch::new(9, 0),
        extra: vec!["--use_fast_math".to_string(), "--use_fast_math".to_string()],
    };
    let key = |opts: &CompileOptions| kfuse_runtime::cache_key(AXPY, opts);
    assert_ne!(key(&plain), key(&fast), "--use_fast_math must change the key");
    assert_ne!(key(&fast), key(&fast_twice), "the option list is keyed, not a set");
    assert_eq!(key(&fast), key(&fast.clone()));
    // The key compile() reports is the one cache_key() predicts, options included.
    let module = compile(AXPY, &fast).expect("compiles with --use_fast_math");
    assert_eq!(module.key, key(&fast));
    assert!(fast.nvrtc_options().ends_with(&["--use_fast_math".to_string()]));
}
