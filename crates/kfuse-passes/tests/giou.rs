//! The seed's GIoU box loss (torchvision semantics, eps 1e-7, intersection clamped at 0, mean over
//! the valid pairs of a padded batch): its gradient w.r.t. `pred` agrees with finite differences,
//! and padded slots get exactly 0 whatever garbage they hold.

mod common;

use common::Problem;
use kfuse_ir::{BinaryOp, NodeId, ReduceAxis, ReduceOp};
use proptest::prelude::*;

const EPS: f64 = 1e-7;

/// Builds `loss = sum(1 - giou, where: valid) / max(count(valid), 1)` over `[B, N, 4]` boxes.
fn giou_loss(p: &mut Problem, pred: NodeId, target: NodeId) -> NodeId {
    let b = &mut p.b;
    let c = |b: &mut kfuse_ir::GraphBuilder, x, i| b.component(x, i).unwrap();
    let bin = |b: &mut kfuse_ir::GraphBuilder, op, x, y| b.binary(op, x, y).unwrap();
    let (p0, p1, p2, p3) = (c(b, pred, 0), c(b, pred, 1), c(b, pred, 2), c(b, pred, 3));
    let (t0, t1, t2, t3) = (c(b, target, 0), c(b, target, 1), c(b, target, 2), c(b, target, 3));
    let zero = b.lit_float(0.0);
    let one = b.lit_float(1.0);
    let eps = b.lit_float(EPS);
    let valid = bin(b, BinaryOp::Ne, t3, zero);
    let ix1 = bin(b, BinaryOp::Max, p0, t0);
    let iy1 = bin(b, BinaryOp::Max, p1, t1);
    let ix2 = bin(b, BinaryOp::Min, p2, t2);
    let iy2 = bin(b, BinaryOp::Min, p3, t3);
    let iw = bin(b, BinaryOp::Sub, ix2, ix1);
    let iw = bin(b, BinaryOp::Max, iw, zero);
    let ih = bin(b, BinaryOp::Sub, iy2, iy1);
    let ih = bin(b, BinaryOp::Max, ih, zero);
    let inter = bin(b, BinaryOp::Mul, iw, ih);
    let pw = bin(b, BinaryOp::Sub, p2, p0);
    let ph = bin(b, BinaryOp::Sub, p3, p1);
    let area1 = bin(b, BinaryOp::Mul, pw, ph);
    let tw = bin(b, BinaryOp::Sub, t2, t0);
    let th = bin(b, BinaryOp::Sub, t3, t1);
    let area2 = bin(b, BinaryOp::Mul, tw, th);
    let union = bin(b, BinaryOp::Add, area1, area2);
    let union = bin(b, BinaryOp::Sub, union, inter);
    let ue = bin(b, BinaryOp::Add, union, eps);
    let iou = bin(b, BinaryOp::Div, inter, ue);
    let cx2 = bin(b, BinaryOp::Max, p2, t2);
    let cx1 = bin(b, BinaryOp::Min, p0, t0);
    let cy2 = bin(b, BinaryOp::Max, p3, t3);
    let cy1 = bin(b, BinaryOp::Min, p1, t1);
    let cw = bin(b, BinaryOp::Sub, cx2, cx1);
    let ch = bin(b, BinaryOp::Sub, cy2, cy1);
    let areac = bin(b, BinaryOp::Mul, cw, ch);
    let gap = bin(b, BinaryOp::Sub, areac, union);
    let ce = bin(b, BinaryOp::Add, areac, eps);
    let frac = bin(b, BinaryOp::Div, gap, ce);
    let giou = bin(b, BinaryOp::Sub, iou, frac);
    let per = bin(b, BinaryOp::Sub, one, giou);
    let total = b.reduce(ReduceOp::Sum, ReduceAxis::All, per, Some(valid)).unwrap();
    let count = b.reduce(ReduceOp::Count, ReduceAxis::All, valid, None).unwrap();
    let one_i = b.lit_int(1);
    let denom = bin(b, BinaryOp::Max, count, one_i);
    bin(b, BinaryOp::Div, total, denom)
}

/// torchvision's `generalized_box_iou_loss` for one pair, written out in plain f64.
fn reference_pair(p: &[f64], t: &[f64]) -> f64 {
    let inter = (p[2].min(t[2]) - p[0].max(t[0])).max(0.0) * (p[3].min(t[3]) - p[1].max(t[1])).max(0.0);
    let union = (p[2] - p[0]) * (p[3] - p[1]) + (t[2] - t[0]) * (t[3] - t[1]) - inter;
    let iou = inter / (union + EPS);
    let areac = (p[2].max(t[2]) - p[0].min(t[0])) * (p[3].max(t[3]) - p[1].min(t[1]));
    1.0 - (iou - (areac - union) / (areac + EPS))
}

/// A batch: `(b, n, pred, target, valid)`, padded slots' target all zero.
type Batch = (usize, usize, Vec<f64>, Vec<f64>, Vec<bool>);

fn batches() -> impl Strategy<Value = Batch> {
    (1usize..3, 1usize..5)
        .prop_flat_map(|(b, n)| {
            let slot = (
                any::<bool>(),
                [0.0f64..8.0, 0.0..8.0, 0.5..4.0, 0.5..4.0],
                [-2.0f64..2.0, -2.0..2.0, 0.5..4.0, 0.5..4.0],
                [-50.0f64..50.0, -50.0..50.0, -50.0..50.0, -50.0..50.0],
            );
            (Just(b), Just(n), proptest::collection::vec(slot, b * n))
        })
        .prop_map(|(b, n, slots)| {
            let (mut pred, mut target, mut valid) = (Vec::new(), Vec::new(), Vec::new());
            for (i, (is_pad, t, d, garbage)) in slots.into_iter().enumerate() {
                // Keep slot 0 valid so that most draws have a loss to differentiate; a padded slot
                // holds a zero target and a finite garbage prediction.
                let pad = is_pad && i > 0;
                valid.push(!pad);
                if pad {
                    target.extend([0.0; 4]);
                    pred.extend(garbage);
                } else {
                    let (x1, y1) = (t[0], t[1]);
                    target.extend([x1, y1, x1 + t[2], y1 + t[3]]);
                    let (px, py) = (x1 + d[0], y1 + d[1]);
                    pred.extend([px, py, px + d[2], py + d[3]]);
                }
            }
            (b, n, pred, target, valid)
        })
}

/// The distance of the valid pairs from every kink of the loss (min/max ties, zero overlap).
fn kink_distance(pred: &[f64], target: &[f64], valid: &[bool]) -> f64 {
    let mut d = f64::INFINITY;
    for (i, _) in valid.iter().enumerate().filter(|(_, v)| **v) {
        let (p, t) = (&pred[4 * i..4 * i + 4], &target[4 * i..4 * i + 4]);
        for k in 0..4 {
            d = d.min((p[k] - t[k]).abs());
        }
        d = d.min((p[2].min(t[2]) - p[0].max(t[0])).abs());
        d = d.min((p[3].min(t[3]) - p[1].max(t[1])).abs());
    }
    d
}

fn problem(b: usize, n: usize, pred: Vec<f64>, target: Vec<f64>) -> (Problem, NodeId) {
    let mut p = Problem::new();
    let pr = p.input("pred", &["B", "N", "4"], &[b, n, 4], pred);
    let tg = p.input("target", &["B", "N", "4"], &[b, n, 4], target);
    let loss = giou_loss(&mut p, pr, tg);
    (p, loss)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn giou_gradient_matches_finite_differences((b, n, pred, target, valid) in batches()) {
        prop_assume!(kink_distance(&pred, &target, &valid) > 1e-3);
        let (p, loss) = problem(b, n, pred.clone(), target.clone());
        // (Not w.r.t. `target`: its y2 decides validity, a jump at the padded slots' 0.)
        let (graph, inputs) = p.graph(loss, &["pred"]);
        // The graph computes torchvision's loss.
        let out = inputs.eval(&graph);
        let got = out.iter().find(|e| e.name == "loss").unwrap().values[0];
        let pairs: Vec<f64> = (0..b * n).filter(|&i| valid[i]).map(|i| reference_pair(&pred[4 * i..4 * i + 4], &target[4 * i..4 * i + 4])).collect();
        let want = pairs.iter().sum::<f64>() / (pairs.len().max(1) as f64);
        prop_assert!((got - want).abs() <= 1e-12 * (1.0 + want.abs()), "loss {got}, torchvision formula {want}");
        common::check_graph(&graph, &inputs, &["pred"]).map_err(TestCaseError::fail)?;
        let dpred = &out.iter().find(|e| e.name == "grad_pred").unwrap().values;
        for (i, _) in valid.iter().enumerate().filter(|(_, v)| !**v) {
            prop_assert!(dpred[4 * i..4 * i + 4].iter().all(|&g| g == 0.0), "padded slot {i} has gradient {:?}", &dpred[4 * i..4 * i + 4]);
        }
    }

    #[test]
    fn padded_slots_get_exact_zeros_even_from_nan_and_inf((b, n, pred, target, valid) in batches()) {
        let (p, loss) = problem(b, n, pred.clone(), target.clone());
        let (graph, inputs) = p.graph(loss, &["pred"]);
        let clean = inputs.eval(&graph);
        let mut dirty_inputs = inputs.clone();
        for (i, _) in valid.iter().enumerate().filter(|(_, v)| !**v) {
            dirty_inputs.0[0].2[4 * i..4 * i + 4].copy_from_slice(&[f64::NAN, f64::INFINITY, f64::NEG_INFINITY, f64::NAN]);
        }
        let dirty = dirty_inputs.eval(&graph);
        for name in ["loss", "grad_pred"] {
            let c = &clean.iter().find(|e| e.name == name).unwrap().values;
            let d = &dirty.iter().find(|e| e.name == name).unwrap().values;
            let same = c.iter().zip(d).all(|(x, y)| x.to_bits() == y.to_bits() || (*x == 0.0 && *y == 0.0));
            prop_assert!(same, "{name} changed when padding became NaN/inf:\nclean {c:?}\ndirty {d:?}");
        }
        let dpred = &dirty.iter().find(|e| e.name == "grad_pred").unwrap().values;
        for (i, _) in valid.iter().enumerate().filter(|(_, v)| !**v) {
            prop_assert!(dpred[4 * i..4 * i + 4].iter().all(|&g| g == 0.0), "padded slot {i}: {:?}", &dpred[4 * i..4 * i + 4]);
        }
    }
}

#[test]
fn an_all_padded_batch_has_zero_loss_and_zero_gradient() {
    let (p, loss) = problem(2, 3, vec![1.5; 24], vec![0.0; 24]);
    let g = p.gradients(loss, &["pred"]);
    assert!(g[0].iter().all(|&v| v == 0.0), "{:?}", g[0]);
}
