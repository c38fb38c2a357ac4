//! GPU tier of `kfuse::mlp::MlpProgram`: a program holds its `Arc<Gpu>`, runs host data
//! (`forward`) and device buffers on a stream it did not create (`launch` on a created stream),
//! fused and tiled models, f16/bf16 weights and f32/f16/bf16 I/O at odd batch sizes, outputs
//! poisoned, every result against the CPU interpreter on fresh random data. Skips without a GPU
//! unless KFUSE_REQUIRE_GPU=1.

use std::sync::Arc;

use kfuse::mlp::{MlpOptions, MlpProgram, Tiering};
use kfuse_ir::{DType, HostTensor};
use kfuse_mlp::testing::{check_16bit, random_input, write_model, ModelSpec, Numerics, Rng};

const PLAIN: Numerics = Numerics { f16_accumulator: false };
use kfuse_mlp::{compare_rows, evaluate_cpu, MlpModel};
use kfuse_runtime::testing::gpu_or_skip;

#[test]
fn mlp_program_forward_and_launch_on_a_stream_match_the_interpreter() {
    let Some(gpu) = gpu_or_skip("mlp_program_forward_and_launch_on_a_stream_match_the_interpreter") else {
        return;
    };
    let gpu = Arc::new(gpu);
    let stream = gpu.create_stream().expect("stream");
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut rng, _) = Rng::from_time();
    // (widths, activation, weight dtype, input, output, bias); the last is too wide to fuse.
    let cases = [
        (vec![64, 64, 64, 64, 64, 16], "relu", DType::F16, DType::F16, DType::F16, false),
        (vec![32, 64, 128, 96, 64, 32, 16], "silu", DType::F16, DType::F32, DType::BF16, true),
        (vec![3, 24, 100, 5], "gelu", DType::BF16, DType::BF16, DType::F32, true),
        (vec![40, 256, 256, 256, 7], "relu", DType::F16, DType::F32, DType::F32, true),
    ];
    for (n, (widths, act, wdtype, input, output, bias)) in cases.into_iter().enumerate() {
        let mut spec = ModelSpec::new(&widths, act);
        spec.dtype = wdtype;
        spec.with_bias = bias;
        spec.seed = rng.next_u64();
        let model = MlpModel::load(write_model(dir.path(), &format!("p{n}"), &spec).expect("write")).expect("load");
        let options = MlpOptions { tiering: Tiering::FullOnly, ..MlpOptions::for_dtypes(input, output) };
        let program = MlpProgram::new(model.clone(), gpu.clone(), options).expect("compile");
        let out_w = model.output_width();
        for rows in [1usize, 129, 1023] {
            let x = random_input(input, rows, model.input_width(), &mut rng);
            let want = evaluate_cpu(&model, &x).expect("cpu");
            let what = format!("{} {input}->{output} rows {rows}", model.summary());
            // Host data.
            let y = program.forward(&x).expect("forward");
            assert_eq!((y.dtype(), y.shape.clone()), (output, vec![rows, out_w]));
            check_16bit(&model, &x, &y.to_f64(), &want, output, PLAIN, &format!("forward {what}"))
                .unwrap_or_else(|why| panic!("{why}"));
            // Device buffers on a stream the program did not create.
            let xb = gpu.upload(&x.to_bytes()).expect("upload");
            let yb = gpu.alloc_zeroed(rows * out_w * output.size_bytes()).expect("alloc");
            gpu.fill(&yb, 0xff).expect("poison");
            gpu.synchronize().expect("ready for the other stream");
            program.launch(&stream, &xb, &yb, rows).expect("launch");
            stream.synchronize().expect("stream");
            let got =
                HostTensor::from_bytes(output, vec![rows, out_w], &gpu.download(&yb).expect("download")).expect("size");
            let e = compare_rows(&got.to_f64(), &want, out_w);
            println!("{what}: launch rel {:.2e} worst row {:.2e}", e.rel_err, e.worst_row_rel_err);
            check_16bit(&model, &x, &got.to_f64(), &want, output, PLAIN, &format!("launch {what}"))
                .unwrap_or_else(|why| panic!("{why}"));
        }
        assert!(program.wait_optimized().is_ok());
    }
}

#[test]
fn an_empty_batch_is_an_error_not_a_launch() {
    let Some(gpu) = gpu_or_skip("an_empty_batch_is_an_error_not_a_launch") else { return };
    let gpu = Arc::new(gpu);
    let dir = tempfile::tempdir().expect("tempdir");
    let model = MlpModel::load(write_model(dir.path(), "e", &ModelSpec::new(&[16, 16, 8], "relu")).expect("write"))
        .expect("load");
    let program = MlpProgram::new(model, gpu.clone(), MlpOptions::default()).expect("compile");
    let buf = gpu.alloc_zeroed(16 * 2).expect("alloc");
    let err = program.launch(&gpu.default_stream(), &buf, &buf, 0).expect_err("zero rows");
    assert!(err.to_string().contains("0 rows"), "{err}");
}
