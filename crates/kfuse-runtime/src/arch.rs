//! GPU architectures (`sm_90`): parsing and display. Only real `sm_` targets; virtual
//! `compute_` targets and suffixed ones (`sm_90a`) are not handled.

use std::fmt;
use std::str::FromStr;

use crate::RuntimeError;

/// A CUDA compute capability, e.g. 9.0 for the H100.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub struct Arch {
    /// Major compute capability (9 for sm_90).
    pub major: u32,
    /// Minor compute capability, a single digit (0 for sm_90).
    pub minor: u32,
}

impl Arch {
    /// Builds an arch from its compute capability.
    pub const fn new(major: u32, minor: u32) -> Arch {
        Arch { major, minor }
    }

    /// The `--gpu-architecture` value NVRTC takes, e.g. `sm_90`.
    pub fn sm_name(&self) -> String {
        self.to_string()
    }
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sm_{}{}", self.major, self.minor)
    }
}

impl FromStr for Arch {
    type Err = RuntimeError;

    /// Accepts `sm_90`, `90` and `9.0` (and `sm_100`, `100`, `10.0`).
    fn from_str(text: &str) -> Result<Arch, RuntimeError> {
        let invalid = || RuntimeError::InvalidArch { text: text.to_string() };
        let trimmed = text.trim();
        let digits = trimmed.strip_prefix("sm_").unwrap_or(trimmed);
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
        Ok(Arch { major, minor })
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
    fn rejects_garbage() {
        for text in ["", "sm_", "9", "sm_9", "9.", ".0", "9.10", "sm_9x", "compute_90", "0.0", "sm_90a", "é0"] {
            assert!(text.parse::<Arch>().is_err(), "{text:?} should not parse");
        }
    }

    #[test]
    fn displays_as_sm_name() {
        assert_eq!(Arch::new(9, 0).to_string(), "sm_90");
        assert_eq!(Arch::new(10, 0).to_string(), "sm_100");
        assert_eq!(Arch::new(8, 6).sm_name(), "sm_86");
    }
}
