//! The command-line tool on bad input: every case exits non-zero with a message that says what
//! and where, and never panics. Runs without a GPU (pure tier); the no-GPU and no-NVRTC cases
//! check the errors a machine without them gives.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use kfuse::{DType, HostTensor};
use kfuse_cli::{boxes, npy};

mod common;
use common::{kfuse, kfuse_exe};

fn examples() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples")
}

fn giou() -> String {
    examples().join("giou.kf").display().to_string()
}

/// Asserts a failure with every `needle` in stderr, and no panic.
fn fails_with(out: &Output, needles: &[&str]) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "expected failure, got success; stderr: {err}");
    assert!(!err.contains("panicked"), "panic: {err}");
    for n in needles {
        assert!(err.contains(n), "stderr lacks {n:?}:\n{err}");
    }
    assert_eq!(err.lines().filter(|l| l.starts_with("error")).count(), 1, "one error line:\n{err}");
}

fn write_kf(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.display().to_string()
}

fn write(dir: &Path, name: &str, t: &HostTensor) -> String {
    let p = dir.join(name);
    npy::write_npy(&p, t).unwrap();
    p.display().to_string()
}

const HEADER: &str = "input pred: f32[B, N, 4]\ninput target: f32[B, N, 4]\n";

#[test]
fn language_errors_point_at_the_spot() {
    let d = tempfile::tempdir().unwrap();
    let cases: [(&str, &[&str]); 4] = [
        ("let x = pred[.., 0] +* 2\noutput y = x\n", &["bad.kf:3:", "^", "expected"]),
        ("output y = sum(prd[.., 0])\n", &["bad.kf:3:", "unknown name `prd`", "pred"]),
        ("let valid = target[.., 3] != 0\noutput y = sum(valid + pred[.., 0])\n", &["bad.kf:4:", "bool", "f32"]),
        ("output y = sum(pred[.., 4])\n", &["bad.kf:3:", "out of range"]),
    ];
    for (body, needles) in cases {
        let f = write_kf(d.path(), "bad.kf", &format!("{HEADER}{body}"));
        fails_with(&kfuse(&["check", &f]), needles);
    }
}

#[test]
fn run_checks_inputs_before_anything_runs() {
    let d = tempfile::tempdir().unwrap();
    let b = boxes::generate(3, 5, 1).unwrap();
    let pred = write(d.path(), "pred.npy", &b.pred);
    let target = write(d.path(), "target.npy", &b.target);
    let other = boxes::generate(3, 6, 1).unwrap();
    let target6 = write(d.path(), "target6.npy", &other.target);
    let ints = write(d.path(), "ints.npy", &HostTensor::from_f64(DType::I32, vec![3, 5, 4], &[1.0; 60]));
    let g = giou();
    let ip = format!("pred={pred}");
    let it = format!("target={target}");
    // Shapes that disagree with each other.
    fails_with(
        &kfuse(&["run", &g, "--device", "cpu", "--input", &ip, "--input", &format!("target={target6}")]),
        &["target", "N = 6", "N = 5"],
    );
    // Wrong dtype.
    fails_with(
        &kfuse(&["run", &g, "--device", "cpu", "--input", &format!("pred={ints}"), "--input", &it]),
        &["pred", "i32", "f32"],
    );
    // A corrupt .npy.
    let bad = d.path().join("bad.npy");
    std::fs::write(&bad, b"\x93NUMPY garbage").unwrap();
    fails_with(
        &kfuse(&["run", &g, "--device", "cpu", "--input", &ip, "--input", &format!("target={}", bad.display())]),
        &["bad.npy", "not a valid .npy"],
    );
    // Missing, unknown and malformed --input.
    fails_with(&kfuse(&["run", &g, "--device", "cpu", "--input", &ip]), &["missing input `target`"]);
    fails_with(
        &kfuse(&["run", &g, "--device", "cpu", "--input", &ip, "--input", &it, "--input", &format!("extra={pred}")]),
        &["unknown input `extra`"],
    );
    fails_with(&kfuse(&["run", &g, "--device", "cpu", "--input", "pred"]), &["NAME=PATH"]);
    // A shape against the declaration.
    let flat = write(d.path(), "flat.npy", &HostTensor::from_f64(DType::F32, vec![3, 5], &[1.0; 15]));
    fails_with(
        &kfuse(&["run", &g, "--device", "cpu", "--input", &format!("pred={flat}"), "--input", &it]),
        &["pred", "2 axes"],
    );
    // And the good case works.
    let ok = kfuse(&["run", &g, "--device", "cpu", "--input", &ip, "--input", &it]);
    assert!(ok.status.success(), "{}", String::from_utf8_lossy(&ok.stderr));
    assert!(String::from_utf8_lossy(&ok.stdout).starts_with("loss = "));
}

#[test]
fn empty_batches_and_nan_data_are_not_errors() {
    let d = tempfile::tempdir().unwrap();
    let empty = HostTensor::from_f64(DType::F32, vec![0, 256, 4], &[]);
    let (p, t) = (write(d.path(), "p.npy", &empty), write(d.path(), "t.npy", &empty));
    let out =
        kfuse(&["run", &giou(), "--device", "cpu", "--input", &format!("pred={p}"), "--input", &format!("target={t}")]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "loss = 0", "max(count, 1) makes an empty batch's loss 0");

    let mut pred = vec![10.0, 10.0, 20.0, 20.0];
    pred[0] = f64::NAN;
    let p = write(d.path(), "pn.npy", &HostTensor::from_f64(DType::F32, vec![1, 1, 4], &pred));
    let t = write(d.path(), "tn.npy", &HostTensor::from_f64(DType::F32, vec![1, 1, 4], &[12.0, 12.0, 22.0, 22.0]));
    let out =
        kfuse(&["run", &giou(), "--device", "cpu", "--input", &format!("pred={p}"), "--input", &format!("target={t}")]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "loss = NaN", "NaN propagates as IEEE says");
}

#[test]
fn tensor_outputs_land_in_the_output_folder() {
    let d = tempfile::tempdir().unwrap();
    let b = boxes::generate(4, 7, 3).unwrap();
    let (p, t) = (write(d.path(), "p.npy", &b.pred), write(d.path(), "t.npy", &b.target));
    let outdir = d.path().join("out");
    let train = examples().join("giou_train.kf").display().to_string();
    let out = kfuse(&[
        "run",
        &train,
        "--device",
        "cpu",
        "--input",
        &format!("pred={p}"),
        "--input",
        &format!("target={t}"),
        "--output",
        &outdir.display().to_string(),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let dpred = npy::read_npy(&outdir.join("dpred.npy")).unwrap();
    assert_eq!(dpred.shape, vec![4, 7, 4]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("loss = "));
}

#[test]
fn no_gpu_and_no_nvrtc_are_clear_errors() {
    if kfuse::runtime::driver_available() {
        println!("SKIPPED: no_gpu_and_no_nvrtc_are_clear_errors: a CUDA driver is present, so the no-GPU error cannot be seen");
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let b = boxes::generate(2, 3, 1).unwrap();
    let (p, t) = (write(d.path(), "p.npy", &b.pred), write(d.path(), "t.npy", &b.target));
    let out = kfuse(&[
        "run",
        &giou(),
        "--device",
        "cuda",
        "--input",
        &format!("pred={p}"),
        "--input",
        &format!("target={t}"),
    ]);
    fails_with(&out, &["CUDA driver is not available"]);
    // Without libnvrtc on the library path, compiling is an error that says what to install.
    let out = Command::new(kfuse_exe())
        .args(["compile", &giou(), "--arch", "sm_90"])
        .env("LD_LIBRARY_PATH", d.path())
        .env("KFUSE_CACHE_DIR", d.path().join("cache"))
        .output()
        .unwrap();
    if kfuse::runtime::nvrtc_available() && out.status.success() {
        println!("SKIPPED: the no-NVRTC half: libnvrtc is found without LD_LIBRARY_PATH on this machine");
        return;
    }
    fails_with(&out, &["NVRTC is not available", "libnvrtc"]);
    // `kfuse demo` still works: it falls back to the CPU.
    let out = kfuse(&["demo", "--batch", "8", "--max-boxes", "16"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("loss = "));
}

/// GPU tier: `kfuse mlp run` on a cold kernel cache answers from the fast-compiled kernel, says so
/// in one stderr line and leaves the optimised kernel in the disk cache; the next run uses it
/// (no such line). Both results match the CPU interpreter.
#[test]
fn mlp_run_answers_cold_from_the_fast_form_and_leaves_the_optimised_kernel_cached() {
    let Some(gpu) = kfuse::runtime::testing::gpu_or_skip(
        "mlp_run_answers_cold_from_the_fast_form_and_leaves_the_optimised_kernel_cached",
    ) else {
        return;
    };
    drop(gpu);
    use kfuse::mlp::testing::{random_input, write_model, ModelSpec, Rng};
    let d = tempfile::tempdir().unwrap();
    let model_path = write_model(d.path(), "m", &ModelSpec::new(&[24, 48, 48, 8], "silu")).unwrap();
    let model = kfuse::mlp::MlpModel::load(&model_path).unwrap();
    let (mut rng, seed) = Rng::from_time();
    println!("seed {seed}");
    let x = random_input(DType::F16, 255, 24, &mut rng);
    let xp = write(d.path(), "x.npy", &x);
    let want = kfuse::mlp::evaluate_cpu(&model, &x).unwrap();
    let mut lines = Vec::new();
    for phase in ["cold", "warm"] {
        let out_path = d.path().join(format!("y_{phase}.npy"));
        let out = Command::new(kfuse_exe())
            .args([
                "mlp",
                "run",
                &model_path.display().to_string(),
                "--input",
                &xp,
                "--output",
                &out_path.display().to_string(),
                "--device",
                "cuda",
            ])
            .env("KFUSE_CACHE_DIR", d.path().join("cache"))
            .env("CUDA_CACHE_DISABLE", "1")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(out.status.success(), "{phase}: {err}");
        let notice = err.lines().filter(|l| l.contains("fast-compiled kernel")).count();
        assert_eq!(notice, usize::from(phase == "cold"), "{phase} stderr:\n{err}");
        if phase == "cold" {
            assert!(err.contains("for the next run"), "{err}");
        }
        let got = npy::read_npy(&out_path).unwrap();
        let e = kfuse::mlp::compare_rows(&got.to_f64(), &want, 8);
        println!("{phase}: {e:?}");
        assert!(e.non_finite == 0 && e.rel_err <= 1e-2, "{phase}: {e:?}");
        lines.push(String::from_utf8_lossy(&out.stdout).split("->").next().unwrap_or_default().to_string());
    }
    assert_eq!(lines[0], lines[1], "the summary line differs between the cold and the warm run");
}

#[test]
fn the_demo_embeds_the_shipped_giou_example_unchanged() {
    let shipped = std::fs::read_to_string(examples().join("giou.kf")).unwrap();
    assert_eq!(kfuse_cli::demo::GIOU_KF, shipped, "crates/kfuse-cli/src/giou.kf must be a copy of examples/giou.kf");
}
