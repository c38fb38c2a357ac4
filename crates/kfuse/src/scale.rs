//! The backward of a loss whose gradients were computed with it (a
//! [`with_gradients`](crate::with_gradients) program): each gradient times the loss's upstream
//! gradient, in place, on the caller's stream. The upstream gradient stays on the device; when it
//! is exactly 1 (what `loss.backward()` passes) the kernel returns at once, so the common backward
//! is one launch and no pass over the gradient, and the host never waits for the value.

use std::sync::OnceLock;

use kfuse_codegen::{scale_by_upstream_source, SCALE_BLOCK};
use kfuse_ir::DType;
use kfuse_runtime::{KernelArg, KernelLaunch, Stream};

use crate::exec::{check_tensor, enqueue, DeviceTensor};
use crate::{Engine, Error, Result};

const FLOATS: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

/// A kernel's CUDA source and name.
type Kernel = (String, String);

/// The kernel (source, name) of each (gradient, upstream) float pair, generated once; `None` for
/// a pair that is not two floats.
pub(crate) fn kernel(grad: DType, upstream: DType) -> Option<&'static Kernel> {
    static KERNELS: OnceLock<Vec<((DType, DType), Kernel)>> = OnceLock::new();
    let all = KERNELS.get_or_init(|| {
        FLOATS
            .iter()
            .flat_map(|&g| FLOATS.iter().map(move |&u| (g, u)))
            .filter_map(|(g, u)| Some(((g, u), scale_by_upstream_source(g, u)?)))
            .collect()
    });
    all.iter().find(|(pair, _)| *pair == (grad, upstream)).map(|(_, k)| k)
}

/// Scales `grad` in place by `upstream` (one element) on `stream` of GPU `ordinal`, computing in
/// f32 with one rounding to the gradient's dtype as `grad * upstream` does; nothing is written
/// when `upstream` is exactly 1, which is exact (`x * 1 == x` for every `x`). Both live in that
/// device's memory and must be ready for `stream`. Queues one kernel (compiled once per
/// architecture through the engine's cache) and returns: no host synchronisation.
pub fn scale_by_upstream(
    engine: &Engine,
    ordinal: usize,
    stream: &Stream,
    grad: &DeviceTensor,
    upstream: &DeviceTensor,
) -> Result<()> {
    let bad = |why: String| Error::Scale { why };
    let Some((source, name)) = kernel(grad.dtype, upstream.dtype) else {
        return Err(bad(format!(
            "the gradient is {} and the upstream {}; both must be floats",
            grad.dtype, upstream.dtype
        )));
    };
    if upstream.shape.iter().product::<usize>() != 1 {
        return Err(bad(format!("the upstream gradient has shape {:?}; it must hold one element", upstream.shape)));
    }
    if stream.ordinal() != ordinal {
        return Err(Error::WrongStream { got: stream.ordinal(), want: ordinal });
    }
    check_tensor("gradient", "grad", grad, ordinal)?;
    check_tensor("upstream gradient", "upstream", upstream, ordinal)?;
    let n: usize = grad.shape.iter().product();
    if n == 0 {
        return Ok(());
    }
    kfuse_runtime::preserving_thread_context(|| {
        let gpu = engine.device(ordinal)?;
        let f = gpu.load_kernel(source, name)?;
        // A grid-stride loop: enough blocks to fill the device, few enough that an upstream of 1
        // (every block returns at once) costs little more than the launch.
        let blocks = n.div_ceil(SCALE_BLOCK as usize).min(4 * gpu.sm_count().max(1) as usize) as u32;
        let args = [KernelArg::Buffer(&grad.buffer), KernelArg::Buffer(&upstream.buffer), KernelArg::I64(n as i64)];
        enqueue(&gpu, stream, &f, KernelLaunch::new(blocks, SCALE_BLOCK), &args)
    })
}
