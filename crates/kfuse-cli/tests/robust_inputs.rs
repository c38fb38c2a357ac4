//! The command-line tool on files a user may give by mistake: devices, FIFOs, folders, huge or
//! binary sources, malformed `.npy` inputs, outputs that cannot be written, `i32` sums beyond
//! the `i32` range (exact `i64`s). Every case exits with status 1 and one error that names the file or input and
//! says what is wrong (its cause printed once), or gives the correct result. Pure tier: no GPU
//! (`--device cpu`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use kfuse::{DType, HostTensor};
use kfuse_cli::npy;

mod common;
use common::{kfuse, stderr, stdout};

/// Asserts exit status 1, one `error` line, no panic, and every `needle` in stderr.
fn fails_with(out: &Output, needles: &[&str]) {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(1), "expected exit status 1; stderr: {err}");
    assert!(!err.contains("panicked"), "panic: {err}");
    for n in needles {
        assert!(err.contains(n), "stderr lacks {n:?}:\n{err}");
    }
    assert_eq!(err.lines().filter(|l| l.starts_with("error")).count(), 1, "one error line:\n{err}");
}

/// Asserts success and returns stdout.
fn succeeds(out: &Output) -> String {
    assert!(out.status.success(), "expected success; stderr: {}", stderr(out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn path_str(p: &Path) -> String {
    p.display().to_string()
}

fn write_file(dir: &Path, name: &str, bytes: &[u8]) -> String {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    path_str(&p)
}

/// An `.npy` file's bytes: format `version`, the header dict `dict`, then `data`.
fn npy_bytes(version: u8, dict: &str, data: &[u8]) -> Vec<u8> {
    let prelude = if version == 1 { 10 } else { 12 };
    let mut text = dict.to_string();
    while !(prelude + text.len() + 1).is_multiple_of(64) {
        text.push(' ');
    }
    text.push('\n');
    let mut b = b"\x93NUMPY".to_vec();
    b.extend([version, 0]);
    if version == 1 {
        b.extend((text.len() as u16).to_le_bytes());
    } else {
        b.extend((text.len() as u32).to_le_bytes());
    }
    b.extend(text.as_bytes());
    b.extend(data);
    b
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// A program with one f32 vector input and a scalar output.
const SUM_F32: &str = "input x: f32[N]\noutput s = sum(x)\n";

/// `kfuse run` of `program` on the CPU with `x` read from `npy`.
fn run_x(dir: &Path, program: &str, npy: &str) -> Output {
    let kf = write_file(dir, "p.kf", program.as_bytes());
    kfuse(&["run", &kf, "--input", &format!("x={npy}"), "--device", "cpu", "--output", &path_str(dir)])
}

#[test]
fn sources_that_are_not_regular_files_are_refused_without_reading() {
    let d = tempfile::tempdir().unwrap();
    // A folder as the source, for every command that reads one.
    let dir = path_str(d.path());
    for cmd in ["check", "emit"] {
        fails_with(&kfuse(&[cmd, &dir]), &[&dir, "is a directory, not a regular file"]);
    }
    fails_with(&kfuse(&["run", &dir, "--device", "cpu"]), &["is a directory, not a regular file"]);
    // A device that never ends (this used to grow memory until killed).
    if Path::new("/dev/zero").exists() {
        fails_with(&kfuse(&["check", "/dev/zero"]), &["/dev/zero", "a character device, not a regular file"]);
        fails_with(&kfuse(&["emit", "/dev/null"]), &["/dev/null", "a character device, not a regular file"]);
    } else {
        eprintln!("SKIPPED: /dev/zero does not exist on this system");
    }
}

#[test]
fn a_fifo_is_refused_without_waiting_for_a_writer() {
    let d = tempfile::tempdir().unwrap();
    let fifo = d.path().join("pipe.kf");
    match Command::new("mkfifo").arg(&fifo).status() {
        Ok(s) if s.success() => {
            let shown = path_str(&fifo);
            fails_with(&kfuse(&["check", &shown]), &[&shown, "a FIFO (named pipe), not a regular file"]);
            let npy_fifo = path_str(&fifo);
            fails_with(&run_x(d.path(), SUM_F32, &npy_fifo), &["--input x", "FIFO", "not a regular file"]);
        }
        _ => eprintln!("SKIPPED: mkfifo is not available here"),
    }
}

#[test]
fn an_oversize_source_is_refused_with_the_limit() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("huge.kf");
    // Sparse: 64 MiB + 1 byte of zeros costs no disk.
    std::fs::File::create(&p).unwrap().set_len((64 << 20) + 1).unwrap();
    fails_with(&kfuse(&["check", &path_str(&p)]), &["huge.kf", "more than 67108864 bytes", "kfuse source"]);
}

#[test]
fn a_missing_file_prints_its_cause_once() {
    let d = tempfile::tempdir().unwrap();
    let missing = path_str(&d.path().join("missing.kf"));
    for args in [vec!["check", &missing], vec!["emit", &missing], vec!["run", &missing, "--device", "cpu"]] {
        let out = kfuse(&args);
        fails_with(&out, &[&missing]);
        let err = stderr(&out);
        let cause = "No such file or directory";
        assert_eq!(err.matches(cause).count(), 1, "the cause once: {err}");
    }
    // The same for an input file, with the input's name.
    let npy_missing = path_str(&d.path().join("x.npy"));
    let out = run_x(d.path(), SUM_F32, &npy_missing);
    fails_with(&out, &["--input x", "x.npy"]);
    assert_eq!(stderr(&out).matches("No such file or directory").count(), 1, "{}", stderr(&out));
}

#[test]
fn a_byte_order_mark_is_accepted() {
    let d = tempfile::tempdir().unwrap();
    let kf = write_file(d.path(), "bom.kf", format!("\u{FEFF}{SUM_F32}").as_bytes());
    let graph = succeeds(&kfuse(&["check", &kf]));
    assert!(graph.contains("output s"), "{graph}");
    // Lines and columns of an error count from after the mark.
    let bad = write_file(d.path(), "bombad.kf", "\u{FEFF}input x: f32[N]\noutput s = sum(y)\n".as_bytes());
    fails_with(&kfuse(&["check", &bad]), &["bombad.kf:2:16", "unknown name `y`"]);
}

#[test]
fn invisible_and_control_characters_are_named_by_code_point_with_their_place() {
    let d = tempfile::tempdir().unwrap();
    let cases: [(&str, &str, &[&str]); 7] = [
        ("nul.kf", "input x: f32[N]\noutput s = sum(x)\0\n", &["nul.kf:2:18", "U+0000 (NUL)", "␀", "^"]),
        ("bel.kf", "input x: f32[N]\noutput s =\x07 sum(x)\n", &["bel.kf:2:11", "U+0007 (a control character)"]),
        ("esc.kf", "input x: f32[N]\n\x1b[31moutput s = sum(x)\n", &["esc.kf:2:1", "U+001B"]),
        ("zwsp.kf", "input x: f32[N]\noutput s = sum(\u{200B}x)\n", &["zwsp.kf:2:16", "U+200B (zero-width space)"]),
        ("nbsp.kf", "input x: f32[N]\noutput s =\u{A0}sum(x)\n", &["nbsp.kf:2:11", "U+00A0 (no-break space)"]),
        ("bom2.kf", "input x: f32[N]\n\u{FEFF}output s = sum(x)\n", &["bom2.kf:2:1", "U+FEFF (byte-order mark)"]),
        (
            "bidi.kf",
            "input x: f32[N]\n# harmless \u{202E} comment\noutput s = sum(x)\n",
            &["bidi.kf:2:12", "comment", "U+202E (a bidirectional text control)"],
        ),
    ];
    for (name, text, needles) in cases {
        let kf = write_file(d.path(), name, text.as_bytes());
        fails_with(&kfuse(&["check", &kf]), needles);
    }
    // Tabs, carriage returns and visible non-ASCII text in comments are fine.
    let ok = write_file(d.path(), "ok.kf", "input x: f32[N]\t# café, naïve — ok\r\noutput s = sum(x)\r\n".as_bytes());
    succeeds(&kfuse(&["check", &ok]));
}

#[test]
fn a_source_that_is_not_utf8_says_where() {
    let d = tempfile::tempdir().unwrap();
    // Line 3, column 5: byte offset 16 + 16 + 4 = 36.
    let kf = write_file(d.path(), "latin1.kf", b"input x: f32[N]\nlet y = x * 2.0\n# ca\xe9\noutput s = sum(y)\n");
    fails_with(&kfuse(&["check", &kf]), &["latin1.kf:3:5", "not UTF-8", "byte 0xE9", "byte offset 36", "UTF-8"]);
    // A binary file: the first bad byte is reported.
    let bin = write_file(d.path(), "bin.kf", &[0xff, 0xfe, 0x00, 0x01]);
    fails_with(&kfuse(&["check", &bin]), &["bin.kf:1:1", "byte 0xFF", "byte offset 0"]);
}

#[test]
fn truncated_npy_says_what_its_header_promises_and_what_it_has() {
    let d = tempfile::tempdir().unwrap();
    let full = npy_bytes(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }", &f32_bytes(&[1.0; 4]));
    let cut = write_file(d.path(), "cut.npy", &full[..full.len() - 3]);
    fails_with(&run_x(d.path(), SUM_F32, &cut), &["--input x", "cut.npy", "promises 16 bytes of data", "has 13"]);
    // Padded with bytes the header does not account for.
    let mut long = full.clone();
    long.extend([0u8; 5]);
    let long = write_file(d.path(), "long.npy", &long);
    fails_with(&run_x(d.path(), SUM_F32, &long), &["long.npy", "promises 16 bytes of data", "has 21"]);
    // Cut inside the header.
    let head = write_file(d.path(), "head.npy", &full[..40]);
    fails_with(&run_x(d.path(), SUM_F32, &head), &["head.npy", "bytes of header", "has 40"]);
    // Cut inside the magic and version.
    let stub = write_file(d.path(), "stub.npy", &full[..8]);
    fails_with(&run_x(d.path(), SUM_F32, &stub), &["stub.npy", "promises 10 bytes of header", "has 8"]);
    // A header that promises a billion elements of a 16-byte file is refused at once.
    let big = npy_bytes(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1000000000,), }", &[0; 16]);
    let big = write_file(d.path(), "big.npy", &big);
    fails_with(&run_x(d.path(), SUM_F32, &big), &["big.npy", "promises 4000000000 bytes of data", "has 16"]);
    // A shape whose element count overflows.
    let huge = npy_bytes(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296), }", &[]);
    let huge = write_file(d.path(), "huge.npy", &huge);
    fails_with(&run_x(d.path(), SUM_F32, &huge), &["huge.npy", "more elements than fit in memory"]);
}

#[test]
fn malformed_npy_headers_are_clear_errors() {
    let d = tempfile::tempdir().unwrap();
    let data = f32_bytes(&[1.0; 3]);
    let cases: Vec<(&str, Vec<u8>, &[&str])> = vec![
        ("magic.npy", b"PK\x03\x04 this is a zip file".to_vec(), &["magic.npy", "not a .npy file", "magic"]),
        ("empty.npy", Vec::new(), &["empty.npy", "not a .npy file"]),
        (
            "v9.npy",
            {
                let mut b = npy_bytes(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", &data);
                b[6] = 9;
                b
            },
            &["v9.npy", "not a valid .npy file", "format version is 9.0"],
        ),
        (
            "noshape.npy",
            npy_bytes(1, "{'descr': '<f4', 'fortran_order': False, }", &data),
            &["noshape.npy", "header is malformed", "no 'shape'"],
        ),
        (
            "negshape.npy",
            npy_bytes(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (-3,), }", &data),
            &["negshape.npy", "header is malformed", "'shape'"],
        ),
        (
            "notdict.npy",
            npy_bytes(1, "['descr', '<f4']", &data),
            &["notdict.npy", "header is malformed", "expected `{`"],
        ),
        (
            "binaryheader.npy",
            npy_bytes(1, "{'descr': '<f4', 'fortran_order': \u{1}, 'shape': (3,), }", &data),
            &["binaryheader.npy", "header is malformed", "fortran_order"],
        ),
        (
            "longheader.npy",
            {
                let mut b = b"\x93NUMPY\x02\x00".to_vec();
                b.extend(0x00ff_ffffu32.to_le_bytes());
                b.extend(b"{}");
                b
            },
            &["longheader.npy", "16777215 bytes long"],
        ),
        (
            "v2.npy",
            npy_bytes(2, "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", &data[..8]),
            &["v2.npy", "promises 12 bytes of data", "has 8"],
        ),
    ];
    for (name, bytes, needles) in cases {
        let p = write_file(d.path(), name, &bytes);
        fails_with(&run_x(d.path(), SUM_F32, &p), needles);
    }
    // Format 2.0 with a well-formed header reads.
    let v2 = write_file(
        d.path(),
        "v2ok.npy",
        &npy_bytes(2, "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", &data),
    );
    assert!(succeeds(&run_x(d.path(), SUM_F32, &v2)).contains("s = 3"));
}

#[test]
fn npy_dtypes_and_layouts_kfuse_does_not_read_say_so() {
    let d = tempfile::tempdir().unwrap();
    let cases: [(&str, &str, usize, &[&str]); 5] = [
        (
            "fortran.npy",
            "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }",
            16,
            &["Fortran order", "np.ascontiguousarray"],
        ),
        ("bigendian.npy", "{'descr': '>f4', 'fortran_order': False, 'shape': (4,), }", 16, &["'>f4'", "big-endian"]),
        ("f64.npy", "{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }", 16, &["'<f8'", "float32 '<f4'"]),
        ("object.npy", "{'descr': '|O', 'fortran_order': False, 'shape': (2,), }", 16, &["'|O'", "pickled"]),
        ("record.npy", "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (4,), }", 16, &["structured"]),
    ];
    for (name, dict, data_len, needles) in cases {
        let p = write_file(d.path(), name, &npy_bytes(1, dict, &vec![0u8; data_len]));
        let mut all = vec![name];
        all.extend_from_slice(needles);
        fails_with(&run_x(d.path(), SUM_F32, &p), &all);
    }
    // A Fortran-order vector is the same bytes as a C-order one: it reads.
    let p = write_file(
        d.path(),
        "fvec.npy",
        &npy_bytes(1, "{'descr': '<f4', 'fortran_order': True, 'shape': (2,), }", &f32_bytes(&[1.5, 2.0])),
    );
    assert!(succeeds(&run_x(d.path(), SUM_F32, &p)).contains("s = 3.5"));
}

#[test]
fn npy_inputs_of_the_wrong_dtype_or_rank_name_the_input() {
    let d = tempfile::tempdir().unwrap();
    let write = |name: &str, t: &HostTensor| {
        let p = d.path().join(name);
        npy::write_npy(&p, t).unwrap();
        path_str(&p)
    };
    let ints = write("ints.npy", &HostTensor::from_f64(DType::I32, vec![3], &[1.0, 2.0, 3.0]));
    fails_with(&run_x(d.path(), SUM_F32, &ints), &["input `x` has dtype i32, but is declared as f32"]);
    let bools = write("bools.npy", &HostTensor::from_f64(DType::Bool, vec![2], &[1.0, 0.0]));
    fails_with(&run_x(d.path(), SUM_F32, &bools), &["input `x` has dtype bool"]);
    let matrix = write("matrix.npy", &HostTensor::from_f64(DType::F32, vec![2, 2], &[1.0; 4]));
    fails_with(&run_x(d.path(), SUM_F32, &matrix), &["input `x` has 2 axes", "f32[N]"]);
    let scalar = write("scalar.npy", &HostTensor::from_f64(DType::F32, vec![], &[1.0]));
    fails_with(&run_x(d.path(), SUM_F32, &scalar), &["input `x` has 0 axes"]);
    let boxes = write("boxes.npy", &HostTensor::from_f64(DType::F32, vec![2, 3], &[1.0; 6]));
    let kf = "input x: f32[B, 4]\noutput s = sum(x[.., 0])\n";
    fails_with(&run_x(d.path(), kf, &boxes), &["input `x` has size 3 on axis 1", "fixes it at 4"]);
    // Not a regular file.
    fails_with(&run_x(d.path(), SUM_F32, &path_str(d.path())), &["--input x", "is a directory, not a regular file"]);
    if Path::new("/dev/zero").exists() {
        fails_with(&run_x(d.path(), SUM_F32, "/dev/zero"), &["--input x", "a character device"]);
    }
}

#[test]
fn run_checks_its_output_folder_before_computing() {
    let d = tempfile::tempdir().unwrap();
    let kf = write_file(d.path(), "t.kf", b"input x: f32[N]\noutput y = x * 2.0\n");
    let file = write_file(d.path(), "afile", b"user data");
    // The input is missing too: the output folder is checked first, before anything is read.
    let missing = format!("x={}", path_str(&d.path().join("missing.npy")));
    let out = kfuse(&["run", &kf, "--input", &missing, "--device", "cpu", "--output", &file]);
    fails_with(&out, &["--output", "afile", "is a file, not a folder"]);
    assert_eq!(std::fs::read(&file).unwrap(), b"user data");
    // A folder under a file.
    let under = path_str(&d.path().join("afile").join("out"));
    fails_with(
        &kfuse(&["run", &kf, "--input", &missing, "--device", "cpu", "--output", &under]),
        &["--output", "cannot create the folder"],
    );
    // A folder that cannot be created, whoever runs the test.
    if Path::new("/proc/self").exists() {
        fails_with(
            &kfuse(&["run", &kf, "--input", &missing, "--device", "cpu", "--output", "/proc/kfuse-out"]),
            &["--output /proc/kfuse-out", "cannot create the folder"],
        );
    }
    // A missing folder is created, and the outputs land in it.
    let x = d.path().join("x.npy");
    npy::write_npy(&x, &HostTensor::from_f64(DType::F32, vec![2], &[1.0, 2.0])).unwrap();
    let fresh = d.path().join("new").join("deeper");
    let input = format!("x={}", path_str(&x));
    succeeds(&kfuse(&["run", &kf, "--input", &input, "--device", "cpu", "--output", &path_str(&fresh)]));
    let y = npy::read_npy(&fresh.join("y.npy")).unwrap();
    assert_eq!(y.to_f64(), vec![2.0, 4.0]);
    // Scalar outputs only: no folder is needed, so a file there is no error.
    let kf = write_file(d.path(), "s.kf", SUM_F32.as_bytes());
    let out = succeeds(&kfuse(&["run", &kf, "--input", &input, "--device", "cpu", "--output", &file]));
    assert!(out.contains("s = 3"), "{out}");
}

#[test]
fn an_unwritable_output_folder_is_refused_before_computing() {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        let d = tempfile::tempdir().unwrap();
        let locked = d.path().join("locked");
        std::fs::create_dir(&locked).unwrap();
        std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o555)).unwrap();
        // A user who may write anyway (root) cannot run this case.
        if std::fs::write(locked.join("probe"), b"").is_ok() {
            eprintln!("SKIPPED: this user can write into a read-only folder (root?)");
            return;
        }
        let kf = write_file(d.path(), "t.kf", b"input x: f32[N]\noutput y = x * 2.0\n");
        let missing = format!("x={}", path_str(&d.path().join("missing.npy")));
        let out = kfuse(&["run", &kf, "--input", &missing, "--device", "cpu", "--output", &path_str(&locked)]);
        fails_with(&out, &["--output", "cannot write in the folder", "Permission denied"]);
    }
}

#[test]
fn an_i32_sum_is_an_exact_i64() {
    // As torch sums integers: the total is an i64, so totals beyond the i32 range are exact.
    let d = tempfile::tempdir().unwrap();
    let program = "input x: i32[N]\noutput s = sum(x)\n";
    let write = |name: &str, v: &[f64]| {
        let p = d.path().join(name);
        npy::write_npy(&p, &HostTensor::from_f64(DType::I32, vec![v.len()], v)).unwrap();
        path_str(&p)
    };
    let big = write("big.npy", &[1073741824.0, 1073741824.0, 1073741824.0]);
    assert!(succeeds(&run_x(d.path(), program, &big)).contains("s = 3221225472"));
    let low = write("low.npy", &[-2147483648.0, -1.0]);
    assert!(succeeds(&run_x(d.path(), program, &low)).contains("s = -2147483649"));
    let fits = write("fits.npy", &[2147483647.0, 2147483647.0, -2147483648.0, -2147483648.0, 5.0]);
    assert!(succeeds(&run_x(d.path(), program, &fits)).contains("s = 3"));
    // A sum along the last axis too: the second row's total is 2^31, stored as an i64.
    let rows = "input x: i32[B, K]\noutput s = sum(x, axis: -1)\n";
    let p = d.path().join("rows.npy");
    npy::write_npy(&p, &HostTensor::from_f64(DType::I32, vec![2, 2], &[1.0, 2.0, 1073741824.0, 1073741824.0])).unwrap();
    succeeds(&run_x(d.path(), rows, &path_str(&p)));
    let s = npy::read_npy(&d.path().join("s.npy")).unwrap();
    assert_eq!(s.dtype(), DType::I64);
    assert_eq!(s.to_f64(), vec![3.0, 2147483648.0]);
}

#[test]
fn mlp_model_files_that_are_not_regular_files_are_refused() {
    let d = tempfile::tempdir().unwrap();
    let x = d.path().join("x.npy");
    npy::write_npy(&x, &HostTensor::from_f64(DType::F32, vec![1, 2], &[1.0, 2.0])).unwrap();
    let y = path_str(&d.path().join("y.npy"));
    let mlp = |model: &str| kfuse(&["mlp", "run", model, "--input", &path_str(&x), "--output", &y, "--device", "cpu"]);
    fails_with(&mlp(&path_str(d.path())), &["is a directory, not a regular file"]);
    if Path::new("/dev/zero").exists() {
        fails_with(&mlp("/dev/zero"), &["/dev/zero", "a character device"]);
    }
    // Its weights file, named by the description, missing: the cause once.
    let json = write_file(
        d.path(),
        "model.json",
        br#"{"format": "kfuse-mlp/1", "weights": "w.safetensors", "dtype": "f16", "layers": [{"weight": "a"}]}"#,
    );
    let out = mlp(&json);
    fails_with(&out, &["w.safetensors"]);
    assert_eq!(stderr(&out).matches("No such file or directory").count(), 1, "{}", stderr(&out));
    // Its weights file a folder.
    std::fs::create_dir(d.path().join("w.safetensors")).unwrap();
    fails_with(&mlp(&json), &["w.safetensors", "is a directory, not a regular file"]);
}

#[test]
fn messages_name_options_as_the_command_line_spells_them() {
    let lengths = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/giou_train_lengths.kf");
    let out = kfuse(&["emit", &path_str(&lengths), "--block-size", "128"]);
    fails_with(&out, &["block size 128", "--lengths-gradient two-kernels"]);
    assert!(!stderr(&out).contains("::"), "a Rust path in the message: {}", stderr(&out));
}

/// `kfuse compile` of examples/giou.kf for sm_90 into a fresh cache under `dir`, with
/// `KFUSE_NVRTC_LIBRARY` naming `library` and, when `search_path` is false, no LD_LIBRARY_PATH.
fn compile_with_nvrtc_library(dir: &Path, library: &Path, search_path: bool) -> Output {
    let mut command = common::command();
    command
        .args(["compile", "--arch", "sm_90", "../../examples/giou.kf"])
        .env("KFUSE_NVRTC_LIBRARY", library)
        .env("KFUSE_CACHE_DIR", dir.join("cache"));
    if !search_path {
        command.env_remove("LD_LIBRARY_PATH");
    }
    command.output().expect("kfuse runs")
}

#[test]
fn an_nvrtc_library_named_that_does_not_load_is_a_warning_then_the_search_by_name() {
    // A file that is not a library: loading it fails, kfuse says so once, and NVRTC is then found
    // by name as without the variable (a compile succeeds where NVRTC is installed, and is the
    // usual "NVRTC is not available" error where it is not).
    let dir = tempfile::tempdir().unwrap();
    let bogus = write_file(dir.path(), "libnvrtc.so.13", b"not a shared library");
    let out = compile_with_nvrtc_library(dir.path(), Path::new(&bogus), true);
    let err = stderr(&out);
    assert!(err.contains("KFUSE_NVRTC_LIBRARY=") && err.contains("does not load"), "{err}");
    assert_eq!(err.matches("does not load").count(), 1, "warned once: {err}");
    if out.status.success() {
        assert!(stdout(&out).contains("sm_90"), "{}", stdout(&out));
    } else {
        assert!(err.contains("NVRTC"), "{err}");
    }
}

#[test]
fn the_nvrtc_library_named_by_path_compiles_without_the_library_search_path() {
    // What the Python package does for its NVRTC wheel: name the library file and leave
    // LD_LIBRARY_PATH alone; kfuse loads it (and its builtins, from the same folder) to compile.
    let test = "the_nvrtc_library_named_by_path_compiles_without_the_library_search_path";
    if kfuse::runtime::testing::nvrtc_or_skip(test).is_none() {
        return;
    }
    // The file this process loaded NVRTC from (the tier gate above loaded it).
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    let library = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| p.rsplit('/').next().is_some_and(|n| n.starts_with("libnvrtc.so")))
        .map(PathBuf::from)
        .expect("NVRTC is loaded, so its file is mapped");
    let dir = tempfile::tempdir().unwrap();
    let out = compile_with_nvrtc_library(dir.path(), &library, false);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("miss (compiled)"), "{}", stdout(&out));
}
