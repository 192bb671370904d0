//! Reading the `runs.jsonl` files `memest compare` writes (for `safety`, `calibrate` and the
//! reports): each line a [`RunRecord`], every number the fits divide by or subtract checked
//! where it is read, so an error names the file, line and field.

use std::path::PathBuf;

use crate::compare::RunRecord;
use crate::error::{EstimateError, Result};

/// Read `runs.jsonl` files written by `memest compare`; errors name the file and line.
pub fn read_runs(paths: &[PathBuf]) -> Result<Vec<RunRecord>> {
    let mut out = Vec::new();
    for f in paths {
        let text = trace::read_small_string(f, u64::MAX).map_err(|source| EstimateError::Io {
            path: f.clone(),
            action: "cannot read",
            source,
        })?;
        for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
            // Through the path of the value at fault: serde alone said "invalid type: floating
            // point, expected u64 at column 1352", not which field.
            let bad = |field: String, e: &serde_json::Error| EstimateError::Line {
                path: f.clone(),
                line: i + 1,
                expected: format!("{field}expected a run record written by `memest compare` ({e})"),
            };
            let mut de = serde_json::Deserializer::from_str(line);
            let r: RunRecord = serde_path_to_error::deserialize(&mut de).map_err(|e| {
                let at = e.path().to_string();
                bad(if at == "." { String::new() } else { format!("field {at}: ") }, e.inner())
            })?;
            de.end().map_err(|e| bad(String::new(), &e))?;
            // A family is one `compare` writes: any other was fitted a margin a profile cannot
            // hold ("the rewritten profile does not parse: safety.families.resnet").
            if simulator::family::Family::parse(&r.family).is_none() {
                let names: Vec<&str> = simulator::family::Family::ALL.iter().map(|f| f.as_str()).collect();
                return Err(EstimateError::Line {
                    path: f.clone(),
                    line: i + 1,
                    expected: format!("field family is {:?}: expected one of {}", r.family, names.join(", ")),
                });
            }
            let impossible = |t: &f64| !(t.is_finite() && *t >= 0.0) || crate::dataset::past_any_device(*t);
            for (field, t) in [("truth_bytes", r.truth_bytes), ("reserved_truth_bytes", r.reserved_truth_bytes)] {
                if let Some(t) = t.filter(impossible) {
                    // 1e30 written out in full is 31 digits.
                    let t = if t.abs() < 1e15 { t.to_string() } else { format!("{t:e}") };
                    return Err(EstimateError::Line {
                        path: f.clone(),
                        line: i + 1,
                        expected: format!(
                            "field {field} is {t}: expected a measured peak in bytes, >= 0 and at most 256 TiB (past any device), or null"
                        ),
                    });
                }
            }
            // The symbolic estimate is what `safety` scales margins by and `calibrate` subtracts:
            // a zero point divided into an infinite margin, and u64::MAX wrote a nonsense profile.
            // Other estimators' answers are only reported, and may be unbounded (Horus's formula).
            // A row with an `error` is not scored: `compare` writes one for a need no device
            // holds, its reserved peak beside, which may be past any device.
            if let Some(sym) = r.estimates.get("symbolic").filter(|s| s.error.is_none()) {
                for (field, v, least) in
                    [("device_bytes", sym.device_bytes, 1), ("reserved_bytes", sym.reserved_bytes, 0)]
                {
                    if let Some(v) = v.filter(|&v| v < least || crate::dataset::past_any_device(v as f64)) {
                        return Err(EstimateError::Line {
                            path: f.clone(),
                            line: i + 1,
                            expected: format!(
                                "field estimates.symbolic.{field} is {v}: expected a peak in bytes, >= {least} and at \
                                 most 256 TiB (past any device), or null"
                            ),
                        });
                    }
                }
            }
            out.push(r);
        }
    }
    Ok(out)
}
