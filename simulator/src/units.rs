//! Byte quantities: sizes as users type them (parsed by `trace::units`, the one parser) and
//! bytes shown as MiB.

pub use trace::units::{parse_capacity, parse_size};

/// How a saturated byte count reads: a need of `u64::MAX` is one no device meets (a memory
/// fraction of 0, a sum that overflowed), not a size to print as 16 EiB.
pub const UNBOUNDED: &str = "more than any device holds";

/// Why a need is no number of bytes (a saturated `u64::MAX`): what a JSON output says in its
/// place (`need_unbounded`), beside the bytes written as `null` ([`bytes_or_null`]). memsim's
/// and memest's outputs both say it, from here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Unbounded {
    /// The program's memory fraction lets its allocator reserve nothing of any device (a
    /// fraction of 0, or one too small for what it reserves).
    MemoryFraction,
    /// The need's parts add up past 2^64 bytes.
    Overflow,
}

impl Unbounded {
    /// Why a need is saturated (`None` when it is a size), from the device total the program's
    /// memory fraction asks for beside it (`ReplayReport::fraction_need_bytes`; a need is at
    /// least that, so a saturated fraction need saturates the need).
    pub fn of(need: u64, fraction_need: u64) -> Option<Unbounded> {
        match (need, fraction_need) {
            (u64::MAX, u64::MAX) => Some(Unbounded::MemoryFraction),
            (u64::MAX, _) => Some(Unbounded::Overflow),
            _ => None,
        }
    }

    /// The reason in words, after "no device holds the need: ".
    pub fn describe(self) -> &'static str {
        match self {
            Unbounded::MemoryFraction => {
                "the program's memory fraction lets its allocator reserve nothing of any device (a fraction of 0, \
                 or one too small for what it reserves)"
            }
            Unbounded::Overflow => "its parts add up past 2^64 bytes",
        }
    }
}

/// A byte total kept wider than u64 (so that a damaged trace's sizes near 2^64 neither wrap it
/// nor, freed, take it below what is still live) as reported: at most `u64::MAX`, the saturated
/// count every output says as [`UNBOUNDED`] or `null`.
pub fn saturated(bytes: u128) -> u64 {
    u64::try_from(bytes).unwrap_or(u64::MAX)
}

/// A byte count as JSON: `null` for a saturated one (`u64::MAX`, [`UNBOUNDED`]), which as a
/// number would read as a size, and is past 2^53, where JavaScript and jq round it.
pub fn bytes_json(b: u64) -> serde_json::Value {
    match b {
        u64::MAX => serde_json::Value::Null,
        b => b.into(),
    }
}

/// Serializes a byte count as [`bytes_json`] does (`#[serde(serialize_with = ...)]`).
pub fn bytes_or_null<S: serde::Serializer>(b: &u64, s: S) -> Result<S::Ok, S::Error> {
    match *b {
        u64::MAX => s.serialize_none(),
        b => s.serialize_some(&b),
    }
}

/// [`bytes_or_null`] of an optional byte count.
pub fn opt_bytes_or_null<S: serde::Serializer>(b: &Option<u64>, s: S) -> Result<S::Ok, S::Error> {
    bytes_or_null(&b.unwrap_or(u64::MAX), s)
}

/// Bytes as MiB with two decimals ([`UNBOUNDED`] for `u64::MAX`).
pub fn mib(b: u64) -> String {
    mib_places(b, 2)
}

/// Bytes as MiB and exact bytes, `12.00 MiB (12582912 B)`, with `more` inside the parentheses;
/// a saturated count is [`UNBOUNDED`] and why: its 18446744073709551615 B is no size anything held.
pub fn mib_and_bytes(b: u64, more: &str) -> String {
    match b {
        u64::MAX => format!("{UNBOUNDED} ({}{more})", Unbounded::Overflow.describe()),
        _ => format!("{} ({b} B{more})", mib(b)),
    }
}

/// Exact bytes, `12582912 B`, for a message; [`UNBOUNDED`] for a saturated count.
pub fn bytes_text(b: u64) -> String {
    match b {
        u64::MAX => UNBOUNDED.to_string(),
        _ => format!("{b} B"),
    }
}

/// Bytes as MiB for a JSON output that counts in MiB: `None` (written `null`) for a saturated
/// count, which as a number would read as 17592186044416 MiB.
pub fn mib_or_null(b: u64) -> Option<f64> {
    (b != u64::MAX).then(|| b as f64 / (1024.0 * 1024.0))
}

/// Bytes as MiB with `decimals` ([`UNBOUNDED`] for `u64::MAX`).
fn mib_places(b: u64, decimals: usize) -> String {
    match b {
        u64::MAX => UNBOUNDED.to_string(),
        _ => format!("{:.*} MiB", decimals, b as f64 / (1024.0 * 1024.0)),
    }
}

/// A need and a capacity as MiB with `decimals`, or both in bytes when those would print alike
/// but differ: a verdict that tells the two apart must not stand beside two equal numbers.
pub fn need_and_capacity(need: u64, capacity: u64, decimals: usize) -> (String, String) {
    let (n, c) = (mib_places(need, decimals), mib_places(capacity, decimals));
    if n == c && need != capacity {
        (format!("{need} B"), format!("{capacity} B"))
    } else {
        (n, c)
    }
}

/// [`need_and_capacity`] of two MiB values (exact for any byte count below 2^53).
pub fn need_and_capacity_mib(need_mib: f64, capacity_mib: f64, decimals: usize) -> (String, String) {
    let bytes = |m: f64| (m * 1024.0 * 1024.0).round() as u64;
    need_and_capacity(bytes(need_mib), bytes(capacity_mib), decimals)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_need_and_capacity_that_print_alike_are_shown_in_bytes() {
        let check = |need: u64, cap: u64, want: (&str, &str)| {
            assert_eq!(need_and_capacity(need, cap, 2), (want.0.to_string(), want.1.to_string()), "{need} {cap}");
        };
        check(18173096968, 18173096967, ("18173096968 B", "18173096967 B"));
        check(1 << 30, 1 << 30, ("1024.00 MiB", "1024.00 MiB"));
        check(1 << 30, 2 << 30, ("1024.00 MiB", "2048.00 MiB"));
        check(u64::MAX, 40 << 30, (UNBOUNDED, "40960.00 MiB"));
        assert_eq!(need_and_capacity_mib(1024.04, 1024.01, 1), ("1073783767 B".into(), "1073752310 B".into()));
    }
}
