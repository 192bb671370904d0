//! Property tests: structural invariants under random requests, and differential fuzzing
//! against the naive reference model.

use proptest::prelude::*;
use simulator::alloc::{Allocator, AllocatorConfig, DeviceEvent, Request, TorchVersion};

use crate::alloc_reference::{Reference, MIB};
use crate::alloc_support::check_consistent;

#[derive(Debug, Clone)]
enum Op {
    Alloc(u64, i64),
    Free(usize),
    Request(usize),
    Complete(usize),
    RecordStream(usize, i64),
    Empty,
}

fn size() -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => 1u64..4096,
        4 => 4096u64..(MIB + 1),
        3 => (MIB + 1)..(10 * MIB),
        2 => (10 * MIB)..(120 * MIB),
        1 => (0u32..8).prop_map(|k| MIB << k),
        // Whole MiB counts hit the segment-size and 1 MiB-remainder boundaries.
        2 => (1u64..64).prop_map(|k| k * MIB),
    ]
}

fn ops(streams: i64, record: bool) -> impl Strategy<Value = Vec<Op>> {
    let op = prop_oneof![
        6 => (size(), 0..streams).prop_map(|(s, st)| Op::Alloc(s, st)),
        3 => any::<usize>().prop_map(Op::Free),
        2 => any::<usize>().prop_map(Op::Request),
        2 => any::<usize>().prop_map(Op::Complete),
        (if record { 1 } else { 0 }) => (any::<usize>(), 0..3i64).prop_map(|(i, s)| Op::RecordStream(i, s)),
        1 => Just(Op::Empty),
    ];
    prop::collection::vec(op, 1..120)
}

/// Drives the model with ops, tracking which addresses are live and which wait for completion.
fn drive(a: &mut Allocator, ops: &[Op], mut each: impl FnMut(&Allocator, &Request, &simulator::alloc::Outcome)) {
    let mut live: Vec<u64> = Vec::new();
    let mut pending: Vec<u64> = Vec::new();
    for op in ops {
        let req = match *op {
            Op::Alloc(size, stream) => Request::Alloc { size, stream, recorded_addr: None },
            Op::Free(i) if !live.is_empty() => Request::Free { addr: live.remove(i % live.len()) },
            Op::Request(i) if !live.is_empty() => {
                let addr = live.remove(i % live.len());
                pending.push(addr);
                Request::FreeRequested { addr }
            }
            Op::Complete(i) if !pending.is_empty() => {
                Request::FreeCompleted { addr: pending.remove(i % pending.len()) }
            }
            Op::RecordStream(i, s) if !live.is_empty() => {
                Request::RecordStream { addr: live[i % live.len()], stream: s }
            }
            Op::Empty => Request::EmptyCache,
            _ => continue,
        };
        let out = a.apply(&req).unwrap_or_else(|e| panic!("{req:?}: {e}"));
        if let Some(addr) = out.addr {
            live.push(addr);
        }
        each(a, &req, &out);
    }
}

fn config() -> impl Strategy<Value = (String, Option<u64>)> {
    let conf = prop_oneof![
        Just(String::new()),
        Just("max_split_size_mb:40".to_string()),
        Just("roundup_power2_divisions:4".to_string()),
        Just("expandable_segments:True".to_string()),
        Just("expandable_segments:True,max_split_size_mb:40".to_string()),
        Just("garbage_collection_threshold:0.5,per_process_memory_fraction:0.5".to_string()),
    ];
    let cap = prop_oneof![Just(None), Just(Some(256 * MIB)), Just(Some(1u64 << 30))];
    (conf, cap)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, .. ProptestConfig::default() })]

    /// No overlap, blocks tile segments, free bytes add up, reserved >= active >= allocated, and
    /// every current statistic equals its recomputation from the state — under every config.
    #[test]
    fn invariants_hold((conf, cap) in config(), ops in ops(3, true)) {
        let cfg = AllocatorConfig::parse(&conf, TorchVersion::V2_9).unwrap();
        let mut a = Allocator::new(cfg, TorchVersion::V2_9, cap);
        drive(&mut a, &ops, |a, _, out| {
            check_consistent(a);
            if let Some(addr) = out.addr {
                assert!(out.block_size >= 512 && addr % 512 == 0);
            }
        });
    }

    /// Same addresses, segment events and statistics as the naive reference, step by step.
    #[test]
    fn matches_reference(
        ops in ops(2, false),
        cap in prop_oneof![Just(None), Just(Some(128 * MIB))],
        msp in prop_oneof![Just(u64::MAX), Just(40 * MIB)],
        version in prop_oneof![Just(TorchVersion::V2_4), Just(TorchVersion::V2_9)],
    ) {
        let conf = if msp == u64::MAX { String::new() } else { format!("max_split_size_mb:{}", msp / MIB) };
        let mut a = Allocator::new(AllocatorConfig::parse(&conf, version).unwrap(), version, cap);
        let mut r = Reference::new(cap, msp, 20 * MIB);
        drive(&mut a, &ops, |a, req, out| {
            let mut ev = Vec::new();
            match *req {
                Request::Alloc { size, stream, .. } => {
                    let got = r.malloc(size, stream, &mut ev);
                    assert_eq!(out.addr, got, "address for {req:?}");
                }
                Request::Free { addr } => {
                    assert!(r.free_requested(addr) && r.free_completed(addr));
                }
                Request::FreeRequested { addr } => assert!(r.free_requested(addr)),
                Request::FreeCompleted { addr } => assert!(r.free_completed(addr)),
                Request::EmptyCache => r.empty_cache(&mut ev),
                _ => {}
            }
            let mine: Vec<(char, u64, u64)> = out.device_events.iter().map(|e| match *e {
                DeviceEvent::SegmentAlloc { addr, size } => ('A', addr, size),
                DeviceEvent::SegmentFree { addr, size } => ('F', addr, size),
                DeviceEvent::SegmentMap { addr, size } => ('M', addr, size),
                DeviceEvent::SegmentUnmap { addr, size } => ('U', addr, size),
            }).collect();
            assert_eq!(mine, ev, "segment events for {req:?}");
            let s = a.stats();
            let c = &r.c;
            assert_eq!(
                (s.allocated_bytes[0].current, s.allocated_bytes[0].peak, s.reserved_bytes[0].current,
                 s.reserved_bytes[0].peak, s.active_bytes[0].current, s.active_bytes[0].peak,
                 s.requested_bytes[0].current, s.segment[0].current, s.num_alloc_retries as i64, s.num_ooms as i64),
                (c.allocated, c.allocated_peak, c.reserved, c.reserved_peak, c.active, c.active_peak,
                 c.requested, c.segments, c.retries, c.ooms),
                "stats after {:?}", req
            );
        });
    }
}
