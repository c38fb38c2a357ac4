//! Helpers shared by kfuse's tests across crates (a dev-dependency only): the example programs,
//! random tensors, relative-error comparison, and the tier gates of `kfuse_runtime::testing`.
//!
//! These helpers panic on bad fixtures (a missing `examples/` folder): they are for test code.
#![forbid(unsafe_code)]

use std::path::PathBuf;

use kfuse_ir::{DType, HostTensor};

pub use kfuse_runtime::testing::{gpu_or_skip, nvrtc_or_skip};
/// The seeded generator the helpers use, for tests that make their own data.
pub use rand::{rngs::StdRng, Rng, SeedableRng};

/// The repository's `examples/` folder.
pub fn examples_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples")
}

/// Every `examples/*.kf`, sorted, as (stem, source).
pub fn examples() -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = std::fs::read_dir(examples_dir())
        .expect("examples/ exists")
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "kf"))
        .map(|p| (p.file_stem().unwrap().to_string_lossy().into_owned(), std::fs::read_to_string(&p).unwrap()))
        .collect();
    v.sort();
    assert!(v.len() >= 4, "expected the example programs, found {}", v.len());
    v
}

/// One example's source by stem (`giou`, `smooth_l1_train`).
pub fn example(stem: &str) -> String {
    let path = examples_dir().join(format!("{stem}.kf"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// A tensor of `dtype` and `shape` with values uniform in [-1, 1) (floats), in -3..=3 (i32, i64), or
/// random booleans, from `seed`.
pub fn random_tensor(dtype: DType, shape: &[usize], seed: u64) -> HostTensor {
    let mut rng = StdRng::seed_from_u64(seed);
    let n: usize = shape.iter().product();
    let values: Vec<f64> = (0..n)
        .map(|_| match dtype {
            DType::I32 | DType::I64 => f64::from(rng.random_range(-3i32..=3)),
            DType::Bool => f64::from(u8::from(rng.random_bool(0.5))),
            _ => rng.random_range(-1.0..1.0),
        })
        .collect();
    HostTensor::from_f64(dtype, shape.to_vec(), &values)
}

/// The largest relative error of `got` against `want`, each element's error divided by
/// `max(|want|, 1e-6)`; infinite when the shapes or dtypes differ.
pub fn max_rel_err(got: &HostTensor, want: &HostTensor) -> f64 {
    if got.shape != want.shape || got.dtype() != want.dtype() {
        return f64::INFINITY;
    }
    got.to_f64()
        .iter()
        .zip(want.to_f64())
        .map(|(g, w)| if g.is_nan() && w.is_nan() { 0.0 } else { (g - w).abs() / w.abs().max(1e-6) })
        .fold(0.0, f64::max)
}

/// The dtype replacements that run an f32 description at `dtype`: every `f32` input with at
/// least one axis (scalars keep their dtype), for `Program::with_input_dtypes`.
pub fn float_inputs_as(interface: &kfuse_ir::Interface, dtype: DType) -> Vec<(String, DType)> {
    interface
        .inputs
        .iter()
        .filter(|d| d.dtype == DType::F32 && !d.shape.is_empty())
        .map(|d| (d.name.clone(), dtype))
        .collect()
}

/// The relative error of `got` against `want` as the GPU conformance tests measure it:
/// ‖got − want‖₂ / ‖want‖₂ (absolute when `want` is 0); NaN in the same places and equal
/// infinities agree; infinite when the shapes or dtypes differ.
pub fn rel_l2_err(got: &HostTensor, want: &HostTensor) -> f64 {
    if got.shape != want.shape || got.dtype() != want.dtype() {
        return f64::INFINITY;
    }
    let (g, w) = (got.to_f64(), want.to_f64());
    let mut num = 0.0f64;
    for (a, b) in g.iter().zip(&w) {
        if (a.is_nan() && b.is_nan()) || a == b {
            continue;
        }
        let d = (a - b).abs();
        num += if d.is_nan() { f64::INFINITY } else { d * d };
    }
    let den: f64 = w.iter().filter(|b| b.is_finite()).map(|b| b * b).sum();
    if den > 0.0 {
        num.sqrt() / den.sqrt()
    } else {
        num.sqrt()
    }
}

/// Panics unless NVRTC compiles kernel `name`'s CUDA `source` for sm_80 and sm_90 (call it after
/// [`nvrtc_or_skip`]); `what` names the program in the message.
pub fn assert_compiles_for_sm80_and_sm90(what: &str, name: &str, source: &str) {
    use kfuse_runtime::{compile, Arch, CompileOptions};
    for arch in [Arch::new(8, 0), Arch::new(9, 0)] {
        if let Err(e) = compile(source, &CompileOptions::for_arch(arch)) {
            panic!("{what}: {name} does not compile for {}: {e}\n{source}", arch.sm_name());
        }
    }
}

/// The outputs of `graph` computed by the interpreter stage by stage, as its plan under `opts`
/// computes them (see [`kfuse_codegen::stage_graphs`]): each stage's graph run on the original
/// inputs and the values the stages before it stored, each stored value shaped as its readers
/// declare it. `Ok(None)` when the plan stores nothing; `Err` says what failed.
pub fn run_stages(
    graph: &kfuse_ir::Graph,
    opts: &kfuse_codegen::CodegenOptions,
    inputs: &[(&str, &HostTensor)],
) -> Result<Option<Vec<(String, HostTensor)>>, String> {
    let Some(stages) = kfuse_codegen::stage_graphs(graph, opts).map_err(|e| format!("the plan: {e}"))? else {
        return Ok(None);
    };
    let bindings = kfuse_ir::SymbolBindings::bind(graph, inputs).map_err(|e| format!("the inputs: {e}"))?;
    let original = graph.inputs.len();
    let run = |g: &kfuse_ir::Graph, stored: &[Option<HostTensor>]| {
        let mut feed: Vec<(&str, &HostTensor)> = Vec::with_capacity(g.inputs.len());
        for (j, input) in g.inputs.iter().enumerate() {
            let t = match j.checked_sub(original) {
                None => inputs.iter().find(|(n, _)| *n == input.name).map(|(_, t)| *t),
                Some(i) => stored[i].as_ref(),
            };
            feed.push((input.name.as_str(), t.ok_or_else(|| format!("no value for stage input `{}`", input.name))?));
        }
        kfuse_interp::run(g, &feed).map_err(|e| format!("a stage: {e}"))
    };
    let mut stored: Vec<Option<HostTensor>> = vec![None; stages.stored.len()];
    for (g, outs) in &stages.early {
        for ((_, t), &i) in run(g, &stored)?.into_iter().zip(outs) {
            let dims = bindings.resolve(graph, &stages.stored[i].1);
            if dims.iter().product::<usize>() != t.data.len() {
                return Err(format!("stored value {i}: {} elements, read as {dims:?}", t.data.len()));
            }
            stored[i] = Some(HostTensor::new(dims, t.data));
        }
    }
    let mut last = match &stages.last {
        Some(g) => run(g, &stored)?.into_iter(),
        None => Vec::new().into_iter(),
    };
    let mut outputs = Vec::with_capacity(graph.outputs.len());
    for (o, output) in graph.outputs.iter().enumerate() {
        let value = match stages.stored_outputs.iter().position(|s| *s == Some(o)) {
            Some(i) => stored[i].clone().map(|t| (output.name.clone(), t)),
            None => last.next(),
        };
        outputs.push(value.ok_or_else(|| format!("no stage computes output `{}`", output.name))?);
    }
    Ok(Some(outputs))
}
