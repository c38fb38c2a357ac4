//! A source's text as a user's editor or a mistake may leave it: a byte-order mark is accepted;
//! NUL, control and invisible characters are diagnostics naming their code point at their line
//! and column; bytes that are not UTF-8 are diagnostics with line, column and byte offset. Files
//! are read only when regular and within the limit. And an `i32` sum never wraps.

use std::error::Error as _;
use std::path::Path;

use kfuse_ir::{DType, HostTensor};
use kfuse_lang::files::{self, FileError};
use kfuse_lang::{parse_program, source_text, Diagnostic, DiagnosticKind};

const PROGRAM: &str = "input x: f32[N]\noutput s = sum(x)\n";

fn error(src: &str) -> Diagnostic {
    match parse_program(src, "t.kf") {
        Ok(g) => panic!("expected an error for {src:?}, got:\n{g}"),
        Err(d) => d,
    }
}

#[test]
fn a_byte_order_mark_is_skipped_and_columns_count_after_it() {
    let with_bom = format!("\u{FEFF}{PROGRAM}");
    let g = parse_program(&with_bom, "t.kf").expect("a BOM is accepted");
    assert_eq!(g.outputs[0].name, "s");
    // Through the file path too: the bytes keep it, the parser skips it.
    let text = source_text(with_bom.clone().into_bytes(), "t.kf").expect("UTF-8");
    assert!(parse_program(&text, "t.kf").is_ok());
    // An error on the first line counts columns from after the mark.
    let d = error("\u{FEFF}input x: f32[N]\noutput s = sum(y)\n");
    assert_eq!((d.kind, d.line, d.column), (DiagnosticKind::UnknownName, 2, 16));
    let d = error("\u{FEFF}inptu x: f32[N]\n");
    assert_eq!((d.line, d.column), (1, 7), "{d}");
    // Two marks: the second is an invisible character.
    let d = error("\u{FEFF}\u{FEFF}input x: f32[N]\n");
    assert_eq!((d.kind, d.line, d.column), (DiagnosticKind::Syntax, 1, 1));
    assert!(d.message.contains("U+FEFF (byte-order mark)"), "{d}");
}

#[test]
fn a_nul_is_named_by_code_point_at_its_place_with_a_caret() {
    let d = error("input x: f32[N]\noutput s = sum(x)\0\n");
    assert_eq!((d.kind, d.line, d.column, d.width), (DiagnosticKind::Syntax, 2, 18, 1));
    assert!(d.message.contains("U+0000 (NUL)"), "{d}");
    // The line shows the NUL as a visible picture, so the caret stands under it.
    assert_eq!(d.source_line, "output s = sum(x)␀");
    let rendered = d.render();
    assert!(rendered.contains("2 | output s = sum(x)␀\n  |                  ^"), "{rendered}");
    assert!(!rendered.contains('\0'), "no raw NUL reaches the terminal");
}

#[test]
fn control_and_invisible_characters_are_named_by_code_point() {
    // (character, its name in the message)
    let cases: [(char, &str); 14] = [
        ('\u{1}', "U+0001 (a control character)"),
        ('\u{7}', "U+0007 (a control character)"),
        ('\u{8}', "U+0008 (a control character)"),
        ('\u{B}', "U+000B (a control character)"),
        ('\u{C}', "U+000C (a control character)"),
        ('\u{1B}', "U+001B (a control character)"),
        ('\u{7F}', "U+007F (DEL)"),
        ('\u{85}', "U+0085 (a control character)"),
        ('\u{A0}', "U+00A0 (no-break space)"),
        ('\u{200B}', "U+200B (zero-width space)"),
        ('\u{200D}', "U+200D (a zero-width character)"),
        ('\u{2066}', "U+2066 (a bidirectional text control)"),
        ('\u{3000}', "U+3000 (a space other than U+0020)"),
        ('\u{AD}', "U+00AD (soft hyphen)"),
    ];
    for (c, name) in cases {
        let src = format!("input x: f32[N]\nlet y = x # é\noutput s = sum({c}y)\n");
        let d = error(&src);
        assert_eq!((d.kind, d.line, d.column, d.width), (DiagnosticKind::Syntax, 3, 16, 1), "{name}: {d}");
        assert!(d.message.contains(name), "{name}: {d}");
        assert!(d.expected.as_deref().is_some_and(|e| e.contains("delete the character")), "{d}");
    }
    // A visible stray character keeps its own spelling.
    let d = error("input x: f32[N]\noutput s = sum(x) $\n");
    assert!(d.message.contains("`$`"), "{d}");
}

#[test]
fn comments_take_visible_text_but_not_controls() {
    // Visible text, tabs, carriage returns, other spaces: fine in a comment.
    let ok = "input x: f32[N]\t# café — naïve\u{A0}text, 日本語, emoji 🙂\r\noutput s = sum(x) # ok\r\n";
    assert!(parse_program(ok, "t.kf").is_ok());
    for (c, name) in [('\0', "U+0000 (NUL)"), ('\u{1B}', "U+001B"), ('\u{202E}', "U+202E"), ('\u{2067}', "U+2067")] {
        let src = format!("input x: f32[N]\n# a {c} b\noutput s = sum(x)\n");
        let d = error(&src);
        assert_eq!((d.kind, d.line, d.column), (DiagnosticKind::Syntax, 2, 5), "{name}: {d}");
        assert!(d.message.contains("comment") && d.message.contains(name), "{d}");
    }
}

#[test]
fn bytes_that_are_not_utf8_say_line_column_and_offset() {
    // (bytes, line, column, byte offset, the bad byte)
    let cases: [(&[u8], usize, usize, usize, &str); 7] = [
        (b"\xff\xfe", 1, 1, 0, "0xFF"),
        (b"input x: f32[N]\n# caf\xe9\n", 2, 6, 21, "0xE9"),
        (b"input x: f32[N]\n# \xc3\xa9\x80\n", 2, 4, 20, "0x80"),
        (b"input x: f32[N]\nlet y = \xc0\x80\n", 2, 9, 24, "0xC0"),
        (b"input x: f32[N]\n\n\nlet y = x \xed\xa0\x80\n", 4, 11, 28, "0xED"),
        (b"input x: f32[N]\noutput s = sum(x) # \xe2\x82", 2, 21, 36, "0xE2"),
        (b"\xef\xbb\xbfinput x: f32[N]\r\n\xa0", 2, 1, 20, "0xA0"),
    ];
    for (bytes, line, column, offset, byte) in cases {
        let d = source_text(bytes.to_vec(), "bad.kf").expect_err("not UTF-8");
        let shown = bytes.escape_ascii().to_string();
        assert_eq!((d.kind, d.line, d.column), (DiagnosticKind::Encoding, line, column), "{shown}: {d}");
        assert!(d.message.contains(&format!("byte offset {offset}")), "{shown}: {d}");
        assert!(d.message.contains(byte) && d.message.contains("not UTF-8"), "{shown}: {d}");
        assert!(d.render().contains("bad.kf:"), "{d}");
    }
    assert_eq!(source_text(PROGRAM.as_bytes().to_vec(), "ok.kf").as_deref(), Ok(PROGRAM));
}

#[test]
fn only_regular_files_within_the_limit_are_read() {
    let d = tempfile::tempdir().unwrap();
    let dir_err = files::read_source_bytes(d.path()).expect_err("a folder");
    assert!(matches!(dir_err, FileError::NotRegular { kind: "a directory", .. }), "{dir_err}");
    assert!(dir_err.to_string().contains("is a directory, not a regular file"), "{dir_err}");
    if Path::new("/dev/zero").exists() {
        let e = files::read_source_bytes(Path::new("/dev/zero")).expect_err("a device");
        assert!(matches!(e, FileError::NotRegular { kind: "a character device", .. }), "{e}");
    }
    let fifo = d.path().join("fifo");
    match std::process::Command::new("mkfifo").arg(&fifo).status() {
        Ok(s) if s.success() => {
            let e = files::read_source_bytes(&fifo).expect_err("a FIFO");
            assert!(matches!(e, FileError::NotRegular { kind: "a FIFO (named pipe)", .. }), "{e}");
        }
        _ => eprintln!("SKIPPED: mkfifo is not available here"),
    }
    // Too large by its size: refused unread.
    let p = d.path().join("big.kf");
    std::fs::write(&p, [b'#'; 100]).unwrap();
    let e = files::read_regular(&p, 99, "test file").expect_err("too large");
    assert!(matches!(e, FileError::TooLarge { limit: 99, size: Some(100), .. }), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("cannot read test file") && msg.contains("more than 99 bytes") && msg.contains("(it has 100)"),
        "{e}"
    );
    assert_eq!(files::read_regular(&p, 100, "test file").map(|b| b.len()).ok(), Some(100));
    // A file whose metadata says 0 bytes but that holds more (procfs) is bounded by the limit.
    if Path::new("/proc/self/status").exists() {
        let e = files::read_regular(Path::new("/proc/self/status"), 8, "test file").expect_err("bounded");
        assert!(matches!(e, FileError::TooLarge { size: None, .. }), "{e}");
    }
    // A missing file: the operating system's cause is in the message, and not again as a source.
    let e = files::read_source_bytes(&d.path().join("missing.kf")).expect_err("missing");
    assert!(matches!(e, FileError::Io { .. }), "{e}");
    assert!(e.to_string().contains("No such file or directory") && e.to_string().contains("missing.kf"), "{e}");
    assert!(e.source().is_none(), "the cause is printed by Display only");
    assert_eq!(e.path(), d.path().join("missing.kf"));
}

#[test]
fn an_i32_sum_is_an_exact_i64() {
    let run = |src: &str, shape: Vec<usize>, values: &[f64]| {
        let g = parse_program(src, "t.kf").expect("parses");
        let x = HostTensor::from_f64(DType::I32, shape, values);
        kfuse_interp::run(&g, &[("x", &x)])
    };
    // As torch gives: an i64, exact beyond the i32 range.
    let total = "input x: i32[N]\noutput s = sum(x)\n";
    let out = run(total, vec![3], &[1073741824.0; 3]).expect("an i64 holds 2^30 * 3");
    assert_eq!((out[0].1.dtype(), out[0].1.to_f64()), (DType::I64, vec![3221225472.0]));
    let out = run(total, vec![2], &[-2147483648.0, -1.0]).expect("an i64 holds it");
    assert_eq!(out[0].1.to_f64(), vec![-2147483649.0]);
    // Masked elements do not count; a row sum is an i64 per row.
    let masked = "input x: i32[N]\noutput s = sum(x, where: x < 10)\n";
    assert_eq!(run(masked, vec![3], &[2147483647.0, 3.0, 4.0]).expect("sums")[0].1.to_f64(), vec![7.0]);
    let rows = "input x: i32[B, K]\noutput s = sum(x, axis: -1)\n";
    let out = run(rows, vec![2, 2], &[1.0, 2.0, 2147483647.0, 1.0]).expect("sums");
    assert_eq!(out[0].1.to_f64(), vec![3.0, 2147483648.0]);
    // i32 max/min reductions and counts stay i32.
    let maxes = "input x: i32[N]\noutput m = max(x)\noutput c = count(x > 0)\n";
    let out = run(maxes, vec![3], &[-2147483648.0, 2147483647.0, 5.0]).expect("in range");
    assert_eq!((out[0].1.dtype(), out[1].1.dtype()), (DType::I32, DType::I32));
    assert_eq!((out[0].1.to_f64(), out[1].1.to_f64()), (vec![2147483647.0], vec![2.0]));
}
