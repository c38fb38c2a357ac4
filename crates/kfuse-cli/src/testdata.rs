//! Random inputs for any program, honouring its layout constraints: used by the conformance
//! tests (GPU against the interpreter) and by `kfuse bench --dim`.
//!
//! Floats are uniform in [-1, 1), except inputs whose last axis is 4 and whose name says they
//! hold boxes (`pred`, `target`, `boxes`…): those get well-formed boxes (x1 < x2, y1 < y2) with
//! about a third of the target slots zeroed as padding. Lengths inputs get values in `0..=N`
//! (empty and full rows included), offsets a random non-decreasing partition of `T`.

use kfuse::{Constraint, DType, Dim, Graph, HostTensor, InputId, Kind};
use rand::{rngs::StdRng, Rng, SeedableRng};

use crate::Error;

/// Random inputs for `graph` at the given symbol sizes (`sizes[sym]`), from `seed`.
pub fn random_inputs_for(graph: &Graph, sizes: &[u64], seed: u64) -> Result<Vec<(String, HostTensor)>, Error> {
    let mut rng = StdRng::seed_from_u64(seed);
    let dim = |d: Dim| match d {
        Dim::Const(c) => c,
        Dim::Sym(s) => sizes[s.0 as usize],
    };
    let mut out = Vec::with_capacity(graph.inputs.len());
    for (i, inp) in graph.inputs.iter().enumerate() {
        let shape = graph.resolve_shape(&inp.shape, sizes);
        let n: usize = shape.iter().product();
        let values: Vec<f64> = match graph.constraint_of(InputId(i as u32)) {
            Some(Constraint::Lengths { max, .. }) => {
                let max = dim(max);
                (0..n)
                    .map(|j| match j % 5 {
                        0 => 0.0,
                        1 => max as f64,
                        _ => rng.random_range(0..=max) as f64,
                    })
                    .collect()
            }
            Some(Constraint::Offsets { total, .. }) => {
                let total = dim(total);
                let mut cuts: Vec<u64> = (0..n.saturating_sub(2)).map(|_| rng.random_range(0..=total)).collect();
                cuts.sort_unstable();
                let mut v = Vec::with_capacity(n);
                if n > 0 {
                    v.push(0.0);
                    v.extend(cuts.iter().map(|&c| c as f64));
                    if n > 1 {
                        v.push(total as f64);
                    }
                }
                v
            }
            None if is_boxes(&inp.name, &shape) => boxes(&mut rng, n / 4, inp.name.contains("target")),
            None => (0..n)
                .map(|_| match inp.dtype.kind() {
                    Kind::Float => rng.random_range(-1.0..1.0),
                    Kind::Int => rng.random_range(0..8) as f64,
                    Kind::Bool => rng.random_bool(0.5) as u8 as f64,
                })
                .collect(),
        };
        out.push((inp.name.clone(), HostTensor::from_f64(inp.dtype, shape, &values)));
    }
    Ok(out)
}

fn is_boxes(name: &str, shape: &[usize]) -> bool {
    shape.last() == Some(&4) && ["pred", "target", "box"].iter().any(|k| name.contains(k))
}

fn boxes(rng: &mut StdRng, count: usize, padded: bool) -> Vec<f64> {
    let mut v = Vec::with_capacity(count * 4);
    for _ in 0..count {
        if padded && rng.random_bool(0.33) {
            v.extend([0.0; 4]);
            continue;
        }
        let (x, y) = (rng.random_range(0.0..200.0f64), rng.random_range(0.0..200.0f64));
        let (w, h) = (rng.random_range(1.0..56.0f64), rng.random_range(1.0..56.0f64));
        v.extend([x, y, x + w, y + h]);
    }
    v
}

/// The same program text with every `f32` input declaration turned into `dtype` (for f16/bf16
/// runs of the f32 examples).
pub fn with_float_dtype(source: &str, dtype: DType) -> String {
    source
        .lines()
        .map(|l| {
            if l.trim_start().starts_with("input") {
                l.replace("f32[", &format!("{}[", dtype.name()))
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}
