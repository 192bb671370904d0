//! Reading an estimate file: the one parser of `memest estimate --json` (schema 3) and of the
//! trainer's `estimate --json`, which adds to it. `memest render` and `memsim report --estimate`
//! both read through [`parse`], so a file one refuses the other refuses with the same words, and
//! both word the verdict from the numbers ([`crate::estimate_text::EstimateText::of`]), never
//! from the file's `text`.
//!
//! The checks: the fields the words use, of their types ([`EstimateView`]); the schema; a need
//! and a capacity that are numbers of MiB; and verdict numbers that agree with each other and
//! with the estimate they name (a hand-edited or spliced file would otherwise be worded as
//! though it held).

use serde_json::Value;

use crate::estimate::SCHEMA;
use crate::estimate_text::{AnswerView, EstimateView};

/// What every refusal but a contradicted `fits` ends with.
const EXPECTED: &str = "expected `estimate --json` output, schema 3";

/// Why an estimate file is refused. Each message names the field; the caller puts the file's
/// name before it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EstimateFileError {
    /// The text is not JSON (the parser's message, with its line and column).
    #[error("{0} ({EXPECTED})", EXPECTED = EXPECTED)]
    Json(serde_json::Error),
    /// The JSON is not an object.
    #[error("not a JSON object ({EXPECTED})", EXPECTED = EXPECTED)]
    NotObject,
    /// A field the words use is missing or of the wrong type.
    #[error("{}{message} ({EXPECTED})", field.as_ref().map_or(String::new(), |f| format!("field `{f}`: ")), EXPECTED = EXPECTED)]
    Shape {
        /// Where (`verdict.need_mib`); `None` for the top level.
        field: Option<String>,
        /// The deserializer's message.
        message: String,
    },
    /// Another schema than the one the words are of.
    #[error("field `schema` is {found}: expected {SCHEMA} ({EXPECTED})", SCHEMA = SCHEMA, EXPECTED = EXPECTED)]
    Schema {
        /// The file's `schema`.
        found: u64,
    },
    /// `verdict.fits` says the opposite of its need and capacity.
    #[error("field `verdict.fits` is {fits} but need_mib {need} {relation} capacity_mib {capacity_mib:.1}")]
    Fits {
        /// The file's `verdict.fits`.
        fits: bool,
        /// The need as said: MiB to a tenth, or that no device holds it.
        need: String,
        /// `<=` or `>`.
        relation: &'static str,
        /// The file's `verdict.capacity_mib`.
        capacity_mib: f64,
    },
    /// Verdict or estimate numbers out of range, or that contradict each other (the message
    /// names the fields and their values).
    #[error("{0} ({EXPECTED})", EXPECTED = EXPECTED)]
    Inconsistent(String),
}

/// An estimate file, read and checked.
#[derive(Debug, Clone)]
pub struct EstimateFile {
    /// The fields the words use, checked: word it with
    /// [`EstimateText::of`](crate::estimate_text::EstimateText::of).
    pub view: EstimateView,
    /// The JSON as written, for fields the words do not use (the trainer's `model`,
    /// `batch_size`, `inputs`). Its `text` is never a view's words: they are made again.
    pub json: Value,
}

/// Read an estimate from its text, with every check `memest render` makes.
pub fn parse(text: &str) -> Result<EstimateFile, EstimateFileError> {
    let json: Value = serde_json::from_str(text).map_err(EstimateFileError::Json)?;
    if !json.is_object() {
        return Err(EstimateFileError::NotObject);
    }
    // The schema first: another schema's file lacks or changes fields this one has, and is said
    // as another schema, not by the first field it lacks.
    if let Some(found) = json.get("schema").and_then(Value::as_u64) {
        if found != u64::from(SCHEMA) {
            return Err(EstimateFileError::Schema { found });
        }
    }
    let view: EstimateView = serde_path_to_error::deserialize(&json).map_err(|e| {
        let path = e.path().to_string();
        EstimateFileError::Shape { field: (path != ".").then_some(path), message: e.inner().to_string() }
    })?;
    check(&view)?;
    Ok(EstimateFile { view, json })
}

/// The checks of [`parse`] past the fields' types: the schema, the need and capacity, and the
/// verdict's numbers against each other and the estimate they name.
pub fn check(view: &EstimateView) -> Result<(), EstimateFileError> {
    if view.schema != SCHEMA {
        return Err(EstimateFileError::Schema { found: view.schema.into() });
    }
    let bad = |m: String| EstimateFileError::Inconsistent(m);
    let v = &view.verdict;
    // A need no device holds is null with its reason; a null without one is a damaged file.
    let need = match (v.need_mib, v.need_unbounded) {
        (Some(_), Some(_)) => {
            return Err(bad(
                "field `verdict.need_mib` is a number but `verdict.need_unbounded` says no device holds it".into(),
            ))
        }
        (None, None) => {
            return Err(bad("field `verdict.need_mib` is null without `verdict.need_unbounded` saying why".into()))
        }
        (None, Some(_)) => f64::INFINITY,
        (Some(need), None) => need,
    };
    for (field, mib) in [("need_mib", v.need_mib.unwrap_or(0.0)), ("capacity_mib", v.capacity_mib)] {
        if !(mib.is_finite() && mib >= 0.0) {
            return Err(bad(format!("field `verdict.{field}` is {mib}: expected a number of MiB >= 0")));
        }
    }
    if v.capacity_mib == 0.0 {
        return Err(bad("field `verdict.capacity_mib` is 0: expected a device's memory".into()));
    }
    // The words never give a verdict the numbers beside it contradict.
    if v.fits != (need <= v.capacity_mib) {
        return Err(EstimateFileError::Fits {
            fits: v.fits,
            need: v.need_mib.map_or("null (no device holds it)".into(), |n| format!("{n:.1}")),
            relation: if need <= v.capacity_mib { "<=" } else { ">" },
            capacity_mib: v.capacity_mib,
        });
    }
    sizes(view).map_err(bad)?;
    // After the outside terms are checked against their total, which the budget is read from.
    consistent(view).map_err(bad)?;
    budget(view).map_err(bad)
}

/// The allocator budget is the capacity less the memory outside the allocator the profile (or
/// `--context`) gives: the recorded part is the trace's own, inside the replay. A hand-edited
/// budget was worded as the one replayed at.
fn budget(view: &EstimateView) -> Result<(), String> {
    let (v, o) = (&view.verdict, &view.outside_allocator);
    let Some(b) = v.allocator_budget_mib else { return Ok(()) };
    // The terms, not `total_mib` less `recorded_mib`: a recorded part past 2^64 B saturates
    // both, and their difference was 0 where the budget is the capacity less the context.
    let outside = o.context_mib + o.cublas_mib + o.cudnn_mib + o.nccl_mib;
    let want = (v.capacity_mib - outside).max(0.0);
    if !(b.is_finite() && (b - want).abs() <= 0.1) {
        return Err(format!(
            "field `verdict.allocator_budget_mib` is {} but `verdict.capacity_mib` {} less the memory outside the \
             allocator ({}: `outside_allocator`'s context, cuBLAS, cuDNN and NCCL terms) is {}",
            show(b),
            show(v.capacity_mib),
            show(outside),
            show(want)
        ));
    }
    Ok(())
}

/// Every number of MiB in the file is one: finite and >= 0, the other estimators' as the
/// headline's (a negative baseline stood in the page's table beside the verdict).
fn sizes(view: &EstimateView) -> Result<(), String> {
    let o = &view.outside_allocator;
    let mut fields: Vec<(String, f64)> = [
        ("context_mib", o.context_mib),
        ("cublas_mib", o.cublas_mib),
        ("cudnn_mib", o.cudnn_mib),
        ("nccl_mib", o.nccl_mib),
        ("recorded_mib", o.recorded_mib),
        ("total_mib", o.total_mib),
    ]
    .into_iter()
    .map(|(k, v)| (format!("outside_allocator.{k}"), v))
    .collect();
    for (name, answer) in &view.estimates {
        let Some(a) = answer else { continue };
        for (k, v) in [
            ("device_mib", a.device_mib),
            ("safe_mib", a.safe_mib),
            ("reserved_mib", a.reserved_mib),
            ("allocated_mib", a.allocated_mib),
        ] {
            fields.extend(v.map(|v| (format!("estimates.{name}.{k}"), v)));
        }
    }
    match fields.into_iter().find(|(_, v)| !(v.is_finite() && *v >= 0.0)) {
        Some((field, v)) => Err(format!("field `{field}` is {v}: expected a number of MiB >= 0")),
        None => Ok(()),
    }
}

/// The verdict's numbers agree with each other and with the estimate they name.
fn consistent(view: &EstimateView) -> Result<(), String> {
    let v = &view.verdict;
    let h = &view.headline;
    let (safe, point) = (format!("estimates.{h}.safe_mib"), format!("estimates.{h}.device_mib"));
    if v.basis != safe && v.basis != point {
        return Err(format!("field `verdict.basis` is {:?}: expected {safe:?} or {point:?} (the headline's)", v.basis));
    }
    // The JSON carries MiB to a tenth at least; a twentieth is rounding, more is another number.
    let differ = |a: f64, b: f64| (a - b).abs() > 0.05;
    let Some(Some(answer)) = view.estimates.get(h) else {
        return Err(format!("field `estimates.{h}` is missing or null: the headline names it"));
    };
    // A need no device holds has no number anywhere: the point, the headline's and its safe number.
    let unbounded = v.need_unbounded.is_some();
    let (point_mib, device_mib) = match (v.point_mib, answer.device_mib) {
        (None, None) if unbounded && answer.safe_mib.is_none() => return Ok(()),
        (Some(p), Some(d)) if !unbounded => (p, d),
        (p, d) => {
            let said = |m: Option<f64>| m.map_or("null".to_string(), show);
            return Err(format!(
                "fields `verdict.point_mib` ({}), `estimates.{h}.device_mib` ({}) and `estimates.{h}.safe_mib` ({}): \
                 expected numbers, or all null when `verdict.need_unbounded` says no device holds the need (it is {})",
                said(p),
                said(d),
                said(answer.safe_mib),
                v.need_unbounded.map_or("null", |u| u.describe())
            ));
        }
    };
    // Checked by the caller: a number when not unbounded.
    let need = v.need_mib.unwrap_or(f64::INFINITY);
    if differ(point_mib, device_mib) {
        return Err(format!(
            "field `verdict.point_mib` is {} but `estimates.{h}.device_mib` is {}",
            show(point_mib),
            show(device_mib)
        ));
    }
    if v.basis == point && differ(need, point_mib) {
        return Err(format!(
            "field `verdict.need_mib` is {} but the basis is the point, {}",
            show(need),
            show(point_mib)
        ));
    }
    if v.basis == safe {
        let Some(safe_mib) = answer.safe_mib else {
            return Err(format!("field `estimates.{h}.safe_mib` is missing or null, but `verdict.basis` names it"));
        };
        if differ(need, safe_mib) {
            return Err(format!(
                "field `verdict.need_mib` is {} but the basis, `estimates.{h}.safe_mib`, is {}",
                show(need),
                show(safe_mib)
            ));
        }
        if safe_mib + 0.05 < device_mib {
            return Err(format!(
                "field `estimates.{h}.safe_mib` is {}, below `estimates.{h}.device_mib` {}: a safe number is never \
                 below the point",
                show(safe_mib),
                show(device_mib)
            ));
        }
    }
    if need + 0.05 < point_mib {
        return Err(format!(
            "field `verdict.need_mib` is {}, below `verdict.point_mib` {}: a safe number is never below the point",
            show(need),
            show(point_mib)
        ));
    }
    parts(view, h, answer, device_mib)?;
    // The detail line adds the headline's reserved peak and the memory outside the allocator:
    // together they are never more than its device need (which a memory fraction can raise).
    if let Some(reserved) = answer.reserved_mib {
        let outside = view.outside_allocator.total_mib;
        if reserved + outside > device_mib + 0.1 {
            return Err(format!(
                "fields `estimates.{h}.reserved_mib` ({}) and `outside_allocator.total_mib` ({}) add up to more than \
                 `estimates.{h}.device_mib` ({})",
                show(reserved),
                show(outside),
                show(device_mib)
            ));
        }
    }
    Ok(())
}

/// The numbers the writer derives from others agree with them (a hand-edited part was worded
/// beside a whole it contradicts): the memory outside the allocator is the sum of its terms, no
/// step's peak is above the headline's (its max over the steps), and the safe number is the
/// point plus the margin's fraction of its scale ([`simulator::fit::Margin::safe`]).
fn parts(view: &EstimateView, h: &str, answer: &AnswerView, device_mib: f64) -> Result<(), String> {
    let o = &view.outside_allocator;
    let sum = o.context_mib + o.cublas_mib + o.cudnn_mib + o.nccl_mib + o.recorded_mib;
    if (sum - o.total_mib).abs() > 0.1 {
        return Err(format!(
            "field `outside_allocator.total_mib` is {} but its terms (context, cuBLAS, cuDNN, NCCL, recorded) add up \
             to {}",
            show(o.total_mib),
            show(sum)
        ));
    }
    if let Some(st) = &answer.steps {
        for (k, v) in
            [("first_step_device_mib", Some(st.first_step_device_mib)), ("steady_device_mib", st.steady_device_mib)]
        {
            match v {
                Some(v) if !(v.is_finite() && v >= 0.0) => {
                    return Err(format!("field `estimates.{h}.steps.{k}` is {v}: expected a number of MiB >= 0"))
                }
                Some(v) if v > device_mib + 0.05 => {
                    return Err(format!(
                        "field `estimates.{h}.steps.{k}` is {}, above `estimates.{h}.device_mib` {}: the headline is \
                         the max over the steps",
                        show(v),
                        show(device_mib)
                    ))
                }
                _ => {}
            }
        }
    }
    let m = &view.margin;
    if let (Some(fraction), Some(safe)) = (m.fraction, answer.safe_mib) {
        if !(fraction.is_finite() && fraction >= 0.0) {
            return Err(format!("field `margin.fraction` is {fraction}: expected a fraction >= 0"));
        }
        let base = match m.scale.as_deref() {
            Some("reserved") => answer.reserved_mib,
            Some("point") | None => Some(device_mib),
            Some(other) => {
                return Err(format!("field `margin.scale` is {other:?}: expected \"point\" or \"reserved\""))
            }
        };
        if let Some(base) = base {
            let want = device_mib + fraction * base;
            if (safe - want).abs() > 0.1 {
                return Err(format!(
                    "field `estimates.{h}.safe_mib` is {} but `margin.fraction` {fraction} of the {} ({}) on the point \
                     {} gives {}",
                    show(safe),
                    m.scale.as_deref().unwrap_or("point"),
                    show(base),
                    show(device_mib),
                    show(want)
                ));
            }
        }
    }
    Ok(())
}

/// MiB as the checks above name them: a tenth, or an exponent for a number no device holds (a
/// 1e308 written out in full is 309 digits).
fn show(mib: f64) -> String {
    if mib.abs() < 1e12 {
        format!("{mib:.1}")
    } else {
        format!("{mib:e}")
    }
}
