//! One self-contained HTML page for a [`Report`]: no script, no network, inline SVG and CSS.

use std::fmt::Write;

use serde::Serialize;

use super::svg::{self, esc, mib};
use super::Report;
use crate::fit;
use crate::units::{Unbounded, UNBOUNDED};

/// The verdict of one GPU profile on the trace.
#[derive(Debug, Clone, Serialize)]
pub struct ProfileVerdict {
    /// Profile name.
    pub profile: String,
    /// The GPU it describes.
    pub gpu: String,
    /// The number the verdict rests on (MiB): the safe number, or the point with `--point`;
    /// `None` (`null`) for a need no device holds, which `need_unbounded` says why.
    pub need_mib: Option<f64>,
    /// The point estimate: reserved peak plus memory outside the allocator (MiB); `None` as
    /// `need_mib`.
    pub point_mib: Option<f64>,
    /// The reserved peak in it (MiB); `None` when saturated (a damaged trace).
    pub reserved_mib: Option<f64>,
    /// Why no device holds the need, when none does (`memsim replay --json`'s `need_unbounded`).
    pub need_unbounded: Option<Unbounded>,
    /// The GPU's total memory (MiB).
    pub capacity_mib: f64,
    /// Whether the job fits.
    pub fits: bool,
    /// "safe" or "point".
    pub basis: String,
    /// Why the need is not the page's reserved peak plus the outside terms, where it is not: the
    /// replay at the capacity (the allocator frees its cache when the device is full), a failed
    /// allocation the peak never counts, or this profile's allocator rules.
    pub note: Option<String>,
}

/// An estimate as the page shows it: the caller reads the file (through its one parser, which
/// checks the numbers agree) and words it (memest's words, made from the numbers); the page
/// words nothing itself.
#[derive(Debug, Clone, Default)]
pub struct EstimatePage {
    /// What is needed where: `needs 1234.5 MiB on GPU (point 1200.0)`.
    pub headline: String,
    /// Whether the need in the headline fits (its verdict word: [`fit::verdict_word`]).
    pub fits: bool,
    /// The need in MiB; `None` for a need no device holds.
    pub need_mib: Option<f64>,
    /// The lines under the headline: the capacity it was judged at, the margin, the breakdown.
    pub details: Vec<String>,
    /// The capacity the estimate was judged at (MiB): the line across the bars.
    pub capacity_mib: f64,
    /// The estimator the headline is of.
    pub headline_estimator: String,
    /// Each estimator that gave a number, by name.
    pub estimators: Vec<EstimatorRow>,
    /// Each estimator that did not, and why.
    pub unavailable: Vec<(String, String)>,
}

/// One estimator's number beside the others.
#[derive(Debug, Clone, Default)]
pub struct EstimatorRow {
    /// Its name (`symbolic`, `analytic`, ...).
    pub name: String,
    /// Device memory it estimates (MiB).
    pub device_mib: f64,
    /// What the number measures (`device`, `live`, ...).
    pub level: String,
    /// What it leaves out.
    pub ignores: String,
}

/// What the page shows beyond the replay.
#[derive(Debug, Clone, Default)]
pub struct Extras {
    /// What the page is about (the trace's file name).
    pub title: String,
    /// The allocator rules replayed (PyTorch version).
    pub allocator: String,
    /// An estimate of the same job (`memest estimate --json`, the trainer's `estimate --json`),
    /// for the headline and the estimators.
    pub estimate: Option<EstimatePage>,
    /// One verdict per GPU profile.
    pub verdicts: Vec<ProfileVerdict>,
    /// Warnings of the replay.
    pub warnings: Vec<String>,
}

const CSS: &str = "body{font:14px/1.45 system-ui,sans-serif;margin:24px auto;max-width:1000px;color:#222}\
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:28px 0 8px;border-bottom:1px solid #ddd}\
#headline{font-size:18px;font-weight:600;margin:8px 0}.fits{color:#1a7f37}.nofit{color:#c00}\
table{border-collapse:collapse;width:100%;font-size:13px}td,th{border-bottom:1px solid #eee;padding:3px 6px;\
text-align:left;vertical-align:top}td.n{text-align:right;font-variant-numeric:tabular-nums}\
.legend span{display:inline-block;margin-right:14px}.sw{display:inline-block;width:11px;height:11px;\
margin-right:4px;vertical-align:-1px}.muted{color:#666}code{font-size:12px}.warn{color:#8a5a00}";

fn verdict_word(fits: bool) -> String {
    let class = if fits { "fits" } else { "nofit" };
    format!(r#"<span class="{class}">{}</span>"#, fit::verdict_word(fits))
}

/// The estimate's headline and the lines under it (the capacity it was judged at, the margin,
/// the breakdown), in the words the caller made from its numbers.
fn estimate_headline(e: &EstimatePage) -> String {
    // A need no device holds has no number to carry.
    let need = e.need_mib.map_or_else(String::new, |need| format!(r#" data-mib="{need:.1}""#));
    let details: Vec<String> = e.details.iter().map(|l| esc(l.trim())).collect();
    format!(
        r#"<p id="headline"{need}>{}: {}</p><p class="muted" id="details">{}</p>"#,
        esc(&e.headline),
        verdict_word(e.fits),
        details.join("<br>")
    )
}

fn headline(r: &Report, x: &Extras) -> String {
    if let Some(e) = &x.estimate {
        return estimate_headline(e);
    }
    // A verdict beside this peak that rests on another number must not read as a contradiction.
    let differs = if x.verdicts.iter().any(|v| v.note.is_some()) {
        concat!(
            r#"<p class="muted">These peaks are of a replay without a capacity; where a verdict below needs "#,
            "another amount, its note says why.</p>"
        )
    } else {
        ""
    };
    format!(
        r#"<p id="headline" data-mib="{:.1}">peak reserved {:.1} MiB (peak allocated {:.1} MiB)</p>{differs}"#,
        mib(r.peak_reserved),
        mib(r.peak_reserved),
        mib(r.peak_allocated)
    )
}

fn legend(r: &Report) -> String {
    let mut s = String::from(r#"<p class="legend">"#);
    for i in (0..7).filter(|&i| r.samples.iter().any(|p| p.by_category[i] > 0)) {
        let name = super::category_name(i);
        let _ = write!(s, r#"<span><i class="sw" style="background:{}"></i>{}</span>"#, svg::COLORS[i], esc(name));
    }
    s.push_str(r#"<span>— reserved</span><span>- - allocated</span><span style="color:#c00">| peak</span></p>"#);
    s
}

fn at_peak(r: &Report) -> String {
    let mut s = String::new();
    let frag = r.reserved_at_peak.saturating_sub(r.peak_allocated);
    let _ = write!(
        s,
        "<p>The allocated peak, {:.1} MiB, is at record {} of {}; {:.1} MiB are reserved then, so {:.1} MiB \
         ({:.1}%) are cached or fragmented. {} allocations are alive.</p>",
        mib(r.peak_allocated),
        r.peak_at,
        r.records,
        mib(r.reserved_at_peak),
        mib(frag),
        if r.reserved_at_peak > 0 { 100.0 * frag as f64 / r.reserved_at_peak as f64 } else { 0.0 },
        r.live_count
    );
    if r.has_categories {
        s.push_str("<table><tr><th>category</th><th>MiB</th><th>share</th></tr>");
        let total: u64 = r.categories_at_peak.iter().map(|c| c.1).sum::<u64>().max(1);
        for (name, bytes) in &r.categories_at_peak {
            let _ = write!(
                s,
                r#"<tr><td><i class="sw" style="background:{}"></i>{}</td><td class="n">{:.1}</td><td class="n">{:.1}%</td></tr>"#,
                svg::color_of(name),
                esc(name),
                mib(*bytes),
                100.0 * *bytes as f64 / total as f64
            );
        }
        s.push_str("</table>");
    } else {
        s.push_str(r#"<p class="muted">The trace labels no allocation with a category.</p>"#);
    }
    let _ = write!(s, "<h3>The {} largest allocations alive at the peak</h3>", r.top.len());
    s.push_str("<table><tr><th>MiB</th><th>block MiB</th><th>category</th><th>stream</th><th>where</th></tr>");
    for a in &r.top {
        let wher = if a.site.is_empty() {
            r#"<span class="muted">no stack in the trace</span>"#.to_string()
        } else {
            a.site.iter().map(|f| format!("<code>{}</code>", esc(f))).collect::<Vec<_>>().join("<br>")
        };
        let _ = write!(
            s,
            r#"<tr><td class="n">{:.2}</td><td class="n">{:.2}</td><td>{}</td><td>{}</td><td>{wher}</td></tr>"#,
            mib(a.size),
            mib(a.block),
            esc(&a.category),
            a.stream
        );
    }
    s.push_str("</table>");
    s
}

fn segments(r: &Report) -> String {
    let reserved: u64 = r.segments.iter().map(|s| s.size).sum();
    let largest_free = r
        .segments
        .iter()
        .flat_map(|s| &s.blocks)
        .filter(|b| b.state == crate::alloc::BlockViewState::Inactive)
        .map(|b| b.size)
        .max()
        .unwrap_or(0);
    format!(
        "<p>{} segments, {:.1} MiB reserved at the peak; the largest free block is {:.1} MiB. Boxes are \
         segments, as wide as their bytes; inside, allocated blocks take their category's colour, free blocks \
         light grey, blocks freed but not yet reusable dark grey. A block freed in one stream's pool cannot \
         serve another stream.</p>{}",
        r.segments.len(),
        mib(reserved),
        mib(largest_free),
        svg::segment_map(r)
    )
}

fn estimators(e: &EstimatePage) -> String {
    let mut rows: Vec<(String, f64, bool)> = Vec::new();
    let mut table = String::from("<table><tr><th>estimator</th><th>MiB</th><th>counts</th><th>ignores</th></tr>");
    for x in &e.estimators {
        let headline = x.name == e.headline_estimator;
        rows.push((x.name.clone(), x.device_mib, headline));
        let _ = write!(
            table,
            r#"<tr><td>{}{}</td><td class="n">{:.1}</td><td>{}</td><td class="muted">{}</td></tr>"#,
            esc(&x.name),
            if headline { " (memtrace)" } else { "" },
            x.device_mib,
            esc(&x.level),
            esc(&x.ignores)
        );
    }
    for (name, why) in &e.unavailable {
        let _ = write!(
            table,
            r#"<tr><td>{}</td><td class="n">-</td><td></td><td class="muted">{}</td></tr>"#,
            esc(name),
            esc(why)
        );
    }
    table.push_str("</table>");
    rows.sort_by(|a, b| b.1.total_cmp(&a.1));
    format!("{}{table}", svg::bars(&rows, Some(e.capacity_mib)))
}

fn verdicts(vs: &[ProfileVerdict]) -> String {
    let mut s = String::from(
        "<table><tr><th>profile</th><th>GPU</th><th>needs</th><th>point</th><th>capacity</th>\
         <th>verdict</th></tr>",
    );
    for v in vs {
        // Each cell carries its unit: where need and capacity would print alike in MiB they are
        // shown in bytes, under a header that said MiB. A need no device holds is said so, as
        // memest's text says it, not as 2^64 B in MiB.
        let need_mib = v.need_mib.unwrap_or(f64::INFINITY);
        let (need, capacity) = crate::units::need_and_capacity_mib(need_mib, v.capacity_mib, 1);
        let point = v.point_mib.map_or_else(|| UNBOUNDED.to_string(), |p| format!("{p:.1} MiB"));
        let _ = write!(
            s,
            r#"<tr><td>{}</td><td>{}</td><td class="n">{}</td><td class="n">{}</td><td class="n">{}</td><td>{} <span class="muted">({})</span></td></tr>"#,
            esc(&v.profile),
            esc(&v.gpu),
            esc(&need),
            esc(&point),
            esc(&capacity),
            verdict_word(v.fits),
            esc(&v.basis)
        );
    }
    s.push_str("</table>");
    for v in vs {
        if let Some(n) = &v.note {
            let _ = write!(s, r#"<p class="note">{}: {}</p>"#, esc(&v.profile), esc(n));
        }
    }
    s
}

/// The page.
pub fn render(r: &Report, x: &Extras) -> String {
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>memtrace: {}</title><style>{CSS}</style></head><body>"#,
        esc(&x.title)
    );
    let _ = write!(
        s,
        r#"<h1>GPU memory of {}</h1><p class="muted">memtrace report: device {} of {}, {} records, allocator rules of PyTorch {}</p>{}"#,
        esc(&x.title),
        r.device,
        r.devices,
        r.records,
        esc(&x.allocator),
        headline(r, x)
    );
    if !x.warnings.is_empty() {
        let _ = write!(
            s,
            r##"<p class="warn">{} warning(s): see <a href="#warnings">the end of the page</a>.</p>"##,
            x.warnings.len()
        );
    }
    let _ = write!(s, "<h2>Memory over the run</h2>{}{}", legend(r), svg::timeline(r));
    let _ = write!(s, "<h2>What is alive at the peak</h2>{}", at_peak(r));
    let _ = write!(s, "<h2>Segments at the peak</h2>{}", segments(r));
    if let Some(e) = &x.estimate {
        let _ = write!(s, "<h2>The estimators side by side</h2>{}", estimators(e));
    }
    if !x.verdicts.is_empty() {
        let _ = write!(s, "<h2>The verdict per GPU profile</h2>{}", verdicts(&x.verdicts));
    }
    if !x.warnings.is_empty() {
        s.push_str(r#"<h2 id="warnings">Warnings</h2><ul>"#);
        for w in &x.warnings {
            let _ = write!(s, r#"<li class="warn">{}</li>"#, esc(w));
        }
        s.push_str("</ul>");
    }
    s.push_str("</body></html>\n");
    s
}
