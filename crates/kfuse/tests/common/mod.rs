//! What the facade's tests share: programs compiled with a memory-only kernel cache, f32 inputs
//! and outputs by name, the GPU's results against the interpreter's, the device under test and
//! runtime allocations handed to launches as borrowed memory, as a framework's tensors are.
//!
//! Each test file uses a part of it, so unused items are expected.
#![allow(dead_code)]

use std::sync::Arc;

use kfuse::{DType, DeviceBuffer, DeviceTensor, Engine, Gpu, HostTensor, KernelCache, Program};
use kfuse_testing::gpu_or_skip;

/// `src` compiled (kernels cached in memory only); `name` is the file name errors show.
pub fn program(src: &str, name: &str) -> Program {
    let engine = Engine::with_cache(Arc::new(KernelCache::memory_only()));
    Program::compile(&engine, src, name).unwrap_or_else(|e| panic!("{name} compiles: {e}"))
}

/// An f32 tensor of `shape` holding `v`.
pub fn t(shape: &[usize], v: &[f64]) -> HostTensor {
    HostTensor::from_f64(DType::F32, shape.to_vec(), v)
}

/// `0, 1, .., n - 1`.
pub fn iota(n: usize) -> Vec<f64> {
    (0..n).map(|i| i as f64).collect()
}

/// The shape and values of output `name`.
pub fn get(out: &[(String, HostTensor)], name: &str) -> (Vec<usize>, Vec<f64>) {
    out.iter().find(|(n, _)| n == name).map(|(_, v)| (v.shape.clone(), v.to_f64())).expect("an output of that name")
}

/// Random inputs of `p` with its symbols at `sizes` (in the graph's symbol order; extra sizes
/// are ignored), input `k` drawn with seed `seed + k`.
pub fn random_inputs(p: &Program, sizes: &[usize], seed: u64) -> Vec<(String, HostTensor)> {
    let g = p.graph();
    let sizes: Vec<u64> = sizes.iter().take(g.symbols.len()).map(|&s| s as u64).collect();
    g.inputs
        .iter()
        .enumerate()
        .map(|(k, input)| {
            let shape = g.resolve_shape(&input.shape, &sizes);
            (input.name.clone(), kfuse_testing::random_tensor(input.dtype, &shape, seed + k as u64))
        })
        .collect()
}

/// The largest error of `got` against `want`, relative to the larger of the value and 1; a NaN
/// in one and not the other is an infinite error.
pub fn error(got: &HostTensor, want: &HostTensor) -> f64 {
    got.to_f64()
        .iter()
        .zip(want.to_f64())
        .map(|(a, b)| match (a.is_nan(), b.is_nan()) {
            (true, true) => 0.0,
            (false, false) => (a - b).abs() / b.abs().max(1.0),
            _ => f64::INFINITY,
        })
        .fold(0.0, f64::max)
}

/// Every output of `p` on the GPU `ordinal` against the interpreter's on the same `inputs`: the
/// same shapes, and values within `tol` relative to the larger of the value and 1 (a NaN where
/// the other has none is an infinite error).
pub fn compare(p: &Program, ordinal: usize, inputs: &[(&str, &HostTensor)], what: &str, tol: f64) {
    let want = p.run_cpu(inputs).expect("the interpreter runs");
    let got = p.run_gpu(ordinal, inputs).expect("the GPU runs");
    for ((name, w), (_, g)) in want.iter().zip(&got) {
        assert_eq!(g.shape, w.shape, "{what} {name}");
        let err = error(g, w);
        assert!(err <= tol, "{what} {name}: error {err} > {tol}\n gpu {:?}\n cpu {:?}", g.to_f64(), w.to_f64());
    }
}

/// The engine (kernels cached in memory only) and the default GPU, or `None` (skipped, saying
/// why) without one.
pub fn device(test: &str) -> Option<(Engine, Arc<Gpu>)> {
    let probe = gpu_or_skip(test)?;
    let ordinal = probe.ordinal();
    drop(probe);
    let engine = Engine::with_cache(Arc::new(KernelCache::memory_only()));
    let gpu = engine.device(ordinal).expect("the device opened once already");
    Some((engine, gpu))
}

/// An allocation made by the runtime and the same memory borrowed, as a framework's tensor is.
pub struct Held {
    pub owned: DeviceBuffer,
    pub dtype: DType,
    pub shape: Vec<usize>,
}

impl Held {
    /// `t`'s bytes in a new allocation.
    pub fn upload(gpu: &Gpu, t: &HostTensor) -> Held {
        Held { owned: gpu.upload(&t.to_bytes()).unwrap(), dtype: t.dtype(), shape: t.shape.clone() }
    }

    /// A zeroed tensor (at least 16 bytes are allocated: an empty or scalar tensor too).
    pub fn zeros(gpu: &Gpu, dtype: DType, shape: &[usize]) -> Held {
        let bytes = (shape.iter().product::<usize>() * dtype.size_bytes()).max(16);
        Held { owned: gpu.alloc_zeroed(bytes).unwrap(), dtype, shape: shape.to_vec() }
    }

    /// A tensor whose every byte is 0x7f, so that an element a kernel does not write shows.
    pub fn poisoned(gpu: &Gpu, dtype: DType, shape: &[usize]) -> Held {
        let held = Held::zeros(gpu, dtype, shape);
        gpu.fill(&held.owned, 0x7f).unwrap();
        gpu.synchronize().unwrap();
        held
    }

    /// The allocation borrowed as a device tensor of its dtype and shape.
    pub fn borrowed(&self, gpu: &Gpu) -> DeviceTensor {
        // SAFETY: `self.owned` is a live allocation of this device of at least that size, and it
        // outlives every launch of the test (each test synchronises before dropping it).
        let buffer = unsafe { gpu.borrow_memory(self.owned.address(), self.owned.bytes()) };
        DeviceTensor::contiguous(buffer, self.dtype, self.shape.clone())
    }

    /// The tensor's values (the first bytes of the allocation).
    pub fn download(&self, gpu: &Gpu) -> HostTensor {
        let mut bytes = gpu.download(&self.owned).unwrap();
        bytes.truncate(self.shape.iter().product::<usize>() * self.dtype.size_bytes());
        HostTensor::from_bytes(self.dtype, self.shape.clone(), &bytes).unwrap()
    }

    /// [`Held::download`] as f64 values.
    pub fn values(&self, gpu: &Gpu) -> Vec<f64> {
        self.download(gpu).to_f64()
    }
}
