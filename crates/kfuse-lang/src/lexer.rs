//! The lexer: `.kf` source text to tokens with byte spans.
//!
//! Line breaks end statements, except inside parentheses or brackets, where they are dropped so
//! that a long expression can span lines (as in Python). `#` starts a comment to the end of the
//! line. Integer literals are `i64`, float literals `f64` (`1.5`, `1e-7`, `.5`, `1.`). This module
//! does not know the grammar: a misplaced but well-formed token is the parser's to report.

use crate::diagnostic::{DiagnosticKind, Report, Span};

/// One token kind. Keywords are separate from identifiers so that `let input = 1` is a syntax error.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Tok {
    Ident(String),
    Int(i64),
    Float(f64),
    Input,
    Let,
    Output,
    And,
    Or,
    Not,
    True,
    False,
    None,
    LParen,
    RParen,
    LBracket,
    RBracket,
    Comma,
    Colon,
    Assign,
    DotDot,
    Plus,
    Minus,
    Star,
    Slash,
    SlashSlash,
    Percent,
    Amp,
    Pipe,
    Caret,
    Tilde,
    Shl,
    Shr,
    EqEq,
    NotEq,
    Lt,
    Le,
    Gt,
    Ge,
    Newline,
    Eof,
}

impl Tok {
    /// How the token is named in "unexpected ..." messages.
    pub fn describe(&self) -> String {
        match self {
            Tok::Ident(s) => format!("name `{s}`"),
            Tok::Int(v) => format!("number `{v}`"),
            Tok::Float(v) => format!("number `{v}`"),
            Tok::Newline => "end of line".into(),
            Tok::Eof => "end of file".into(),
            other => format!("`{}`", other.text()),
        }
    }

    fn text(&self) -> &'static str {
        match self {
            Tok::Input => "input",
            Tok::Let => "let",
            Tok::Output => "output",
            Tok::And => "and",
            Tok::Or => "or",
            Tok::Not => "not",
            Tok::True => "true",
            Tok::False => "false",
            Tok::None => "None",
            Tok::LParen => "(",
            Tok::RParen => ")",
            Tok::LBracket => "[",
            Tok::RBracket => "]",
            Tok::Comma => ",",
            Tok::Colon => ":",
            Tok::Assign => "=",
            Tok::DotDot => "..",
            Tok::Plus => "+",
            Tok::Minus => "-",
            Tok::Star => "*",
            Tok::Slash => "/",
            Tok::SlashSlash => "//",
            Tok::Percent => "%",
            Tok::Amp => "&",
            Tok::Pipe => "|",
            Tok::Caret => "^",
            Tok::Tilde => "~",
            Tok::Shl => "<<",
            Tok::Shr => ">>",
            Tok::EqEq => "==",
            Tok::NotEq => "!=",
            Tok::Lt => "<",
            Tok::Le => "<=",
            Tok::Gt => ">",
            Tok::Ge => ">=",
            Tok::Ident(_) | Tok::Int(_) | Tok::Float(_) | Tok::Newline | Tok::Eof => "",
        }
    }
}

/// A token and where it is.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Token {
    pub tok: Tok,
    pub span: Span,
}

/// Splits `src` into tokens; the last one is always [`Tok::Eof`].
pub(crate) fn lex(src: &str) -> Result<Vec<Token>, Report> {
    let bytes = src.as_bytes();
    let mut toks = Vec::new();
    let mut depth: usize = 0;
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        let start = i;
        let at = |k: usize| bytes.get(k).copied().unwrap_or(0);
        let tok = match c {
            b' ' | b'\t' | b'\r' => {
                i += 1;
                continue;
            }
            b'#' => {
                let end = src[i..].find('\n').map_or(src.len(), |k| i + k);
                if let Some((k, c)) = src[i..end].char_indices().find(|&(_, c)| hidden_in_comment(c)) {
                    return Err(Report::new(
                        DiagnosticKind::Syntax,
                        Span::new(i + k, i + k + c.len_utf8()),
                        format!("a comment holds the invisible character {}", describe_char(c)),
                    )
                    .expected("visible text in comments (delete the character)"));
                }
                i = end;
                continue;
            }
            b'\n' => {
                i += 1;
                if depth > 0 {
                    continue;
                }
                Tok::Newline
            }
            b'0'..=b'9' => lex_number(src, &mut i)?,
            b'.' if at(i + 1).is_ascii_digit() => lex_number(src, &mut i)?,
            b'.' if at(i + 1) == b'.' => {
                i += 2;
                Tok::DotDot
            }
            b'a'..=b'z' | b'A'..=b'Z' | b'_' => {
                while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                    i += 1;
                }
                keyword_or_ident(&src[start..i])
            }
            _ => {
                let (tok, len) = lex_punct(bytes, i).ok_or_else(|| bad_char(src, i))?;
                i += len;
                match tok {
                    Tok::LParen | Tok::LBracket => depth += 1,
                    Tok::RParen | Tok::RBracket => depth = depth.saturating_sub(1),
                    _ => {}
                }
                tok
            }
        };
        toks.push(Token { tok, span: Span::new(start, i) });
    }
    toks.push(Token { tok: Tok::Eof, span: Span::new(src.len(), src.len()) });
    Ok(toks)
}

fn keyword_or_ident(word: &str) -> Tok {
    match word {
        "input" => Tok::Input,
        "let" => Tok::Let,
        "output" => Tok::Output,
        "and" => Tok::And,
        "or" => Tok::Or,
        "not" => Tok::Not,
        "true" => Tok::True,
        "false" => Tok::False,
        "None" => Tok::None,
        _ => Tok::Ident(word.to_string()),
    }
}

fn lex_punct(bytes: &[u8], i: usize) -> Option<(Tok, usize)> {
    let next = bytes.get(i + 1).copied().unwrap_or(0);
    Some(match (bytes[i], next) {
        (b'=', b'=') => (Tok::EqEq, 2),
        (b'!', b'=') => (Tok::NotEq, 2),
        (b'<', b'=') => (Tok::Le, 2),
        (b'>', b'=') => (Tok::Ge, 2),
        (b'<', b'<') => (Tok::Shl, 2),
        (b'>', b'>') => (Tok::Shr, 2),
        (b'/', b'/') => (Tok::SlashSlash, 2),
        (b'&', b'&') | (b'|', b'|') => return None,
        (b'&', _) => (Tok::Amp, 1),
        (b'|', _) => (Tok::Pipe, 1),
        (b'^', _) => (Tok::Caret, 1),
        (b'~', _) => (Tok::Tilde, 1),
        (b'%', _) => (Tok::Percent, 1),
        (b'=', _) => (Tok::Assign, 1),
        (b'<', _) => (Tok::Lt, 1),
        (b'>', _) => (Tok::Gt, 1),
        (b'(', _) => (Tok::LParen, 1),
        (b')', _) => (Tok::RParen, 1),
        (b'[', _) => (Tok::LBracket, 1),
        (b']', _) => (Tok::RBracket, 1),
        (b',', _) => (Tok::Comma, 1),
        (b':', _) => (Tok::Colon, 1),
        (b'+', _) => (Tok::Plus, 1),
        (b'-', _) => (Tok::Minus, 1),
        (b'*', b'*') => return None,
        (b'*', _) => (Tok::Star, 1),
        (b'/', _) => (Tok::Slash, 1),
        _ => return None,
    })
}

/// The report for a character that starts no token, with a hint for the usual suspects.
fn bad_char(src: &str, i: usize) -> Report {
    let rest = &src[i..];
    let c = rest.chars().next().unwrap_or(' ');
    let (shown, len, expected) = match c {
        '*' if rest.starts_with("**") => ("**".to_string(), 2, "pow(a, b) for powers"),
        '&' => ("&&".into(), 2, "`and` for logical and, or `&` (bitwise_and) for bits and masks"),
        '|' => ("||".into(), 2, "`or` for logical or, or `|` (bitwise_or) for bits and masks"),
        '!' => ("!".into(), 1, "`!=`, or `not` for logical negation"),
        '.' => (".".into(), 1, "`..` as in x[.., 0], or a number like .5"),
        _ if invisible(c).is_some() => {
            let message = format!("unexpected invisible character {}", describe_char(c));
            return Report::new(DiagnosticKind::Syntax, Span::new(i, i + c.len_utf8()), message)
                .expected("a name, a number, an operator, or a comment starting with # (delete the character)");
        }
        _ => (c.to_string(), c.len_utf8(), "a name, a number, an operator, or a comment starting with #"),
    };
    Report::new(DiagnosticKind::Syntax, Span::new(i, i + len), format!("unexpected character `{shown}`"))
        .expected(expected)
}

/// The name of a character that shows as nothing or as a plain space: control characters (tab,
/// line feed and carriage return included, which the lexer takes as white space before asking),
/// spaces other than U+0020, zero-width and bidirectional formatting characters, the byte-order
/// mark. `None` for a visible character.
pub(crate) fn invisible(c: char) -> Option<&'static str> {
    Some(match c {
        '\0' => "NUL",
        '\t' => "tab",
        '\u{7F}' => "DEL",
        c if c.is_control() => "a control character",
        '\u{A0}' => "no-break space",
        '\u{AD}' => "soft hyphen",
        '\u{2000}'..='\u{200A}' | '\u{202F}' | '\u{205F}' | '\u{3000}' => "a space other than U+0020",
        '\u{200B}' => "zero-width space",
        '\u{200C}' | '\u{200D}' | '\u{2060}'..='\u{2064}' => "a zero-width character",
        '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}' => "a bidirectional text control",
        '\u{FEFF}' => "byte-order mark",
        _ => return None,
    })
}

/// Whether a comment may not hold `c`: a control character other than tab and carriage return,
/// or a bidirectional text control (which can make a line read otherwise than it lexes).
fn hidden_in_comment(c: char) -> bool {
    (c.is_control() && !matches!(c, '\t' | '\r')) || invisible(c) == Some("a bidirectional text control")
}

/// `U+0000 (NUL)`: a character by code point, with its name when it is invisible.
pub(crate) fn describe_char(c: char) -> String {
    match invisible(c) {
        Some(name) => format!("U+{:04X} ({name})", u32::from(c)),
        None => format!("U+{:04X}", u32::from(c)),
    }
}

/// Lexes a number starting at `*i` (a digit, or a `.` before a digit) and advances `*i`.
fn lex_number(src: &str, i: &mut usize) -> Result<Tok, Report> {
    let bytes = src.as_bytes();
    let at = |k: usize| bytes.get(k).copied().unwrap_or(0);
    let start = *i;
    let mut float = false;
    while at(*i).is_ascii_digit() {
        *i += 1;
    }
    // `1.` is a float, but `1..` is the integer 1 followed by `..`.
    if at(*i) == b'.' && at(*i + 1) != b'.' {
        float = true;
        *i += 1;
        while at(*i).is_ascii_digit() {
            *i += 1;
        }
    }
    let sign = usize::from(matches!(at(*i + 1), b'+' | b'-'));
    if matches!(at(*i), b'e' | b'E') && at(*i + 1 + sign).is_ascii_digit() {
        float = true;
        *i += 1 + sign;
        while at(*i).is_ascii_digit() {
            *i += 1;
        }
    }
    let text = &src[start..*i];
    let span = Span::new(start, *i);
    if float {
        match text.parse::<f64>() {
            Ok(v) if v.is_finite() => Ok(Tok::Float(v)),
            _ => Err(Report::new(DiagnosticKind::Syntax, span, format!("float literal `{text}` is out of range"))
                .expected("a finite number (at most about 1.8e308)")),
        }
    } else {
        text.parse::<i64>().map(Tok::Int).map_err(|_| {
            Report::new(DiagnosticKind::Syntax, span, format!("integer literal `{text}` is too large"))
                .expected("an integer below 2^63, or a float literal like 1e30")
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toks(src: &str) -> Vec<Tok> {
        lex(src).map(|v| v.into_iter().map(|t| t.tok).collect()).unwrap_or_default()
    }

    #[test]
    fn numbers_ranges_and_keywords() {
        assert_eq!(
            toks("1 1.5 1e-7 .5 2."),
            vec![Tok::Int(1), Tok::Float(1.5), Tok::Float(1e-7), Tok::Float(0.5), Tok::Float(2.0), Tok::Eof]
        );
        assert_eq!(
            toks("x[.., -1]"),
            vec![
                Tok::Ident("x".into()),
                Tok::LBracket,
                Tok::DotDot,
                Tok::Comma,
                Tok::Minus,
                Tok::Int(1),
                Tok::RBracket,
                Tok::Eof
            ]
        );
        assert_eq!(
            toks("let a = not b # c\n"),
            vec![
                Tok::Let,
                Tok::Ident("a".into()),
                Tok::Assign,
                Tok::Not,
                Tok::Ident("b".into()),
                Tok::Newline,
                Tok::Eof
            ]
        );
    }

    #[test]
    fn line_breaks_inside_brackets_are_dropped() {
        assert_eq!(
            toks("f(a,\n b)\n"),
            vec![
                Tok::Ident("f".into()),
                Tok::LParen,
                Tok::Ident("a".into()),
                Tok::Comma,
                Tok::Ident("b".into()),
                Tok::RParen,
                Tok::Newline,
                Tok::Eof
            ]
        );
    }

    #[test]
    fn bad_characters_and_literals_are_reported_with_a_hint() {
        let r = lex("a ** 2").err();
        assert_eq!(r.as_ref().map(|r| r.span), Some(Span::new(2, 4)));
        assert!(r.and_then(|r| r.expected).is_some_and(|e| e.contains("pow")));
        assert!(lex("99999999999999999999").is_err());
        assert!(lex("1e999").is_err());
        assert!(lex("é").is_err_and(|r| r.span == Span::new(0, 2)));
    }
}
