//! The hot path: a fixed-size event, a preallocated lock-free queue, the thread-local call depth,
//! and the clock. Nothing here allocates or blocks (except the one-off queue creation).

use std::cell::Cell;
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

use crossbeam_queue::ArrayQueue;

/// What a [`RawEvent`] is; the writer turns each into one `trace::Event`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum RawKind {
    /// `trace::Event::Alloc`.
    Alloc = 1,
    /// `trace::Event::Free`.
    Free = 2,
    /// `trace::Event::Vmm`; the op is in [`RawEvent::sub`].
    Vmm = 3,
    /// `trace::Event::KernelLaunch`; [`RawEvent::aux`] holds the function, `sub` its [`FuncKind`].
    Launch = 4,
    /// `trace::Event::PoolTrim`: `addr` = pool, `size` = bytes to keep.
    PoolTrim = 5,
    /// `trace::Event::Marker`: `aux` owns a leaked `Box<CString>` the writer frees.
    Marker = 6,
    /// `trace::Event::KernelExec` from CUPTI: `ts` = start, `size` = end (CLOCK_MONOTONIC ns),
    /// `addr` = registers, `offset` = static shared memory, `shared` = dynamic shared memory,
    /// `aux` = CUPTI's name pointer, `result` = correlation id, `caller` = device.
    KernelExec = 7,
}

/// How the writer resolves a launch's kernel name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum FuncKind {
    /// A runtime host stub address: `dladdr`.
    HostStub = 0,
    /// A driver `CUfunction`: `cuFuncGetName`.
    CuFunction = 1,
    /// A graph launch: no single kernel.
    Graph = 2,
}

/// One intercepted call, as the hook saw it. Plain old data, copied into the queue.
#[derive(Debug, Clone, Copy, Default)]
#[repr(C)]
pub struct RawEvent {
    /// CLOCK_MONOTONIC ns (absolute; the writer subtracts the origin).
    pub ts: u64,
    /// Address (or physical handle, pool, graph).
    pub addr: u64,
    /// Size in bytes.
    pub size: u64,
    /// Stream handle.
    pub stream: u64,
    /// Physical handle for a map, function for a launch, marker text pointer.
    pub aux: u64,
    /// Offset into the physical handle for a map.
    pub offset: u64,
    /// Return address in the calling module (0 = unknown).
    pub caller: u64,
    /// Grid dimensions.
    pub grid: [u32; 3],
    /// Block dimensions.
    pub block: [u32; 3],
    /// Dynamic shared memory.
    pub shared: u32,
    /// OS thread id.
    pub tid: u32,
    /// CUDA result code.
    pub result: i32,
    /// `trace::Api` code.
    pub api: u16,
    /// [`RawKind`] as u8.
    pub kind: u8,
    /// `MemoryKind` index, `VmmOp` index or [`FuncKind`].
    pub sub: u8,
}

/// Memory kinds as `RawEvent::sub` (the writer maps them to `trace::MemoryKind`).
pub mod mem {
    /// Device memory.
    pub const DEVICE: u8 = 0;
    /// Pinned host memory.
    pub const PINNED_HOST: u8 = 1;
    /// Managed memory.
    pub const MANAGED: u8 = 2;
    /// VMM physical handle.
    pub const PHYSICAL: u8 = 3;
    /// Registered host memory.
    pub const HOST_REGISTERED: u8 = 4;
    /// IPC import.
    pub const IPC_IMPORT: u8 = 5;
}

/// VMM operations as `RawEvent::sub`.
pub mod vmm {
    /// `cuMemAddressReserve`.
    pub const RESERVE: u8 = 0;
    /// `cuMemAddressFree`.
    pub const ADDRESS_FREE: u8 = 1;
    /// `cuMemMap`.
    pub const MAP: u8 = 2;
    /// `cuMemUnmap`.
    pub const UNMAP: u8 = 3;
    /// `cuMemSetAccess`.
    pub const SET_ACCESS: u8 = 4;
}

/// Per-thread state, in one thread-local so that a hook pays for one TLS lookup (in a shared
/// library each lookup is a `__tls_get_addr` call).
struct Tls {
    depth: Cell<u32>,
    internal: Cell<bool>,
    tid: Cell<u32>,
}

thread_local! {
    // A const initialiser and no Drop: no TLS destructor is registered, so this stays usable
    // while a thread is being torn down.
    static TLS: Tls = const { Tls { depth: Cell::new(0), internal: Cell::new(false), tid: Cell::new(0) } };
}

/// Marks the current thread as the shim's own (writer thread, own lookups): nothing it calls is
/// recorded and the `dlsym` hook never wraps for it.
pub fn set_internal(on: bool) {
    let _ = TLS.try_with(|t| t.internal.set(on));
}

/// Whether the current thread is inside the shim's own work.
pub fn is_internal() -> bool {
    TLS.try_with(|t| t.internal.get()).unwrap_or(false)
}

/// Forget the cached thread id (the fork child's only thread has a new one).
pub fn reset_tid_cache() {
    let _ = TLS.try_with(|t| t.tid.set(0));
}

fn tid_of(t: &Tls) -> u32 {
    let v = t.tid.get();
    if v != 0 {
        return v;
    }
    // Safety: gettid has no preconditions.
    let v = unsafe { libc::gettid() } as u32;
    t.tid.set(v);
    v
}

/// The OS thread id, cached per thread because `gettid` is a syscall.
pub fn tid() -> u32 {
    TLS.try_with(tid_of).unwrap_or_else(|_| {
        // Safety: gettid has no preconditions.
        unsafe { libc::gettid() as u32 }
    })
}

/// One level of hook nesting on this thread. Only the outermost level records: a runtime call
/// that reaches the driver through a wrapped pointer is one call.
pub struct Depth {
    /// The thread id when this is the outermost, recording level; 0 otherwise.
    tid: u32,
}

impl Depth {
    /// Enter a hook.
    #[inline]
    pub fn enter() -> Depth {
        let tid = TLS
            .try_with(|t| {
                let v = t.depth.get();
                t.depth.set(v + 1);
                if v == 0 && !t.internal.get() {
                    tid_of(t)
                } else {
                    0
                }
            })
            // TLS unavailable (thread teardown): record, with the thread id from the kernel.
            .unwrap_or_else(|_| tid());
        Depth { tid }
    }

    /// Whether this is the outermost hook on the thread (and the thread is not the shim's).
    #[inline]
    pub fn outer(&self) -> bool {
        self.tid != 0
    }

    /// The thread id (0 unless outermost).
    #[inline]
    pub fn tid(&self) -> u32 {
        self.tid
    }
}

impl Drop for Depth {
    #[inline]
    fn drop(&mut self) {
        let _ = TLS.try_with(|t| t.depth.set(t.depth.get().saturating_sub(1)));
    }
}

/// CLOCK_MONOTONIC in ns (vDSO, no syscall, no allocation).
#[inline]
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // Safety: ts is a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

static QUEUE: AtomicPtr<ArrayQueue<RawEvent>> = AtomicPtr::new(std::ptr::null_mut());
/// Events dropped because the queue stayed full.
pub static LOST: AtomicU64 = AtomicU64::new(0);

/// How long a producer waits for room while the writer makes no progress at all before it
/// drops the event. While the writer drains (even slowly) producers wait: that is backpressure,
/// and losing events only because another thread won the race for a slot would be wrong. The
/// bound is generous because on an oversubscribed machine the writer can be descheduled for
/// hundreds of milliseconds; it exists for a writer that is truly stuck (a hung file system),
/// and after it fires, producers drop at once until the writer moves again.
const MAX_WAIT_NS: u64 = 1_000_000_000;

/// Events the writer has taken off the queue (its heartbeat).
pub static PROGRESS: AtomicU64 = AtomicU64::new(0);
/// The heartbeat value at which the writer was declared stalled (u64::MAX = not stalled). While
/// it still equals [`PROGRESS`], a full queue drops at once instead of waiting again.
static STALLED_AT: AtomicU64 = AtomicU64::new(u64::MAX);

/// The queue, creating it on first use with `capacity` slots.
pub fn queue(capacity: usize) -> &'static ArrayQueue<RawEvent> {
    let q = QUEUE.load(Ordering::Acquire);
    if !q.is_null() {
        // Safety: a published queue is never freed (a fork child replaces, and leaks, its copy).
        return unsafe { &*q };
    }
    let fresh = Box::into_raw(Box::new(ArrayQueue::new(capacity)));
    match QUEUE.compare_exchange(std::ptr::null_mut(), fresh, Ordering::AcqRel, Ordering::Acquire) {
        // Safety: we just published it and never free it.
        Ok(_) => unsafe { &*fresh },
        Err(won) => {
            // Safety: `fresh` was never shared.
            drop(unsafe { Box::from_raw(fresh) });
            // Safety: as above for the winner.
            unsafe { &*won }
        }
    }
}

/// The queue if it exists (the writer and the exit path never create it).
pub fn existing_queue() -> Option<&'static ArrayQueue<RawEvent>> {
    let q = QUEUE.load(Ordering::Acquire);
    // Safety: published queues live forever.
    (!q.is_null()).then(|| unsafe { &*q })
}

/// In a fork child: abandon the parent's queue (its events belong to the parent's trace).
pub fn forget_queue() {
    QUEUE.store(std::ptr::null_mut(), Ordering::Release);
    LOST.store(0, Ordering::Relaxed);
}

/// Push an event; when the queue stays full past a bounded wait, drop it and count it. Returns
/// the event back when it was dropped so that owned payloads can be released.
pub fn push(q: &ArrayQueue<RawEvent>, ev: RawEvent) -> Result<(), RawEvent> {
    let mut ev = match q.push(ev) {
        Ok(()) => return Ok(()),
        Err(e) => e,
    };
    let mut seen = PROGRESS.load(Ordering::Acquire);
    if STALLED_AT.load(Ordering::Relaxed) == seen {
        LOST.fetch_add(1, Ordering::Relaxed);
        return Err(ev);
    }
    let mut since = now_ns();
    let mut spins = 0u32;
    loop {
        spins += 1;
        if spins < 64 {
            std::hint::spin_loop();
        } else {
            let p = PROGRESS.load(Ordering::Acquire);
            let now = now_ns();
            if p != seen {
                seen = p;
                since = now;
            } else if now - since > MAX_WAIT_NS {
                STALLED_AT.store(p, Ordering::Relaxed);
                LOST.fetch_add(1, Ordering::Relaxed);
                return Err(ev);
            }
            // Sleeping (not yielding) hands the core to the writer: with more producers than
            // cores, sched_yield alone keeps the writer starved.
            let pause = libc::timespec { tv_sec: 0, tv_nsec: 50_000 };
            // Safety: nanosleep with a valid timespec.
            unsafe { libc::nanosleep(&pause, std::ptr::null_mut()) };
        }
        ev = match q.push(ev) {
            Ok(()) => return Ok(()),
            Err(e) => e,
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stalled_writer_drops_after_the_bound_then_at_once() {
        let q = ArrayQueue::new(1);
        let ev = RawEvent { addr: 1, ..RawEvent::default() };
        assert!(push(&q, ev).is_ok());
        let before = LOST.load(Ordering::Relaxed);
        // Nobody drains: the first push waits out the bound, the next one fails immediately.
        let t0 = now_ns();
        assert_eq!(push(&q, ev).map_err(|e| e.addr), Err(1));
        let waited = now_ns() - t0;
        assert!(waited >= MAX_WAIT_NS, "{waited}");
        let t1 = now_ns();
        assert!(push(&q, ev).is_err());
        assert!(now_ns() - t1 < MAX_WAIT_NS / 2);
        assert_eq!(LOST.load(Ordering::Relaxed) - before, 2);
        // Progress clears the stall: a push succeeds again once there is room.
        q.pop();
        PROGRESS.fetch_add(1, Ordering::Release);
        assert!(push(&q, ev).is_ok());
    }

    #[test]
    fn only_the_outermost_hook_records() {
        let a = Depth::enter();
        let b = Depth::enter();
        assert!(a.outer() && !b.outer());
        drop(b);
        drop(a);
        set_internal(true);
        assert!(!Depth::enter().outer());
        set_internal(false);
        assert!(Depth::enter().outer());
    }
}
