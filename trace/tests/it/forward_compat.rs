//! Newer writers' additions are skipped (unknown tags, unknown kinds) or ignored (appended fields).

use trace::codec::{encode_frame, PrefixState};
use trace::*;

use crate::support::{binary, read_all};

fn mem_info(ts: u64, free: u64) -> Record {
    Record { ts_ns: Some(ts), tid: Some(3), device: None, event: Event::MemInfo(MemInfo { free, total: 100 }) }
}

#[test]
fn unknown_tag_is_skipped_by_length_and_counted() {
    let h = Header::new("t", "0", Level::Device);
    let mut bytes = binary(&h, &[mem_info(1000, 1)]);
    // Continue the writer's delta state by hand: the unknown frame carries a timestamp the next
    // known frame is a delta from, so a reader must parse the prefix of unknown frames too.
    let mut state = PrefixState::default();
    let mut scratch = Vec::new();
    encode_frame(&mut state, &mem_info(1000, 1), &mut scratch).unwrap();
    let mut frames = Vec::new();
    encode_frame(&mut state, &mem_info(5000, 2), &mut frames).unwrap();
    frames[0] = 200; // a tag from the future
    frames[1] += 4; // with a longer body than this version would write
    frames.extend_from_slice(&[0xde, 0xad, 0xbe, 0xef]);
    encode_frame(&mut state, &mem_info(5100, 3), &mut frames).unwrap();
    let at = bytes.len() as u64;
    bytes.extend_from_slice(&frames);

    let (_, recs, sum) = read_all(&bytes).unwrap();
    assert_eq!(recs, vec![mem_info(1000, 1), mem_info(5100, 3)]);
    assert_eq!(sum.unknown_skipped, 1);
    // Where it is, said: the warning (and --strict's refusal) named no place.
    assert_eq!((sum.first_unknown_at, sum.first_unknown_tag), (Some(at), Some(200)));
    let w = sum.warnings(std::path::Path::new("t.mtrace"));
    assert!(w[0].ends_with(&format!("; it is tag 200 at byte {at}")), "{w:?}");
    // The unknown frame's bytes are its own, not fields of a known record.
    assert_eq!((sum.extended_records, sum.extended_header), (0, false));
    assert!(!sum.truncated);
}

#[test]
fn appended_fields_inside_a_known_frame_are_ignored() {
    let h = Header::new("t", "0", Level::Device);
    let mut bytes = binary(&h, &[]);
    let at = bytes.len();
    let mut frame = Vec::new();
    encode_frame(&mut PrefixState::default(), &mem_info(7, 9), &mut frame).unwrap();
    frame[1] += 3;
    frame.extend_from_slice(&[1, 42, 0]); // e.g. a new Option field, Some(42), then more
    bytes.extend_from_slice(&frame);
    let (_, recs, sum) = read_all(&bytes).unwrap();
    assert_eq!(recs, vec![mem_info(7, 9)]);
    // Ignored, but counted and said: they were dropped without a word.
    assert_eq!((sum.extended_records, sum.extended_header), (1, false));
    let w = sum.warnings(std::path::Path::new("t.mtrace"));
    assert_eq!(
        w,
        [format!(
            "t.mtrace: 1 record carried fields this version does not read (written by a newer memtrace?): those \
             fields were ignored; the record is at byte {at}"
        )]
    );
}

/// The hot kinds (read by `fastread`, not the derived decoders) count appended fields alike, on
/// every read path: a record at a time from a stream, and in batches from a mapped file.
#[test]
fn appended_fields_of_the_hot_kinds_are_counted_on_every_path() {
    let h = Header::new("t", "0", Level::Allocator);
    let recs = vec![
        Record {
            ts_ns: Some(1),
            tid: None,
            device: Some(0),
            event: Event::Alloc(Alloc::device(4096, 512, Api::CudaMalloc, Origin::Request)),
        },
        Record {
            ts_ns: Some(2),
            tid: None,
            device: Some(0),
            event: Event::Free(Free::device(4096, Api::CudaFree, Origin::Request, FreeStage::Immediate)),
        },
        Record {
            ts_ns: Some(3),
            tid: None,
            device: Some(0),
            event: Event::KernelLaunch(KernelLaunch::succeeded(Api::__CudaLaunchKernel, None, [1, 1, 1], [1, 1, 1], 0)),
        },
    ];
    let mut bytes = binary(&h, &[]);
    let mut state = PrefixState::default();
    // Each record twice: as written, and with a byte appended to its body.
    let mut first = None;
    for r in &recs {
        encode_frame(&mut state, r, &mut bytes).unwrap();
        let at = bytes.len();
        first = first.or(Some(at as u64));
        encode_frame(&mut state, r, &mut bytes).unwrap();
        bytes[at + 1] += 1;
        bytes.push(0);
    }
    let (_, got, sum) = read_all(&bytes).unwrap();
    assert_eq!(got.len(), 6);
    assert_eq!((sum.extended_records, sum.first_extended_at), (3, first));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.mtrace");
    std::fs::write(&path, &bytes).unwrap();
    // Batches of 4 and of 1: the first is found in the first batch, and in a later one.
    for max in [4, 1] {
        let mut reader = Reader::open(&path).unwrap();
        let mut batch = Vec::new();
        while reader.next_records(&mut batch, max, &mut |r| r).unwrap() {}
        assert_eq!(batch.len(), 6);
        let sum = reader.summary();
        assert_eq!((sum.extended_records, sum.first_extended_at), (3, first), "batches of {max}");
    }
}

#[test]
fn appended_header_fields_are_ignored() {
    let h = Header::new("t", "0", Level::Device);
    let bytes = binary(&h, &[mem_info(1, 1)]);
    // Rebuild with a longer header frame: the header body + 5 unknown bytes.
    let pre = trace::codec::PREAMBLE_LEN;
    let (len, n) = trace::codec::get_uvarint(&bytes[pre..]).unwrap();
    let body_start = pre + n;
    let body_end = body_start + len as usize;
    let mut v = bytes[..pre].to_vec();
    trace::codec::put_uvarint(&mut v, len + 5);
    v.extend_from_slice(&bytes[body_start..body_end]);
    v.extend_from_slice(&[9, 9, 9, 9, 9]);
    v.extend_from_slice(&bytes[body_end..]);
    let (h2, recs, sum) = read_all(&v).unwrap();
    assert_eq!(h2, h);
    assert_eq!(recs, vec![mem_info(1, 1)]);
    assert_eq!((sum.extended_records, sum.extended_header), (0, true));
    assert!(sum.warnings(std::path::Path::new("t")).iter().any(|w| w.contains("the header carried fields")));
}

#[test]
fn unknown_json_kind_and_fields_are_skipped() {
    let input = concat!(
        "{\"kind\":\"header\",\"format_version\":1,\"producer\":{\"name\":\"p\",\"version\":\"1\"},\"level\":\"device\",\"new_header_field\":[1,2]}\n",
        "{\"kind\":\"gpu_temperature\",\"celsius\":71}\n",
        "\n",
        "{\"kind\":\"mem_info\",\"ts_ns\":4,\"free\":1,\"total\":2,\"new_field\":{\"x\":1}}\n",
        "{\"kind\":\"another_future_kind\"}\n",
    );
    let (h, recs, sum) = read_all(input.as_bytes()).unwrap();
    assert_eq!(h.producer.name, "p");
    assert_eq!(
        recs,
        vec![Record { ts_ns: Some(4), tid: None, device: None, event: Event::MemInfo(MemInfo { free: 1, total: 2 }) }]
    );
    assert_eq!(sum.unknown_skipped, 2);
    assert_eq!((sum.first_unknown_at, sum.first_unknown_tag), (Some(2), None));
    assert!(sum.warnings(std::path::Path::new("t")).iter().any(|w| w.ends_with("; the first is at line 2")));
    // The unknown keys of a known record, and of the header, are counted, and the first of each
    // named: a misspelt key is read as one.
    assert_eq!((sum.extended_records, sum.extended_header, sum.first_extended_at), (1, true, Some(4)));
    assert_eq!(
        sum.warnings(std::path::Path::new("t")).last().unwrap(),
        "t: the header and 1 record carried fields this version does not read (misspelt, or written by a newer \
         memtrace?): those fields were ignored; the header's first is \"new_header_field\"; the record is at line 4, \
         key \"new_field\""
    );
}

/// A misspelt optional key is read as absent (its default), and the warning names it where it
/// first stands: an escaped name as the text it stands for, a long one cut.
#[test]
fn the_first_unread_json_key_is_named() {
    let header = "{\"kind\":\"header\",\"format_version\":1,\"producer\":{\"name\":\"p\",\"version\":\"1\"},\"level\":\"device\"}\n";
    let long = "k".repeat(50);
    let check = |lines: &[&str], expect: &str| {
        let input = format!("{header}{}\n", lines.join("\n"));
        let (_, _, sum) = read_all(input.as_bytes()).unwrap();
        let w = sum.warnings(std::path::Path::new("t.jsonl"));
        assert!(w.last().is_some_and(|w| w.ends_with(expect)), "{lines:?}: {w:?}");
    };
    let alloc = |extra: &str| {
        format!(r#"{{"kind":"alloc","ts_ns":1,"addr":4096,"size":512,{extra}"api":"cudaMalloc","origin":"request"}}"#)
    };
    check(&[&alloc(r#""strem":7,"#)], "; the record is at line 2, key \"strem\"");
    check(
        &[&alloc(""), &alloc(r#""strem":7,"#), &alloc(r#""b":1,"#)],
        "; the first record is at line 3, key \"strem\"",
    );
    check(&[&alloc(r#""\u0073trem":7,"#)], "; the record is at line 2, key \"strem\"");
    check(&[&alloc(&format!(r#""{long}":7,"#))], &format!("; the record is at line 2, key \"{}…\"", "k".repeat(40)));
    check(&[&alloc(r#""ẞ\"q":7,"#)], "; the record is at line 2, key \"ẞ\\\"q\"");
    // Cut at a character boundary: 39 bytes, then a 3-byte character that does not fit.
    let cut = format!("{}ẞ", "k".repeat(39));
    check(&[&alloc(&format!(r#""{cut}":7,"#))], &format!("; the record is at line 2, key \"{}…\"", "k".repeat(39)));
}

/// The golden files, every kind and every header field in both forms, carry nothing the reader
/// does not read: a record as this version writes it is never counted.
#[test]
fn records_as_written_carry_no_unread_fields() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/trace-v1");
    for name in ["all-kinds.mtrace", "all-kinds.jsonl", "appended-kinds.mtrace", "appended-kinds.jsonl"] {
        let (_, recs, sum) = read_all(&std::fs::read(dir.join(name)).unwrap()).unwrap();
        assert!(!recs.is_empty(), "{name}");
        assert_eq!((sum.extended_records, sum.extended_header), (0, false), "{name}");
    }
}

#[test]
fn unknown_api_codes_survive_both_forms() {
    let rec =
        Record::bare(Event::PoolTrim(PoolTrim { pool: 1, min_bytes_to_keep: 0, api: Api::from_code(4242), result: 0 }));
    let h = Header::new("t", "0", Level::Device);
    let (_, via_bin, _) = read_all(&binary(&h, std::slice::from_ref(&rec))).unwrap();
    assert_eq!(via_bin, vec![rec.clone()]);
    let line = serde_json::to_string(&rec).unwrap();
    assert!(line.contains("\"api\":\"unknown:4242\""), "{line}");
}

/// A JSON Lines `api` name this version does not know (a newer writer's) failed the whole file,
/// where the binary form keeps an unknown code (FORMAT.md §1.9 rule 3): it is kept as
/// [`Api::UNKNOWN_NAME`]; a name no entry point can have (empty, not an identifier) or one that is not a string is
/// still refused.
#[test]
fn unknown_api_names_in_json_lines_are_kept() {
    let header = r#"{"kind":"header","format_version":1,"producer":{"name":"p","version":"1"},"level":"device"}"#;
    let check = |api: &str, expect: Result<Api, &str>| {
        let line = format!(r#"{{"kind":"pool_trim","pool":1,"min_bytes_to_keep":0,"api":{api},"result":0}}"#);
        let got = read_all(format!("{header}\n{line}\n").as_bytes()).map(|(_, recs, _)| match &recs[0].event {
            Event::PoolTrim(p) => p.api,
            e => panic!("{e:?}"),
        });
        match (got, expect) {
            (Ok(a), Ok(b)) => assert_eq!(a, b, "{api}"),
            (Err(e), Err(words)) => assert!(e.to_string().contains(words), "{api}: {e}"),
            (got, expect) => panic!("{api}: got {got:?}, expected {expect:?}"),
        }
    };
    check(r#""cudaMemPoolTrimTo""#, Ok(Api::CudaMemPoolTrimTo));
    check(r#""unknown:4242""#, Ok(Api::Unknown(4242)));
    // Code 0, which no API has: the line gives no code.
    check(r#""cudaMemPoolTrimToNew""#, Ok(Api::Unknown(0)));
    check(r#""""#, Err("field `api`"));
    check(r#""unknown:x""#, Err("field `api`"));
    check("7", Err("field `api`"));
}

/// Records naming APIs this version does not know were counted by memsim alone (its input
/// module), so memest and the trainer read them without a word: the reader counts them in its
/// `Summary` and words the warning every tool prints, in both forms and every reading path.
#[test]
fn records_of_unknown_apis_are_counted_and_said_by_the_reader() {
    let dir = tempfile::tempdir().unwrap();
    let h = Header::new("t", "0", Level::Allocator);
    let alloc = |addr, api| Record::bare(Event::Alloc(Alloc::device(addr, 512, api, Origin::Request)));
    let free = |addr, api| Record::bare(Event::Free(Free::device(addr, api, Origin::Request, FreeStage::Immediate)));
    let recs = [
        alloc(4096, Api::Allocator),
        alloc(8192, Api::from_code(4242)),
        alloc(16384, Api::from_code(4243)),
        free(8192, Api::UNKNOWN_NAME),
        free(4096, Api::Allocator),
    ];
    let bin = binary(&h, &recs);
    let (_, _, s) = read_all(&bin).unwrap();
    assert_eq!((s.unknown_apis, s.unknown_api_names, s.first_unknown_api), (3, 1, Some(4242)));
    assert!(!s.incomplete());
    // Batched, from a mapped file: the same counts.
    let path = dir.path().join("t.mtrace");
    std::fs::write(&path, &bin).unwrap();
    let mut r = Reader::open(&path).unwrap();
    let mut out = Vec::new();
    while r.next_records(&mut out, 2, &mut |r| r).unwrap() {}
    assert_eq!(r.summary(), s);
    // In the binary form code 0 is a code (a conversion wrote unknown:0); one line says all.
    let w = s.warnings(std::path::Path::new("t.mtrace"));
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(w[0].starts_with("t.mtrace: 3 records name APIs this version does not know"), "{w:?}");
    assert!(w[0].ends_with("3 by code, the first: unknown:4242"), "{w:?}");

    // In JSON Lines, code 0 is a name the reader does not know, whose name is lost.
    let header = r#"{"kind":"header","format_version":1,"producer":{"name":"p","version":"1"},"level":"device"}"#;
    let line = r#"{"kind":"pool_trim","pool":1,"min_bytes_to_keep":0,"api":"cudaMemPoolTrimToNew","result":0}"#;
    let (_, _, s) = read_all(format!("{header}\n{line}\n").as_bytes()).unwrap();
    assert_eq!((s.unknown_apis, s.unknown_api_names, s.first_unknown_api), (1, 1, None));
    let w = s.warnings(std::path::Path::new("t.jsonl"));
    assert_eq!(
        w,
        ["t.jsonl: 1 record names an API this version does not know (written by a newer memtrace?): the records \
          are read, with their API unknown (`unknown` in memsim stats' calls); 1 by a name, which is not kept: read \
          as unknown:0, and written as unknown:0 by a conversion"]
    );
    // Known APIs only: nothing said.
    let (_, _, s) = read_all(&binary(&h, &recs[..1])).unwrap();
    assert_eq!((s.unknown_apis, s.warnings(std::path::Path::new("t")).len()), (0, 0));
}
