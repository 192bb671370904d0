//! `Reader::next_records` (batches, the decoding thread's path) yields what `next_record` yields
//! one at a time: the same records in the same order, the same first error, the same summary,
//! for whole, cut, damaged and unknown-tag inputs, streamed or mapped from a file; also through a
//! `MapRecord` that takes allocations and frees field by field (`next_records_with`, a replay's).

use proptest::collection::vec;
use proptest::prelude::*;
use trace::*;

use crate::strategies::record;
use crate::support::{binary, frame_bounds, jsonl, read_all, small_trace};

/// What a reader gave: the records, or the error as text (errors are not `PartialEq`); and the
/// summary, where the bytes consumed when an error stopped it are also compared.
type Outcome = (Result<Vec<Record>, String>, Summary);

fn one_by_one<R: std::io::Read>(mut r: Reader<R>) -> Outcome {
    let mut out = Vec::new();
    while let Some(rec) = r.next_record() {
        match rec {
            Ok(rec) => out.push(rec),
            Err(e) => return (Err(e.to_string()), r.summary()),
        }
    }
    (Ok(out), r.summary())
}

/// A mapper that takes allocations and frees field by field, as a replay's does, and builds the
/// record they stand for; it counts the records it was given either way, and those given field
/// by field.
#[derive(Default)]
struct Fields {
    seen: usize,
    by_fields: usize,
}

impl MapRecord<Record> for Fields {
    fn record(&mut self, r: Record) -> Record {
        self.seen += 1;
        r
    }

    fn alloc(&mut self, ts_ns: Option<u64>, tid: Option<u32>, device: Option<u32>, a: Alloc) -> Record {
        self.seen += 1;
        self.by_fields += 1;
        Record { ts_ns, tid, device, event: Event::Alloc(a) }
    }

    fn free(&mut self, ts_ns: Option<u64>, tid: Option<u32>, device: Option<u32>, f: Free) -> Record {
        self.seen += 1;
        self.by_fields += 1;
        Record { ts_ns, tid, device, event: Event::Free(f) }
    }
}

/// Reads in batches of `batch`, through a mapper (a closure, or [`Fields`] with `fields`), as the
/// decoding thread does; checks that every batch but the last is full and that the reader stays
/// ended.
fn batched<R: std::io::Read>(mut r: Reader<R>, batch: usize, fields: bool) -> Outcome {
    let mut out = Vec::new();
    let seen = std::cell::Cell::new(0);
    let mut map = |rec: Record| {
        seen.set(seen.get() + 1);
        rec
    };
    let mut by_fields = Fields::default();
    let mut next = |r: &mut Reader<R>, out: &mut Vec<Record>| match fields {
        true => r.next_records_with(out, batch, &mut by_fields),
        false => r.next_records(out, batch, &mut map),
    };
    loop {
        let before = out.len();
        match next(&mut r, &mut out) {
            Ok(true) => assert_eq!(out.len() - before, batch, "a batch that did not end the input is full"),
            Ok(false) => break,
            Err(e) => return (Err(e.to_string()), r.summary()),
        }
    }
    let mut more = Vec::new();
    assert!(matches!(next(&mut r, &mut more), Ok(false)) && more.is_empty(), "reader restarted");
    assert_eq!(seen.get() + by_fields.seen, out.len(), "every record went through the mapper once");
    (Ok(out), r.summary())
}

/// Both ways of reading `bytes` agree, for several batch sizes.
fn agree(bytes: &[u8], what: &str) {
    let Ok(reader) = open_reader(bytes) else { return };
    let want = one_by_one(reader);
    for batch in [1, 2, 3, 7, 4096] {
        for fields in [false, true] {
            let got = batched(open_reader(bytes).expect("header read once already"), batch, fields);
            assert_eq!(got, want, "{what}, batches of {batch}, field by field: {fields}");
        }
    }
}

#[test]
fn batches_equal_single_records_for_every_cut() {
    let (h, recs) = small_trace();
    for bytes in [binary(&h, &recs), jsonl(&h, &recs)] {
        for cut in 0..=bytes.len() {
            agree(&bytes[..cut], &format!("cut at {cut}"));
        }
    }
}

#[test]
fn batches_equal_single_records_for_every_damaged_byte() {
    let (h, recs) = small_trace();
    let bytes = binary(&h, &recs);
    let first = frame_bounds(&bytes)[0];
    let mut checked_errors = 0;
    for at in first..bytes.len() {
        // 0: a tag 0 or a zero length; 0xff: an overlong varint or a bad enum; 200: an unknown tag.
        for v in [0u8, 0x7f, 0xff, 200] {
            let mut damaged = bytes.clone();
            damaged[at] = v;
            checked_errors += usize::from(read_all(&damaged).is_err());
            agree(&damaged, &format!("byte {at} set to {v:#x}"));
        }
    }
    assert!(checked_errors > 0, "some damage must be an error, or the errors went unchecked");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// A file is mapped and decoded in place (the loop in `next_records` runs over the whole of
    /// it): generated records of every kind read back equal to one at a time.
    #[test]
    fn a_mapped_file_reads_the_same_in_batches(recs in vec(record(), 0..200), batch in 1usize..64) {
        let (h, _) = small_trace();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.mtrace");
        std::fs::write(&path, binary(&h, &recs)).unwrap();
        let want = one_by_one(Reader::open(&path).unwrap());
        prop_assert_eq!(want.0.as_ref(), Ok(&recs));
        prop_assert_eq!(&batched(Reader::open(&path).unwrap(), batch, false), &want);
        prop_assert_eq!(batched(Reader::open(&path).unwrap(), batch, true), want);
    }
}

/// The field-by-field path is the one a binary trace's allocations and frees take once the
/// thread and device are the record before's (were it never taken, every test above would still
/// pass, and only the replay's speed would say so).
#[test]
fn a_binary_traces_allocations_and_frees_come_field_by_field() {
    let (h, mut recs) = small_trace();
    let Event::Alloc(a) = recs[3].event.clone() else { panic!("the small trace's fourth record is an allocation") };
    let free = Free {
        addr: a.addr,
        size: None,
        stream: a.stream,
        mem: a.mem,
        api: a.api,
        result: 0,
        origin: a.origin,
        stage: FreeStage::Immediate,
        caller: None,
        stack: None,
    };
    // After the small trace's allocation (a new thread: the general path), one more allocation
    // and a free on its thread and device.
    let at = |ts, event| Record { ts_ns: Some(ts), tid: Some(8), device: Some(0), event };
    recs.insert(4, at(510, Event::Alloc(Alloc { addr: a.addr + (4 << 20), ..a })));
    recs.insert(5, at(520, Event::Free(free)));
    let bytes = binary(&h, &recs);
    let mut r = open_reader(&bytes[..]).unwrap();
    let (mut out, mut map) = (Vec::new(), Fields::default());
    while r.next_records_with(&mut out, 4096, &mut map).unwrap() {}
    assert_eq!(out, recs);
    assert_eq!((map.seen, map.by_fields), (recs.len(), 2));
}
