//! The replay's address translation (the classifier numbers live trace addresses, the replay
//! keeps blocks by number) holds what a map from trace address to block holds, the way the
//! replay kept it before: checked against that map, driving the allocator directly, on random
//! traces whose requests the model refuses in every way (unknown and double frees, an allocation
//! over a live address, out-of-memory, zero bytes, `record_stream` on freed blocks, a refused
//! start state), on two devices, with synthetic and recorded addresses.

use std::collections::{HashMap, HashSet};

use proptest::prelude::*;
use proptest::strategy::ValueTree;
use simulator::alloc::{Allocator, AllocatorConfig, ExistingSegment, Request, TorchVersion};
use simulator::replay::{ReplayOptions, Replayer};
use trace::{
    Alloc, Api, BlockInfo, BlockState, Category, Control, ControlOp, Event, Free, FreeStage, Origin, Record,
    SegmentPool, SegmentState, StateAt,
};

const MIB: u64 = 1 << 20;

/// What the map held per trace address: the model's address, the block size, the category and
/// whether the free was requested.
type Entry = (u64, u64, Option<Category>, bool);

/// The translation as a map by (device, trace address), with the replay's former rules.
struct MapReplay {
    synthetic: bool,
    capacity: Option<u64>,
    allocs: HashMap<u32, Allocator>,
    map: HashMap<(u32, u64), Entry>,
    by_category: HashMap<u32, [u64; 7]>,
    rejected: u64,
    /// Addresses whose allocation failed (out of memory) until freed or placed again, and the
    /// frees left out because of that, as the replay counts them.
    failed: HashSet<(u32, u64)>,
    failed_frees: u64,
}

fn cat_index(c: Option<Category>) -> usize {
    c.and_then(|c| Category::ALL.iter().position(|x| *x == c)).unwrap_or(6)
}

impl MapReplay {
    fn allocator(&mut self, d: u32) -> &mut Allocator {
        let capacity = self.capacity;
        self.allocs
            .entry(d)
            .or_insert_with(|| Allocator::new(AllocatorConfig::default(), TorchVersion::default(), capacity))
    }

    fn apply(&mut self, d: u32, req: &Request) -> Option<simulator::alloc::Outcome> {
        match self.allocator(d).apply(req) {
            Ok(o) => Some(o),
            Err(_) => {
                self.rejected += 1;
                None
            }
        }
    }

    fn observe(&mut self, r: &Record) {
        let d = r.device.unwrap_or(0);
        let model = |map: &HashMap<(u32, u64), Entry>, addr| map.get(&(d, addr)).map_or(addr, |e| e.0);
        match &r.event {
            Event::Alloc(a) => {
                let req = Request::Alloc {
                    size: a.size,
                    stream: a.stream,
                    recorded_addr: (!self.synthetic).then_some(a.addr),
                };
                if let Some(o) = self.apply(d, &req) {
                    if let (None, Some(m)) = (&o.oom, o.addr) {
                        self.failed.remove(&(d, a.addr));
                        self.map.insert((d, a.addr), (m, o.block_size, a.category, false));
                        self.by_category.entry(d).or_default()[cat_index(a.category)] += o.block_size;
                    } else if o.oom.is_some() {
                        self.failed.insert((d, a.addr));
                    }
                }
            }
            Event::Free(f) if self.skips_failed(d, f.addr, f.stage != FreeStage::Requested) => {}
            Event::Free(f) if f.stage == FreeStage::Requested => {
                let req = Request::FreeRequested { addr: model(&self.map, f.addr) };
                if self.apply(d, &req).is_some() {
                    if let Some(e) = self.map.get_mut(&(d, f.addr)) {
                        if !e.3 {
                            e.3 = true;
                            self.by_category.entry(d).or_default()[cat_index(e.2)] -= e.1;
                        }
                    }
                }
            }
            Event::Free(f) => {
                let taken = self.map.remove(&(d, f.addr));
                let addr = taken.map_or(f.addr, |e| e.0);
                let req = if f.stage == FreeStage::Immediate {
                    Request::Free { addr }
                } else {
                    Request::FreeCompleted { addr }
                };
                match (self.apply(d, &req), taken) {
                    (Some(_), Some(e)) if !e.3 => self.by_category.entry(d).or_default()[cat_index(e.2)] -= e.1,
                    (None, Some(e)) => {
                        self.map.insert((d, f.addr), e);
                    }
                    _ => {}
                }
            }
            Event::Control(c) => {
                let req = match c.op {
                    ControlOp::RecordStream { addr, stream } => {
                        Request::RecordStream { addr: model(&self.map, addr), stream }
                    }
                    ControlOp::EmptyCache => Request::EmptyCache,
                    ref other => panic!("not generated: {other:?}"),
                };
                self.apply(d, &req);
            }
            Event::SegmentState(s) => {
                if self.allocator(d).add_existing_segment(&ExistingSegment::from(s)).is_err() {
                    self.rejected += 1;
                    return;
                }
                for b in s.blocks.iter().filter(|b| b.state != BlockState::Inactive) {
                    self.map.insert((d, b.addr), (b.addr, b.size, None, false));
                    self.by_category.entry(d).or_default()[6] += b.size;
                }
            }
            other => panic!("not generated: {other:?}"),
        }
    }

    /// A free of an address whose allocation failed, with no block live there, frees nothing
    /// and is left out; a completing free forgets the failure.
    fn skips_failed(&mut self, d: u32, addr: u64, completes: bool) -> bool {
        let failed = if completes { self.failed.remove(&(d, addr)) } else { self.failed.contains(&(d, addr)) };
        let skip = failed && !self.map.contains_key(&(d, addr));
        self.failed_frees += u64::from(skip && completes);
        skip
    }

    fn current(&self, d: u32) -> (u64, u64) {
        self.allocs.get(&d).map_or((0, 0), |a| {
            let s = a.stats();
            (s.reserved_bytes[0].current.max(0) as u64, s.allocated_bytes[0].current.max(0) as u64)
        })
    }

    fn live_blocks(&self, d: u32) -> Vec<(u64, u64, u64, Option<Category>)> {
        let mut v: Vec<_> = self
            .map
            .iter()
            .filter(|((dev, _), e)| *dev == d && !e.3)
            .map(|((_, addr), e)| (*addr, e.0, e.1, e.2))
            .collect();
        v.sort_by_key(|b| (b.0, b.1));
        v
    }
}

/// A start-state segment of two blocks at `base` (both live, or the second inactive).
fn seed(device: u32, base: u64, second_live: bool) -> Record {
    let block = |addr, state| BlockInfo { addr, size: MIB, requested_size: MIB, state, stack: None };
    let second = if second_live { BlockState::ActiveAllocated } else { BlockState::Inactive };
    let segment = SegmentState {
        at: StateAt::Start,
        addr: base,
        total_size: 2 * MIB,
        stream: 0,
        pool: SegmentPool::Large,
        is_expandable: false,
        pool_id: (0, 0),
        stack: None,
        blocks: vec![block(base, BlockState::ActiveAllocated), block(base + MIB, second)],
    };
    Record { ts_ns: None, tid: None, device: Some(device), event: Event::SegmentState(segment) }
}

fn record(device: u32, event: Event) -> Record {
    Record { ts_ns: None, tid: None, device: Some(device), event }
}

/// Addresses from a small set, so that frees meet unknown, freed and replaced addresses; the
/// first two are the start state's blocks.
fn op() -> impl Strategy<Value = Record> {
    let addr = (0u64..6).prop_map(|i| (1 << 40) + i * MIB);
    let device = 0u32..2;
    let size = prop_oneof![Just(0u64), 1u64..4096, (1u64..40).prop_map(|m| m * MIB)];
    let category = prop_oneof![Just(None), Just(Some(Category::Activation)), Just(Some(Category::Parameter))];
    let stage = prop_oneof![Just(FreeStage::Immediate), Just(FreeStage::Requested), Just(FreeStage::Completed)];
    prop_oneof![
        5 => (device.clone(), addr.clone(), size, category).prop_map(|(d, a, s, c)| record(
            d,
            Event::Alloc(Alloc { category: c, ..Alloc::device(a, s, Api::Allocator, Origin::Request) })
        )),
        5 => (device.clone(), addr.clone(), stage)
            .prop_map(|(d, a, st)| record(d, Event::Free(Free::device(a, Api::Allocator, Origin::Request, st)))),
        1 => (device.clone(), addr, 1i64..3).prop_map(|(d, a, s)| record(
            d,
            Event::Control(Control { op: ControlOp::RecordStream { addr: a, stream: s } })
        )),
        1 => device.clone().prop_map(|d| record(d, Event::Control(Control { op: ControlOp::EmptyCache }))),
        // A start state again, over live blocks: the model refuses it.
        1 => (device, any::<bool>()).prop_map(|(d, live)| seed(d, 1 << 40, live)),
    ]
}

fn trace() -> impl Strategy<Value = (Vec<Record>, bool, Option<u64>)> {
    (
        (any::<bool>(), proptest::collection::vec(op(), 1..160)).prop_map(|(seeded, ops)| {
            let mut recs = if seeded { vec![seed(0, 1 << 40, true)] } else { Vec::new() };
            recs.extend(ops);
            recs
        }),
        any::<bool>(),
        prop_oneof![Just(None), Just(Some(64 * MIB)), Just(Some(200 * MIB))],
    )
}

/// A replayer for one of [`trace`]'s cases: its kind of addresses and its capacity.
fn replayer(synthetic: bool, capacity: Option<u64>) -> Replayer {
    let mut h = crate::records::header();
    h.synthetic_addresses = synthetic;
    Replayer::new(&h, ReplayOptions { capacity, ..ReplayOptions::default() }).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn numbered_blocks_hold_what_a_map_by_trace_address_holds((recs, synthetic, capacity) in trace()) {
        let mut whole = replayer(synthetic, capacity);
        let mut stepped = replayer(synthetic, capacity);
        let mut classifier = stepped.classifier().unwrap();
        let mut map = MapReplay {
            synthetic,
            capacity,
            allocs: HashMap::new(),
            map: HashMap::new(),
            by_category: HashMap::new(),
            rejected: 0,
            failed: HashSet::new(),
            failed_frees: 0,
        };
        for (i, r) in recs.iter().enumerate() {
            whole.observe(r);
            stepped.observe_step(&classifier.classify(r.clone()));
            map.observe(r);
            for d in 0..2 {
                prop_assert_eq!(whole.current(d), map.current(d), "record {}, device {}: {:?}", i, d, r);
                let cats = map.by_category.get(&d).copied().unwrap_or_default();
                prop_assert_eq!(whole.live_by_category(d), cats, "record {}, device {}: {:?}", i, d, r);
                let mut live = whole.live_blocks(d);
                live.sort_by_key(|b| (b.0, b.1));
                prop_assert_eq!(live, map.live_blocks(d), "record {}, device {}: {:?}", i, d, r);
            }
        }
        let (a, b) = (whole.finish(), stepped.finish());
        prop_assert_eq!(a.rejected, map.rejected);
        prop_assert_eq!(a.failed_frees, map.failed_frees);
        prop_assert_eq!(serde_json::to_value(a).unwrap(), serde_json::to_value(b).unwrap());
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// The decoding thread hands allocations and frees to the replay's mapper field by field
    /// (`MapRecord::alloc`/`free`); each must give the step the whole record gives.
    #[test]
    fn field_by_field_steps_are_the_records_steps((recs, synthetic, capacity) in trace()) {
        use simulator::replay::Steps;
        use trace::MapRecord;
        let mut whole = Steps(replayer(synthetic, capacity).classifier());
        let mut fields = Steps(replayer(synthetic, capacity).classifier());
        for (i, r) in recs.iter().enumerate() {
            let by_fields = match r.event.clone() {
                Event::Alloc(a) => fields.alloc(r.ts_ns, r.tid, r.device, a),
                Event::Free(f) => fields.free(r.ts_ns, r.tid, r.device, f),
                _ => fields.record(r.clone()),
            };
            prop_assert_eq!(by_fields, whole.record(r.clone()), "record {}: {:?}", i, r);
        }
    }
}

#[test]
fn the_random_traces_reach_every_refusal() {
    // The property above means something only if its traces make the model refuse frees (the
    // case that moves a block out of its number), allocations over refused frees' addresses and
    // frees of allocations that ran out of memory.
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let (mut refused_frees, mut ooms, mut failed_frees) = (0, 0, 0);
    for _ in 0..200 {
        let (recs, synthetic, capacity) = trace().new_tree(&mut runner).unwrap().current();
        let mut rp = replayer(synthetic, capacity);
        recs.iter().for_each(|r| rp.observe(r));
        let report = rp.finish();
        refused_frees += report.rejected_examples.iter().filter(|e| e.contains("free")).count();
        ooms += usize::from(report.first_oom.oom);
        failed_frees += report.failed_frees;
    }
    assert!(refused_frees > 50, "only {refused_frees} refused frees");
    assert!(ooms > 10, "only {ooms} traces ran out of memory");
    assert!(failed_frees > 10, "only {failed_frees} frees of allocations that failed");
}
