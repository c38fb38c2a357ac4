//! `stack(a, b, ...)`: the parts, broadcast to one shape, along a new last axis (torch.stack with
//! dim=-1), and its gradient (each part gets its component).

use kfuse_ir::{HostTensor, TensorData};
use kfuse_lang::{parse_program, DiagnosticKind};

fn floats(shape: Vec<usize>, v: &[f32]) -> HostTensor {
    HostTensor::new(shape, TensorData::F32(v.to_vec()))
}

#[test]
fn stack_puts_its_parts_along_a_new_last_axis_and_routes_gradients_back() {
    let src = "input x: f32[B, N]\ninput y: f32[N]\noutput s = stack(x, y * 2.0, x + 1.0)\n\
               output loss = sum(s * s)\noutput dy = grad(loss, y)\n";
    let g = parse_program(src, "t.kf").unwrap_or_else(|d| panic!("{d}"));
    let x = floats(vec![2, 2], &[1.0, 2.0, 3.0, 4.0]);
    let y = floats(vec![2], &[10.0, 20.0]);
    let outs = kfuse_interp::run(&g, &[("x", &x), ("y", &y)]).unwrap();
    let s = &outs.iter().find(|(n, _)| n == "s").unwrap().1;
    assert_eq!(s.shape, vec![2, 2, 3]);
    assert_eq!(s.to_f64(), vec![1.0, 20.0, 2.0, 2.0, 40.0, 3.0, 3.0, 20.0, 4.0, 4.0, 40.0, 5.0]);
    // loss = sum over rows of (2y)^2 + ...: d/dy = sum over the 2 rows of 8y.
    let dy = &outs.iter().find(|(n, _)| n == "dy").unwrap().1;
    assert_eq!(dy.to_f64(), vec![160.0, 320.0]);
}

#[test]
fn stack_of_nothing_or_of_clashing_shapes_is_a_diagnostic() {
    let d = parse_program("input x: f32[B]\noutput s = stack()\n", "t.kf").unwrap_err();
    assert_eq!(d.kind, DiagnosticKind::Arguments, "{d}");
    assert!(d.to_string().contains("needs at least one part"), "{d}");
    let d = parse_program("input x: f32[B]\ninput y: f32[C]\noutput s = stack(x, y)\n", "t.kf").unwrap_err();
    assert_eq!(d.kind, DiagnosticKind::Shape, "{d}");
}
