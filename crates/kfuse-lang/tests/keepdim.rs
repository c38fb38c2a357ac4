//! `keepdim: true` on a reduction along the last axis keeps that axis with size 1, as PyTorch's
//! `x.sum(-1, keepdim=True)` does: the same graph as `x[.., None]` of the reduction.

use kfuse_lang::{parse_program, DiagnosticKind};

const HEADER: &str = "input x: f32[B, N]\ninput valid: bool[B, N]\n";

fn graph_text(body: &str) -> String {
    let src = format!("{HEADER}{body}");
    parse_program(&src, "t.kf").unwrap_or_else(|d| panic!("{body:?} should parse:\n{d}")).to_string()
}

fn error(body: &str) -> kfuse_lang::Diagnostic {
    let src = format!("{HEADER}{body}");
    parse_program(&src, "t.kf").err().unwrap_or_else(|| panic!("{body:?} should not parse"))
}

#[test]
fn keepdim_is_the_reduction_with_its_axis_put_back() {
    for (kept, spelled) in [
        ("sum(x, axis: -1, keepdim: true)", "sum(x, axis: -1)[.., None]"),
        ("max(x, axis: 1, keepdim: true)", "max(x, axis: 1)[.., None]"),
        ("mean(x, where: valid, axis: -1, keepdim: true)", "mean(x, where: valid, axis: -1)[.., None]"),
        ("count(valid, axis: -1, keepdim: true)", "count(valid, axis: -1)[.., None]"),
        ("sum(x, axis: -1, keepdim: false)", "sum(x, axis: -1)"),
        // The softmax of each row, written as in PyTorch.
        (
            "exp(x - max(x, axis: -1, keepdim: true)) / sum(exp(x - max(x, axis: -1, keepdim: true)), axis: -1, keepdim: true)",
            "exp(x - max(x, axis: -1)[.., None]) / sum(exp(x - max(x, axis: -1)[.., None]), axis: -1)[.., None]",
        ),
    ] {
        assert_eq!(graph_text(&format!("output y = {kept}\n")), graph_text(&format!("output y = {spelled}\n")), "{kept}");
    }
}

#[test]
fn keepdim_needs_a_literal_bool_and_an_axis() {
    let d = error("output y = sum(x, keepdim: true)\n");
    assert_eq!(d.kind, DiagnosticKind::Arguments, "{d}");
    assert!(d.message.contains("needs an `axis:`"), "{d}");
    let d = error("output y = sum(x, axis: -1, keepdim: 1)\n");
    assert!(d.kind == DiagnosticKind::Arguments && d.message.contains("`true` or `false`"), "{d}");
    let d = error("output y = sum(x, axis: -1, keep: true)\n");
    assert!(d.message.contains("keep"), "{d}");
}
