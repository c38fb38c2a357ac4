//! Pure tier: a reduction over the rows of an output that an earlier kernel stores (a bias
//! gradient summed from the input gradient) reads that output, not the tensors it comes from.

use std::sync::Arc;

use kfuse::{Engine, Program};

fn compile(src: &str) -> Program {
    let engine = Engine::with_cache(Arc::new(kfuse::KernelCache::memory_only()));
    Program::compile(&engine, src, "test").expect("compiles")
}

#[test]
fn a_bias_gradient_sums_the_stored_input_gradient() {
    let p = compile(
        "input x: bf16[B, D]\ninput bias: bf16[D]\ninput dy: bf16[B, D]\n\
         let h = x + bias\nlet y = 0.5 * h * (1 + erf(h * 0.7071067811865476))\n\
         output dx = grad(sum(y * dy), x)\noutput dbias = grad(sum(y * dy), bias)\n",
    );
    let kernels = &p.plan().kernels;
    assert_eq!(kernels.len(), 2);
    assert!(kernels[0].source.contains("elementwise by rows of the last axis"), "{}", kernels[0].source);
    let columns = &kernels[1].source;
    assert!(
        columns
            .contains("const unsigned short* __restrict__ out0, // output dx bf16[B, D], stored by an earlier kernel"),
        "{columns}"
    );
    assert!(columns.contains("kf_bf16_to_f32(out0["), "{columns}");
    // Neither x nor dy is read again, and no erf is computed.
    assert!(!columns.contains("in0") && !columns.contains("in2") && !columns.contains("erff"), "{columns}");
}

#[test]
fn a_gradient_that_is_not_an_output_is_computed_where_it_is_summed() {
    // Only dbias is asked for: dx is no output, so the column kernel computes it from x and dy.
    let p = compile(
        "input x: f32[B, D]\ninput bias: f32[D]\ninput dy: f32[B, D]\n\
         let h = x + bias\noutput dbias = grad(sum(h * h * dy), bias)\n",
    );
    let last = &p.plan().kernels.last().expect("a kernel").source;
    assert!(last.contains("in0") && last.contains("in2") && !last.contains("stored by an earlier kernel"), "{last}");
}
