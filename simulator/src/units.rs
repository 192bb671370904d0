//! Byte quantities: sizes as users type them (parsed by `trace::units`, the one parser) and
//! bytes shown as MiB.

pub use trace::units::{parse_capacity, parse_size};

/// Bytes as MiB with two decimals.
pub fn mib(b: u64) -> String {
    format!("{:.2} MiB", b as f64 / (1024.0 * 1024.0))
}
