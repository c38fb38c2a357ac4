//! kfuse's environment switches, read one way everywhere: [`flag`] for on/off variables
//! (`KFUSE_NO_CACHE`, `KFUSE_LOG_COMPILES`, `KFUSE_LOG_TIMING`, `KFUSE_NO_TIERING`, `KFUSE_REQUIRE_NVRTC`, ...) and
//! [`size`] for byte counts (`KFUSE_CACHE_MAX_BYTES`).
//!
//! A flag accepts `1`, `true`, `yes`, `on` and `0`, `false`, `no`, `off` (any case, surrounding
//! blanks ignored); unset or empty is off. Any other value is an [`EnvError`] naming the variable
//! and the accepted values, never a silent "off".

/// What a flag accepts, for error messages.
pub const FLAG_VALUES: &str = "1, true, yes, on (or 0, false, no, off; empty is off)";
/// What a size accepts, for error messages.
pub const SIZE_VALUES: &str = "a byte count such as 1073741824, 64K, 512M or 2G (0 keeps nothing on disk)";

/// An environment variable with a value kfuse cannot use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvError {
    /// The variable.
    pub name: &'static str,
    /// Its value.
    pub value: String,
    /// What a valid value looks like.
    pub expected: &'static str,
}

impl std::fmt::Display for EnvError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "environment variable {}={:?} is invalid: expected {}", self.name, self.value, self.expected)
    }
}

impl std::error::Error for EnvError {}

/// Parses a flag's text: `Some(true)` / `Some(false)` for the accepted words, `None` otherwise.
pub fn parse_flag(text: &str) -> Option<bool> {
    match text.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Some(true),
        "" | "0" | "false" | "no" | "off" => Some(false),
        _ => None,
    }
}

/// Parses `1234`, `64K`, `512M`, `2G` (binary units, any case, blanks ignored).
pub fn parse_size(text: &str) -> Option<u64> {
    let text = text.trim();
    let (digits, shift) = match text.char_indices().last()? {
        (i, 'k' | 'K') => (&text[..i], 10),
        (i, 'm' | 'M') => (&text[..i], 20),
        (i, 'g' | 'G') => (&text[..i], 30),
        _ => (text, 0),
    };
    digits.trim().parse::<u64>().ok()?.checked_mul(1u64 << shift)
}

/// The raw value of `name`, `None` when unset; a value that is not Unicode is an error.
fn raw(name: &'static str, expected: &'static str) -> Result<Option<String>, EnvError> {
    match std::env::var(name) {
        Ok(value) => Ok(Some(value)),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(value)) => {
            Err(EnvError { name, value: value.to_string_lossy().into_owned(), expected })
        }
    }
}

/// What `KFUSE_FAST_COMPILE` accepts, for error messages.
pub const FAST_COMPILE_VALUES: &str = "min, mid or max (or 0/off; empty is off)";

/// Parses a fast-compile level: `Some(None)` for off, `Some(Some(level))` for NVRTC's
/// `-Ofast-compile` levels, `None` for anything else.
pub fn parse_fast_compile(text: &str) -> Option<Option<&'static str>> {
    match text.trim().to_ascii_lowercase().as_str() {
        "" | "0" | "off" | "false" | "no" => Some(None),
        "min" => Some(Some("min")),
        "mid" => Some(Some("mid")),
        "max" => Some(Some("max")),
        _ => None,
    }
}

/// `KFUSE_FAST_COMPILE`: NVRTC's `-Ofast-compile` level for the kernels of programs (`None`:
/// off, the default). Faster compiles, possibly slower kernels; the level is part of each
/// kernel's cache key, so kernels of either kind stay cached side by side.
pub fn fast_compile() -> Result<Option<&'static str>, EnvError> {
    const NAME: &str = "KFUSE_FAST_COMPILE";
    match raw(NAME, FAST_COMPILE_VALUES)? {
        None => Ok(None),
        Some(value) => parse_fast_compile(&value).ok_or(EnvError { name: NAME, value, expected: FAST_COMPILE_VALUES }),
    }
}

/// Whether flag `name` is on (unset or empty: off); see the module docs.
pub fn flag(name: &'static str) -> Result<bool, EnvError> {
    match raw(name, FLAG_VALUES)? {
        None => Ok(false),
        Some(value) => parse_flag(&value).ok_or(EnvError { name, value, expected: FLAG_VALUES }),
    }
}

/// The byte count in `name`, `None` when unset or empty.
pub fn size(name: &'static str) -> Result<Option<u64>, EnvError> {
    match raw(name, SIZE_VALUES)? {
        None => Ok(None),
        Some(value) if value.trim().is_empty() => Ok(None),
        Some(value) => parse_size(&value).map(Some).ok_or(EnvError { name, value, expected: SIZE_VALUES }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_parse() {
        for on in ["1", "true", "TRUE", " yes ", "On"] {
            assert_eq!(parse_flag(on), Some(true), "{on:?}");
        }
        for off in ["", "  ", "0", "false", "No", "OFF"] {
            assert_eq!(parse_flag(off), Some(false), "{off:?}");
        }
        for bad in ["2", "enabled", "y", "tru", "1 1"] {
            assert_eq!(parse_flag(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn fast_compile_levels_parse() {
        assert_eq!(parse_fast_compile(""), Some(None));
        assert_eq!(parse_fast_compile(" Off "), Some(None));
        assert_eq!(parse_fast_compile("MAX"), Some(Some("max")));
        assert_eq!(parse_fast_compile("mid"), Some(Some("mid")));
        assert_eq!(parse_fast_compile("fast"), None);
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("1234"), Some(1234));
        assert_eq!(parse_size("0"), Some(0));
        assert_eq!(parse_size("64K"), Some(64 << 10));
        assert_eq!(parse_size("512m"), Some(512 << 20));
        assert_eq!(parse_size(" 2G "), Some(2 << 30));
        assert_eq!(parse_size("G"), None);
        assert_eq!(parse_size("lots"), None);
        assert_eq!(parse_size(""), None);
        assert_eq!(parse_size("-1"), None);
        assert_eq!(parse_size("99999999999G"), None);
    }

    #[test]
    fn an_error_names_the_variable_and_the_accepted_values() {
        let e = EnvError { name: "KFUSE_NO_CACHE", value: "maybe".to_string(), expected: FLAG_VALUES };
        let text = e.to_string();
        for word in ["KFUSE_NO_CACHE", "\"maybe\"", "true", "off"] {
            assert!(text.contains(word), "{text}");
        }
    }
}
