//! Byte quantities: sizes as users type them (parsed by `trace::units`, the one parser) and
//! bytes shown as MiB.

pub use trace::units::{parse_capacity, parse_size};

/// How a saturated byte count reads: a need of `u64::MAX` is one no device meets (a memory
/// fraction of 0, a sum that overflowed), not a size to print as 16 EiB.
pub const UNBOUNDED: &str = "more than any device holds";

/// Bytes as MiB with two decimals ([`UNBOUNDED`] for `u64::MAX`).
pub fn mib(b: u64) -> String {
    mib_places(b, 2)
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
