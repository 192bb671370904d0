//! The report's pictures as inline SVG: memory over the run, the segment map at the peak, and
//! bars for the estimators. Every shape carries a `<title>`, which browsers show on hover, so
//! the page needs no script.

use std::collections::BTreeMap;
use std::fmt::Write;

use crate::alloc::{BlockViewState, SegmentView};

use super::{category_name, Report};

/// Category colours, in `Category::ALL` order (colour-blind-safe Tableau 10).
pub const COLORS: [&str; 7] = ["#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#eeca3b", "#b279a2"];
const FREE: &str = "#d9d9d9";
const PENDING: &str = "#8c8c8c";

pub fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

pub fn mib(b: u64) -> f64 {
    b as f64 / (1u64 << 20) as f64
}

pub fn color_of(category: &str) -> &'static str {
    (0..7).find(|&i| category_name(i) == category).map_or(COLORS[6], |i| COLORS[i])
}

/// A round step for an axis spanning `max`, giving about five ticks.
fn tick_step(max: f64) -> f64 {
    let raw = (max / 5.0).max(1e-9);
    let mag = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 2.5, 5.0, 10.0].iter().map(|m| m * mag).find(|s| *s >= raw).unwrap_or(10.0 * mag)
}

/// Memory over the run: allocated bytes stacked by category, the allocated and reserved lines,
/// the markers, and the peak.
pub fn timeline(r: &Report) -> String {
    let (w, h, left, right, top, bottom) = (960.0, 380.0, 70.0, 20.0, 20.0, 40.0);
    let (pw, ph) = (w - left - right, h - top - bottom);
    let xmax = r.records.max(1) as f64;
    let ymax = (mib(r.peak_reserved.max(r.peak_allocated)) * 1.05).max(1.0);
    let x = |at: u64| left + at as f64 / xmax * pw;
    let y = |b: f64| top + ph - b / ymax * ph;
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg id="timeline" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {w} {h}" width="100%" role="img" aria-label="memory over the run">"#
    );
    let step = tick_step(ymax);
    let mut t = 0.0;
    while t <= ymax {
        let yy = y(t);
        let _ = write!(
            s,
            r##"<line x1="{left}" x2="{}" y1="{yy:.1}" y2="{yy:.1}" stroke="#eee"/><text x="{}" y="{:.1}" font-size="11" text-anchor="end">{t:.0}</text>"##,
            left + pw,
            left - 6.0,
            yy + 4.0
        );
        t += step;
    }
    let _ = write!(
        s,
        r#"<text x="14" y="{}" font-size="12" transform="rotate(-90 14 {})" text-anchor="middle">MiB</text>"#,
        top + ph / 2.0,
        top + ph / 2.0
    );
    let _ = write!(
        s,
        r#"<text x="{}" y="{}" font-size="12" text-anchor="middle">trace records (logical time)</text>"#,
        left + pw / 2.0,
        h - 6.0
    );
    if !r.samples.is_empty() {
        // Stacked areas, bottom category first, as step functions (memory changes at records).
        let mut below = vec![0.0f64; r.samples.len()];
        for (c, color) in COLORS.iter().enumerate() {
            let above: Vec<f64> = r.samples.iter().zip(&below).map(|(p, b)| b + mib(p.by_category[c])).collect();
            if above.iter().zip(&below).all(|(a, b)| a <= b) {
                continue;
            }
            let mut pts = String::new();
            for (i, p) in r.samples.iter().enumerate() {
                let next = r.samples.get(i + 1).map_or(r.records, |n| n.at);
                let _ = write!(pts, "{:.1},{:.1} {:.1},{:.1} ", x(p.at), y(above[i]), x(next), y(above[i]));
            }
            for (i, p) in r.samples.iter().enumerate().rev() {
                let next = r.samples.get(i + 1).map_or(r.records, |n| n.at);
                let _ = write!(pts, "{:.1},{:.1} {:.1},{:.1} ", x(next), y(below[i]), x(p.at), y(below[i]));
            }
            let _ = write!(
                s,
                r#"<polygon points="{pts}" fill="{color}" fill-opacity="0.85"><title>{}</title></polygon>"#,
                category_name(c)
            );
            below = above;
        }
        for (name, color, dash, pick) in
            [("reserved", "#222", "", 0usize), ("allocated", "#222", r#" stroke-dasharray="5 3""#, 1usize)]
        {
            let mut d = String::new();
            for (i, p) in r.samples.iter().enumerate() {
                let v = mib(if pick == 0 { p.reserved } else { p.allocated });
                let next = r.samples.get(i + 1).map_or(r.records, |n| n.at);
                let _ = write!(
                    d,
                    "{}{:.1},{:.1} L{:.1},{:.1} ",
                    if i == 0 { "M" } else { "L" },
                    x(p.at),
                    y(v),
                    x(next),
                    y(v)
                );
            }
            let _ = write!(
                s,
                r#"<path d="{d}" fill="none" stroke="{color}" stroke-width="1.5"{dash}><title>{name}</title></path>"#
            );
        }
    }
    for m in &r.marks {
        let xx = x(m.at);
        let iter = m.is_iter();
        let _ = write!(
            s,
            r##"<line x1="{xx:.1}" x2="{xx:.1}" y1="{top}" y2="{}" stroke="{}" stroke-dasharray="2 3"><title>{}</title></line>"##,
            top + ph,
            if iter { "#555" } else { "#bbb" },
            esc(&m.text)
        );
        if iter {
            let _ = write!(s, r#"<text x="{:.1}" y="{}" font-size="10">{}</text>"#, xx + 3.0, top + 10.0, esc(&m.text));
        }
    }
    let px = x(r.peak_at);
    let _ = write!(
        s,
        r##"<line x1="{px:.1}" x2="{px:.1}" y1="{top}" y2="{}" stroke="#c00" stroke-width="1.5"><title>peak allocated {:.1} MiB at record {}</title></line><text x="{:.1}" y="{}" font-size="11" fill="#c00">peak</text></svg>"##,
        top + ph,
        mib(r.peak_allocated),
        r.peak_at,
        px + 3.0,
        top + 24.0
    );
    s
}

/// The segments at the peak, one row per stream, each segment a box as wide as its share of
/// the row's bytes, its blocks coloured by category (allocated), dark grey (freed, not yet
/// reusable) or light grey (free).
pub fn segment_map(r: &Report) -> String {
    let mut by_stream: BTreeMap<i64, Vec<&SegmentView>> = BTreeMap::new();
    for seg in &r.segments {
        by_stream.entry(seg.stream).or_default().push(seg);
    }
    let widest = by_stream.values().map(|v| v.iter().map(|s| s.size).sum::<u64>()).max().unwrap_or(1).max(1);
    let (w, left, row, gap) = (960.0, 150.0, 34.0, 1.0);
    let pw = w - left - 10.0;
    let h = row * by_stream.len().max(1) as f64 + 10.0;
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg id="segments" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {w} {h}" width="100%" role="img" aria-label="segments at the peak">"#
    );
    for (i, (stream, segs)) in by_stream.iter().enumerate() {
        let y0 = 5.0 + i as f64 * row;
        let total: u64 = segs.iter().map(|s| s.size).sum();
        let _ = write!(
            s,
            r##"<text x="4" y="{:.1}" font-size="11">stream {stream}</text><text x="4" y="{:.1}" font-size="10" fill="#555">{} segs, {:.0} MiB</text>"##,
            y0 + 12.0,
            y0 + 25.0,
            segs.len(),
            mib(total)
        );
        let mut x0 = left;
        for seg in segs {
            let sw = seg.size as f64 / widest as f64 * pw;
            let _ = write!(
                s,
                r##"<rect x="{x0:.2}" y="{y0:.1}" width="{:.2}" height="{:.1}" fill="none" stroke="#666" stroke-width="0.5"><title>segment {:#x}: {:.2} MiB{}</title></rect>"##,
                (sw - gap).max(0.2),
                row - 8.0,
                seg.addr,
                mib(seg.size),
                if seg.expandable { ", expandable" } else { "" }
            );
            // Adjacent blocks of one colour are drawn as one box.
            let mut run: Option<(f64, u64, &str, usize)> = None;
            let flush = |s: &mut String, run: Option<(f64, u64, &str, usize)>| {
                if let Some((bx, bytes, color, n)) = run {
                    let bw = (bytes as f64 / widest as f64 * pw).max(0.1);
                    let _ = write!(
                        s,
                        r#"<rect x="{bx:.2}" y="{:.1}" width="{bw:.2}" height="{:.1}" fill="{color}"><title>{n} block(s), {:.2} MiB</title></rect>"#,
                        y0 + 1.0,
                        row - 10.0,
                        mib(bytes)
                    );
                }
            };
            let mut bx = x0;
            for b in &seg.blocks {
                let color = match b.state {
                    BlockViewState::Inactive => FREE,
                    BlockViewState::PendingFree => PENDING,
                    BlockViewState::Allocated => r.block_categories.get(&b.addr).map_or(COLORS[6], |c| color_of(c)),
                };
                run = match run {
                    Some((rx, bytes, c, n)) if c == color => Some((rx, bytes + b.size, c, n + 1)),
                    other => {
                        flush(&mut s, other);
                        Some((bx, b.size, color, 1))
                    }
                };
                bx += b.size as f64 / widest as f64 * pw;
            }
            flush(&mut s, run);
            x0 += sw;
        }
    }
    s.push_str("</svg>");
    s
}

/// Horizontal bars, one per estimator, with the measured or decisive value marked.
pub fn bars(rows: &[(String, f64, bool)], capacity: Option<f64>) -> String {
    let (w, left, row) = (960.0, 150.0, 22.0);
    let pw = w - left - 90.0;
    let max = rows.iter().map(|r| r.1).fold(capacity.unwrap_or(0.0), f64::max).max(1.0);
    let h = row * rows.len() as f64 + 10.0;
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg id="estimators" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {w} {h}" width="100%" role="img" aria-label="estimators side by side">"#
    );
    for (i, (name, v, headline)) in rows.iter().enumerate() {
        let y0 = 5.0 + i as f64 * row;
        let bw = v / max * pw;
        let _ = write!(
            s,
            r##"<text x="4" y="{:.1}" font-size="12"{}>{}</text><rect x="{left}" y="{y0:.1}" width="{bw:.1}" height="{:.1}" fill="{}"><title>{}: {v:.1} MiB</title></rect><text x="{:.1}" y="{:.1}" font-size="11">{v:.0} MiB</text>"##,
            y0 + 13.0,
            if *headline { r#" font-weight="bold""# } else { "" },
            esc(name),
            row - 6.0,
            if *headline { "#4c78a8" } else { "#9ecae9" },
            esc(name),
            left + bw + 4.0,
            y0 + 13.0
        );
    }
    if let Some(c) = capacity {
        let cx = left + c / max * pw;
        let _ = write!(
            s,
            r##"<line x1="{cx:.1}" x2="{cx:.1}" y1="0" y2="{h}" stroke="#c00" stroke-dasharray="4 3"><title>capacity {c:.0} MiB</title></line>"##
        );
    }
    s.push_str("</svg>");
    s
}
