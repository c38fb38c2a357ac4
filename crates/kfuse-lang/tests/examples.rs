//! The example programs in `examples/` parse, type-check, and have the expected signatures; the
//! GIoU graph is pinned by a golden test (`UPDATE_EXPECT=1 cargo test -p kfuse-lang` refreshes it).

use kfuse_ir::{DType, Dim, Graph};
use kfuse_lang::parse_program;

const GIOU: &str = include_str!("../../../examples/giou.kf");
const SMOOTH_L1: &str = include_str!("../../../examples/smooth_l1.kf");
const FOCAL: &str = include_str!("../../../examples/focal.kf");
const SOFTMAX_XENT: &str = include_str!("../../../examples/softmax_xent.kf");

fn parse(src: &str, name: &str) -> Graph {
    match parse_program(src, name) {
        Ok(g) => g,
        Err(d) => panic!("{name} does not parse:\n{d}"),
    }
}

/// Inputs as `name: dtype[dims]` strings and the one scalar f32 output named `loss`.
fn assert_signature(g: &Graph, inputs: &[&str]) {
    let got: Vec<String> =
        g.inputs.iter().map(|i| format!("{}: {}{}", i.name, i.dtype, g.shape_str(&i.shape))).collect();
    assert_eq!(got, inputs);
    assert_eq!(g.outputs.len(), 1);
    let out = g.node(g.outputs[0].node);
    assert_eq!(g.outputs[0].name, "loss");
    assert_eq!((out.dtype, out.shape.is_scalar()), (DType::F32, true));
    kfuse_ir::verify(g).unwrap_or_else(|e| panic!("verifier: {e}"));
}

#[test]
fn every_example_parses_and_has_a_scalar_loss() {
    let boxes = ["pred: f32[B, N, 4]", "target: f32[B, N, 4]"];
    let scores = ["logits: f32[B, C]", "targets: f32[B, C]"];
    assert_signature(&parse(GIOU, "examples/giou.kf"), &boxes);
    assert_signature(&parse(SMOOTH_L1, "examples/smooth_l1.kf"), &boxes);
    assert_signature(&parse(FOCAL, "examples/focal.kf"), &scores);
    assert_signature(&parse(SOFTMAX_XENT, "examples/softmax_xent.kf"), &scores);
}

#[test]
fn examples_use_the_last_axis_reductions_and_masks_they_document() {
    let g = parse(SOFTMAX_XENT, "examples/softmax_xent.kf");
    let last_axis = g
        .nodes
        .iter()
        .filter(|n| matches!(n.op, kfuse_ir::Op::Reduce { axis: kfuse_ir::ReduceAxis::Last, .. }))
        .count();
    assert_eq!(last_axis, 3, "max, sum(exp), sum(targets * log_probs)");
    let g = parse(SMOOTH_L1, "examples/smooth_l1.kf");
    let mask_shapes: Vec<String> = g
        .nodes
        .iter()
        .filter_map(|n| match n.op {
            kfuse_ir::Op::Reduce { mask: Some(m), .. } => Some(g.shape_str(&g.node(m).shape)),
            _ => None,
        })
        .collect();
    assert_eq!(mask_shapes, ["[B, N, 1]"]);
    assert!(g.symbols.iter().eq(["B", "N"].iter()));
    assert!(matches!(g.inputs[0].shape.0[2], Dim::Const(4)));
}

#[test]
fn giou_graph_is_stable() {
    let g = parse(GIOU, "examples/giou.kf");
    expect_test::expect![[r#"
        input  in0 pred: f32[B, N, 4]
        input  in1 target: f32[B, N, 4]
        v0     f32[B, N, 4]     = input pred
        v1     f32[B, N, 4]     = input target
        v2     f32[]            = const 1e-7
        v3     f32[B, N]        = v1[.., 3]
        v4     f32[]            = const 0.0
        v5     bool[B, N]       = v3 != v4
        v6     f32[B, N]        = v0[.., 0]
        v7     f32[B, N]        = v1[.., 0]
        v8     f32[B, N]        = v6 max v7
        v9     f32[B, N]        = v0[.., 1]
        v10    f32[B, N]        = v1[.., 1]
        v11    f32[B, N]        = v9 max v10
        v12    f32[B, N]        = v0[.., 2]
        v13    f32[B, N]        = v1[.., 2]
        v14    f32[B, N]        = v12 min v13
        v15    f32[B, N]        = v0[.., 3]
        v16    f32[B, N]        = v15 min v3
        v17    f32[B, N]        = v14 - v8
        v18    f32[B, N]        = v17 max v4
        v19    f32[B, N]        = v16 - v11
        v20    f32[B, N]        = v19 max v4
        v21    f32[B, N]        = v18 * v20
        v22    f32[B, N]        = v12 - v6
        v23    f32[B, N]        = v15 - v9
        v24    f32[B, N]        = v22 * v23
        v25    f32[B, N]        = v13 - v7
        v26    f32[B, N]        = v3 - v10
        v27    f32[B, N]        = v25 * v26
        v28    f32[B, N]        = v24 + v27
        v29    f32[B, N]        = v28 - v21
        v30    f32[B, N]        = v29 + v2
        v31    f32[B, N]        = v21 / v30
        v32    f32[B, N]        = v12 max v13
        v33    f32[B, N]        = v6 min v7
        v34    f32[B, N]        = v32 - v33
        v35    f32[B, N]        = v15 max v3
        v36    f32[B, N]        = v9 min v10
        v37    f32[B, N]        = v35 - v36
        v38    f32[B, N]        = v34 * v37
        v39    f32[B, N]        = v38 - v29
        v40    f32[B, N]        = v38 + v2
        v41    f32[B, N]        = v39 / v40
        v42    f32[B, N]        = v31 - v41
        v43    i32[]            = const 1
        v44    f32[]            = const 1.0
        v45    f32[B, N]        = v44 - v42
        v46    f32[]            = sum(v45, where: v5)
        v47    i32[]            = count(v5)
        v48    i32[]            = v47 max v43
        v49    f32[]            = cast v48
        v50    f32[]            = v46 / v49
        output loss: f32[] = v50
    "#]]
    .assert_eq(&g.to_string());
}
