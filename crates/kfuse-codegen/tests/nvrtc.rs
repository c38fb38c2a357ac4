//! NVRTC tier: every representative graph's kernels (and a device function) compile for sm_80
//! and sm_90. Runs when libnvrtc loads; otherwise prints `SKIPPED:` and passes.

mod common;

use kfuse_codegen::{emit_device_function, plan, CodegenOptions};
use kfuse_ir::{BinaryOp, DType, GraphBuilder, Shape, UnaryOp};
use kfuse_runtime::{compile, testing::nvrtc_or_skip, Arch, CompileOptions};

const ARCHS: [Arch; 2] = [Arch::new(8, 0), Arch::new(9, 0)];

fn compile_all(what: &str, source: &str) {
    for arch in ARCHS {
        match compile(source, &CompileOptions::for_arch(arch)) {
            Ok(m) => assert!(!m.cubin.is_empty(), "{what}: empty cubin for {}", arch.sm_name()),
            Err(e) => panic!("{what} does not compile for {}: {e}\n{source}", arch.sm_name()),
        }
    }
}

#[test]
fn every_golden_graph_compiles_for_sm80_and_sm90() {
    if nvrtc_or_skip("every_golden_graph_compiles_for_sm80_and_sm90").is_none() {
        return;
    }
    for (name, g) in common::all() {
        for block_size in [256, 128] {
            let p = plan(&g, &CodegenOptions { block_size, ..CodegenOptions::default() }).expect("plan");
            for (source, entry) in p.kernels.iter().flat_map(|k| k.entries()) {
                compile_all(&format!("{name} {entry} (block {block_size})"), source);
            }
        }
    }
}

#[test]
fn rows_plan_kernels_compile_with_and_without_a_partial_slot() {
    if nvrtc_or_skip("rows_plan_kernels_compile_with_and_without_a_partial_slot").is_none() {
        return;
    }
    // With a loss: its sum keeps a partial slot and the ticket tail reads the block's count;
    // without one: the count has no slot, so the kernel has no tail at all.
    for with_loss in [true, false] {
        let g = common::lengths_mean_and_gradient(with_loss).expect("graph");
        let p = plan(&g, &CodegenOptions::default()).expect("plan");
        assert_eq!(p.kernels.len(), 1, "the rows plan is one launch");
        for k in &p.kernels {
            compile_all(&format!("lengths mean and gradient (loss: {with_loss}) {}", k.name), &k.source);
        }
    }
}

#[test]
fn device_functions_compile_side_by_side() {
    if nvrtc_or_skip("device_functions_compile_side_by_side").is_none() {
        return;
    }
    // gelu(x) = 0.5 x (1 + erf(x / sqrt(2))) and a clamped swish: both need helpers, so the
    // include guards are exercised when the two share a translation unit.
    let mut b = GraphBuilder::new();
    let x = b.input("x", DType::F32, Shape::scalar()).expect("input");
    let r2 = b.lit_float(std::f64::consts::FRAC_1_SQRT_2);
    let xs = b.binary(BinaryOp::Mul, x, r2).expect("mul");
    let e = b.unary(UnaryOp::Erf, xs).expect("erf");
    let one = b.lit_float(1.0);
    let e1 = b.binary(BinaryOp::Add, e, one).expect("add");
    let half = b.lit_float(0.5);
    let hx = b.binary(BinaryOp::Mul, x, half).expect("mul");
    let y = b.binary(BinaryOp::Mul, hx, e1).expect("mul");
    let y = b.binary(BinaryOp::Max, y, x).expect("max");
    b.output("y", y).expect("output");
    let gelu = b.finish().expect("graph");
    let f1 = emit_device_function(&gelu, "act_a").expect("device fn");
    let f2 = emit_device_function(&gelu, "act_b").expect("device fn");
    let src = format!(
        "{f1}{f2}extern \"C\" __global__ void use_them(float* p, long long n) {{\n    \
         long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n    if (i < n) p[i] = act_a(p[i]) + act_b(p[i]);\n}}\n"
    );
    compile_all("two device functions", &src);
    // Before sm_80 there is no `max.NaN.f32`: the f32 min/max helpers take their portable form.
    let turing = Arch::new(7, 5);
    if let Err(e) = compile(&src, &CompileOptions::for_arch(turing)) {
        panic!("two device functions do not compile for {}: {e}\n{src}", turing.sm_name());
    }
}

#[test]
fn upstream_scaling_kernels_compile_for_every_float_pair() {
    if nvrtc_or_skip("upstream_scaling_kernels_compile_for_every_float_pair").is_none() {
        return;
    }
    let floats = [DType::F32, DType::F16, DType::BF16];
    for grad in floats {
        for up in floats {
            let (source, name) = kfuse_codegen::scale_by_upstream_source(grad, up).expect("float dtypes");
            compile_all(&name, &source);
        }
    }
}
