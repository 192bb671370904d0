//! Byte quantities as people type them: `40GiB`, `80GB`, `500MiB`, `1.5TiB`, `4096`. The one
//! parser of sizes: memsim's and memest's flags, and the shim's `MEMTRACE_MAX_BYTES` (this crate
//! is the one both depend on).

/// Parse a size. Binary (`KiB`, `MiB`, `GiB`, `TiB`, and `K`/`M`/`G`/`T`) and decimal (`KB`, `MB`,
/// `GB`, `TB`) suffixes, case-insensitive but for `Gb` and its kin (bits: refused); a bare number
/// is bytes. Whole numbers are exact
/// (`18446744073709551615`); a fraction (`1.5GiB`) is rounded to the byte.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '_')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    // `1e9`, `4e1GiB`: read as the unit "e9" or "e1gib" otherwise, which names no mistake.
    let exponent = unit.strip_prefix(['e', 'E']).map(|r| r.trim_start_matches(['+', '-']));
    if !num.is_empty() && exponent.is_some_and(|r| r.starts_with(|c: char| c.is_ascii_digit())) {
        return Err(format!(
            "invalid size {s:?}: exponent notation is not taken; write the number out with a unit, e.g. \
             40GiB or 500MiB"
        ));
    }
    let digits = num.replace('_', "");
    let whole = digits.parse::<u64>().ok();
    let value: f64 = match whole {
        Some(n) => n as f64,
        None => digits.parse().map_err(|_| {
            format!("invalid size {s:?}: expected a number with an optional unit, e.g. 40GiB or 500MiB")
        })?,
    };
    if unit.trim().is_empty() && whole.is_none() && value.fract() != 0.0 {
        return Err(format!(
            "invalid size {s:?}: a number without a unit is bytes, and {s} is not a whole number (did you \
             mean {s}GiB?)"
        ));
    }
    // `40Gb` is how bandwidth writes gigabits; memory is never sized in bits, so a lower-case b
    // after an upper-case prefix is a typo for one of two units 7% apart: asked, not guessed.
    if let [p @ (b'K' | b'M' | b'G' | b'T'), b'b'] = unit.trim().as_bytes() {
        let bits = ["kilo", "mega", "giga", "tera"][b"KMGT".iter().position(|c| c == p).unwrap_or(0)];
        let p = *p as char;
        return Err(format!(
            "invalid size {s:?}: {p}b means {bits}bits; for bytes write {num}{p}iB (binary, as GPUs are sized) \
             or {num}{p}B (decimal)"
        ));
    }
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        u => {
            return Err(format!("invalid size {s:?}: unknown unit {u:?} (use B, KiB, MiB, GiB, TiB or K, M, G, T for them, or KB, MB, GB, TB)"))
        }
    };
    let out_of_range = || format!("invalid size {s:?}: out of range");
    if let Some(n) = whole {
        return n.checked_mul(mult).ok_or_else(out_of_range);
    }
    let v = value * mult as f64;
    if !v.is_finite() || v < 0.0 || v >= u64::MAX as f64 {
        return Err(out_of_range());
    }
    Ok(v.round() as u64)
}

/// The largest device capacity taken, 256 TiB: the allocator model's largest segment
/// (`simulator::alloc::MAX_SEGMENT`). Past it a request no segment holds would fail at any
/// capacity, and a verdict of "fits" beside it would contradict the replay.
pub const MAX_CAPACITY: u64 = 1 << 48;

/// A device capacity as users type it ([`parse_size`]): at least a MiB, since no GPU is smaller
/// and a bare number is bytes (`--capacity 40` is far more likely a missing `GiB` than 40 B);
/// at most [`MAX_CAPACITY`].
pub fn parse_capacity(s: &str) -> Result<u64, String> {
    match parse_size(s)? {
        0 => Err(format!("invalid capacity {s:?}: a device holds more than 0 bytes (e.g. 40GiB)")),
        // Only a bare number is taken for a missing unit; `1KB` was told "did you mean 1KBGiB?".
        // Below 1024 it is a GPU's GiB; from 1024 its MiB, as nvidia-smi prints memory (40960
        // was told "did you mean 40960GiB?", 40 TiB).
        n if n < 1 << 20 && s.trim().parse::<f64>().is_ok() => Err(format!(
            "invalid capacity {s:?}: {n} B is less than a MiB, and no GPU is that small (a number without a \
             unit is bytes: did you mean {}{}?)",
            s.trim(),
            if n < 1024 { "GiB" } else { "MiB" }
        )),
        n if n < 1 << 20 => {
            Err(format!("invalid capacity {s:?}: {n} B is less than a MiB, and no GPU is that small (e.g. 40GiB)"))
        }
        n if n > MAX_CAPACITY => {
            Err(format!("invalid capacity {s:?}: more than any GPU holds (memtrace models devices of up to 256 TiB)"))
        }
        n => Ok(n),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_capacity_is_not_zero() {
        assert_eq!(parse_capacity("40GiB"), Ok(40 << 30));
        assert!(parse_capacity("0GiB").unwrap_err().contains("more than 0 bytes"));
        assert!(parse_capacity("-1GiB").is_err());
        assert!(parse_capacity("40").unwrap_err().contains("did you mean 40GiB?"));
        assert!(parse_capacity("40960").unwrap_err().contains("did you mean 40960MiB?"));
        let with_unit = parse_capacity("1KB").unwrap_err();
        assert!(with_unit.contains("less than a MiB") && !with_unit.contains("did you mean"), "{with_unit}");
        assert_eq!(parse_capacity("256TiB"), Ok(MAX_CAPACITY));
        assert!(parse_capacity("4000TiB").unwrap_err().contains("more than any GPU holds"));
        assert_eq!(parse_capacity("1MiB"), Ok(1 << 20));
    }

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
            ("10MB", 10_000_000),
            ("64K", 64 << 10),
            ("1_000", 1000),
            ("18446744073709551615", u64::MAX),
            ("9007199254740993", 9_007_199_254_740_993),
        ] {
            assert_eq!(parse_size(s), Ok(want), "{s}");
        }
        assert!(parse_size("forty").unwrap_err().contains("forty"));
        assert!(parse_size("4 parsecs").unwrap_err().contains("parsecs"));
        assert!(parse_size("").unwrap_err().contains("expected a number"));
        assert!(parse_size("20000000T").unwrap_err().contains("out of range"));
        assert!(parse_size("20000000.5T").unwrap_err().contains("out of range"));
        // A bare number is bytes: a fraction of a byte is a unit left out, not a size.
        assert!(parse_size("0.05").unwrap_err().contains("0.05GiB"));
        for s in ["1e99GiB", "4E1GiB", "1.5e+3", "2e-1MiB"] {
            assert!(parse_size(s).unwrap_err().contains("exponent notation"), "{s}");
        }
        // Bits are asked about, not read as bytes; all lower case stays the decimal unit.
        let bits = parse_size("40Gb").unwrap_err();
        assert!(bits.contains("40GiB") && bits.contains("40GB") && bits.contains("bits"), "{bits}");
        assert!(parse_size("512Mb").unwrap_err().contains("512MiB"));
        assert_eq!(parse_size("40gb"), Ok(40_000_000_000));
        // A unit that only starts with e is still an unknown unit.
        assert!(parse_size("4eggs").unwrap_err().contains("unknown unit"));
    }
}
