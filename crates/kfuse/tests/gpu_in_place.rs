//! GPU tier: a program launched in place, as a framework would: memory allocated by the runtime
//! and handed over as borrowed device pointers, a created stream (and the same stream borrowed by
//! its handle), outputs poisoned first, results compared with the CPU interpreter on random data
//! at odd sizes, in f32 and bf16. Also the launch's checks (shapes, buffer sizes). Skips, saying
//! why, without a GPU; fails instead with KFUSE_REQUIRE_GPU=1.

use kfuse::{DType, DeviceBuffer, DeviceTensor, Error, Gpu, HostTensor, Program, Stream, Validation};
use kfuse_testing::{example, float_inputs_as, rel_l2_err as rel_err, Rng, SeedableRng, StdRng};

mod common;
use common::{device, Held};

/// A new seed every run, printed so that a failure can be replayed with KFUSE_TEST_SEED.
fn seed() -> u64 {
    let seed = std::env::var("KFUSE_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
    });
    println!("seed {seed} (replay with KFUSE_TEST_SEED={seed})");
    seed
}

/// Well-formed boxes (x1 < x2, y1 < y2) of `dtype`, `rows` of them, shaped `shape`.
fn boxes(rng: &mut StdRng, dtype: DType, shape: &[usize]) -> HostTensor {
    let rows: usize = shape.iter().product::<usize>() / 4;
    let mut v = Vec::with_capacity(rows * 4);
    for _ in 0..rows {
        let (x, y) = (rng.random_range(0.0..50.0), rng.random_range(0.0..50.0));
        let (w, h) = (rng.random_range(1.0..20.0), rng.random_range(1.0..20.0));
        v.extend([x, y, x + w, y + h]);
    }
    HostTensor::from_f64(dtype, shape.to_vec(), &v)
}

/// Launches `p` in place on `stream` with `inputs` and compares every output with the interpreter.
fn check_in_place(gpu: &Gpu, p: &Program, stream: &Stream, inputs: &[(&str, HostTensor)], what: &str) {
    let named: Vec<(&str, &HostTensor)> = inputs.iter().map(|(n, t)| (*n, t)).collect();
    let want = p.run_cpu(&named).unwrap_or_else(|e| panic!("{what}: interpreter: {e}"));
    let held: Vec<(&str, Held)> = inputs.iter().map(|(n, t)| (*n, Held::upload(gpu, t))).collect();
    let shapes: Vec<(&str, &[usize])> = inputs.iter().map(|(n, t)| (*n, t.shape.as_slice())).collect();
    let outs: Vec<Held> =
        p.output_shapes(&shapes).unwrap().iter().map(|(_, dtype, shape)| Held::poisoned(gpu, *dtype, shape)).collect();
    gpu.synchronize().unwrap();
    let device_inputs: Vec<(&str, DeviceTensor)> = held.iter().map(|(n, h)| (*n, h.borrowed(gpu))).collect();
    let device_outputs: Vec<DeviceTensor> = outs.iter().map(|h| h.borrowed(gpu)).collect();
    // The bound launch (what a framework keeps per shape signature) over the same memory.
    let typed: Vec<(&str, DType, &[usize])> = inputs.iter().map(|(n, t)| (*n, t.dtype(), t.shape.as_slice())).collect();
    let bound = p.bind_device(gpu.ordinal(), &typed).unwrap_or_else(|e| panic!("{what}: bind_device: {e}"));
    let buffers: Vec<DeviceBuffer> =
        held.iter().map(|(_, h)| h.borrowed(gpu).buffer).chain(outs.iter().map(|h| h.borrowed(gpu).buffer)).collect();
    // Twice on the same buffers: the kernels leave their counters ready for the next launch;
    // then the bound launch, with the outputs poisoned again first.
    for round in 0..3 {
        if round < 2 {
            p.launch(gpu.ordinal(), stream, &device_inputs, &device_outputs, Validation::Deferred)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
        } else {
            for h in &outs {
                gpu.fill(&h.owned, 0x7f).unwrap();
            }
            gpu.synchronize().unwrap();
            bound
                .launch(stream, &buffers, Validation::Deferred)
                .unwrap_or_else(|e| panic!("{what}: bound launch: {e}"));
        }
        stream.synchronize().unwrap();
        for ((name, w), h) in want.iter().zip(&outs) {
            let got = h.download(gpu);
            // As the conformance tests: f32 against f64; 16-bit outputs rounded on both sides.
            let tol = if got.dtype() == DType::F32 { 1e-5 } else { 1e-2 };
            let err = rel_err(&got, w);
            assert!(err <= tol, "{what} output {name} (launch {round}): error {err:.3e} > {tol:.0e}");
        }
    }
}

#[test]
fn programs_launched_in_place_on_a_created_stream_match_the_interpreter() {
    let Some((engine, gpu)) = device("programs_launched_in_place_on_a_created_stream_match_the_interpreter") else {
        return;
    };
    let stream = gpu.create_stream().unwrap();
    assert_eq!(stream.ordinal(), gpu.ordinal());
    let mut rng = StdRng::seed_from_u64(seed());
    let mut cases = 0;
    for stem in ["giou_train_lengths", "smooth_l1_train_packed", "softmax_xent_train"] {
        let base = Program::compile(&engine, &example(stem), &format!("examples/{stem}.kf")).unwrap();
        for dtype in [DType::F32, DType::BF16] {
            let pairs = float_inputs_as(base.interface(), dtype);
            let pairs: Vec<(&str, DType)> = pairs.iter().map(|(n, d)| (n.as_str(), *d)).collect();
            let p = base.with_input_dtypes(&pairs).unwrap();
            // Small, then larger (the workspace grows), then small again (it is reused).
            for (b, n) in [(3usize, 5usize), (257, 131), (1, 1), (0, 7)] {
                let inputs: Vec<(&str, HostTensor)> = match stem {
                    "giou_train_lengths" => {
                        let lengths: Vec<f64> = (0..b).map(|_| rng.random_range(0..=n) as f64).collect();
                        vec![
                            ("pred", boxes(&mut rng, dtype, &[b, n, 4])),
                            ("target", boxes(&mut rng, dtype, &[b, n, 4])),
                            ("lengths", HostTensor::from_f64(DType::I32, vec![b], &lengths)),
                        ]
                    }
                    "smooth_l1_train_packed" => {
                        let mut offsets = vec![0.0];
                        for _ in 0..b {
                            offsets.push(offsets.last().unwrap() + rng.random_range(0..=n) as f64);
                        }
                        let t = *offsets.last().unwrap() as usize;
                        vec![
                            ("pred", boxes(&mut rng, dtype, &[t, 4])),
                            ("target", boxes(&mut rng, dtype, &[t, 4])),
                            ("offsets", HostTensor::from_f64(DType::I32, vec![b + 1], &offsets)),
                        ]
                    }
                    _ => {
                        let logits: Vec<f64> = (0..b * n).map(|_| rng.random_range(-4.0..4.0)).collect();
                        let targets: Vec<f64> = (0..b * n).map(|_| rng.random_range(0.0..1.0)).collect();
                        vec![
                            ("logits", HostTensor::from_f64(dtype, vec![b, n], &logits)),
                            ("targets", HostTensor::from_f64(dtype, vec![b, n], &targets)),
                        ]
                    }
                };
                check_in_place(&gpu, &p, &stream, &inputs, &format!("{stem} ({dtype}) at {b}x{n}"));
                cases += 1;
            }
        }
    }
    println!("{cases} in-place launches agreed with the interpreter");
}

#[test]
fn a_borrowed_stream_handle_runs_the_same_launch() {
    let Some((engine, gpu)) = device("a_borrowed_stream_handle_runs_the_same_launch") else { return };
    let owner = gpu.create_stream().unwrap();
    // SAFETY: `owner` is a live stream of this device and outlives `borrowed` (dropped first).
    let borrowed = unsafe { gpu.borrow_stream(owner.handle()) };
    assert!(borrowed.is_borrowed() && !owner.is_borrowed());
    assert_eq!(borrowed.handle(), owner.handle());
    let p = Program::compile(&engine, &example("giou"), "examples/giou.kf").unwrap();
    let mut rng = StdRng::seed_from_u64(seed());
    let inputs =
        vec![("pred", boxes(&mut rng, DType::F32, &[5, 33, 4])), ("target", boxes(&mut rng, DType::F32, &[5, 33, 4]))];
    check_in_place(&gpu, &p, &borrowed, &inputs, "giou on a borrowed stream");
    drop(borrowed);
    // The owner's stream still works: the borrowed wrapper did not destroy it.
    check_in_place(&gpu, &p, &owner, &inputs, "giou on the owning stream");
    // And the device's own stream, as a Stream.
    check_in_place(&gpu, &p, &gpu.default_stream(), &inputs, "giou on the default stream");
}

#[test]
fn launch_refuses_wrong_shapes_and_short_buffers() {
    let Some((engine, gpu)) = device("launch_refuses_wrong_shapes_and_short_buffers") else { return };
    let p = Program::compile(&engine, &example("smooth_l1_train"), "examples/smooth_l1_train.kf").unwrap();
    let stream = gpu.default_stream();
    let mut rng = StdRng::seed_from_u64(seed());
    let pred = Held::upload(&gpu, &boxes(&mut rng, DType::F32, &[2, 3, 4]));
    let target = Held::upload(&gpu, &boxes(&mut rng, DType::F32, &[2, 3, 4]));
    let loss = Held::poisoned(&gpu, DType::F32, &[]);
    let dpred = Held::poisoned(&gpu, DType::F32, &[2, 3, 4]);
    let wrong = Held::poisoned(&gpu, DType::F32, &[2, 3, 5]);
    let inputs = [("pred", pred.borrowed(&gpu)), ("target", target.borrowed(&gpu))];

    let err = p
        .launch(gpu.ordinal(), &stream, &inputs, &[loss.borrowed(&gpu), wrong.borrowed(&gpu)], Validation::Deferred)
        .unwrap_err();
    assert!(matches!(&err, Error::OutputShape { name, position: 1, .. } if name == "dpred"), "{err}");
    let err = p.launch(gpu.ordinal(), &stream, &inputs, &[loss.borrowed(&gpu)], Validation::Deferred).unwrap_err();
    assert!(matches!(err, Error::OutputCount { got: 1, want: 2, .. }), "{err}");

    // SAFETY: a prefix of a live allocation of this device.
    let short = unsafe { gpu.borrow_memory(pred.owned.address(), 16) };
    let bad = [("pred", DeviceTensor::contiguous(short, DType::F32, vec![2, 3, 4])), ("target", target.borrowed(&gpu))];
    let err = p
        .launch(gpu.ordinal(), &stream, &bad, &[loss.borrowed(&gpu), dpred.borrowed(&gpu)], Validation::Deferred)
        .unwrap_err();
    assert!(matches!(&err, Error::BufferTooSmall { name, want: 96, bytes: 16, .. } if name == "pred"), "{err}");

    // The bound launch checks what it can without shapes: the count and each buffer's size.
    let typed: [(&str, DType, &[usize]); 2] = [("pred", DType::F32, &[2, 3, 4]), ("target", DType::F32, &[2, 3, 4])];
    let bound = p.bind_device(gpu.ordinal(), &typed).unwrap();
    let mine = |h: &Held| h.borrowed(&gpu).buffer;
    let err = bound.launch(&stream, &[mine(&pred), mine(&target), mine(&loss)], Validation::Deferred).unwrap_err();
    assert!(err.to_string().contains("3 buffers given for 2 inputs and 2 outputs"), "{err}");
    // SAFETY: a prefix of a live allocation of this device.
    let short = unsafe { gpu.borrow_memory(dpred.owned.address(), 64) };
    let err =
        bound.launch(&stream, &[mine(&pred), mine(&target), mine(&loss), short], Validation::Deferred).unwrap_err();
    assert!(err.to_string().contains("output #1 holds 64 bytes; its bound shape needs 96"), "{err}");
    let err = p.bind_device(gpu.ordinal(), &[("pred", DType::F32, &[2, 3, 4])]).unwrap_err();
    assert!(err.to_string().contains("target"), "{err}");

    let ok = [loss.borrowed(&gpu), dpred.borrowed(&gpu)];
    p.launch(gpu.ordinal(), &stream, &inputs, &ok, Validation::Deferred).unwrap();
    stream.synchronize().unwrap();
    let named = [("pred", &pred.download(&gpu)), ("target", &target.download(&gpu))];
    let want = p.run_cpu(&named).unwrap();
    assert!(rel_err(&loss.download(&gpu), &want[0].1) <= 1e-5);
    assert!(rel_err(&dpred.download(&gpu), &want[1].1) <= 1e-5);
}

#[test]
fn a_gradient_is_scaled_by_its_upstream_in_place_and_left_alone_by_an_upstream_of_one() {
    let Some((engine, gpu)) =
        device("a_gradient_is_scaled_by_its_upstream_in_place_and_left_alone_by_an_upstream_of_one")
    else {
        return;
    };
    let stream = gpu.create_stream().unwrap();
    let mut rng = StdRng::seed_from_u64(seed());
    let n = 3 * 1023 + 1;
    for grad_dtype in [DType::F32, DType::F16, DType::BF16] {
        for up_dtype in [DType::F32, DType::BF16, DType::F16] {
            let values: Vec<f64> = (0..n).map(|_| rng.random_range(-3.0..3.0)).collect();
            let grad = HostTensor::from_f64(grad_dtype, vec![n], &values);
            for up in [1.0, -2.5] {
                let g = Held::upload(&gpu, &grad);
                let u = Held::upload(&gpu, &HostTensor::from_f64(up_dtype, vec![], &[up]));
                gpu.synchronize().unwrap();
                kfuse::scale_by_upstream(&engine, gpu.ordinal(), &stream, &g.borrowed(&gpu), &u.borrowed(&gpu))
                    .unwrap_or_else(|e| panic!("{grad_dtype} by {up_dtype}: {e}"));
                stream.synchronize().unwrap();
                // -2.5 has few significant bits: the f32 product is exact and rounds once, as the
                // f64 product does here, so the bytes must agree.
                let scaled: Vec<f64> = grad.to_f64().iter().map(|v| v * up).collect();
                let want = HostTensor::from_f64(grad_dtype, vec![n], &scaled);
                assert_eq!(g.download(&gpu).to_bytes(), want.to_bytes(), "{grad_dtype} by {up_dtype} = {up}");
            }
        }
    }
    // Refused: an integer gradient, an upstream of more than one element.
    let ints = Held::upload(&gpu, &HostTensor::from_f64(DType::I32, vec![4], &[1.0, 2.0, 3.0, 4.0]));
    let one = Held::upload(&gpu, &HostTensor::from_f64(DType::F32, vec![], &[1.0]));
    let two = Held::upload(&gpu, &HostTensor::from_f64(DType::F32, vec![2], &[1.0, 1.0]));
    gpu.synchronize().unwrap();
    let err = kfuse::scale_by_upstream(&engine, gpu.ordinal(), &stream, &ints.borrowed(&gpu), &one.borrowed(&gpu))
        .unwrap_err();
    assert!(matches!(&err, Error::Scale { why, .. } if why.contains("must be floats")), "{err}");
    let err = kfuse::scale_by_upstream(&engine, gpu.ordinal(), &stream, &one.borrowed(&gpu), &two.borrowed(&gpu))
        .unwrap_err();
    assert!(matches!(&err, Error::Scale { why, .. } if why.contains("one element")), "{err}");
}
