//! GPU tier: what a framework's process pays for kfuse's first use of a device. Opening it and
//! loading a kernel from a warm disk cache ask NVRTC nothing; the long-lived buffers of launches
//! on a framework's memory (plain `cuMemAlloc`, outside the driver's stream-ordered pool) start
//! zeroed and work like any other. Skips, saying why, without a GPU.

use std::sync::Arc;

use kfuse_runtime::testing::gpu_or_skip;
use kfuse_runtime::{nvrtc_calls_on_this_thread, Gpu, KernelArg, KernelCache, KernelLaunch};

const FILL: &str = r#"
extern "C" __global__ void fill_index(int* out, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { out[i] += (int)i; }
}
"#;

#[test]
fn open_and_a_warm_load_ask_nvrtc_nothing() {
    let Some(probe) = gpu_or_skip("open_and_a_warm_load_ask_nvrtc_nothing") else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let cold = Gpu::open_with_cache(probe.ordinal(), Arc::new(KernelCache::with_dir(dir.path(), 1 << 30))).unwrap();
    cold.load_kernel(FILL, "fill_index").expect("compiles");
    drop(cold);
    let before = nvrtc_calls_on_this_thread();
    let cache = Arc::new(KernelCache::with_dir(dir.path(), 1 << 30));
    let gpu = Gpu::open_with_cache(probe.ordinal(), cache.clone()).expect("opens");
    let f = gpu.load_kernel(FILL, "fill_index").expect("loads from disk");
    assert_eq!(nvrtc_calls_on_this_thread(), before, "open or a warm load asked NVRTC something");
    assert_eq!((cache.stats().session.disk_hits, cache.stats().session.compiles), (1, 0));
    // The device's arch keys the lookup; what NVRTC builds for is asked only on demand.
    assert!(gpu.compile_arch() <= gpu.arch());
    let out = gpu.alloc_long_lived(4 * 1000).expect("allocates");
    gpu.launch(&gpu.default_stream(), &f, KernelLaunch::new(4, 256), &[KernelArg::Buffer(&out), KernelArg::I64(1000)])
        .expect("launches");
    let got: Vec<i32> =
        gpu.download(&out).unwrap().chunks_exact(4).map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
    assert_eq!(got, (0..1000).collect::<Vec<i32>>());
}

#[test]
fn long_lived_buffers_start_zeroed_and_hold_what_is_written() {
    let Some(gpu) = gpu_or_skip("long_lived_buffers_start_zeroed_and_hold_what_is_written") else { return };
    for bytes in [1usize, 16, 4097, 1 << 20] {
        let buf = gpu.alloc_long_lived(bytes).expect("allocates");
        assert_eq!((buf.bytes(), buf.is_borrowed()), (bytes, false));
        gpu.synchronize().expect("zeroed");
        assert!(gpu.download(&buf).unwrap().iter().all(|&b| b == 0), "{bytes} B not zeroed");
        gpu.fill(&buf, 0x5a).expect("fills");
        assert!(gpu.download(&buf).unwrap().iter().all(|&b| b == 0x5a), "{bytes} B");
        gpu.synchronize_device().expect("idle before the free");
    }
    let empty = gpu.alloc_long_lived(0).expect("empty");
    assert_eq!((empty.bytes(), empty.address()), (0, 0));
}
