//! Small text helpers of the CUDA writers: indented lines, and the renderer of the reviewed
//! templates under `templates/`.

use std::fmt::Write as _;

/// Appends each line of `body` to `src` with `indent` before it.
pub(crate) fn write_lines(src: &mut String, body: &[String], indent: &str) {
    for l in body {
        let _ = writeln!(src, "{indent}{l}");
    }
}

/// Renders a reviewed template: lines starting with `//~` (notes for the reader) are dropped, a
/// line holding only `{{name}}` is replaced by the block of whole lines `values` gives for
/// `name` (possibly none), and `{{name}}` elsewhere by its value. Every placeholder must have a
/// value: the templates are part of the crate, so a missing one is a bug that the golden tests
/// catch as a leftover `{{`.
pub(crate) fn render(template: &str, values: &[(&str, &str)]) -> String {
    let mut out = String::with_capacity(template.len());
    for line in template.lines() {
        if line.starts_with("//~") {
            continue;
        }
        let trimmed = line.trim();
        if let Some(name) = trimmed.strip_prefix("{{").and_then(|t| t.strip_suffix("}}")) {
            if let Some((_, block)) = values.iter().find(|(k, _)| *k == name) {
                out.push_str(block);
                continue;
            }
        }
        let mut l = line.to_string();
        for (k, v) in values {
            l = l.replace(&format!("{{{{{k}}}}}"), v);
        }
        out.push_str(&l);
        out.push('\n');
    }
    out
}
