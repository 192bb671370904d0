//! Shared helpers: encode a trace in memory, read one back completely.

use trace::*;

pub fn binary(header: &Header, records: &[Record]) -> Vec<u8> {
    let mut w = BinaryWriter::new(Vec::new(), header).expect("binary writer");
    for r in records {
        w.write(r).expect("binary write");
    }
    w.finish().expect("binary finish")
}

pub fn jsonl(header: &Header, records: &[Record]) -> Vec<u8> {
    let mut w = JsonlWriter::new(Vec::new(), header).expect("jsonl writer");
    for r in records {
        w.write(r).expect("jsonl write");
    }
    w.finish().expect("jsonl finish")
}

/// Everything a reader yields: header, records and summary, or the first error.
pub fn read_all(bytes: &[u8]) -> Result<(Header, Vec<Record>, Summary), TraceError> {
    let mut r = open_reader(bytes)?;
    let mut out = Vec::new();
    while let Some(rec) = r.next_record() {
        out.push(rec?);
    }
    // Iteration stays ended.
    assert!(r.next_record().is_none(), "reader yielded a record after its end");
    Ok((r.header().clone(), out, r.summary()))
}

/// A small trace touching several prefix combinations.
pub fn small_trace() -> (Header, Vec<Record>) {
    let mut h = Header::new("tests", "1", Level::Allocator);
    h.pid = Some(42);
    let name = Record {
        ts_ns: Some(10),
        tid: Some(7),
        device: None,
        event: Event::Name(NameDef { id: 1, text: "ampere_sgemm_128x64_nn".into() }),
    };
    let launch = |ts| Record {
        ts_ns: Some(ts),
        tid: Some(7),
        device: Some(0),
        event: Event::KernelLaunch(KernelLaunch::succeeded(
            Api::__CudaLaunchKernel,
            Some(1),
            [128, 1, 1],
            [256, 1, 1],
            0,
        )),
    };
    let alloc = Record {
        ts_ns: Some(500),
        tid: Some(8),
        device: Some(0),
        event: Event::Alloc(Alloc {
            addr: 0x7f00_0000_0000,
            size: 2 << 20,
            stream: -1,
            mem: MemoryKind::Device,
            api: Api::Allocator,
            result: 0,
            origin: Origin::Request,
            category: Some(Category::Activation),
            caller: None,
            stack: None,
        }),
    };
    let exit = Record::bare(Event::ProcessExit(ProcessExit { status: Some(0), signal: None, lost_events: 0 }));
    (h, vec![name, launch(100), launch(220), alloc, launch(240), exit])
}

/// Byte offsets where each event frame starts, plus the end; from the frame lengths.
pub fn frame_bounds(bytes: &[u8]) -> Vec<usize> {
    let mut pos = trace::codec::PREAMBLE_LEN;
    let (hl, n) = trace::codec::get_uvarint(&bytes[pos..]).expect("header length");
    pos += n + hl as usize;
    let mut bounds = vec![pos];
    while pos < bytes.len() {
        let (len, n) = trace::codec::get_uvarint(&bytes[pos + 1..]).expect("frame length");
        pos += 1 + n + len as usize;
        bounds.push(pos);
    }
    assert_eq!(pos, bytes.len(), "frames must tile the file");
    bounds
}
