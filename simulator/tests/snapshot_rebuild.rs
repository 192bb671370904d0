//! Start-state rebuild on hand-made fixtures whose answers follow from the allocator reference
//! §15 by hand (see tests/fixtures/snapshots/README.md), and validation of the same fixture.

use simulator::snapshot::{self, StartState, ValidateOptions, Verdict};
use trace::BlockState::{self, ActiveAllocated as Alloc, ActivePendingFree as Pending, Inactive as Free};

use crate::snapshot_support::{fixture, plain};

const MIB: u64 = 1 << 20;
const L: u64 = 0x7F00_0000_0000;
const S: u64 = 0x7F00_0200_0000;
const F: u64 = 0x7F00_0600_0000;

/// (segment base, size, small pool, [(offset, size, requested, state)]).
type Expect = (u64, u64, bool, Vec<(u64, u64, u64, BlockState)>);

fn check(start: &StartState, expect: &[Expect]) {
    let got: Vec<Expect> = start
        .segments
        .iter()
        .map(|s| {
            let blocks = s.blocks.iter().map(|b| (b.addr - s.addr, b.size, b.requested_size, b.state)).collect();
            (s.addr, s.size, s.is_small_pool, blocks)
        })
        .collect();
    assert_eq!(got, expect);
}

#[test]
fn rebuild_native_fixture() {
    let snap = snapshot::read_snapshot(&fixture("rebuild_native.pickle")).unwrap_or_else(|e| panic!("{e}"));
    let start = snapshot::rebuild(&snap.segments, &snap.device_traces, &plain());
    let b = 3_000_320 + 512 * 1024; // round_size(3,000,000) plus the absorbed 512 KiB gap
    let c = 2 * MIB + b;
    let d = c + 4 * MIB;
    let d_size = 5 * MIB;
    check(
        &start,
        &[
            (
                L,
                20 * MIB,
                false,
                vec![
                    (0, 2 * MIB, 2 * MIB, Alloc),
                    (2 * MIB, b, 3_000_000, Alloc),
                    (c, 4 * MIB, 4 * MIB, Alloc),
                    (d, d_size, 5 * MIB, Pending),
                    (d + d_size, 20 * MIB - d - d_size, 0, Free),
                ],
            ),
            (
                S,
                2 * MIB,
                true,
                vec![
                    (0, 4096, 4000, Alloc),
                    (4096, 1280, 1000, Alloc), // round_size(1000) = 1024 plus a 256 B gap
                    (4096 + 1280, 512, 512, Alloc),
                    (4096 + 1792, 2 * MIB - 4096 - 1792, 0, Free),
                ],
            ),
            (F, 2 * MIB, true, vec![(0, 2 * MIB, 0, Free)]),
        ],
    );
    assert_eq!(start.unrecoverable.len(), 1, "{:?}", start.unrecoverable);
    let u = &start.unrecoverable[0];
    assert_eq!(u.addr, Some(L + d));
    assert!(u.reason.contains("size ambiguous") && u.reason.contains("up to 1 MiB"), "{}", u.reason);
}

#[test]
fn rebuild_with_an_empty_trace_is_the_final_state() {
    let mut snap = snapshot::read_snapshot(&fixture("rebuild_native.pickle")).unwrap_or_else(|e| panic!("{e}"));
    snap.device_traces = vec![Vec::new()];
    let start = snapshot::rebuild(&snap.segments, &snap.device_traces, &plain());
    assert!(start.unrecoverable.is_empty());
    assert_eq!(start.segments.len(), snap.segments.len());
    for (s, f) in start.segments.iter().zip(&snap.segments) {
        let got: Vec<_> = s.blocks.iter().map(|b| (b.addr, b.size, b.state)).collect();
        // Free blocks carry no requested size in the start state; the rest is identical.
        let want: Vec<_> = f.blocks.iter().map(|b| (b.address, b.size, b.state)).collect();
        assert_eq!(got, want);
    }
}

#[test]
fn the_fixture_replays_exactly_from_its_rebuilt_start() {
    let snap = snapshot::read_snapshot(&fixture("rebuild_native.pickle")).unwrap_or_else(|e| panic!("{e}"));
    let r = snapshot::validate(&snap, &ValidateOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((r.counts.allocs, r.counts.alloc_addr_matches), (1, 1));
    // segment_free of F (replayed as empty_cache) and segment_alloc of N.
    assert_eq!(
        (r.counts.segment_events, r.counts.segment_event_matches, r.counts.extra_predicted_segment_events),
        (2, 2, 0)
    );
    assert_eq!(r.empty_cache_bursts, 1);
    assert_eq!(r.verdict, Verdict::Exact);
    // 24 MiB at the start; F (2 MiB) is released before N (12 MiB) is created.
    assert_eq!(r.recorded_peak_reserved_bytes, (20 + 2 + 12) * MIB);
    assert_eq!(r.predicted_peak_reserved_bytes, r.recorded_peak_reserved_bytes);
    assert!(r.passed());
}

/// A snapshot with one large native segment of 64 MiB: a block allocated before the trace (25 MiB
/// requested) and freed in it, then a free gap of `gap` bytes, then a live block filling the rest.
fn one_freed_block(gap: u64) -> simulator::snapshot::Snapshot {
    use serde_json::json;
    let base = L;
    let block = |addr: u64, size: u64, requested: u64, state: &str| json!({"address": addr, "size": size, "requested_size": requested, "state": state});
    let live = 64 * MIB - 25 * MIB - gap;
    let snap = json!({
        "segments": [{
            "device": 0, "address": base, "total_size": 64 * MIB, "allocated_size": live,
            "active_size": live, "requested_size": live, "stream": 0, "segment_type": "large",
            "blocks": [block(base, 25 * MIB + gap, 0, "inactive"), block(base + 25 * MIB + gap, live, live, "active_allocated")],
        }],
        "device_traces": [[
            {"action": "free_requested", "addr": base, "size": 25 * MIB, "stream": 0},
            {"action": "free_completed", "addr": base, "size": 25 * MIB, "stream": 0},
        ]],
    });
    snapshot::parse_snapshot(&simulator::snapshot::pickle::encode(&snap), "hand-made").unwrap()
}

/// With `expandable_segments` on, the model splits off any remainder of a block, even in a native
/// segment (PyTorch's `shouldSplit` reads the configuration): the rebuild reads it so too.
#[test]
fn rebuild_follows_expandable_segments_of_the_configuration() {
    let gap = 600 * 1024;
    let snap = one_freed_block(gap);
    let sizes = |start: &StartState| start.segments[0].blocks.iter().map(|b| (b.addr - L, b.size)).collect::<Vec<_>>();
    let start = snapshot::rebuild(&snap.segments, &snap.device_traces, &plain());
    assert_eq!(sizes(&start)[0], (0, 25 * MIB + gap), "the large pool absorbs a remainder up to 1 MiB");
    let cfg = simulator::alloc::AllocatorConfig::parse("expandable_segments:True", Default::default()).unwrap();
    let start = snapshot::rebuild(&snap.segments, &snap.device_traces, &cfg);
    assert_eq!(sizes(&start)[..2], [(0, 25 * MIB), (25 * MIB, gap)]);
    assert!(start.unrecoverable.iter().any(|u| u.reason.contains("under 512 B")), "{:?}", start.unrecoverable);
}

/// A block allocated before the trace and freed in it, 25 MiB requested, with a 2 MiB free gap
/// after it: the large pool splits a remainder over 1 MiB, so without `max_split_size` the gap
/// is its own block and the size is ambiguous; with `max_split_size:21MB` a 25 MiB block is never
/// split, so the gap belongs to it. The rebuild reads the allocator's one split rule backwards.
#[test]
fn rebuild_follows_max_split_size() {
    let base = L;
    let snap = one_freed_block(2 * MIB);
    let sizes =
        |start: &StartState| start.segments[0].blocks.iter().map(|b| (b.addr - base, b.size)).collect::<Vec<_>>();

    let start = snapshot::rebuild(&snap.segments, &snap.device_traces, &plain());
    assert_eq!(sizes(&start), vec![(0, 25 * MIB), (25 * MIB, 2 * MIB), (27 * MIB, 37 * MIB)]);
    assert!(start.unrecoverable.iter().any(|u| u.reason.contains("size ambiguous")), "{:?}", start.unrecoverable);

    let cfg = simulator::alloc::AllocatorConfig::parse("max_split_size_mb:21", Default::default()).unwrap();
    let start = snapshot::rebuild(&snap.segments, &snap.device_traces, &cfg);
    assert_eq!(sizes(&start), vec![(0, 27 * MIB), (27 * MIB, 37 * MIB)]);
    assert!(start.unrecoverable.is_empty(), "{:?}", start.unrecoverable);
}
