//! Fitting a profile's outside-allocator constants from measured runs: device-level truth
//! (nvidia-smi) minus the symbolic reserved prediction of the same run is what lives outside the
//! allocator. MLP runs load cuBLAS but no cuDNN, so they fit `context + cublas`; CNN runs then
//! fit `cudnn` on top. A fit is always evaluated on runs it did not see.

use std::collections::BTreeMap;

use serde::Serialize;
use simulator::fit::{self, Libraries};
use simulator::profile::OutsideAllocator;

use crate::compare::RunRecord;
use crate::dataset::splitmix64;
use crate::error::{EstimateError, Result};
use crate::metrics::{self, Metrics};
use crate::rows::RowSet;

const MIB: f64 = 1024.0 * 1024.0;

/// A run as calibration needs it.
#[derive(Debug, Clone, PartialEq)]
pub struct CalRun {
    /// Row id.
    pub id: String,
    /// Measured device peak, MiB.
    pub truth_mib: f64,
    /// Symbolic reserved peak, MiB.
    pub reserved_mib: f64,
    /// cuBLAS loaded.
    pub uses_gemm: bool,
    /// cuDNN loaded.
    pub uses_conv: bool,
}

impl CalRun {
    /// From a comparison's run record; `None` without a truth or a symbolic estimate.
    pub fn from_record(r: &RunRecord) -> Option<CalRun> {
        // A zero label is a failed measurement (nvidia-smi never shows less than the context).
        let t = r.truth_bytes.filter(|t| !r.real_oom && *t > 0.0)?;
        let res = r.estimates.get("symbolic")?.reserved_bytes?;
        Some(CalRun {
            id: r.id.clone(),
            truth_mib: t / MIB,
            reserved_mib: res as f64 / MIB,
            uses_gemm: r.uses_gemm,
            uses_conv: r.uses_conv,
        })
    }

    /// The libraries the run loads (calibration rows are single-process runs).
    fn libraries(&self) -> Libraries {
        Libraries::single(self.uses_gemm, self.uses_conv, "calibration")
    }

    fn predict(&self, o: &OutsideAllocator) -> f64 {
        self.reserved_mib + fit::outside_mib(o, self.libraries())
    }
}

/// The value minimising Σ wᵢ·|vᵢ − x|: the weighted median (lower one on ties).
pub fn weighted_median(values: &[(f64, f64)]) -> Option<f64> {
    weighted_quantile(values, 0.5)
}

/// The fitted constants and how they were obtained.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Fit {
    /// The fitted constants.
    pub outside: OutsideAllocator,
    /// `context + cublas` fitted on the MLP runs, MiB.
    pub mlp_sum_mib: Option<f64>,
    /// Training runs used: MLP (cuBLAS, no cuDNN) and convolutional.
    pub train_mlp: usize,
    /// Convolutional training runs.
    pub train_conv: usize,
    /// Test runs.
    pub test: usize,
    /// Test-set metrics with the prior constants.
    pub before: Metrics,
    /// Test-set metrics with the fitted constants.
    pub after: Metrics,
    /// Training runs that load neither cuBLAS nor cuDNN: no constant fitted here applies to
    /// them alone, so they are left out of the fit.
    pub left_out_no_library: usize,
    /// Training runs whose measured peak is below their symbolic reserved peak: the device holds
    /// at least what the allocator reserved, so each contradicts the model.
    pub below_reserved: usize,
    /// Whether a fitted residual was below zero and its constant clamped to 0: the measured peaks
    /// fall below the symbolic reserved peak, and the constant written would not be what was fitted.
    pub clamped: bool,
    /// Notes on identifiability.
    pub notes: Vec<String>,
}

/// Split runs into (train, test) with a seeded shuffle; `test_fraction` of them are held out.
pub fn split(runs: &[CalRun], test_fraction: f64, seed: u64) -> (Vec<CalRun>, Vec<CalRun>) {
    split_by_id(runs, |r| &r.id, test_fraction, seed)
}

/// Split items into (train, test) by a seeded hash of their ids, so an item's side does not
/// depend on which other items are present; `test_fraction` of them (rounded) are held out.
pub fn split_by_id<T: Clone>(items: &[T], id: impl Fn(&T) -> &str, test_fraction: f64, seed: u64) -> (Vec<T>, Vec<T>) {
    let mut keyed: Vec<(u64, &T)> = items
        .iter()
        .map(|r| {
            let mut s = seed
                ^ id(r).bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3));
            (splitmix64(&mut s), r)
        })
        .collect();
    keyed.sort_by_key(|k| k.0);
    let cut = ((items.len() as f64) * test_fraction).round() as usize;
    let test = keyed[..cut].iter().map(|k| k.1.clone()).collect();
    let train = keyed[cut..].iter().map(|k| k.1.clone()).collect();
    (train, test)
}

/// Fit on `train`, evaluate prior and fit on `test`. Residual weights 1/truth make the fit
/// minimise the summed relative error, the quantity MRE reports. `quantile` (0..1) picks the
/// weighted quantile of residuals: 0.5 is the median; a higher one trades error for fewer
/// underestimates.
pub fn fit(prior: &OutsideAllocator, train: &[CalRun], test: &[CalRun], quantile: f64, total_gpu: f64) -> Result<Fit> {
    let wq = |vals: &[(f64, f64)]| weighted_quantile(vals, quantile);
    let mlp: Vec<(f64, f64)> = train
        .iter()
        .filter(|r| r.uses_gemm && !r.uses_conv)
        .map(|r| (r.truth_mib - r.reserved_mib, 1.0 / r.truth_mib))
        .collect();
    // Runs without either library fit no term of their own here; counted, so the notes below
    // never say no such run exists.
    let left_out = train.iter().filter(|r| !r.uses_gemm && !r.uses_conv).count();
    let below_reserved = train.iter().filter(|r| r.truth_mib < r.reserved_mib).count();
    let mut notes = Vec::new();
    let mut clamped = false;
    let mut outside = prior.clone();
    let mlp_sum = wq(&mlp);
    if let Some(sum) = mlp_sum {
        // Every MLP run loads cuBLAS, so context and cuBLAS are not separable on this data: the
        // context stays at its prior and cuBLAS takes the rest (never below zero).
        if sum >= prior.context_mib {
            outside.cublas_mib = sum - prior.context_mib;
            notes.push(if left_out == 0 {
                format!(
                    "context_mib kept at its prior {:.1}: no run without GEMMs separates it from cublas_mib",
                    prior.context_mib
                )
            } else {
                format!(
                    "context_mib kept at its prior {:.1}: the {left_out} runs without GEMMs are not used to separate it \
                     from cublas_mib",
                    prior.context_mib
                )
            });
        } else if sum >= 0.0 {
            outside.context_mib = sum;
            outside.cublas_mib = 0.0;
            notes.push(format!(
                "MLP residual {sum:.1} MiB is below the prior context: context_mib lowered to it, cublas_mib 0"
            ));
        } else {
            clamped = true;
            outside.context_mib = 0.0;
            outside.cublas_mib = 0.0;
            notes.push(format!(
                "MLP residual {sum:.1} MiB is below zero (measured peaks below the symbolic reserved peak): \
                 context_mib and cublas_mib clamped to 0, not fitted"
            ));
        }
    } else {
        notes.push("no MLP runs: context_mib and cublas_mib keep their priors".into());
    }
    let conv: Vec<(f64, f64)> = train
        .iter()
        .filter(|r| r.uses_conv)
        .map(|r| {
            // What the terms other than cuDNN's leave of the measured peak.
            let without_cudnn = Libraries { conv: false, ..r.libraries() };
            (r.truth_mib - r.reserved_mib - fit::outside_mib(&outside, without_cudnn), 1.0 / r.truth_mib)
        })
        .collect();
    match wq(&conv) {
        Some(c) if c < 0.0 => {
            clamped = true;
            outside.cudnn_mib = 0.0;
            notes.push(format!(
                "cuDNN residual {c:.1} MiB is below zero (measured peaks below the symbolic reserved peak and the \
                 other constants): cudnn_mib clamped to 0, not fitted"
            ));
        }
        Some(c) => outside.cudnn_mib = c,
        None => notes.push("no convolutional runs: cudnn_mib keeps its prior".into()),
    }
    if left_out > 0 {
        notes.push(format!(
            "{left_out} of {} training runs load neither cuBLAS nor cuDNN (uses_gemm and uses_conv false): left out, \
             no fitted constant is theirs alone",
            train.len()
        ));
    }
    if below_reserved > 0 {
        notes.push(format!(
            "{below_reserved} of {} training runs measured a peak below their symbolic reserved peak: the device \
             holds at least what the allocator reserved, so these contradict the model (a mismeasured peak, or a \
             replay that overestimates)",
            train.len()
        ));
    }
    if mlp.is_empty() && conv.is_empty() {
        let why = if left_out > 0 {
            format!(
                "all {left_out} training runs load neither cuBLAS nor cuDNN (uses_gemm and uses_conv false), and only \
                 runs that load one fit a constant: nothing to fit"
            )
        } else {
            "no training run has both a measured peak and a symbolic estimate: nothing to fit".to_string()
        };
        return Err(EstimateError::Calibration(why));
    }
    let eval = |o: &OutsideAllocator| {
        let runs: Vec<metrics::Run> = test
            .iter()
            .map(|r| metrics::Run {
                truth: Some(r.truth_mib * MIB),
                real_oom: false,
                estimate: Ok(r.predict(o) * MIB),
                capped_rerun_ok: None,
                seconds: None,
            })
            .collect();
        metrics::compute(&runs, total_gpu)
    };
    Ok(Fit {
        before: eval(prior),
        after: eval(&outside),
        outside,
        mlp_sum_mib: mlp_sum,
        train_mlp: mlp.len(),
        train_conv: conv.len(),
        test: test.len(),
        left_out_no_library: left_out,
        below_reserved,
        clamped,
        notes,
    })
}

/// Weighted quantile (`q` = 0.5 is [`weighted_median`]).
pub fn weighted_quantile(values: &[(f64, f64)], q: f64) -> Option<f64> {
    let mut v: Vec<(f64, f64)> = values.iter().copied().filter(|(x, w)| x.is_finite() && *w > 0.0).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total: f64 = v.iter().map(|x| x.1).sum();
    let mut acc = 0.0;
    for (x, w) in &v {
        acc += w;
        if acc >= total * q.clamp(0.0, 1.0) {
            return Some(*x);
        }
    }
    v.last().map(|x| x.0)
}

/// Rewrite a profile's text with fitted constants: the three `[outside_allocator]` values are
/// replaced in place (their comments kept) and a `[calibration]` table is (re)written at the end.
pub fn rewrite_profile(text: &str, o: &OutsideAllocator, provenance: &[(String, String)], rows: &RowSet) -> String {
    // The old provenance goes; every other table stays as it was.
    let mut out = String::new();
    let mut section = String::new();
    for line in fitted_on(&without_tables(text, "calibration"), provenance).lines() {
        let t = line.trim_start();
        if t.starts_with('[') {
            section = t.to_string();
        }
        if section == "[outside_allocator]" {
            let key = t.split('=').next().unwrap_or("").trim();
            let val = match key {
                "context_mib" => Some(o.context_mib),
                "cublas_mib" => Some(o.cublas_mib),
                "cudnn_mib" => Some(o.cudnn_mib),
                _ => None,
            };
            if let Some(v) = val {
                let comment = line.find('#').map(|i| format!("   {}", &line[i..])).unwrap_or_default();
                out.push_str(&format!("{key} = {v:.1}{comment}\n"));
                continue;
            }
        }
        out.push_str(line);
        out.push('\n');
    }
    out.push_str("\n[calibration]\n");
    for (k, v) in provenance {
        out.push_str(&format!("{k} = {}\n", toml_string(v)));
    }
    let by_stem = rows_by_dataset(rows.ids());
    if !by_stem.is_empty() {
        out.push_str(
            "\n[calibration.rows]\n# The dataset rows (1-based, per file stem) whose runs the constants were fitted and\n\
             # evaluated on; `memest compare` marks them and can leave them out (--exclude-calibrated).\n",
        );
        for (stem, nums) in by_stem {
            let list = nums.iter().map(usize::to_string).collect::<Vec<_>>().join(", ");
            out.push_str(&format!("{} = [{list}]\n", toml_string(&stem)));
        }
    }
    if !rows.digests().is_empty() {
        out.push_str(
            "\n[calibration.row_digests]\n# The same rows by what they hold (memest's rows::digest of each CSV record), so\n\
             # that they are recognised in a file of another name or order.\n",
        );
        for (stem, digests) in rows.digests() {
            let list = digests.iter().map(|d| toml_string(d)).collect::<Vec<_>>().join(", ");
            out.push_str(&format!("{} = [{list}]\n", toml_string(stem)));
        }
    }
    out
}

/// `text` with its leading comment's account of what the constants were fitted on (from the line
/// that names the `[outside_allocator] constants` to the next comment paragraph on another
/// subject: `# Held-out`, `# [provenance]`) replaced by one made from `provenance`: the old
/// one described the data of an earlier fit.
fn fitted_on(text: &str, provenance: &[(String, String)]) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let head = lines.iter().position(|l| l.trim_start().starts_with('[')).unwrap_or(lines.len());
    let get = |k: &str| provenance.iter().find(|(key, _)| key == k).map(|(_, v)| v.as_str());
    let mut said =
        format!("The [outside_allocator] constants were fitted by {}", get("fitted_by").unwrap_or("memest calibrate"));
    if let Some(runs) = get("runs") {
        said += &format!(" on the runs of {runs}");
    }
    if let Some(l) = get("data_licence") {
        said += &format!(" (data licence {l})");
    }
    said += &get("method").map_or(".".into(), |m| format!(": {m}."));
    let mut new: Vec<String> = Vec::new();
    let mut line = String::from("#");
    for word in said.split_whitespace() {
        if line.len() + word.len() > 99 {
            new.push(std::mem::replace(&mut line, "#".into()));
        }
        line = format!("{line} {word}");
    }
    new.push(line);
    let other = |l: &str| l.starts_with("# Held-out") || l.starts_with("# [provenance]") || !l.starts_with('#');
    let start = lines[..head].iter().position(|l| l.contains("[outside_allocator] constants"));
    let (start, end) = match start {
        Some(i) => (i, lines[i + 1..head].iter().position(|l| other(l)).map_or(head, |j| i + 1 + j)),
        // No account to replace: the new one closes the leading comment.
        None => {
            let end = lines[..head].iter().position(|l| !l.starts_with('#')).unwrap_or(head);
            (end, end)
        }
    };
    let mut out: Vec<String> = lines[..start].iter().map(|l| l.to_string()).collect();
    out.extend(new);
    out.extend(lines[end..].iter().map(|l| l.to_string()));
    out.join("\n") + "\n"
}

/// A profile's text without the table `[name]` and its subtables `[name.*]`, with the comment
/// lines directly above their headers (they describe them), every other line kept, and no
/// trailing blank lines.
pub fn without_tables(text: &str, name: &str) -> String {
    let (own, sub) = (format!("[{name}]"), format!("[{name}."));
    let mut out = String::new();
    // Comment and blank lines wait until the next line says which table they belong to.
    let mut pending = String::new();
    let mut skipping = false;
    for line in text.lines() {
        let t = line.trim_start();
        if t.is_empty() || t.starts_with('#') {
            pending.push_str(line);
            pending.push('\n');
            continue;
        }
        if t.starts_with('[') {
            skipping = t.starts_with(&own) || t.starts_with(&sub);
        }
        let kept_blanks: String = pending.lines().filter(|l| l.trim().is_empty()).map(|_| "\n").collect();
        if skipping {
            // The comments above a dropped header go with it; one blank line between tables
            // stays, however many tables were dropped there.
            if t.starts_with('[') && !kept_blanks.is_empty() && !out.is_empty() && !out.ends_with("\n\n") {
                out.push('\n');
            }
        } else {
            // A blank line already ends the text where a table was dropped: don't double it.
            let lead = if out.ends_with("\n\n") { pending.trim_start_matches('\n') } else { &pending };
            out.push_str(lead);
            out.push_str(line);
            out.push('\n');
        }
        pending.clear();
    }
    if !skipping {
        out.push_str(&pending);
    }
    while out.ends_with("\n\n") {
        out.pop();
    }
    out
}

/// Row ids (`STEM-NNNNN`, as [`crate::dataset`] makes them) grouped by dataset stem.
pub fn rows_by_dataset<'a>(ids: impl IntoIterator<Item = &'a str>) -> BTreeMap<String, Vec<usize>> {
    let mut out: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for id in ids {
        if let Some((stem, n)) = id.rsplit_once('-') {
            if let Ok(n) = n.parse() {
                out.entry(stem.to_string()).or_default().push(n);
            }
        }
    }
    for v in out.values_mut() {
        v.sort_unstable();
        v.dedup();
    }
    out
}

/// The rows a profile was calibrated on: `[calibration.rows]` by position and
/// `[calibration.row_digests]` by content; empty when it says neither.
pub fn calibrated_rows(calibration: &BTreeMap<String, toml::Value>) -> std::result::Result<RowSet, String> {
    let mut set = RowSet::default();
    if let Some(rows) = calibration.get("rows") {
        let table = rows.as_table().ok_or("calibration.rows: expected a table of dataset stem = [row numbers]")?;
        for (stem, list) in table {
            let list =
                list.as_array().ok_or_else(|| format!("calibration.rows.{stem}: expected an array of row numbers"))?;
            for v in list {
                let n = v
                    .as_integer()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| format!("calibration.rows.{stem}: {v} is not a row number (1-based)"))?;
                set.insert(&format!("{stem}-{n:05}"), "");
            }
        }
    }
    if let Some(digests) = calibration.get("row_digests") {
        let expected = "expected an array of 16-hex-digit row digests";
        let table =
            digests.as_table().ok_or("calibration.row_digests: expected a table of dataset stem = [digests]")?;
        for (stem, list) in table {
            let list = list.as_array().ok_or_else(|| format!("calibration.row_digests.{stem}: {expected}"))?;
            let digests = list
                .iter()
                .map(|v| {
                    v.as_str()
                        .filter(|d| d.len() == 16 && d.bytes().all(|b| b.is_ascii_hexdigit()))
                        .ok_or_else(|| format!("calibration.row_digests.{stem}: {v} is not a row digest; {expected}"))
                })
                .collect::<std::result::Result<Vec<_>, _>>()?;
            set.insert_digests(stem, digests);
        }
    }
    Ok(set)
}

fn toml_string(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n"))
}
