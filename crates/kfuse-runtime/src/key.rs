//! The cache key: a blake3 hash over what a kernel is asked to be (source, NVRTC options, target
//! arch, kfuse version, cache format version).
//!
//! NVRTC's version is not part of it, so that a lookup never loads libnvrtc: the entry records
//! which NVRTC built it, and a cubin that the driver then refuses is rebuilt in its place (the
//! cache heals itself; see `Gpu::load_kernel_for`). The target arch is the one asked for (the
//! device's), also when NVRTC does not know it and builds for an older one: that entry is found
//! again without asking NVRTC which archs it knows.
//!
//! The encoding is explicit and length-prefixed so the key is stable across builds, runs and
//! machines; it never uses `DefaultHasher`. It does not canonicalise the source: callers hash the
//! canonical generated source they compile.

use std::fmt;

use crate::Arch;

/// Version of the on-disk entry format; part of every key and every entry header. Version 2:
/// the key leaves out NVRTC's version and the header records it, with the arch the cubin is for.
pub const CACHE_FORMAT_VERSION: u32 = 2;

/// kfuse's own version, part of every key.
pub const KFUSE_VERSION: &str = env!("CARGO_PKG_VERSION");

/// A 256-bit content key naming one compiled module.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CacheKey(pub [u8; 32]);

/// Every input of the key, spelled out so tests can vary each one.
#[derive(Debug, Clone, Copy)]
pub struct KeyParts<'a> {
    /// The generated CUDA source, exactly as compiled.
    pub source: &'a str,
    /// The full NVRTC option list (arch option included).
    pub options: &'a [String],
    /// The target architecture asked for.
    pub arch: Arch,
    /// kfuse's version string.
    pub kfuse_version: &'a str,
    /// The cache format version.
    pub format_version: u32,
}

impl CacheKey {
    /// Hashes the key parts with a fixed, length-prefixed encoding.
    pub fn from_parts(parts: &KeyParts<'_>) -> CacheKey {
        let mut hasher = blake3::Hasher::new();
        let mut field = |bytes: &[u8]| {
            hasher.update(&(bytes.len() as u64).to_le_bytes());
            hasher.update(bytes);
        };
        field(b"kfuse-kernel-cache-key");
        field(&parts.format_version.to_le_bytes());
        field(parts.kfuse_version.as_bytes());
        field(&parts.arch.major.to_le_bytes());
        field(&parts.arch.minor.to_le_bytes());
        // Only the `a` targets add a field, so that the keys of plain targets stay what they were.
        if parts.arch.accel {
            field(b"a");
        }
        field(&(parts.options.len() as u64).to_le_bytes());
        for option in parts.options {
            field(option.as_bytes());
        }
        field(parts.source.as_bytes());
        CacheKey(*hasher.finalize().as_bytes())
    }

    /// The key as 64 lowercase hex digits (also the entry's file name).
    pub fn to_hex(&self) -> String {
        let mut out = String::with_capacity(64);
        for byte in self.0 {
            out.push(char::from(HEX[usize::from(byte >> 4)]));
            out.push(char::from(HEX[usize::from(byte & 15)]));
        }
        out
    }

    /// Parses 64 hex digits; `None` for anything else.
    pub fn from_hex(text: &str) -> Option<CacheKey> {
        let bytes = text.as_bytes();
        if bytes.len() != 64 {
            return None;
        }
        let mut key = [0u8; 32];
        for (i, pair) in bytes.chunks_exact(2).enumerate() {
            let hi = hex_value(pair[0])?;
            let lo = hex_value(pair[1])?;
            key[i] = (hi << 4) | lo;
        }
        Some(CacheKey(key))
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

fn hex_value(digit: u8) -> Option<u8> {
    match digit {
        b'0'..=b'9' => Some(digit - b'0'),
        b'a'..=b'f' => Some(digit - b'a' + 10),
        _ => None,
    }
}

impl fmt::Display for CacheKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for CacheKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CacheKey({})", self.to_hex())
    }
}

impl serde::Serialize for CacheKey {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.to_hex())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base_options() -> Vec<String> {
        vec!["--gpu-architecture=sm_90".to_string(), "--std=c++17".to_string()]
    }

    fn base<'a>(options: &'a [String]) -> KeyParts<'a> {
        KeyParts {
            source: "extern \"C\" __global__ void k() {}",
            options,
            arch: Arch::new(9, 0),
            kfuse_version: "0.1.0",
            format_version: 1,
        }
    }

    #[test]
    fn key_is_a_fixed_value_for_fixed_parts() {
        let options = base_options();
        let a = CacheKey::from_parts(&base(&options));
        let b = CacheKey::from_parts(&base(&options));
        assert_eq!(a, b);
        // Pinned so that an accidental change of the encoding (which would orphan every
        // user's cache) shows up in review.
        assert_eq!(a.to_hex(), "2c9b0dd7d697561f8b5ded372ec40417c1d29a2cf66b6f743eac17f3a17f8a35");
    }

    #[test]
    fn every_part_changes_the_key() {
        let options = base_options();
        let reference = CacheKey::from_parts(&base(&options));
        let other_options = vec!["--gpu-architecture=sm_90".to_string(), "--std=c++20".to_string()];
        let variants = [
            KeyParts { source: "extern \"C\" __global__ void k2() {}", ..base(&options) },
            KeyParts { options: &other_options, ..base(&options) },
            KeyParts { arch: Arch::new(8, 0), ..base(&options) },
            KeyParts { arch: Arch::accelerated(9, 0), ..base(&options) },
            KeyParts { kfuse_version: "0.1.1", ..base(&options) },
            KeyParts { format_version: 2, ..base(&options) },
        ];
        let mut seen = vec![reference];
        for variant in &variants {
            let key = CacheKey::from_parts(variant);
            assert!(!seen.contains(&key), "{variant:?} collided");
            seen.push(key);
        }
    }

    #[test]
    fn options_are_not_ambiguous_when_concatenated() {
        let split = vec!["-a".to_string(), "b".to_string()];
        let joined = vec!["-ab".to_string()];
        assert_ne!(CacheKey::from_parts(&base(&split)), CacheKey::from_parts(&base(&joined)));
    }

    #[test]
    fn hex_round_trips_and_rejects_garbage() {
        let options = base_options();
        let key = CacheKey::from_parts(&base(&options));
        assert_eq!(CacheKey::from_hex(&key.to_hex()), Some(key));
        assert_eq!(CacheKey::from_hex("abc"), None);
        assert_eq!(CacheKey::from_hex(&"g".repeat(64)), None);
        assert_eq!(CacheKey::from_hex(&"A".repeat(64)), None);
    }
}
