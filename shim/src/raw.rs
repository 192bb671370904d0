//! The hot path: the thread-local call depth and the thread's ring.
//! Nothing here allocates or blocks, except taking the thread's ring on its first event.

use std::cell::Cell;

use crate::event::RawEvent;
use crate::ring::{self, Ring};

/// Per-thread state, in one thread-local block so that a hook pays for one TLS access. All-zero
/// bytes are its initial value (depth 0, not internal, no tid yet, no ring), which the
/// initial-exec block below relies on.
#[repr(C)]
pub struct Tls {
    depth: Cell<u32>,
    internal: Cell<bool>,
    tid: Cell<u32>,
    ring: Cell<*const Ring>,
}

// x86_64 Linux: the block lives in `.tbss` with the initial-exec TLS model. `thread_local!` in a
// shared library uses the general-dynamic model, where every access is a `__tls_get_addr` call
// (about 14 instructions), and a launch through the runtime pays it twice (the runtime hook and
// the driver hook the runtime reaches through a wrapped pointer). Initial-exec fixes the block's
// offset from the thread pointer at load time: an access is one `mov` and one `add`. That is
// sound for a library loaded at start-up (LD_PRELOAD: its TLS is part of the static block), and a
// later `dlopen` is served from glibc's static TLS surplus (the block is 24 bytes). The block
// lives as long as the thread, so hooks called during thread teardown still find it (the
// `thread_local!` fallback gets the same from a const initialiser and no destructor).
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
std::arch::global_asm!(
    ".pushsection .tbss.memtrace_tls,\"awT\",@nobits",
    ".p2align 3",
    ".globl memtrace_tls_block",
    ".hidden memtrace_tls_block",
    ".type memtrace_tls_block,@object",
    ".size memtrace_tls_block,24",
    "memtrace_tls_block:",
    ".zero 24",
    ".popsection",
);

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
const _: () = assert!(std::mem::size_of::<Tls>() == 24 && std::mem::align_of::<Tls>() <= 8);
// The hooks' entry points read these two fields in assembly (`hooks::forward_check`).
const _: () = assert!(std::mem::offset_of!(Tls, depth) == 0 && std::mem::offset_of!(Tls, internal) == 4);

/// This thread's [`Tls`]: always available (even during thread teardown).
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[inline(always)]
fn with_tls<R>(f: impl FnOnce(&Tls) -> R) -> Result<R, ()> {
    let p: usize;
    // Safety: reads the thread pointer (`fs:0` holds its own address on x86_64 Linux) and the
    // block's offset from it, which the dynamic linker wrote into the GOT at load time.
    unsafe {
        std::arch::asm!(
            "mov {p}, qword ptr [rip + memtrace_tls_block@GOTTPOFF]",
            "add {p}, qword ptr fs:[0]",
            p = out(reg) p,
            options(nostack, pure, readonly),
        )
    };
    // Safety: the block is 24 zero-initialised bytes, 8-aligned, private to this thread and
    // alive as long as it; all-zero is a valid `Tls` (see the type).
    Ok(f(unsafe { &*(p as *const Tls) }))
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
thread_local! {
    // A const initialiser and no Drop: no TLS destructor is registered, so this stays usable
    // while a thread is being torn down.
    static TLS: Tls = const {
        Tls { depth: Cell::new(0), internal: Cell::new(false), tid: Cell::new(0), ring: Cell::new(std::ptr::null()) }
    };
}

/// This thread's [`Tls`], or `Err` when it is gone.
#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
#[inline(always)]
fn with_tls<R>(f: impl FnOnce(&Tls) -> R) -> Result<R, ()> {
    TLS.try_with(f).map_err(|_| ())
}

thread_local! {
    // Gives the thread's ring back when the thread exits. Touched once per thread, when the
    // ring is taken; after it is destroyed the thread pushes to the shared queue.
    static RING_OWNER: RingOwner = const { RingOwner };
}

struct RingOwner;

impl Drop for RingOwner {
    fn drop(&mut self) {
        let _ = with_tls(|t| {
            let r = t.ring.replace(std::ptr::null());
            // Safety: rings are never freed.
            if let Some(r) = unsafe { r.as_ref() } {
                r.release();
            }
        });
    }
}

/// Marks the current thread as the shim's own (writer thread, own lookups): nothing it calls is
/// recorded and the `dlsym` hook never wraps for it.
pub fn set_internal(on: bool) {
    let _ = with_tls(|t| t.internal.set(on));
}

/// Whether the current thread is inside the shim's own work.
pub fn is_internal() -> bool {
    with_tls(|t| t.internal.get()).unwrap_or(false)
}

fn tid_of(t: &Tls) -> u32 {
    let v = t.tid.get();
    if v != 0 {
        return v;
    }
    let v = crate::state::gettid() as u32;
    t.tid.set(v);
    v
}

/// The OS thread id, cached per thread because `gettid` is a syscall.
pub fn tid() -> u32 {
    with_tls(tid_of).unwrap_or_else(|_| crate::state::gettid() as u32)
}

/// Fork child: its only thread has a new id; the parent's queued events are not its own.
pub fn reset_in_child() {
    let (ring, tid) = with_tls(|t| {
        t.tid.set(0);
        // Safety: rings are never freed.
        (unsafe { t.ring.get().as_ref() }, tid_of(t))
    })
    .unwrap_or((None, 0));
    ring::reset_in_child(ring, tid);
}

/// Queue an event from this thread: into its ring (taking one on first use), else into the
/// shared queue. Returns the event when it was dropped.
#[inline(always)]
fn push_from(t: &Tls, ev: RawEvent) -> Result<(), RawEvent> {
    // Safety: rings are never freed; this thread owns the one it holds.
    if let Some(r) = unsafe { t.ring.get().as_ref() } {
        r.push(ev);
        return Ok(());
    }
    push_first(t, ev)
}

#[cold]
fn push_first(t: &Tls, ev: RawEvent) -> Result<(), RawEvent> {
    let capacity = crate::config::config().queue;
    let tid = tid_of(t);
    // Only a thread that can still register a TLS destructor may take a ring: it must be able
    // to give it back.
    if !t.internal.get() && RING_OWNER.try_with(|_| ()).is_ok() {
        let Some(r) = ring::acquire(capacity, tid) else {
            ring::out_of_memory("a thread's ring", capacity);
            return Err(ev);
        };
        t.ring.set(r);
        r.push(ev);
        return Ok(());
    }
    ring::push_shared(capacity, tid, ev)
}

/// Count an event dropped past `MEMTRACE_MAX_BYTES` in this thread's ring, or in the shared
/// total when it has none ([`ring::count_unrecorded`]).
pub fn count_unrecorded() {
    // Safety: rings are never freed; this thread owns the one it holds, the only writer of its
    // count.
    let r = with_tls(|t| unsafe { t.ring.get().as_ref() }).ok().flatten();
    ring::count_unrecorded(r);
}

/// Queue an event from any thread (markers, the writer's own records path is separate).
pub fn push_any(ev: RawEvent) -> Result<(), RawEvent> {
    match with_tls(|t| push_from(t, ev)) {
        Ok(r) => r,
        Err(_) => ring::push_shared(crate::config::config().queue, tid(), ev),
    }
}

/// Whether a hook already runs on this thread, or the thread is the shim's own. Such a call
/// records nothing, so a recording hook forwards it straight away (a tail call) without
/// touching the depth: the runtime's launch reaching the driver's `cuLaunchKernel` through a
/// wrapped pointer then costs a few instructions instead of a second full hook. Resolver hooks
/// never take this shortcut: a pointer handed out inside another call must still be wrapped.
#[inline(always)]
pub fn nested() -> bool {
    with_tls(|t| t.depth.get() != 0 || t.internal.get()).unwrap_or(false)
}

/// One level of hook nesting on this thread. Only the outermost level records: a runtime call
/// that reaches the driver through a wrapped pointer is one call.
pub struct Depth {
    /// This thread's state; null when its TLS is gone (thread teardown).
    tls: *const Tls,
    outer: bool,
}

impl Depth {
    /// Enter a hook.
    #[inline]
    pub fn enter() -> Depth {
        with_tls(|t| {
            let v = t.depth.get();
            t.depth.set(v + 1);
            Depth { tls: t as *const Tls, outer: v == 0 && !t.internal.get() }
        })
        // TLS unavailable (thread teardown): record, through the shared queue.
        .unwrap_or(Depth { tls: std::ptr::null(), outer: true })
    }

    /// Whether this is the outermost hook on the thread (and the thread is not the shim's).
    #[inline]
    pub fn outer(&self) -> bool {
        self.outer
    }

    /// Queue an event into this thread's ring if it has one with room now (the hooks' common
    /// path).
    #[inline(always)]
    pub fn try_push(&self, ev: &RawEvent) -> bool {
        // Safety: `tls` points to this thread's TLS, alive for the whole hook call; rings are
        // never freed.
        match unsafe { self.tls.as_ref().and_then(|t| t.ring.get().as_ref()) } {
            Some(r) => r.try_push(ev),
            None => false,
        }
    }

    /// Queue an event recorded at this level. Returns the event when it was dropped.
    #[inline(always)]
    pub fn push(&self, ev: RawEvent) -> Result<(), RawEvent> {
        // Safety: `tls` points to this thread's TLS, alive for the whole hook call.
        match unsafe { self.tls.as_ref() } {
            Some(t) => push_from(t, ev),
            None => ring::push_shared(crate::config::config().queue, tid(), ev),
        }
    }
}

impl Drop for Depth {
    #[inline]
    fn drop(&mut self) {
        // Safety: as in `push`.
        if let Some(t) = unsafe { self.tls.as_ref() } {
            t.depth.set(t.depth.get().saturating_sub(1));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
