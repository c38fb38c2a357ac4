//! The example programs compute what their comments promise: each is evaluated by the CPU
//! interpreter and compared with an independent f64 transcription of the PyTorch/torchvision
//! formula it cites, on pseudo-random data with padding rows, disjoint boxes and an empty batch.

use kfuse_lang::parse_program;

/// A small deterministic generator (xorshift), so the test needs no seed plumbing.
struct Rng(u64);
impl Rng {
    fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        lo + (hi - lo) * ((self.0 >> 11) as f64 / (1u64 << 53) as f64)
    }
}

/// Evaluates `src`'s one scalar output on f64 inputs `(name, shape, values)`.
fn loss(src: &str, file: &str, inputs: &[(&str, Vec<usize>, Vec<f64>)]) -> f64 {
    let g = parse_program(src, file).unwrap_or_else(|d| panic!("{d}"));
    let out = kfuse_interp::evaluate_f64(&g, inputs).unwrap_or_else(|e| panic!("{file}: {e}"));
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].values.len(), 1);
    out[0].values[0]
}

fn assert_close(got: f64, want: f64, what: &str) {
    assert!((got - want).abs() <= 1e-9 * (1.0 + want.abs()), "{what}: got {got}, want {want}");
}

/// `n` boxes (x1, y1, x2, y2) with positive width and height; every third target row is padding.
fn boxes(rng: &mut Rng, n: usize, pad_targets: bool) -> Vec<f64> {
    let mut v = Vec::new();
    for i in 0..n {
        let (x, y) = (rng.uniform(0.0, 10.0), rng.uniform(0.0, 10.0));
        let (w, h) = (rng.uniform(0.1, 4.0), rng.uniform(0.1, 4.0));
        if pad_targets && i % 3 == 2 {
            v.extend([0.0; 4]);
        } else {
            v.extend([x, y, x + w, y + h]);
        }
    }
    v
}

/// torchvision `generalized_box_iou_loss` for one pair (its masked-intersection form).
fn giou_loss_ref(p: &[f64], t: &[f64]) -> f64 {
    let eps = 1e-7;
    let (xk1, yk1) = (p[0].max(t[0]), p[1].max(t[1]));
    let (xk2, yk2) = (p[2].min(t[2]), p[3].min(t[3]));
    let inter = if yk2 > yk1 && xk2 > xk1 { (xk2 - xk1) * (yk2 - yk1) } else { 0.0 };
    let union = (p[2] - p[0]) * (p[3] - p[1]) + (t[2] - t[0]) * (t[3] - t[1]) - inter;
    let iou = inter / (union + eps);
    let area_c = (p[2].max(t[2]) - p[0].min(t[0])) * (p[3].max(t[3]) - p[1].min(t[1]));
    1.0 - (iou - (area_c - union) / (area_c + eps))
}

#[test]
fn giou_is_torchvisions_loss_averaged_over_valid_boxes() {
    let src = include_str!("../../../examples/giou.kf");
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    for (b, n) in [(1, 1), (2, 3), (3, 7)] {
        let pred = boxes(&mut rng, b * n, false);
        let target = boxes(&mut rng, b * n, true);
        let pairs: Vec<(&[f64], &[f64])> = pred.chunks(4).zip(target.chunks(4)).filter(|(_, t)| t[3] != 0.0).collect();
        let want = if pairs.is_empty() {
            0.0
        } else {
            pairs.iter().map(|(p, t)| giou_loss_ref(p, t)).sum::<f64>() / pairs.len() as f64
        };
        let got = loss(src, "giou.kf", &[("pred", vec![b, n, 4], pred.clone()), ("target", vec![b, n, 4], target)]);
        assert_close(got, want, &format!("giou B={b} N={n}"));
    }
    // Disjoint boxes: no overlap (not a negative one), so the loss exceeds 1.
    let (p, t) = (vec![0.0, 0.0, 1.0, 1.0], vec![2.0, 2.0, 3.0, 3.0]);
    let got = loss(src, "giou.kf", &[("pred", vec![1, 1, 4], p.clone()), ("target", vec![1, 1, 4], t.clone())]);
    assert_close(got, giou_loss_ref(&p, &t), "disjoint");
    assert!(got > 1.0);
    // Only padding: 0, not NaN.
    let got = loss(src, "giou.kf", &[("pred", vec![1, 2, 4], vec![1.0; 8]), ("target", vec![1, 2, 4], vec![0.0; 8])]);
    assert_eq!(got, 0.0);
}

#[test]
fn smooth_l1_is_torchs_loss_over_the_coordinates_of_valid_boxes() {
    let src = include_str!("../../../examples/smooth_l1.kf");
    let mut rng = Rng(7);
    let (b, n) = (2, 5);
    let target = boxes(&mut rng, b * n, true);
    // Predictions near the targets, so that both sides of beta = 1 occur.
    let pred: Vec<f64> = target.iter().map(|t| t + rng.uniform(-2.0, 2.0)).collect();
    let mut terms = Vec::new();
    for (p, t) in pred.chunks(4).zip(target.chunks(4)).filter(|(_, t)| t[3] != 0.0) {
        for k in 0..4 {
            let d: f64 = p[k] - t[k];
            terms.push(if d.abs() < 1.0 { 0.5 * d * d } else { d.abs() - 0.5 });
        }
    }
    let want = terms.iter().sum::<f64>() / terms.len() as f64;
    assert!(terms.iter().any(|&x| x < 0.5) && terms.iter().any(|&x| x > 0.5), "both branches are exercised");
    let got = loss(src, "smooth_l1.kf", &[("pred", vec![b, n, 4], pred), ("target", vec![b, n, 4], target)]);
    assert_close(got, want, "smooth_l1");
}

#[test]
fn focal_is_torchvisions_sigmoid_focal_loss() {
    let src = include_str!("../../../examples/focal.kf");
    let mut rng = Rng(11);
    let (b, c) = (3, 5);
    let logits: Vec<f64> = (0..b * c).map(|_| rng.uniform(-30.0, 30.0)).collect();
    let targets: Vec<f64> = (0..b * c).map(|_| if rng.uniform(0.0, 1.0) < 0.3 { 1.0 } else { 0.0 }).collect();
    let want = logits
        .iter()
        .zip(&targets)
        .map(|(&x, &t)| {
            let p = 1.0 / (1.0 + (-x).exp());
            let ce = -(t * p.ln() + (1.0 - t) * (1.0 - p).ln());
            let p_t = p * t + (1.0 - p) * (1.0 - t);
            let alpha_t = 0.25 * t + 0.75 * (1.0 - t);
            alpha_t * ce * (1.0 - p_t).powi(2)
        })
        .sum::<f64>()
        / (b * c) as f64;
    let got = loss(src, "focal.kf", &[("logits", vec![b, c], logits), ("targets", vec![b, c], targets)]);
    // The naive reference loses precision where p rounds to 1; a relative 1e-6 is still tight.
    assert!((got - want).abs() <= 1e-6 * want.abs().max(1e-12), "focal: got {got}, want {want}");
}

#[test]
fn softmax_xent_is_torchs_cross_entropy_and_survives_large_logits() {
    let src = include_str!("../../../examples/softmax_xent.kf");
    let mut rng = Rng(5);
    let (b, c) = (4, 6);
    let logits: Vec<f64> = (0..b * c).map(|_| rng.uniform(-5.0, 5.0)).collect();
    let mut targets = vec![0.0; b * c];
    for row in 0..b {
        targets[row * c + (row * 7 + 3) % c] = 1.0;
    }
    let want = (0..b)
        .map(|row| {
            let x = &logits[row * c..(row + 1) * c];
            let z: f64 = x.iter().map(|v| v.exp()).sum();
            let label = (row * 7 + 3) % c;
            -(x[label].exp() / z).ln()
        })
        .sum::<f64>()
        / b as f64;
    let got = loss(
        src,
        "softmax_xent.kf",
        &[("logits", vec![b, c], logits.clone()), ("targets", vec![b, c], targets.clone())],
    );
    assert_close(got, want, "softmax_xent");
    // Shifting every logit by 1000 would overflow exp without the max subtraction.
    let shifted: Vec<f64> = logits.iter().map(|v| v + 1000.0).collect();
    let got = loss(src, "softmax_xent.kf", &[("logits", vec![b, c], shifted), ("targets", vec![b, c], targets)]);
    assert!((got - want).abs() < 1e-9, "shifted: got {got}, want {want}");
}
