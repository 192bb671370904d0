//! Hand-written native-mode cases: one per rule and per config option, expectations derived from the spec.

use simulator::alloc::{
    Allocator, AllocatorConfig, DeviceEvent, ExistingBlock, ExistingSegment, ReplayError, Request, SeedError,
    TorchVersion,
};

use crate::alloc_support::{check_consistent, run, stat, Op::*, BASE, GIB, KIB, MIB};

const V9: TorchVersion = TorchVersion::V2_9;
const V5: TorchVersion = TorchVersion::V2_5;
const V4: TorchVersion = TorchVersion::V2_4;

fn seg_alloc(addr: u64, size: u64) -> DeviceEvent {
    DeviceEvent::SegmentAlloc { addr, size }
}
fn seg_free(addr: u64, size: u64) -> DeviceEvent {
    DeviceEvent::SegmentFree { addr, size }
}

#[test]
fn small_requests_share_a_2mib_segment() {
    let r = run("", V9, None, &[A(1), A(1000), A(MIB)]);
    assert_eq!(r.addrs, vec![Some(BASE), Some(BASE + 512), Some(BASE + 512 + 1024)]);
    assert_eq!(r.outcomes[1].block_size, 1024);
    // 1 MiB + 1.5 KiB does not fit the 2 MiB segment's 1 MiB - 1.5 KiB tail: exactly 1 MiB
    // is small, so it gets a second 2 MiB segment.
    assert_eq!(r.device_events(), vec![seg_alloc(BASE, 2 * MIB)]);
    assert_eq!(r.stat("segment.small_pool.current"), 1);
    assert_eq!(r.stat("allocated_bytes.small_pool.current"), (512 + 1024 + MIB) as i64);
    assert_eq!(r.stat("requested_bytes.all.current"), (1 + 1000 + MIB) as i64);
    check_consistent(&r.alloc);
}

#[test]
fn large_segment_sizes_and_the_one_mib_remainder_rule() {
    // 11 MiB → 12 MiB segment whose 1 MiB remainder is absorbed (not > 1 MiB); 1.2 MB → 20 MiB
    // segment, split; 10.5 MiB best-fits that segment's tail; a second 10.5 MiB gets a 12 MiB
    // segment and its 1.5 MiB remainder is split off.
    let r = run("", V9, None, &[A(11 * MIB), A(1_200_000), A(10 * MIB + 512 * KIB), A(10 * MIB + 512 * KIB)]);
    assert_eq!(
        r.device_events(),
        vec![seg_alloc(BASE, 12 * MIB), seg_alloc(BASE + 12 * MIB, 20 * MIB), seg_alloc(BASE + 32 * MIB, 12 * MIB)]
    );
    assert_eq!(r.addrs[2], Some(BASE + 12 * MIB + 1_200_128));
    assert_eq!(r.addrs[3], Some(BASE + 32 * MIB));
    assert_eq!(r.outcomes[0].block_size, 12 * MIB);
    assert_eq!(r.outcomes[1].block_size, 1_200_128);
    assert_eq!(r.outcomes[3].block_size, 10 * MIB + 512 * KIB);
    let tail = 20 * MIB - 1_200_128 - (10 * MIB + 512 * KIB);
    assert_eq!(r.stat("inactive_split.large_pool.current"), 2);
    assert_eq!(r.stat("inactive_split_bytes.large_pool.current"), (tail + 1536 * KIB) as i64);
    check_consistent(&r.alloc);
}

#[test]
fn best_fit_smallest_then_lowest_address() {
    // 20 MiB segment: 4 | 2 | 4 | 2 | 2 | 2 | 4 free; freeing 0, 2 and 4 leaves holes of
    // 4 MiB at 0, 4 MiB at 6, 2 MiB at 12 and the 4 MiB tail at 16.
    let mut r =
        run("", V9, None, &[A(4 * MIB), A(2 * MIB), A(4 * MIB), A(2 * MIB), A(2 * MIB), A(2 * MIB), F(0), F(2), F(4)]);
    let (hole2, hole4b) = (r.addr(4), r.addr(2));
    // 3 MiB: smallest fitting size is 4 MiB, three such holes; the lowest address wins. The
    // 1 MiB remainder is not > 1 MiB, so the block keeps all 4 MiB.
    let out = r.step(A(3 * MIB)).clone();
    assert_eq!((out.addr, out.block_size), (Some(BASE), 4 * MIB));
    // 2 MiB takes the exact 2 MiB hole, not a lower 4 MiB one.
    assert_eq!(r.step(A(2 * MIB)).addr, Some(hole2));
    // 1.5 MiB: the lowest remaining 4 MiB hole, split (2.5 MiB remainder).
    let out = r.step(A(1536 * KIB)).clone();
    assert_eq!((out.addr, out.block_size), (Some(hole4b), 1536 * KIB));
    assert!(r.device_events().len() == 1);
    check_consistent(&r.alloc);
}

#[test]
fn merging_on_free_and_inactive_split() {
    let mut r = run("", V9, None, &[A(4 * MIB), A(4 * MIB), A(4 * MIB)]);
    assert_eq!(r.stat("inactive_split.all.current"), 1);
    r.step(F(1));
    assert_eq!(r.stat("inactive_split.all.current"), 2);
    r.step(F(0)); // merges with the freed middle block
    assert_eq!(r.stat("inactive_split.all.current"), 2);
    assert_eq!(r.stat("inactive_split_bytes.all.current"), (8 * MIB + 8 * MIB) as i64);
    r.step(F(2)); // everything merges back into one unsplit block
    assert_eq!(r.stat("inactive_split.all.current"), 0);
    assert_eq!(r.alloc.largest_free_block(), 20 * MIB);
    let segs = r.alloc.segments();
    assert_eq!(segs.len(), 1);
    assert_eq!(segs[0].blocks.len(), 1);
    check_consistent(&r.alloc);
}

#[test]
fn free_requested_defers_reuse_until_completed() {
    let mut r = run("", V9, None, &[A(MIB), Fr(0)]);
    assert_eq!(r.stat("allocated_bytes.all.current"), 0);
    assert_eq!(r.stat("active_bytes.all.current"), MIB as i64);
    // Not yet reusable: a same-size request goes to the next free space.
    assert_eq!(r.step(A(MIB)).addr, Some(BASE + MIB));
    r.step(Fc(0));
    assert_eq!(r.stat("active_bytes.all.current"), MIB as i64);
    assert_eq!(r.step(A(MIB)).addr, Some(BASE));
    check_consistent(&r.alloc);
}

#[test]
fn record_stream_defers_free_to_next_malloc() {
    let mut r = run("", V9, None, &[A(MIB), Rs(0, 7), F(0)]);
    assert_eq!(r.stat("allocated_bytes.all.current"), 0);
    assert_eq!(r.stat("active_bytes.all.current"), MIB as i64);
    let out = r.step(A(MIB)).clone();
    // process_events at the start of malloc completed the free, so the block is reused.
    assert_eq!(out.completed_frees, vec![BASE]);
    assert_eq!(out.addr, Some(BASE));
    // Recording the allocation stream itself is a no-op: the free completes at once.
    r.step(Rs(1, 0));
    r.step(F(1));
    assert_eq!(r.stat("active_bytes.all.current"), 0);
    check_consistent(&r.alloc);
}

#[test]
fn pools_are_per_stream() {
    let r = run("", V9, None, &[S(MIB, 1), F(0), S(MIB, 2), S(MIB, 1)]);
    assert_eq!(r.device_events(), vec![seg_alloc(BASE, 2 * MIB), seg_alloc(BASE + 2 * MIB, 2 * MIB)]);
    assert_eq!(r.addr(1), BASE + 2 * MIB);
    assert_eq!(r.addr(2), BASE);
    check_consistent(&r.alloc);
}

#[test]
fn empty_cache_releases_only_unsplit_free_segments() {
    let mut r = run("", V9, None, &[A(12 * MIB), A(MIB), A(3 * MIB), A(3 * MIB), F(0), F(2)]);
    let out = r.step(Empty).clone();
    // The 12 MiB segment is whole and free; the 20 MiB one still holds allocation 3.
    assert_eq!(out.device_events, vec![seg_free(BASE, 12 * MIB)]);
    r.step(F(1));
    let out = r.step(Empty).clone();
    assert_eq!(out.device_events, vec![seg_free(BASE + 12 * MIB, 2 * MIB)]);
    assert_eq!(r.stat("num_device_free"), 2);
    assert_eq!(r.stat("num_sync_all_streams"), 2);
    assert_eq!(r.stat("reserved_bytes.all.current"), 20 * MIB as i64);
    assert_eq!(r.stat("reserved_bytes.all.peak"), 34 * MIB as i64);
    check_consistent(&r.alloc);
}

#[test]
fn oom_chain_release_cached_blocks_and_retry() {
    // Capacity 40 MiB: a small 2 MiB segment (in use) and a 12 MiB one (freed). 30 MiB needs
    // release_cached_blocks (segment_free of the 12 MiB one only) and a retried cudaMalloc.
    let mut r = run("", V9, Some(40 * MIB), &[A(1000), A(12 * MIB), F(1)]);
    let out = r.step(A(30 * MIB)).clone();
    assert!(out.retried);
    assert_eq!(out.device_events, vec![seg_free(BASE + 2 * MIB, 12 * MIB), seg_alloc(BASE + 14 * MIB, 30 * MIB)]);
    assert_eq!(r.stat("num_alloc_retries"), 1);
    // 32 MiB reserved; 10 MiB more cannot fit: OOM with the rounded size.
    let out = r.step(A(10 * MIB - 100)).clone();
    assert!(out.addr.is_none());
    let oom = out.oom.expect("oom");
    assert_eq!((oom.rounded_size, oom.reserved, oom.device_free), (10 * MIB, 32 * MIB, Some(8 * MIB)));
    assert_eq!(r.stat("num_ooms"), 1);
    assert_eq!(r.stat("num_alloc_retries"), 2);
    // A failed cudaMalloc never raises reserved memory.
    assert_eq!(r.stat("reserved_bytes.all.peak"), 32 * MIB as i64);
    check_consistent(&r.alloc);
}

#[test]
fn max_split_size_keeps_small_requests_out_of_big_blocks() {
    let conf = "max_split_size_mb:64";
    // A 100 MiB block freed: an 8 MiB request (< 64 MiB) must not use it.
    let r = run(conf, V9, None, &[A(100 * MIB), F(0), A(30 * MIB)]);
    assert_eq!(r.addr(1), BASE + 100 * MIB);
    // Oversize blocks are never split: a 70 MiB request takes the whole 100 MiB? No: the block
    // is >= 70 + 20 MiB, so it is refused and a 70 MiB segment is made.
    let r2 = run(conf, V9, None, &[A(100 * MIB), F(0), A(70 * MIB), A(85 * MIB)]);
    assert_eq!(r2.addr(1), BASE + 100 * MIB);
    // 85 MiB fits the 100 MiB block within the 20 MiB slack, unsplit.
    assert_eq!(r2.addr(2), BASE);
    assert_eq!(r2.outcomes[3].block_size, 100 * MIB);
    assert_eq!(r2.stat("oversize_allocations.current"), 2);
    assert_eq!(r2.stat("oversize_segments.current"), 2);
    assert_eq!(r2.stat("max_split_size"), 64 * MIB as i64);
    check_consistent(&r2.alloc);
}

#[test]
fn max_non_split_rounding_by_version() {
    // 100 MiB free block, 70 MiB request: slack 30 MiB. R = 20 MiB (2.4 always; 2.5+ default)
    // refuses; max_non_split_rounding_mb:64 (2.5+) accepts.
    let ops = [A(100 * MIB), F(0), A(70 * MIB)];
    assert_eq!(run("max_split_size_mb:64", V4, None, &ops).addr(1), BASE + 100 * MIB);
    assert_eq!(run("max_split_size_mb:64", V5, None, &ops).addr(1), BASE + 100 * MIB);
    let r = run("max_split_size_mb:64,max_non_split_rounding_mb:64", V5, None, &ops);
    assert_eq!(r.addr(1), BASE);
    assert_eq!(r.outcomes[2].block_size, 100 * MIB);
}

#[test]
fn release_available_cached_blocks_before_full_release() {
    // Capacity 260 MiB, max_split_size 64 MiB. Two oversize free blocks (100 and 80 MiB) and a
    // split 20 MiB segment in use. A 120 MiB request cannot be cudaMalloc'd (200 + 120 > 260),
    // no single free block >= 120 MiB exists, so the oversize blocks are released largest first
    // until >= 120 MiB is freed — both go — then cudaMalloc succeeds without a full retry.
    let mut r = run("max_split_size_mb:64", V9, Some(260 * MIB), &[A(100 * MIB), A(80 * MIB), A(MIB + 1), F(0), F(1)]);
    let out = r.step(A(120 * MIB)).clone();
    assert!(!out.retried);
    assert_eq!(
        out.device_events,
        vec![seg_free(BASE, 100 * MIB), seg_free(BASE + 100 * MIB, 80 * MIB), seg_alloc(BASE + 200 * MIB, 120 * MIB)]
    );
    // Without max_split_size the same situation needs release_cached_blocks and a retry.
    let mut r = run("", V9, Some(260 * MIB), &[A(100 * MIB), A(80 * MIB), A(MIB + 1), F(0), F(1)]);
    assert!(r.step(A(120 * MIB)).retried);
    check_consistent(&r.alloc);
}

#[test]
fn garbage_collection_needs_a_fraction() {
    // Total 1 GiB, fraction 0.5 → 512 MiB allowed; threshold 0.5 → GC above 256 MiB.
    let ops = [A(200 * MIB), A(100 * MIB), F(0), F(1), A(50 * MIB), F(2), A(300 * MIB)];
    let mut with = run("garbage_collection_threshold:0.5", V9, Some(GIB), &[Frac(0.5)]);
    for op in ops {
        with.step(op);
    }
    // On the 300 MiB miss, reserved is 300 MiB > 256 MiB (target: reclaim 44 MiB). Ages in
    // get_free_block calls: the 200 MiB block 2, the 100 MiB block 1 (reused by the 50 MiB
    // request); the average is 1.5, so only the 200 MiB block goes. 100 + 300 <= 512 MiB.
    let ev = with.outcomes.last().unwrap().device_events.clone();
    assert_eq!(ev, vec![seg_free(BASE, 200 * MIB), seg_alloc(BASE + 300 * MIB, 300 * MIB)]);
    assert!(!with.outcomes.last().unwrap().retried);
    // Without a fraction the threshold does nothing: no segment is freed.
    let without = run("garbage_collection_threshold:0.5", V9, Some(GIB), &ops);
    assert_eq!(without.outcomes.last().unwrap().device_events, vec![seg_alloc(BASE + 300 * MIB, 300 * MIB)]);
    check_consistent(&with.alloc);
}

#[test]
fn memory_fraction_caps_reserved() {
    let mut r = run("", V9, Some(GIB), &[Frac(0.25), A(200 * MIB)]);
    let out = r.step(A(100 * MIB)).clone();
    assert!(out.oom.is_some(), "200 + 100 MiB exceeds 256 MiB");
    assert_eq!(r.stat("num_ooms"), 1);
    // The 2.9+ config key does the same from the start.
    let mut r2 = run("per_process_memory_fraction:0.25", V9, Some(GIB), &[A(200 * MIB)]);
    assert!(r2.step(A(100 * MIB)).oom.is_some());
    assert!(r2.alloc.apply(&Request::SetMemoryFraction(1.5)).is_err());
}

#[test]
fn roundup_power2_divisions_change_block_sizes() {
    let r = run("roundup_power2_divisions:4", V9, None, &[A(1_200_000), A(5_000_000)]);
    assert_eq!(r.outcomes[0].block_size, 1_310_720);
    assert_eq!(r.outcomes[1].block_size, 5_242_880);
    let r = run("roundup_power2_divisions:[1:4,4:8]", V9, None, &[A(1_200_000), A(5_000_000)]);
    assert_eq!(r.outcomes[1].block_size, 5_242_880);
}

#[test]
fn options_without_placement_effect() {
    let ops = [A(1000), A(3 * MIB), A(30 * MIB), F(1), A(MIB), Empty, A(500 * KIB)];
    let base = run("", V9, None, &ops);
    for conf in [
        "release_lock_on_cudamalloc:True",
        "pinned_use_cuda_host_register:True,pinned_num_register_threads:4",
        "pinned_use_background_threads:True",
        "pinned_reserve_segment_size_mb:16",
        "graph_capture_record_stream_reuse:True",
        "backend:native",
        "expandable_segments:False",
    ] {
        let r = run(conf, V9, None, &ops);
        assert_eq!(r.addrs, base.addrs, "{conf}");
        assert_eq!(r.device_events(), base.device_events(), "{conf}");
        assert_eq!(r.alloc.stats(), base.alloc.stats(), "{conf}");
    }
}

#[test]
fn reset_peak_stats() {
    let r = run("", V9, None, &[A(30 * MIB), F(0), Empty, Reset, A(MIB)]);
    assert_eq!(r.stat("reserved_bytes.all.peak"), 2 * MIB as i64);
    assert_eq!(r.stat("allocated_bytes.all.peak"), MIB as i64);
    assert_eq!(r.stat("allocated_bytes.all.allocated"), (31 * MIB) as i64);
}

#[test]
fn recorded_addresses_place_new_segments() {
    let r = run("", V9, None, &[At(MIB, 0x7f00_0000_0000), At(MIB, 0x7f00_0000_0000 + MIB), At(MIB, 0x7f00_0000_0000)]);
    // The second request fits the first segment: its recorded address only matters for new segments.
    assert_eq!(r.addrs, vec![Some(0x7f00_0000_0000), Some(0x7f00_0000_0000 + MIB), Some(BASE)]);
    assert_eq!(r.device_events(), vec![seg_alloc(0x7f00_0000_0000, 2 * MIB), seg_alloc(BASE, 2 * MIB)]);
}

#[test]
fn bad_requests_are_errors_and_leave_state_alone() {
    let mut a = Allocator::new(AllocatorConfig::default(), V9, None);
    let check = |a: &mut Allocator, req: Request, expect: ReplayError| {
        let before = a.stats().clone();
        assert_eq!(a.apply(&req), Err(expect));
        assert_eq!(a.stats(), &before);
    };
    check(&mut a, Request::Free { addr: 42 }, ReplayError::UnknownAddress { addr: 42 });
    // Said as the operation it was, not as a free.
    check(&mut a, Request::RecordStream { addr: 42, stream: 5 }, ReplayError::UnknownStreamUse { addr: 42 });
    let p = a.apply(&Request::Alloc { size: 100, stream: 0, recorded_addr: None }).unwrap().addr.unwrap();
    check(&mut a, Request::FreeCompleted { addr: p }, ReplayError::NotRequested { addr: p });
    a.apply(&Request::FreeRequested { addr: p }).unwrap();
    check(&mut a, Request::Free { addr: p }, ReplayError::DoubleFree { addr: p });
    check(&mut a, Request::RecordStream { addr: p, stream: 3 }, ReplayError::NotAllocated { addr: p });
    a.apply(&Request::FreeCompleted { addr: p }).unwrap();
    check(&mut a, Request::FreeCompleted { addr: p }, ReplayError::UnknownAddress { addr: p });
    // Zero bytes and absurd sizes never panic.
    assert_eq!(a.apply(&Request::Alloc { size: 0, stream: 0, recorded_addr: None }).unwrap().addr, None);
    let huge = a.apply(&Request::Alloc { size: u64::MAX, stream: 0, recorded_addr: None }).unwrap();
    assert!(huge.oom.is_some());
    check_consistent(&a);
}

#[test]
fn existing_segments_seed_the_state() {
    let mut a = Allocator::new(AllocatorConfig::default(), V9, None);
    let base = 0x7f00_0000_0000;
    let seg = ExistingSegment {
        addr: base,
        size: 20 * MIB,
        stream: 0,
        is_small_pool: false,
        expandable: false,
        blocks: vec![
            ExistingBlock { addr: base, size: 4 * MIB, requested_size: 4 * MIB - 100, allocated: true },
            ExistingBlock { addr: base + 4 * MIB, size: 6 * MIB, requested_size: 0, allocated: false },
            ExistingBlock { addr: base + 10 * MIB, size: 10 * MIB, requested_size: 10 * MIB, allocated: true },
        ],
    };
    a.add_existing_segment(&seg).unwrap();
    assert_eq!(a.add_existing_segment(&seg), Err(SeedError::Overlap { addr: base, size: 20 * MIB }));
    let mut bad = seg.clone();
    bad.addr = BASE;
    assert!(matches!(a.add_existing_segment(&bad), Err(SeedError::NotTiled { .. })));
    check_consistent(&a);
    assert_eq!(stat(a.stats(), "allocated_bytes.all.current"), 14 * MIB as i64);
    // A 5 MiB request best-fits into the seeded 6 MiB hole.
    let out = a.apply(&Request::Alloc { size: 5 * MIB, stream: 0, recorded_addr: None }).unwrap();
    assert_eq!(out.addr, Some(base + 4 * MIB));
    a.apply(&Request::Free { addr: base }).unwrap();
    check_consistent(&a);
}

#[test]
fn memory_stats_key_names() {
    let r = run("", V9, None, &[A(MIB)]);
    let j = r.alloc.stats().to_json();
    let m = j.as_object().unwrap();
    for key in [
        "allocated_bytes.all.peak",
        "reserved_bytes.large_pool.freed",
        "active_bytes.small_pool.allocated",
        "requested_bytes.all.current",
        "inactive_split_bytes.all.current",
        "inactive_split.small_pool.peak",
        "allocation.all.current",
        "segment.all.current",
        "active.all.current",
        "oversize_allocations.current",
        "oversize_segments.peak",
        "num_alloc_retries",
        "num_ooms",
        "num_sync_all_streams",
        "num_device_alloc",
        "num_device_free",
        "max_split_size",
    ] {
        assert!(m.contains_key(key), "missing {key}");
    }
    assert_eq!(m.len(), 9 * 3 * 4 + 2 * 4 + 6);
    assert_eq!(m["max_split_size"], -1);
}
