//! The command-line tool on bad programs, bad inputs and bad arguments, as a user would give them:
//! each case asserts the exit code (1 for an error kfuse reports, 2 for arguments the parser
//! refuses), the one `error:` line and the key words of its message, and that nothing panicked.
//! Language errors are checked here through `kfuse check` (rendering and exit code); their
//! positions are pinned by kfuse-lang's `diagnostics` tests, the inputs of `kfuse run` by `cli.rs`.

use std::path::PathBuf;
use std::process::Output;

use kfuse::{DType, HostTensor};
use kfuse_cli::npy;

mod common;

fn kfuse(args: &[&str]) -> Output {
    common::command()
        .args(args)
        .env("KFUSE_NO_CACHE", "1")
        .env_remove("KFUSE_REQUIRE_GPU")
        .output()
        .expect("kfuse runs")
}

/// Asserts exit code `code`, no panic, one `error` line, and every `needle` in stderr; returns it.
fn fails(out: &Output, code: i32, needles: &[&str]) -> String {
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(code), "exit code; stderr:\n{err}");
    assert!(!err.contains("panicked") && !err.contains("RUST_BACKTRACE"), "panic: {err}");
    assert_eq!(err.lines().filter(|l| l.starts_with("error")).count(), 1, "one error line:\n{err}");
    for n in needles {
        assert!(err.contains(n), "stderr lacks {n:?}:\n{err}");
    }
    err
}

struct Dir(tempfile::TempDir);

impl Dir {
    fn new() -> Dir {
        Dir(tempfile::tempdir().expect("tempdir"))
    }
    fn path(&self, name: &str) -> PathBuf {
        self.0.path().join(name)
    }
    fn kf(&self, name: &str, text: &str) -> String {
        let p = self.path(name);
        std::fs::write(&p, text).expect("write");
        p.display().to_string()
    }
    fn npy(&self, name: &str, dtype: DType, shape: &[usize], values: &[f64]) -> String {
        let p = self.path(name);
        npy::write_npy(&p, &HostTensor::from_f64(dtype, shape.to_vec(), values)).expect("write npy");
        p.display().to_string()
    }
}

/// `kfuse check` of `source` fails with exit code 1 and every needle (the file name and the line
/// are part of the rendering).
fn check_fails(source: &str, needles: &[&str]) {
    let dir = Dir::new();
    let f = dir.kf("p.kf", source);
    let err = fails(&kfuse(&["check", &f]), 1, needles);
    assert!(err.contains("p.kf:") && err.contains('^'), "rendered with file and caret:\n{err}");
}

// ---- Malformed sources: one case per kind of syntax error ----

#[test]
fn syntax_errors() {
    check_fails("input x: f32[N, 4]\noutput y = x[.., 0\n", &["unexpected end of file", "expected: `,` or `]`"]);
    check_fails("input x: f32[N]\noutput y = x * 1e\n", &["unexpected name `e`", "an operator"]);
    check_fails("input x: f32[N]\noutput y = \"x\"\n", &["unexpected character `\"`"]);
    check_fails("input x: f32[N]\noutput y = (x + 1\n", &["unexpected end", "`)`"]);
    check_fails("input x: f32[N]\noutput = x\n", &["unexpected `=`"]);
    check_fails("input x: f32[N]\noutput y = x x\n", &["unexpected name `x`", "end of the line"]);
    check_fails("input x: f32[N]\noutput y = 0 < x < 1\n", &["comparisons do not chain"]);
    check_fails("input x: f32[N]\noutput y = x ** 2\n", &["unexpected character", "pow(a, b)"]);
    check_fails("input x: f32[N]\noutput y = x[a]\n", &["x[.., 0]"]);
    check_fails("input x f32[N]\noutput y = x\n", &["expected"]);
    check_fails("input x: f32[N]\noutput y = x +\n", &["unexpected end of line", "an expression"]);
}

#[test]
fn empty_and_comment_only_programs_have_no_output() {
    check_fails("", &["defines no output", "output NAME = EXPR"]);
    check_fails("# nothing here\n\n", &["defines no output"]);
    check_fails("input x: f32[N]\nlet y = x\n", &["no output"]);
}

#[test]
fn unknown_names_functions_keywords_and_dtypes() {
    check_fails("input x: f32[N]\noutput y = w\n", &["unknown name `w`", "defined above"]);
    check_fails("input x: f32[N]\noutput y = cumsum(x)\n", &["unknown function `cumsum`", "built-in function"]);
    check_fails("input x: f32[N]\noutput y = f64(x)\n", &["unknown function `f64`"]);
    check_fails("input x: f32[N]\noutput y = sum(x, axes: -1)\n", &["no keyword argument `axes:`", "`axis:`"]);
    check_fails("input x: f64[N]\noutput y = x\n", &["unknown dtype `f64`", "f32, f16, bf16, i32, i64 or bool"]);
    check_fails("input x: f32[N]\noutput y: f64 = x\n", &["unknown dtype `f64`"]);
    check_fails("input x: f32[N]\noutput y = size(Q)\n", &["`Q` is not a dimension symbol", "N"]);
}

#[test]
fn type_errors() {
    let xm = "input x: f32[N]\ninput m: bool[N]\ninput i: i32[N]\n";
    check_fails(&format!("{xm}output y = x + m\n"), &["same kind, got f32 and bool", "where(c, 1.0, 0.0)"]);
    check_fails(&format!("{xm}output y = where(i, x, 0)\n"), &["`where` does not accept i32", "bool condition"]);
    check_fails(&format!("{xm}output y = where(x, x, 0)\n"), &["`where` does not accept f32"]);
    check_fails(&format!("{xm}output y = mean(m)\n"), &["`mean` does not accept bool", "count"]);
    check_fails(&format!("{xm}output y = not x\n"), &["`not` does not accept f32"]);
    check_fails(&format!("{xm}output y = x > m\n"), &["same kind, got f32 and bool"]);
    check_fails(&format!("{xm}output y = sum(x, where: i)\n"), &["where", "bool"]);
}

#[test]
fn negating_a_bool_names_the_operator_as_written() {
    let err = {
        let dir = Dir::new();
        let f = dir.kf("p.kf", "input m: bool[N]\noutput y = -m\n");
        fails(&kfuse(&["check", &f]), 1, &["`-` does not accept bool operands", "where(c, 1.0, 0.0)"])
    };
    assert!(!err.contains("`neg`"), "the IR's name of the operation leaked:\n{err}");
}

#[test]
fn shape_and_axis_errors() {
    check_fails("input a: f32[N]\ninput b: f32[M]\noutput y = a + b\n", &["cannot broadcast shape [N] with shape [M]"]);
    check_fails("input x: f32[B, N]\noutput y = sum(x, axis: -3)\n", &["axis -3 is out of range", "rank 2"]);
    check_fails("input x: f32[B, N]\noutput y = sum(x, axis: [1, 1])\n", &["named twice", "each named once"]);
    check_fails("input x: f32[N, 3]\noutput y = x[.., 3]\n", &["component index 3 is out of range", "from -3 to 2"]);
    check_fails("input x: f32[N, 3]\noutput y = x[.., -4]\n", &["out of range", "from -3 to 2"]);
    check_fails("input x: f32[N, M]\noutput y = x[.., -1]\n", &["symbolic size", "[N, M]", "index >= 0"]);
}

#[test]
fn grad_misuse() {
    check_fails(
        "input x: f32[N]\noutput y = x * x\noutput d = grad(y, x)\n",
        &["differentiates a scalar", "[N]", "sum"],
    );
    check_fails(
        "input x: f32[N]\nlet z = x * 2\noutput y = sum(z * z)\noutput d = grad(y, z)\n",
        &["with respect to an input, but `z` is not one"],
    );
    check_fails("input x: i32[N]\noutput y = sum(x)\noutput d = grad(y, x)\n", &["differentiates a float", "i64"]);
    check_fails("input x: f32[N]\noutput y = sum(x)\noutput d = grad(y)\n", &["grad"]);
}

#[test]
fn duplicate_names() {
    check_fails("input x: f32[N]\ninput x: f32[N]\noutput y = sum(x)\n", &["`x` is already defined", "line 1"]);
    check_fails("input x: f32[N]\noutput y = sum(x)\noutput y = x\n", &["`y` is already defined", "line 2"]);
    check_fails("input x: f32[N]\nlet x = 2\noutput y = x\n", &["`x` is already defined"]);
}

#[test]
fn layout_declarations() {
    check_fails(
        "input x: f32[B, N]\ninput l: i32[B]\noutput y = sum(x, where: mask(l))\n",
        &["`mask` takes an input declared as lengths", "as lengths(N)"],
    );
    check_fails("input x: f32[B, N]\ninput l: f32[B] as lengths(N)\noutput y = sum(x)\n", &["lengths must be i32"]);
    check_fails(
        "input x: f32[T]\ninput o: i32[S, 2] as offsets(T)\noutput y = sum(x)\n",
        &["offsets must have one axis"],
    );
    check_fails("input l: i32[B] as lengths(N)\noutput y = sum(l)\n", &["dimension `N` sizes no input's axis"]);
}

// ---- `kfuse run` with .npy inputs ----

const LENGTHS: &str =
    "input x: f32[B, N]\ninput lengths: i32[B] as lengths(N)\noutput y = sum(x, where: mask(lengths))\n";
const OFFSETS: &str = "input t: f32[T]\ninput offsets: i32[S] as offsets(T)\noutput y = sum(t) / max(size(T), 1)\n";

fn run_lengths(dir: &Dir, x: &str, lengths: &str) -> Output {
    let f = dir.kf("len.kf", LENGTHS);
    kfuse(&["run", &f, "--device", "cpu", "--input", &format!("x={x}"), "--input", &format!("lengths={lengths}")])
}

fn run_offsets(dir: &Dir, offsets: &[f64]) -> Output {
    let f = dir.kf("off.kf", OFFSETS);
    let t = dir.npy("t.npy", DType::F32, &[4], &[1.0, 2.0, 3.0, 4.0]);
    let o = dir.npy("o.npy", DType::I32, &[offsets.len()], offsets);
    kfuse(&["run", &f, "--device", "cpu", "--input", &format!("t={t}"), "--input", &format!("offsets={o}")])
}

#[test]
fn wrong_dtypes_ranks_and_sizes_of_inputs() {
    let dir = Dir::new();
    let ok_l = dir.npy("l.npy", DType::I32, &[4], &[1.0, 3.0, 2.0, 0.0]);
    let ok_x = dir.npy("x.npy", DType::F32, &[4, 3], &[1.0; 12]);
    let out = run_lengths(&dir, &ok_x, &ok_l);
    assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).contains("y = 6"), "{out:?}");
    let rank1 = dir.npy("x1.npy", DType::F32, &[4], &[1.0; 4]);
    fails(&run_lengths(&dir, &rank1, &ok_l), 1, &["input `x` has 1 axes", "declared with 2: f32[B, N]"]);
    let rank3 = dir.npy("x3.npy", DType::F32, &[4, 3, 2], &[1.0; 24]);
    fails(&run_lengths(&dir, &rank3, &ok_l), 1, &["input `x` has 3 axes", "f32[B, N]"]);
    let boolx = dir.npy("xb.npy", DType::Bool, &[4, 3], &[1.0; 12]);
    fails(&run_lengths(&dir, &boolx, &ok_l), 1, &["input `x` has dtype bool, but is declared as f32"]);
    let f32l = dir.npy("lf.npy", DType::F32, &[4], &[1.0, 3.0, 2.0, 0.0]);
    fails(&run_lengths(&dir, &ok_x, &f32l), 1, &["input `lengths` has dtype f32, but is declared as i32"]);
    let l5 = dir.npy("l5.npy", DType::I32, &[5], &[1.0; 5]);
    fails(&run_lengths(&dir, &ok_x, &l5), 1, &["input `lengths` has B = 5", "`x` already set B = 4"]);
}

#[test]
fn npy_files_kfuse_does_not_read() {
    let dir = Dir::new();
    let l = dir.npy("l.npy", DType::I32, &[4], &[1.0; 4]);
    // A float64 array as NumPy writes it by default.
    let mut f64_file = b"\x93NUMPY\x01\x00".to_vec();
    let header = "{'descr': '<f8', 'fortran_order': False, 'shape': (4, 3), }";
    let pad = 64 - (10 + header.len() + 1) % 64;
    let header = format!("{header}{}\n", " ".repeat(pad));
    f64_file.extend((header.len() as u16).to_le_bytes());
    f64_file.extend(header.as_bytes());
    f64_file.extend(std::iter::repeat_n(0u8, 12 * 8));
    std::fs::write(dir.path("x64.npy"), &f64_file).expect("write");
    let x64 = dir.path("x64.npy").display().to_string();
    fails(&run_lengths(&dir, &x64, &l), 1, &["x64.npy holds dtype '<f8'", "float32 '<f4'"]);
    let missing = dir.path("missing.npy").display().to_string();
    fails(&run_lengths(&dir, &missing, &l), 1, &["cannot read", "missing.npy", "No such file"]);
    let folder = dir.path("").display().to_string();
    fails(&run_lengths(&dir, &folder, &l), 1, &[]);
}

#[test]
fn bad_lengths_values() {
    let dir = Dir::new();
    let x = dir.npy("x.npy", DType::F32, &[4, 3], &[1.0; 12]);
    let neg = dir.npy("neg.npy", DType::I32, &[4], &[1.0, -1.0, 2.0, 0.0]);
    fails(&run_lengths(&dir, &x, &neg), 1, &["lengths[1] = -1 is negative"]);
    let big = dir.npy("big.npy", DType::I32, &[4], &[1.0, 5.0, 2.0, 0.0]);
    fails(&run_lengths(&dir, &x, &big), 1, &["lengths[1] = 5 is greater than N = 3"]);
}

#[test]
fn bad_offsets_values() {
    fails(&run_offsets(&Dir::new(), &[1.0, 2.0, 4.0]), 1, &["offsets[0] = 1, but must be 0"]);
    fails(&run_offsets(&Dir::new(), &[0.0, 3.0, 2.0, 4.0]), 1, &["offsets[2] = 2 is less than offsets[1] = 3"]);
    fails(&run_offsets(&Dir::new(), &[0.0, 2.0, 3.0]), 1, &["the last offset offsets[2] = 3 must equal T = 4"]);
    fails(&run_offsets(&Dir::new(), &[]), 1, &["input `offsets` is empty", "at least one element"]);
    fails(&run_offsets(&Dir::new(), &[0.0, 2.0, 9.0]), 1, &["offsets[2] = 9 is past the end (T = 4)"]);
    let out = run_offsets(&Dir::new(), &[0.0, 2.0, 4.0]);
    assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).contains("y = 2.5"), "{out:?}");
}

#[test]
fn input_arguments() {
    let dir = Dir::new();
    let f = dir.kf("len.kf", LENGTHS);
    let x = dir.npy("x.npy", DType::F32, &[4, 3], &[1.0; 12]);
    let xi = format!("x={x}");
    fails(
        &kfuse(&["run", &f, "--device", "cpu", "--input", &xi, "--input", &xi]),
        1,
        &["input `x` is given more than once"],
    );
    fails(&kfuse(&["run", &f, "--device", "cpu", "--input", &format!("={x}")]), 1, &["NAME=PATH", "must not be empty"]);
    fails(&kfuse(&["run", &f, "--device", "cpu", "--input", "x="]), 1, &["NAME=PATH", "must not be empty"]);
    fails(
        &kfuse(&["run", &f, "--device", "cpu", "--input", &format!("z={x}")]),
        1,
        &["unknown input `z`", "x, lengths"],
    );
}

// ---- Bad command-line arguments ----

#[test]
fn unknown_devices_architectures_and_option_values() {
    let dir = Dir::new();
    let f = dir.kf("len.kf", LENGTHS);
    fails(&kfuse(&["run", &f, "--device", "tpu"]), 2, &["invalid value 'tpu' for '--device", "cpu"]);
    fails(&kfuse(&["run", &f, "--device", "cuda:x"]), 2, &["invalid value 'cuda:x'"]);
    fails(&kfuse(&["compile", &f, "--arch", "sm_7"]), 1, &["invalid GPU architecture \"sm_7\"", "sm_90"]);
    fails(&kfuse(&["compile", &f, "--arch", "banana"]), 1, &["invalid GPU architecture \"banana\""]);
    fails(&kfuse(&["emit", &f, "--block-size", "100"]), 1, &["block size 100 is not supported", "multiple of 32"]);
    fails(&kfuse(&["emit", &f, "--block-size", "abc"]), 2, &["invalid value 'abc' for '--block-size"]);
    fails(&kfuse(&["emit", &f, "--elems-per-thread", "0"]), 1, &["0 elements per thread", "between 1 and 16"]);
    fails(&kfuse(&["emit", &f, "--lengths-gradient", "bogus"]), 2, &["invalid value 'bogus'", "two-kernels, one-pass"]);
    fails(&kfuse(&["frobnicate"]), 2, &["unrecognized subcommand 'frobnicate'"]);
    fails(&kfuse(&["run"]), 2, &["required arguments were not provided", "<FILE>"]);
    fails(
        &kfuse(&["gen", "boxes", "--batch", "-1", "--max-boxes", "4", "--out", "o"]),
        2,
        &["unexpected argument '-1'"],
    );
}

#[test]
fn program_files_that_cannot_be_read() {
    let dir = Dir::new();
    let missing = dir.path("missing.kf").display().to_string();
    fails(&kfuse(&["check", &missing]), 1, &["cannot read", "missing.kf"]);
    let folder = dir.path("").display().to_string();
    fails(&kfuse(&["check", &folder]), 1, &["cannot read"]);
}
