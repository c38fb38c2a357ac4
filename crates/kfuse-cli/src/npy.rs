//! `.npy` files in and out: read by a small reader of its own (it reads only a regular file, and
//! no more than the header promises and the file holds), written through the `npyz` crate.
//!
//! Handles C-order arrays of `float32`, `float16`, `int32`, `int64`, `bool`, and bfloat16 as NumPy's
//! `ml_dtypes` writes it (`'<V2'`, two raw bytes per element: load it in Python with
//! `np.load(p).view(ml_dtypes.bfloat16)`). Fortran order, pickled object arrays, big-endian and
//! other dtypes are clear errors naming the file.

use std::fs::File;
use std::io::{BufWriter, Read as _};
use std::path::{Path, PathBuf};

use half::{bf16, f16};
use kfuse::lang::files::{self, FileError};
use kfuse::{DType, HostTensor, TensorData};
use npyz::WriterBuilder;

/// The first six bytes of every `.npy` file.
const MAGIC: &[u8] = b"\x93NUMPY";
/// The longest header read (NumPy itself refuses headers over 10 000 bytes by default).
const MAX_HEADER_BYTES: u64 = 64 << 10;

/// Why an `.npy` file could not be read or written. Each message names the file.
#[derive(Debug, thiserror::Error)]
pub enum NpyError {
    /// Missing, unreadable, or not a regular file.
    #[error(transparent)]
    File(#[from] FileError),
    #[error("{} is not a .npy file: it does not start with the .npy magic bytes \\x93NUMPY", path.display())]
    Magic { path: PathBuf },
    #[error("{} is not a valid .npy file: its format version is {major}.{minor} (kfuse reads 1.0, 2.0 and 3.0)", path.display())]
    Version { path: PathBuf, major: u8, minor: u8 },
    #[error("{} is not a valid .npy file: its header is malformed: {why}", path.display())]
    Header { path: PathBuf, why: String },
    /// The header or the data are shorter (or the data longer) than the header says.
    #[error("{} is truncated or padded: its header promises {promised} bytes of {what}, but the file has {has}", path.display())]
    Size { path: PathBuf, what: &'static str, promised: u64, has: u64 },
    #[error("{} holds dtype '{descr}', which kfuse does not read (it reads float32 '<f4', float16 '<f2', bfloat16 '<V2', int32 '<i4' and bool '|b1'){hint}", path.display())]
    UnsupportedDType { path: PathBuf, descr: String, hint: &'static str },
    #[error("{} is in Fortran order; save it C-ordered (np.ascontiguousarray)", path.display())]
    FortranOrder { path: PathBuf },
    #[error("{}: its shape {shape:?} holds more elements than fit in memory", path.display())]
    TooLarge { path: PathBuf, shape: Vec<u64> },
    #[error("cannot write {}: {error}", path.display())]
    Write { path: PathBuf, error: std::io::Error },
}

/// A header's three fields.
struct Header {
    descr: String,
    fortran_order: bool,
    shape: Vec<u64>,
}

/// Reads an `.npy` file into a host tensor of the dtype the file holds. Only a regular file is
/// read, and no more than its header promises: a header that promises more or fewer bytes than
/// the file has is an error saying both.
pub fn read_npy(path: &Path) -> Result<HostTensor, NpyError> {
    let p = || path.to_path_buf();
    let (file, len) = files::open_regular(path, ".npy file")?;
    let io = |error| NpyError::File(FileError::Io { what: ".npy file", path: p(), error });
    let mut file = file.take(len);
    let mut pre = Vec::with_capacity(12);
    (&mut file).take(10).read_to_end(&mut pre).map_err(io)?;
    if pre.len() < MAGIC.len() || &pre[..MAGIC.len()] != MAGIC {
        return Err(NpyError::Magic { path: p() });
    }
    let truncated_prelude = |need: u64| NpyError::Size { path: p(), what: "header", promised: need, has: len };
    if pre.len() < 10 {
        return Err(truncated_prelude(10));
    }
    let (major, minor) = (pre[6], pre[7]);
    let header_len = match (major, minor) {
        (1, 0) => u64::from(u16::from_le_bytes([pre[8], pre[9]])),
        (2, 0) | (3, 0) => {
            (&mut file).take(2).read_to_end(&mut pre).map_err(io)?;
            if pre.len() < 12 {
                return Err(truncated_prelude(12));
            }
            u64::from(u32::from_le_bytes([pre[8], pre[9], pre[10], pre[11]]))
        }
        _ => return Err(NpyError::Version { path: p(), major, minor }),
    };
    let data_start = pre.len() as u64 + header_len;
    if header_len > MAX_HEADER_BYTES {
        let why =
            format!("it says it is {header_len} bytes long; kfuse reads headers of up to {MAX_HEADER_BYTES} bytes");
        return Err(NpyError::Header { path: p(), why });
    }
    if data_start > len {
        return Err(NpyError::Size { path: p(), what: "header", promised: data_start, has: len });
    }
    let mut text = Vec::with_capacity(header_len as usize);
    (&mut file).take(header_len).read_to_end(&mut text).map_err(io)?;
    if (text.len() as u64) < header_len {
        let has = pre.len() as u64 + text.len() as u64;
        return Err(NpyError::Size { path: p(), what: "header", promised: data_start, has });
    }
    let header = parse_header(&text).map_err(|why| NpyError::Header { path: p(), why })?;
    if header.fortran_order && header.shape.len() > 1 {
        return Err(NpyError::FortranOrder { path: p() });
    }
    let item = match header.descr.as_str() {
        "<i8" => 8,
        "<f4" | "<i4" => 4,
        "<f2" | "<V2" | "|V2" => 2,
        "|b1" => 1,
        _ => {
            let hint = if header.descr.starts_with('>') {
                "; this one is big-endian: save it little-endian (x.astype(x.dtype.newbyteorder('<')))"
            } else if header.descr.contains('O') {
                "; object arrays are pickled Python objects"
            } else {
                ""
            };
            return Err(NpyError::UnsupportedDType { path: p(), descr: header.descr, hint });
        }
    };
    let too_large = || NpyError::TooLarge { path: p(), shape: header.shape.clone() };
    let elements = header.shape.iter().try_fold(1u64, |n, &d| n.checked_mul(d)).ok_or_else(too_large)?;
    let promised = elements.checked_mul(item).ok_or_else(too_large)?;
    let has = len - data_start;
    if promised != has {
        return Err(NpyError::Size { path: p(), what: "data", promised, has });
    }
    let mut data = Vec::new();
    data.try_reserve_exact(usize::try_from(promised).map_err(|_| too_large())?).map_err(|_| too_large())?;
    file.read_to_end(&mut data).map_err(io)?;
    if data.len() as u64 != promised {
        // The file changed while it was read.
        return Err(NpyError::Size { path: p(), what: "data", promised, has: data.len() as u64 });
    }
    let data = match header.descr.as_str() {
        "<f4" => TensorData::F32(data.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()),
        "<i4" => TensorData::I32(data.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()),
        "<i8" => {
            TensorData::I64(data.chunks_exact(8).map(|c| i64::from_le_bytes(std::array::from_fn(|k| c[k]))).collect())
        }
        "<f2" => TensorData::F16(data.chunks_exact(2).map(|c| f16::from_le_bytes([c[0], c[1]])).collect()),
        "|b1" => TensorData::Bool(data.iter().map(|&b| b != 0).collect()),
        _ => TensorData::BF16(data.chunks_exact(2).map(|c| bf16::from_le_bytes([c[0], c[1]])).collect()),
    };
    let shape = header.shape.iter().map(|&d| usize::try_from(d).map_err(|_| too_large())).collect::<Result<_, _>>()?;
    Ok(HostTensor::new(shape, data))
}

/// Parses a header's Python dict literal: `{'descr': '<f4', 'fortran_order': False, 'shape': (3,
/// 4), }`. Values other than strings, booleans and tuples of integers are kept as their text (a
/// structured dtype's list), which no supported dtype matches.
fn parse_header(bytes: &[u8]) -> Result<Header, String> {
    let text = std::str::from_utf8(bytes).map_err(|_| "it is not text".to_string())?;
    let mut p = Lit { s: text.trim_end().as_bytes(), i: 0 };
    let (mut descr, mut fortran_order, mut shape) = (None, None, None);
    p.expect(b'{')?;
    loop {
        p.skip_space();
        if p.eat(b'}') {
            break;
        }
        let key = p.string()?;
        p.skip_space();
        p.expect(b':')?;
        p.skip_space();
        match key.as_str() {
            "descr" => descr = Some(p.descr()?),
            "fortran_order" => fortran_order = Some(p.boolean()?),
            "shape" => shape = Some(p.tuple()?),
            _ => p.skip_value()?,
        }
        p.skip_space();
        if !p.eat(b',') {
            p.skip_space();
            p.expect(b'}')?;
            break;
        }
    }
    p.skip_space();
    if p.i != p.s.len() {
        return Err(format!("unexpected text after the dict at character {}", p.i));
    }
    let missing = |k: &str| format!("it has no '{k}'");
    Ok(Header {
        descr: descr.ok_or_else(|| missing("descr"))?,
        fortran_order: fortran_order.ok_or_else(|| missing("fortran_order"))?,
        shape: shape.ok_or_else(|| missing("shape"))?,
    })
}

/// A cursor over a header's text.
struct Lit<'a> {
    s: &'a [u8],
    i: usize,
}

impl Lit<'_> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }
    fn skip_space(&mut self) {
        while self.peek().is_some_and(|c| c.is_ascii_whitespace()) {
            self.i += 1;
        }
    }
    fn eat(&mut self, c: u8) -> bool {
        let hit = self.peek() == Some(c);
        self.i += usize::from(hit);
        hit
    }
    fn expect(&mut self, c: u8) -> Result<(), String> {
        if self.eat(c) {
            return Ok(());
        }
        Err(match self.peek() {
            Some(got) => format!("expected `{}` at character {}, found `{}`", c as char, self.i, got.escape_ascii()),
            None => format!("expected `{}` at character {}, found the end", c as char, self.i),
        })
    }
    fn string(&mut self) -> Result<String, String> {
        let quote = match self.peek() {
            Some(q @ (b'\'' | b'"')) => q,
            _ => return Err(format!("expected a quoted string at character {}", self.i)),
        };
        let start = self.i + 1;
        let len = self.s[start..].iter().position(|&c| c == quote).ok_or("a string is not closed")?;
        self.i = start + len + 1;
        Ok(String::from_utf8_lossy(&self.s[start..start + len]).into_owned())
    }
    /// A dtype: a string, or the text of a structured dtype's list.
    fn descr(&mut self) -> Result<String, String> {
        if matches!(self.peek(), Some(b'\'' | b'"')) {
            return self.string();
        }
        let start = self.i;
        self.skip_value()?;
        Ok(format!("structured {}", String::from_utf8_lossy(&self.s[start..self.i]).trim()))
    }
    fn boolean(&mut self) -> Result<bool, String> {
        for (word, v) in [(&b"True"[..], true), (&b"False"[..], false)] {
            if self.s[self.i..].starts_with(word) {
                self.i += word.len();
                return Ok(v);
            }
        }
        Err(format!("'fortran_order' is not True or False (at character {})", self.i))
    }
    fn tuple(&mut self) -> Result<Vec<u64>, String> {
        self.expect(b'(')?;
        let mut dims = Vec::new();
        loop {
            self.skip_space();
            if self.eat(b')') {
                return Ok(dims);
            }
            let start = self.i;
            while self.peek().is_some_and(|c| c.is_ascii_digit()) {
                self.i += 1;
            }
            let digits = std::str::from_utf8(&self.s[start..self.i]).unwrap_or("");
            let d = digits.parse::<u64>().map_err(|_| {
                format!("'shape' holds something other than a size (a non-negative integer) at character {start}")
            })?;
            dims.push(d);
            self.eat(b'L');
            self.skip_space();
            if !self.eat(b',') {
                self.skip_space();
                self.expect(b')')?;
                return Ok(dims);
            }
        }
    }
    /// Skips a value of another key: up to the next `,` or `}` outside brackets and strings.
    fn skip_value(&mut self) -> Result<(), String> {
        let mut depth = 0usize;
        while let Some(c) = self.peek() {
            match c {
                b'\'' | b'"' => {
                    self.string()?;
                    continue;
                }
                b'(' | b'[' | b'{' => depth += 1,
                b')' | b']' | b'}' if depth > 0 => depth -= 1,
                b',' | b'}' if depth == 0 => return Ok(()),
                _ => {}
            }
            self.i += 1;
        }
        Err("the dict is not closed".into())
    }
}

/// Writes a host tensor as a C-order `.npy` file (bf16 as `'<V2'`, see the module docs).
pub fn write_npy(path: &Path, t: &HostTensor) -> Result<(), NpyError> {
    let werr = |error| NpyError::Write { path: path.to_path_buf(), error };
    let file = File::create(path).map_err(werr)?;
    let shape: Vec<u64> = t.shape.iter().map(|&d| d as u64).collect();
    let w = BufWriter::new(file);
    match &t.data {
        TensorData::F32(v) => write_typed(w, &shape, v.iter().copied()),
        TensorData::F16(v) => write_typed(w, &shape, v.iter().copied()),
        TensorData::I32(v) => write_typed(w, &shape, v.iter().copied()),
        TensorData::I64(v) => write_typed(w, &shape, v.iter().copied()),
        TensorData::Bool(v) => write_typed(w, &shape, v.iter().copied()),
        TensorData::BF16(v) => write_bf16(w, &shape, v),
    }
    .map_err(werr)
}

fn write_bf16(w: BufWriter<File>, shape: &[u64], v: &[bf16]) -> std::io::Result<()> {
    let descr = "<V2".parse().map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("{e}")))?;
    let mut out = npyz::WriteOptions::<npyz::FixedSizeBytes<2>>::new()
        .dtype(npyz::DType::Plain(descr))
        .shape(shape)
        .writer(w)
        .begin_nd()?;
    out.extend(v.iter().map(|x| npyz::FixedSizeBytes(x.to_le_bytes())))?;
    out.finish()
}

fn write_typed<T: npyz::AutoSerialize>(
    w: BufWriter<File>,
    shape: &[u64],
    items: impl Iterator<Item = T>,
) -> std::io::Result<()> {
    let mut out = npyz::WriteOptions::<T>::new().default_dtype().shape(shape).writer(w).begin_nd()?;
    out.extend(items)?;
    out.finish()
}

/// The dtype a `.npy` would be read as (for messages).
pub fn dtype_name(d: DType) -> &'static str {
    match d {
        DType::F32 => "float32",
        DType::F16 => "float16",
        DType::BF16 => "bfloat16",
        DType::I32 => "int32",
        DType::I64 => "int64",
        DType::Bool => "bool",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_every_dtype() {
        let dir = tempfile::tempdir().unwrap();
        let vals = [1.5, -2.0, 0.0, 3.25, 7.0, -0.5];
        for d in DType::ALL {
            let t = HostTensor::from_f64(d, vec![2, 3], &vals);
            let p = dir.path().join(format!("{d}.npy"));
            write_npy(&p, &t).unwrap();
            assert_eq!(read_npy(&p).unwrap(), t, "{d}");
        }
    }

    #[test]
    fn i64_round_trips_at_its_limits_as_numpy_int64() {
        let dir = tempfile::tempdir().unwrap();
        let t = HostTensor::new(vec![4], TensorData::I64(vec![i64::MIN, -1, (1 << 53) + 1, i64::MAX]));
        let p = dir.path().join("labels.npy");
        write_npy(&p, &t).unwrap();
        let bytes = std::fs::read(&p).unwrap();
        assert!(String::from_utf8_lossy(&bytes[..128]).contains("'descr': '<i8'"), "numpy's int64 header");
        assert_eq!(read_npy(&p).unwrap(), t);
        assert_eq!(dtype_name(DType::I64), "int64");
    }

    #[test]
    fn corrupt_and_foreign_files_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.npy");
        std::fs::write(&p, b"not an npy file at all").unwrap();
        assert!(matches!(read_npy(&p), Err(NpyError::Magic { .. })));
        let t = HostTensor::from_f64(DType::F32, vec![4, 4], &[1.0; 16]);
        write_npy(&p, &t).unwrap();
        let bytes = std::fs::read(&p).unwrap();
        std::fs::write(&p, &bytes[..bytes.len() - 10]).unwrap();
        let e = read_npy(&p).unwrap_err();
        assert!(matches!(e, NpyError::Size { promised: 64, has: 54, .. }), "{e}");
        let e = read_npy(&dir.path().join("missing.npy")).unwrap_err();
        assert!(matches!(e, NpyError::File(FileError::Io { .. })), "{e}");
    }

    #[test]
    fn headers_parse_as_numpy_writes_them() {
        let h = parse_header(b"{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }      \n").unwrap();
        assert_eq!((h.descr.as_str(), h.fortran_order, h.shape), ("<f4", false, vec![3, 4]));
        let h = parse_header(b"{\"shape\": (5,), \"fortran_order\": True, \"descr\": [('a', '<f4')]}").unwrap();
        assert_eq!((h.descr.as_str(), h.fortran_order, h.shape), ("structured [('a', '<f4')]", true, vec![5]));
        assert_eq!(
            parse_header(b"{'descr': '|b1', 'fortran_order': False, 'shape': ()}").unwrap().shape,
            Vec::<u64>::new()
        );
        for bad in [
            &b"{'descr': '<f4', 'shape': (3,)}"[..],
            b"{'descr': '<f4', 'fortran_order': 0, 'shape': ()}",
            b"{'shape': (-1,)",
            b"[]",
            b"{'descr': '<f4",
        ] {
            assert!(parse_header(bad).is_err(), "{}", bad.escape_ascii());
        }
    }
}
