//! One dataset cell's number read exactly: a whole-number column parsed through f64 saturated
//! past u64 and rounded past 2^53 in silence.

/// The largest whole number every f64 below it holds exactly (2^53).
pub(crate) const EXACT_IN_F64: u64 = 1 << 53;

/// A whole-number cell: digits as an integer (any u64), or a float text (`2e3`, `20.0`) only
/// where it is an exact whole number within 2^53; parsed through f64 alone, 2^64 saturated and
/// 2^53 + 1 rounded in silence.
pub(crate) fn whole_number(s: &str) -> Option<u64> {
    let s = s.trim();
    if let Ok(v) = s.parse::<u64>() {
        return Some(v);
    }
    // Read from the text's digits, not through f64: `4503599627370495.7` rounds to a whole f64.
    let (mantissa, exp) = match s.find(['e', 'E']) {
        Some(i) => (&s[..i], s[i + 1..].parse::<i32>().ok()?),
        None => (s, 0),
    };
    let mantissa = mantissa.strip_prefix('+').unwrap_or(mantissa);
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits = format!("{int}{frac}");
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let significant = digits.trim_end_matches('0');
    let zeros = (digits.len() - significant.len()) as i32;
    let shift = exp.checked_add(zeros)?.checked_sub(frac.len() as i32)?;
    let significant = significant.trim_start_matches('0');
    let v = if significant.is_empty() {
        0
    } else if !(0..=19).contains(&shift) {
        return None;
    } else {
        significant.parse::<u64>().ok()?.checked_mul(10u64.checked_pow(shift as u32)?)?
    };
    (v <= EXACT_IN_F64).then_some(v)
}
