//! Per-thread single-producer/single-consumer rings, and the shared queue for threads that
//! have none.
//!
//! A thread gets its ring on its first recorded call (allocated once, registered in a
//! lock-free list the writer walks, reused by a later thread once drained). Pushing is a slot
//! write and one release store: no compare-and-swap, no cache line shared with other producers.
//! A thread whose TLS is being torn down cannot keep a ring (it could not give it back), so it
//! pushes to one shared `ArrayQueue` instead, tagged with its thread id.

use std::cell::UnsafeCell;
use std::mem::MaybeUninit;
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering};

use crossbeam_queue::ArrayQueue;

use crate::clock::now_ns;
use crate::event::RawEvent;

/// Keeps the producer's and the consumer's indices on separate cache lines.
#[repr(align(64))]
struct Padded<T>(T);

/// One thread's ring.
pub struct Ring {
    /// Next slot the producer writes.
    tail: Padded<AtomicUsize>,
    /// The producer's last view of `head` (producer-only).
    seen_head: UnsafeCell<usize>,
    /// Next slot the writer reads.
    head: Padded<AtomicUsize>,
    /// The owning thread's id, for the records.
    tid: AtomicU32,
    /// A live thread pushes to this ring.
    owned: AtomicBool,
    /// Events its owners dropped past `MEMTRACE_MAX_BYTES` ([`count_unrecorded`]); kept when a
    /// thread ends and its ring passes to another, so the summary still counts them.
    unrecorded: AtomicU64,
    next: AtomicPtr<Ring>,
    mask: usize,
    slots: Box<[UnsafeCell<MaybeUninit<RawEvent>>]>,
}

// Safety: the slots are written by the one owning thread and read by the writer only between
// `head` and `tail`, with release/acquire ordering on those indices.
unsafe impl Sync for Ring {}

static RINGS: AtomicPtr<Ring> = AtomicPtr::new(ptr::null_mut());
static SHARED: AtomicPtr<ArrayQueue<(u32, RawEvent)>> = AtomicPtr::new(ptr::null_mut());
/// Events the writer has taken from the shared queue (only the writer pops, and reads it).
static SHARED_TAKEN: AtomicU64 = AtomicU64::new(0);

/// Events dropped because a queue stayed full.
pub static LOST: AtomicU64 = AtomicU64::new(0);
/// Events dropped past `MEMTRACE_MAX_BYTES` by threads without a ring (none taken yet, or torn
/// down); those with one count in it ([`count_unrecorded`]).
static SHARED_UNRECORDED: AtomicU64 = AtomicU64::new(0);
/// The writer's heartbeat: moves on every sweep and while it encodes.
pub static PROGRESS: AtomicU64 = AtomicU64::new(0);
/// The heartbeat value at which the writer was declared stalled (u64::MAX = not stalled).
static STALLED_AT: AtomicU64 = AtomicU64::new(u64::MAX);

/// How long a producer waits for room while the writer makes no progress at all before it
/// drops the event, by default (`MEMTRACE_MAX_WAIT_MS` sets it). While the writer drains (even
/// slowly) producers wait: that is backpressure.
/// The bound is generous because on an oversubscribed machine the writer can be descheduled
/// for hundreds of milliseconds; it exists for a writer that is truly stuck (a hung file
/// system), and after it fires, producers drop at once until the writer moves again.
pub const MAX_WAIT_NS: u64 = crate::config::DEFAULT_MAX_WAIT_MS * 1_000_000;

/// Whether `bytes` can be allocated now. Rust aborts the process when an allocation fails (a
/// tight RLIMIT_AS or cgroup): the shim asks first, with the allocator's fallible call, and
/// stops recording instead.
fn can_allocate(bytes: usize, align: usize) -> bool {
    let Ok(layout) = std::alloc::Layout::from_size_align(bytes.max(1), align) else { return false };
    // Safety: a non-zero layout; the block is freed at once with the same layout.
    unsafe {
        let p = std::alloc::alloc(layout);
        if p.is_null() {
            return false;
        }
        std::alloc::dealloc(p, layout);
    }
    true
}

impl Ring {
    /// A ring of at least `capacity` slots, or `None` when its memory cannot be allocated.
    fn new(capacity: usize, tid: u32) -> Option<Ring> {
        let cap = capacity.checked_next_power_of_two()?;
        let mut slots = Vec::new();
        // Fallible: a failed reservation returns an error where `collect` would abort.
        slots.try_reserve_exact(cap).ok()?;
        slots.resize_with(cap, || UnsafeCell::new(MaybeUninit::uninit()));
        let slots = slots.into_boxed_slice();
        Some(Ring {
            tail: Padded(AtomicUsize::new(0)),
            seen_head: UnsafeCell::new(0),
            head: Padded(AtomicUsize::new(0)),
            tid: AtomicU32::new(tid),
            owned: AtomicBool::new(true),
            unrecorded: AtomicU64::new(0),
            next: AtomicPtr::new(ptr::null_mut()),
            mask: cap - 1,
            slots,
        })
    }

    /// Push from the owning thread if there is room now: plain loads and stores, inlined into
    /// every hook.
    #[inline(always)]
    pub fn try_push(&self, ev: &RawEvent) -> bool {
        let t = self.tail.0.load(Ordering::Relaxed);
        // Safety: only the owning thread touches seen_head.
        let seen = unsafe { &mut *self.seen_head.get() };
        if t.wrapping_sub(*seen) > self.mask {
            *seen = self.head.0.load(Ordering::Acquire);
            if t.wrapping_sub(*seen) > self.mask {
                return false;
            }
        }
        // Safety: slot t is outside [head, tail), so the writer does not read it now; `t & mask`
        // is in bounds because there are `mask + 1` slots.
        unsafe { (*self.slots.get_unchecked(t & self.mask).get()).write(*ev) };
        self.tail.0.store(t.wrapping_add(1), Ordering::Release);
        true
    }

    /// Push from the owning thread; waits (bounded) while full, then drops and counts.
    pub fn push(&self, ev: RawEvent) {
        if !self.try_push(&ev) && self.wait_for_room() {
            // There is room now (only this thread fills the ring).
            self.try_push(&ev);
        }
    }

    #[cold]
    fn wait_for_room(&self) -> bool {
        let t = self.tail.0.load(Ordering::Relaxed);
        wait(|| t.wrapping_sub(self.head.0.load(Ordering::Acquire)) <= self.mask)
    }

    /// Hand the writer up to `max` events pushed so far: `f(tid, event)` in push order.
    /// Returns how many, and whether events were left behind.
    /// The events are handed over in place: the producer cannot reuse their slots until `head`
    /// moves past them, after the last call.
    fn drain(&self, max: usize, f: &mut impl FnMut(u32, &RawEvent)) -> (usize, bool) {
        let h = self.head.0.load(Ordering::Relaxed);
        let t = self.tail.0.load(Ordering::Acquire);
        let tid = self.tid.load(Ordering::Relaxed);
        let avail = t.wrapping_sub(h);
        let n = avail.min(max);
        for i in 0..n {
            // Safety: slots in [head, tail) were fully written before tail was released, and stay
            // untouched until head is stored below; `& mask` is in bounds (`mask + 1` slots).
            let ev = unsafe { (*self.slots.get_unchecked(h.wrapping_add(i) & self.mask).get()).assume_init_ref() };
            f(tid, ev);
        }
        self.head.0.store(h.wrapping_add(n), Ordering::Release);
        (n, n < avail)
    }

    /// Events pushed and not yet drained.
    pub fn available(&self) -> usize {
        self.tail.0.load(Ordering::Acquire).wrapping_sub(self.head.0.load(Ordering::Relaxed))
    }

    /// The thread that owned this ring is gone; a later thread may take it once drained.
    pub fn release(&self) {
        self.owned.store(false, Ordering::Release);
    }
}

/// Wait, bounded, until `ready()`: spin, then sleep (handing the core to the writer), and give
/// up after [`MAX_WAIT_NS`] without writer progress, counting one lost event.
fn wait(mut ready: impl FnMut() -> bool) -> bool {
    let mut seen = PROGRESS.load(Ordering::Acquire);
    if STALLED_AT.load(Ordering::Relaxed) == seen {
        LOST.fetch_add(1, Ordering::Relaxed);
        return false;
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
            } else if now - since > max_wait_ns() {
                STALLED_AT.store(p, Ordering::Relaxed);
                LOST.fetch_add(1, Ordering::Relaxed);
                return false;
            }
            // Sleeping (not yielding) hands the core to the writer: with more producers than
            // cores, sched_yield alone keeps the writer starved.
            let pause = libc::timespec { tv_sec: 0, tv_nsec: 50_000 };
            // Safety: nanosleep with a valid timespec.
            unsafe { libc::nanosleep(&pause, ptr::null_mut()) };
        }
        if ready() {
            return true;
        }
    }
}

/// The configured bound (read only on this slow path, when a ring is full).
fn max_wait_ns() -> u64 {
    crate::config::config().max_wait_ms.saturating_mul(1_000_000)
}

fn rings() -> impl Iterator<Item = &'static Ring> {
    let mut p = RINGS.load(Ordering::Acquire);
    std::iter::from_fn(move || {
        // Safety: registered rings are never freed.
        let r = unsafe { p.as_ref() }?;
        p = r.next.load(Ordering::Acquire);
        Some(r)
    })
}

/// A ring for the calling thread: a drained one a finished thread left, or a new one (`None`
/// when its memory cannot be allocated). Allocates once per thread (never again on that
/// thread's hot path).
pub fn acquire(capacity: usize, tid: u32) -> Option<&'static Ring> {
    for r in rings() {
        if r.owned.compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
            if r.head.0.load(Ordering::Acquire) == r.tail.0.load(Ordering::Acquire) {
                r.tid.store(tid, Ordering::Relaxed);
                // Safety: we own the ring now; the previous owner is gone.
                unsafe { *r.seen_head.get() = r.head.0.load(Ordering::Relaxed) };
                return Some(r);
            }
            r.owned.store(false, Ordering::Release);
        }
    }
    let r: &'static Ring = Box::leak(Box::new(Ring::new(capacity, tid)?));
    let mut head = RINGS.load(Ordering::Acquire);
    loop {
        r.next.store(head, Ordering::Relaxed);
        match RINGS.compare_exchange_weak(head, r as *const Ring as *mut Ring, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return Some(r),
            Err(h) => head = h,
        }
    }
}

/// The shared queue for threads without a ring, created on first use (`None` when its memory
/// cannot be allocated: `ArrayQueue::new` would abort, so its size is asked for first, twice
/// over for its slots' stamps).
fn shared(capacity: usize) -> Option<&'static ArrayQueue<(u32, RawEvent)>> {
    let q = SHARED.load(Ordering::Acquire);
    if !q.is_null() {
        // Safety: a published queue is never freed.
        return Some(unsafe { &*q });
    }
    let slot = std::mem::size_of::<(u32, RawEvent)>() + std::mem::size_of::<usize>();
    if !can_allocate(capacity.checked_mul(2 * slot)?, 64) {
        return None;
    }
    let fresh = Box::into_raw(Box::new(ArrayQueue::new(capacity)));
    match SHARED.compare_exchange(ptr::null_mut(), fresh, Ordering::AcqRel, Ordering::Acquire) {
        // Safety: just published, never freed.
        Ok(_) => Some(unsafe { &*fresh }),
        Err(won) => {
            // Safety: `fresh` was never shared.
            drop(unsafe { Box::from_raw(fresh) });
            // Safety: as above for the winner.
            Some(unsafe { &*won })
        }
    }
}

/// Push to the shared queue (threads without a ring); bounded wait, then drop and count.
/// Returns the event when it was dropped, so owned payloads can be released.
pub fn push_shared(capacity: usize, tid: u32, ev: RawEvent) -> Result<(), RawEvent> {
    let Some(q) = shared(capacity) else {
        out_of_memory("the shared queue", capacity);
        return Err(ev);
    };
    let mut item = match q.push((tid, ev)) {
        Ok(()) => return Ok(()),
        Err(e) => e,
    };
    let mut pushed = false;
    let ok = wait(|| match q.push(item) {
        Ok(()) => {
            pushed = true;
            true
        }
        Err(e) => {
            item = e;
            false
        }
    });
    if ok && pushed {
        Ok(())
    } else {
        Err(item.1)
    }
}

/// An event the hooks dropped past `MEMTRACE_MAX_BYTES`, counted in `r`, the calling thread's
/// ring: every hooked call counts once the limit is reached, and one shared counter would put a
/// contended cache line into every hook of every thread. Only the owning thread writes its
/// ring's count, so a load and a store do (no read-modify-write). A thread without a ring counts
/// in the shared total.
pub fn count_unrecorded(r: Option<&Ring>) {
    match r {
        Some(r) => r.unrecorded.store(r.unrecorded.load(Ordering::Relaxed) + 1, Ordering::Relaxed),
        None => {
            SHARED_UNRECORDED.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Events the hooks dropped past `MEMTRACE_MAX_BYTES` (the writer counts those it had queued
/// already in its tally), on every thread, ended ones included: rings are never freed.
pub fn unrecorded() -> u64 {
    SHARED_UNRECORDED.load(Ordering::Relaxed) + rings().map(|r| r.unrecorded.load(Ordering::Relaxed)).sum::<u64>()
}

/// What one sweep handed over.
pub struct Sweep {
    /// Events.
    pub events: usize,
    /// Sources (rings, the shared queue) that had any.
    pub sources: usize,
    /// The smallest last stamp of a ring that still holds events: later events of other
    /// rings must wait, or they would be written before that ring's remaining ones.
    pub limit: Option<u64>,
}

/// The one ring that holds events, if no other source (ring or shared queue) does. Its events
/// are already in stamp order, so the writer can encode them straight from the ring.
pub fn lone_source() -> Option<&'static Ring> {
    let q = SHARED.load(Ordering::Acquire);
    // Safety: published queues live forever.
    if unsafe { q.as_ref() }.is_some_and(|q| !q.is_empty()) {
        return None;
    }
    let mut lone = None;
    for r in rings() {
        if r.tail.0.load(Ordering::Acquire) != r.head.0.load(Ordering::Relaxed) {
            if lone.is_some() {
                return None;
            }
            lone = Some(r);
        }
    }
    lone
}

/// Up to `max` events of one ring, in place (see [`lone_source`]).
pub fn drain_one(r: &Ring, max: usize, mut f: impl FnMut(u32, &RawEvent)) -> usize {
    let (n, _) = r.drain(max, &mut f);
    heartbeat();
    n
}

/// The writer's sweep: up to `max_per_ring` events of every ring, then the shared queue.
pub fn drain_all(max_per_ring: usize, mut f: impl FnMut(u32, &RawEvent)) -> Sweep {
    let mut s = Sweep { events: 0, sources: 0, limit: None };
    for r in rings() {
        let mut last = 0;
        let (k, more) = r.drain(max_per_ring, &mut |tid, ev| {
            last = ev.ts;
            f(tid, ev)
        });
        s.events += k;
        s.sources += usize::from(k > 0);
        if more {
            s.limit = Some(s.limit.map_or(last, |l: u64| l.min(last)));
        }
    }
    let (mut n, mut sources) = (s.events, s.sources);
    let q = SHARED.load(Ordering::Acquire);
    // Safety: published queues live forever.
    if let Some(q) = unsafe { q.as_ref() } {
        let mut k = 0;
        while let Some((tid, ev)) = q.pop() {
            f(tid, &ev);
            k += 1;
        }
        if k > 0 {
            SHARED_TAKEN.fetch_add(k as u64, Ordering::Relaxed);
        }
        n += k;
        sources += usize::from(k > 0);
    }
    heartbeat();
    Sweep { events: n, sources, ..s }
}

/// Events queued in every ring and the shared queue, not yet taken by the writer.
pub fn pending_events() -> u64 {
    behind(&mark())
}

/// Where every producer stood when the process began to exit: the events pushed by then,
/// which the writer must write before the trace's end, or count as lost.
pub struct Mark {
    rings: Vec<(&'static Ring, usize)>,
    /// The count of events taken from the shared queue once those queued at the mark are: the
    /// queue is first in, first out, so what is popped after that was pushed later.
    shared: u64,
}

/// The events queued now, in every ring and the shared queue ([`behind`]).
pub fn mark() -> Mark {
    let q = SHARED.load(Ordering::Acquire);
    // Safety: published queues live forever.
    let queued = unsafe { q.as_ref() }.map_or(0, |q| q.len());
    let shared = SHARED_TAKEN.load(Ordering::Relaxed) + queued as u64;
    Mark { rings: rings().map(|r| (r, r.tail.0.load(Ordering::Acquire))).collect(), shared }
}

/// Events queued before `m` that the writer has not taken yet.
pub fn behind(m: &Mark) -> u64 {
    let shared = m.shared.saturating_sub(SHARED_TAKEN.load(Ordering::Relaxed));
    let rings = m.rings.iter().map(|(r, t)| {
        // Past the mark once `head` reaches it; indices wrap, so compared as a signed distance.
        let d = t.wrapping_sub(r.head.0.load(Ordering::Acquire)) as isize;
        d.max(0) as u64
    });
    rings.sum::<u64>() + shared
}

/// Put a sweep's events (`batch`, after the events held back last time, `pending`) in the
/// order they are written: by stamp when more than one source contributed. Events that may
/// still be overtaken stay in `pending`: those stamped after `watermark` (taken just before the
/// sweep: a ring swept earlier may already hold later events than one swept after it), and
/// those after the last event taken from a ring that was cut short. `last_round` writes all.
pub fn order(
    batch: &mut Vec<(u32, RawEvent)>,
    pending: &mut Vec<(u32, RawEvent)>,
    sweep: &Sweep,
    watermark: u64,
    last_round: bool,
) {
    let mixed = sweep.sources > 1 || !pending.is_empty();
    if !mixed {
        // One ring's events are already in stamp order.
        return;
    }
    pending.append(batch);
    std::mem::swap(batch, pending);
    batch.sort_by_key(|(_, e)| e.ts);
    if last_round {
        return;
    }
    let limit = sweep.limit.map_or(watermark, |l| l.min(watermark));
    let cut = batch.partition_point(|(_, e)| e.ts <= limit);
    pending.extend(batch.drain(cut..));
}

/// The writer is alive: producers waiting for room keep waiting instead of dropping.
pub fn heartbeat() {
    PROGRESS.fetch_add(1, Ordering::Release);
}

/// In a fork child: the parent's queued events belong to the parent's trace, and its other
/// threads do not exist here. Empty every ring, free all but `keep` (the forking thread's),
/// which now belongs to `tid`.
pub fn reset_in_child(keep: Option<&Ring>, tid: u32) {
    for r in rings() {
        r.head.0.store(r.tail.0.load(Ordering::Relaxed), Ordering::Relaxed);
        // Safety: the child's only thread is running this; no producer pushes concurrently.
        unsafe { *r.seen_head.get() = r.head.0.load(Ordering::Relaxed) };
        let mine = keep.is_some_and(|k| ptr::eq(k, r));
        r.owned.store(mine, Ordering::Relaxed);
        r.unrecorded.store(0, Ordering::Relaxed);
        if mine {
            r.tid.store(tid, Ordering::Relaxed);
        }
    }
    SHARED.store(ptr::null_mut(), Ordering::Release);
    SHARED_TAKEN.store(0, Ordering::Relaxed);
    LOST.store(0, Ordering::Relaxed);
    SHARED_UNRECORDED.store(0, Ordering::Relaxed);
    STALLED_AT.store(u64::MAX, Ordering::Relaxed);
}

/// A queue's memory could not be allocated: recording stops for good (the host's calls are
/// forwarded as always), said once.
#[cold]
pub fn out_of_memory(what: &str, capacity: usize) {
    // Not counted as lost (a full queue): the trace's marker says recording stopped here.
    crate::state::OUT_OF_MEMORY.store(true, Ordering::Release);
    if crate::state::RECORDING.swap(false, Ordering::AcqRel) {
        let mib = capacity.saturating_mul(std::mem::size_of::<RawEvent>()) >> 20;
        crate::log!(
            Warn,
            "cannot allocate {what} ({capacity} events, about {mib} MiB; MEMTRACE_QUEUE sets it): recording stopped"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(addr: u64) -> RawEvent {
        RawEvent { addr, ..RawEvent::default() }
    }

    #[test]
    fn ring_keeps_order_and_wraps() {
        let r = Ring::new(4, 7).unwrap();
        let mut got = Vec::new();
        for round in 0..5u64 {
            for i in 0..4 {
                r.push(ev(round * 10 + i));
            }
            r.drain(usize::MAX, &mut |tid, e| got.push((tid, e.addr)));
        }
        let want: Vec<(u32, u64)> = (0..5u64).flat_map(|r| (0..4).map(move |i| (7, r * 10 + i))).collect();
        assert_eq!(got, want);
    }

    fn stamped(tid: u32, ts: u64) -> (u32, RawEvent) {
        (tid, RawEvent { ts, ..RawEvent::default() })
    }

    /// (thread, stamp) pairs.
    type Seq<'a> = &'a [(u32, u64)];

    /// (events, pending, sources, ring cut short at, watermark, last round) → (written, held).
    fn check_order(
        events: Seq,
        pending: Seq,
        sources: usize,
        limit: Option<u64>,
        watermark: u64,
        last_round: bool,
        expect: (Seq, Seq),
    ) {
        let mut b: Vec<_> = events.iter().map(|(t, s)| stamped(*t, *s)).collect();
        let mut p: Vec<_> = pending.iter().map(|(t, s)| stamped(*t, *s)).collect();
        let sweep = Sweep { events: b.len(), sources, limit };
        order(&mut b, &mut p, &sweep, watermark, last_round);
        let ts = |v: &Vec<(u32, RawEvent)>| v.iter().map(|(t, e)| (*t, e.ts)).collect::<Vec<_>>();
        assert_eq!((ts(&b), ts(&p)), (expect.0.to_vec(), expect.1.to_vec()));
    }

    #[test]
    fn sweeps_merge_rings_by_stamp_and_hold_back_what_may_be_overtaken() {
        // One ring: written as swept.
        check_order(&[(1, 5), (1, 9)], &[], 1, None, 7, false, (&[(1, 5), (1, 9)], &[]));
        // Two rings: merged; past the watermark held back.
        let two = [(1, 1), (1, 5), (1, 9), (2, 2), (2, 3), (2, 12)];
        check_order(&two, &[], 2, None, 10, false, (&[(1, 1), (2, 2), (2, 3), (1, 5), (1, 9)], &[(2, 12)]));
        // A ring cut short at stamp 5: nothing later is written before its remaining events.
        check_order(&two, &[], 2, Some(5), 10, false, (&[(1, 1), (2, 2), (2, 3), (1, 5)], &[(1, 9), (2, 12)]));
        // Held-back events join the next sweep in order.
        check_order(&[(1, 20)], &[(2, 12)], 1, None, 30, false, (&[(2, 12), (1, 20)], &[]));
        // The last round writes everything.
        check_order(
            &two,
            &[(3, 0)],
            2,
            Some(5),
            4,
            true,
            (&[(3, 0), (1, 1), (2, 2), (2, 3), (1, 5), (1, 9), (2, 12)], &[]),
        );
    }

    #[test]
    fn stalled_writer_drops_after_the_bound_then_at_once() {
        let r = Ring::new(1, 1).unwrap();
        r.push(ev(1));
        let before = LOST.load(Ordering::Relaxed);
        // Nobody drains: the first push waits out the bound, the next one fails immediately.
        let t0 = now_ns();
        r.push(ev(2));
        assert!(now_ns() - t0 >= MAX_WAIT_NS);
        let t1 = now_ns();
        r.push(ev(3));
        assert!(now_ns() - t1 < MAX_WAIT_NS / 2);
        assert_eq!(LOST.load(Ordering::Relaxed) - before, 2);
        // Progress clears the stall: a push succeeds again once there is room.
        let mut got = Vec::new();
        r.drain(usize::MAX, &mut |_, e| got.push(e.addr));
        PROGRESS.fetch_add(1, Ordering::Release);
        r.push(ev(4));
        r.drain(usize::MAX, &mut |_, e| got.push(e.addr));
        assert_eq!(got, [1, 4]);
    }
}
