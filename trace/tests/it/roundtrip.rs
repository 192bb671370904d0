//! Every event kind survives binary, JSON Lines, and binary → JSON Lines → binary.

use proptest::prelude::*;
use trace::*;

use crate::strategies::{header, record};
use crate::support::{binary, jsonl, read_all};

/// Reads `bytes` back and checks it gives `header` and `records`, whole (not truncated, every
/// byte read), in `format`. Returns the summary for further checks.
fn reads_back(bytes: &[u8], header: &Header, records: &[Record], format: Format) -> Result<Summary, TestCaseError> {
    let (h2, recs2, sum) = read_all(bytes).unwrap();
    prop_assert_eq!(&h2, header);
    prop_assert_eq!(&recs2[..], records);
    prop_assert!(!sum.truncated);
    prop_assert_eq!(sum.bytes_read, bytes.len() as u64);
    prop_assert_eq!(sum.format, format);
    Ok(sum)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn binary_round_trip(h in header(), recs in proptest::collection::vec(record(), 0..24)) {
        let bytes = binary(&h, &recs);
        let sum = reads_back(&bytes, &h, &recs, Format::Binary)?;
        prop_assert_eq!(sum.records, recs.len() as u64);
    }

    #[test]
    fn jsonl_round_trip(h in header(), recs in proptest::collection::vec(record(), 0..24)) {
        let bytes = jsonl(&h, &recs);
        reads_back(&bytes, &h, &recs, Format::Jsonl)?;
    }

    #[test]
    fn binary_to_jsonl_to_binary_is_byte_identical(h in header(), recs in proptest::collection::vec(record(), 0..24)) {
        let bin = binary(&h, &recs);
        let (h1, r1, _) = read_all(&bin).unwrap();
        let json = jsonl(&h1, &r1);
        let (h2, r2, _) = read_all(&json).unwrap();
        prop_assert_eq!(binary(&h2, &r2), bin);
    }

    /// The derived serde path (flatten + internal tag) is what other crates use on single
    /// records; it must agree with the line reader, including u64 above 2^53 and negative i64.
    #[test]
    fn serde_derive_agrees_with_line_reader(rec in record()) {
        let line = serde_json::to_string(&rec).unwrap();
        let via_derive: Record = serde_json::from_str(&line).unwrap();
        prop_assert_eq!(&via_derive, &rec);
        let via_reader = trace::jsonl::parse_record_line(line.as_bytes(), 1).unwrap();
        prop_assert_eq!(via_reader.as_ref(), Some(&rec));
    }
}

#[test]
fn big_integers_stay_json_integers() {
    let rec = Record {
        ts_ns: Some(u64::MAX),
        tid: None,
        device: None,
        event: Event::Alloc(Alloc {
            addr: (1 << 53) + 1,
            size: u64::MAX,
            stream: i64::MIN,
            mem: MemoryKind::Device,
            api: Api::CudaMalloc,
            result: -1,
            origin: Origin::Outcome,
            category: None,
            caller: None,
            stack: None,
        }),
    };
    let mut buf = Vec::new();
    trace::jsonl::write_record_line(&rec, &mut buf).unwrap();
    let text = String::from_utf8(buf).unwrap();
    assert_eq!(
        text,
        "{\"ts_ns\":18446744073709551615,\"kind\":\"alloc\",\"addr\":9007199254740993,\
         \"size\":18446744073709551615,\"stream\":-9223372036854775808,\"mem\":\"device\",\
         \"api\":\"cudaMalloc\",\"result\":-1,\"origin\":\"outcome\"}\n"
    );
    assert_eq!(trace::jsonl::parse_record_line(text.trim_end().as_bytes(), 1).unwrap(), Some(rec));
}

#[test]
fn json_writer_refuses_non_finite_fraction() {
    let h = Header::new("t", "0", Level::Allocator);
    let mut w = JsonlWriter::new(Vec::new(), &h).unwrap();
    let bad = Record::bare(Event::Control(Control { op: ControlOp::SetMemoryFraction { fraction: f64::NAN } }));
    let err = w.write(&bad).unwrap_err().to_string();
    assert!(err.contains("not a finite number"), "{err}");
    assert_eq!(w.events_written(), 0);
    // The binary form carries it exactly.
    let (_, recs, _) = read_all(&binary(&h, std::slice::from_ref(&bad))).unwrap();
    assert!(matches!(&recs[0].event,
        Event::Control(Control { op: ControlOp::SetMemoryFraction { fraction } }) if fraction.is_nan()));
}
