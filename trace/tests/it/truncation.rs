//! A trace cut at any byte reads up to its last complete record and says it was truncated.

use trace::*;

use crate::support::{binary, frame_bounds, jsonl, read_all, small_trace};

#[test]
fn binary_cut_at_every_offset() {
    let (h, recs) = small_trace();
    let bytes = binary(&h, &recs);
    let bounds = frame_bounds(&bytes);
    assert_eq!(bounds.len(), recs.len() + 1);
    let header_end = bounds[0];
    for cut in 0..=bytes.len() {
        let prefix = &bytes[..cut];
        match read_all(prefix) {
            Err(e) => {
                assert!(cut < header_end, "cut {cut}: error after the header: {e}");
                let msg = e.to_string();
                assert!(
                    matches!(e, TraceError::PartialHeader { offset, .. } if offset == cut as u64),
                    "cut {cut}: expected an incomplete-header error at byte {cut}, got: {msg}"
                );
                assert!(msg.contains("incomplete trace header"), "{msg}");
            }
            Ok((h2, got, sum)) => {
                assert!(cut >= header_end, "cut {cut}: a partial header was accepted");
                assert_eq!(h2, h);
                let complete = bounds.iter().skip(1).filter(|&&b| b <= cut).count();
                assert_eq!(got, recs[..complete], "cut {cut}");
                assert_eq!(sum.truncated, !bounds.contains(&cut), "cut {cut}: truncated flag");
                assert_eq!(sum.records, complete as u64);
                assert_eq!(sum.bytes_read, cut as u64, "cut {cut}: every byte is consumed");
            }
        }
    }
}

#[test]
fn jsonl_cut_at_every_offset() {
    let (h, recs) = small_trace();
    let bytes = jsonl(&h, &recs);
    // Line ends: index of each '\n'.
    let ends: Vec<usize> = bytes.iter().enumerate().filter(|(_, &b)| b == b'\n').map(|(i, _)| i).collect();
    assert_eq!(ends.len(), recs.len() + 1);
    for cut in 0..=bytes.len() {
        // A line is complete once its closing brace is in (the newline may be missing).
        let complete_lines = ends.iter().filter(|&&nl| nl <= cut).count();
        match read_all(&bytes[..cut]) {
            Err(e) => {
                assert!(cut < ends[0], "cut {cut}: error after the header line: {e}");
                assert!(matches!(e, TraceError::PartialHeader { .. }), "cut {cut}: {e}");
            }
            Ok((h2, got, sum)) => {
                assert!(complete_lines >= 1, "cut {cut}: a partial header was accepted");
                assert_eq!(h2, h);
                let n = complete_lines - 1;
                assert_eq!(got, recs[..n], "cut {cut}");
                let at_boundary = cut == 0 || ends.iter().any(|&nl| cut == nl || cut == nl + 1);
                assert_eq!(sum.truncated, !at_boundary, "cut {cut}: truncated flag");
            }
        }
    }
}

#[test]
fn empty_and_blank_inputs_say_the_header_is_missing() {
    let check = |input: &[u8], expect: &str| {
        let err = read_all(input).unwrap_err().to_string();
        assert!(err.contains(expect), "input {input:?}: {err}");
    };
    check(b"", "incomplete trace header: the input ends at byte 0");
    check(b"  \n\n ", "incomplete trace header");
    check(b"MEMTR", "while reading the preamble");
    check(b"{\"kind\":\"header\",\"format_ver", "while reading the JSON Lines header line");
}

/// A trace whose producer always ends it with `process_exit` and that ends at a whole record
/// without it was cut short (`head -n`, a killed run): said, whichever form; another producer's
/// traces (a snapshot import) carry no such promise.
#[test]
fn a_trace_cut_at_a_record_boundary_is_said_when_its_producer_ends_with_exit() {
    let (mut h, recs) = small_trace();
    assert!(matches!(recs.last().unwrap().event, Event::ProcessExit(_)));
    for (producer, expects) in [("memtrace_trainer.symtrace", true), ("libmemtrace", true), ("tests", false)] {
        h.producer.name = producer.into();
        for (encode, form) in [(binary as fn(&Header, &[Record]) -> Vec<u8>, "binary"), (jsonl, "jsonl")] {
            for (n, ended) in [(recs.len(), true), (recs.len() - 1, false), (1, false)] {
                let (_, _, sum) = read_all(&encode(&h, &recs[..n])).unwrap();
                assert_eq!(sum.ends_with_exit, ended, "{producer} {form} {n}");
                assert_eq!(sum.cut_short(), expects && !ended, "{producer} {form} {n}");
                let said = sum.warnings(std::path::Path::new("t")).iter().any(|w| w.contains("cut short"));
                assert_eq!(said, sum.cut_short(), "{producer} {form} {n}");
            }
        }
    }
}
