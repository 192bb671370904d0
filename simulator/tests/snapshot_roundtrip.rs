//! pickle → trace → pickle keeps memory_viz's picture: `_memory_viz stats` prints the same, and
//! the segments, blocks, frames, trace entries and settings compare equal in Python.

use std::path::{Path, PathBuf};
use std::process::Command;

use simulator::snapshot::{self, pickle};

use crate::snapshot_support::{plain, shared_path, shared_snapshot, SHARED_FILES};

/// The project's venv python; the test fails (never skips) without it.
fn venv_python() -> PathBuf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python");
    assert!(
        p.is_file(),
        "{} is missing: run scripts/setup.sh to create the venv with torch (needed to check \
         exported snapshots with torch.cuda._memory_viz)",
        p.display()
    );
    p
}

fn run_python(args: &[&std::ffi::OsStr]) -> String {
    let out = Command::new(venv_python()).args(args).output().expect("venv python runs");
    assert!(out.status.success(), "python {:?} failed: {}", args, String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("utf-8 output")
}

fn memviz_stats(file: &Path) -> String {
    run_python(&["-m".as_ref(), "torch.cuda._memory_viz".as_ref(), "stats".as_ref(), file.as_os_str()])
}

/// For each (original, exported) pair: `_memory_viz stats` (its `segsum`, on the file as its CLI
/// reads it) must print the same, and the two snapshots must compare equal field by field.
/// Frames are not compared on segment_map/unmap, oom and snapshot entries: the trace format has
/// no stack on those events (reported to the lead). compile_context and user_metadata are not
/// carried either. One python process for all files: importing torch takes seconds.
const COMPARE: &str = r#"
import pickle, pickletools, sys
from torch.cuda._memory_viz import segsum
# What MemoryViz.js's unpickler reads (and Python, at protocol 3).
VIZ_OPS = {'PROTO', 'EMPTY_DICT', 'EMPTY_LIST', 'MARK', 'SETITEMS', 'APPENDS', 'TUPLE2', 'BININT1',
           'BININT2', 'BININT', 'LONG1', 'BINUNICODE', 'BINFLOAT', 'NONE', 'NEWTRUE', 'NEWFALSE',
           'BINPUT', 'LONG_BINPUT', 'BINGET', 'LONG_BINGET', 'STOP'}
def read(name):
    data = pickle.load(open(name, 'rb'))
    return {"segments": data, "traces": []} if isinstance(data, list) else data
def compare(fa, fb):
    ops = {op.name for op, _, _ in pickletools.genops(open(fb, 'rb').read())}
    if not ops <= VIZ_OPS:
        return f"opcodes memory_viz cannot read: {sorted(ops - VIZ_OPS)}"
    if segsum(read(fa)) != segsum(read(fb)):
        return "_memory_viz stats differ"
    a = pickle.load(open(fa, 'rb'))
    b = pickle.load(open(fb, 'rb'))
    if isinstance(a, list):
        return None if a == b else "old list-form segments differ"
    for k in ('segments', 'allocator_settings', 'external_annotations'):
        if a.get(k) != b.get(k):
            return f"{k} differ"
    if len(a['device_traces']) != len(b['device_traces']):
        return "device count differs"
    no_frames = {'segment_map', 'segment_unmap', 'oom', 'snapshot'}
    for d, (ta, tb) in enumerate(zip(a['device_traces'], b['device_traces'])):
        if len(ta) != len(tb):
            return f"device {d}: {len(ta)} vs {len(tb)} entries"
        for i, (x, y) in enumerate(zip(ta, tb)):
            keys = ['action', 'size', 'stream', 'time_us', 'device_free']
            if x['action'] != 'oom':
                keys.append('addr')
            if x['action'] not in no_frames:
                keys.append('frames')
            for k in keys:
                if x.get(k) != y.get(k):
                    return f"device {d} entry {i} field {k}: {x.get(k)!r} vs {y.get(k)!r}"
    return None
args = sys.argv[1:]
for fa, fb in zip(args[::2], args[1::2]):
    print(fa, compare(fa, fb) or "OK")
"#;

fn export_roundtrip(file: &str, dir: &Path) -> PathBuf {
    let snap = shared_snapshot(file);
    let imp = snapshot::import(&snap, &plain());
    let out = dir.join(format!("{file}.rt.pickle"));
    snapshot::write_snapshot(&out, &imp.header, &imp.records).unwrap_or_else(|e| panic!("{file}: {e}"));
    let bytes = std::fs::read(&out).expect("written");
    assert_eq!(&bytes[..2], &[0x80, 3], "{file}: protocol 3 (memory_viz rejects PROTO > 4)");
    // Frame lists are shared through the memo as PyTorch's own pickles share them.
    let original = std::fs::metadata(shared_path(file)).expect("exists").len() as usize;
    assert!(bytes.len() <= 2 * original.max(4096), "{file}: {} B exported from {original} B", bytes.len());
    // Our own unpickler accepts no bytes or sets, so a successful decode shows there are none.
    pickle::decode(&bytes).unwrap_or_else(|e| panic!("{file}: exported pickle: {e}"));
    out
}

#[test]
fn every_shared_snapshot_round_trips_through_a_trace() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut args: Vec<std::ffi::OsString> = vec!["-c".into(), COMPARE.into()];
    for file in SHARED_FILES {
        args.push(shared_path(file).into_os_string());
        args.push(export_roundtrip(file, dir.path()).into_os_string());
    }
    let refs: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_os_str()).collect();
    let report = run_python(&refs);
    let lines: Vec<&str> = report.lines().collect();
    assert_eq!(lines.len(), SHARED_FILES.len(), "{report}");
    for line in lines {
        assert!(line.ends_with(" OK"), "round trip differs: {line}");
    }
}

#[test]
fn memory_viz_cli_prints_the_same_stats_for_a_round_tripped_file() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = "JasperSolt--EoR_NN--snapshot.pickle";
    let out = export_roundtrip(file, dir.path());
    let before = memviz_stats(&shared_path(file));
    assert!(before.contains("total_reserved"), "{before}");
    assert_eq!(before, memviz_stats(&out));
}

#[test]
fn export_refuses_a_trace_without_final_segments() {
    let snap = shared_snapshot("JasperSolt--EoR_NN--snapshot.pickle");
    let imp = snapshot::import(&snap, &plain());
    let without_end: Vec<_> = imp
        .records
        .into_iter()
        .filter(|r| !matches!(&r.event, trace::Event::SegmentState(s) if s.at == trace::StateAt::End))
        .collect();
    let err = snapshot::export_snapshot(&imp.header, &without_end).expect_err("no End state");
    assert!(err.to_string().contains("no final segment state"), "{err}");
}

#[test]
fn a_failed_write_leaves_no_file() {
    let snap = shared_snapshot("JasperSolt--EoR_NN--snapshot.pickle");
    let imp = snapshot::import(&snap, &plain());
    let dir = tempfile::tempdir().expect("temp dir");
    let target = dir.path().join("missing-dir").join("x.pickle");
    let err = snapshot::write_snapshot(&target, &imp.header, &imp.records).expect_err("no such dir");
    assert!(err.to_string().contains("x.pickle"), "{err}");
    assert!(!target.exists());
}
