//! `memsim stats` on CUPTI memory records: the `cupti_memory` JSON object, its text lines, and
//! their absence from traces without such records.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};
use trace::{
    Alloc, Api, CuptiMemoryKind, Event, Free, FreeStage, Header, Level, MemActivity, MemActivityOp, Origin, Record,
};

use crate::support::{memsim_ok, write_records};

fn alloc(ts: u64, addr: u64, size: u64) -> Record {
    Record {
        ts_ns: Some(ts),
        tid: Some(1),
        device: None,
        event: Event::Alloc(Alloc::device(addr, size, Api::CudaMalloc, Origin::Outcome)),
    }
}

fn free(ts: u64, addr: u64) -> Record {
    Record {
        ts_ns: Some(ts),
        tid: Some(1),
        device: None,
        event: Event::Free(Free::device(addr, Api::CudaFree, Origin::Outcome, FreeStage::Immediate)),
    }
}

fn cupti(ts: u64, op: MemActivityOp, memory_kind: CuptiMemoryKind, addr: u64, size: u64) -> Record {
    let m = MemActivity { correlation_id: 1, ..MemActivity::new(op, memory_kind, addr, size) };
    Record { ts_ns: Some(ts), tid: None, device: Some(0), event: Event::MemActivity(m) }
}

fn write(dir: &Path, name: &str, records: &[Record]) -> PathBuf {
    write_records(dir, name, &Header::new("libmemtrace", "0", Level::Device), records)
}

const MIB: u64 = 1 << 20;

/// Interposition saw 3 cudaMallocs; CUPTI (flushed at exit, so last in the file) reports 2 of
/// them exactly, one with another size, a pinned buffer interposition never saw, and releases.
fn records() -> Vec<Record> {
    use CuptiMemoryKind::{Device, Pinned};
    use MemActivityOp::{Allocation, Release};
    vec![
        alloc(10, 0xa000_0000, 4 * MIB),
        alloc(20, 0xb000_0000, 2 * MIB),
        free(30, 0xa000_0000),
        alloc(40, 0xc000_0000, MIB),
        cupti(11, Allocation, Device, 0xa000_0000, 4 * MIB),
        cupti(21, Allocation, Device, 0xb000_0000, 2 * MIB),
        cupti(25, Allocation, Pinned, 0x7000, 4096),
        cupti(31, Release, Device, 0xa000_0000, 4 * MIB),
        cupti(41, Allocation, Device, 0xc000_0000, 2 * MIB),
    ]
}

#[test]
fn stats_reports_cupti_memory() {
    let dir = tempfile::tempdir().unwrap();
    let t = write(dir.path(), "cupti.mtrace", &records());
    let v: Value = serde_json::from_str(&memsim_ok(&["stats", t.to_str().unwrap(), "--json"])).unwrap();
    assert_eq!(
        v["cupti_memory"],
        json!({
            "allocations": 4,
            "releases": 1,
            "allocations_by_kind": { "device": 3, "pinned": 1 },
            "device_bytes_allocated": 8 * MIB,
            "peak_live_device_bytes": 6 * MIB,
            "live_device_bytes": 4 * MIB,
            "unknown_releases": 0,
            "device_allocations": 3,
            "device_allocations_matched": 2
        })
    );
    // The interposition counts are CUPTI-free.
    assert_eq!((v["allocs"].as_u64(), v["frees"].as_u64()), (Some(3), Some(1)));
    assert_eq!(v["peak_live_device_bytes"], 6 * MIB);
    assert_eq!(v["kinds"]["mem_activity"], 5);

    let text = memsim_ok(&["stats", t.to_str().unwrap()]);
    for line in [
        "  CUPTI memory      4 allocations (device 3, pinned 1), 1 releases",
        "    device bytes    8.00 MiB allocated, peak live 6.00 MiB (6291456 B)",
        "    cross-check     2 of 3 CUPTI device allocations match a traced allocation (address and size)",
    ] {
        assert!(text.lines().any(|l| l == line), "missing {line:?} in:\n{text}");
    }
}

#[test]
fn stats_without_cupti_memory_says_nothing_of_it() {
    let dir = tempfile::tempdir().unwrap();
    let plain: Vec<Record> = records().into_iter().filter(|r| !matches!(r.event, Event::MemActivity(_))).collect();
    let t = write(dir.path(), "plain.mtrace", &plain);
    let v: Value = serde_json::from_str(&memsim_ok(&["stats", t.to_str().unwrap(), "--json"])).unwrap();
    assert!(v.get("cupti_memory").is_none(), "{v}");
    assert!(!memsim_ok(&["stats", t.to_str().unwrap()]).contains("CUPTI memory"));
}
