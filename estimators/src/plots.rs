//! Plots (SVG and PNG) of a comparison: estimate vs actual with y = x, error distributions
//! (CDF of signed relative error), and per-run bars like GPUMemNet's Figure 5.

use std::path::{Path, PathBuf};

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::compare::{RunRecord, ESTIMATORS};
use crate::error::{EstimateError, Result};

const MIB: f64 = 1024.0 * 1024.0;
const COLORS: [RGBColor; 6] = [
    RGBColor(230, 97, 1),
    RGBColor(94, 60, 153),
    RGBColor(27, 158, 119),
    RGBColor(117, 112, 179),
    RGBColor(31, 120, 180),
    RGBColor(200, 30, 90),
];

type DrawResult = std::result::Result<(), String>;

/// Every chart's legend, in one style.
fn legend<'a, DB: DrawingBackend + 'a, CT: CoordTranslate>(chart: &mut ChartContext<'a, DB, CT>) -> DrawResult {
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| e.to_string())
}

/// The plots [`write_all`] draws, by name.
const PLOTS: [&str; 3] = ["estimate_vs_actual", "error_distribution", "per_run_bars"];

/// The files [`write_all`] writes into `dir`.
pub fn files(dir: &Path) -> Vec<PathBuf> {
    PLOTS.iter().flat_map(|name| ["svg", "png"].map(|ext| paths(dir, name, ext).0)).collect()
}

/// Write `NAME.svg` and `NAME.png` of every plot into `dir`; returns the files written.
pub fn write_all(dir: &Path, records: &[RunRecord]) -> Result<Vec<PathBuf>> {
    const SIZE: (u32, u32) = (900, 650);
    let mut written = Vec::new();
    for name in PLOTS {
        let (svg, tmp) = paths(dir, name, "svg");
        written.push(finish(name, SVGBackend::new(&tmp, SIZE).into_drawing_area(), records, &tmp, svg)?);
        let (png, tmp) = paths(dir, name, "png");
        written.push(finish(name, BitMapBackend::new(&tmp, SIZE).into_drawing_area(), records, &tmp, png)?);
    }
    Ok(written)
}

/// A plot's file, and the temporary name it is drawn into first.
fn paths(dir: &Path, name: &str, ext: &str) -> (PathBuf, PathBuf) {
    (dir.join(format!("{name}.{ext}")), dir.join(format!(".{name}.tmp.{ext}")))
}

/// Draws plot `name` on `root`, a backend writing `tmp`, then renames `tmp` to `out`: a failed
/// plot never leaves a partial file under its name.
fn finish<DB: DrawingBackend>(
    name: &str,
    root: DrawingArea<DB, Shift>,
    records: &[RunRecord],
    tmp: &Path,
    out: PathBuf,
) -> Result<PathBuf> {
    draw(name, &root, records)
        .and_then(|_| root.present().map_err(|e| e.to_string()))
        .map_err(|message| EstimateError::Plot { path: out.clone(), message })?;
    // The backend writes and closes its file when dropped: before the rename.
    drop(root);
    rename(tmp, &out)?;
    Ok(out)
}

fn rename(from: &Path, to: &Path) -> Result<()> {
    std::fs::rename(from, to).map_err(|source| EstimateError::Io {
        path: to.to_path_buf(),
        action: "cannot write",
        source,
    })
}

fn draw<DB: DrawingBackend>(name: &str, root: &DrawingArea<DB, Shift>, records: &[RunRecord]) -> DrawResult {
    match name {
        "estimate_vs_actual" => scatter(root, records),
        "error_distribution" => error_cdf(root, records),
        _ => bars(root, records),
    }
}

/// (truth MiB, estimate MiB) per estimator, runs with both.
fn pairs(records: &[RunRecord], est: &str) -> Vec<(f64, f64)> {
    records
        .iter()
        .filter(|r| !r.real_oom)
        .filter_map(|r| {
            let t = r.truth_bytes? / MIB;
            let e = r.estimates.get(est)?.device_bytes? as f64 / MIB;
            (t > 0.0 && e > 0.0).then_some((t, e))
        })
        .collect()
}

fn present(records: &[RunRecord]) -> Vec<(usize, &'static str)> {
    ESTIMATORS.iter().copied().enumerate().filter(|(_, e)| !pairs(records, e).is_empty()).collect()
}

fn scatter<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, records: &[RunRecord]) -> DrawResult {
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let all: Vec<f64> =
        present(records).iter().flat_map(|(_, e)| pairs(records, e)).flat_map(|(t, e)| [t, e]).collect();
    let lo = all.iter().copied().fold(f64::INFINITY, f64::min).clamp(1e-3, 100.0);
    let hi = all.iter().copied().fold(0.0, f64::max).max(lo * 10.0);
    let mut chart = ChartBuilder::on(root)
        .caption("estimate vs measured (MiB, log-log); y = x is exact", ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d((lo..hi).log_scale(), (lo..hi).log_scale())
        .map_err(|e| e.to_string())?;
    chart.configure_mesh().x_desc("measured MiB").y_desc("estimated MiB").draw().map_err(|e| e.to_string())?;
    chart
        .draw_series(LineSeries::new([(lo, lo), (hi, hi)], BLACK.stroke_width(1)))
        .map_err(|e| e.to_string())?
        .label("y = x");
    for (i, est) in present(records) {
        let c = COLORS[i % COLORS.len()];
        chart
            .draw_series(pairs(records, est).into_iter().map(|p| Circle::new(p, 2, c.filled())))
            .map_err(|e| e.to_string())?
            .label(est)
            .legend(move |(x, y)| Circle::new((x, y), 4, c.filled()));
    }
    legend(&mut chart)
}

fn error_cdf<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, records: &[RunRecord]) -> DrawResult {
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let mut chart = ChartBuilder::on(root)
        .caption(
            "signed relative error (estimate − measured) / measured, CDF; clipped to [−100%, +300%]",
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(-100.0..300.0, 0.0..1.0)
        .map_err(|e| e.to_string())?;
    chart.configure_mesh().x_desc("signed error %").y_desc("fraction of runs").draw().map_err(|e| e.to_string())?;
    for (i, est) in present(records) {
        let c = COLORS[i % COLORS.len()];
        let mut errs: Vec<f64> =
            pairs(records, est).iter().map(|(t, e)| ((e - t) / t * 100.0).clamp(-100.0, 300.0)).collect();
        errs.sort_by(f64::total_cmp);
        let n = errs.len() as f64;
        let pts: Vec<(f64, f64)> = errs.iter().enumerate().map(|(k, &x)| (x, (k + 1) as f64 / n)).collect();
        chart
            .draw_series(LineSeries::new(pts, c.stroke_width(2)))
            .map_err(|e| e.to_string())?
            .label(est)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], c.stroke_width(2)));
    }
    legend(&mut chart)
}

fn bars<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, records: &[RunRecord]) -> DrawResult {
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    // Up to 12 runs spread evenly over the measured range, like the paper's per-model figure.
    let mut measured: Vec<&RunRecord> = records.iter().filter(|r| r.truth_bytes.is_some() && !r.real_oom).collect();
    measured.sort_by(|a, b| a.truth_bytes.partial_cmp(&b.truth_bytes).unwrap_or(std::cmp::Ordering::Equal));
    let k = measured.len().min(12);
    let chosen: Vec<&RunRecord> = (0..k).map(|i| measured[i * measured.len() / k.max(1)]).collect();
    let est = present(records);
    let series = est.len() + 1;
    let value = |r: &RunRecord, s: usize| -> f64 {
        if s == 0 {
            r.truth_bytes.unwrap_or(0.0) / MIB
        } else {
            r.estimates.get(est[s - 1].1).and_then(|o| o.device_bytes).map_or(0.0, |b| b as f64 / MIB)
        }
    };
    let top =
        chosen.iter().flat_map(|r| (0..series).map(move |s| (r, s))).map(|(r, s)| value(r, s)).fold(1.0, f64::max);
    let mut chart = ChartBuilder::on(root)
        .caption("per run: measured (black) and each estimator, MiB", ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..(k.max(1) as f64), 0.0..top * 1.05)
        .map_err(|e| e.to_string())?;
    chart.configure_mesh().x_desc("run (sorted by measured peak)").y_desc("MiB").draw().map_err(|e| e.to_string())?;
    let w = 0.8 / series as f64;
    for s in 0..series {
        let c = if s == 0 { BLACK } else { COLORS[est[s - 1].0 % COLORS.len()] };
        let label = if s == 0 { "measured" } else { est[s - 1].1 };
        chart
            .draw_series(chosen.iter().enumerate().map(|(i, r)| {
                let x0 = i as f64 + 0.1 + s as f64 * w;
                Rectangle::new([(x0, 0.0), (x0 + w, value(r, s))], c.filled())
            }))
            .map_err(|e| e.to_string())?
            .label(label)
            .legend(move |(x, y)| Rectangle::new([(x, y - 4), (x + 10, y + 4)], c.filled()));
    }
    legend(&mut chart)
}
