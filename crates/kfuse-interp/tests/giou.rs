//! The seed's GIoU loss through the interpreter, against an independent plain-Rust f64 version of
//! torchvision's `generalized_box_iou_loss` and against hand-derived values.

mod common;

use common::giou::{giou_graph, EPS};
use common::*;
use kfuse_interp::evaluate;
use kfuse_ir::DType;

/// torchvision's `generalized_box_iou_loss` (reduction "none") for one pair, written from its
/// definition: the intersection is kept only where both overlap extents are positive.
fn torchvision_giou_loss(p: [f64; 4], g: [f64; 4]) -> f64 {
    let [x1, y1, x2, y2] = p;
    let [x1g, y1g, x2g, y2g] = g;
    let area_1 = (x2 - x1) * (y2 - y1);
    let area_2 = (x2g - x1g) * (y2g - y1g);
    let (xkis1, ykis1) = (x1.max(x1g), y1.max(y1g));
    let (xkis2, ykis2) = (x2.min(x2g), y2.min(y2g));
    let intsct = if ykis2 > ykis1 && xkis2 > xkis1 { (xkis2 - xkis1) * (ykis2 - ykis1) } else { 0.0 };
    let union = area_1 + area_2 - intsct;
    let iou = intsct / (union + EPS);
    let (xc1, yc1) = (x1.min(x1g), y1.min(y1g));
    let (xc2, yc2) = (x2.max(x2g), y2.max(y2g));
    let area_c = (xc2 - xc1) * (yc2 - yc1);
    let miou = iou - (area_c - union) / (area_c + EPS);
    1.0 - miou
}

/// (name, pred, target, hand-derived 1 - GIoU ignoring eps).
const CASES: [(&str, [f64; 4], [f64; 4], f64); 5] = [
    // No overlap; union 2, enclosing box [0,0,3,3] of area 9: GIoU = 0 - 7/9.
    ("disjoint", [0.0, 0.0, 1.0, 1.0], [2.0, 2.0, 3.0, 3.0], 1.0 + 7.0 / 9.0),
    // Target inside pred: IoU 1/16, the enclosing box is pred itself.
    ("nested", [0.0, 0.0, 4.0, 4.0], [1.0, 1.0, 2.0, 2.0], 1.0 - 1.0 / 16.0),
    ("identical", [0.5, 1.0, 2.5, 3.0], [0.5, 1.0, 2.5, 3.0], 0.0),
    // Sharing an edge: no intersection, and the enclosing box is exactly the union.
    ("touching", [0.0, 0.0, 1.0, 1.0], [1.0, 0.0, 2.0, 1.0], 1.0),
    // Overlap 1, union 7, enclosing 9.
    ("partial", [0.0, 0.0, 2.0, 2.0], [1.0, 1.0, 3.0, 3.0], 1.0 - (1.0 / 7.0 - 2.0 / 9.0)),
];

#[test]
fn giou_matches_torchvision_and_hand_values_on_five_pairs() {
    let g = giou_graph().unwrap();
    let pred: Vec<f64> = CASES.iter().flat_map(|c| c.1).collect();
    let target: Vec<f64> = CASES.iter().flat_map(|c| c.2).collect();
    // As one batch row of five boxes, and as five rows of one box: same answers.
    for dims in [[1, 5, 4], [5, 1, 4]] {
        let (p, tt) = (t(DType::F32, &dims, &pred), t(DType::F32, &dims, &target));
        let outs = evaluate(&g, &[("pred", &p), ("target", &tt)]).unwrap();
        let per_box = &outs[0];
        assert_eq!(per_box.shape, dims[..2].to_vec());
        for (i, (name, pb, tb, hand)) in CASES.iter().enumerate() {
            let reference = torchvision_giou_loss(*pb, *tb);
            let got = per_box.values[i];
            assert!((got - reference).abs() <= 1e-12, "{name}: interpreter {got}, torchvision formula {reference}");
            assert!((got - hand).abs() <= 1e-6, "{name}: interpreter {got}, hand value {hand}");
        }
        let mean: f64 = CASES.iter().map(|c| torchvision_giou_loss(c.1, c.2)).sum::<f64>() / 5.0;
        assert!((outs[1].values[0] - mean).abs() <= 1e-12, "loss {} vs {mean}", outs[1].values[0]);
    }
}

#[test]
fn padded_rows_are_left_out_of_the_loss_even_when_nan() {
    let g = giou_graph().unwrap();
    // Row 0: the "partial" pair then padding (target all zero) with a NaN prediction; row 1: all
    // padding. Only one box is valid.
    let mut pred = vec![0.0, 0.0, 2.0, 2.0, f64::NAN, 0.0, 1.0, 1.0];
    pred.extend([0.0; 8]);
    let mut target = vec![1.0, 1.0, 3.0, 3.0];
    target.extend([0.0; 12]);
    let (p, tt) = (t(DType::F32, &[2, 2, 4], &pred), t(DType::F32, &[2, 2, 4], &target));
    let outs = evaluate(&g, &[("pred", &p), ("target", &tt)]).unwrap();
    assert!(outs[0].values[1].is_nan(), "the padded slot itself is NaN");
    let want = torchvision_giou_loss([0.0, 0.0, 2.0, 2.0], [1.0, 1.0, 3.0, 3.0]);
    assert!((outs[1].values[0] - want).abs() <= 1e-12, "loss {} vs {want}", outs[1].values[0]);

    // An empty batch: no valid box, loss 0 / max(0, 1) = 0.
    let (p, tt) = (t(DType::F32, &[0, 3, 4], &[]), t(DType::F32, &[0, 3, 4], &[]));
    let outs = evaluate(&g, &[("pred", &p), ("target", &tt)]).unwrap();
    assert!(outs[0].values.is_empty());
    assert_same(&outs[1].values, &[0.0]);
}
