//! GPU architectures as kfuse names them: a real CUDA target `sm_XY`, or its
//! architecture-specific variant `sm_XYa` (the `a` targets unlock instructions such as Hopper's
//! `wgmma`, and their code runs on that exact compute capability only).
//!
//! Pure: no CUDA. Used by the emitters (which pick a target for a kernel), by kfuse-runtime
//! (NVRTC's `--gpu-architecture`, the cache key and the cache folder) and by the launchers
//! (whether a cubin loads on a device, [`Arch::cubin_loads_on`]).
//!
//! Does not handle: virtual `compute_` targets, family-specific `f` targets (`sm_100f`).
#![forbid(unsafe_code)]

use std::fmt;
use std::str::FromStr;

/// A CUDA compute capability, e.g. 9.0 for the H100, and whether code for it uses the
/// architecture-specific features (`sm_90a`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub struct Arch {
    /// Major compute capability (9 for sm_90).
    pub major: u32,
    /// Minor compute capability, a single digit (0 for sm_90).
    pub minor: u32,
    /// The architecture-specific variant (`sm_90a`): code runs on exactly `major.minor`.
    pub accel: bool,
}

/// A text that names no architecture.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid GPU architecture {text:?}: expected a form like \"sm_90\", \"sm_90a\", \"90\" or \"9.0\"")]
pub struct ParseArchError {
    /// The text as given.
    pub text: String,
}

impl Arch {
    /// The plain target of a compute capability (`sm_XY`).
    pub const fn new(major: u32, minor: u32) -> Arch {
        Arch { major, minor, accel: false }
    }

    /// The architecture-specific target of a compute capability (`sm_XYa`).
    pub const fn accelerated(major: u32, minor: u32) -> Arch {
        Arch { major, minor, accel: true }
    }

    /// This compute capability's plain target (drops the `a`).
    pub const fn plain(self) -> Arch {
        Arch::new(self.major, self.minor)
    }

    /// The `--gpu-architecture` value NVRTC takes, e.g. `sm_90` or `sm_90a`.
    pub fn sm_name(&self) -> String {
        self.to_string()
    }

    /// Whether a cubin compiled for `self` loads on a device of compute capability `device`
    /// (its `accel` flag is ignored: a device has no variant). A plain cubin loads on the same
    /// major version at an equal or higher minor; an `a` cubin on exactly its own capability.
    pub fn cubin_loads_on(self, device: Arch) -> bool {
        if self.accel {
            self.major == device.major && self.minor == device.minor
        } else {
            self.major == device.major && self.minor <= device.minor
        }
    }
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sm_{}{}{}", self.major, self.minor, if self.accel { "a" } else { "" })
    }
}

impl FromStr for Arch {
    type Err = ParseArchError;

    /// Accepts `sm_90`, `90` and `9.0` (and `sm_100`, `100`, `10.0`), each with an `a` suffix
    /// for the architecture-specific variant (`sm_90a`, `90a`, `9.0a`).
    fn from_str(text: &str) -> Result<Arch, ParseArchError> {
        let invalid = || ParseArchError { text: text.to_string() };
        let trimmed = text.trim();
        let digits = trimmed.strip_prefix("sm_").unwrap_or(trimmed);
        let (digits, accel) = match digits.strip_suffix('a') {
            Some(rest) => (rest, true),
            None => (digits, false),
        };
        let (major, minor) = if let Some((major, minor)) = digits.split_once('.') {
            (major, minor)
        } else {
            if digits.len() < 2 || !digits.is_char_boundary(digits.len() - 1) {
                return Err(invalid());
            }
            digits.split_at(digits.len() - 1)
        };
        let all_digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        if !all_digits(major) || !all_digits(minor) || minor.len() != 1 || major.len() > 3 {
            return Err(invalid());
        }
        let major: u32 = major.parse().map_err(|_| invalid())?;
        let minor: u32 = minor.parse().map_err(|_| invalid())?;
        if major == 0 {
            return Err(invalid());
        }
        Ok(Arch { major, minor, accel })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_all_three_forms() {
        for text in ["sm_90", "90", "9.0", " sm_90 "] {
            assert_eq!(text.parse::<Arch>().ok(), Some(Arch::new(9, 0)), "{text}");
        }
        assert_eq!("sm_86".parse::<Arch>().ok(), Some(Arch::new(8, 6)));
        assert_eq!("sm_100".parse::<Arch>().ok(), Some(Arch::new(10, 0)));
        assert_eq!("12.0".parse::<Arch>().ok(), Some(Arch::new(12, 0)));
    }

    #[test]
    fn parses_the_a_variants() {
        for text in ["sm_90a", "90a", "9.0a", " sm_90a "] {
            assert_eq!(text.parse::<Arch>().ok(), Some(Arch::accelerated(9, 0)), "{text}");
        }
        assert_eq!("sm_100a".parse::<Arch>().ok(), Some(Arch::accelerated(10, 0)));
    }

    #[test]
    fn rejects_garbage_with_a_message_naming_it() {
        for text in
            ["", "sm_", "9", "sm_9", "9.", ".0", "9.10", "sm_9x", "compute_90", "0.0", "é0", "a", "sm_a", "sm_90aa"]
        {
            let err = text.parse::<Arch>().expect_err(text);
            assert_eq!(err.text, text);
            assert!(err.to_string().contains("sm_90a"), "{err}");
        }
    }

    #[test]
    fn displays_as_sm_name_and_round_trips() {
        assert_eq!(Arch::new(9, 0).to_string(), "sm_90");
        assert_eq!(Arch::new(10, 0).to_string(), "sm_100");
        assert_eq!(Arch::new(8, 6).sm_name(), "sm_86");
        assert_eq!(Arch::accelerated(9, 0).to_string(), "sm_90a");
        for arch in [Arch::new(7, 5), Arch::new(12, 1), Arch::accelerated(9, 0), Arch::accelerated(10, 3)] {
            assert_eq!(arch.to_string().parse::<Arch>(), Ok(arch));
        }
        assert_eq!(Arch::accelerated(9, 0).plain(), Arch::new(9, 0));
    }

    #[test]
    fn cubin_compatibility() {
        let h100 = Arch::new(9, 0);
        assert!(Arch::new(9, 0).cubin_loads_on(h100));
        assert!(Arch::accelerated(9, 0).cubin_loads_on(h100));
        assert!(Arch::new(8, 0).cubin_loads_on(Arch::new(8, 6)));
        assert!(!Arch::new(8, 6).cubin_loads_on(Arch::new(8, 0)));
        assert!(!Arch::new(8, 0).cubin_loads_on(h100));
        assert!(!Arch::new(9, 0).cubin_loads_on(Arch::new(10, 0)));
        assert!(!Arch::accelerated(10, 0).cubin_loads_on(Arch::new(10, 3)));
        assert!(Arch::new(10, 0).cubin_loads_on(Arch::new(10, 3)));
    }
}
