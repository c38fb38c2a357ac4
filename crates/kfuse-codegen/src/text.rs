//! Small text helpers of the CUDA writers: indented lines, and the renderer of the reviewed
//! templates under `templates/`.

use std::fmt::Write as _;

/// Appends each line of `body` to `src` with `indent` before it.
pub(crate) fn write_lines(src: &mut String, body: &[String], indent: &str) {
    for l in body {
        let _ = writeln!(src, "{indent}{l}");
    }
}
