//! The generic fast form (`emit_generic`, tiered compilation's stand-in kernel), NVRTC and GPU
//! tiers (its pure tier is in kfuse-mlp's `generic` tests). NVRTC tier: it compiles for sm_80 and
//! sm_90 for many shapes, dtypes, activations and bias forms. GPU tier (skips without a GPU unless
//! KFUSE_REQUIRE_GPU=1): launched directly, it matches the CPU interpreter on fresh random data,
//! outputs poisoned, batches 1, 3, 127, 129, 255, 1023, 4099, widths 16, 24, 100, 256, depth 1 and
//! 8, f16 and bf16 weights, f32/f16/bf16 I/O, and relaunches bit-identically.

use kfuse_ir::{DType, HostTensor};
use kfuse_mlp::testing::{both, check_16bit, random_input, Case, Numerics, Rng};
use kfuse_mlp::{compare_rows, evaluate_cpu, ActivationMath};
use kfuse_runtime::testing::{gpu_or_skip, nvrtc_or_skip};
use kfuse_runtime::{compile, Arch, CompileOptions, KernelArg, KernelLaunch};

fn cases() -> Vec<Case> {
    use DType::*;
    let mut fma8 = Case::new(&[32, 64, 128, 96, 64, 32, 16], "silu", F16, true);
    fma8.math = ActivationMath::PackedFma { eighths: 8 };
    let mut tanh32 = Case::new(&[24, 40, 24], "silu", BF16, true).io(F32, F32);
    tanh32.math = ActivationMath::TanhF32;
    let mut f32math = Case::new(&[100, 100, 100, 100, 3], "silu", F16, true).io(F32, BF16);
    f32math.math = ActivationMath::F32;
    let mut fma = Case::new(&[32, 64, 128, 96, 64, 32, 16], "silu", F16, true);
    fma.math = ActivationMath::PackedFma { eighths: 2 };
    vec![
        Case::new(&[16, 16], "none", F16, true),
        Case::new(&[16, 16], "none", BF16, false).io(F32, F32).last("relu"),
        Case::new(&[24, 24, 24, 24, 24, 24, 24, 24, 5], "relu", BF16, true).io(F32, F32),
        Case::new(&[24, 16, 16, 16, 16, 16, 16, 16, 24], "leaky_relu", F16, true).io(BF16, F16),
        Case::new(&[100, 100, 100, 3], "gelu", F16, true).io(F32, F16),
        Case::new(&[256, 256, 32], "tanh", BF16, false).io(BF16, BF16),
        Case::new(&[256, 100, 24, 16], "silu", F16, true).io(F32, F32).last("sigmoid"),
        Case::new(&[64, 64, 64, 64, 64, 16], "relu", F16, false),
        Case::new(&[64, 128, 128, 128, 128, 16], "relu", BF16, false),
        Case::new(&[32, 64, 128, 96, 64, 32, 16], "silu", F16, true),
        Case::new(&[32, 64, 128, 96, 64, 32, 16], "silu", BF16, true).io(F32, F32),
        Case::new(&[3, 17, 1], "x * sigmoid(1.702 * x)", BF16, true).io(F32, BF16),
        fma8,
        tanh32,
        f32math,
        fma,
    ]
}

#[test]
fn generic_compiles_for_sm80_and_sm90() {
    if nvrtc_or_skip("generic_compiles_for_sm80_and_sm90").is_none() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    for (n, case) in cases().iter().enumerate() {
        let m = case.model(dir.path(), &format!("c{n}"), 5);
        let (_, generic) = both(&m, &case.options(None));
        for arch in [Arch::new(8, 0), Arch::new(9, 0)] {
            let t = std::time::Instant::now();
            let mut opts = CompileOptions { arch: generic.target(arch), extra: generic.nvrtc_options.clone() };
            opts.extra.push("--ptxas-options=-v".to_string());
            match compile(&generic.source, &opts) {
                Ok(module) => {
                    let regs = module
                        .log
                        .lines()
                        .filter(|l| l.contains("registers") || l.contains("spill"))
                        .map(str::trim)
                        .collect::<Vec<_>>()
                        .join(" ");
                    println!(
                        "{} {arch}: {} B cubin in {:.0} ms; {regs}",
                        m.summary(),
                        module.cubin.len(),
                        t.elapsed().as_secs_f64() * 1e3
                    );
                    assert!(!module.cubin.is_empty());
                    assert!(
                        !module.log.contains("bytes spill stores") || module.log.contains(" 0 bytes spill stores"),
                        "{}: spills: {}",
                        m.summary(),
                        module.log
                    );
                }
                Err(e) => panic!(
                    "{}: the generic form failed to compile for {arch}: {e}\n--- source ---\n{}",
                    m.summary(),
                    generic.source
                ),
            }
        }
    }
}

#[test]
fn generic_kernel_matches_cpu_interpreter() {
    let Some(gpu) = gpu_or_skip("generic_kernel_matches_cpu_interpreter") else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut rng, _) = Rng::from_time();
    for (n, case) in cases().iter().enumerate() {
        let m = case.model(dir.path(), &format!("g{n}"), rng.next_u64());
        let (_, generic) = both(&m, &case.options(Some(gpu.max_shared_bytes())));
        let f = gpu
            .load_kernel_for(&generic.source, &generic.name, generic.target(gpu.compile_arch()), &generic.nvrtc_options)
            .expect("compile and load");
        let params = gpu.upload(&generic.params).expect("upload params");
        let (io_in, io_out) = case.io;
        for rows in [1usize, 3, 127, 129, 255, 1023, 4099] {
            let x = random_input(io_in, rows, m.input_width(), &mut rng);
            let xb = gpu.upload(&x.to_bytes()).expect("upload");
            let out_w = m.output_width();
            let y = gpu.alloc_zeroed(rows * out_w * io_out.size_bytes()).expect("alloc");
            let mut results = Vec::new();
            for _ in 0..2 {
                gpu.fill(&y, 0xff).expect("poison");
                let blocks = u32::try_from(rows.div_ceil(generic.rows_per_block as usize))
                    .expect("blocks")
                    .min(gpu.sm_count())
                    .max(1);
                let args = [
                    KernelArg::Buffer(&xb),
                    KernelArg::Buffer(&y),
                    KernelArg::Buffer(&params),
                    KernelArg::I64(rows as i64),
                ];
                gpu.launch(
                    &gpu.default_stream(),
                    &f,
                    KernelLaunch::new(blocks, generic.block).with_shared_bytes(generic.shared_bytes),
                    &args,
                )
                .expect("launch");
                results.push(gpu.download(&y).expect("download"));
            }
            assert_eq!(results[0], results[1], "{}: a relaunch differs", m.summary());
            let got = HostTensor::from_bytes(io_out, vec![rows, out_w], &results[0]).expect("size");
            let want = evaluate_cpu(&m, &x).expect("cpu");
            let e = compare_rows(&got.to_f64(), &want, out_w);
            println!(
                "{} io {io_in}->{io_out} {:?} rows {rows}: rel {:.2e} worst row {:.2e} (row {})",
                m.summary(),
                case.math,
                e.rel_err,
                e.worst_row_rel_err,
                e.worst_row
            );
            let what = format!("{} rows {rows}", m.summary());
            check_16bit(&m, &x, &got.to_f64(), &want, io_out, Numerics { f16_accumulator: false }, &what)
                .unwrap_or_else(|why| panic!("{why}"));
        }
    }
}
