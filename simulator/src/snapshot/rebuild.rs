//! Rebuilding the allocator state at the first trace entry (allocator reference §15).
//!
//! Most snapshots start mid-run. Their final `segments` plus the trace determine the starting
//! state except for one thing: a block allocated before recording and freed during it is known
//! only by its requested size. Its real size may carry an unsplit tail, so the guess follows the
//! split thresholds, and every guess that could be wrong is reported as [`Unrecoverable`].

use std::collections::BTreeMap;

use serde::Serialize;
use trace::{BlockState, SegmentPool};

use super::model::{Action, Segment, TraceEntry};
use crate::alloc::rounding::{self, K_SMALL_BUFFER};
use crate::alloc::AllocatorConfig;

/// One block of the starting state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StartBlock {
    /// Address.
    pub addr: u64,
    /// Size (rounded, tail included).
    pub size: u64,
    /// Requested size (0 for free blocks).
    pub requested_size: u64,
    /// State at the first trace entry.
    #[serde(serialize_with = "ser_state")]
    pub state: BlockState,
}

fn ser_state<S: serde::Serializer>(s: &BlockState, ser: S) -> Result<S::Ok, S::Error> {
    ser.serialize_str(match s {
        BlockState::ActiveAllocated => "active_allocated",
        BlockState::ActivePendingFree => "active_pending_free",
        BlockState::Inactive => "inactive",
    })
}

/// One segment of the starting state; blocks tile it exactly.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StartSegment {
    /// Device.
    pub device: u32,
    /// Base address.
    pub addr: u64,
    /// Size.
    pub size: u64,
    /// Stream.
    pub stream: i64,
    /// Whether the small pool owns it.
    pub is_small_pool: bool,
    /// Whether it is an expandable segment's mapped range.
    pub expandable: bool,
    /// Blocks in address order, free gaps included.
    pub blocks: Vec<StartBlock>,
}

/// Something the backward walk could not determine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Unrecoverable {
    /// Device.
    pub device: u32,
    /// Address concerned, when there is one.
    pub addr: Option<u64>,
    /// Why, in words.
    pub reason: String,
    /// Not a start state the walk could not see but a snapshot at odds with itself (an
    /// allocation neither in the final segments nor freed later): no start state explains it.
    pub inconsistent: bool,
    /// Only the size of a block allocated before the trace and freed during it is uncertain (a
    /// hidden tail the allocator may have split off): the rest of the start state stands.
    #[serde(skip)]
    pub size_only: bool,
}

/// What kind of doubt an [`Unrecoverable`] item is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Doubt {
    /// A start state the walk could not see.
    Unseen,
    /// A snapshot at odds with itself.
    Inconsistent,
    /// Only a block's size.
    SizeOnly,
}

impl std::fmt::Display for Unrecoverable {
    /// `device D, address 0x...: reason`, addresses in hex as everywhere else.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.addr {
            Some(a) => write!(f, "device {}, address {a:#x}: {}", self.device, self.reason),
            None => write!(f, "device {}: {}", self.device, self.reason),
        }
    }
}

/// The rebuilt starting state of every device.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct StartState {
    /// Segments at the first trace entry, by device then address.
    pub segments: Vec<StartSegment>,
    /// What could not be recovered.
    pub unrecoverable: Vec<Unrecoverable>,
}

impl StartState {
    /// Segments of one device.
    pub fn device_segments(&self, device: u32) -> impl Iterator<Item = &StartSegment> {
        self.segments.iter().filter(move |s| s.device == device)
    }

    /// Reserved bytes of one device at the start.
    pub fn reserved(&self, device: u32) -> u64 {
        self.device_segments(device).map(|s| s.size).sum()
    }
}

#[derive(Debug, Clone)]
struct SegInfo {
    size: u64,
    stream: i64,
    expandable: bool,
    small: bool,
}

#[derive(Debug, Clone)]
struct Live {
    /// Known when the block survives to the end; inferred otherwise.
    size: Option<u64>,
    requested: u64,
    state: BlockState,
}

/// Rebuilds the starting state of every device from the final `segments` and the per-device
/// traces, under the allocator configuration `cfg` (its rounding, `round_size` of §2, and its
/// split rule, which decide the sizes of blocks allocated before the trace).
pub fn rebuild(segments: &[Segment], device_traces: &[Vec<TraceEntry>], cfg: &AllocatorConfig) -> StartState {
    let mut out = StartState::default();
    let devices = segments.iter().map(|s| s.device as usize + 1).max().unwrap_or(0).max(device_traces.len());
    for d in 0..devices {
        let finals: Vec<&Segment> = segments.iter().filter(|s| s.device as usize == d).collect();
        let entries = device_traces.get(d).map(Vec::as_slice).unwrap_or(&[]);
        rebuild_device(d as u32, &finals, entries, cfg, &mut out);
    }
    out
}

fn rebuild_device(
    device: u32,
    finals: &[&Segment],
    entries: &[TraceEntry],
    cfg: &AllocatorConfig,
    out: &mut StartState,
) {
    let mut problem = |addr: Option<u64>, reason: String, doubt: Doubt| {
        let (inconsistent, size_only) = (doubt == Doubt::Inconsistent, doubt == Doubt::SizeOnly);
        out.unrecoverable.push(Unrecoverable { device, addr, reason, inconsistent, size_only });
    };
    let mut segs: BTreeMap<u64, SegInfo> = BTreeMap::new();
    let mut live: BTreeMap<u64, Live> = BTreeMap::new();
    for s in finals {
        segs.insert(
            s.address,
            SegInfo {
                size: s.total_size,
                stream: s.stream,
                expandable: s.is_expandable,
                small: s.pool == SegmentPool::Small,
            },
        );
        for b in &s.blocks {
            if b.state != BlockState::Inactive {
                live.insert(b.address, Live { size: Some(b.size), requested: b.requested_size, state: b.state });
            }
        }
    }

    for (i, e) in entries.iter().enumerate().rev() {
        match e.action {
            Action::Alloc => {
                if live.remove(&e.addr).is_none() {
                    problem(
                        Some(e.addr),
                        format!("entry {i}: alloc of a block that is neither in the final segments nor freed later"),
                        Doubt::Inconsistent,
                    );
                }
            }
            Action::FreeCompleted => {
                let prev =
                    live.insert(e.addr, Live { size: None, requested: e.size, state: BlockState::ActivePendingFree });
                if prev.is_some() {
                    problem(
                        Some(e.addr),
                        format!("entry {i}: free_completed of a block still live later"),
                        Doubt::Unseen,
                    );
                }
            }
            Action::FreeRequested => {
                // Seen after its free_completed when walking backwards: the block was fully
                // allocated before this point.
                if let Some(b) = live.get_mut(&e.addr) {
                    b.state = BlockState::ActiveAllocated;
                }
            }
            Action::SegmentAlloc => {
                if segs.remove(&e.addr).is_none() {
                    problem(
                        Some(e.addr),
                        format!("entry {i}: segment_alloc of a segment unknown later"),
                        Doubt::Unseen,
                    );
                }
            }
            Action::SegmentFree => {
                segs.insert(
                    e.addr,
                    SegInfo { size: e.size, stream: e.stream, expandable: false, small: e.size == K_SMALL_BUFFER },
                );
            }
            Action::SegmentMap => unmap_range(&mut segs, e.addr, e.size),
            Action::SegmentUnmap => map_range(&mut segs, e.addr, e.size, e.stream),
            Action::Oom | Action::Snapshot | Action::Annotate | Action::Unknown => {}
        }
    }

    if segs.values().any(|s| s.expandable) {
        problem(
            None,
            "expandable segments existed before the trace: their page layout and virtual ranges \
             cannot be rebuilt (only traces starting empty replay exactly)"
                .to_string(),
            Doubt::Unseen,
        );
    }

    // Blocks per segment, then sizes of the blocks whose size the trace does not give.
    let mut by_seg: BTreeMap<u64, Vec<(u64, Live)>> = BTreeMap::new();
    for (addr, b) in live {
        match segs.range(..=addr).next_back() {
            Some((base, s)) if addr < base.saturating_add(s.size) => by_seg.entry(*base).or_default().push((addr, b)),
            _ => problem(
                Some(addr),
                "block live at the start lies in no segment known at the start; dropped".to_string(),
                Doubt::Unseen,
            ),
        }
    }

    for (base, s) in &segs {
        let end = base.saturating_add(s.size);
        let small = s.small;
        let blocks = by_seg.remove(base).unwrap_or_default();
        let mut out_blocks = Vec::new();
        let mut cursor = *base;
        for (k, (addr, b)) in blocks.iter().enumerate() {
            let next = blocks.get(k + 1).map(|(a, _)| *a).unwrap_or(end);
            if *addr > cursor {
                out_blocks.push(StartBlock {
                    addr: cursor,
                    size: addr - cursor,
                    requested_size: 0,
                    state: BlockState::Inactive,
                });
            }
            let size = match b.size {
                Some(sz) => sz,
                None => infer_size(*addr, b.requested, next, small, s.expandable, cfg, &mut |a, r| {
                    problem(a, r, Doubt::SizeOnly)
                }),
            };
            let size = if addr.saturating_add(size) > next {
                problem(
                    Some(*addr),
                    format!("block of {size} B overlaps the next block or the segment end at 0x{next:x}; truncated"),
                    Doubt::Unseen,
                );
                next - addr
            } else {
                size
            };
            out_blocks.push(StartBlock { addr: *addr, size, requested_size: b.requested, state: b.state });
            cursor = addr.saturating_add(size);
        }
        if cursor < end {
            out_blocks.push(StartBlock {
                addr: cursor,
                size: end - cursor,
                requested_size: 0,
                state: BlockState::Inactive,
            });
        }
        out.segments.push(StartSegment {
            device,
            addr: *base,
            size: s.size,
            stream: s.stream,
            is_small_pool: small,
            expandable: s.expandable,
            blocks: out_blocks,
        });
    }
}

/// Size of a block allocated before the trace and freed during it (§15 step 3).
fn infer_size(
    addr: u64,
    requested: u64,
    next: u64,
    small: bool,
    expandable: bool,
    cfg: &AllocatorConfig,
    problem: &mut dyn FnMut(Option<u64>, String),
) -> u64 {
    let rounded = rounding::round_size(requested, &cfg.roundup_power2_divisions);
    if addr.saturating_add(rounded) > next {
        return rounded;
    }
    let gap = next - addr - rounded;
    if gap == 0 {
        return rounded;
    }
    // A remainder the allocator would not have split off belongs to the block. An expandable
    // segment splits as the small pool does, whatever the configuration says now.
    let small_rules = small || expandable;
    if !cfg.should_split(small_rules, rounded, gap) {
        return rounded + gap;
    }
    let tail =
        if cfg.splits_any_remainder(small_rules) { "under 512 B".to_string() } else { "up to 1 MiB".to_string() };
    problem(
        Some(addr),
        format!(
            "block at 0x{addr:x} allocated before the trace and freed during it: size ambiguous \
             (taken as {rounded} B; a hidden tail {tail} may precede the {gap} B free gap)"
        ),
    );
    rounded
}

/// Backwards over a `segment_map`: the range was not mapped before it.
fn unmap_range(segs: &mut BTreeMap<u64, SegInfo>, addr: u64, size: u64) {
    let end = addr.saturating_add(size);
    let Some((&base, s)) = segs.range(..=addr).next_back() else { return };
    let seg_end = base.saturating_add(s.size);
    if addr >= seg_end {
        return;
    }
    let s = s.clone();
    segs.remove(&base);
    if addr > base {
        segs.insert(base, SegInfo { size: addr - base, ..s.clone() });
    }
    if seg_end > end {
        segs.insert(end, SegInfo { size: seg_end - end, ..s });
    }
}

/// Backwards over a `segment_unmap`: the range was mapped before it; merge with touching
/// expandable ranges of the same stream, as the snapshot reports one segment per mapped range.
fn map_range(segs: &mut BTreeMap<u64, SegInfo>, addr: u64, size: u64, stream: i64) {
    let mut start = addr;
    let mut end = addr.saturating_add(size);
    // The pool of an unmapped range is not recorded; a neighbouring range of the same stream
    // tells it, otherwise it is taken for large (expandable start states are flagged anyway).
    let mut small = false;
    if let Some((&b, s)) = segs.range(..addr).next_back() {
        if s.expandable && s.stream == stream && b.saturating_add(s.size) == addr {
            start = b;
            small = s.small;
            segs.remove(&b);
        }
    }
    if let Some(s) = segs.get(&end) {
        if s.expandable && s.stream == stream {
            let sz = s.size;
            small |= s.small;
            segs.remove(&end);
            end = end.saturating_add(sz);
        }
    }
    segs.insert(start, SegInfo { size: end - start, stream, expandable: true, small });
}
