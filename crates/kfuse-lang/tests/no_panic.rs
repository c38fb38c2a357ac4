//! No input makes the language panic: random text, random token soup and random edits of the
//! examples all give either a graph or a well-formed diagnostic.

use kfuse_ir::{DType, Dim, Shape, SymId};
use kfuse_lang::{parse_expression, parse_program, Diagnostic};
use proptest::prelude::*;

const GIOU: &str = include_str!("../../../examples/giou.kf");
const RAGGED: [&str; 2] =
    [include_str!("../../../examples/giou_train_lengths.kf"), include_str!("../../../examples/giou_train_packed.kf")];

const TOKENS: &[&str] = &[
    "input",
    "as",
    "lengths",
    "offsets",
    "mask",
    "size",
    "grad",
    "let",
    "output",
    "x",
    "y",
    "pred",
    "f32",
    "bool",
    "i32",
    "f16",
    "[",
    "]",
    "(",
    ")",
    ",",
    ":",
    "=",
    "==",
    "!=",
    "<",
    ">=",
    "+",
    "-",
    "*",
    "/",
    "..",
    "None",
    "0",
    "1",
    "-1",
    "3",
    "4",
    "0.5",
    "1e-7",
    ".5",
    "\n",
    "sum",
    "mean",
    "max",
    "min",
    "count",
    "where",
    "clamp",
    "pow",
    "exp",
    "grad",
    "not",
    "and",
    "or",
    "true",
    "B",
    "N",
    "axis",
    "# c\n",
    "2147483648",
    "99999999999999999999",
    "é",
    "**",
    "!",
    "\t",
];

/// Checks that a diagnostic is placed inside `src` and renders with its position.
fn assert_well_formed(d: &Diagnostic, src: &str, file: &str) {
    let lines = src.split('\n').count();
    assert!(d.line >= 1 && d.line <= lines, "line {} of {lines}", d.line);
    assert!(
        d.column >= 1 && d.column <= d.source_line.chars().count() + 1,
        "column {} in {:?}",
        d.column,
        d.source_line
    );
    assert!(d.width >= 1);
    assert!(!d.message.is_empty());
    assert!(d.expected.as_ref().is_some_and(|e| !e.is_empty()), "no expected-line: {d}");
    let r = d.render();
    assert!(
        r.starts_with("error: ") && r.contains(&format!("--> {file}:{}:{}", d.line, d.column)) && r.contains('^'),
        "{r}"
    );
}

fn check_program(src: &str) {
    if let Err(d) = parse_program(src, "p.kf") {
        assert_well_formed(&d, src, "p.kf");
    }
    let vars = [("x", DType::F32, Shape(vec![Dim::Sym(SymId(0)), Dim::Const(4)])), ("y", DType::Bool, Shape::scalar())];
    if let Err(d) = parse_expression(src, &vars) {
        assert_well_formed(&d, src, "<expression>");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn random_text_never_panics(src in "\\PC{0,80}") {
        check_program(&src);
    }

    #[test]
    fn random_token_soup_never_panics(toks in proptest::collection::vec(proptest::sample::select(TOKENS), 0..40)) {
        let header = "input x: f32[N, 4]\ninput m: bool[N]\n";
        check_program(&format!("{header}{}", toks.join(" ")));
        check_program(&toks.join(" "));
    }

    #[test]
    fn random_edits_of_an_example_never_panic(at in 0usize..GIOU.len(), cut in 0usize..8, insert in "[a-z0-9()\\[\\],.:=+*/<> \n-]{0,4}") {
        let mut at = at;
        while !GIOU.is_char_boundary(at) { at -= 1; }
        let mut end = (at + cut).min(GIOU.len());
        while !GIOU.is_char_boundary(end) { end -= 1; }
        let src = format!("{}{insert}{}", &GIOU[..at], &GIOU[end..]);
        check_program(&src);
    }

    #[test]
    fn random_edits_of_the_ragged_examples_never_panic(which in 0usize..2, at in 0usize..2000, cut in 0usize..8, insert in "[a-zA-Z0-9()\\[\\],.:=+*/<> \n-]{0,4}") {
        let text = RAGGED[which];
        let mut at = at.min(text.len());
        while !text.is_char_boundary(at) { at -= 1; }
        let mut end = (at + cut).min(text.len());
        while !text.is_char_boundary(end) { end -= 1; }
        let src = format!("{}{insert}{}", &text[..at], &text[end..]);
        check_program(&src);
    }
}
