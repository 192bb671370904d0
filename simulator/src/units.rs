//! Byte quantities as users type them: `40GiB`, `80GB`, `500MiB`, `1.5TiB`, `4096`.

/// Parse a size. Binary (`KiB`, `MiB`, `GiB`, `TiB`, and `K`/`M`/`G`/`T`) and decimal (`KB`, `MB`,
/// `GB`, `TB`) suffixes, case-insensitive; a bare number is bytes.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '_')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let num: f64 = num
        .replace('_', "")
        .parse()
        .map_err(|_| format!("invalid size {s:?}: expected a number with an optional unit, e.g. 40GiB or 500MiB"))?;
    if unit.trim().is_empty() && num.fract() != 0.0 {
        return Err(format!(
            "invalid size {s:?}: a number without a unit is bytes, and {s} is not a whole number (did you \
             mean {s}GiB?)"
        ));
    }
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => 1024.0,
        "m" | "mib" => 1024.0 * 1024.0,
        "g" | "gib" => 1024.0 * 1024.0 * 1024.0,
        "t" | "tib" => 1024.0f64.powi(4),
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        u => {
            return Err(format!("invalid size {s:?}: unknown unit {u:?} (use B, KiB, MiB, GiB, TiB, KB, MB, GB or TB)"))
        }
    };
    let v = num * mult;
    if !v.is_finite() || v < 0.0 || v > u64::MAX as f64 {
        return Err(format!("invalid size {s:?}: out of range"));
    }
    Ok(v.round() as u64)
}

/// Bytes as MiB with two decimals.
pub fn mib(b: u64) -> String {
    format!("{:.2} MiB", b as f64 / (1024.0 * 1024.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        for (s, want) in [
            ("4096", 4096),
            ("40GiB", 40 << 30),
            ("40gib", 40 << 30),
            ("80GB", 80_000_000_000),
            ("500MiB", 500 << 20),
            ("1.5KiB", 1536),
            ("2M", 2 << 20),
        ] {
            assert_eq!(parse_size(s), Ok(want), "{s}");
        }
        assert!(parse_size("forty").unwrap_err().contains("forty"));
        assert!(parse_size("4 parsecs").unwrap_err().contains("parsecs"));
        // A bare number is bytes: a fraction of a byte is a unit left out, not a size.
        assert!(parse_size("0.05").unwrap_err().contains("0.05GiB"));
    }
}
