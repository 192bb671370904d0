//! The optional CUPTI activity layer (`MEMTRACE_CUPTI=1`): kernel execution records
//! (`CONCURRENT_KERNEL`) and memory allocation and release records (`MEMORY2`) on the trace's
//! clock, through cudarc with dynamic loading. A CUPTI that rejects `MEMORY2` costs one line;
//! kernel records go on.
//!
//! Started lazily by the first recorded CUDA call (never in the library constructor: CUDA is not
//! loaded yet then), on the thread that made it, marked internal so that nothing CUPTI or cudarc
//! calls is traced. Every cudarc call runs inside `catch_unwind`: cudarc panics when a library or
//! symbol is missing, and that must never reach the host. When libcupti is missing, or another
//! tool already holds CUPTI (torch.profiler/Kineto, nsys, ncu:
//! `CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED`), one line is logged and tracing continues with
//! interposition only.
//!
//! Kernel names are CUPTI-owned strings shared by all records of a kernel and kept until
//! `cuptiFinalize`, which the shim never calls; the writer reads them by pointer, once per kernel.

use std::ffi::{c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicU8, Ordering};
use std::sync::Mutex;

use cudarc::cupti::{result, sys};

use crate::{clock, log, raw, real};

/// Why the CUPTI layer is not running.
#[derive(Debug, thiserror::Error)]
pub enum CuptiError {
    /// No libcupti could be loaded (by soname, next to libcudart, or by cudarc's names).
    #[error("libcupti not found (looked for {looked}); continuing with interposition only")]
    Missing {
        /// Where it was looked for.
        looked: String,
    },
    /// No CUDA driver is loaded. Real libcupti 13 recurses until the stack overflows when
    /// `cuptiSubscribe` finds no `libcuda.so.1`, so it is not even loaded then.
    #[error("no CUDA driver (libcuda.so.1) is loaded, so CUPTI cannot run; continuing with interposition only")]
    NoDriver,
    /// Another subscriber holds CUPTI: torch.profiler/Kineto, Nsight Systems/Compute, cuda-gdb.
    #[error(
        "another profiler holds CUPTI (CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED from {call}); continuing with interposition only"
    )]
    Busy {
        /// The call that reported it.
        call: &'static str,
    },
    /// A CUPTI call failed.
    #[error("{call} failed with CUPTI error {code}; continuing with interposition only")]
    Call {
        /// The CUPTI function.
        call: &'static str,
        /// Its `CUptiResult` code.
        code: u32,
    },
    /// cudarc panicked inside a call (a missing symbol, most likely).
    #[error("{call} panicked inside cudarc (a missing libcupti symbol?); continuing with interposition only")]
    Panicked {
        /// The CUPTI function.
        call: &'static str,
    },
    /// `MEMORY2` could not be enabled (a CUPTI too old for it); the layer runs without it.
    #[error("CUPTI memory activity (MEMORY2) is unavailable ({why}); recording kernel executions only")]
    NoMemoryActivity {
        /// What the enable call reported.
        why: String,
    },
}

const OFF: u8 = 0;
const STARTING: u8 = 1;
const ON: u8 = 2;
const FAILED: u8 = 3;

static STATE: AtomicU8 = AtomicU8::new(OFF);
/// CLOCK_MONOTONIC minus `cuptiGetTimestamp`, measured at start.
static OFFSET: AtomicI64 = AtomicI64::new(0);
/// `cuptiActivityFlushAll` deadlocks when entered from two threads at once.
static FLUSHING: AtomicBool = AtomicBool::new(false);
/// Records CUPTI reported as dropped (buffers full).
pub static DROPPED: AtomicU64 = AtomicU64::new(0);
/// Kernel execution records delivered.
pub static DELIVERED: AtomicU64 = AtomicU64::new(0);
/// Memory activity records delivered.
pub static MEM_DELIVERED: AtomicU64 = AtomicU64::new(0);
/// Whether `MEMORY2` is enabled.
static MEMORY_ON: AtomicBool = AtomicBool::new(false);

/// CUPTI's recommended buffer size is 1–10 MB; Kineto uses 4 MB.
const BUFFER_BYTES: usize = 4 << 20;
const BUFFER_ALIGN: usize = 8;

/// `CUpti_ActivityKernel10` (CUDA 13.0), the record `CONCURRENT_KERNEL` delivers; later
/// versions only append fields, so the prefix read here is the same.
type KernelRecord = sys::CUpti_ActivityKernel10;
/// `CUpti_ActivityMemory4` (CUDA 12.6+), the record `MEMORY2` delivers. Older CUPTIs deliver
/// `CUpti_ActivityMemory3`/`2`, the same layout without the trailing fields; only that common
/// prefix is read, field by field, so that no enum is read from CUPTI's bytes (an unknown value
/// in a Rust enum is undefined behaviour).
type MemoryRecord = sys::CUpti_ActivityMemory4;

const KIND_KERNEL: u32 = sys::CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_KERNEL as u32;
const KIND_CONCURRENT_KERNEL: u32 = sys::CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL as u32;
const KIND_MEMORY2: u32 = sys::CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_MEMORY2 as u32;

fn call<T>(name: &'static str, f: impl FnOnce() -> Result<T, result::CuptiError>) -> Result<T, CuptiError> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Err(_) => Err(CuptiError::Panicked { call: name }),
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) if e.0 == sys::CUptiResult::CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED => {
            Err(CuptiError::Busy { call: name })
        }
        Ok(Err(e)) => Err(CuptiError::Call { call: name, code: e.0 as u32 }),
    }
}

/// Whether the layer delivers records.
pub fn running() -> bool {
    STATE.load(Ordering::Acquire) == ON
}

/// Start the layer once (later calls return at once). Logs one line when it cannot run.
/// `prepare` runs once CUPTI is set up, before the layer counts as running: whoever finds it
/// running finds what `prepare` made (the writer's thread for a flush at a fatal signal).
pub fn start(prepare: impl FnOnce()) {
    if STATE.compare_exchange(OFF, STARTING, Ordering::AcqRel, Ordering::Acquire).is_err() {
        return;
    }
    let was = raw::is_internal();
    raw::set_internal(true);
    let r = catch_unwind(AssertUnwindSafe(init)).unwrap_or(Err(CuptiError::Panicked { call: "init" }));
    if r.is_ok() {
        let _ = catch_unwind(AssertUnwindSafe(prepare));
    }
    raw::set_internal(was);
    match r {
        Ok(()) => {
            STATE.store(ON, Ordering::Release);
            let kinds =
                if MEMORY_ON.load(Ordering::Acquire) { "CONCURRENT_KERNEL, MEMORY2" } else { "CONCURRENT_KERNEL" };
            log!(Info, "CUPTI activity layer on ({kinds})");
        }
        Err(e) => {
            STATE.store(FAILED, Ordering::Release);
            log!(Warn, "MEMTRACE_CUPTI=1: {e}");
        }
    }
}

/// A fork child inherits no usable CUPTI state.
pub fn disable_in_child() {
    STATE.store(FAILED, Ordering::Release);
    FLUSHING.store(false, Ordering::Release);
}

/// What [`flush`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flushed {
    /// The layer is not running: CUPTI holds nothing of ours.
    Off,
    /// Every record CUPTI held was delivered.
    Done,
    /// Another thread was flushing: left to it, so what it had not taken yet may still be held.
    Busy,
    /// CUPTI reported an error (logged).
    Failed,
}

/// Deliver every buffered record now (exit paths, `cudaDeviceReset`). Never waits for another
/// thread: a flush already running elsewhere is left to finish ([`Flushed::Busy`]).
pub fn flush() -> Flushed {
    if !running() {
        return Flushed::Off;
    }
    if FLUSHING.swap(true, Ordering::AcqRel) {
        return Flushed::Busy;
    }
    let was = raw::is_internal();
    raw::set_internal(true);
    // CUPTI_ACTIVITY_FLAG_FLUSH_FORCED = 1: also flush records of kernels still running.
    let r = call("cuptiActivityFlushAll", || result::activity::flush_all(1));
    raw::set_internal(was);
    FLUSHING.store(false, Ordering::Release);
    match r {
        Ok(()) => Flushed::Done,
        Err(e) => {
            log!(Warn, "{e}");
            Flushed::Failed
        }
    }
}

/// The directory of the loaded `libcudart.so.<major>`, and the major.
fn cudart_dir() -> Option<(String, &'static str)> {
    for (soname, major) in [(c"libcudart.so.13", "13"), (c"libcudart.so.12", "12")] {
        let Some(h) = real::loaded(soname) else { continue };
        let p = real::dlsym(h, c"cudaMalloc");
        if p == 0 {
            continue;
        }
        // Safety: Dl_info is plain C data; all-zero is a valid value.
        let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
        // Safety: dladdr reads loader tables; `info` is a valid out-pointer.
        if unsafe { libc::dladdr(p as *const c_void, &mut info) } == 0 || info.dli_fname.is_null() {
            continue;
        }
        // Safety: dladdr's file name is a NUL-terminated string owned by the loader.
        let path = unsafe { CStr::from_ptr(info.dli_fname) }.to_string_lossy().into_owned();
        let dir = path.rsplit_once('/').map(|(d, _)| d.to_string()).unwrap_or_else(|| ".".into());
        return Some((dir, major));
    }
    None
}

/// Make sure a libcupti matching the loaded runtime is loaded, so that cudarc's load by name
/// finds it by soname: cu13 wheels ship `libcupti.so.13` next to `libcudart.so.13`, outside the
/// loader's search path.
fn preload() -> Result<(), CuptiError> {
    for soname in [c"libcupti.so.13", c"libcupti.so.12"] {
        // Safety: RTLD_NOLOAD only looks; the reference it takes is kept for the process.
        if !unsafe { libc::dlopen(soname.as_ptr(), libc::RTLD_NOLOAD | libc::RTLD_LAZY) }.is_null() {
            return Ok(());
        }
    }
    let mut looked = vec!["libcupti.so.13/.12 already loaded".to_string()];
    if let Some((dir, major)) = cudart_dir() {
        let path = format!("{dir}/libcupti.so.{major}");
        looked.push(path.clone());
        if let Ok(c) = CString::new(path) {
            // Safety: loading a library by explicit path; it stays loaded for the process.
            if !unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) }.is_null() {
                return Ok(());
            }
        }
    }
    // Safety: is_culib_present only tries dlopen on cudarc's candidate names.
    let present = catch_unwind(|| unsafe { sys::is_culib_present() }).unwrap_or(false);
    if present {
        return Ok(());
    }
    looked.push("libcupti.so, libcupti.so.13/.12/.11/.10 on the loader path".into());
    Err(CuptiError::Missing { looked: looked.join(", ") })
}

fn init() -> Result<(), CuptiError> {
    if real::loaded(c"libcuda.so.1").is_none() {
        return Err(CuptiError::NoDriver);
    }
    preload()?;
    // Subscribing first reports a profiler that already holds CUPTI; the subscription flushes
    // on cudaDeviceReset, which discards a context's pending records.
    let mut sub: sys::CUpti_SubscriberHandle = std::ptr::null_mut();
    // Safety: `sub` is a valid out-pointer; the callback matches CUpti_CallbackFunc.
    call("cuptiSubscribe", || unsafe { result::subscribe(&mut sub, Some(on_callback), std::ptr::null_mut()) })?;
    // Safety: `sub` was just returned by cuptiSubscribe.
    call("cuptiEnableCallback", || unsafe {
        result::enable_callback(
            1,
            sub,
            sys::CUpti_CallbackDomain::CUPTI_CB_DOMAIN_RUNTIME_API,
            sys::CUpti_runtime_api_trace_cbid::CUPTI_RUNTIME_TRACE_CBID_cudaDeviceReset_v3020 as u32,
        )
    })?;
    call("cuptiActivityRegisterCallbacks", || {
        result::activity::register_callbacks(Some(buffer_requested), Some(buffer_completed))
    })?;
    let mut cupti_now = 0u64;
    // Safety: valid out-pointer.
    call("cuptiGetTimestamp", || unsafe { result::get_timestamp(&mut cupti_now) })?;
    let mono = clock::now_ns();
    OFFSET.store(mono as i64 - cupti_now as i64, Ordering::Release);
    call("cuptiActivityEnable(CONCURRENT_KERNEL)", || {
        result::activity::enable(sys::CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL)
    })?;
    match call("cuptiActivityEnable(MEMORY2)", || {
        result::activity::enable(sys::CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_MEMORY2)
    }) {
        Ok(()) => MEMORY_ON.store(true, Ordering::Release),
        Err(e) => {
            let why = match e {
                CuptiError::Call { call, code } => format!("{call} failed with CUPTI error {code}"),
                CuptiError::Panicked { call } => format!("{call} panicked inside cudarc"),
                CuptiError::Busy { call } => format!("{call}: another profiler holds CUPTI"),
                other => other.to_string(),
            };
            log!(Warn, "MEMTRACE_CUPTI=1: {}", CuptiError::NoMemoryActivity { why });
        }
    }
    Ok(())
}

unsafe extern "C" fn on_callback(
    _user: *mut c_void,
    _domain: sys::CUpti_CallbackDomain,
    cbid: u32,
    _data: *const c_void,
) {
    let _ = catch_unwind(|| {
        if cbid == sys::CUpti_runtime_api_trace_cbid::CUPTI_RUNTIME_TRACE_CBID_cudaDeviceReset_v3020 as u32 {
            let _ = flush();
        }
    });
}

unsafe extern "C" fn buffer_requested(buf: *mut *mut u8, size: *mut usize, max_records: *mut usize) {
    let _ = catch_unwind(|| {
        let layout = std::alloc::Layout::from_size_align(BUFFER_BYTES, BUFFER_ALIGN).expect("constant layout");
        // Safety: non-zero size; a null result is reported to CUPTI as "no buffer".
        let p = unsafe { std::alloc::alloc(layout) };
        // Safety: CUPTI passes valid out-pointers.
        unsafe {
            *buf = p;
            *size = if p.is_null() { 0 } else { BUFFER_BYTES };
            *max_records = 0;
        }
    });
}

/// CUPTI's monotonic-ish timestamp on our CLOCK_MONOTONIC.
fn to_mono(t: u64) -> u64 {
    (t as i64).wrapping_add(OFFSET.load(Ordering::Relaxed)) as u64
}

/// One kernel execution, as the writer needs it. Timestamps are CLOCK_MONOTONIC ns.
#[derive(Debug, Clone, Copy)]
pub struct Exec {
    /// Start.
    pub start: u64,
    /// End.
    pub end: u64,
    /// CUPTI's name pointer (CUPTI-owned, see the module doc).
    pub name: u64,
    /// Grid.
    pub grid: [u32; 3],
    /// Block.
    pub block: [u32; 3],
    /// Registers per thread.
    pub registers: u16,
    /// Static shared memory per block.
    pub static_shared: u32,
    /// Dynamic shared memory per block.
    pub dynamic_shared: u32,
    /// CUPTI stream id.
    pub stream: u32,
    /// Correlation id.
    pub correlation: u32,
    /// Device.
    pub device: u32,
}

/// One memory allocation or release, ready for the trace but for its clock: `ts` is
/// CLOCK_MONOTONIC ns.
#[derive(Debug, Clone)]
pub struct Mem {
    /// CUPTI's timestamp.
    pub ts: u64,
    /// CUPTI device id.
    pub device: u32,
    /// The record.
    pub event: trace::MemActivity,
}

/// One CUPTI record, in CUPTI's order.
#[derive(Debug, Clone)]
pub enum Activity {
    /// A kernel execution.
    Kernel(Exec),
    /// A memory allocation or release.
    Memory(Mem),
}

/// Records delivered by CUPTI and not yet taken by the writer. CUPTI delivers whole buffers on
/// its own thread (or in the flushing thread), never on a hook's hot path, so a mutex is fine.
static PENDING: Mutex<Vec<Activity>> = Mutex::new(Vec::new());

/// Everything delivered since the last call (the writer's sweep).
pub fn take() -> Vec<Activity> {
    match PENDING.lock() {
        Ok(mut v) if !v.is_empty() => std::mem::take(&mut *v),
        _ => Vec::new(),
    }
}

fn exec_of(k: &KernelRecord) -> Exec {
    Exec {
        start: to_mono(k.start),
        end: to_mono(k.end),
        name: k.name as u64,
        grid: [k.gridX as u32, k.gridY as u32, k.gridZ as u32],
        block: [k.blockX as u32, k.blockY as u32, k.blockZ as u32],
        registers: k.registersPerThread,
        static_shared: k.staticSharedMemory.max(0) as u32,
        dynamic_shared: k.dynamicSharedMemory.max(0) as u32,
        stream: k.streamId,
        correlation: k.correlationId,
        device: k.deviceId,
    }
}

/// A field of a record at `p`, by its offset (records may be packed to 8 bytes).
///
/// # Safety
/// `p + off .. p + off + size_of::<T>()` lies inside the record, and any bit pattern is a `T`.
unsafe fn field<T: Copy>(p: *const u8, off: usize) -> T {
    // Safety: per the contract.
    unsafe { std::ptr::read_unaligned(p.add(off).cast::<T>()) }
}

/// A `MEMORY2` record, or `None` for an operation type this version does not know.
///
/// # Safety
/// `p` points at a whole `CUpti_ActivityMemory2` or later record.
unsafe fn mem_of(p: *const u8) -> Option<Mem> {
    use std::mem::offset_of;
    use trace::{CuptiMemoryKind, MemActivity, MemActivityOp, MemPoolKind};
    // Safety: every read is at an offset inside the record's common prefix, of a plain integer.
    let (op, kind, pool_type): (u32, u32, u32) = unsafe {
        (
            field(p, offset_of!(MemoryRecord, memoryOperationType)),
            field(p, offset_of!(MemoryRecord, memoryKind)),
            field(p, offset_of!(MemoryRecord, memoryPoolConfig.memoryPoolType)),
        )
    };
    let op = match op {
        1 => MemActivityOp::Allocation,
        2 => MemActivityOp::Release,
        _ => return None,
    };
    let pool = match pool_type {
        1 => Some(MemPoolKind::Local),
        2 => Some(MemPoolKind::Imported),
        _ => None,
    };
    // Safety: as above.
    unsafe {
        let is_async: u32 = field(p, offset_of!(MemoryRecord, isAsync));
        let stream: u32 = field(p, offset_of!(MemoryRecord, streamId));
        let event = MemActivity {
            op,
            memory_kind: CuptiMemoryKind::from_cupti(kind),
            addr: field(p, offset_of!(MemoryRecord, address)),
            size: field(p, offset_of!(MemoryRecord, bytes)),
            // Synchronous operations carry CUPTI_INVALID_STREAM_ID.
            stream: (is_async != 0).then_some(i64::from(stream)),
            correlation_id: field(p, offset_of!(MemoryRecord, correlationId)),
            pc: field(p, offset_of!(MemoryRecord, PC)),
            pool,
            pool_addr: pool.map(|_| field(p, offset_of!(MemoryRecord, memoryPoolConfig.address))),
        };
        Some(Mem {
            ts: to_mono(field(p, offset_of!(MemoryRecord, timestamp))),
            device: field(p, offset_of!(MemoryRecord, deviceId)),
            event,
        })
    }
}

unsafe extern "C" fn buffer_completed(
    ctx: cudarc::driver::sys::CUcontext,
    stream: u32,
    buf: *mut u8,
    size: usize,
    valid: usize,
) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        let was = raw::is_internal();
        raw::set_internal(true);
        let mut rec: *mut sys::CUpti_Activity = std::ptr::null_mut();
        let mut got = Vec::new();
        // Safety: `buf`/`valid` are the buffer CUPTI completed; it hands out records inside it.
        while call("cuptiActivityGetNextRecord", || unsafe { result::activity::get_next_record(buf, valid, &mut rec) })
            .is_ok()
            && !rec.is_null()
        {
            // Safety: every record starts with its kind, a u32 (read as one: see MemoryRecord).
            let kind: u32 = unsafe { field(rec.cast::<u8>(), 0) };
            if kind == KIND_CONCURRENT_KERNEL || kind == KIND_KERNEL {
                // Safety: kernel kinds are delivered as CUpti_ActivityKernel<N>; records may be
                // packed to 8 bytes, hence the unaligned read.
                let k = unsafe { std::ptr::read_unaligned(rec.cast::<KernelRecord>()) };
                got.push(Activity::Kernel(exec_of(&k)));
                DELIVERED.fetch_add(1, Ordering::Relaxed);
            } else if kind == KIND_MEMORY2 {
                // Safety: MEMORY2 is delivered as CUpti_ActivityMemory<N>.
                if let Some(m) = unsafe { mem_of(rec.cast::<u8>()) } {
                    got.push(Activity::Memory(m));
                    MEM_DELIVERED.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        if let Ok(mut p) = PENDING.lock() {
            p.append(&mut got);
        }
        let mut dropped = 0usize;
        // Safety: valid out-pointer; ctx/stream are what CUPTI passed.
        if call("cuptiActivityGetNumDroppedRecords", || unsafe {
            result::activity::get_num_dropped_records(ctx, stream, &mut dropped)
        })
        .is_ok()
            && dropped > 0
        {
            DROPPED.fetch_add(dropped as u64, Ordering::Relaxed);
            log!(Warn, "CUPTI dropped {dropped} activity records (buffers full)");
        }
        raw::set_internal(was);
    }));
    if !buf.is_null() && size == BUFFER_BYTES {
        // Safety: allocated by buffer_requested with exactly this layout.
        unsafe { std::alloc::dealloc(buf, std::alloc::Layout::from_size_align_unchecked(BUFFER_BYTES, BUFFER_ALIGN)) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The offsets of `T`'s fields, then its size.
    macro_rules! layout {
        ($t:ty: $($($f:ident).+),+) => {
            [$(std::mem::offset_of!($t, $($f).+),)+ std::mem::size_of::<$t>()]
        };
    }

    /// The offsets the stub libcupti (tests/c/stub_cupti.c) writes at, pinned against cudarc's
    /// bindings of the CUPTI header.
    #[test]
    fn kernel_record_layout_matches_the_stub() {
        let got = layout!(KernelRecord: registersPerThread, start, end, deviceId, streamId, gridX, blockX,
            staticSharedMemory, dynamicSharedMemory, correlationId, name);
        assert_eq!(got, [6, 16, 24, 40, 48, 52, 64, 76, 80, 92, 104, 216]);
    }

    /// The same for `CUpti_ActivityMemory4`, whose prefix the shim reads field by field.
    #[test]
    fn memory_record_layout_matches_the_stub() {
        let got = layout!(MemoryRecord: memoryOperationType, memoryKind, correlationId, address, bytes, timestamp, PC,
            deviceId, streamId, isAsync, memoryPoolConfig.memoryPoolType, memoryPoolConfig.address);
        assert_eq!(got, [4, 8, 12, 16, 24, 32, 40, 52, 60, 72, 80, 88, 128]);
    }

    #[test]
    fn memory_record_fields_and_unknown_operations() {
        let mut rec = [0u8; 128];
        let put = |rec: &mut [u8; 128], off: usize, v: &[u8]| rec[off..off + v.len()].copy_from_slice(v);
        put(&mut rec, 4, &2u32.to_le_bytes());
        put(&mut rec, 8, &42u32.to_le_bytes()); // a memory kind newer than this version
        put(&mut rec, 12, &9u32.to_le_bytes());
        put(&mut rec, 16, &0x7f00_0000_1000u64.to_le_bytes());
        put(&mut rec, 24, &4096u64.to_le_bytes());
        put(&mut rec, 52, &1u32.to_le_bytes());
        put(&mut rec, 60, &5u32.to_le_bytes());
        put(&mut rec, 72, &1u32.to_le_bytes());
        put(&mut rec, 80, &2u32.to_le_bytes());
        put(&mut rec, 88, &0xabcdu64.to_le_bytes());
        // Safety: a whole record.
        let m = unsafe { mem_of(rec.as_ptr()) }.expect("a release");
        let want = trace::MemActivity {
            op: trace::MemActivityOp::Release,
            memory_kind: trace::CuptiMemoryKind::Unknown,
            addr: 0x7f00_0000_1000,
            size: 4096,
            stream: Some(5),
            correlation_id: 9,
            pc: 0,
            pool: Some(trace::MemPoolKind::Imported),
            pool_addr: Some(0xabcd),
        };
        assert_eq!((m.device, m.event), (1, want));
        // CUPTI_ACTIVITY_MEMORY_OPERATION_TYPE_INVALID
        put(&mut rec, 4, &0u32.to_le_bytes());
        // Safety: a whole record.
        assert!(unsafe { mem_of(rec.as_ptr()) }.is_none());
    }
}
