//! Expandable segments: page mapping and rounding, lowest-address reuse, unmapping on empty_cache and OOM.

use simulator::alloc::{DeviceEvent, TorchVersion};

use crate::alloc_support::{check_consistent, run, Op::*, BASE, MIB};

const EXP: &str = "expandable_segments:True";
const V9: TorchVersion = TorchVersion::V2_9;

fn map(off: u64, size: u64) -> DeviceEvent {
    DeviceEvent::SegmentMap { addr: BASE + off * MIB, size: size * MIB }
}
fn unmap(off: u64, size: u64) -> DeviceEvent {
    DeviceEvent::SegmentUnmap { addr: BASE + off * MIB, size: size * MIB }
}

#[test]
fn grows_page_by_page_and_splits_tightly() {
    let r = run(EXP, V9, None, &[A(MIB + 1), A(30 * MIB)]);
    let first = MIB + 512;
    // 20 MiB large pages; the second request extends the same range from the free tail.
    assert_eq!(r.device_events(), vec![map(0, 20), map(20, 20)]);
    assert_eq!(r.addrs, vec![Some(BASE), Some(BASE + first)]);
    // Split whenever remaining >= 512: the block is exactly the rounded request.
    assert_eq!(r.outcomes[1].block_size, 30 * MIB);
    assert_eq!(r.stat("reserved_bytes.all.current"), 40 * MIB as i64);
    assert_eq!(r.stat("segment.all.current"), 0, "expandable mappings are not counted as segments");
    assert_eq!(r.stat("num_device_alloc"), 2);
    assert_eq!(r.stat("inactive_split.all.current"), 0);
    check_consistent(&r.alloc);
}

#[test]
fn small_pool_pages_are_2mib() {
    let r = run(EXP, V9, None, &[A(1000), A(MIB), A(MIB)]);
    assert_eq!(r.device_events(), vec![map(0, 2), map(2, 2)]);
    assert_eq!(r.addrs, vec![Some(BASE), Some(BASE + 1024), Some(BASE + 1024 + MIB)]);
    // One contiguous mapped range is reported as one segment of 4 MiB.
    let segs = r.alloc.segments();
    assert_eq!(segs.len(), 1);
    assert_eq!(segs[0].size, 4 * MIB);
    assert!(segs[0].is_small_pool && segs[0].expandable);
    check_consistent(&r.alloc);
}

#[test]
fn empty_cache_unmaps_whole_free_pages_and_reuses_lowest_address() {
    let mut r = run(EXP, V9, None, &[A(10 * MIB), A(50 * MIB), A(5 * MIB)]);
    assert_eq!(r.device_events(), vec![map(0, 20), map(20, 40), map(60, 20)]);
    r.step(F(1));
    let out = r.step(Empty).clone();
    // Free range [10, 60) MiB: only the pages [20, 60) are wholly free; [65, 80) has no whole page.
    assert_eq!(out.device_events, vec![unmap(20, 40)]);
    assert_eq!(r.stat("reserved_bytes.all.current"), 40 * MIB as i64);
    assert_eq!(r.stat("num_device_free"), 1);
    let segs = r.alloc.segments();
    assert_eq!(
        segs.iter().map(|s| (s.addr - BASE, s.size)).collect::<Vec<_>>(),
        vec![(0, 20 * MIB), (60 * MIB, 20 * MIB)]
    );
    check_consistent(&r.alloc);
    // 45 MiB: no free block fits; the lowest place with room starts at the free block before
    // the hole, so the hole is remapped and the block lands at 10 MiB.
    let out = r.step(A(45 * MIB)).clone();
    assert_eq!(out.device_events, vec![map(20, 40)]);
    assert_eq!(out.addr, Some(BASE + 10 * MIB));
    check_consistent(&r.alloc);
}

#[test]
fn empty_cache_releases_a_fully_unmapped_reservation() {
    let mut r = run(EXP, V9, None, &[A(MIB + 1), A(30 * MIB), F(0), F(1)]);
    let out = r.step(Empty).clone();
    assert_eq!(out.device_events, vec![unmap(0, 40)]);
    assert!(r.alloc.segments().is_empty());
    assert_eq!(r.stat("reserved_bytes.all.current"), 0);
    assert_eq!(r.stat("reserved_bytes.all.peak"), 40 * MIB as i64);
    // The next request starts a new reservation after the released one (synthetic addresses
    // are never reused).
    let out = r.step(A(MIB + 1)).clone();
    assert_eq!(out.device_events.len(), 1);
    check_consistent(&r.alloc);
}

#[test]
fn oom_path_unmaps_then_retries() {
    // Capacity 100 MiB → reservations of 20 MiB · ceil(112.5 / 20) = 120 MiB. Stream 1 maps
    // 60 MiB and frees it; stream 0 maps 40 MiB in its own reservation at 120 MiB.
    let mut r = run(EXP, V9, Some(100 * MIB), &[S(60 * MIB, 1), F(0), S(30 * MIB, 0)]);
    assert_eq!(r.device_events(), vec![map(0, 60), map(120, 40)]);
    // 50 MiB on stream 0 needs two more pages (140 > 100 MiB): release_cached_blocks unmaps
    // stream 1's free pages (dropping its reservation), and the retry maps them for stream 0.
    let out = r.step(S(50 * MIB, 0)).clone();
    assert!(out.retried, "{out:?}");
    assert_eq!(out.device_events, vec![unmap(0, 60), map(160, 40)]);
    assert_eq!(out.addr, Some(BASE + 150 * MIB));
    assert_eq!(r.stat("num_alloc_retries"), 1);
    let segs = r.alloc.segments();
    assert_eq!(
        segs.iter().map(|s| (s.addr - BASE, s.size, s.stream)).collect::<Vec<_>>(),
        vec![(120 * MIB, 80 * MIB, 0)]
    );
    check_consistent(&r.alloc);
}

#[test]
fn oom_when_pages_cannot_be_created() {
    let mut r = run(EXP, V9, Some(100 * MIB), &[A(90 * MIB)]);
    let out = r.step(A(20 * MIB)).clone();
    let oom = out.oom.expect("100 MiB mapped, a fifth page does not fit");
    assert_eq!(oom.reserved, 100 * MIB);
    assert_eq!(r.stat("num_ooms"), 1);
    check_consistent(&r.alloc);
}

#[test]
fn expandable_streams_get_their_own_reservations() {
    let r = run(EXP, V9, None, &[S(4 * MIB, 1), S(4 * MIB, 2)]);
    let segs = r.alloc.segments();
    assert_eq!(segs.len(), 2);
    assert_ne!(segs[0].stream, segs[1].stream);
    assert_eq!(segs[1].addr - segs[0].addr, 90 << 30, "80 GiB default total → 90 GiB reservations");
    check_consistent(&r.alloc);
}
