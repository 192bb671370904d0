//! Proptest strategies covering every event kind, with edge values over-represented.

use proptest::collection::vec;
use proptest::option;
use proptest::prelude::*;
use trace::*;

fn u64_edge() -> impl Strategy<Value = u64> {
    // 0..300 and the u32 range also reach bincode's 1-, 3- and 5-byte varint widths.
    prop_oneof![
        Just(0u64),
        Just(u64::MAX),
        Just(1u64 << 53),
        Just((1u64 << 53) + 1),
        0u64..300,
        0u64..=u64::from(u32::MAX),
        any::<u64>()
    ]
}

fn i64_edge() -> impl Strategy<Value = i64> {
    prop_oneof![
        Just(0i64),
        Just(-1i64),
        Just(i64::MIN),
        Just(i64::MAX),
        -300i64..300,
        -(1i64 << 31)..(1i64 << 31),
        any::<i64>()
    ]
}

fn u32_edge() -> impl Strategy<Value = u32> {
    prop_oneof![Just(0u32), Just(u32::MAX), 0u32..300, any::<u32>()]
}

fn text() -> impl Strategy<Value = String> {
    prop_oneof![Just(String::new()), "[a-z_:0-9]{1,12}", "\\PC{0,16}", Just("ünïcødé ✓ 🚀 \"q\" \\ \n\t".to_string())]
}

pub fn api() -> impl Strategy<Value = Api> {
    prop_oneof![
        8 => proptest::sample::select(Api::ALL.to_vec()),
        // Codes no known API uses: what a newer producer might write.
        1 => (200u16..=u16::MAX).prop_map(Api::from_code),
    ]
}

fn origin() -> impl Strategy<Value = Origin> {
    prop_oneof![Just(Origin::Request), Just(Origin::Outcome)]
}

fn mem() -> impl Strategy<Value = MemoryKind> {
    proptest::sample::select(MemoryKind::ALL.to_vec())
}

fn dim3() -> impl Strategy<Value = [u32; 3]> {
    [u32_edge(), u32_edge(), u32_edge()]
}

/// A strategy for a struct from one strategy a field, each field named once beside its own: the
/// fields' strategies run as one tuple, in the order written.
macro_rules! fields {
    ($ty:ident { $($field:ident: $strategy:expr),+ $(,)? }) => {
        ($($strategy,)+).prop_map(|($($field,)+)| $ty { $($field),+ })
    };
}

fn alloc() -> impl Strategy<Value = Alloc> {
    fields!(Alloc {
        addr: u64_edge(),
        size: u64_edge(),
        stream: i64_edge(),
        mem: mem(),
        api: api(),
        result: any::<i32>(),
        origin: origin(),
        category: option::of(proptest::sample::select(Category::ALL.to_vec())),
        caller: option::of(u32_edge()),
        stack: option::of(u32_edge()),
    })
}

fn free() -> impl Strategy<Value = Free> {
    fields!(Free {
        addr: u64_edge(),
        size: option::of(u64_edge()),
        stream: i64_edge(),
        mem: mem(),
        api: api(),
        result: any::<i32>(),
        origin: origin(),
        stage: proptest::sample::select(vec![FreeStage::Immediate, FreeStage::Requested, FreeStage::Completed]),
        caller: option::of(u32_edge()),
        stack: option::of(u32_edge()),
    })
}

fn vmm() -> impl Strategy<Value = Vmm> {
    fields!(Vmm {
        op: proptest::sample::select(vec![
            VmmOp::Reserve,
            VmmOp::AddressFree,
            VmmOp::Map,
            VmmOp::Unmap,
            VmmOp::SetAccess
        ]),
        addr: u64_edge(),
        size: u64_edge(),
        handle: u64_edge(),
        offset: u64_edge(),
        api: api(),
        result: any::<i32>(),
        origin: origin(),
        stream: i64_edge(),
        caller: option::of(u32_edge()),
    })
}

fn launch() -> impl Strategy<Value = KernelLaunch> {
    fields!(KernelLaunch {
        api: api(),
        name: option::of(u32_edge()),
        grid: dim3(),
        block: dim3(),
        shared_mem: u32_edge(),
        stream: i64_edge(),
        result: any::<i32>(),
    })
}

fn kernel_exec() -> impl Strategy<Value = KernelExec> {
    fields!(KernelExec {
        start_ns: u64_edge(),
        end_ns: u64_edge(),
        name: option::of(u32_edge()),
        grid: dim3(),
        block: dim3(),
        registers_per_thread: any::<u16>(),
        static_shared_mem: u32_edge(),
        dynamic_shared_mem: u32_edge(),
        stream: i64_edge(),
        correlation_id: u32_edge(),
    })
}

fn mem_activity() -> impl Strategy<Value = MemActivity> {
    fields!(MemActivity {
        op: prop_oneof![Just(MemActivityOp::Allocation), Just(MemActivityOp::Release)],
        memory_kind: proptest::sample::select(CuptiMemoryKind::ALL.to_vec()),
        addr: u64_edge(),
        size: u64_edge(),
        stream: option::of(i64_edge()),
        correlation_id: u32_edge(),
        pc: u64_edge(),
        pool: option::of(prop_oneof![Just(MemPoolKind::Local), Just(MemPoolKind::Imported)]),
        pool_addr: option::of(u64_edge()),
    })
}

fn frame() -> impl Strategy<Value = Frame> {
    (text(), u32_edge(), text()).prop_map(|(filename, line, name)| Frame { filename, line, name })
}

fn control_op() -> impl Strategy<Value = ControlOp> {
    prop_oneof![
        Just(ControlOp::EmptyCache),
        Just(ControlOp::ResetPeakStats),
        // Finite values only: JSON has no NaN or infinity (the JSON writer refuses them).
        prop_oneof![Just(0.0f64), Just(1.0), Just(-0.0), Just(f64::MIN_POSITIVE), Just(0.1), -1e300f64..1e300]
            .prop_map(|fraction| ControlOp::SetMemoryFraction { fraction }),
        (u64_edge(), i64_edge()).prop_map(|(addr, stream)| ControlOp::RecordStream { addr, stream }),
    ]
}

fn block() -> impl Strategy<Value = BlockInfo> {
    fields!(BlockInfo {
        addr: u64_edge(),
        size: u64_edge(),
        requested_size: u64_edge(),
        state: proptest::sample::select(vec![
            BlockState::ActiveAllocated,
            BlockState::ActivePendingFree,
            BlockState::Inactive,
        ]),
        stack: option::of(u32_edge()),
    })
}

fn segment() -> impl Strategy<Value = SegmentState> {
    fields!(SegmentState {
        at: prop_oneof![Just(StateAt::Start), Just(StateAt::End)],
        addr: u64_edge(),
        total_size: u64_edge(),
        stream: i64_edge(),
        pool: prop_oneof![Just(SegmentPool::Small), Just(SegmentPool::Large)],
        is_expandable: any::<bool>(),
        pool_id: (i64_edge(), i64_edge()),
        stack: option::of(u32_edge()),
        blocks: vec(block(), 0..4),
    })
}

/// Any event of any kind.
pub fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        alloc().prop_map(Event::Alloc),
        free().prop_map(Event::Free),
        vmm().prop_map(Event::Vmm),
        launch().prop_map(Event::KernelLaunch),
        kernel_exec().prop_map(Event::KernelExec),
        (u64_edge(), u64_edge()).prop_map(|(free, total)| Event::MemInfo(MemInfo { free, total })),
        text().prop_map(|text| Event::Marker(Marker { text })),
        (u32_edge(), text()).prop_map(|(id, text)| Event::Name(NameDef { id, text })),
        (u32_edge(), vec(frame(), 0..4)).prop_map(|(id, frames)| Event::Stack(StackDef { id, frames })),
        (u64_edge(), option::of(u64_edge()), i64_edge()).prop_map(|(size, device_free, stream)| Event::Oom(Oom {
            size,
            device_free,
            stream
        })),
        control_op().prop_map(|op| Event::Control(Control { op })),
        (u64_edge(), u64_edge(), api(), any::<i32>()).prop_map(|(pool, min_bytes_to_keep, api, result)| {
            Event::PoolTrim(PoolTrim { pool, min_bytes_to_keep, api, result })
        }),
        segment().prop_map(Event::SegmentState),
        u64_edge().prop_map(|active_bytes| Event::SnapshotPoint(SnapshotPoint { active_bytes })),
        (option::of(any::<i32>()), option::of(any::<i32>()), u64_edge())
            .prop_map(|(status, signal, lost_events)| Event::ProcessExit(ProcessExit { status, signal, lost_events })),
        mem_activity().prop_map(Event::MemActivity),
    ]
}

/// A record with any combination of shared fields.
pub fn record() -> impl Strategy<Value = Record> {
    (option::of(u64_edge()), option::of(prop_oneof![Just(7u32), u32_edge()]), option::of(0u32..3), event())
        .prop_map(|(ts_ns, tid, device, event)| Record { ts_ns, tid, device, event })
}

/// A header with optional fields present or not.
pub fn header() -> impl Strategy<Value = Header> {
    (
        text(),
        text(),
        any::<bool>(),
        option::of(any::<u32>()),
        option::of(u64_edge()),
        vec(text(), 0..3),
        proptest::collection::btree_map("[A-Z_]{1,8}", text(), 0..3),
        any::<bool>(),
    )
        .prop_map(|(name, version, level, pid, wall, cmd, env, synth)| {
            let mut h = Header::new(&name, &version, if level { Level::Allocator } else { Level::Device });
            h.pid = pid;
            h.start_wall_ns = wall;
            h.clock_origin_ns = wall.map(|w| w / 3);
            h.command_line = cmd;
            h.env = env;
            h.synthetic_addresses = synth;
            h.devices = vec![DeviceInfo {
                index: 0,
                name: Some("NVIDIA H100 80GB HBM3".into()),
                total_memory: Some(85_032_435_712),
                sm_count: Some(132),
                compute_capability: Some((9, 0)),
            }];
            h
        })
}
