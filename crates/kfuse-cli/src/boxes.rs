//! Ragged batches of boxes with the statistics of the GIoU seed (a face detector's targets).
//!
//! Each image holds `clip(floor(|Normal(0, 3)|), 0, max_boxes)` boxes (most hold fewer than ten
//! of up to 256 slots); a box has a top-left corner uniform in `[0, 255)` and a size uniform in
//! `[1, 256)`, its bottom-right corner clamped to 255, as in the seed's `FakeDataset`. Targets are
//! padded with zeros, so a slot is valid exactly when its `y2` (component 3) is non-zero: a real
//! box always has `y2 >= 1`.
//!
//! Predictions are what a half-trained detector emits: for a valid slot, the target with each
//! corner moved by `Normal(0, 12)` pixels; for a padding slot, an unrelated random box (a model
//! writes every slot). Every predicted box is well formed (`x1 <= x2`, `y1 <= y2`).
//!
//! The same batch comes in three layouts: padded (`[B, N, 4]`), lengths (`i32[B]`: valid boxes are
//! the first `lengths[b]` slots of row b), and packed (`[T, 4]` with `i32[B + 1]` offsets).

use kfuse::{DType, HostTensor, TensorData};
use rand::{rngs::StdRng, Rng, SeedableRng};
use rand_distr::{Distribution, Normal};

/// A ragged batch in every layout kfuse handles.
#[derive(Clone, Debug)]
pub struct BoxBatch {
    /// `f32[B, N, 4]`.
    pub pred: HostTensor,
    /// `f32[B, N, 4]`, zero-padded.
    pub target: HostTensor,
    /// `i32[B]`.
    pub lengths: HostTensor,
    /// `f32[T, 4]`.
    pub pred_packed: HostTensor,
    /// `f32[T, 4]`.
    pub target_packed: HostTensor,
    /// `i32[B + 1]`.
    pub offsets: HostTensor,
}

impl BoxBatch {
    /// Number of valid boxes.
    pub fn valid_boxes(&self) -> usize {
        self.target_packed.shape[0]
    }

    /// The tensors with their file stems, as `kfuse gen boxes` writes them.
    pub fn named(&self) -> [(&'static str, &HostTensor); 6] {
        [
            ("pred", &self.pred),
            ("target", &self.target),
            ("lengths", &self.lengths),
            ("pred_packed", &self.pred_packed),
            ("target_packed", &self.target_packed),
            ("offsets", &self.offsets),
        ]
    }
}

/// Why a batch cannot be generated.
#[derive(Debug, thiserror::Error)]
pub enum GenError {
    #[error("--max-boxes must be between 1 and 65536, got {0}")]
    MaxBoxes(usize),
    #[error("a batch of {batch} × {max_boxes} boxes is too large ({elems} floats)")]
    TooLarge { batch: usize, max_boxes: usize, elems: u128 },
}

/// Generates a batch of `batch` images with `max_boxes` slots each, reproducibly from `seed`.
pub fn generate(batch: usize, max_boxes: usize, seed: u64) -> Result<BoxBatch, GenError> {
    if !(1..=65536).contains(&max_boxes) {
        return Err(GenError::MaxBoxes(max_boxes));
    }
    let elems = batch as u128 * max_boxes as u128 * 4;
    // 2^30 floats is 4 GiB a tensor; beyond that the allocation, not the user, would fail.
    if elems > (1u128 << 30) {
        return Err(GenError::TooLarge { batch, max_boxes, elems });
    }
    let mut rng = StdRng::seed_from_u64(seed);
    let count_dist = Normal::new(0.0f64, 3.0).expect("fixed parameters are valid");
    let jitter = Normal::new(0.0f32, 12.0).expect("fixed parameters are valid");
    let n = max_boxes;
    let mut target = vec![0f32; batch * n * 4];
    let mut pred = vec![0f32; batch * n * 4];
    let mut lengths = Vec::with_capacity(batch);
    let mut offsets = Vec::with_capacity(batch + 1);
    let mut tp = Vec::new();
    let mut pp = Vec::new();
    offsets.push(0i32);
    for b in 0..batch {
        let count = (count_dist.sample(&mut rng).abs().floor() as usize).min(255).min(n);
        lengths.push(count as i32);
        for s in 0..n {
            let at = (b * n + s) * 4;
            let p = if s < count {
                let t = seed_box(&mut rng);
                target[at..at + 4].copy_from_slice(&t);
                tp.extend_from_slice(&t);
                let moved = [0, 1, 2, 3].map(|i| t[i] + jitter.sample(&mut rng));
                well_formed(moved)
            } else {
                seed_box(&mut rng)
            };
            pred[at..at + 4].copy_from_slice(&p);
            if s < count {
                pp.extend_from_slice(&p);
            }
        }
        offsets.push(i32::try_from(tp.len() / 4).unwrap_or(i32::MAX));
    }
    let t = tp.len() / 4;
    Ok(BoxBatch {
        pred: HostTensor::new(vec![batch, n, 4], TensorData::F32(pred)),
        target: HostTensor::new(vec![batch, n, 4], TensorData::F32(target)),
        lengths: HostTensor::new(vec![batch], TensorData::I32(lengths)),
        pred_packed: HostTensor::new(vec![t, 4], TensorData::F32(pp)),
        target_packed: HostTensor::new(vec![t, 4], TensorData::F32(tp)),
        offsets: HostTensor::new(vec![batch + 1], TensorData::I32(offsets)),
    })
}

/// One box as the seed's dataset draws it: uint8 corners, bottom-right clamped to 255.
fn seed_box(rng: &mut StdRng) -> [f32; 4] {
    let (x1, y1) = (rng.random_range(0..255u32), rng.random_range(0..255u32));
    let (w, h) = (rng.random_range(1..256u32), rng.random_range(1..256u32));
    [x1 as f32, y1 as f32, (x1 + w).min(255) as f32, (y1 + h).min(255) as f32]
}

fn well_formed([x1, y1, x2, y2]: [f32; 4]) -> [f32; 4] {
    [x1.min(x2), y1.min(y2), x1.max(x2), y1.max(y2)]
}

/// Converts a batch's float tensors to another float dtype (for f16/bf16 runs).
pub fn convert_floats(t: &HostTensor, dtype: DType) -> HostTensor {
    if !t.dtype().is_float() || t.dtype() == dtype {
        return t.clone();
    }
    HostTensor::from_f64(dtype, t.shape.clone(), &t.to_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_agree_and_follow_the_padding_rule() {
        let b = generate(257, 16, 7).unwrap();
        let target = b.target.to_f64();
        let lengths = match &b.lengths.data {
            TensorData::I32(v) => v.clone(),
            _ => unreachable!(),
        };
        let mut valid = 0;
        for (row, &len) in lengths.iter().enumerate() {
            for s in 0..16 {
                let y2 = target[(row * 16 + s) * 4 + 3];
                assert_eq!(y2 != 0.0, (s as i32) < len, "row {row} slot {s}");
                valid += (y2 != 0.0) as usize;
            }
        }
        assert_eq!(valid, b.valid_boxes());
        let offs = b.offsets.to_f64();
        assert_eq!(offs[0], 0.0);
        assert_eq!(*offs.last().unwrap() as usize, valid);
        // The seed's distribution: mean of floor(|N(0,3)|) is about 1.9.
        let mean = valid as f64 / 257.0;
        assert!((1.0..3.0).contains(&mean), "mean boxes per image {mean}");
        // Reproducible.
        assert_eq!(generate(257, 16, 7).unwrap().pred, b.pred);
        let p = b.pred.to_f64();
        assert!(p.chunks(4).all(|c| c[0] <= c[2] && c[1] <= c[3]));
    }

    #[test]
    fn bad_sizes_are_errors() {
        assert!(matches!(generate(4, 0, 0), Err(GenError::MaxBoxes(0))));
        assert!(generate(0, 4, 0).unwrap().pred.is_empty());
    }
}
