use kfuse_ir::*;

fn giou_like() -> (GraphBuilder, NodeId, NodeId) {
    let mut b = GraphBuilder::new();
    let bs = b.symbol("B");
    let n = b.symbol("N");
    let shape = Shape(vec![Dim::Sym(bs), Dim::Sym(n), Dim::Const(4)]);
    let pred = b.input("pred", DType::F32, shape.clone()).unwrap();
    let target = b.input("target", DType::F16, shape).unwrap();
    (b, pred, target)
}

#[test]
fn weak_literals_adopt_the_tensor_dtype() {
    let (mut b, _, t) = giou_like();
    let one = b.lit_int(1);
    let y = b.binary(BinaryOp::Sub, one, t).unwrap();
    assert_eq!(b.node(y).dtype, DType::F16);
    let half = b.lit_float(0.5);
    let iota = b.iota(Shape(vec![Dim::Const(3)]), 0).unwrap();
    let z = b.binary(BinaryOp::Mul, iota, half).unwrap();
    assert_eq!(b.node(z).dtype, DType::F32);
}

#[test]
fn mixed_floats_promote_and_ints_cast() {
    let (mut b, p, t) = giou_like();
    let s = b.binary(BinaryOp::Add, p, t).unwrap();
    assert_eq!(b.node(s).dtype, DType::F32);
    let c = b.component(t, 3).unwrap();
    let z = b_zero(&mut b);
    let valid = b.binary(BinaryOp::Ne, c, z).unwrap();
    let cnt = b.reduce(ReduceOp::Count, ReduceAxis::All, valid, None).unwrap();
    assert_eq!(b.node(cnt).dtype, DType::I32);
    let tot = b.reduce(ReduceOp::Sum, ReduceAxis::All, c, Some(valid)).unwrap();
    let q = b.binary(BinaryOp::Div, tot, cnt).unwrap();
    assert_eq!(b.node(q).dtype, DType::F16);
    assert!(matches!(b.node(q).op, Op::Binary(BinaryOp::Div, _, d) if matches!(b.node(d).op, Op::Cast(_))));
    b.output("q", q).unwrap();
    let g = b.finish().unwrap();
    verify(&g).unwrap();
}

fn b_zero(b: &mut GraphBuilder) -> NodeId {
    b.lit_int(0)
}

#[test]
fn type_errors_are_values() {
    let (mut b, p, t) = giou_like();
    let c = b.component(t, 3).unwrap();
    let z = p_zero(&mut b);
    let valid = b.binary(BinaryOp::Ne, c, z).unwrap();
    let pc = b.component(p, 0).unwrap();
    assert!(matches!(b.binary(BinaryOp::Add, valid, pc), Err(IrError::KindMismatch { .. })));
    assert!(matches!(b.component(p, 4), Err(IrError::ComponentOutOfRange { index: 4, size: 4 })));
    assert!(matches!(b.unary(UnaryOp::Exp, valid), Err(IrError::BadDType { .. })));
    let m = b.symbol("M");
    let other = b.input("other", DType::F32, Shape(vec![Dim::Sym(m)])).unwrap();
    assert!(matches!(b.binary(BinaryOp::Add, pc, other), Err(IrError::Broadcast { .. })));
}

fn p_zero(b: &mut GraphBuilder) -> NodeId {
    b.lit_float(0.0)
}

#[test]
fn hash_consing_and_stable_hash() {
    let build = || {
        let (mut b, p, _) = giou_like();
        let x = b.unary(UnaryOp::Exp, p).unwrap();
        let y = b.unary(UnaryOp::Exp, p).unwrap();
        assert_eq!(x, y);
        let s = b.reduce(ReduceOp::Sum, ReduceAxis::All, x, None).unwrap();
        b.output("s", s).unwrap();
        b.finish().unwrap()
    };
    let (g1, g2) = (build(), build());
    assert_eq!(g1.stable_hash(), g2.stable_hash());
    // Pinned: a change here means every cache key changes, so bump the cache format on purpose.
    assert_eq!(g1.stable_hash().short().len(), 16);
    let mut g3 = g1.clone();
    g3.outputs[0].name = "t".into();
    assert_ne!(g1.stable_hash(), g3.stable_hash());
}

#[test]
fn binding_checks_inputs() {
    let (mut b, p, t) = giou_like();
    let s = b.binary(BinaryOp::Add, p, t).unwrap();
    b.output("s", s).unwrap();
    let g = b.finish().unwrap();
    let pred = HostTensor::from_f64(DType::F32, vec![2, 3, 4], &[0.0; 24]);
    let target = HostTensor::from_f64(DType::F16, vec![2, 3, 4], &[0.0; 24]);
    let ok = SymbolBindings::bind(&g, &[("pred", &pred), ("target", &target)]).unwrap();
    assert_eq!(ok.sizes, vec![2, 3]);
    let bad = HostTensor::from_f64(DType::F16, vec![2, 5, 4], &[0.0; 40]);
    let e = SymbolBindings::bind(&g, &[("pred", &pred), ("target", &bad)]).unwrap_err();
    assert_eq!(e.to_string(), "input `target` has N = 5 (axis 1), but `pred` already set N = 3");
    let e = SymbolBindings::bind(&g, &[("pred", &pred)]).unwrap_err();
    assert!(e.to_string().contains("missing input `target`"));
    let e = SymbolBindings::bind(&g, &[("pred", &target), ("target", &target)]).unwrap_err();
    assert!(e.to_string().contains("dtype f16"));
}

#[test]
fn verifier_rejects_a_stack_of_a_missing_list_without_panicking() {
    let (mut b, p, _) = giou_like();
    let c = b.component(p, 0).unwrap();
    let s = b.stack(&[c, c]).unwrap();
    b.output("s", s).unwrap();
    let mut g = b.finish().unwrap();
    g.lists.clear();
    assert!(matches!(verify(&g), Err(IrError::Malformed(_))));
}
