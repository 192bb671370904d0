//! The two-phase replay (`Classifier::classify` then `Replayer::observe_step`) leaves a replay
//! exactly as `Replayer::observe` of the same records does: on every shared real snapshot, and
//! on hand-built traces with every kind of record the classifier sorts (other callers, failed
//! calls, control operations, markers, names, device-level requests, a start state).

use simulator::replay::{ReplayOptions, Replayer, Step};
use simulator::snapshot;
use trace::{Control, ControlOp, Event, Header, Level, Marker, MemoryKind, NameDef, Origin, Record};

use crate::records::{alloc, free, header};
use crate::snapshot_support::{shared_snapshot, SHARED_FILES};

const MIB: u64 = 1 << 20;

/// Replays `recs` both ways and asserts equal reports; returns the steps, for the callers'
/// own checks of how records were sorted.
fn check(what: &str, h: &Header, opts: &ReplayOptions, recs: &[Record]) -> Vec<Step> {
    let mut whole = Replayer::new(h, opts.clone()).unwrap();
    let mut stepped = Replayer::new(h, opts.clone()).unwrap();
    let mut c = stepped.classifier().expect("a replay that does not realise has a classifier");
    let mut steps = Vec::new();
    for r in recs {
        whole.observe(r);
        let s = c.classify(r.clone());
        stepped.observe_step(&s);
        steps.push(s);
    }
    assert_eq!(whole.position(), stepped.position(), "{what}: records counted");
    let a = serde_json::to_value(whole.finish()).unwrap();
    let b = serde_json::to_value(stepped.finish()).unwrap();
    assert_eq!(a, b, "{what}: the stepped replay's report differs from the whole-record one");
    steps
}

fn with_event(mut r: Record, f: impl FnOnce(&mut Event)) -> Record {
    f(&mut r.event);
    r
}

fn bare(event: Event) -> Record {
    Record { ts_ns: None, tid: None, device: Some(0), event }
}

/// Allocations and frees from another caller module, failed ones, outcome events, a control
/// operation, iteration markers and names: every kind the fast path must not take.
fn unusual_records() -> Vec<Record> {
    let by_caller = |r: Record, id: u32| {
        with_event(r, |e| match e {
            Event::Alloc(a) => a.caller = Some(id),
            Event::Free(f) => f.caller = Some(id),
            _ => {}
        })
    };
    let failed = with_event(alloc(9, 8 * MIB, None), |e| {
        if let Event::Alloc(a) = e {
            a.result = 2;
        }
    });
    let outcome = with_event(alloc(10, 4 * MIB, None), |e| {
        if let Event::Alloc(a) = e {
            a.origin = Origin::Outcome;
        }
    });
    let pinned = mem(alloc(11, 4 * MIB, None), MemoryKind::PinnedHost);
    vec![
        bare(Event::Name(NameDef { id: 1, text: "/usr/lib/libnccl.so.2".into() })),
        bare(Event::Name(NameDef { id: 2, text: "/opt/torch/lib/libc10_cuda.so".into() })),
        bare(Event::Marker(Marker { text: "iter:0".into() })),
        alloc(1, 30 * MIB, None),
        by_caller(alloc(2, 20 * MIB, None), 1),
        by_caller(alloc(3, 20 * MIB, None), 2),
        failed,
        outcome,
        pinned,
        free(1),
        bare(Event::Marker(Marker { text: "iter:1".into() })),
        alloc(4, 50 * MIB, None),
        bare(Event::Control(Control { op: ControlOp::EmptyCache })),
        by_caller(free(2), 1),
        by_caller(free(3), 2),
        free(4),
        bare(Event::Control(Control { op: ControlOp::ResetPeakStats })),
        alloc(5, 10 * MIB, None),
        bare(Event::Oom(trace::Oom { size: 80 * MIB, device_free: None, stream: 0 })),
        mem(alloc(12, 6 * MIB, None), MemoryKind::Physical),
        mem(alloc(13, 2 * MIB, None), MemoryKind::Managed),
        mem(free(12), MemoryKind::Physical),
    ]
}

/// The record with its memory kind set (a VMM handle, managed memory).
fn mem(r: Record, kind: MemoryKind) -> Record {
    with_event(r, |e| match e {
        Event::Alloc(a) => a.mem = kind,
        Event::Free(f) => f.mem = kind,
        _ => {}
    })
}

fn kind(s: &Step) -> String {
    match s {
        Step::Alloc { .. } => "alloc".into(),
        Step::Free { .. } => "free".into(),
        Step::Control { .. } => "control".into(),
        Step::Seed(_) => "seed".into(),
        Step::Iteration(n) => format!("iteration {n}"),
        Step::Outside { caller: Some(_), .. } => "other caller".into(),
        Step::Outside { caller: None, .. } => "held outside".into(),
        Step::FailedCall => "failed".into(),
        Step::RecordedOom { .. } => "recorded oom".into(),
        Step::RecordedRelease { .. } => "recorded release".into(),
        Step::Skip => "skip".into(),
        Step::Record(_) => "record".into(),
    }
}

#[test]
fn hand_built_traces_replay_the_same_either_way() {
    let opts = ReplayOptions::default();
    let steps = check("allocator-level records", &header(), &opts, &crate::records::records());
    // The fast path took the plain requests and skipped the stack definition.
    assert!(steps.iter().any(|s| matches!(s, Step::Alloc { .. })));
    assert!(steps.iter().any(|s| matches!(s, Step::Free { .. })));
    assert!(steps.iter().any(|s| matches!(s, Step::Skip)));

    // What each unusual record is to a replay of an allocator-level trace, and to one of a
    // device-level trace taken with the cache off, where every device request is one whatever
    // its origin. Either way, other callers' requests and failed calls are left out with their
    // reason, and the allocator's own module's requests are applied.
    let expect = [
        ("skip", "skip"),
        ("skip", "skip"),
        ("iteration 0", "iteration 0"),
        ("alloc", "alloc"),
        ("other caller", "other caller"),
        ("alloc", "alloc"),
        ("failed", "failed"),
        ("skip", "alloc"), // an outcome event
        ("skip", "skip"),  // pinned host memory
        ("free", "free"),
        ("iteration 1", "iteration 1"),
        ("alloc", "alloc"),
        ("control", "control"),
        ("other caller", "other caller"),
        ("free", "free"),
        ("free", "free"),
        ("control", "control"),
        ("alloc", "alloc"),
        ("recorded oom", "recorded oom"),
        ("held outside", "held outside"), // a VMM handle
        ("held outside", "held outside"), // managed memory
        ("held outside", "held outside"), // the handle released
    ];
    let steps = check("unusual records", &header(), &opts, &unusual_records());
    assert_eq!(steps.iter().map(kind).collect::<Vec<_>>(), expect.map(|e| e.0), "{steps:#?}");
    // Another module's requests hold device memory beside the allocator's, and give it back.
    let nccl = |size: u64, free: bool| Step::Outside {
        device: 0,
        addr: 2,
        size,
        free,
        physical: false,
        caller: Some("/usr/lib/libnccl.so.2".into()),
    };
    assert_eq!((&steps[4], &steps[13]), (&nccl(20 * MIB, false), &nccl(0, true)));
    let mut h = Header::new("test", "0", Level::Device);
    h.caching_disabled = true;
    h.synthetic_addresses = true;
    let steps = check("device-level requests", &h, &opts, &unusual_records());
    assert_eq!(steps.iter().map(kind).collect::<Vec<_>>(), expect.map(|e| e.1), "{steps:#?}");

    let capped = ReplayOptions { capacity: Some(60 * MIB), ..ReplayOptions::default() };
    check("a capacity the trace exceeds", &header(), &capped, &unusual_records());
}

#[test]
fn shared_snapshots_replay_the_same_either_way() {
    let mut with_history = 0;
    for file in SHARED_FILES {
        let snap = shared_snapshot(file);
        let imported = snapshot::import_snapshot(&snap, None, None).unwrap_or_else(|e| panic!("{file}: {e}"));
        let steps = check(file, &imported.header, &ReplayOptions::default(), &imported.records);
        // Some snapshots hold only their segments, no history of requests.
        if steps.iter().any(|s| matches!(s, Step::Alloc { .. })) {
            with_history += 1;
        }
    }
    assert!(with_history >= 10, "only {with_history} snapshots sent requests through the fast path");
}

#[test]
fn a_realising_replay_has_no_classifier() {
    let rp = Replayer::new(&header(), ReplayOptions::default()).unwrap().realize();
    assert!(rp.classifier().is_none());
}

/// A device-level trace taken with the cache off records each request as the `cudaMalloc` and
/// `cudaFree` it became (outcomes). Realised, the requests kept those fields and were exported
/// as `segment_alloc`/`segment_free`: a snapshot of a cache-off run held no allocation, so
/// `memsim validate` had nothing to replay. They are the allocator's requests.
#[test]
fn a_cache_off_trace_realises_its_calls_as_requests() {
    let mut h = Header::new("libmemtrace", "0", Level::Device);
    h.caching_disabled = true;
    let call = |ts: u64, event| Record { ts_ns: Some(ts), tid: Some(1), device: Some(0), event };
    let addr = |i: u64| 0x7f00_0000_0000 + i * 2 * MIB;
    let mut recs = Vec::new();
    for i in 0..8u64 {
        let a = trace::Alloc::device(addr(i), 2 * MIB, trace::Api::CudaMalloc, Origin::Outcome);
        recs.push(call(2 * i, Event::Alloc(a)));
        let f = trace::Free::device(addr(i), trace::Api::CudaFree, Origin::Outcome, trace::FreeStage::Immediate);
        recs.push(call(2 * i + 1, Event::Free(f)));
    }
    let mut rp = Replayer::new(&h, ReplayOptions::default()).unwrap().realize();
    recs.iter().for_each(|r| rp.observe(r));
    let realized = rp.take_realized();
    let requests = |origin| {
        realized
            .iter()
            .filter(|r| match &r.event {
                Event::Alloc(a) => a.size == 2 * MIB && a.origin == origin,
                _ => false,
            })
            .count()
    };
    assert_eq!((requests(Origin::Request), requests(Origin::Outcome)), (8, 0), "{realized:#?}");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("t.pickle");
    let exported = snapshot::write_snapshot(&out, &h, &realized).unwrap();
    assert_eq!(exported.allocs, 8);
    let snap = snapshot::read_snapshot(&out).unwrap();
    let r = snapshot::validate(&snap, &snapshot::ValidateOptions::default()).unwrap();
    assert_eq!((r.counts.allocs, r.counts.alloc_addr_matches), (8, 8));
    assert_eq!(r.counts.segment_event_matches, r.counts.segment_events);
    assert_eq!(r.verdict, snapshot::Verdict::Exact);
}
