//! The columns of the dataset formats [`crate::dataset`] reads, and what a header says that
//! its rows cannot: a column of no format (a misspelt one is never read), or no `Status`.

use std::path::Path;

use crate::dataset::{DatasetRow, UTILIZATION_COLUMNS};
use crate::features::Family;

/// Columns this loader reads (beyond [`UTILIZATION_COLUMNS`]).
const READ: [&str; 19] = [
    "Filename",
    "Activations-Params",
    "Total Activations",
    "Total Parameters",
    "Batch Size",
    "Max GPU Memory (MiB)",
    "Status",
    "Depth",
    "Activation Function",
    "spec",
    "optimizer",
    "amp",
    "oom",
    "device_peak_mib",
    "max_memory_reserved_mib",
    "family",
    "job",
    "profile",
    "gpu",
];

/// Columns of the formats read that no reader here needs: GPUMemNet's per-type layer counts
/// (the parsed `Activations-Params` says them) and its transformer sweep's settings, and the
/// trainer's `dataset` columns kept for people.
const NOT_READ: [&str; 21] = [
    "Batch Normalization Layers",
    "Dropout Layers",
    "Conv2d Count",
    "BatchNorm2d Count",
    "Dropout Count",
    "AdaptiveAvgPool2d Count",
    "Linear Count",
    "Seq Length",
    "Embedding Size",
    "Num Layers",
    "Num Heads",
    "Accumulated Params",
    "NonDynamicallyQuantizableLinear Count",
    "LayerNorm Count",
    "run_id",
    "max_memory_allocated_mib",
    "device_peak_source",
    "step_time_s",
    "device",
    "torch",
    "cuda",
];

/// What the header says that the rows cannot: columns of no format read, and no `Status` (nor
/// the trainer's `oom`) beside rows that are not all MLPs (GPUMemNet's CNN and transformer
/// sweeps record OOM crashes in `Status`; its MLP sweeps have no such column and no OOM row).
pub(crate) fn warnings(path: &Path, headers: &csv::StringRecord, rows: &[DatasetRow]) -> Vec<String> {
    let known = |h: &str| READ.contains(&h) || NOT_READ.contains(&h) || UTILIZATION_COLUMNS.contains(&h);
    let unknown: Vec<String> = headers
        .iter()
        .map(str::trim)
        .filter(|h| !h.is_empty() && !known(h))
        .map(|h| match READ.iter().chain(&UTILIZATION_COLUMNS).find(|k| k.eq_ignore_ascii_case(h)) {
            Some(k) => format!("{h:?} (did you mean {k:?}?)"),
            None => format!("{h:?}"),
        })
        .collect();
    let mut out = Vec::new();
    if !unknown.is_empty() {
        out.push(format!(
            "{}: {} {} of no dataset format read here: {} cells are ignored (a misspelt column is one never read)",
            path.display(),
            if unknown.len() == 1 { "column" } else { "columns" },
            unknown.join(", "),
            if unknown.len() == 1 { "its" } else { "their" },
        ));
    }
    let has = |name: &str| headers.iter().any(|h| h.trim() == name);
    if !has("Status") && !has("oom") && rows.iter().any(|r| r.family != Family::Mlp) {
        out.push(format!(
            "{}: no `Status` column (nor the trainer's `oom`): an OOM_CRASH row cannot be told from a measured run, so \
             every row's `Max GPU Memory (MiB)` is read as a measured peak (GPUMemNet's CNN and transformer files have \
             `Status`)",
            path.display()
        ));
    }
    out.extend(repeated(path, rows));
    out
}

/// Rows whose every cell repeats an earlier row's (by content digest): each would be scored
/// (compare) or trained on (ml) twice; said once, with the count and the first rows.
fn repeated(path: &Path, rows: &[DatasetRow]) -> Option<String> {
    let mut first = std::collections::HashMap::new();
    let pairs: Vec<(usize, usize)> = rows
        .iter()
        .filter_map(|r| {
            let earliest = *first.entry(r.digest.as_str()).or_insert(r.row);
            (earliest != r.row).then_some((r.row, earliest))
        })
        .collect();
    (!pairs.is_empty()).then(|| {
        let shown: Vec<String> = pairs.iter().take(5).map(|(r, e)| format!("row {r} repeats row {e}")).collect();
        format!(
            "{}: {} rows repeat an earlier row cell for cell ({}{}): each is used as often as it appears",
            path.display(),
            pairs.len(),
            shown.join(", "),
            if pairs.len() > 5 { ", ..." } else { "" }
        )
    })
}

/// The first column a CSV header names twice, and what is expected of it: which copy a reader
/// reads is an accident of position, so every CSV reader of this crate refuses it.
pub(crate) fn column_twice(headers: &csv::StringRecord) -> Option<(String, String)> {
    headers.iter().enumerate().find_map(|(i, h)| {
        let j = headers.iter().skip(i + 1).position(|o| o.trim() == h.trim() && !h.trim().is_empty())?;
        Some((
            h.trim().to_string(),
            format!("expected each column once; it is column {} and column {}", i + 1, i + j + 2),
        ))
    })
}
