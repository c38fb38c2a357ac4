//! Ragged-layout constraints: the builder and verifier accept them only on `i32` inputs (rank 1
//! for offsets), they print and hash, survive dead-node pruning, and `SymbolBindings::bind`
//! refuses bad lengths/offsets with messages that name the input and the bad position.

use kfuse_ir::*;

/// `lengths: i32[B] as lengths(N)`, `x: f32[B, N]`, output `sum(x)`.
fn lengths_graph() -> Graph {
    let mut b = GraphBuilder::new();
    let (bs, n) = (b.symbol("B"), b.symbol("N"));
    b.input("lengths", DType::I32, Shape(vec![Dim::Sym(bs)])).unwrap();
    let x = b.input("x", DType::F32, Shape(vec![Dim::Sym(bs), Dim::Sym(n)])).unwrap();
    b.constrain(Constraint::Lengths { input: InputId(0), max: Dim::Sym(n) }).unwrap();
    let s = b.reduce(ReduceOp::Sum, ReduceAxis::All, x, None).unwrap();
    b.output("s", s).unwrap();
    b.finish().unwrap()
}

/// `offsets: i32[S] as offsets(T)`, `x: f32[T, 4]`, output `sum(x)`.
fn offsets_graph() -> Graph {
    let mut b = GraphBuilder::new();
    let (s, t) = (b.symbol("S"), b.symbol("T"));
    b.input("offsets", DType::I32, Shape(vec![Dim::Sym(s)])).unwrap();
    let x = b.input("x", DType::F32, Shape(vec![Dim::Sym(t), Dim::Const(4)])).unwrap();
    b.constrain(Constraint::Offsets { input: InputId(0), total: Dim::Sym(t) }).unwrap();
    let r = b.reduce(ReduceOp::Sum, ReduceAxis::All, x, None).unwrap();
    b.output("s", r).unwrap();
    b.finish().unwrap()
}

fn i32s(v: &[i32]) -> HostTensor {
    HostTensor::new(vec![v.len()], TensorData::I32(v.to_vec()))
}

fn zeros(shape: Vec<usize>) -> HostTensor {
    let n = shape.iter().product();
    HostTensor::new(shape, TensorData::F32(vec![0.0; n]))
}

fn bind_lengths(lengths: &[i32], n: usize) -> Result<SymbolBindings, BindError> {
    let g = lengths_graph();
    let (l, x) = (i32s(lengths), zeros(vec![lengths.len(), n]));
    SymbolBindings::bind(&g, &[("lengths", &l), ("x", &x)])
}

fn bind_offsets(offsets: &[i32], t: usize) -> Result<SymbolBindings, BindError> {
    let g = offsets_graph();
    let (o, x) = (i32s(offsets), zeros(vec![t, 4]));
    SymbolBindings::bind(&g, &[("offsets", &o), ("x", &x)])
}

fn message(r: Result<SymbolBindings, BindError>) -> String {
    match r {
        Ok(b) => panic!("expected a bind error, got sizes {:?}", b.sizes),
        Err(e) => e.to_string(),
    }
}

#[test]
fn constraints_print_hash_and_survive_pruning() {
    let g = lengths_graph();
    assert_eq!(g.constraints, vec![Constraint::Lengths { input: InputId(0), max: Dim::Sym(SymId(1)) }]);
    let text = g.to_string();
    assert!(text.contains("constraint in0 lengths as lengths(N)\n"), "{text}");
    let mut plain = g.clone();
    plain.constraints.clear();
    assert_ne!(g.stable_hash(), plain.stable_hash());
    let mut offsets = g.clone();
    offsets.constraints = vec![Constraint::Offsets { input: InputId(0), total: Dim::Sym(SymId(1)) }];
    assert_ne!(g.stable_hash(), offsets.stable_hash());
    verify(&g).unwrap();
    let text = offsets_graph().to_string();
    assert!(text.contains("constraint in0 offsets as offsets(T)\n"), "{text}");
}

#[test]
fn only_i32_inputs_take_a_layout_and_offsets_need_rank_1() {
    let mut b = GraphBuilder::new();
    let (bs, n) = (b.symbol("B"), b.symbol("N"));
    b.input("f", DType::F32, Shape(vec![Dim::Sym(bs)])).unwrap();
    b.input("m", DType::I32, Shape(vec![Dim::Sym(bs), Dim::Sym(n)])).unwrap();
    let err = b.constrain(Constraint::Lengths { input: InputId(0), max: Dim::Sym(n) }).unwrap_err();
    assert_eq!(err.to_string(), "input `f` cannot be declared as lengths: it is f32, and lengths must be i32");
    let err = b.constrain(Constraint::Offsets { input: InputId(1), total: Dim::Sym(n) }).unwrap_err();
    assert!(err.to_string().contains("it has shape [B, N], and offsets must have one axis"), "{err}");
    // A [B, N] lengths tensor is fine (lengths[b, n] <= 7); a second layout is not.
    b.constrain(Constraint::Lengths { input: InputId(1), max: Dim::Const(7) }).unwrap();
    let err = b.constrain(Constraint::Lengths { input: InputId(1), max: Dim::Sym(n) }).unwrap_err();
    assert!(err.to_string().contains("already has a layout"), "{err}");
    let err = b.constrain(Constraint::Lengths { input: InputId(5), max: Dim::Sym(n) }).unwrap_err();
    assert!(matches!(err, IrError::Malformed(_)), "{err}");
    let err = b.constrain(Constraint::Lengths { input: InputId(1), max: Dim::Sym(SymId(9)) }).unwrap_err();
    assert!(matches!(err, IrError::UnknownSymbol(_)), "{err}");
}

#[test]
fn the_verifier_checks_hand_edited_constraints() {
    let mut g = lengths_graph();
    g.constraints.push(Constraint::Lengths { input: InputId(1), max: Dim::Const(3) });
    assert!(verify(&g).unwrap_err().to_string().contains("it is f32"));
    let mut g = lengths_graph();
    g.constraints.push(g.constraints[0]);
    assert!(verify(&g).unwrap_err().to_string().contains("already has a layout"));
}

#[test]
fn good_lengths_bind_including_empty_and_full_rows() {
    let b = bind_lengths(&[0, 3, 5, 5], 5).unwrap();
    assert_eq!(b.sizes, vec![4, 5]);
    bind_lengths(&[], 5).unwrap();
    bind_lengths(&[0, 0], 0).unwrap();
}

#[test]
fn bad_lengths_name_the_input_and_position() {
    assert_eq!(
        message(bind_lengths(&[1, 2, 3, 300], 256)),
        "input `lengths`: lengths[3] = 300 is greater than N = 256"
    );
    assert_eq!(
        message(bind_lengths(&[-1, 2], 4)),
        "input `lengths`: lengths[0] = -1 is negative (a length counts valid rows, from 0)"
    );
    assert!(matches!(bind_lengths(&[1], 0), Err(BindError::LengthTooLarge { max: 0, .. })));
    // A [B, K] lengths tensor reports both coordinates, and a constant bound its value.
    let mut b = GraphBuilder::new();
    let (bs, k) = (b.symbol("B"), b.symbol("K"));
    let l = b.input("lens", DType::I32, Shape(vec![Dim::Sym(bs), Dim::Sym(k)])).unwrap();
    b.constrain(Constraint::Lengths { input: InputId(0), max: Dim::Const(4) }).unwrap();
    b.output("l", l).unwrap();
    let g = b.finish().unwrap();
    let t = HostTensor::new(vec![2, 3], TensorData::I32(vec![0, 1, 2, 3, 5, 4]));
    let e = SymbolBindings::bind(&g, &[("lens", &t)]).unwrap_err();
    assert_eq!(e.to_string(), "input `lens`: lens[1, 1] = 5 is greater than 4 = 4");
}

#[test]
fn good_offsets_bind_including_empty_segments() {
    assert_eq!(bind_offsets(&[0, 3, 3, 7], 7).unwrap().sizes, vec![4, 7]);
    bind_offsets(&[0], 0).unwrap();
    bind_offsets(&[0, 0, 0], 0).unwrap();
}

#[test]
fn bad_offsets_name_the_input_and_position() {
    assert_eq!(
        message(bind_offsets(&[0, 1, 2, 5, 12, 10, 94], 94)),
        "input `offsets`: offsets[5] = 10 is less than offsets[4] = 12 (offsets must not decrease)"
    );
    assert_eq!(message(bind_offsets(&[2, 5, 94], 94)), "input `offsets`: offsets[0] = 2, but must be 0");
    assert_eq!(
        message(bind_offsets(&[0, 10, 20, 30, 40, 50, 60, 70, 90], 94)),
        "input `offsets`: the last offset offsets[8] = 90 must equal T = 94"
    );
    assert_eq!(
        message(bind_offsets(&[0, 10, 20, 120, 130], 94)),
        "input `offsets`: offsets[3] = 120 is past the end (T = 94)"
    );
    assert!(matches!(bind_offsets(&[], 0), Err(BindError::OffsetsEmpty { .. })));
    assert!(matches!(bind_offsets(&[0, -3, 0], 0), Err(BindError::OffsetDecrease { index: 1, .. })));
    assert!(matches!(bind_offsets(&[0, 5], 4), Err(BindError::OffsetPastEnd { index: 1, total: 4, .. })));
}
