//! One test per interception path. Each runs a tiny C program against the stub runtime and
//! driver and checks exact calls and counts.

use trace::{Api, Event, MemoryKind, VmmOp};

use crate::harness::{run_ok, Run};
use crate::stats::Stats;

/// Expected totals: (allocs, frees, kernel_launches, peak_live_device_bytes).
type Totals = (u64, u64, u64, u64);

fn check(prog: &str, env: &[(&str, &str)], calls: &[(&str, u64)], totals: Totals) -> (Run, Stats) {
    let r = run_ok(prog, env);
    let s = r.stats();
    assert_eq!(s.calls(), calls, "{prog}: calls");
    assert_eq!((s.allocs, s.frees, s.kernel_launches, s.peak_live_device_bytes), totals, "{prog}: totals");
    assert!(s.whole(), "{prog}: trace not whole");
    assert_eq!(s.lost_events, 0);
    (r, s)
}

/// The shim `dlopen`ed at run time instead of preloaded, so its initial-exec TLS block comes from
/// glibc's static TLS surplus: the hook reached through its handle is recorded (the free through
/// the PLT bypasses the shim, loaded after the runtime), and so is the marker.
#[test]
fn dlopened_instead_of_preloaded() {
    let shim = crate::harness::shim();
    let env = [("LD_PRELOAD", ""), ("SHIM_PATH", shim.to_str().expect("a UTF-8 path"))];
    let (r, s) = check("p_dlopen_shim", &env, &[("cudaMalloc", 1)], (1, 0, 0, 4096));
    let marked = s.records.iter().any(|r| matches!(&r.event, Event::Marker(m) if m.text == "dlopened"));
    assert!(marked, "no marker; stderr:\n{}", r.stderr());
}

#[test]
fn runtime_alloc_and_free() {
    let (r, s) = check(
        "p_runtime_alloc",
        &[],
        &[("cudaFree", 2), ("cudaFreeHost", 1), ("cudaMalloc", 2), ("cudaMallocHost", 1)],
        (2, 2, 0, (1 << 20) + 4096),
    );
    assert_eq!(s.host_allocs, 1);
    // Caller module: the program itself made the calls.
    let callers: Vec<_> = s.allocs().iter().map(|a| s.name(a.caller).unwrap_or("?").to_string()).collect();
    assert_eq!(callers, ["p_runtime_alloc"; 3]);
    // Frees carry the size the shim knew from the allocation.
    let sizes: Vec<_> = s.events(|e| match e {
        Event::Free(f) => f.size,
        _ => None,
    });
    assert_eq!(sizes, [1 << 20, 4096]);
    // Summary on stderr: counts, peak, output path.
    let err = r.stderr();
    assert!(
        err.contains("2 allocs, 2 frees") && err.contains(&format!("peak live device bytes {}", (1 << 20) + 4096)),
        "{err}"
    );
    assert!(err.contains(".mtrace"), "{err}");
}

#[test]
fn cuda_launch_kernel_stubs_and_names() {
    let (_, s) = check(
        "p_launch",
        &[],
        &[("__cudaLaunchKernel", 3), ("cudaLaunchKernel", 1), ("cudaLaunchKernelExC", 1)],
        (0, 0, 5, 0),
    );
    let launches: Vec<_> = s
        .launches()
        .iter()
        .map(|k| (s.name(k.name).unwrap_or("?").to_string(), k.grid, k.block[0], k.shared_mem))
        .collect();
    assert_eq!(launches[0], ("my_kernel".to_string(), [4, 2, 1], 128, 256));
    assert_eq!(launches[3], ("other_kernel".to_string(), [4, 2, 1], 128, 0));
    assert_eq!(launches[4], ("my_kernel".to_string(), [8, 1, 1], 32, 0));
}

#[test]
fn runtime_internal_driver_calls_count_once() {
    check(
        "p_internal_driver",
        &[],
        &[
            ("cudaFree", 1),
            ("cudaFreeAsync", 1),
            ("cudaFreeHost", 1),
            ("cudaGraphLaunch", 1),
            ("cudaHostAlloc", 1),
            ("cudaMallocAsync", 1),
            ("cudaMallocManaged", 1),
            ("cudaMemPoolTrimTo", 1),
        ],
        (2, 2, 1, (1 << 16) + (1 << 12)),
    );
}

#[test]
fn driver_entry_point_vmm() {
    let (_, s) = check(
        "p_entry_point",
        &[],
        &[
            ("cuMemAddressFree", 1),
            ("cuMemAddressReserve", 1),
            ("cuMemAlloc_v2", 1),
            ("cuMemCreate", 1),
            ("cuMemMap", 1),
            ("cuMemRelease", 1),
            ("cuMemSetAccess", 1),
            ("cuMemUnmap", 1),
        ],
        (2, 1, 0, 2 << 20),
    );
    let ops: Vec<_> = s.events(|e| match e {
        Event::Vmm(v) => Some(v.op),
        _ => None,
    });
    assert_eq!(ops, [VmmOp::Reserve, VmmOp::Map, VmmOp::SetAccess, VmmOp::Unmap, VmmOp::AddressFree]);
    let phys = s.records.iter().find_map(|r| match &r.event {
        Event::Alloc(a) if a.mem == MemoryKind::Physical => Some(a.clone()),
        _ => None,
    });
    let map = s.records.iter().find_map(|r| match &r.event {
        Event::Vmm(v) if v.op == VmmOp::Map => Some(v.clone()),
        _ => None,
    });
    let (phys, map) = (phys.unwrap(), map.unwrap());
    assert_eq!((map.handle, map.size), (phys.addr, 2 << 20));
}

#[test]
fn triton_dlopen_dlsym_launch() {
    let (_, s) = check("p_triton", &[], &[("cuLaunchKernelEx", 2)], (0, 0, 2, 0));
    let names: Vec<_> = s.launches().iter().map(|k| (s.name(k.name), k.grid[0], k.shared_mem)).collect();
    assert_eq!(names, [(Some("triton_kernel"), 16, 1024); 2]);
}

/// A kernel name is one frame, which readers take up to 64 MiB: a 70 MB name made the whole
/// trace unreadable. Names past 1 MiB are cut at a character boundary, saying so.
#[test]
fn a_name_past_a_mebibyte_is_cut_and_says_so() {
    let (_, s) = check("p_long_name", &[], &[("cuLaunchKernel", 1)], (0, 0, 1, 0));
    let name = s.name(s.launches()[0].name).expect("the launch is named");
    let (kept, said) = name.split_at(1 << 20);
    assert!(kept.bytes().all(|b| b == b'k'), "the first MiB is the name's own");
    assert_eq!(said, " [memtrace: 1048579 more bytes of this name cut]");
}

/// Every allocation and free hook of the common shapes, every pitched allocation, IPC open, pool
/// trim and VMM call on an address range records its own API, memory kind (or VMM operation),
/// address, size, stream and caller module (`p_every_alloc.c`): a hook whose table entry names
/// the wrong one fails here.
#[test]
fn every_alloc_and_free_hook_records_its_own_fields() {
    use MemoryKind::{Device, HostRegistered, IpcImport, Managed, PinnedHost};
    let s = run_ok("p_every_alloc", &[]).stats();
    let got: Vec<_> = s.events(|e| match e {
        Event::Alloc(a) => Some(("alloc", a.api.name(), a.mem, Some(a.size), a.stream, s.name(a.caller))),
        Event::Free(f) => Some(("free", f.api.name(), f.mem, f.size, f.stream, s.name(f.caller))),
        _ => None,
    });
    // Streams are the handles the program passed (0x5000 + n). A free of device memory carries
    // the size the shim knew from its allocation; host frees and an address never allocated
    // (an IPC close) carry none (`writer/translate.rs` tracks device memory only). A pitched
    // block is pitch × height bytes (the stub's pitch: the width rounded up to 512), saturated
    // when that overflows; an IPC open knows no size, and is recorded without a caller module.
    let st = |n: i64| 0x5000 + n;
    let me = Some("p_every_alloc");
    let want = [
        ("alloc", "cudaMalloc", Device, Some(1001), 0, me),
        ("alloc", "cudaMallocAsync", Device, Some(1002), st(1), me),
        ("alloc", "cudaMallocAsync_ptsz", Device, Some(1003), st(2), me),
        ("alloc", "cudaMallocFromPoolAsync", Device, Some(1004), st(3), me),
        ("alloc", "cudaMallocFromPoolAsync_ptsz", Device, Some(1005), st(4), me),
        ("alloc", "cudaMallocManaged", Managed, Some(1006), 0, me),
        ("alloc", "cudaMallocHost", PinnedHost, Some(1007), 0, me),
        ("alloc", "cudaHostAlloc", PinnedHost, Some(1008), 0, me),
        ("alloc", "cudaHostRegister", HostRegistered, Some(1009), 0, me),
        ("alloc", "cudaMallocPitch", Device, Some(512 * 3), 0, me),
        ("alloc", "cudaIpcOpenMemHandle", IpcImport, Some(0), 0, None),
        ("free", "cudaFreeAsync", Device, Some(1002), st(11), me),
        ("free", "cudaFreeAsync_ptsz", Device, Some(1003), st(12), me),
        ("free", "cudaFreeHost", PinnedHost, None, 0, me),
        ("free", "cudaHostUnregister", HostRegistered, None, 0, me),
        ("free", "cudaIpcCloseMemHandle", IpcImport, None, 0, me),
        ("alloc", "cuMemAlloc_v2", Device, Some(2001), 0, me),
        ("alloc", "cuMemAllocAsync", Device, Some(2002), st(21), me),
        ("alloc", "cuMemAllocAsync_ptsz", Device, Some(2003), st(22), me),
        ("alloc", "cuMemAllocFromPoolAsync", Device, Some(2004), st(23), me),
        ("alloc", "cuMemAllocFromPoolAsync_ptsz", Device, Some(2005), st(24), me),
        ("alloc", "cuMemAllocManaged", Managed, Some(2006), 0, me),
        ("alloc", "cuMemAllocHost_v2", PinnedHost, Some(2007), 0, me),
        ("alloc", "cuMemHostAlloc", PinnedHost, Some(2008), 0, me),
        ("alloc", "cuMemHostRegister_v2", HostRegistered, Some(2009), 0, me),
        ("alloc", "cuMemAllocPitch_v2", Device, Some(1024 * 5), 0, me),
        ("alloc", "cuMemAllocPitch_v2", Device, Some(u64::MAX), 0, me),
        ("alloc", "cuIpcOpenMemHandle_v2", IpcImport, Some(0), 0, None),
        ("free", "cuMemFree_v2", Device, Some(2001), 0, me),
        ("free", "cuMemFreeAsync", Device, Some(2002), st(31), me),
        ("free", "cuMemFreeAsync_ptsz", Device, Some(2003), st(32), me),
        ("free", "cuMemFreeHost", PinnedHost, None, 0, me),
        ("free", "cuMemHostUnregister", HostRegistered, None, 0, me),
        ("free", "cuIpcCloseMemHandle", IpcImport, None, 0, me),
    ];
    assert_eq!(got, want);
    // Addresses: the stub driver places pitched blocks from 0x7d0000000000 up, 4 KiB apart, and
    // an IPC open returns its handle's address; a failed call (the overflowing pitch) records 0.
    let placed: Vec<_> = s.events(|e| match e {
        Event::Alloc(a) if a.api.name().contains("Pitch") || a.api.name().contains("IpcOpen") => {
            Some((a.api.name(), a.addr, a.result))
        }
        _ => None,
    });
    let imported = 0x7e00_0000_0000;
    assert_eq!(
        placed,
        [
            ("cudaMallocPitch", 0x7d00_0000_0000, 0),
            ("cudaIpcOpenMemHandle", imported, 0),
            ("cuMemAllocPitch_v2", 0x7d00_0000_1000, 0),
            ("cuMemAllocPitch_v2", 0, 2),
            ("cuIpcOpenMemHandle_v2", imported + 4096, 0),
        ]
    );
    assert_eq!(s.failed(), 1);
    // Pool trims: the pool and the size it keeps (no caller module in the record).
    let trims: Vec<_> = s.events(|e| match e {
        Event::PoolTrim(t) => Some((t.api.name(), t.pool, t.min_bytes_to_keep)),
        _ => None,
    });
    assert_eq!(trims, [("cudaMemPoolTrimTo", 0x5000 + 91, 1011), ("cuMemPoolTrimTo", 0x5000 + 92, 2011)]);
    // VMM calls on ranges of a reservation the stub placed at the program's hint.
    let va = 0x7c00_0000_0000;
    let vmm: Vec<_> = s.events(|e| match e {
        Event::Vmm(v) => Some((v.api.name(), v.op, v.addr, v.size, v.stream, s.name(v.caller))),
        _ => None,
    });
    assert_eq!(
        vmm,
        [
            ("cuMemAddressReserve", VmmOp::Reserve, va, 0x10000, 0, me),
            ("cuMemSetAccess", VmmOp::SetAccess, va + 0x1000, 0x3000, 0, me),
            ("cuMemUnmap", VmmOp::Unmap, va + 0x2000, 0x2000, 0, me),
            ("cuMemAddressFree", VmmOp::AddressFree, va, 0x10000, 0, me),
        ]
    );
    assert!(s.whole() && s.lost_events == 0);
}

#[test]
fn direct_plt_driver_calls() {
    check("p_plt_driver", &[], &[("cuLaunchKernel", 1), ("cuMemAlloc_v2", 1), ("cuMemFree_v2", 1)], (1, 1, 1, 3 << 20));
}

/// `dlvsym` through a handle is wrapped (one `cudaMalloc`); through RTLD_DEFAULT it goes to libc
/// untouched, whose versioned lookup passes over the shim's unversioned export: that call is seen
/// as the runtime's own driver call (`cuMemAlloc_v2`).
#[test]
fn dlvsym_and_cooperative_launches() {
    let (_, s) = check(
        "p_dlvsym",
        &[],
        &[("cuLaunchCooperativeKernel", 1), ("cuMemAlloc_v2", 1), ("cudaMalloc", 1)],
        (2, 0, 1, 3000),
    );
    let allocs: Vec<_> = s.allocs().iter().map(|a| (a.api, a.size)).collect();
    assert_eq!(allocs, [(Api::CuMemAlloc_v2, 1000), (Api::CudaMalloc, 2000)]);
    let launches: Vec<_> = s.launches().iter().map(|k| (k.api, k.grid, k.block, k.shared_mem)).collect();
    assert_eq!(launches, [(Api::CuLaunchCooperativeKernel, [2, 3, 4], [64, 1, 1], 512)]);
}

#[test]
fn rtld_local_cudart_found_by_soname() {
    let (_, s) = check("p_rtld_local", &[], &[("cudaFree", 1), ("cudaMalloc", 1)], (1, 1, 0, 12345));
    let caller = s.allocs().first().map(|a| s.name(a.caller));
    assert_eq!(caller, Some(Some("libuser.so")));
}

#[test]
fn failed_allocation_is_a_call_not_an_allocation() {
    let (_, s) =
        check("p_oom", &[("STUB_OOM_LIMIT", "1073741824")], &[("cudaFree", 1), ("cudaMalloc", 2)], (1, 1, 0, 1 << 20));
    let failed: Vec<_> = s.events(|e| match e {
        Event::Alloc(a) if a.result != 0 => Some((a.result, a.addr, a.size)),
        _ => None,
    });
    assert_eq!(failed, [(2, 0, 1 << 34)]);
    assert_eq!(s.failed(), 1);
}

#[test]
fn second_interposer_beside_ours() {
    let b = crate::harness::build_dir().join("libsecond.so");
    let shim = crate::harness::shim();
    for order in [format!("{}:{}", shim.display(), b.display()), format!("{}:{}", b.display(), shim.display())] {
        let (r, _) = check(
            "p_runtime_alloc",
            &[("LD_PRELOAD", &order)],
            &[("cudaFree", 2), ("cudaFreeHost", 1), ("cudaMalloc", 2), ("cudaMallocHost", 1)],
            (2, 2, 0, (1 << 20) + 4096),
        );
        assert!(r.stderr().contains("second: cudaMalloc=2 cudaFree=3"), "{order}: {}", r.stderr());
    }
}

#[test]
fn program_dlsym_rtld_next_keeps_its_meaning() {
    check("p_rtld_next", &[], &[("cudaMalloc", 1)], (1, 0, 0, 777));
}

#[test]
fn ptsz_allocations_arrays_and_legacy_launches() {
    let peak = 16384 + 4096 + 84;
    let (_, s) = check(
        "p_more_entry_points",
        &[],
        &[
            ("cuArray3DCreate_v2", 1),
            ("cuArrayCreate_v2", 1),
            ("cuArrayDestroy", 2),
            ("cuLaunch", 1),
            ("cuLaunchGrid", 1),
            ("cuLaunchGridAsync", 1),
            ("cuMipmappedArrayCreate", 1),
            ("cuMipmappedArrayDestroy", 1),
            ("cudaFreeAsync_ptsz", 2),
            ("cudaMallocAsync_ptsz", 1),
            ("cudaMallocFromPoolAsync_ptsz", 1),
        ],
        (5, 5, 3, peak),
    );
    let sizes: Vec<_> = s.allocs().iter().map(|a| (a.api.name(), a.size)).collect();
    assert_eq!(
        sizes,
        [
            ("cudaMallocAsync_ptsz", 1000),
            ("cudaMallocFromPoolAsync_ptsz", 3000),
            ("cuArrayCreate_v2", 16384),
            ("cuArray3DCreate_v2", 4096),
            ("cuMipmappedArrayCreate", 84)
        ]
    );
    let launches: Vec<_> = s.launches().iter().map(|k| (s.name(k.name), k.grid, k.block, k.stream)).collect();
    let name = Some("plain_kernel");
    assert_eq!(launches, [(name, [1, 1, 1], [0; 3], 0), (name, [5, 6, 1], [0; 3], 0), (name, [7, 8, 1], [0; 3], 0x99)]);
}
