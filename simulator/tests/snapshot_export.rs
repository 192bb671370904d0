//! Snapshots written from a replay (`memsim convert X.jsonl Y.pickle`): what the run recorded
//! stays in them (an OOM, the allocator configuration), a replay that ends with no segment is
//! still a snapshot, errors number the input's records; and blocks outside their segment are
//! refused when a snapshot is read.

use std::path::Path;

use serde_json::json;
use simulator::replay::{ReplayOptions, Replayer};
use simulator::snapshot::{self, SnapshotError};
use trace::{Control, ControlOp, Event, Header, Oom, Record};

use crate::records::{alloc, free, header};

const MIB: u64 = 1 << 20;

fn bare(event: Event) -> Record {
    Record { ts_ns: None, tid: None, device: Some(0), event }
}

/// `recs` realised by the model and written as a snapshot at `out`, read back.
fn export(h: &Header, recs: &[Record], out: &Path) -> (snapshot::Exported, snapshot::Snapshot) {
    snapshot::check_exportable(recs).unwrap();
    let mut rep = Replayer::new(h, ReplayOptions::default()).unwrap().realize();
    recs.iter().for_each(|r| rep.observe(r));
    let realized = rep.take_realized();
    let exported = snapshot::write_replayed_snapshot(out, h, &realized).unwrap();
    (exported, snapshot::read_snapshot(out).unwrap())
}

/// A recorded OOM was dropped by the realised replay: the pickle read back as a run that fitted.
#[test]
fn a_recorded_oom_is_kept_in_the_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let oom = bare(Event::Oom(Oom { size: 30_000 * MIB, device_free: Some(0), stream: 0 }));
    let recs = [alloc(1, 100 * MIB, None), oom, free(1)];
    let (_, snap) = export(&header(), &recs, &dir.path().join("oom.pickle"));
    let ooms: Vec<_> = snap.device_traces[0]
        .iter()
        .filter(|e| e.action == snapshot::Action::Oom)
        .map(|e| (e.size, e.device_free))
        .collect();
    assert_eq!(ooms, [(30_000 * MIB, Some(0))]);
    let v = snapshot::validate(&snap, &snapshot::ValidateOptions::default()).unwrap();
    assert_eq!(v.devices[0].recorded_ooms, 1);
}

/// A replay ending with every segment released (an `empty_cache` last), or one with no request
/// at all, was refused as a trace with no final segment state.
#[test]
fn a_replay_ending_with_no_segment_is_a_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let empty = bare(Event::Control(Control { op: ControlOp::EmptyCache }));
    let (e, snap) = export(&header(), &[alloc(1, MIB, None), free(1), empty], &dir.path().join("ec.pickle"));
    assert!(snap.segments.is_empty());
    assert_eq!((e.allocs, e.segment_events, e.segments), (1, 2, 0), "{e:?}");
    let (e, snap) = export(&header(), &[], &dir.path().join("none.pickle"));
    assert_eq!((e.entries, e.segments, snap.segments.len()), (0, 0, 0), "{e:?}");
    // A trace that is not a replay's still needs its final state.
    let err = snapshot::export_snapshot(&header(), &[alloc(1, MIB, None)]).expect_err("no final state");
    assert!(err.to_string().contains("no final segment state"), "{err}");
}

/// The export of a replay numbered its errors by the realised records (segment events added):
/// a device past PyTorch's at the input's record 2 was "record 3".
#[test]
fn export_errors_number_the_input_records() {
    let mut far = alloc(2, MIB, None);
    far.device = Some(200);
    let err = snapshot::check_exportable(&[alloc(1, MIB, None), free(1), far]).expect_err("device 200");
    assert!(matches!(err, SnapshotError::Export { index: 2, .. }), "{err}");
    assert!(err.to_string().starts_with("record 2: device 200"), "{err}");
    let mut stacked = alloc(1, MIB, None);
    if let Event::Alloc(a) = &mut stacked.event {
        a.stack = Some(7);
    }
    let err = snapshot::check_exportable(&[free(5), stacked]).expect_err("undefined stack");
    assert!(err.to_string().starts_with("record 1: stack 7 is used before"), "{err}");
}

/// The trace's `PYTORCH_CUDA_ALLOC_CONF` was not written: the pickle replayed under the defaults.
/// It goes in as PyTorch writes it; a key 2.5's rules refuse is returned, not written.
#[test]
fn the_trace_allocator_configuration_rides_along() {
    let dir = tempfile::tempdir().unwrap();
    let mut h = header();
    h.env.insert("PYTORCH_CUDA_ALLOC_CONF".into(), "max_split_size_mb:200".into());
    let (e, snap) = export(&h, &[alloc(1, MIB, None)], &dir.path().join("conf.pickle"));
    assert_eq!(e.alloc_conf_not_carried, None);
    assert_eq!(snap.allocator_settings, Some(json!({"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:200"})));
    h.env.insert("PYTORCH_CUDA_ALLOC_CONF".into(), "per_process_memory_fraction:0.5".into());
    let (e, snap) = export(&h, &[alloc(1, MIB, None)], &dir.path().join("frac.pickle"));
    assert_eq!(e.alloc_conf_not_carried.as_deref(), Some("per_process_memory_fraction:0.5"));
    assert_eq!(snap.allocator_settings, None);
}

/// A 30 MiB block in a 20 MiB segment was replayed cut to fit, the snapshot read as sound.
#[test]
fn a_block_outside_its_segment_is_refused() {
    let seg = |blocks: serde_json::Value| {
        json!({"segments": [{"device": 0, "address": 1u64 << 30, "total_size": 20 * MIB, "stream": 0,
                             "segment_type": "large", "allocated_size": 0, "active_size": 0, "blocks": blocks}],
               "device_traces": [[]]})
    };
    let block =
        |addr: u64, size: u64| json!({"address": addr, "size": size, "requested_size": size, "state": "inactive"});
    let base = 1u64 << 30;
    let cases = [
        (json!([block(base, 30 * MIB)]), "segments[0].blocks[0]: expected a block inside its segment"),
        (json!([block(base - 512, 512)]), "segments[0].blocks[0]: expected a block inside its segment"),
        (json!([block(base, 10 * MIB), block(base + MIB, 2 * MIB)]), "segments[0].blocks[1]: expected blocks in"),
    ];
    for (blocks, words) in cases {
        let bytes = serde_pickle::to_vec(&seg(blocks), serde_pickle::SerOptions::new()).unwrap();
        let err = snapshot::parse_snapshot(&bytes, "b.pickle").expect_err("a block outside its segment");
        assert!(err.to_string().starts_with(&format!("b.pickle: field {words}")), "{err}");
    }
    let fine = serde_pickle::to_vec(&seg(json!([block(base, 20 * MIB)])), serde_pickle::SerOptions::new()).unwrap();
    snapshot::parse_snapshot(&fine, "f.pickle").unwrap();
    // An empty segment: validate refused it, replay rejected it as a request, stats read it.
    let mut empty = seg(json!([]));
    empty["segments"][0]["total_size"] = json!(0);
    let bytes = serde_pickle::to_vec(&empty, serde_pickle::SerOptions::new()).unwrap();
    let err = snapshot::parse_snapshot(&bytes, "e.pickle").expect_err("an empty segment");
    assert!(
        err.to_string().starts_with("e.pickle: field segments[0].total_size: expected a segment of at least one byte"),
        "{err}"
    );
    // A segment listed without its blocks is still read (the GPU check's dry run writes them).
    let bytes = serde_pickle::to_vec(&seg(json!([])), serde_pickle::SerOptions::new()).unwrap();
    snapshot::parse_snapshot(&bytes, "n.pickle").unwrap();
}

/// Each redefinition of a stack id searched downward for a free key (quadratic in the number of
/// redefinitions); keys now come from a counter. Many redefinitions, and ids that take the keys
/// the counter hands out, still give each entry the frames its id named when it was made.
#[test]
fn many_redefinitions_keep_each_entrys_frames() {
    let dir = tempfile::tempdir().unwrap();
    let stack = |id, file: String| {
        bare(Event::Stack(trace::StackDef {
            id,
            frames: vec![trace::Frame { filename: file, line: 1, name: "f".into() }],
        }))
    };
    let mut recs = Vec::new();
    let mut want = Vec::new();
    for i in 0..400u64 {
        // Ids at the top of the range, defined midway: the keys fresh ones are drawn from.
        let id = if i % 100 == 50 { u32::MAX - (i / 100) as u32 } else { 7 };
        let file = format!("def{i}.py");
        recs.push(stack(id, file.clone()));
        let mut a = alloc(0x1000 * (i + 1), MIB, None);
        if let Event::Alloc(x) = &mut a.event {
            x.stack = Some(id);
        }
        recs.push(a);
        want.push(file);
    }
    let (_, snap) = export(&header(), &recs, &dir.path().join("many.pickle"));
    // The model places the blocks at addresses of its own: entries are matched by their order.
    let got: Vec<String> = snap.device_traces[0]
        .iter()
        .filter(|e| e.action == snapshot::Action::Alloc)
        .map(|e| {
            let frames = &snap.stacks[e.frames.expect("frames") as usize];
            frames.iter().map(|f| f.filename.clone()).collect::<Vec<_>>().join(",")
        })
        .collect();
    assert_eq!(got, want);
}
