//! Which PyTorch release's allocator rules apply.

use std::fmt;
use std::str::FromStr;

use thiserror::Error;

/// The PyTorch release family whose caching-allocator rules are modelled.
///
/// Only the releases where placement or parsing rules changed get their own variant; every
/// release maps onto the newest family at or below it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum TorchVersion {
    /// 2.4-era: `max_split_size_mb > 20`, the oversize slack is `kLargeBuffer`, `>` in the
    /// divisions list overwrites the last explicit interval.
    V2_4,
    /// 2.5 to 2.8: adds `max_non_split_rounding_mb`; expandable blocks are skipped when releasing
    /// available cached blocks and by the garbage collector.
    V2_5,
    /// 2.9 and later: the `ConfigTokenizer` parser, `max_split_size_mb >= 20`, `>` fills from the
    /// interval after the last explicit one.
    #[default]
    V2_9,
}

/// A version string that is not a PyTorch release number.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum VersionError {
    /// The text is not `MAJOR.MINOR[.PATCH][+local]` with numeric parts.
    #[error("invalid PyTorch version {0:?}: expected MAJOR.MINOR such as \"2.4\", \"2.6.0\" or \"2.15\"")]
    Syntax(String),
    /// A release older than the 2.4 family, whose rules are not modelled.
    #[error("PyTorch version {0:?} is older than 2.4, the oldest release family modelled")]
    TooOld(String),
}

impl FromStr for TorchVersion {
    type Err = VersionError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let syntax = || VersionError::Syntax(s.to_string());
        // Local and pre-release suffixes ("2.6.0+cu124", "2.9.0a0") do not change the rules.
        let core = s.trim().split('+').next().unwrap_or_default();
        let mut parts = core.split('.');
        let major: u32 = parts.next().and_then(|p| p.parse().ok()).ok_or_else(syntax)?;
        let minor_text = parts.next().ok_or_else(syntax)?;
        let digits: String = minor_text.chars().take_while(char::is_ascii_digit).collect();
        let minor: u32 = digits.parse().map_err(|_| syntax())?;
        if let Some(patch) = parts.next() {
            if !patch.chars().next().is_some_and(|c| c.is_ascii_digit()) {
                return Err(syntax());
            }
        }
        match (major, minor) {
            (0..=1, _) | (2, 0..=3) => Err(VersionError::TooOld(s.to_string())),
            (2, 4) => Ok(TorchVersion::V2_4),
            (2, 5..=8) => Ok(TorchVersion::V2_5),
            _ => Ok(TorchVersion::V2_9),
        }
    }
}

impl fmt::Display for TorchVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TorchVersion::V2_4 => "2.4",
            TorchVersion::V2_5 => "2.5",
            TorchVersion::V2_9 => "2.9",
        })
    }
}
