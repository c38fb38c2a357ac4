//! The backward of a loss whose gradient was computed with it (a `with_gradients` program): the
//! gradient scaled in place by the loss's upstream gradient, a one-element device tensor. When
//! that upstream gradient is exactly 1 (what `loss.backward()` passes) the kernel reads it and
//! returns, so the common backward costs one launch and no pass over the gradient; the value is
//! read on the device, so the host never synchronises.

use kfuse_ir::DType;

use crate::cuda::{helper_source, Helper};
use crate::text::render;

/// The reviewed template of the kernel.
const SCALE: &str = include_str!("templates/scale_by_upstream.cuh");

/// Threads per block of the scaling kernel.
pub const SCALE_BLOCK: u32 = 256;

/// The CUDA source of the in-place scaling of a `grad` tensor by an `upstream` scalar, and its
/// kernel's name; `None` unless both are float dtypes. The kernel takes `(grad*, const
/// upstream*, long long n)`, runs any 1-D grid of [`SCALE_BLOCK`] threads, and computes in f32
/// with one rounding to the gradient's dtype, as PyTorch's `grad * upstream` does.
pub fn scale_by_upstream_source(grad: DType, upstream: DType) -> Option<(String, String)> {
    let (gty, load_g, store_g) = float_access(grad)?;
    let (uty, load_u, _) = float_access(upstream)?;
    let name = format!("kf_scale_{}_by_{}", grad.name(), upstream.name());
    let mut helpers = String::new();
    for h in [Helper::F16, Helper::BF16] {
        if [grad, upstream].iter().any(|d| helper_of(*d) == Some(h)) {
            helpers.push_str(&helper_source(h));
        }
    }
    let load_up = load_u.replace("{}", "up[0]");
    let scaled = store_g.replace("{}", &format!("{} * s", load_g.replace("{}", "grad[i]")));
    let block = SCALE_BLOCK.to_string();
    let source = render(
        SCALE,
        &[
            ("helpers", &helpers),
            ("gty", gty),
            ("uty", uty),
            ("name", &name),
            ("block", &block),
            ("load_up", &load_up),
            ("scaled", &scaled),
        ],
    );
    Some((source, name))
}

/// The storage type of a float dtype, its load as f32 and its store from f32 (`{}` is the value).
fn float_access(d: DType) -> Option<(&'static str, &'static str, &'static str)> {
    match d {
        DType::F32 => Some(("float", "{}", "{}")),
        DType::F16 => Some(("unsigned short", "kf_f16_to_f32({})", "kf_f32_to_f16({})")),
        DType::BF16 => Some(("unsigned short", "kf_bf16_to_f32({})", "kf_f32_to_bf16({})")),
        DType::I32 | DType::I64 | DType::Bool => None,
    }
}

fn helper_of(d: DType) -> Option<Helper> {
    match d {
        DType::F16 => Some(Helper::F16),
        DType::BF16 => Some(Helper::BF16),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_kernel_per_float_pair_with_only_the_helpers_it_uses() {
        let (f32_src, name) = scale_by_upstream_source(DType::F32, DType::F32).unwrap();
        assert_eq!(name, "kf_scale_f32_by_f32");
        assert!(f32_src.contains("grad[i] = grad[i] * s;"), "{f32_src}");
        assert!(!f32_src.contains("kf_f16_to_f32") && !f32_src.contains("//~"));
        let (bf16_src, _) = scale_by_upstream_source(DType::BF16, DType::F32).unwrap();
        assert!(bf16_src.contains("grad[i] = kf_f32_to_bf16(kf_bf16_to_f32(grad[i]) * s);"), "{bf16_src}");
        assert!(bf16_src.contains("KF_HELPER_BF16") && !bf16_src.contains("KF_HELPER_F16"));
        let (mixed, _) = scale_by_upstream_source(DType::F16, DType::BF16).unwrap();
        assert!(mixed.contains("const float s = kf_bf16_to_f32(up[0]);"), "{mixed}");
        assert!(scale_by_upstream_source(DType::I32, DType::F32).is_none());
        assert!(scale_by_upstream_source(DType::F32, DType::Bool).is_none());
        // Deterministic: the same dtypes give the same bytes.
        assert_eq!(scale_by_upstream_source(DType::F16, DType::BF16).unwrap().0, mixed);
    }
}
