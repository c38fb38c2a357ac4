//! The on-disk entry format: a fixed header (magic, format version, arch asked for, arch the cubin
//! is for, NVRTC version, key, payload lengths, blake3 checksum) followed by the cubin, the PTX and
//! the NVRTC log.
//!
//! Decoding rejects anything that is not exactly a valid entry for the expected key and arch:
//! short files, foreign files, other format versions, wrong lengths, a wrong checksum. It does
//! not touch the file system.

use crate::key::CACHE_FORMAT_VERSION;
use crate::nvrtc::CompiledModule;
use crate::{Arch, CacheKey};

/// The first bytes of every entry.
pub(crate) const MAGIC: [u8; 8] = *b"KFUSEKC\0";
/// magic 8, format 4, arch 4 + 4, built-for arch 4 + 4, NVRTC version 4 + 4, key 32, three
/// lengths 3 x 8, checksum 32. An arch's second word is the minor version, with [`ACCEL_BIT`] set
/// for an `a` target (`sm_90a`).
pub(crate) const HEADER_LEN: usize = 8 + 4 + 8 + 8 + 8 + 32 + 24 + 32;
const ACCEL_BIT: u32 = 1 << 31;
const BUILT_FOR_AT: usize = 20;
const NVRTC_AT: usize = 28;
const KEY_AT: usize = 36;
const LENS_AT: usize = KEY_AT + 32;
const CHECKSUM_AT: usize = HEADER_LEN - 32;

fn push_arch(bytes: &mut Vec<u8>, arch: Arch) {
    bytes.extend_from_slice(&arch.major.to_le_bytes());
    let minor_word = arch.minor | if arch.accel { ACCEL_BIT } else { 0 };
    bytes.extend_from_slice(&minor_word.to_le_bytes());
}

fn arch_at(bytes: &[u8], at: usize) -> Arch {
    let minor_word = u32_at(bytes, at + 4);
    Arch { major: u32_at(bytes, at), minor: minor_word & !ACCEL_BIT, accel: minor_word & ACCEL_BIT != 0 }
}

/// The NVRTC version an entry's header records, read from its first bytes without checking the
/// rest (for `kfuse cache list`); `None` for anything that is not a header of this format.
pub(crate) fn nvrtc_version_of(header: &[u8]) -> Option<(i32, i32)> {
    if header.len() < HEADER_LEN || header[..8] != MAGIC || u32_at(header, 8) != CACHE_FORMAT_VERSION {
        return None;
    }
    Some((u32_at(header, NVRTC_AT) as i32, u32_at(header, NVRTC_AT + 4) as i32))
}
/// Larger entries are treated as damaged rather than read into memory.
pub(crate) const MAX_ENTRY_BYTES: u64 = 512 << 20;

/// Serialises a compiled module into one entry file's bytes.
pub(crate) fn encode(module: &CompiledModule) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(HEADER_LEN + module.cubin.len() + module.ptx.len() + module.log.len());
    bytes.extend_from_slice(&MAGIC);
    bytes.extend_from_slice(&CACHE_FORMAT_VERSION.to_le_bytes());
    push_arch(&mut bytes, module.arch);
    push_arch(&mut bytes, module.built_for);
    bytes.extend_from_slice(&module.nvrtc_version.0.to_le_bytes());
    bytes.extend_from_slice(&module.nvrtc_version.1.to_le_bytes());
    bytes.extend_from_slice(&module.key.0);
    for len in [module.cubin.len(), module.ptx.len(), module.log.len()] {
        bytes.extend_from_slice(&(len as u64).to_le_bytes());
    }
    bytes.extend_from_slice(&[0u8; 32]);
    bytes.extend_from_slice(&module.cubin);
    bytes.extend_from_slice(module.ptx.as_bytes());
    bytes.extend_from_slice(module.log.as_bytes());
    let checksum = checksum(&bytes);
    bytes[CHECKSUM_AT..HEADER_LEN].copy_from_slice(&checksum);
    bytes
}

/// blake3 over the whole entry with the checksum field taken as zero.
fn checksum(bytes: &[u8]) -> [u8; 32] {
    let mut hasher = blake3::Hasher::new();
    hasher.update(&bytes[..CHECKSUM_AT]);
    hasher.update(&[0u8; 32]);
    hasher.update(&bytes[HEADER_LEN..]);
    *hasher.finalize().as_bytes()
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    let mut word = [0u8; 4];
    word.copy_from_slice(&bytes[at..at + 4]);
    u32::from_le_bytes(word)
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(word)
}

/// Parses and checks an entry; the error says what is wrong with it.
pub(crate) fn decode(bytes: &[u8], key: &CacheKey, arch: Arch) -> Result<CompiledModule, String> {
    if bytes.is_empty() {
        return Err("empty file".to_string());
    }
    if bytes.len() < HEADER_LEN {
        return Err(format!("truncated: {} bytes, shorter than the {HEADER_LEN}-byte header", bytes.len()));
    }
    if bytes[..8] != MAGIC {
        return Err("not a kfuse cache entry (bad magic)".to_string());
    }
    let format = u32_at(bytes, 8);
    if format != CACHE_FORMAT_VERSION {
        return Err(format!("cache format version {format}, this kfuse reads {CACHE_FORMAT_VERSION}"));
    }
    let stored_arch = arch_at(bytes, 12);
    let built_for = arch_at(bytes, BUILT_FOR_AT);
    let nvrtc_version = (u32_at(bytes, NVRTC_AT) as i32, u32_at(bytes, NVRTC_AT + 4) as i32);
    let lens = [u64_at(bytes, LENS_AT), u64_at(bytes, LENS_AT + 8), u64_at(bytes, LENS_AT + 16)];
    let payload = (bytes.len() - HEADER_LEN) as u64;
    let declared = lens.iter().try_fold(0u64, |sum, len| sum.checked_add(*len));
    if declared != Some(payload) {
        return Err(format!(
            "truncated or padded: header declares {} payload bytes, file holds {payload}",
            declared.map_or("overflowing".to_string(), |d| d.to_string())
        ));
    }
    if checksum(bytes)[..] != bytes[CHECKSUM_AT..HEADER_LEN] {
        return Err("checksum mismatch (the file is damaged)".to_string());
    }
    if bytes[KEY_AT..KEY_AT + 32] != key.0 {
        return Err("entry holds another key than its file name says".to_string());
    }
    if stored_arch != arch {
        return Err(format!("entry is for {stored_arch}, found in the {arch} folder"));
    }
    // The lengths sum to the payload, which fits in memory, so each fits in usize.
    let cubin_len = usize::try_from(lens[0]).map_err(|_| "cubin length overflows".to_string())?;
    let ptx_len = usize::try_from(lens[1]).map_err(|_| "PTX length overflows".to_string())?;
    let cubin_end = HEADER_LEN + cubin_len;
    let ptx_end = cubin_end + ptx_len;
    let cubin = bytes[HEADER_LEN..cubin_end].to_vec();
    if cubin.len() < 4 || cubin[..4] != *b"\x7fELF" {
        return Err("cubin is not an ELF image".to_string());
    }
    let ptx = String::from_utf8(bytes[cubin_end..ptx_end].to_vec()).map_err(|_| "PTX is not UTF-8".to_string())?;
    let log = String::from_utf8_lossy(&bytes[ptx_end..]).into_owned();
    Ok(CompiledModule { key: *key, arch, built_for, nvrtc_version, cubin, ptx, log })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn module() -> CompiledModule {
        CompiledModule {
            key: CacheKey([7; 32]),
            arch: Arch::new(9, 0),
            built_for: Arch::new(9, 0),
            nvrtc_version: (13, 0),
            cubin: b"\x7fELF and more".to_vec(),
            ptx: ".version 9.0\n.target sm_90\n".to_string(),
            log: "warning: none".to_string(),
        }
    }

    #[test]
    fn round_trips() {
        let m = module();
        assert_eq!(decode(&encode(&m), &m.key, m.arch), Ok(m));
    }

    #[test]
    fn an_a_target_round_trips_and_is_not_its_plain_target() {
        let m = CompiledModule { arch: Arch::accelerated(9, 0), built_for: Arch::accelerated(9, 0), ..module() };
        let bytes = encode(&m);
        assert_eq!(decode(&bytes, &m.key, m.arch), Ok(m.clone()));
        assert!(decode(&bytes, &m.key, Arch::new(9, 0)).unwrap_err().contains("sm_90a"));
        // A plain target's minor word is the minor version alone.
        assert_eq!(encode(&module())[16..20], 0u32.to_le_bytes());
    }

    #[test]
    fn the_header_records_the_nvrtc_and_the_arch_the_cubin_is_for() {
        // Asked for sm_120, built by an NVRTC that knows only up to sm_100.
        let m =
            CompiledModule { arch: Arch::new(12, 0), built_for: Arch::new(10, 0), nvrtc_version: (12, 8), ..module() };
        let bytes = encode(&m);
        let back = decode(&bytes, &m.key, m.arch).expect("decodes");
        assert_eq!((back.built_for, back.nvrtc_version), (Arch::new(10, 0), (12, 8)));
        assert_eq!(nvrtc_version_of(&bytes[..HEADER_LEN]), Some((12, 8)));
        assert_eq!(nvrtc_version_of(&bytes[..HEADER_LEN - 1]), None);
        assert_eq!(nvrtc_version_of(&[0u8; HEADER_LEN]), None);
    }

    #[test]
    fn every_single_bit_flip_is_detected() {
        let m = module();
        let good = encode(&m);
        for byte in 0..good.len() {
            for bit in 0..8 {
                let mut bad = good.clone();
                bad[byte] ^= 1 << bit;
                assert!(decode(&bad, &m.key, m.arch).is_err(), "flip of bit {bit} in byte {byte} undetected");
            }
        }
    }

    #[test]
    fn every_truncation_and_extension_is_detected() {
        let m = module();
        let good = encode(&m);
        for len in 0..good.len() {
            assert!(decode(&good[..len], &m.key, m.arch).is_err(), "truncation to {len} undetected");
        }
        let mut longer = good.clone();
        longer.push(0);
        assert!(decode(&longer, &m.key, m.arch).is_err());
    }

    #[test]
    fn wrong_key_arch_or_version_is_detected() {
        let m = module();
        let good = encode(&m);
        assert!(decode(&good, &CacheKey([8; 32]), m.arch).unwrap_err().contains("another key"));
        assert!(decode(&good, &m.key, Arch::new(8, 0)).unwrap_err().contains("sm_90"));
        let mut other_version = good.clone();
        other_version[8] = 99;
        let fixed = checksum(&other_version);
        other_version[CHECKSUM_AT..HEADER_LEN].copy_from_slice(&fixed);
        assert!(decode(&other_version, &m.key, m.arch).unwrap_err().contains("format version 99"));
        let text = "hello, I am a text file long enough to pass the header length check. ".repeat(3);
        assert!(text.len() > HEADER_LEN);
        assert!(decode(text.as_bytes(), &m.key, m.arch).unwrap_err().contains("magic"));
    }
}
