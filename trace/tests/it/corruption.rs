//! Foreign or damaged bytes give an error naming the byte offset (binary) or line (JSON Lines).

use trace::codec::{preamble, PREAMBLE_LEN};
use trace::*;

use crate::support::{binary, frame_bounds, jsonl, read_all, small_trace};

/// Reads `input` to its end and checks the first error's text contains every `expect` piece.
fn check(input: &[u8], expect: &[&str]) {
    let err = match read_all(input) {
        Ok((_, recs, sum)) => panic!("expected an error, read {} records ({sum:?})", recs.len()),
        Err(e) => e.to_string(),
    };
    for piece in expect {
        assert!(err.contains(piece), "error {err:?} lacks {piece:?}");
    }
}

fn valid() -> (Vec<u8>, Vec<usize>) {
    let (h, recs) = small_trace();
    let bytes = binary(&h, &recs);
    let bounds = frame_bounds(&bytes);
    (bytes, bounds)
}

/// The valid trace up to its second frame, then `tail`.
fn with_frame(tail: &[u8]) -> (Vec<u8>, usize) {
    let (bytes, bounds) = valid();
    let at = bounds[1];
    let mut v = bytes[..at].to_vec();
    v.extend_from_slice(tail);
    (v, at)
}

#[test]
fn preamble_errors() {
    check(b"GARBAGE!xxxxxxxx", &["not a memtrace trace", "47 41 52 42 41 47 45 21", "\"GARBAGE!xxxxxxxx\""]);
    check(b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR", &["not a memtrace trace", "89 50 4e 47"]);
    check(b"MEMTRACX\x01\x00\x03\x00\x00", &["not a memtrace trace", "MEMTRACX"]);
    check(&preamble(2, 3), &["unsupported trace format version 2", "versions 1 to 1", "upgrade memtrace"]);
    check(&preamble(0, 3), &["unsupported trace format version 0", "never written, so the header is damaged"]);
    check(&preamble(1, 0x8003), &["unsupported trace flags 0x8003", "0x8000"]);
}

#[test]
fn header_frame_errors() {
    let mut absurd = preamble(1, 3).to_vec();
    absurd.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 0x7f]);
    check(&absurd, &["corrupt trace frame at byte 12", "header length", "exceeds"]);
    let mut garbage = preamble(1, 3).to_vec();
    garbage.extend_from_slice(&[4, 0xff, 0xff, 0xff, 0xff]);
    check(
        &garbage,
        &[
            "corrupt trace frame at byte 12",
            "header body does not decode: a reserved integer marker byte where a u16 belongs",
        ],
    );
    let mut short = preamble(1, 3).to_vec();
    short.extend_from_slice(&[40, 1, 2]);
    check(&short, &["incomplete trace header", "header frame body"]);
    assert_eq!(short.len(), PREAMBLE_LEN + 3);
}

#[test]
fn frame_errors_name_the_offset() {
    let (v, at) = with_frame(&[0, 1, 0]);
    check(&v, &[&format!("corrupt trace frame at byte {at}"), "tag 0 is invalid"]);

    let (v, at) = with_frame(&[1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f]);
    check(&v, &[&format!("at byte {at}"), "frame length", "exceeds"]);

    let (v, at) = with_frame(&[1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]);
    check(&v, &[&format!("at byte {at}"), "exceeds 64 bits"]);

    // An alloc body of garbage: prefix byte 0, then an api varint discriminant that cannot be a u64.
    let (v, at) = with_frame(&[1, 3, 0, 0xff, 0xff]);
    check(
        &v,
        &[&format!("at byte {at}"), "alloc body does not decode: a reserved integer marker byte where a u64 belongs"],
    );

    // Empty body: not even the prefix byte.
    let (v, at) = with_frame(&[2, 0]);
    check(&v, &[&format!("at byte {at}"), "prefix byte is missing"]);

    let (v, _) = with_frame(&[6, 3, 0x40, 1, 2]);
    check(&v, &["reserved bits"]);

    let (v, _) = with_frame(&[7, 2, 0x08, 0]);
    check(&v, &["thread id-same bit set without the has-thread id bit"]);
}

#[test]
fn timestamp_delta_needs_an_earlier_timestamp() {
    let h = Header::new("t", "0", Level::Device);
    let mut bytes = binary(&h, &[]);
    let at = bytes.len();
    // mem_info with a delta timestamp but no earlier one.
    bytes.extend_from_slice(&[6, 4, trace::codec::PREFIX_HAS_TS | trace::codec::PREFIX_TS_DELTA, 2, 1, 1]);
    check(&bytes, &[&format!("at byte {at}"), "no earlier timestamp"]);
}

/// Two foreign starts were misnamed: a JSON Lines file behind a UTF-8 byte-order mark was "not
/// a memtrace trace", and a second trace appended to the first was a record prefix with
/// reserved bits.
#[test]
fn a_byte_order_mark_and_a_second_trace_are_named() {
    let (h, recs) = small_trace();
    let mut bom = b"\xef\xbb\xbf".to_vec();
    bom.extend_from_slice(&jsonl(&h, &recs));
    check(&bom, &["UTF-8 byte-order mark", "ef bb bf"]);
    let (one, _) = valid();
    let two = [one.clone(), one.clone()].concat();
    check(&two, &[&format!("a second trace header starts at byte {}", one.len()), "concatenated"]);
    // A pickle (a PyTorch snapshot given where a trace belongs) is named as one, with the way
    // to a trace of it.
    check(
        b"\x80\x04\x95\x10\x00\x00\x00",
        &["not a memtrace trace", "starts as a Python pickle does", "memsim convert"],
    );
    check(b"hello", &["not a memtrace trace"]);
    let plain = open_reader(&b"hello"[..]).err().unwrap().to_string();
    assert!(!plain.contains("pickle"), "{plain}");
}

/// A JSON Lines header's version is read first, as any number: 99999 was "expected u16" (the
/// field's type), where version 2 said which versions this reader knows.
#[test]
fn a_json_lines_version_of_any_size_is_named_as_a_version() {
    let line = |v: &str| {
        format!(r#"{{"kind":"header","format_version":{v},"producer":{{"name":"p","version":"1"}},"level":"device"}}"#)
            + "\n"
    };
    for v in ["2", "99999", "18446744073709551615"] {
        check(
            line(v).as_bytes(),
            &[&format!("unsupported trace format version {v}: this reader knows versions 1 to 1")],
        );
    }
    check(line("0").as_bytes(), &["version 0 was never written"]);
    check(line("-1").as_bytes(), &["format_version"]);
    // A newer version's header may differ in its other fields: the version is said, not them.
    let newer = r#"{"kind":"header","format_version":2,"producer":"p2","level":"gpu"}"#.to_string() + "\n";
    check(newer.as_bytes(), &["unsupported trace format version 2"]);
}

#[test]
fn errors_stop_iteration_and_keep_earlier_records() {
    let (v, _) = with_frame(&[0, 1, 0]);
    let mut r = open_reader(&v[..]).unwrap();
    assert!(r.next_record().unwrap().is_ok());
    let err = r.next_record().unwrap().unwrap_err();
    assert!(err.offset().is_some());
    assert!(r.next_record().is_none());
}

/// A key named like a tag, inside a string or nested with another value, is no tag: such lines
/// still read.
#[test]
fn jsonl_tag_names_elsewhere_still_read() {
    let (h, recs) = small_trace();
    let good = String::from_utf8(jsonl(&h, &recs[..2])).unwrap();
    for line in [r#"{"kind":"marker","text":"\"kind\": 1"}"#, r#"{"kind":"marker","text":"\"op\""}"#] {
        let (_, got, _) = read_all(format!("{good}{line}\n").as_bytes()).unwrap_or_else(|e| panic!("{line}: {e}"));
        assert!(matches!(&got[2].event, Event::Marker(_)), "{line}: {got:?}");
    }
}

#[test]
fn jsonl_errors_name_line_and_field() {
    let (h, recs) = small_trace();
    let good = String::from_utf8(jsonl(&h, &recs[..2])).unwrap();
    let checkj = |extra: &str, expect: &[&str]| {
        let input = format!("{good}{extra}\n");
        check(input.as_bytes(), expect);
    };
    checkj(
        r#"{"kind":"alloc","addr":1,"size":"big","api":"cudaMalloc"}"#,
        &["line 4", "field `size`", "invalid type: string \"big\"", "expected u64"],
    );
    checkj(r#"{"kind":"alloc","addr":1,"size":-5,"api":"cudaMalloc"}"#, &["line 4", "field `size`", "u64"]);
    checkj(r#"{"kind":"free","addr":1}"#, &["line 4", "field `api`", "missing field `api`"]);
    // An identifier this version does not know is a newer writer's API, kept (forward_compat.rs).
    checkj(
        r#"{"kind":"alloc","addr":1,"size":2,"api":"cuda Malloc"}"#,
        &["line 4", "field `api`", "api \"cuda Malloc\" is no entry-point name"],
    );
    checkj(r#"{"kind":"alloc","addr":1,"size":2,"api":"unknown:70000"}"#, &["line 4", "field `api`", "up to 65535"]);
    checkj(
        r#"{"kind":"segment_state","at":"end","addr":0,"total_size":2,"pool":"small","blocks":[{"addr":0,"size":2,"state":"bogus"}]}"#,
        &["line 4", "field `blocks[0].state`", "unknown variant `bogus`"],
    );
    checkj(r#"{"addr":1}"#, &["line 4", "field `kind`", "missing field `kind`"]);
    checkj(r#"{"kind":"alloc","addr":1,"#, &["line 4", "EOF while parsing"]);
    checkj(r#"{"kind":"header","format_version":1}"#, &["line 4", "second header"]);
    checkj(r#"{"kind":"marker","text":"a"} trailing"#, &["line 4", "trailing characters"]);
    checkj("null", &["line 4", "expected a JSON object"]);
    // serde's tagged enums take a variant's index: `"kind":1` was read as a free, and with
    // another fault on the line the error blamed `kind`, not the field at fault.
    checkj(r#"{"kind":1,"addr":1,"api":"cudaFree"}"#, &["line 4", "field `kind`", "expected a string"]);
    checkj(r#"{"kind" : 0,"addr":1,"size":2,"api":"cudaMalloc"}"#, &["line 4", "field `kind`", "expected a string"]);
    checkj(r#"{"kind":"control","op":0,"fraction":0.5}"#, &["line 4", "field `op`", "expected a string"]);
    // A control record's fields are read by its `op`: serde's tagged enum lost their names.
    checkj(
        r#"{"kind":"control","op":"set_memory_fraction","fraction":"0.5"}"#,
        &["line 4", "field `fraction`", "invalid type: string \"0.5\"", "expected f64"],
    );
    checkj(r#"{"kind":"control","op":"record_stream","addr":"x","stream":1}"#, &["line 4", "field `addr`", "u64"]);
    checkj(r#"{"kind":"control","op":"record_stream","addr":1}"#, &["line 4", "field `stream`", "missing field"]);
    checkj(r#"{"kind":"control","op":"bogus"}"#, &["line 4", "field `op`", "unknown variant `bogus`"]);
    checkj(r#"{"kind":"control"}"#, &["line 4", "field `op`", "missing field `op`"]);
    check(br#"{"kind":"marker","text":"a"}"#, &["missing trace header", "line 1", "\"marker\" record"]);
    // CR-only line endings read as one line: it was called a header cut short.
    let (h, recs) = small_trace();
    let cr = String::from_utf8(jsonl(&h, &recs[..2])).unwrap().replace('\n', "\r");
    check(cr.as_bytes(), &["line 1", "bare carriage return"]);
    check(
        b"{\"kind\":\"header\",\"format_version\":1,\"level\":\"device\"}\n",
        &["line 1", "missing field `producer`"],
    );
    check(
        b"{\"kind\":\"header\",\"format_version\":9,\"producer\":{\"name\":\"x\",\"version\":\"1\"},\"level\":\"device\"}\n",
        &["unsupported trace format version 9"],
    );
}

/// A key given twice in the header's `env` or `metadata` was kept once, the last silently (a
/// recorded allocator configuration replayed as the second of two): refused, naming the field
/// and the key, as a top-level field given twice is.
#[test]
fn a_header_key_given_twice_is_refused_by_field_and_key() {
    let head = r#"{"kind":"header","format_version":1,"producer":{"name":"p","version":"1"},"level":"allocator""#;
    for (field, object, key) in [
        (
            "env",
            r#"{"PYTORCH_CUDA_ALLOC_CONF":"expandable_segments:True","PYTORCH_CUDA_ALLOC_CONF":"expandable_segments:False"}"#,
            "PYTORCH_CUDA_ALLOC_CONF",
        ),
        ("metadata", r#"{"amp":"bf16","other":"x","amp":"fp32"}"#, "amp"),
    ] {
        let input = format!("{head},\"{field}\":{object}}}\n");
        check(input.as_bytes(), &["line 1", &format!("field `{field}`"), &format!("key `{key}` is given twice")]);
        // Each key once reads.
        let once = format!("{head},\"{field}\":{{\"{key}\":\"a\"}}}}\n");
        assert!(read_all(once.as_bytes()).is_ok(), "{field}");
    }
}

/// A file a crash or a full disk left unfinished can end in zero bytes (space the file system
/// gave it before the data arrived): the whole trace was refused as "tag 0 is invalid". The
/// records before are read, and the tail is said; zeros followed by anything else stay damage.
#[test]
fn a_tail_of_zero_bytes_is_read_as_the_end_and_said() {
    let (whole, _) = valid();
    let (_, records, _) = read_all(&whole).unwrap();
    for zeros in [1usize, 4096, 200_000] {
        let mut v = whole.clone();
        v.resize(whole.len() + zeros, 0);
        let (_, got, sum) = read_all(&v).unwrap();
        assert_eq!(got, records, "{zeros} zeros");
        assert_eq!(
            (sum.zero_tail, sum.complete_bytes, sum.bytes_read),
            (zeros as u64, whole.len() as u64, v.len() as u64)
        );
        assert!(sum.ends_with_exit && !sum.incomplete(), "zeros after process_exit are unused space");
        // Not a reason the run is incomplete: said after those (`--strict` names the first line).
        let mut lost = sum;
        lost.lost_events = 3;
        let said = lost.warnings(std::path::Path::new("t.mtrace"));
        assert!(said[0].contains("3 events were lost") && said[1].contains("zero bytes"), "{said:?}");
        let said = sum.warnings(std::path::Path::new("t.mtrace"));
        let want = format!("t.mtrace: ends in {zeros} zero bytes after byte {}", whole.len());
        assert!(said.iter().any(|w| w.starts_with(&want)), "{said:?}");
    }
    // Zeros where the process_exit should be: the run's end is missing.
    let (_, bounds) = valid();
    let mut v = whole[..bounds[bounds.len() - 2]].to_vec();
    v.resize(whole.len() + 4096, 0);
    let (_, _, sum) = read_all(&v).unwrap();
    assert!(!sum.ends_with_exit && sum.incomplete(), "{sum:?}");
    let mut v = whole.clone();
    v.extend_from_slice(&[0; 100]);
    v.push(7);
    check(&v, &[&format!("corrupt trace frame at byte {}", whole.len()), "tag 0 is invalid"]);
}
