//! `memest compare`'s words on its rows: those an ML model was trained on or that lie outside the
//! range it was trained on, and the rows whose traces carry warnings or could not be made.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use estimators::compare::{MlModels, RunRecord};
use estimators::dataset::DatasetRow;

/// Rows whose outside-the-range warnings are printed in full; the rest are counted (a
/// comparison of 500 rows would otherwise bury every other warning), and all are in runs.jsonl.
const ROWS_SHOWN: usize = 5;

/// The rows of each dataset an ML model was trained on, said on stderr and returned for the
/// report: null unless `--ml-include-training-rows`, in-sample when included.
pub fn training_notes(m: &MlModels, rows: &[(DatasetRow, usize)], datasets: &[PathBuf], include: bool) -> Vec<String> {
    let mut counts: BTreeMap<(usize, &Path), usize> = BTreeMap::new();
    for (r, di) in rows {
        if let Some(model) = m.trained_on_row(r, &datasets[*di]) {
            *counts.entry((*di, model)).or_default() += 1;
        }
    }
    if counts.is_empty() && include {
        eprintln!(
            "memest: warning: --ml-include-training-rows has no effect: no row compared is one a model was trained on"
        );
    }
    let mut notes = Vec::new();
    for ((di, model), n) in counts {
        let data = datasets[di].display();
        let model = model.display();
        let them = if n == 1 { "1 row".to_string() } else { format!("{n} rows") };
        let msg = if include {
            format!("ml on {them} of {data} uses {model}, which was trained on them: those results are in-sample, not held out")
        } else {
            format!("ml is null on {them} of {data}: {model} was trained on them (--ml-include-training-rows evaluates them in-sample)")
        };
        // Said as every other warning is: the prefix, and the paths escaped for the terminal.
        eprintln!("memest: warning: {}", trace::terminal::printable(&msg));
        notes.push(msg);
    }
    notes
}

/// The rows an ML model was asked about outside the range it was trained on: each row's
/// warnings are `memest estimate`'s for that row (in runs.jsonl, `estimates.ml.warnings`); on
/// stderr, how many rows and the first [`ROWS_SHOWN`] in full. Also each model file that records
/// no range, once. Returns the report's note, when a row is outside.
pub fn outside_training(m: &MlModels, records: &[RunRecord]) -> Option<String> {
    for w in m.ranges_unknown() {
        eprintln!("memest: warning: ml: {w}");
    }
    let outside: Vec<&RunRecord> =
        records.iter().filter(|r| r.estimates.get("ml").is_some_and(|o| !o.warnings.is_empty())).collect();
    if outside.is_empty() {
        return None;
    }
    let note = format!(
        "{} of the {} rows lie outside the range their ML model was trained on: its answers there are \
         extrapolations (each row's warnings: runs.jsonl, `estimates.ml.warnings`)",
        outside.len(),
        records.len()
    );
    let first = if outside.len() > ROWS_SHOWN { format!("; the first {ROWS_SHOWN}:") } else { ":".to_string() };
    eprintln!("memest: warning: ml: {note}{first}");
    for r in outside.iter().take(ROWS_SHOWN) {
        for w in &r.estimates["ml"].warnings {
            eprintln!("memest: warning: ml: {w}");
        }
    }
    Some(note)
}

/// What the rows' traces do not give whole (cut short, a converted snapshot's caveats: what
/// `memest estimate` warns of a trace), in runs.jsonl beside each answer read from them
/// (`estimates.symbolic.warnings`, `.live_peak`, `.fake_tensor`); on stderr, how many rows and
/// the first [`ROWS_SHOWN`] rows' in full.
pub fn trace_warnings(records: &[RunRecord]) {
    let of = |r: &RunRecord| -> Vec<String> {
        ["symbolic", "fake_tensor"]
            .iter()
            .filter_map(|k| r.estimates.get(*k))
            .flat_map(|o| o.warnings.clone())
            .collect()
    };
    let rows: Vec<Vec<String>> = records.iter().map(of).filter(|w| !w.is_empty()).collect();
    if rows.is_empty() {
        return;
    }
    let first = if rows.len() > ROWS_SHOWN { format!("; the first {ROWS_SHOWN}:") } else { ":".to_string() };
    eprintln!(
        "memest: warning: the traces of {} of the {} rows carry warnings (cut short, header values ignored, a \
         snapshot's caveats; each row's: runs.jsonl, `estimates.symbolic.warnings`){first}",
        rows.len(),
        records.len()
    );
    for w in rows.iter().take(ROWS_SHOWN).flatten() {
        eprintln!("memest: warning: {}", trace::terminal::printable(w));
    }
}

/// Rows the trainer could not rebuild (a `Filename` it cannot parse, a spec it does not know):
/// the report counts them by reason, and stderr names them, how many and the first
/// [`ROWS_SHOWN`] with the reason, since their trace-based estimates are missing from every metric.
pub fn untraced(records: &[RunRecord]) {
    let failed: Vec<(&RunRecord, &str)> = records
        .iter()
        .filter_map(|r| Some((r, r.estimates.get("symbolic")?.error.as_deref()?.strip_prefix("no trace: ")?)))
        .collect();
    if failed.is_empty() {
        return;
    }
    let first = if failed.len() > ROWS_SHOWN { format!("; the first {ROWS_SHOWN}:") } else { ":".to_string() };
    eprintln!(
        "memest: warning: the trainer could not rebuild {} of the {} rows, which have no trace-based estimate \
         (symbolic, live_peak, fake_tensor){first}",
        failed.len(),
        records.len()
    );
    for (r, why) in failed.iter().take(ROWS_SHOWN) {
        eprintln!("memest: warning: row {} (Filename {:?}): {why}", r.id, r.filename);
    }
}
