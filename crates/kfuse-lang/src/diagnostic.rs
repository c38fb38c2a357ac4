//! Diagnostics: an error with a source position, rendered rustc-style with a caret under the
//! offending span and a line saying what was expected.
//!
//! The parser and the lowering produce a position-free [`Report`] (a byte span plus text); it
//! becomes a [`Diagnostic`] once, at the API boundary, where the source text is at hand. This
//! module does not decide *what* is wrong; it only places and prints it.

use std::fmt::Write as _;
use std::ops::Range;

/// A byte range in the source text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Span {
    pub start: usize,
    pub end: usize,
}

impl Span {
    pub fn new(start: usize, end: usize) -> Span {
        Span { start, end: end.max(start) }
    }
    /// The smallest span covering both.
    pub fn to(self, other: Span) -> Span {
        Span::new(self.start.min(other.start), self.end.max(other.end))
    }
}

/// What sort of mistake a [`Diagnostic`] reports, for callers (and tests) that branch on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DiagnosticKind {
    /// The text is not a well-formed program (a stray character, an unexpected token).
    Syntax,
    /// A value name that is not defined (yet).
    UnknownName,
    /// A call to a function that does not exist.
    UnknownFunction,
    /// A name defined twice.
    DuplicateName,
    /// Operands of the wrong dtype or kind (`bool + f32`, `not 1.5`).
    Type,
    /// Shapes that do not fit (broadcasting, masks, component access, rank).
    Shape,
    /// A call with the wrong number or names of arguments.
    Arguments,
    /// A reduction axis that the operand does not have, one named twice, or an empty or
    /// non-literal axis list.
    Axis,
    /// A `grad(...)` that cannot be taken.
    Grad,
    /// A program with nothing to compute (no output).
    NoOutput,
    /// A file whose bytes are not UTF-8 text.
    Encoding,
    /// A graph the builder accepted but the verifier rejected: a bug in kfuse, not in the source.
    Internal,
}

/// A problem found in a `.kf` source, with its place. `Display` prints [`Diagnostic::render`].
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{}", self.render())]
pub struct Diagnostic {
    /// The file name given by the caller, as it should appear in the report.
    pub file: String,
    /// 1-based line of the span's start.
    pub line: usize,
    /// 1-based column (in characters) of the span's start.
    pub column: usize,
    /// What is wrong, one sentence without a trailing period.
    pub message: String,
    /// What would have been right, when that can be said.
    pub expected: Option<String>,
    /// What sort of mistake this is.
    pub kind: DiagnosticKind,
    /// The byte range of the offending text in the source.
    pub span: Range<usize>,
    /// The text of the line the span starts on (without its line break).
    pub source_line: String,
    /// How many characters of `source_line` the caret underlines (at least 1).
    pub width: usize,
}

impl Diagnostic {
    /// The full report:
    ///
    /// ```text
    /// error: `+` needs operands of the same kind, got bool and f32
    ///  --> examples/bad.kf:4:9
    ///   |
    /// 4 | let y = valid + x
    ///   |         ^^^^^^^^^
    ///   = expected: numbers on both sides
    /// ```
    pub fn render(&self) -> String {
        let num = self.line.to_string();
        let pad = " ".repeat(num.len());
        // Keep tabs in the caret line's indent so that the caret stays under the text.
        let indent: String = self
            .source_line
            .chars()
            .take(self.column.saturating_sub(1))
            .map(|c| if c == '\t' { '\t' } else { ' ' })
            .collect();
        let mut s = String::new();
        let _ = writeln!(s, "error: {}", self.message);
        let _ = writeln!(s, "{pad}--> {}:{}:{}", self.file, self.line, self.column);
        let _ = writeln!(s, "{pad} |");
        let _ = writeln!(s, "{num} | {}", self.source_line);
        let _ = write!(s, "{pad} | {indent}{}", "^".repeat(self.width.max(1)));
        if let Some(e) = &self.expected {
            let _ = write!(s, "\n{pad} = expected: {e}");
        }
        s
    }
}

/// A problem at a byte span, before it is placed in a file.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Report {
    pub kind: DiagnosticKind,
    pub span: Span,
    pub message: String,
    pub expected: Option<String>,
}

impl Report {
    pub fn new(kind: DiagnosticKind, span: Span, message: impl Into<String>) -> Report {
        Report { kind, span, message: message.into(), expected: None }
    }
    pub fn expected(mut self, what: impl Into<String>) -> Report {
        self.expected = Some(what.into());
        self
    }

    /// Places the report in `source` (named `file`): line, column, the line's text and the
    /// caret width. Spans past the end or inside a multi-byte character are clamped.
    pub fn place(self, source: &str, file: &str) -> Diagnostic {
        let len = source.len();
        let mut start = floor_char_boundary(source, self.span.start.min(len));
        // A span at the very end of a file that ends with a line break points at the end of the
        // last line rather than at an empty line after it.
        if start == len && start > 0 && source.ends_with('\n') {
            start -= 1;
        }
        let end = floor_char_boundary(source, self.span.end.clamp(start, len));
        let line_start = source[..start].rfind('\n').map_or(0, |i| i + 1);
        let line_end = source[start..].find('\n').map_or(len, |i| start + i);
        // Control characters are shown as their Unicode pictures (NUL as ␀), one column each,
        // so that the caret stays under them and nothing invisible reaches the terminal.
        let source_line = source[line_start..line_end]
            .trim_end_matches('\r')
            .chars()
            .map(|c| match u32::from(c) {
                k @ 0..=0x1F if c != '\t' => char::from_u32(0x2400 + k).unwrap_or('?'),
                0x7F => '\u{2421}',
                _ => c,
            })
            .collect();
        let line = source[..start].matches('\n').count() + 1;
        let column = source[line_start..start].chars().count() + 1;
        let width = source[start..end.min(line_end).max(start)].chars().count().max(1);
        Diagnostic {
            file: file.to_string(),
            line,
            column,
            message: self.message,
            expected: self.expected,
            kind: self.kind,
            span: self.span.start..self.span.end,
            source_line,
            width,
        }
    }
}

fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_and_renders_a_caret_under_the_span() {
        let src = "input x: f32\n\nlet y = valid + x\n";
        let start = src.find("valid").unwrap_or(0);
        let d =
            Report::new(DiagnosticKind::Type, Span::new(start, start + 9), "bad").expected("good").place(src, "a.kf");
        assert_eq!((d.line, d.column, d.width), (3, 9, 9));
        assert_eq!(
            d.render(),
            "error: bad\n --> a.kf:3:9\n  |\n3 | let y = valid + x\n  |         ^^^^^^^^^\n  = expected: good"
        );
        assert_eq!(d.to_string(), d.render());
    }

    #[test]
    fn a_span_at_the_end_points_after_the_last_line() {
        let src = "let y = (1\n";
        let d = Report::new(DiagnosticKind::Syntax, Span::new(src.len(), src.len()), "eof").place(src, "f");
        assert_eq!((d.line, d.column, d.width), (1, 11, 1));
        let d = Report::new(DiagnosticKind::Syntax, Span::new(99, 120), "eof").place("", "f");
        assert_eq!((d.line, d.column), (1, 1));
    }

    #[test]
    fn columns_count_characters_and_tabs_are_kept() {
        let src = "\tlet é = ü";
        let start = src.find('ü').unwrap_or(0);
        let d = Report::new(DiagnosticKind::Syntax, Span::new(start + 1, start + 2), "x").place(src, "f");
        // The span starts inside `ü` and is moved to its start: column 10 (characters, not bytes).
        assert_eq!(d.column, 10);
        assert!(
            d.render().contains("\n  | \t        ^\n") || d.render().ends_with("\n  | \t        ^"),
            "{}",
            d.render()
        );
    }
}
