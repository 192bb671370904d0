//! Report writers: the Markdown tables (the FakeTensor table's percentile layout, xMem's
//! MRE/PEF/MCP, bin scores, latency, failures), the per-run CSV and the JSON forms.

use std::fmt::Write as _;

use crate::compare::{GroupMetrics, RunRecord, ESTIMATORS};
use crate::metrics::{Metrics, PefKind};

const MIB: f64 = 1024.0 * 1024.0;

fn pct(v: Option<f64>) -> String {
    v.map_or("–".into(), |x| format!("{:.1}%", x * 100.0))
}

fn num(v: Option<f64>, digits: usize) -> String {
    v.map_or("–".into(), |x| format!("{x:.digits$}"))
}

/// The estimator's name, marked when the row compares allocator-level answers and truth.
fn label(r: &GroupMetrics) -> String {
    if r.level == "device" {
        r.estimator.clone()
    } else {
        format!("{} ({})", r.estimator, r.level)
    }
}

/// PEF from memsim's simulated capped reruns, as every view prints it: none where some run had
/// no trace to simulate (the value is then the proxy's, [`PefKind::Proxy`]).
pub fn pef_memsim(m: &Metrics) -> String {
    match (m.pef, m.pef_kind) {
        (Some(v), PefKind::Simulated) => format!("{v:.1}%"),
        (Some(_), PefKind::Proxy) => "– (some runs had no trace)".into(),
        (None, _) => "–".into(),
    }
}

/// The PEF proxy ("estimate below truth" as the capped rerun), as every view prints it.
pub fn pef_proxy(g: &GroupMetrics) -> String {
    g.pef_proxy.map_or("–".into(), |v| format!("{v:.1}%"))
}

/// A Markdown table of estimators: the header (column names joined by " | ", the estimator's
/// first), its rule, and a line per row: the estimator's [`label`], then `cells` of its metrics.
fn table(s: &mut String, header: &str, rows: &[&GroupMetrics], cells: impl Fn(&GroupMetrics, &Metrics) -> Vec<String>) {
    let columns = header.split(" | ").count();
    let _ = writeln!(s, "| {header} |");
    let _ = writeln!(s, "|{}", "---|".repeat(columns));
    for r in rows {
        let mut line = vec![label(r)];
        line.extend(cells(r, &r.metrics));
        debug_assert_eq!(line.len(), columns, "a row's cells match the header");
        let _ = writeln!(s, "| {} |", line.join(" | "));
    }
}

/// The Markdown report. `title` heads it; `notes` go under the title verbatim.
pub fn markdown(title: &str, notes: &str, groups: &[GroupMetrics]) -> String {
    let mut s = format!("# {title}\n\n{notes}\n\n");
    let mut names: Vec<&str> = groups.iter().map(|g| g.group.as_str()).collect();
    names.dedup();
    let mut seen = Vec::new();
    for g in names {
        if seen.contains(&g) {
            continue;
        }
        seen.push(g);
        let rows: Vec<&GroupMetrics> = groups.iter().filter(|m| m.group == g).collect();
        let n = rows.first().map_or(0, |r| r.metrics.runs + r.unlabelled);
        let _ = writeln!(s, "## {g} ({n} runs)\n");
        for r in rows.iter().filter(|r| r.unlabelled > 0) {
            let _ = writeln!(
                s,
                "- {}: {} of {n} runs have no {} truth and are not scored.",
                label(r),
                r.unlabelled,
                r.level
            );
        }
        for r in rows.iter().filter(|r| r.metrics.zero_truth > 0) {
            let _ = writeln!(
                s,
                "- {}: {} of {n} runs have a measured peak of 0 MiB (a failed measurement, not a peak): estimated, \
                 but left out of the errors, PEF and MCP.",
                label(r),
                r.metrics.zero_truth
            );
        }
        if rows.iter().any(|r| r.unlabelled > 0 || r.metrics.zero_truth > 0) {
            s.push('\n');
        }
        table(
            &mut s,
            "estimator | estimated | MRE | median signed | under | P50 | P80 | P90 | P95 | P99 | max | PEF (memsim) | PEF proxy | MCP GB",
            &rows,
            |r, m| {
                let p = m.abs_rel;
                vec![
                    format!("{}/{}", m.estimated, m.runs),
                    pct(m.mre),
                    pct(m.median_signed),
                    pct(m.under_fraction),
                    pct(p.map(|p| p.p50)),
                    pct(p.map(|p| p.p80)),
                    pct(p.map(|p| p.p90)),
                    pct(p.map(|p| p.p95)),
                    pct(p.map(|p| p.p99)),
                    pct(p.map(|p| p.max)),
                    pef_memsim(m),
                    pef_proxy(r),
                    num(m.mcp_gb, 2),
                ]
            },
        );
        s.push_str("\nAbsolute error in MiB, bin accuracy / macro F1 (right-closed bins), latency:\n\n");
        table(
            &mut s,
            "estimator | P50 MiB | P90 MiB | P99 MiB | max MiB | acc@1GiB | F1@1GiB | acc@2GiB | F1@2GiB | acc@8GiB | F1@8GiB | latency P50 s | latency P99 s",
            &rows,
            |_, m| {
                let a = m.abs_mib;
                let bin = |w: f64| m.bins.iter().find(|b| b.width_gib == w);
                let mut cells =
                    [a.map(|p| p.p50), a.map(|p| p.p90), a.map(|p| p.p99), a.map(|p| p.max)].map(|v| num(v, 0)).to_vec();
                for w in [1.0, 2.0, 8.0] {
                    cells.extend([bin(w).map(|b| b.accuracy), bin(w).map(|b| b.macro_f1)].map(|v| num(v, 3)));
                }
                cells.extend([m.latency_p50_s, m.latency_p99_s].map(|v| num(v, 4)));
                cells
            },
        );
        let failures: Vec<String> = rows
            .iter()
            .flat_map(|r| r.metrics.not_estimated.iter().map(move |(why, n)| format!("- {}: {n} × {why}", label(r))))
            .collect();
        if !failures.is_empty() {
            s.push_str("\nRuns not estimated:\n\n");
            s.push_str(&failures.join("\n"));
            s.push('\n');
        }
        s.push('\n');
    }
    s
}

/// Per-run CSV: one row per run, a MiB column per estimator.
pub fn runs_csv(records: &[RunRecord]) -> String {
    let mut s = String::from("id,spec,family,batch,real_oom,calibrated_on,truth_mib,reserved_truth_mib");
    for e in ESTIMATORS {
        let _ = write!(s, ",{e}_mib,{e}_reserved_mib,{e}_capped_ok,{e}_seconds,{e}_error");
    }
    s.push('\n');
    let opt = |v: Option<f64>| v.map_or(String::new(), |x| format!("{x:.2}"));
    for r in records {
        let _ = write!(
            s,
            "{},{},{},{},{},{},{},{}",
            csv_cell(&r.id),
            csv_cell(&r.spec),
            r.family,
            r.batch,
            r.real_oom,
            r.calibrated_on,
            opt(r.truth_bytes.map(|t| t / MIB)),
            opt(r.reserved_truth_bytes.map(|t| t / MIB))
        );
        for e in ESTIMATORS {
            match r.estimates.get(e) {
                None => s.push_str(",,,,,"),
                Some(o) => {
                    let _ = write!(
                        s,
                        ",{},{},{},{},{}",
                        opt(o.device_bytes.map(|b| b as f64 / MIB)),
                        opt(o.reserved_bytes.map(|b| b as f64 / MIB)),
                        o.capped_rerun_ok.map_or(String::new(), |b| b.to_string()),
                        opt(o.seconds),
                        csv_cell(o.error.as_deref().unwrap_or("")),
                    );
                }
            }
        }
        s.push('\n');
    }
    s
}

fn csv_cell(v: &str) -> String {
    if v.contains([',', '"', '\n']) {
        format!("\"{}\"", v.replace('"', "\"\"").replace('\n', " "))
    } else {
        v.to_string()
    }
}

/// `runs.jsonl`: one [`RunRecord`] per line (what `memest calibrate` reads).
pub fn runs_jsonl(records: &[RunRecord]) -> String {
    let mut s = String::new();
    for r in records {
        s.push_str(&serde_json::to_string(r).unwrap_or_default());
        s.push('\n');
    }
    s
}
