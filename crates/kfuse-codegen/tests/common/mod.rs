//! Representative graphs shared by the golden, plan-shape and NVRTC tests, built with
//! `GraphBuilder` exactly as a user would.
#![allow(dead_code)]

use kfuse_ir::{BinaryOp as B, DType, Dim, Graph, GraphBuilder, IrError, NodeId, ReduceAxis, ReduceOp, Shape, UnaryOp};

fn bin(b: &mut GraphBuilder, op: B, x: NodeId, y: NodeId) -> Result<NodeId, IrError> {
    b.binary(op, x, y)
}

/// The GIoU loss of a padded box batch (torchvision's `generalized_box_iou_loss`, eps 1e-7,
/// intersection clamped at 0): a target row whose y2 is 0 is padding.
/// `loss = sum(1 - giou, where: valid) / max(count(valid), 1)`.
pub fn giou(pred_dtype: DType, target_dtype: DType) -> Result<Graph, IrError> {
    let mut b = GraphBuilder::new();
    let bs = b.symbol("B");
    let n = b.symbol("N");
    let shape = Shape(vec![Dim::Sym(bs), Dim::Sym(n), Dim::Const(4)]);
    let pred = b.input("pred", pred_dtype, shape.clone())?;
    let target = b.input("target", target_dtype, shape)?;
    let (x1, y1, x2, y2) = (b.component(pred, 0)?, b.component(pred, 1)?, b.component(pred, 2)?, b.component(pred, 3)?);
    let (x1g, y1g, x2g, y2g) =
        (b.component(target, 0)?, b.component(target, 1)?, b.component(target, 2)?, b.component(target, 3)?);
    let zero = b.lit_float(0.0);
    let valid = bin(&mut b, B::Ne, y2g, zero)?;
    let eps = b.lit_float(1e-7);
    let ix1 = bin(&mut b, B::Max, x1, x1g)?;
    let iy1 = bin(&mut b, B::Max, y1, y1g)?;
    let ix2 = bin(&mut b, B::Min, x2, x2g)?;
    let iy2 = bin(&mut b, B::Min, y2, y2g)?;
    let iw = bin(&mut b, B::Sub, ix2, ix1)?;
    let ih = bin(&mut b, B::Sub, iy2, iy1)?;
    let iw = bin(&mut b, B::Max, iw, zero)?;
    let ih = bin(&mut b, B::Max, ih, zero)?;
    let inter = bin(&mut b, B::Mul, iw, ih)?;
    let w1 = bin(&mut b, B::Sub, x2, x1)?;
    let h1 = bin(&mut b, B::Sub, y2, y1)?;
    let a1 = bin(&mut b, B::Mul, w1, h1)?;
    let w2 = bin(&mut b, B::Sub, x2g, x1g)?;
    let h2 = bin(&mut b, B::Sub, y2g, y1g)?;
    let a2 = bin(&mut b, B::Mul, w2, h2)?;
    let areas = bin(&mut b, B::Add, a1, a2)?;
    let union = bin(&mut b, B::Sub, areas, inter)?;
    let ue = bin(&mut b, B::Add, union, eps)?;
    let iou = bin(&mut b, B::Div, inter, ue)?;
    let cx1 = bin(&mut b, B::Min, x1, x1g)?;
    let cy1 = bin(&mut b, B::Min, y1, y1g)?;
    let cx2 = bin(&mut b, B::Max, x2, x2g)?;
    let cy2 = bin(&mut b, B::Max, y2, y2g)?;
    let cw = bin(&mut b, B::Sub, cx2, cx1)?;
    let ch = bin(&mut b, B::Sub, cy2, cy1)?;
    let area_c = bin(&mut b, B::Mul, cw, ch)?;
    let gap = bin(&mut b, B::Sub, area_c, union)?;
    let ce = bin(&mut b, B::Add, area_c, eps)?;
    let penalty = bin(&mut b, B::Div, gap, ce)?;
    let giou = bin(&mut b, B::Sub, iou, penalty)?;
    let one = b.lit_float(1.0);
    let l = bin(&mut b, B::Sub, one, giou)?;
    let total = b.reduce(ReduceOp::Sum, ReduceAxis::All, l, Some(valid))?;
    let count = b.reduce(ReduceOp::Count, ReduceAxis::All, valid, None)?;
    let one_i = b.lit_int(1);
    let denom = bin(&mut b, B::Max, count, one_i)?;
    let loss = bin(&mut b, B::Div, total, denom)?;
    b.output("loss", loss)?;
    b.finish()
}

/// Softmax cross-entropy along the last axis with integer labels, averaged over the batch:
/// `mean(logsumexp(x) - x[label])`, the label picked with an iota comparison.
pub fn softmax_xent() -> Result<Graph, IrError> {
    let mut b = GraphBuilder::new();
    let bs = b.symbol("B");
    let c = b.symbol("C");
    let x = b.input("logits", DType::F32, Shape(vec![Dim::Sym(bs), Dim::Sym(c)]))?;
    let labels = b.input("labels", DType::I32, Shape(vec![Dim::Sym(bs)]))?;
    let m = b.reduce(ReduceOp::Max, ReduceAxis::Last, x, None)?;
    let m1 = b.expand_last(m);
    let shifted = bin(&mut b, B::Sub, x, m1)?;
    let e = b.unary(UnaryOp::Exp, shifted)?;
    let s = b.reduce(ReduceOp::Sum, ReduceAxis::Last, e, None)?;
    let ls = b.unary(UnaryOp::Log, s)?;
    let lse = bin(&mut b, B::Add, ls, m)?;
    let iota = b.iota(Shape(vec![Dim::Sym(bs), Dim::Sym(c)]), 1)?;
    let l1 = b.expand_last(labels);
    let onehot = bin(&mut b, B::Eq, iota, l1)?;
    let zero = b.lit_float(0.0);
    let picked = b.select(onehot, x, zero)?;
    let picked = b.reduce(ReduceOp::Sum, ReduceAxis::Last, picked, None)?;
    let per_row = bin(&mut b, B::Sub, lse, picked)?;
    let loss = b.reduce(ReduceOp::Mean, ReduceAxis::All, per_row, None)?;
    b.output("loss", loss)?;
    b.finish()
}

/// Plain elementwise tensor outputs over one domain: a broadcast bias, an f16 output, and a
/// `[B, N, 4]` output stored as one vector per element.
pub fn elementwise() -> Result<Graph, IrError> {
    let mut b = GraphBuilder::new();
    let bs = b.symbol("B");
    let n = b.symbol("N");
    let x = b.input("x", DType::F32, Shape(vec![Dim::Sym(bs), Dim::Sym(n)]))?;
    let bias = b.input("bias", DType::F32, Shape(vec![Dim::Sym(n)]))?;
    let boxes = b.input("boxes", DType::F32, Shape(vec![Dim::Sym(bs), Dim::Sym(n), Dim::Const(4)]))?;
    let s = b.unary(UnaryOp::Sigmoid, x)?;
    let two = b.lit_float(2.0);
    let s2 = bin(&mut b, B::Mul, s, two)?;
    let y = bin(&mut b, B::Add, s2, bias)?;
    let y = b.cast(y, DType::F16);
    b.output("y", y)?;
    let half = b.lit_float(0.5);
    let scaled = bin(&mut b, B::Mul, boxes, half)?;
    b.output("scaled", scaled)?;
    b.finish()
}

/// A full reduction feeding element work: `x / sum(x)` (two kernels) plus the sum itself.
pub fn normalize() -> Result<Graph, IrError> {
    let mut b = GraphBuilder::new();
    let n = b.symbol("N");
    let x = b.input("x", DType::F32, Shape(vec![Dim::Sym(n)]))?;
    let s = b.reduce(ReduceOp::Sum, ReduceAxis::All, x, None)?;
    let y = bin(&mut b, B::Div, x, s)?;
    b.output("y", y)?;
    b.output("total", s)?;
    b.finish()
}

/// A masked gradient-like output: `where(valid[.., None], pred - target, 0)` over `[B, N, 4]`,
/// next to the masked count, so both share one predicate branch.
pub fn masked_delta() -> Result<Graph, IrError> {
    let mut b = GraphBuilder::new();
    let bs = b.symbol("B");
    let n = b.symbol("N");
    let shape = Shape(vec![Dim::Sym(bs), Dim::Sym(n), Dim::Const(4)]);
    let pred = b.input("pred", DType::F32, shape.clone())?;
    let target = b.input("target", DType::F32, shape)?;
    let y2 = b.component(target, 3)?;
    let zero = b.lit_float(0.0);
    let valid = bin(&mut b, B::Ne, y2, zero)?;
    let v1 = b.expand_last(valid);
    let d = bin(&mut b, B::Sub, pred, target)?;
    let g = b.select(v1, d, zero)?;
    b.output("delta", g)?;
    let count = b.reduce(ReduceOp::Count, ReduceAxis::All, valid, None)?;
    b.output("count", count)?;
    b.finish()
}

/// The lengths form of `masked_delta`: `valid = iota(N) < lengths[.., None]` (what `mask(lengths)`
/// lowers to), a masked sum and count over it, and `where(valid[.., None], pred - target, 0)`.
pub fn masked_delta_lengths() -> Result<Graph, IrError> {
    let mut b = GraphBuilder::new();
    let bs = b.symbol("B");
    let n = b.symbol("N");
    let shape = Shape(vec![Dim::Sym(bs), Dim::Sym(n), Dim::Const(4)]);
    let pred = b.input("pred", DType::F32, shape.clone())?;
    let target = b.input("target", DType::F32, shape)?;
    let lengths = b.input("lengths", DType::I32, Shape(vec![Dim::Sym(bs)]))?;
    let iota = b.iota(Shape(vec![Dim::Sym(bs), Dim::Sym(n)]), 1)?;
    let l1 = b.expand_last(lengths);
    let valid = bin(&mut b, B::Lt, iota, l1)?;
    let v1 = b.expand_last(valid);
    let zero = b.lit_float(0.0);
    let d = bin(&mut b, B::Sub, pred, target)?;
    let g = b.select(v1, d, zero)?;
    b.output("delta", g)?;
    let x0 = b.component(d, 0)?;
    let s = b.reduce(ReduceOp::Sum, ReduceAxis::All, x0, Some(valid))?;
    let count = b.reduce(ReduceOp::Count, ReduceAxis::All, valid, None)?;
    let mean = bin(&mut b, B::Div, s, count)?;
    b.output("mean_dx", mean)?;
    b.finish()
}

/// A masked mean and its gradient under a lengths mask, the shape of the rows plan (one launch):
/// `grad = where(valid, (pred - target) * (1 / max(count(valid), 1)), 0)` and, when `with_loss`,
/// `loss = sum(pred[.., 0] - target[.., 0], where: valid) / max(count(valid), 1)`. Not in
/// [`all`] (no golden file): the plan-shape and NVRTC tests use it directly.
pub fn lengths_mean_and_gradient(with_loss: bool) -> Result<Graph, IrError> {
    let mut b = GraphBuilder::new();
    let bs = b.symbol("B");
    let n = b.symbol("N");
    let shape = Shape(vec![Dim::Sym(bs), Dim::Sym(n), Dim::Const(4)]);
    let pred = b.input("pred", DType::F32, shape.clone())?;
    let target = b.input("target", DType::F32, shape)?;
    let lengths = b.input("lengths", DType::I32, Shape(vec![Dim::Sym(bs)]))?;
    let iota = b.iota(Shape(vec![Dim::Sym(bs), Dim::Sym(n)]), 1)?;
    let l1 = b.expand_last(lengths);
    let valid = bin(&mut b, B::Lt, iota, l1)?;
    let count = b.reduce(ReduceOp::Count, ReduceAxis::All, valid, None)?;
    let one = b.lit_int(1);
    let denom = bin(&mut b, B::Max, count, one)?;
    let denom = b.cast(denom, DType::F32);
    let d = bin(&mut b, B::Sub, pred, target)?;
    if with_loss {
        let x0 = b.component(d, 0)?;
        let s = b.reduce(ReduceOp::Sum, ReduceAxis::All, x0, Some(valid))?;
        let loss = bin(&mut b, B::Div, s, denom)?;
        b.output("loss", loss)?;
    }
    let unit = b.lit_float(1.0);
    let scale = bin(&mut b, B::Div, unit, denom)?;
    let scaled = bin(&mut b, B::Mul, d, scale)?;
    let v1 = b.expand_last(valid);
    let zero = b.lit_float(0.0);
    let grad = b.select(v1, scaled, zero)?;
    b.output("grad", grad)?;
    b.finish()
}

/// `i64` work: wrapping arithmetic with an `i32` operand, floor division, remainder, shifts,
/// clamp and casts, component reads of an `[.., 2]` pair (a `longlong2` load), a row sum, and a
/// full sum used again by element work (an `i64` scalar crossing kernels).
pub fn int64() -> Result<Graph, IrError> {
    let mut b = GraphBuilder::new();
    let bs = b.symbol("B");
    let n = b.symbol("N");
    let x = b.input("x", DType::I64, Shape(vec![Dim::Sym(bs), Dim::Sym(n)]))?;
    let k = b.input("k", DType::I32, Shape(vec![Dim::Sym(n)]))?;
    let pairs = b.input("pairs", DType::I64, Shape(vec![Dim::Sym(bs), Dim::Const(2)]))?;
    let xk = bin(&mut b, B::Mul, x, k)?;
    let three = b.lit_int(3);
    let q = bin(&mut b, B::FloorDiv, xk, three)?;
    let five = b.lit_int(5);
    let r = bin(&mut b, B::Remainder, x, five)?;
    let one = b.lit_int(1);
    let shl = bin(&mut b, B::Shl, q, one)?;
    let y = bin(&mut b, B::Add, shl, r)?;
    let (lo, hi) = (b.lit_int(-1000), b.lit_int(1000));
    let y = b.clamp(y, lo, hi)?;
    b.output("y", y)?;
    let half = b.lit_float(0.5);
    let f = bin(&mut b, B::Mul, x, half)?;
    b.output("half", f)?;
    let p0 = b.component(pairs, 0)?;
    let p1 = b.component(pairs, 1)?;
    let two = b.lit_int(2);
    let p = bin(&mut b, B::Shr, p1, two)?;
    let p = bin(&mut b, B::Sub, p0, p)?;
    let p = b.unary(UnaryOp::Abs, p)?;
    b.output("pair", p)?;
    let rows = b.reduce(ReduceOp::Sum, ReduceAxis::Last, x, None)?;
    b.output("rows", rows)?;
    let total = b.reduce(ReduceOp::Sum, ReduceAxis::All, x, None)?;
    let centred = bin(&mut b, B::Sub, x, total)?;
    let narrow = b.cast(centred, DType::I32);
    b.output("centred", narrow)?;
    b.finish()
}

/// Gathers: along the last axis of a computed source with three indices a row (the index read
/// as one vector, components of the result), along the first axis of a bf16 source with `i32`
/// indices, of a bool source, and into a full sum.
pub fn gather() -> Result<Graph, IrError> {
    let mut b = GraphBuilder::new();
    let (bs, c, k) = (b.symbol("B"), b.symbol("C"), b.symbol("K"));
    let x = b.input("x", DType::F32, Shape(vec![Dim::Sym(bs), Dim::Sym(c)]))?;
    let h = b.input("h", DType::BF16, Shape(vec![Dim::Sym(bs), Dim::Sym(c)]))?;
    let idx = b.input("idx", DType::I64, Shape(vec![Dim::Sym(bs), Dim::Const(3)]))?;
    let rows = b.input("rows", DType::I32, Shape(vec![Dim::Sym(k), Dim::Sym(c)]))?;
    let xh = bin(&mut b, B::Mul, x, h)?;
    let one = b.lit_float(1.0);
    let src = bin(&mut b, B::Add, xh, one)?;
    let picked = b.gather(src, idx, -1)?;
    b.output("picked", picked)?;
    let e = b.unary(UnaryOp::Exp, h)?;
    let e = b.cast(e, DType::BF16);
    let by_rows = b.gather(e, rows, 0)?;
    b.output("by_rows", by_rows)?;
    let zero = b.lit_float(0.0);
    let neg = bin(&mut b, B::Lt, x, zero)?;
    let negative = b.gather(neg, idx, 1)?;
    b.output("negative", negative)?;
    let gx = b.gather(x, idx, -1)?;
    let total = b.reduce(ReduceOp::Sum, ReduceAxis::All, gx, None)?;
    b.output("total", total)?;
    b.finish()
}

/// Every representative graph, by name.
pub fn all() -> Vec<(&'static str, Graph)> {
    let mut v = Vec::new();
    let mut add = |name: &'static str, g: Result<Graph, IrError>| match g {
        Ok(g) => v.push((name, g)),
        Err(e) => panic!("test graph {name} does not build: {e}"),
    };
    add("giou_f32", giou(DType::F32, DType::F32));
    add("giou_f16", giou(DType::F16, DType::F16));
    add("giou_bf16", giou(DType::BF16, DType::BF16));
    add("softmax_xent", softmax_xent());
    add("elementwise", elementwise());
    add("normalize", normalize());
    add("masked_delta", masked_delta());
    add("masked_delta_lengths", masked_delta_lengths());
    add("int64", int64());
    add("gather", gather());
    v
}
