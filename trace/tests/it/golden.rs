//! The committed format-v1 files decode to the expected records and re-encode byte for byte.
//!
//! `MEMTRACE_REGEN_GOLDEN=1 cargo test -p memtrace-trace --test tests golden` rewrites them
//! (and the test then still checks what it wrote). Do that only for a deliberate format change,
//! in a new `trace-vN/` directory: old files must keep parsing.

use std::collections::BTreeMap;
use std::path::PathBuf;

use trace::*;

use crate::support::{binary, jsonl, read_all};

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/trace-v1")
}

fn header() -> Header {
    let mut h = Header::new("memtrace-trace golden", "1", Level::Allocator);
    h.caching_disabled = false;
    h.pid = Some(4_294_967_295);
    h.start_wall_ns = Some(1_767_225_600_000_000_000);
    h.clock_origin_ns = Some(123_456_789);
    h.command_line = vec!["python".into(), "train.py".into(), "--naïve=✓".into()];
    h.host_name = Some("gpu-node-01".into());
    h.env = BTreeMap::from([("PYTORCH_CUDA_ALLOC_CONF".into(), "expandable_segments:True".into())]);
    h.cuda_driver_version = Some(13000);
    h.cuda_runtime_version = Some(12080);
    h.devices = vec![
        DeviceInfo {
            index: 0,
            name: Some("NVIDIA H100 80GB HBM3".into()),
            total_memory: Some(85_032_435_712),
            sm_count: Some(132),
            compute_capability: Some((9, 0)),
        },
        DeviceInfo { index: 1, name: None, total_memory: None, sm_count: None, compute_capability: None },
    ];
    h.allocator_settings = Some("{\"expandable_segments\": true}".into());
    h.synthetic_addresses = false;
    h.metadata = BTreeMap::from([("model".into(), "gpt2-small".into()), ("batch".into(), "8".into())]);
    h
}

/// One record of every kind, plus edge values: u64::MAX sizes, negative streams, absent optional
/// fields, unicode names, unknown API codes.
fn records() -> Vec<Record> {
    let r =
        |ts: Option<u64>, tid: Option<u32>, device: Option<u32>, event: Event| Record { ts_ns: ts, tid, device, event };
    vec![
        r(
            Some(0),
            Some(1234),
            Some(0),
            Event::Name(NameDef {
                id: 0,
                text: "void at::native::vectorized_elementwise_kernel<4>(…) — ünïcødé 🚀".into(),
            }),
        ),
        r(
            Some(5),
            Some(1234),
            None,
            Event::Stack(StackDef {
                id: 7,
                frames: vec![
                    Frame { filename: "train.py".into(), line: 42, name: "forward".into() },
                    Frame { filename: "".into(), line: u32::MAX, name: "??".into() },
                ],
            }),
        ),
        r(
            Some(1_000),
            Some(1234),
            Some(0),
            Event::Alloc(Alloc {
                addr: 0x7f3a_0000_0000,
                size: u64::MAX,
                stream: -1,
                mem: MemoryKind::Device,
                api: Api::Allocator,
                result: 0,
                origin: Origin::Request,
                category: Some(Category::OptimizerState),
                caller: Some(0),
                stack: Some(7),
            }),
        ),
        r(
            Some(900),
            Some(1234),
            Some(0),
            Event::Alloc(Alloc {
                addr: 0,
                size: 1 << 40,
                stream: i64::MIN,
                mem: MemoryKind::PinnedHost,
                api: Api::CudaHostAlloc,
                result: 2,
                origin: Origin::Outcome,
                category: None,
                caller: None,
                stack: None,
            }),
        ),
        r(
            Some(2_000),
            Some(99),
            Some(1),
            Event::Free(Free {
                addr: 0x7f3a_0000_0000,
                size: None,
                stream: 0x5555_0000_1234,
                mem: MemoryKind::Device,
                api: Api::Allocator,
                result: 0,
                origin: Origin::Request,
                stage: FreeStage::Requested,
                caller: None,
                stack: None,
            }),
        ),
        r(
            Some(2_001),
            Some(99),
            Some(1),
            Event::Free(Free {
                addr: 0x7f3a_0000_0000,
                size: Some(u64::MAX),
                stream: -7,
                mem: MemoryKind::Physical,
                api: Api::CuMemRelease,
                result: 0,
                origin: Origin::Outcome,
                stage: FreeStage::Completed,
                caller: Some(0),
                stack: Some(7),
            }),
        ),
        r(
            Some(3_000),
            None,
            Some(0),
            Event::Vmm(Vmm {
                op: VmmOp::Map,
                addr: 0x7f00_0000_0000,
                size: 2 << 20,
                handle: u64::MAX,
                offset: 0,
                api: Api::CuMemMap,
                result: 0,
                origin: Origin::Outcome,
                stream: -2,
                caller: None,
            }),
        ),
        r(
            Some(3_050),
            Some(1234),
            Some(0),
            Event::KernelLaunch(KernelLaunch {
                api: Api::__CudaLaunchKernel,
                name: Some(0),
                grid: [u32::MAX, 1, 1],
                block: [1024, 1, 1],
                shared_mem: 49_152,
                stream: 0,
                result: 0,
            }),
        ),
        r(
            Some(3_060),
            Some(1234),
            Some(0),
            Event::KernelLaunch(KernelLaunch {
                api: Api::from_code(4242),
                name: None,
                grid: [0, 0, 0],
                block: [0, 0, 0],
                shared_mem: 0,
                stream: -1,
                result: 1,
            }),
        ),
        r(
            None,
            None,
            Some(0),
            Event::KernelExec(KernelExec {
                start_ns: 3_100,
                end_ns: u64::MAX,
                name: Some(0),
                grid: [80, 1, 1],
                block: [256, 1, 1],
                registers_per_thread: u16::MAX,
                static_shared_mem: 0,
                dynamic_shared_mem: 49_152,
                stream: 7,
                correlation_id: u32::MAX,
            }),
        ),
        r(Some(4_000), None, Some(0), Event::MemInfo(MemInfo { free: 0, total: u64::MAX })),
        r(Some(5_000), Some(1234), None, Event::Marker(Marker { text: "iter:0".into() })),
        r(Some(5_001), Some(1234), None, Event::Marker(Marker { text: "".into() })),
        r(Some(6_000), Some(1234), Some(0), Event::Oom(Oom { size: u64::MAX, device_free: None, stream: -3 })),
        r(Some(6_001), Some(1234), Some(0), Event::Oom(Oom { size: 1, device_free: Some(0), stream: 0 })),
        r(Some(7_000), Some(1234), None, Event::Control(Control { op: ControlOp::EmptyCache })),
        r(
            Some(7_001),
            Some(1234),
            None,
            Event::Control(Control { op: ControlOp::SetMemoryFraction { fraction: 0.1 } }),
        ),
        r(Some(7_002), Some(1234), None, Event::Control(Control { op: ControlOp::ResetPeakStats })),
        r(
            Some(7_003),
            Some(1234),
            None,
            Event::Control(Control { op: ControlOp::RecordStream { addr: u64::MAX, stream: i64::MIN } }),
        ),
        r(
            Some(8_000),
            Some(1234),
            Some(0),
            Event::PoolTrim(PoolTrim {
                pool: 0xdead_beef,
                min_bytes_to_keep: 0,
                api: Api::CudaMemPoolTrimTo,
                result: 0,
            }),
        ),
        r(
            Some(9_000),
            None,
            Some(0),
            Event::SegmentState(SegmentState {
                at: StateAt::End,
                addr: 0x7f3a_0000_0000,
                total_size: 20 << 20,
                stream: -1,
                pool: SegmentPool::Large,
                is_expandable: true,
                pool_id: (i64::MIN, -1),
                stack: Some(7),
                blocks: vec![
                    BlockInfo {
                        addr: 0x7f3a_0000_0000,
                        size: 2 << 20,
                        requested_size: 1_999_999,
                        state: BlockState::ActiveAllocated,
                        stack: Some(7),
                    },
                    BlockInfo {
                        addr: 0x7f3a_0020_0000,
                        size: u64::MAX,
                        requested_size: 0,
                        state: BlockState::ActivePendingFree,
                        stack: None,
                    },
                    BlockInfo {
                        addr: 0x7f3a_0040_0000,
                        size: 512,
                        requested_size: 0,
                        state: BlockState::Inactive,
                        stack: None,
                    },
                ],
            }),
        ),
        r(
            Some(9_000),
            None,
            Some(0),
            Event::SegmentState(SegmentState {
                at: StateAt::Start,
                addr: 0,
                total_size: 0,
                stream: 0,
                pool: SegmentPool::Small,
                is_expandable: false,
                pool_id: (0, 0),
                stack: None,
                blocks: vec![],
            }),
        ),
        r(Some(9_500), None, None, Event::SnapshotPoint(SnapshotPoint { active_bytes: u64::MAX })),
        r(
            Some(u64::MAX),
            Some(u32::MAX),
            Some(u32::MAX),
            Event::ProcessExit(ProcessExit { status: None, signal: Some(9), lost_events: u64::MAX }),
        ),
        r(None, None, None, Event::ProcessExit(ProcessExit { status: Some(-1), signal: None, lost_events: 0 })),
    ]
}

/// Records of the kinds appended to version 1 after `all-kinds.*` was committed (those files must
/// not change): tag 16 `mem_activity`, with every op and pool kind, absent and present options.
fn appended_records() -> Vec<Record> {
    let r =
        |ts: Option<u64>, tid: Option<u32>, device: Option<u32>, event: Event| Record { ts_ns: ts, tid, device, event };
    let m = |op, memory_kind, addr, size, stream, correlation_id, pc, pool, pool_addr| {
        Event::MemActivity(MemActivity { op, memory_kind, addr, size, stream, correlation_id, pc, pool, pool_addr })
    };
    vec![
        r(
            Some(10_000),
            None,
            Some(0),
            m(
                MemActivityOp::Allocation,
                CuptiMemoryKind::Device,
                0x7f3a_0000_0000,
                2 << 20,
                None,
                17,
                0x7f00_1234,
                None,
                None,
            ),
        ),
        r(
            Some(10_500),
            None,
            Some(1),
            m(
                MemActivityOp::Allocation,
                CuptiMemoryKind::Device,
                (1 << 53) + 1,
                u64::MAX,
                Some(7),
                u32::MAX,
                0,
                Some(MemPoolKind::Local),
                Some(0x7f3b_0000_0000),
            ),
        ),
        r(
            Some(10_400),
            None,
            Some(0),
            m(MemActivityOp::Allocation, CuptiMemoryKind::Pinned, 0x2000, 1, None, 0, u64::MAX, None, None),
        ),
        r(
            Some(11_000),
            None,
            Some(1),
            m(
                MemActivityOp::Release,
                CuptiMemoryKind::Device,
                (1 << 53) + 1,
                u64::MAX,
                Some(-1),
                18,
                0,
                Some(MemPoolKind::Imported),
                Some(u64::MAX),
            ),
        ),
        r(None, None, None, m(MemActivityOp::Release, CuptiMemoryKind::Unknown, 0, 0, None, 0, 0, None, None)),
        r(
            Some(12_000),
            None,
            Some(0),
            m(
                MemActivityOp::Release,
                CuptiMemoryKind::ManagedStatic,
                0x7f3a_0000_0000,
                2 << 20,
                None,
                19,
                1,
                None,
                None,
            ),
        ),
    ]
}

fn check_file(name: &str, fresh: Vec<u8>) {
    check_file_of(name, fresh, records());
}

fn check_file_of(name: &str, fresh: Vec<u8>, expect: Vec<Record>) {
    let path = dir().join(name);
    if std::env::var_os("MEMTRACE_REGEN_GOLDEN").is_some_and(|v| v == "1") {
        std::fs::create_dir_all(dir()).unwrap();
        std::fs::write(&path, &fresh).unwrap();
    }
    let committed = std::fs::read(&path)
        .unwrap_or_else(|e| panic!("{}: {e}; run with MEMTRACE_REGEN_GOLDEN=1 to create it", path.display()));
    let (h, recs, sum) = read_all(&committed).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(h, header(), "{name}: header");
    assert_eq!(recs, expect, "{name}: records");
    assert!(!sum.truncated && sum.unknown_skipped == 0, "{name}: {sum:?}");
    assert!(committed == fresh, "{name}: re-encoding no longer reproduces the committed bytes");
}

/// `Event::kind` reads `Event::KINDS` by tag: each kind it gives is the one the JSON Lines form
/// writes (serde's renames), for a record of every kind.
#[test]
fn every_kind_is_what_json_lines_writes() {
    for r in records().iter().chain(&appended_records()) {
        let mut line = Vec::new();
        trace::jsonl::write_record_line(r, &mut line).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&line).unwrap();
        assert_eq!(v["kind"], r.event.kind(), "{v}");
    }
}

#[test]
fn golden_covers_every_kind() {
    let kinds: std::collections::BTreeSet<&str> =
        records().iter().chain(&appended_records()).map(|r| r.event.kind()).collect();
    assert_eq!(kinds, Event::KINDS.into_iter().collect());
}

#[test]
fn golden_binary() {
    check_file("all-kinds.mtrace", binary(&header(), &records()));
}

#[test]
fn golden_jsonl() {
    check_file("all-kinds.jsonl", jsonl(&header(), &records()));
}

#[test]
fn golden_appended_binary() {
    check_file_of("appended-kinds.mtrace", binary(&header(), &appended_records()), appended_records());
}

#[test]
fn golden_appended_jsonl() {
    check_file_of("appended-kinds.jsonl", jsonl(&header(), &appended_records()), appended_records());
}

/// What a reader from before tag 16 sees in the appended file: every frame skipped by its
/// length, none misread.
#[test]
fn golden_appended_frames_tile_the_file() {
    let bytes = std::fs::read(dir().join("appended-kinds.mtrace")).unwrap();
    let bounds = crate::support::frame_bounds(&bytes);
    assert_eq!(bounds.len() - 1, appended_records().len());
    assert!(bounds[..bounds.len() - 1].iter().all(|&b| bytes[b] == 16));
}
