//! What a memory report shows, taken from a replay: memory over the run by category with the
//! allocated and reserved lines, what is alive at the peak (by category, and the largest
//! allocations with their source lines where the trace has them), and the segment map at the
//! peak. Sans-IO: records in, a [`Report`] out; [`html::render`] turns it into one
//! self-contained page.

pub mod html;
pub mod site;
mod svg;

use std::collections::HashMap;

use serde::Serialize;
use trace::marker::{self, MarkerKind};
use trace::{Category, Event, Header, MemoryKind, Origin, Record};

use crate::alloc::SegmentView;
use crate::replay::{ReplayOptions, ReplaySetupError, Replayer};

/// Points kept for the plot: enough for a smooth curve, few enough for a small page.
const MAX_SAMPLES: usize = 1500;
/// Allocations listed at the peak.
const TOP: usize = 15;
/// Phase and iteration markers drawn; beyond this only iterations are drawn.
const MAX_MARKS: usize = 80;

/// The memory of one device at one point of the trace.
#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    /// Record index.
    pub at: u64,
    /// Allocated bytes.
    pub allocated: u64,
    /// Reserved bytes.
    pub reserved: u64,
    /// Allocated block bytes by category (`Category::ALL` order; the last holds
    /// uncategorized blocks with `other`).
    pub by_category: [u64; 7],
}

/// A phase or iteration marker of the trace.
#[derive(Debug, Clone, Serialize)]
pub struct Mark {
    /// Record index.
    pub at: u64,
    /// The marker's text (`iter:1`, `phase:backward`).
    pub text: String,
}

impl Mark {
    /// Whether it starts an iteration (`iter:N`, by the one marker grammar, `trace::marker`).
    pub fn is_iter(&self) -> bool {
        matches!(marker::parse(&self.text), MarkerKind::Iter(_))
    }
}

/// One allocation alive at the peak.
#[derive(Debug, Clone, Serialize)]
pub struct LiveAlloc {
    /// Requested bytes.
    pub size: u64,
    /// The allocator's block bytes.
    pub block: u64,
    /// Category name.
    pub category: String,
    /// Stream.
    pub stream: i64,
    /// Source lines, innermost first (`file:line in function`), when the trace has stacks:
    /// what PyTorch's memory viewer shows ([`site::viewer_keeps`]).
    pub frames: Vec<String>,
    /// The few of them that say where in the program it was made ([`site::site`]).
    pub site: Vec<String>,
}

/// Everything a report shows for one device.
#[derive(Debug, Clone)]
pub struct Report {
    /// The device shown: the one whose reserved peak is the trace's, which a verdict rests on.
    pub device: u32,
    /// Devices in the trace.
    pub devices: usize,
    /// Records in the trace.
    pub records: u64,
    /// Memory over the trace, at most [`MAX_SAMPLES`] points (each bucket's highest allocated).
    pub samples: Vec<Sample>,
    /// Markers.
    pub marks: Vec<Mark>,
    /// Peak allocated bytes.
    pub peak_allocated: u64,
    /// Peak reserved bytes.
    pub peak_reserved: u64,
    /// Record index of the allocated peak (its first occurrence).
    pub peak_at: u64,
    /// Reserved bytes at the allocated peak.
    pub reserved_at_peak: u64,
    /// Block bytes by category at the peak, largest first.
    pub categories_at_peak: Vec<(String, u64)>,
    /// Whether the trace labels allocations with categories.
    pub has_categories: bool,
    /// The largest allocations alive at the peak.
    pub top: Vec<LiveAlloc>,
    /// Allocations alive at the peak.
    pub live_count: usize,
    /// Segments at the peak.
    pub segments: Vec<SegmentView>,
    /// Model address of each live block at the peak, with its category name.
    pub block_categories: HashMap<u64, String>,
}

pub(crate) fn category_name(i: usize) -> &'static str {
    Category::ALL.get(i).map_or("other", |c| c.as_str())
}

/// One device's curve from the first pass.
#[derive(Default)]
struct Curve {
    samples: Vec<Sample>,
    peak_allocated: u64,
    peak_reserved: u64,
    peak_at: u64,
    last: Option<(u64, u64)>,
    allocs: usize,
}

impl Curve {
    fn observe(&mut self, at: u64, (reserved, allocated): (u64, u64), by_category: impl FnOnce() -> [u64; 7]) {
        self.peak_reserved = self.peak_reserved.max(reserved);
        if allocated > self.peak_allocated {
            self.peak_allocated = allocated;
            self.peak_at = at;
        }
        if self.last != Some((reserved, allocated)) {
            self.last = Some((reserved, allocated));
            self.samples.push(Sample { at, allocated, reserved, by_category: by_category() });
        }
    }
}

/// The device the page shows: the one whose reserved peak is the trace's (the one a verdict's
/// need rests on), the busier one on a tie, the lower ordinal after that.
fn deciding_device(curves: &HashMap<u32, Curve>) -> u32 {
    curves.iter().max_by_key(|&(d, c)| (c.peak_reserved, c.allocs, std::cmp::Reverse(*d))).map_or(0, |(d, _)| *d)
}

fn is_memory_event(e: &Event) -> bool {
    matches!(e, Event::Alloc(_) | Event::Free(_) | Event::Control(_) | Event::SegmentState(_))
}

/// Each bucket of the trace keeps its sample of highest allocated bytes; the peak is kept.
fn downsample(samples: Vec<Sample>, records: u64, peak_at: u64) -> Vec<Sample> {
    if samples.len() <= MAX_SAMPLES {
        return samples;
    }
    let width = records.div_ceil(MAX_SAMPLES as u64).max(1);
    let mut out: Vec<Sample> = Vec::with_capacity(MAX_SAMPLES + 1);
    for s in samples {
        let bucket = s.at / width;
        match out.last_mut() {
            Some(last) if last.at / width == bucket => {
                if last.at != peak_at && (s.allocated > last.allocated || s.at == peak_at) {
                    *last = s;
                }
            }
            _ => out.push(s),
        }
    }
    out
}

/// Replays the records twice: once for the curve and the peak's position, once up to the peak
/// for what is alive there and the segment map.
pub fn collect(header: &Header, records: &[Record], opts: &ReplayOptions) -> Result<Report, ReplaySetupError> {
    let mut rp = Replayer::new(header, opts.clone())?;
    let mut curves: HashMap<u32, Curve> = HashMap::new();
    let mut marks = Vec::new();
    for (i, r) in records.iter().enumerate() {
        rp.observe(r);
        let at = i as u64;
        if let Event::Marker(m) = &r.event {
            if !matches!(marker::parse(&m.text), MarkerKind::User(_)) {
                marks.push(Mark { at, text: m.text.clone() });
            }
            continue;
        }
        if !is_memory_event(&r.event) {
            continue;
        }
        let device = r.device.unwrap_or(0);
        let curve = curves.entry(device).or_default();
        curve.allocs += usize::from(matches!(r.event, Event::Alloc(_)));
        curve.observe(at, rp.current(device), || rp.live_by_category(device));
    }
    let has_categories = rp.has_categories();
    if marks.len() > MAX_MARKS {
        marks.retain(Mark::is_iter);
        marks.truncate(MAX_MARKS);
    }
    let total = records.len() as u64;
    let devices = curves.values().filter(|c| c.allocs > 0).count().max(1);
    let device = deciding_device(&curves);
    let Curve { samples, peak_allocated, peak_reserved, peak_at, .. } = curves.remove(&device).unwrap_or_default();
    let samples = downsample(samples, total, peak_at);

    // Second pass, to the peak: the live allocations with their stacks, and the segments.
    let mut rp = Replayer::new(header, opts.clone())?;
    // A stack id is resolved where an allocation uses it: a later record redefining the id must
    // not re-credit earlier allocations to its frames (`defs` holds every definition; `stacks`
    // the one each id names now).
    let mut defs: Vec<(Vec<String>, Vec<String>)> = Vec::new();
    let mut stacks: HashMap<u64, usize> = HashMap::new();
    let mut live: HashMap<u64, (u64, i64, Option<usize>)> = HashMap::new();
    for r in records.iter().take(peak_at as usize + 1) {
        rp.observe(r);
        match &r.event {
            Event::Stack(s) => {
                let frames = s.frames.iter().filter(|f| site::viewer_keeps(f)).map(site::format).collect();
                stacks.insert(u64::from(s.id), defs.len());
                defs.push((frames, site::site(&s.frames)));
            }
            Event::Alloc(a)
                if r.device.unwrap_or(0) == device
                    && a.mem == MemoryKind::Device
                    && (a.origin == Origin::Request || header.caching_disabled) =>
            {
                live.insert(a.addr, (a.size, a.stream, a.stack.and_then(|id| stacks.get(&u64::from(id)).copied())));
            }
            _ => {}
        }
    }
    let reserved_at_peak = rp.current(device).0;
    let by_cat = rp.live_by_category(device);
    let mut categories_at_peak: Vec<(String, u64)> =
        (0..7).filter(|&i| by_cat[i] > 0).map(|i| (category_name(i).to_string(), by_cat[i])).collect();
    categories_at_peak.sort_by_key(|c| std::cmp::Reverse(c.1));
    let blocks = rp.live_blocks(device);
    let mut block_categories = HashMap::new();
    let mut top: Vec<LiveAlloc> = blocks
        .iter()
        .map(|&(trace_addr, model_addr, block, category)| {
            let name = category.map_or("other", |c| c.as_str()).to_string();
            block_categories.insert(model_addr, name.clone());
            let (size, stream, stack) = live.get(&trace_addr).copied().unwrap_or((block, 0, None));
            let (frames, site) = stack.and_then(|s| defs.get(s).cloned()).unwrap_or_default();
            LiveAlloc { size, block, category: name, stream, frames, site }
        })
        .collect();
    top.sort_by(|a, b| b.block.cmp(&a.block).then(b.size.cmp(&a.size)));
    let live_count = top.len();
    top.truncate(TOP);
    Ok(Report {
        device,
        devices,
        records: total,
        samples,
        marks,
        peak_allocated,
        peak_reserved,
        peak_at,
        reserved_at_peak,
        categories_at_peak,
        has_categories,
        top,
        live_count,
        segments: rp.segments(device),
        block_categories,
    })
}
