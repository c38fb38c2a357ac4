//! GPU tier: launches on a real device, compared with a CPU computation. Skips (printing
//! `SKIPPED:`) without a device unless `KFUSE_REQUIRE_GPU=1`.

use kfuse_runtime::testing::gpu_or_skip;
use kfuse_runtime::{Gpu, KernelArg, KernelLaunch, RuntimeError};

const SCALE_ADD: &str = r#"
extern "C" __global__ void __launch_bounds__(256) scale_add(
    float* out,          // n outputs
    const float* x,      // n inputs
    float a,
    float b,
    long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { out[i] = a * x[i] + b; }
}
"#;

// Reverses n floats through dynamic shared memory: needs n * 4 bytes of it.
const SHARED_REVERSE: &str = r#"
extern "C" __global__ void shared_reverse(float* out, const float* x, int n) {
    extern __shared__ float tile[];
    for (int i = threadIdx.x; i < n; i += blockDim.x) { tile[i] = x[i]; }
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x) { out[i] = tile[n - 1 - i]; }
}
"#;

fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn bytes_f32(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

/// Deterministic pseudo-random floats in [-1, 1) (a fresh seed per call site).
fn random_floats(n: usize, seed: u64) -> Vec<f32> {
    let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// A new seed every run (`KFUSE_TEST_SEED` replays one), printed so that a failure shows it.
fn seed() -> u64 {
    let seed = std::env::var("KFUSE_TEST_SEED").ok().and_then(|s| s.trim().parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(7)
    });
    println!("seed {seed} (replay with KFUSE_TEST_SEED={seed})");
    seed
}

#[test]
fn launch_matches_cpu_on_odd_sizes() {
    let Some(gpu) = gpu_or_skip("launch_matches_cpu_on_odd_sizes") else { return };
    let f = gpu.load_kernel(SCALE_ADD, "scale_add").expect("kernel loads");
    const TOLERANCE_F32: f32 = 1e-6;
    for n in [1usize, 3, 255, 256, 1023, 100_003] {
        let x = random_floats(n, seed() ^ n as u64);
        let (a, b) = (1.5f32, -0.25f32);
        let xb = gpu.upload(&f32_bytes(&x)).expect("upload");
        let out = gpu.alloc_zeroed(n * 4).expect("alloc");
        gpu.fill(&out, 0xFF).expect("poison");
        let grid = u32::try_from(n.div_ceil(256)).expect("grid fits");
        let args = [
            KernelArg::Buffer(&out),
            KernelArg::Buffer(&xb),
            KernelArg::F32(a),
            KernelArg::F32(b),
            KernelArg::I64(i64::try_from(n).expect("n fits")),
        ];
        gpu.launch(&gpu.default_stream(), &f, KernelLaunch::new(grid, 256), &args).expect("launch");
        let got = bytes_f32(&gpu.download(&out).expect("download"));
        assert_eq!(got.len(), n);
        for (i, (g, xi)) in got.iter().zip(&x).enumerate() {
            let want = a * xi + b;
            assert!((g - want).abs() <= TOLERANCE_F32 * want.abs().max(1.0), "n={n} i={i}: {g} vs {want}");
        }
    }
}

#[test]
fn fill_and_alloc_zeroed_are_visible() {
    let Some(gpu) = gpu_or_skip("fill_and_alloc_zeroed_are_visible") else { return };
    let buf = gpu.alloc_zeroed(1023).expect("alloc");
    assert!(gpu.download(&buf).expect("download").iter().all(|&b| b == 0));
    gpu.fill(&buf, 0xAB).expect("fill");
    assert!(gpu.download(&buf).expect("download").iter().all(|&b| b == 0xAB));
    let empty = gpu.alloc_zeroed(0).expect("empty alloc");
    assert_eq!(empty.bytes(), 0);
    assert!(gpu.download(&empty).expect("download empty").is_empty());
}

#[test]
fn large_dynamic_shared_memory_opts_in() {
    let Some(gpu) = gpu_or_skip("large_dynamic_shared_memory_opts_in") else { return };
    let f = gpu.load_kernel(SHARED_REVERSE, "shared_reverse").expect("kernel loads");
    let n = 20_000usize; // 80 000 bytes of shared memory, above the 48 KiB default
    let shared = u32::try_from(n * 4).expect("fits");
    if shared > gpu.max_shared_bytes() {
        println!("SKIPPED: large_dynamic_shared_memory_opts_in: device allows only {} B", gpu.max_shared_bytes());
        return;
    }
    let x = random_floats(n, seed());
    let xb = gpu.upload(&f32_bytes(&x)).expect("upload");
    let out = gpu.alloc_zeroed(n * 4).expect("alloc");
    gpu.fill(&out, 0xFF).expect("poison");
    let args = [KernelArg::Buffer(&out), KernelArg::Buffer(&xb), KernelArg::I32(i32::try_from(n).expect("fits"))];
    gpu.launch(&gpu.default_stream(), &f, KernelLaunch::new(1, 256).with_shared_bytes(shared), &args)
        .expect("launch with 80 KB shared");
    let got = bytes_f32(&gpu.download(&out).expect("download"));
    let want: Vec<f32> = x.iter().rev().copied().collect();
    assert_eq!(got, want);
    let too_much = gpu.max_shared_bytes() + 1024;
    let err = gpu
        .launch(&gpu.default_stream(), &f, KernelLaunch::new(1, 256).with_shared_bytes(too_much), &args)
        .expect_err("over the device limit");
    assert!(matches!(err, RuntimeError::InvalidLaunch { .. }), "{err}");
}

#[test]
fn second_handle_loads_without_recompiling_and_refuses_foreign_buffers() {
    let Some(gpu) = gpu_or_skip("second_handle_loads_without_recompiling") else { return };
    let source = SCALE_ADD.replace("scale_add", "scale_add_twice");
    let first = gpu.load_kernel(&source, "scale_add_twice").expect("loads");
    let compiles = gpu.cache().stats().session.compiles;
    let again = gpu.load_kernel(&source, "scale_add_twice").expect("loads again");
    assert_eq!(first.key(), again.key());
    let other = Gpu::open_with_cache(gpu.ordinal(), gpu.cache().clone()).expect("second handle");
    let on_other = other.load_kernel(&source, "scale_add_twice").expect("loads on second handle");
    assert_eq!(on_other.key(), first.key());
    assert_eq!(gpu.cache().stats().session.compiles, compiles, "no recompilation");
    let buf = gpu.alloc_zeroed(16).expect("alloc");
    let err = other.download(&buf).expect_err("foreign buffer");
    assert!(matches!(err, RuntimeError::ForeignHandle { .. }), "{err}");
    let err =
        other.launch(&other.default_stream(), &first, KernelLaunch::new(1, 1), &[]).expect_err("foreign function");
    assert!(matches!(err, RuntimeError::ForeignHandle { .. }), "{err}");
}

#[test]
fn missing_function_and_bad_launch_are_errors() {
    let Some(gpu) = gpu_or_skip("missing_function_and_bad_launch_are_errors") else { return };
    let err = gpu.load_kernel(SCALE_ADD, "no_such_kernel").expect_err("missing");
    assert!(matches!(err, RuntimeError::FunctionNotFound { .. }), "{err}");
    let f = gpu.load_kernel(SCALE_ADD, "scale_add").expect("loads");
    let err = gpu.launch(&gpu.default_stream(), &f, KernelLaunch::new(0, 256), &[]).expect_err("empty grid");
    assert!(matches!(err, RuntimeError::InvalidLaunch { .. }), "{err}");
}

#[test]
fn events_time_a_launch() {
    let Some(gpu) = gpu_or_skip("events_time_a_launch") else { return };
    let f = gpu.load_kernel(SCALE_ADD, "scale_add").expect("loads");
    let n = 1 << 20;
    let x = gpu.alloc_zeroed(n * 4).expect("alloc");
    let out = gpu.alloc_zeroed(n * 4).expect("alloc");
    let start = gpu.record_event().expect("event");
    let args = [
        KernelArg::Buffer(&out),
        KernelArg::Buffer(&x),
        KernelArg::F32(1.0),
        KernelArg::F32(2.0),
        KernelArg::I64(n as i64),
    ];
    gpu.launch(&gpu.default_stream(), &f, KernelLaunch::new((n / 256) as u32, 256), &args).expect("launch");
    let end = gpu.record_event().expect("event");
    let ms = gpu.elapsed_ms(&start, &end).expect("elapsed");
    assert!(ms >= 0.0 && ms.is_finite(), "{ms}");
    assert!(bytes_f32(&gpu.download(&out).expect("download")).iter().all(|&v| v == 2.0));
}

#[test]
fn extra_options_reach_nvrtc_and_key_the_loaded_kernel() {
    let Some(gpu) = gpu_or_skip("extra_options_reach_nvrtc_and_key_the_loaded_kernel") else { return };
    // VALUE is only defined by the extra option, so the kernel only compiles with it.
    let source = SCALE_ADD.replace("a * x[i] + b", "a * x[i] + b + VALUE").replace("scale_add", "scale_add_value");
    let err = gpu.load_kernel(&source, "scale_add_value").expect_err("VALUE undefined without the option");
    assert!(matches!(err, RuntimeError::Compile { .. }), "{err}");
    let three = vec!["-DVALUE=3.0f".to_string()];
    let five = vec!["-DVALUE=5.0f".to_string(), "--use_fast_math".to_string()];
    let f3 = gpu.load_kernel_with_options(&source, "scale_add_value", &three).expect("loads with -DVALUE=3");
    let f5 = gpu.load_kernel_with_options(&source, "scale_add_value", &five).expect("loads with -DVALUE=5");
    assert_ne!(f3.key(), f5.key(), "extra options are part of the key");
    let compiles = gpu.cache().stats().session.compiles;
    let again = gpu.load_kernel_with_options(&source, "scale_add_value", &three).expect("loads again");
    assert_eq!(again.key(), f3.key());
    assert_eq!(gpu.cache().stats().session.compiles, compiles, "the same extras do not recompile");
    const TOLERANCE_F32: f32 = 1e-5;
    for n in [1usize, 3, 255, 256, 1023] {
        let x = random_floats(n, seed() ^ n as u64);
        let xb = gpu.upload(&f32_bytes(&x)).expect("upload");
        for (f, value) in [(&f3, 3.0f32), (&f5, 5.0f32)] {
            let out = gpu.alloc_zeroed(n * 4).expect("alloc");
            gpu.fill(&out, 0xFF).expect("poison");
            let grid = u32::try_from(n.div_ceil(256)).expect("grid fits");
            let args = [
                KernelArg::Buffer(&out),
                KernelArg::Buffer(&xb),
                KernelArg::F32(2.0),
                KernelArg::F32(-1.0),
                KernelArg::I64(i64::try_from(n).expect("n fits")),
            ];
            gpu.launch(&gpu.default_stream(), f, KernelLaunch::new(grid, 256), &args).expect("launch");
            let got = bytes_f32(&gpu.download(&out).expect("download"));
            assert_eq!(got.len(), n);
            for (i, (g, xi)) in got.iter().zip(&x).enumerate() {
                let want = 2.0 * xi - 1.0 + value;
                assert!(
                    (g - want).abs() <= TOLERANCE_F32 * want.abs().max(1.0),
                    "VALUE={value} n={n} i={i}: {g} vs {want}"
                );
            }
        }
    }
}

#[test]
fn upload_slice_matches_byte_upload_for_every_element_type() {
    let Some(gpu) = gpu_or_skip("upload_slice_matches_byte_upload_for_every_element_type") else { return };
    for n in [1usize, 3, 255, 256, 1023] {
        let floats = random_floats(n, seed() ^ n as u64);
        let got = gpu.download(&gpu.upload_slice(&floats).expect("upload f32")).expect("download");
        assert_eq!(got, f32_bytes(&floats), "f32 n={n}");
        let halves: Vec<u16> = floats.iter().map(|f| (f.to_bits() >> 16) as u16).collect();
        let want: Vec<u8> = halves.iter().flat_map(|h| h.to_le_bytes()).collect();
        assert_eq!(gpu.download(&gpu.upload_slice(&halves).expect("upload u16")).expect("download"), want, "u16 n={n}");
        let flags: Vec<bool> = floats.iter().map(|f| *f > 0.0).collect();
        let want: Vec<u8> = flags.iter().map(|&b| u8::from(b)).collect();
        assert_eq!(
            gpu.download(&gpu.upload_slice(&flags).expect("upload bool")).expect("download"),
            want,
            "bool n={n}"
        );
    }
    let empty: [f32; 0] = [];
    assert_eq!(gpu.upload_slice(&empty).expect("empty upload").bytes(), 0);
}
