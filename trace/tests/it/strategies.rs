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

fn alloc() -> impl Strategy<Value = Alloc> {
    (
        u64_edge(),
        u64_edge(),
        i64_edge(),
        mem(),
        api(),
        any::<i32>(),
        origin(),
        option::of(proptest::sample::select(Category::ALL.to_vec())),
        option::of(u32_edge()),
        option::of(u32_edge()),
    )
        .prop_map(|(addr, size, stream, mem, api, result, origin, category, caller, stack)| Alloc {
            addr,
            size,
            stream,
            mem,
            api,
            result,
            origin,
            category,
            caller,
            stack,
        })
}

fn free() -> impl Strategy<Value = Free> {
    (
        u64_edge(),
        option::of(u64_edge()),
        i64_edge(),
        mem(),
        api(),
        any::<i32>(),
        origin(),
        proptest::sample::select(vec![FreeStage::Immediate, FreeStage::Requested, FreeStage::Completed]),
        option::of(u32_edge()),
        option::of(u32_edge()),
    )
        .prop_map(|(addr, size, stream, mem, api, result, origin, stage, caller, stack)| Free {
            addr,
            size,
            stream,
            mem,
            api,
            result,
            origin,
            stage,
            caller,
            stack,
        })
}

fn vmm() -> impl Strategy<Value = Vmm> {
    (
        proptest::sample::select(vec![VmmOp::Reserve, VmmOp::AddressFree, VmmOp::Map, VmmOp::Unmap, VmmOp::SetAccess]),
        u64_edge(),
        u64_edge(),
        u64_edge(),
        u64_edge(),
        api(),
        any::<i32>(),
        origin(),
        i64_edge(),
        option::of(u32_edge()),
    )
        .prop_map(|(op, addr, size, handle, offset, api, result, origin, stream, caller)| Vmm {
            op,
            addr,
            size,
            handle,
            offset,
            api,
            result,
            origin,
            stream,
            caller,
        })
}

fn launch() -> impl Strategy<Value = KernelLaunch> {
    (api(), option::of(u32_edge()), dim3(), dim3(), u32_edge(), i64_edge(), any::<i32>()).prop_map(
        |(api, name, grid, block, shared_mem, stream, result)| KernelLaunch {
            api,
            name,
            grid,
            block,
            shared_mem,
            stream,
            result,
        },
    )
}

fn kernel_exec() -> impl Strategy<Value = KernelExec> {
    (
        u64_edge(),
        u64_edge(),
        option::of(u32_edge()),
        dim3(),
        dim3(),
        any::<u16>(),
        u32_edge(),
        u32_edge(),
        i64_edge(),
        u32_edge(),
    )
        .prop_map(
            |(
                start_ns,
                end_ns,
                name,
                grid,
                block,
                registers_per_thread,
                static_shared_mem,
                dynamic_shared_mem,
                stream,
                correlation_id,
            )| KernelExec {
                start_ns,
                end_ns,
                name,
                grid,
                block,
                registers_per_thread,
                static_shared_mem,
                dynamic_shared_mem,
                stream,
                correlation_id,
            },
        )
}

fn mem_activity() -> impl Strategy<Value = MemActivity> {
    (
        prop_oneof![Just(MemActivityOp::Allocation), Just(MemActivityOp::Release)],
        proptest::sample::select(CuptiMemoryKind::ALL.to_vec()),
        u64_edge(),
        u64_edge(),
        option::of(i64_edge()),
        u32_edge(),
        u64_edge(),
        option::of(prop_oneof![Just(MemPoolKind::Local), Just(MemPoolKind::Imported)]),
        option::of(u64_edge()),
    )
        .prop_map(|(op, memory_kind, addr, size, stream, correlation_id, pc, pool, pool_addr)| MemActivity {
            op,
            memory_kind,
            addr,
            size,
            stream,
            correlation_id,
            pc,
            pool,
            pool_addr,
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
    (
        u64_edge(),
        u64_edge(),
        u64_edge(),
        proptest::sample::select(vec![
            BlockState::ActiveAllocated,
            BlockState::ActivePendingFree,
            BlockState::Inactive,
        ]),
        option::of(u32_edge()),
    )
        .prop_map(|(addr, size, requested_size, state, stack)| BlockInfo {
            addr,
            size,
            requested_size,
            state,
            stack,
        })
}

fn segment() -> impl Strategy<Value = SegmentState> {
    (
        prop_oneof![Just(StateAt::Start), Just(StateAt::End)],
        u64_edge(),
        u64_edge(),
        i64_edge(),
        prop_oneof![Just(SegmentPool::Small), Just(SegmentPool::Large)],
        any::<bool>(),
        (i64_edge(), i64_edge()),
        option::of(u32_edge()),
        vec(block(), 0..4),
    )
        .prop_map(|(at, addr, total_size, stream, pool, is_expandable, pool_id, stack, blocks)| SegmentState {
            at,
            addr,
            total_size,
            stream,
            pool,
            is_expandable,
            pool_id,
            stack,
            blocks,
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
