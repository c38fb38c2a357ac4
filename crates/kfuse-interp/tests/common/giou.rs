//! The seed's GIoU loss as a kfuse graph built with the Rust builder (shared by the GIoU test and
//! the speed example). Boxes are `[x1, y1, x2, y2]`; a target row with `y2 == 0` is padding.

use kfuse_ir::{BinaryOp, DType, Dim, Graph, GraphBuilder, IrError, ReduceAxis, ReduceOp, Shape};

/// torchvision's epsilon in `generalized_box_iou_loss`.
pub const EPS: f64 = 1e-7;

/// Inputs `pred`, `target`: f32[B, N, 4]. Outputs `per_box` (1 - GIoU, f32[B, N]) and `loss`
/// (the mean of `per_box` over valid boxes, `sum(.., where: valid) / max(count(valid), 1)`).
pub fn giou_graph() -> Result<Graph, IrError> {
    let mut b = GraphBuilder::new();
    let (bs, ns) = (Dim::Sym(b.symbol("B")), Dim::Sym(b.symbol("N")));
    let box_shape = Shape(vec![bs, ns, Dim::Const(4)]);
    let pred = b.input("pred", DType::F32, box_shape.clone())?;
    let target = b.input("target", DType::F32, box_shape)?;
    let mut comps = |x| -> Result<Vec<_>, IrError> { (0..4).map(|i| b.component(x, i)).collect() };
    let p = comps(pred)?;
    let g = comps(target)?;
    let bin = |b: &mut GraphBuilder, op, x, y| b.binary(op, x, y);
    use BinaryOp::*;
    let area = |b: &mut GraphBuilder, q: &[_]| -> Result<_, IrError> {
        let w = bin(b, Sub, q[2], q[0])?;
        let h = bin(b, Sub, q[3], q[1])?;
        bin(b, Mul, w, h)
    };
    let area_p = area(&mut b, &p)?;
    let area_g = area(&mut b, &g)?;
    let ix1 = bin(&mut b, Max, p[0], g[0])?;
    let iy1 = bin(&mut b, Max, p[1], g[1])?;
    let ix2 = bin(&mut b, Min, p[2], g[2])?;
    let iy2 = bin(&mut b, Min, p[3], g[3])?;
    let zero = b.lit_float(0.0);
    let iw = bin(&mut b, Sub, ix2, ix1)?;
    let iw = bin(&mut b, Max, iw, zero)?;
    let ih = bin(&mut b, Sub, iy2, iy1)?;
    let ih = bin(&mut b, Max, ih, zero)?;
    let inter = bin(&mut b, Mul, iw, ih)?;
    let sum_areas = bin(&mut b, Add, area_p, area_g)?;
    let union = bin(&mut b, Sub, sum_areas, inter)?;
    let eps = b.lit_float(EPS);
    let union_eps = bin(&mut b, Add, union, eps)?;
    let iou = bin(&mut b, Div, inter, union_eps)?;
    let cx1 = bin(&mut b, Min, p[0], g[0])?;
    let cy1 = bin(&mut b, Min, p[1], g[1])?;
    let cx2 = bin(&mut b, Max, p[2], g[2])?;
    let cy2 = bin(&mut b, Max, p[3], g[3])?;
    let cw = bin(&mut b, Sub, cx2, cx1)?;
    let ch = bin(&mut b, Sub, cy2, cy1)?;
    let area_c = bin(&mut b, Mul, cw, ch)?;
    let extra = bin(&mut b, Sub, area_c, union)?;
    let area_c_eps = bin(&mut b, Add, area_c, eps)?;
    let penalty = bin(&mut b, Div, extra, area_c_eps)?;
    let giou = bin(&mut b, Sub, iou, penalty)?;
    let one = b.lit_float(1.0);
    let per_box = bin(&mut b, Sub, one, giou)?;
    let valid = bin(&mut b, Ne, g[3], zero)?;
    let total = b.reduce(ReduceOp::Sum, ReduceAxis::All, per_box, Some(valid))?;
    let count = b.reduce(ReduceOp::Count, ReduceAxis::All, valid, None)?;
    let one_i = b.lit_int(1);
    let denom = bin(&mut b, Max, count, one_i)?;
    let loss = bin(&mut b, Div, total, denom)?;
    b.output("per_box", per_box)?;
    b.output("loss", loss)?;
    b.finish()
}
