//! What a producer did not record, though the trace ends whole: events it lost (counted in its
//! `process_exit`) and a stop at its byte limit (its marker). The reader's summary counts both,
//! whichever way the trace is read, and words the warning every tool prints.

use std::path::Path;

use trace::*;

use crate::support::{binary, jsonl, small_trace};

fn exit(lost_events: u64) -> Record {
    Record::bare(Event::ProcessExit(ProcessExit { status: Some(0), signal: None, lost_events }))
}

fn marker(text: &str) -> Record {
    Record { ts_ns: Some(300), tid: Some(7), device: None, event: Event::Marker(Marker { text: text.into() }) }
}

/// `small_trace()` as the shim's, whose producer writes a `process_exit` last, without its exit.
fn shim_trace() -> (Header, Vec<Record>) {
    let (mut h, mut recs) = small_trace();
    h.producer.name = "libmemtrace".into();
    recs.pop();
    (h, recs)
}

/// The summary of `bytes` read one record at a time, in batches, and mapped from a file: all
/// the same.
fn summaries(bytes: &[u8], dir: &Path, name: &str) -> Summary {
    let mut r = open_reader(bytes).unwrap();
    while let Some(rec) = r.next_record() {
        rec.unwrap();
    }
    let one = r.summary();
    let mut r = open_reader(bytes).unwrap();
    let mut out = Vec::new();
    while r.next_records(&mut out, 2, &mut |rec| rec).unwrap() {}
    assert_eq!(r.summary(), one, "{name}: batched");
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    let mut r = Reader::open(&path).unwrap();
    out.clear();
    while r.next_records(&mut out, 4096, &mut |rec| rec).unwrap() {}
    assert_eq!(r.summary(), one, "{name}: mapped");
    one
}

#[test]
fn lost_events_and_a_byte_limit_stop_are_counted_and_said() {
    let dir = tempfile::tempdir().unwrap();
    let (h, recs) = shim_trace();
    // The shim's own words when it stops at MEMTRACE_MAX_BYTES (and what `marker::byte_limit`
    // writes).
    let stop = "memtrace: MEMTRACE_MAX_BYTES=20000 reached; recording stopped";
    assert_eq!(marker::byte_limit(20000), stop);
    type Case = (&'static str, Vec<Record>, u64, Option<u64>);
    let cases: [Case; 5] = [
        ("whole", vec![exit(0)], 0, None),
        ("lost", vec![exit(309_402)], 309_402, None),
        ("limit", vec![marker(stop), exit(0)], 0, Some(20000)),
        ("both", vec![marker(stop), exit(7)], 7, Some(20000)),
        // A user's marker that only looks like it is user text.
        ("lookalike", vec![marker("memtrace: MEMTRACE_MAX_BYTES=lots reached; recording stopped"), exit(0)], 0, None),
    ];
    for (name, tail, lost, limit) in cases {
        let all: Vec<Record> = recs.iter().cloned().chain(tail).collect();
        for (form, bytes) in [("mtrace", binary(&h, &all)), ("jsonl", jsonl(&h, &all))] {
            let s = summaries(&bytes, dir.path(), &format!("{name}.{form}"));
            assert_eq!((s.lost_events, s.byte_limit), (lost, limit), "{name}.{form}");
            assert!(s.ends_with_exit && !s.truncated && !s.cut_short(), "{name}.{form}: ends whole");
            assert_eq!(s.incomplete(), lost > 0 || limit.is_some(), "{name}.{form}");
            let w = s.warnings(Path::new("t.mtrace"));
            let said_lost = w.iter().any(|l| l.contains(&format!("t.mtrace: {lost} events were lost by the recorder")));
            let said_limit = w.iter().any(|l| l.contains("recording stopped at the producer's byte limit"));
            assert_eq!((said_lost, said_limit), (lost > 0, limit.is_some()), "{name}.{form}: {w:?}");
            // What --strict refuses comes first.
            if s.incomplete() {
                assert!(w[0].contains("byte limit") || w[0].contains("lost"), "{w:?}");
            }
        }
    }
}

/// The shim's note that CUPTI records it still held at a fatal signal were not delivered: the
/// trace ends whole, but is incomplete, and said so.
#[test]
fn cupti_records_undelivered_at_a_signal_are_said() {
    let dir = tempfile::tempdir().unwrap();
    let (h, mut recs) = shim_trace();
    recs.push(marker(marker::CUPTI_UNDELIVERED));
    recs.push(exit(0));
    for (form, bytes) in [("mtrace", binary(&h, &recs)), ("jsonl", jsonl(&h, &recs))] {
        let s = summaries(&bytes, dir.path(), &format!("cupti.{form}"));
        assert!(s.cupti_undelivered && s.ends_with_exit && s.incomplete(), "{form}: {s:?}");
        let w = s.warnings(Path::new("t.mtrace"));
        assert!(w[0].starts_with("t.mtrace: CUPTI activity records were still buffered"), "{form}: {w:?}");
    }
    // A user's text is not the note.
    let user: Vec<Record> =
        recs[..recs.len() - 2].iter().cloned().chain([marker("memtrace: CUPTI"), exit(0)]).collect();
    let s = summaries(&binary(&h, &user), dir.path(), "user.mtrace");
    assert!(!s.cupti_undelivered && !s.incomplete(), "{s:?}");
}
