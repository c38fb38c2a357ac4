//! A model built from its description and tensors in memory (`MlpModel::from_tensors`, what the
//! Python package's `FusedMLP.from_torch` uses) is the model that loading the same files gives,
//! and a bad description or tensor is the same clear error as from files.

use kfuse_ir::{DType, HostTensor};
use kfuse_mlp::testing::{write_model, ModelSpec};
use kfuse_mlp::{MlpError, MlpModel};

/// The description and tensors of a model written by `write_model`, read back from its files.
fn in_memory(spec: &ModelSpec) -> (MlpModel, String, Vec<(String, HostTensor)>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let json = write_model(dir.path(), "m", spec).expect("write model");
    let model = MlpModel::load(&json).expect("load");
    let text = std::fs::read_to_string(&json).expect("read json");
    let tensors = model
        .layers
        .iter()
        .enumerate()
        .flat_map(|(i, l)| {
            let w = HostTensor::from_f64(DType::F32, vec![l.outputs, l.inputs], &to_f64(&l.weight));
            let b = l
                .bias
                .as_ref()
                .map(|b| (format!("{}.bias", 2 * i), HostTensor::from_f64(DType::F16, vec![b.len()], &to_f64(b))));
            std::iter::once((format!("{}.weight", 2 * i), w)).chain(b)
        })
        .collect();
    (model, text, tensors)
}

fn to_f64(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| x as f64).collect()
}

fn refs(tensors: &[(String, HostTensor)]) -> Vec<(&str, &HostTensor)> {
    tensors.iter().map(|(n, t)| (n.as_str(), t)).collect()
}

fn err(text: &str, tensors: &[(String, HostTensor)]) -> MlpError {
    match MlpModel::from_tensors(text, &refs(tensors), "my module") {
        Ok(m) => panic!("expected an error, built {}", m.summary()),
        Err(e) => e,
    }
}

#[test]
fn same_model_as_from_files() {
    let mut spec = ModelSpec::new(&[6, 12, 3], "gelu");
    spec.file_dtype = DType::F16;
    let (model, text, tensors) = in_memory(&spec);
    let built = MlpModel::from_tensors(&text, &refs(&tensors), "my module").expect("from_tensors");
    assert_eq!(built, model);
    assert_eq!(built.summary(), "f16 6→12→3 [gelu, none]");
}

#[test]
fn bad_descriptions_and_tensors_are_clear_errors() {
    let spec = ModelSpec::new(&[4, 8, 2], "relu");
    let (_, text, tensors) = in_memory(&spec);

    let e = err("{not json", &tensors);
    assert!(matches!(e, MlpError::Json { .. }), "{e:?}");
    assert!(e.to_string().contains("`my module` is not a valid kfuse MLP description"), "{e}");

    let e = err(&text.replace("\"f16\"", "\"f64\""), &tensors);
    assert!(matches!(e, MlpError::ModelDType { .. }) && e.to_string().contains("expected \"f16\" or \"bf16\""), "{e}");

    let missing: Vec<_> = tensors.iter().filter(|(n, _)| n != "2.weight").cloned().collect();
    let e = err(&text, &missing);
    assert!(matches!(e, MlpError::MissingTensor { layer: 1, .. }), "{e:?}");
    assert!(
        e.to_string().contains("`2.weight` (weight) is not in `my module`, which holds: 0.bias, 0.weight, 2.bias"),
        "{e}"
    );

    let mut ints = tensors.clone();
    ints[0].1 = HostTensor::from_f64(DType::I32, vec![8, 4], &[1.0; 32]);
    let e = err(&text, &ints);
    assert!(matches!(e, MlpError::TensorDType { layer: 0, .. }) && e.to_string().contains("F16, BF16 or F32"), "{e}");

    let mut flat = tensors.clone();
    flat[0].1 = HostTensor::from_f64(DType::F32, vec![32], &[0.5; 32]);
    let e = err(&text, &flat);
    assert!(matches!(e, MlpError::TensorRank { layer: 0, want: 2, .. }), "{e:?}");

    let mut wide = tensors.clone();
    wide[2].1 = HostTensor::from_f64(DType::F32, vec![2, 7], &[0.5; 14]);
    let e = err(&text, &wide);
    assert!(matches!(e, MlpError::WidthChain { layer: 1, input: 7, prev_out: 8, .. }), "{e:?}");
}
