//! Pins the on-disk variant index of every small enum (FORMAT.md §1.7) and a few API codes:
//! bincode numbers enum variants by declaration order, so reordering one must fail here.

use trace::*;

fn check<T: bincode::Encode>(values: &[T], name: &str) {
    for (i, v) in values.iter().enumerate() {
        let bytes = bincode::encode_to_vec(v, bincode::config::standard()).unwrap();
        assert_eq!(bytes[0] as usize, i, "{name} value #{i} must encode as variant index {i}");
    }
}

fn check_names<T: serde::Serialize>(values: &[T], names: &[&str]) {
    let got: Vec<String> =
        values.iter().map(|v| serde_json::to_value(v).unwrap().as_str().unwrap().to_owned()).collect();
    assert_eq!(got, names);
}

#[test]
fn enum_variant_indexes_are_pinned() {
    check(&[Level::Device, Level::Allocator], "Level");
    check(&[Origin::Request, Origin::Outcome], "Origin");
    // `ALL` in declaration order, pinned by JSON spelling: reordering the enum, or `ALL` with it,
    // fails.
    check(&MemoryKind::ALL, "MemoryKind");
    check_names(&MemoryKind::ALL, &["device", "pinned_host", "managed", "physical", "host_registered", "ipc_import"]);
    check(&Category::ALL, "Category");
    let categories = ["parameter", "gradient", "optimizer_state", "activation", "workspace", "input", "other"];
    check_names(&Category::ALL, &categories);
    check(&[FreeStage::Immediate, FreeStage::Requested, FreeStage::Completed], "FreeStage");
    check(&[VmmOp::Reserve, VmmOp::AddressFree, VmmOp::Map, VmmOp::Unmap, VmmOp::SetAccess], "VmmOp");
    check(&[StateAt::Start, StateAt::End], "StateAt");
    check(&[SegmentPool::Small, SegmentPool::Large], "SegmentPool");
    check(&[BlockState::ActiveAllocated, BlockState::ActivePendingFree, BlockState::Inactive], "BlockState");
    check(
        &[
            ControlOp::EmptyCache,
            ControlOp::SetMemoryFraction { fraction: 0.0 },
            ControlOp::ResetPeakStats,
            ControlOp::RecordStream { addr: 0, stream: 0 },
        ],
        "ControlOp",
    );
    check(&[MemActivityOp::Allocation, MemActivityOp::Release], "MemActivityOp");
    // The index is CUPTI's CUpti_ActivityMemoryKind code.
    check(&CuptiMemoryKind::ALL, "CuptiMemoryKind");
    for (code, k) in CuptiMemoryKind::ALL.iter().enumerate() {
        assert_eq!(CuptiMemoryKind::from_cupti(code as u32), *k);
        assert_eq!(serde_json::to_value(k).unwrap(), k.as_str());
    }
    assert_eq!(CuptiMemoryKind::from_cupti(8), CuptiMemoryKind::Unknown, "a code newer than this list");
    check(&[MemPoolKind::Local, MemPoolKind::Imported], "MemPoolKind");
}

#[test]
fn api_encodes_as_its_code() {
    let check = |api: Api, expect: &[u8]| {
        assert_eq!(bincode::encode_to_vec(api, bincode::config::standard()).unwrap(), expect, "{api}");
    };
    check(Api::Allocator, &[1]);
    check(Api::CudaMalloc, &[2]);
    check(Api::__CudaLaunchKernel, &[98]);
    check(Api::User, &[162]);
    check(Api::from_code(4242), &[0xFB, 0x92, 0x10]);
}
