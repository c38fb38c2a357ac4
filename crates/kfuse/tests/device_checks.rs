//! Lengths/offsets values checked by the kernels on the device (`Validation::Deferred`): the plan's
//! kernels take the error record (pure tier: their parameters and the null-pointer guard), a bad
//! value makes the loss NaN and the bad row's gradient NaN, and the next launch on the device or
//! `Engine::check_errors` returns it as `Error::DeviceInput` naming the program, input and
//! position; `Validation::Off` checks nothing (GPU tier, odd sizes). Skips without a GPU.

use std::sync::Arc;

use kfuse::{DType, Engine, Error, Gpu, HostTensor, KernelCache, Program, TensorData, Validation};
use kfuse_codegen::Param;
use kfuse_testing::example;

mod common;
use common::{device, Held};

const B: usize = 5;
const N: usize = 13;

fn engine() -> Engine {
    Engine::with_cache(Arc::new(KernelCache::memory_only()))
}

#[test]
fn kernels_of_ragged_programs_take_the_error_record_and_others_do_not() {
    for stem in ["giou_lengths", "giou_train_lengths", "giou_packed", "giou_train_packed", "giou", "giou_train"] {
        let p = Program::compile(&engine(), &example(stem), &format!("examples/{stem}.kf")).unwrap();
        let ragged = !p.graph().constraints.is_empty();
        for k in &p.plan().kernels {
            let n = k.params.len();
            let takes = n >= 2 && k.params[n - 2] == Param::ErrorRecord && k.params[n - 1] == Param::CheckTag;
            assert_eq!(takes, ragged, "{stem}: {}", k.name);
            // With a null record no check reads anything: every check sits behind the guard.
            let guarded = k.source.lines().filter(|l| l.contains("kf_report(kf_err")).all(|l| {
                l.contains("kf_err != nullptr") || k.source.contains("if (kf_err != nullptr) { // the checks")
            });
            assert!(guarded, "{stem}: {}", k.name);
            // Kernel 0 checks every layout input (the others check what they read).
            if !ragged || k.name.ends_with("_0") {
                assert_eq!(k.source.contains("kf_report(kf_err"), ragged, "{stem}: {}", k.name);
            }
        }
    }
}

fn boxes(rows: usize, seed: u64) -> Vec<f64> {
    // Deterministic boxes (x1 < x2, y1 < y2) without a random source.
    (0..rows)
        .flat_map(|r| {
            let x = ((r as u64 * 7 + seed * 3) % 40) as f64 + 0.25;
            let y = ((r as u64 * 11 + seed * 5) % 40) as f64 + 0.5;
            let (w, h) = (1.0 + ((r as u64 + seed) % 9) as f64, 1.5 + ((r as u64 * 3 + seed) % 7) as f64);
            [x, y, x + w, y + h]
        })
        .collect()
}

/// Launches giou_train_lengths in place with `lengths` and returns (loss, dpred).
fn launch(gpu: &Gpu, p: &Program, lengths: &[i32], validation: Validation) -> kfuse::Result<(Vec<f64>, Vec<f64>)> {
    let pred = HostTensor::from_f64(DType::F32, vec![B, N, 4], &boxes(B * N, 1));
    let target = HostTensor::from_f64(DType::F32, vec![B, N, 4], &boxes(B * N, 2));
    let lens = HostTensor::new(vec![B], TensorData::I32(lengths.to_vec()));
    let held = [Held::upload(gpu, &pred), Held::upload(gpu, &target), Held::upload(gpu, &lens)];
    let (loss, dpred) = (Held::zeros(gpu, DType::F32, &[]), Held::zeros(gpu, DType::F32, &[B, N, 4]));
    let inputs =
        [("pred", held[0].borrowed(gpu)), ("target", held[1].borrowed(gpu)), ("lengths", held[2].borrowed(gpu))];
    let result =
        p.launch(gpu.ordinal(), &gpu.default_stream(), &inputs, &[loss.borrowed(gpu), dpred.borrowed(gpu)], validation);
    gpu.synchronize_device().unwrap();
    result?;
    Ok((loss.values(gpu), dpred.values(gpu)))
}

#[test]
fn bad_lengths_poison_the_loss_and_the_bad_row_and_surface_at_the_next_launch() {
    let Some((engine, gpu)) = device("bad_lengths_poison_the_loss_and_the_bad_row_and_surface_at_the_next_launch")
    else {
        return;
    };
    let p = Program::compile(&engine, &example("giou_train_lengths"), "examples/giou_train_lengths.kf").unwrap();
    let good = [3, 0, N as i32, 2, 5];
    for (bad, words) in
        [(1 << 30, "is greater than N = 13"), (-7, "is negative"), (N as i32 + 1, "is greater than N = 13")]
    {
        let mut lengths = good;
        lengths[3] = bad;
        let (loss, dpred) = launch(&gpu, &p, &lengths, Validation::Deferred).expect("nothing pending before");
        assert!(loss[0].is_nan(), "lengths {bad}: loss {}", loss[0]);
        assert!(dpred[3 * N * 4..4 * N * 4].iter().all(|v| v.is_nan()), "lengths {bad}: row 3 of the gradient");
        let err = launch(&gpu, &p, &good, Validation::Deferred).unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, Error::DeviceInput { ordinal: 0, .. }), "{text}");
        assert!(text.contains("examples/giou_train_lengths.kf"), "{text}");
        assert!(text.contains(&format!("lengths[3] = {bad} {words}")), "{text}");
        // Taken once: the next launch works and matches the interpreter.
        let (loss, _) = launch(&gpu, &p, &good, Validation::Deferred).unwrap();
        let named_pred = HostTensor::from_f64(DType::F32, vec![B, N, 4], &boxes(B * N, 1));
        let named_target = HostTensor::from_f64(DType::F32, vec![B, N, 4], &boxes(B * N, 2));
        let lens = HostTensor::new(vec![B], TensorData::I32(good.to_vec()));
        let want = p.run_cpu(&[("pred", &named_pred), ("target", &named_target), ("lengths", &lens)]).unwrap();
        let want = want[0].1.scalar_f64().unwrap();
        assert!((loss[0] - want).abs() <= 1e-5 * want.abs().max(1.0), "{} vs {want}", loss[0]);
    }
}

#[test]
fn check_errors_returns_a_violation_once_and_off_records_nothing() {
    let Some((engine, gpu)) = device("check_errors_returns_a_violation_once_and_off_records_nothing") else { return };
    let p = Program::compile(&engine, &example("giou_train_lengths"), "examples/giou_train_lengths.kf").unwrap();
    launch(&gpu, &p, &[1, 2, -7, 3, 4], Validation::Deferred).unwrap();
    let err = engine.check_errors(gpu.ordinal()).unwrap_err();
    assert!(err.to_string().contains("lengths[2] = -7 is negative"), "{err}");
    engine.check_errors(gpu.ordinal()).unwrap();
    let (loss, _) = launch(&gpu, &p, &[1, 2, -7, 3, 4], Validation::Off).unwrap();
    assert!(!loss[0].is_nan());
    engine.check_errors(gpu.ordinal()).unwrap();
}

#[test]
fn bad_offsets_are_found_by_the_first_kernel() {
    let Some((engine, gpu)) = device("bad_offsets_are_found_by_the_first_kernel") else { return };
    let p = Program::compile(&engine, &example("giou_train_packed"), "examples/giou_train_packed.kf").unwrap();
    let t = 37;
    for (offsets, words) in [
        (vec![0, 5, 3, t], "offsets[2] = 3 is less than offsets[1] = 5"),
        (vec![0, 5, 30, t - 1], "the last offset offsets[3] = 36 must equal T = 37"),
        (vec![2, 5, t], "offsets[0] = 2, but must be 0"),
    ] {
        let pred = Held::upload(&gpu, &HostTensor::from_f64(DType::F32, vec![t as usize, 4], &boxes(t as usize, 3)));
        let target = Held::upload(&gpu, &HostTensor::from_f64(DType::F32, vec![t as usize, 4], &boxes(t as usize, 4)));
        let off = Held::upload(&gpu, &HostTensor::new(vec![offsets.len()], TensorData::I32(offsets.clone())));
        let (loss, dpred) = (Held::zeros(&gpu, DType::F32, &[]), Held::zeros(&gpu, DType::F32, &[t as usize, 4]));
        let inputs =
            [("pred", pred.borrowed(&gpu)), ("target", target.borrowed(&gpu)), ("offsets", off.borrowed(&gpu))];
        p.launch(
            gpu.ordinal(),
            &gpu.default_stream(),
            &inputs,
            &[loss.borrowed(&gpu), dpred.borrowed(&gpu)],
            Validation::Deferred,
        )
        .unwrap();
        gpu.synchronize_device().unwrap();
        assert!(loss.values(&gpu)[0].is_nan(), "{offsets:?}");
        let err = engine.check_errors(gpu.ordinal()).unwrap_err();
        assert!(err.to_string().contains(words), "{offsets:?}: {err}");
    }
}
