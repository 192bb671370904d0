//! The writer thread: drains the rings, writes the file, and flushes it while the process runs.
//! Turning raw events into records is [`translate`]; resolving caller modules and kernel names
//! off the hot path is [`names`]; the exit's last rounds are [`ending`]; the thread that flushes
//! CUPTI at a fatal signal is [`flusher`]; the exit summary is [`summary`]; the file itself is
//! [`file`].

mod ending;
mod file;
mod flusher;
mod names;
mod summary;
mod translate;

use std::collections::BTreeMap;
use std::ffi::{c_char, CString};
use std::sync::atomic::Ordering;
use std::time::Duration;

use trace::{BinaryWriter, Event, Header, Level, Marker, Record, ALLOCATOR_ENV_VARS};

use crate::clock::{self, now_ns};
use crate::config::{config, expand_out, names_pid, Config};
use crate::event::{RawEvent, RawKind};
use crate::state::{self, DONE, FLUSH, NOT_STARTED, RUNNING, WRITER};
use crate::{log, raw, ring};

use ending::Ending;
use file::{beside, open_own, process_start, std_stream_of, TraceFile};
use names::Names;
use summary::Tally;

/// Make the parked thread that flushes CUPTI at a fatal signal: as CUPTI starts.
pub use flusher::start as start_flush_thread;

/// A fork child has no flush thread: it was its parent's.
pub use flusher::forget_in_child as forget_flush_thread;

/// At most this many events per ring per sweep, so that a sweep's batch (72 bytes an event)
/// stays in the writer core's L2 cache: 16,384 made it 1.2 MB, and the batch was written and
/// read back from beyond L2 (a few ns less per launch when writer and caller share a core).
const SWEEP_PER_RING: usize = 2048;

/// How often buffered events reach the file while the process runs, so that a process killed
/// with SIGKILL leaves a trace readable up to a recent point.
const FLUSH_EVERY: Duration = Duration::from_millis(50);

/// How often an idle writer asks whether it is the process's last live thread ([`alone`]).
const ALONE_EVERY: Duration = Duration::from_millis(200);

/// How long the writer sleeps after a sweep that found nothing: [`IDLE_FIRST`], doubled after
/// each further empty sweep up to [`IDLE_LONGEST`], and back to the first after any event. A
/// fixed 200 µs woke an idle host's writer 5,000 times a second (a training step that waits on
/// the GPU makes no CUDA calls for seconds); the longest sleep wakes it 500 times. A thread fills
/// its ring (16,384 events by default) in no less than about 10 ms of back-to-back CUDA calls
/// (each costs a microsecond or more), so a burst that begins in a long sleep still finds room;
/// a full ring makes its thread wait for the writer, never drop, within `MEMTRACE_MAX_WAIT_MS`.
const IDLE_FIRST: Duration = Duration::from_micros(200);
const IDLE_LONGEST: Duration = Duration::from_millis(2);

/// The writer's sleeps between empty sweeps (see [`IDLE_FIRST`]).
struct Idle {
    next: Duration,
}

impl Idle {
    fn new() -> Self {
        Idle { next: IDLE_FIRST }
    }

    /// A sweep found events: the next empty one sleeps the shortest time.
    fn busy(&mut self) {
        self.next = IDLE_FIRST;
    }

    /// The sleep after this empty sweep. While the process is exiting, always the shortest: the
    /// exit waits on the writer.
    fn sleep(&mut self, finishing: bool) -> Duration {
        if finishing {
            return IDLE_FIRST;
        }
        let d = self.next;
        self.next = (d * 2).min(IDLE_LONGEST);
        d
    }
}

/// Whether every other thread of the process has ended: the main thread left by
/// `pthread_exit`, and the others after it. A process ends when its last thread does, and the
/// writer, which never ends by itself, kept such a process alive for ever (deaf to SIGTERM, which
/// it blocks). The main thread's state is read first (one small file); the other threads only
/// once it is gone. Without /proc nothing is known, and the writer stays.
fn alone(pid: u32) -> bool {
    // The shim's own threads: the process's count holds them too. Read before the count, so that
    // a thread made meanwhile (by a thread still alive) is never counted as ours without being
    // there.
    let ours = 1 + flusher::live();
    // One descriptor at a time, so that a program holding all but one open is still read; any
    // error (out of descriptors, no /proc) means "not known", never "ended".
    let main_gone = std::fs::read_to_string(format!("/proc/self/task/{pid}/stat"))
        .ok()
        .and_then(|stat| stat.rsplit_once(')')?.1.trim_start().chars().next())
        .is_some_and(|state| matches!(state, 'Z' | 'X'));
    if !main_gone {
        return false;
    }
    // The thread count keeps the ended main thread until the process ends: alone is it and the
    // shim's threads (this writer, and the parked CUPTI flush thread when there is one). One
    // read of one file, so no thread started meanwhile is missed.
    std::fs::read_to_string("/proc/self/status").ok().is_some_and(|status| {
        status.lines().find_map(|l| l.strip_prefix("Threads:")).and_then(|n| n.trim().parse::<u32>().ok())
            == Some(1 + ours)
    })
}

/// Start the writer thread if none runs. Called by the first recording hook.
pub fn ensure_started() {
    if WRITER.load(Ordering::Acquire) != NOT_STARTED {
        return;
    }
    if WRITER.compare_exchange(NOT_STARTED, RUNNING, Ordering::AcqRel, Ordering::Acquire).is_err() {
        return;
    }
    let b = std::thread::Builder::new();
    let spawned = spawn_blocked(b, state::WRITER_THREAD, c"memtrace-writer", |inherited| {
        let r = std::panic::catch_unwind(run);
        if r.is_err() {
            log!(Warn, "writer thread failed; recording stopped");
        }
        WRITER.store(DONE, Ordering::Release);
        // The CUPTI flush thread ends with the writer, before it: a process whose main thread
        // left by pthread_exit ends with its last thread, which must be this one.
        flusher::stop();
        if r.unwrap_or(false) {
            // This thread ends the process (glibc calls exit(0) as its last thread returns), and
            // the program's exit handlers run on it: as on a thread of the program, with the
            // signal mask of the one that made it (a signal the program keeps blocked for
            // `sigwait` stays blocked) and its calls its own.
            // Safety: sets this thread's mask to a valid set, the one it was born with.
            unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &inherited, std::ptr::null_mut()) };
            raw::set_internal(false);
        }
    });
    if let Err(e) = spawned {
        log!(Warn, "cannot start the writer thread ({e}); recording disabled");
        WRITER.store(DONE, Ordering::Release);
        // No CUPTI flush thread without a writer to end it.
        flusher::stop();
    }
}

/// Spawn `f` on a thread made by `b` that never runs the exit-signal handler: that handler
/// waits for the writer, and for the CUPTI flush the writer waits on. So it is born with
/// SIGINT, SIGTERM, SIGHUP, SIGQUIT and SIGABRT blocked (a new thread inherits its creator's mask, restored here at
/// once); a signal arriving meanwhile stays pending for the host's threads. SIGXFSZ (a file
/// size limit) and SIGPIPE (a FIFO's reader gone) are sent to the thread whose write caused
/// them, and by default end the process: blocked, the write fails instead, and recording stops.
/// `f` is given the creator's mask, the one the thread would have had.
///
/// The thread is known as one of the shim's (`state::SHIM_TIDS[slot]`: a fault or `abort()` on it
/// never waits for the trace) before it takes its `name`, so that nothing that finds it by name
/// (`/proc/self/task/*/comm`) finds it unknown: std's `Builder::name` would name it first.
fn spawn_blocked(
    b: std::thread::Builder,
    slot: usize,
    name: &'static std::ffi::CStr,
    f: impl FnOnce(libc::sigset_t) + Send + 'static,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    let old = block_signals();
    let spawned = b.spawn(move || {
        state::SHIM_TIDS[slot].store(state::gettid(), Ordering::Release);
        // Safety: PR_SET_NAME reads a NUL-terminated name (the kernel keeps its first 15 bytes)
        // and renames the calling thread only.
        unsafe { libc::prctl(libc::PR_SET_NAME, name.as_ptr()) };
        f(old)
    });
    // Safety: restores the mask saved above.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
    spawned
}

/// The writer thread's state: the open trace, the clock map, interned names and the tally.
struct Ctx {
    w: BinaryWriter<TraceFile>,
    origin: u64,
    clock: clock::Calibration,
    names: Names,
    tally: Tally,
    max_bytes: u64,
    limit_hit: bool,
}

fn header(cfg: &Config, pid: u32, origin: u64) -> Header {
    let mut h = Header::new("libmemtrace", env!("CARGO_PKG_VERSION"), Level::Device);
    h.pid = Some(pid);
    h.clock_origin_ns = Some(origin);
    let wall = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    h.start_wall_ns = Some((wall.as_nanos() as u64).saturating_sub(now_ns().saturating_sub(origin)));
    h.command_line = std::fs::read("/proc/self/cmdline")
        .map(|b| {
            b.split(|c| *c == 0).filter(|s| !s.is_empty()).map(|s| String::from_utf8_lossy(s).into_owned()).collect()
        })
        .unwrap_or_default();
    let mut host = [0u8; 256];
    // Safety: the buffer is valid for its length; gethostname NUL-terminates when it fits.
    if unsafe { libc::gethostname(host.as_mut_ptr().cast(), host.len() - 1) } == 0 {
        let end = host.iter().position(|c| *c == 0).unwrap_or(host.len());
        h.host_name = Some(String::from_utf8_lossy(&host[..end]).into_owned());
    }
    h.env = ALLOCATOR_ENV_VARS
        .iter()
        .filter_map(|k| std::env::var(k).ok().map(|v| (k.to_string(), v)))
        .collect::<BTreeMap<_, _>>();
    h.caching_disabled = h.env_var("PYTORCH_NO_CUDA_MEMORY_CACHING").is_some_and(truthy);
    h.set_meta(&trace::metadata::SHIM_KERNELS, (cfg.kernels as u8).to_string());
    if let Some(start) = process_start() {
        h.set_meta(&trace::metadata::SHIM_PROCESS_START, start.to_string());
    }
    h
}

/// PyTorch treats any value other than empty and "0" as set.
fn truthy(v: &str) -> bool {
    let v = v.trim();
    !v.is_empty() && v != "0"
}

/// The signals the writer blocks ([`block_signals`]): those sent to the process whose handler
/// completes the trace (`lifecycle::signals`: a terminal's or `kill`'s, and SIGABRT, which
/// `abort()` unblocks on the thread that aborts), so that it never runs on the thread that
/// writes the trace; and SIGXFSZ and SIGPIPE.
const WRITER_BLOCKS: [libc::c_int; 7] =
    [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT, libc::SIGABRT, libc::SIGXFSZ, libc::SIGPIPE];

/// Blocks [`WRITER_BLOCKS`] in the calling thread; returns the previous mask.
fn block_signals() -> libc::sigset_t {
    // Safety: plain sigset manipulation on local sets; affects only this thread.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for sig in WRITER_BLOCKS {
            libc::sigaddset(&mut set, sig);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old);
        old
    }
}

/// The trace could not be written (`doing` it failed with `e`): recording stops, said once,
/// with the events queued and not written (`held` of them held back by the writer) counted.
/// Events already encoded into the writer's buffer when the write failed are lost too, but the
/// encoder does not say how many of them reached the file: the count is a lower bound.
#[cold]
fn stopped(path: &str, doing: &str, e: &trace::TraceError, held: usize) {
    let dropped = ring::pending_events() + held as u64;
    ring::LOST.fetch_add(dropped, Ordering::Relaxed);
    log!(
        Warn,
        "{doing} {path} failed: {e:#}; recording stopped, the trace ends incomplete (without its exit record; \
         at least {dropped} events not written: {dropped} still queued, and those buffered when the write failed)"
    );
}

/// The writer's life; true when it ended as the process's last live thread ([`alone`]).
fn run() -> bool {
    raw::set_internal(true);
    let cfg = config();
    let pid = state::owner_pid();
    let origin = state::clock_origin();
    let mut wanted = expand_out(&cfg.out, pid);
    if state::FORK_CHILD.load(Ordering::Acquire) && !names_pid(&cfg.out) {
        // A stream (`/dev/stdout`, a FIFO) is the parent's: two writers would interleave their
        // frames, and nothing can be written beside a device.
        if std::fs::metadata(&wanted).is_ok_and(|m| !m.is_file() || std_stream_of(&m).is_some()) {
            log!(Warn, "MEMTRACE_OUT {wanted} is a stream: fork child pid {pid} does not trace (give a path with %p)");
            return false;
        }
        // The path is the parent's, which may not have opened it yet (its writer starts
        // lazily) and would then truncate this child's finished trace: the child writes beside.
        let own = beside(&wanted, &pid.to_string());
        log!(Warn, "MEMTRACE_OUT {wanted} has no %p: fork child pid {pid} traces into {own}");
        wanted = own;
    }
    let Some((file, path)) = open_own(wanted, pid) else { return false };
    let w = match BinaryWriter::new(TraceFile::new(file), &header(cfg, pid, origin)) {
        Ok(w) => w,
        Err(e) => {
            log!(Warn, "MEMTRACE_OUT: cannot write trace header to {path}: {e:#}; recording disabled");
            return false;
        }
    };
    log!(Info, "tracing pid {pid} into {path}");
    let names = Names::new();
    let clock = clock::Calibration::new(clock::anchor());
    let mut cx = Ctx { w, origin, clock, names, tally: Tally::default(), max_bytes: cfg.max_bytes, limit_hit: false };
    let mut last_flush = std::time::Instant::now();
    let mut dirty = false;
    let mut batch: Vec<(u32, RawEvent)> = Vec::new();
    let mut pending: Vec<(u32, RawEvent)> = Vec::new();
    let mut ending: Option<Ending> = None;
    let mut alone_checked = std::time::Instant::now();
    let mut ended_alone = false;
    let mut idle = Idle::new();
    loop {
        let finishing = state::finishing();
        if finishing && ending.is_none() {
            ending = Some(Ending::new());
        }
        // Events stamped after this may still be overtaken by events of a ring swept earlier;
        // see `ring::order`.
        let watermark = clock::stamp();
        // Finishing: sweep until every event queued before the exit is written (threads that
        // keep calling do not hold the exit up), or until the exit's wait runs out.
        let lone = if pending.is_empty() { ring::lone_source() } else { None };
        let swept = match lone {
            Some(r) => cx.sweep_in_place(r).map(|n| (n, ending.as_ref().is_some_and(|e| e.done(n)))),
            None => cx.sweep_merged(&mut batch, &mut pending, watermark, ending.as_ref(), &mut last_flush),
        };
        let (n, last_round) = match swept.and_then(|s| cx.drain_cupti(&mut dirty).map(|_| s)) {
            Ok(s) => s,
            Err(e) => {
                stopped(&path, "writing", &e, pending.len());
                return false;
            }
        };
        dirty |= n > 0;
        if last_round {
            if let Some(e) = &ending {
                e.count_abandoned();
            }
            cx.finish(&path, ending.as_ref().is_some_and(Ending::cupti_undelivered));
            return ended_alone;
        }
        if dirty && (FLUSH.swap(false, Ordering::AcqRel) || last_flush.elapsed() >= FLUSH_EVERY) {
            if let Err(e) = cx.w.flush() {
                stopped(&path, "flushing", &e, pending.len());
                return false;
            }
            last_flush = std::time::Instant::now();
            dirty = false;
        }
        if n > 0 {
            idle.busy();
        } else {
            if !finishing && alone_checked.elapsed() >= ALONE_EVERY {
                alone_checked = std::time::Instant::now();
                if alone(pid) {
                    // The trace is completed as at exit; the process ends when this thread does.
                    log!(
                        Info,
                        "every thread of pid {pid} has ended (the main thread by pthread_exit): completing the trace"
                    );
                    state::set_finish();
                    ended_alone = true;
                    continue;
                }
            }
            std::thread::sleep(idle.sleep(finishing));
        }
    }
}

impl Ctx {
    fn rec(&self, ts: u64, tid: u32, event: Event) -> Record {
        Record { ts_ns: Some(ts.saturating_sub(self.origin)), tid: Some(tid), device: None, event }
    }

    /// One source and nothing held back: its events are in stamp order already, so they are
    /// encoded straight from the ring's slots, with no copy into a batch. Returns how many.
    fn sweep_in_place(&mut self, r: &ring::Ring) -> Result<usize, trace::TraceError> {
        // Only events pushed before the clock map's newest sample: their stamps are converted
        // between samples, never extrapolated past the last one (which a later sample could
        // contradict by a few ns, out of order).
        let take = r.available().min(SWEEP_PER_RING);
        self.clock.refresh();
        let mut failed = None;
        let mut i = 0u32;
        let n = ring::drain_one(r, take, |tid, ev| {
            if failed.is_none() {
                failed = self.handle(tid, ev).err();
            }
            i += 1;
            if i.is_multiple_of(1024) {
                ring::heartbeat();
            }
        });
        failed.map_or(Ok(n), Err)
    }

    /// Several sources (or events held back last time): copy the sweep into `batch`, merge by
    /// stamp, write what can no longer be overtaken and hold back the rest in `pending`
    /// (`ring::order`). The last round ([`Ending::done`]) writes everything. Returns how many
    /// events the sweep took, and whether it was the last round.
    fn sweep_merged(
        &mut self,
        batch: &mut Vec<(u32, RawEvent)>,
        pending: &mut Vec<(u32, RawEvent)>,
        watermark: u64,
        ending: Option<&Ending>,
        last_flush: &mut std::time::Instant,
    ) -> Result<(usize, bool), trace::TraceError> {
        let sweep = ring::drain_all(SWEEP_PER_RING, |tid, ev| batch.push((tid, *ev)));
        // After the sweep: every stamp it took is older than the clock map's newest sample.
        self.clock.refresh();
        let n = sweep.events;
        let last_round = ending.is_some_and(|e| e.done(n));
        if batch.is_empty() && pending.is_empty() {
            return Ok((n, last_round));
        }
        ring::order(batch, pending, &sweep, watermark, last_round);
        for (i, (tid, ev)) in batch.iter().enumerate() {
            self.handle(*tid, ev)?;
            if i % 1024 == 1023 {
                ring::heartbeat();
            }
            if i % 8192 == 8191 && last_flush.elapsed() >= FLUSH_EVERY {
                let _ = self.w.flush();
                *last_flush = std::time::Instant::now();
            }
        }
        batch.clear();
        Ok((n, last_round))
    }

    /// Write what CUPTI delivered since the last sweep.
    fn drain_cupti(&mut self, dirty: &mut bool) -> Result<(), trace::TraceError> {
        for a in crate::cupti::take() {
            self.cupti(a)?;
            *dirty = true;
        }
        Ok(())
    }

    /// Write one record, then stop recording (with a marker) once past `MEMTRACE_MAX_BYTES`.
    fn write_checked(&mut self, r: &Record) -> Result<(), trace::TraceError> {
        self.w.write(r)?;
        self.check_limit()
    }

    #[inline(always)]
    fn check_limit(&mut self) -> Result<(), trace::TraceError> {
        if self.max_bytes != 0 && self.w.bytes_written() >= self.max_bytes {
            return self.limit_reached();
        }
        Ok(())
    }

    #[cold]
    #[inline(never)]
    fn limit_reached(&mut self) -> Result<(), trace::TraceError> {
        self.limit_hit = true;
        // The text memsim reads as "recording stopped here" (one owner: `trace::marker`).
        let text = trace::marker::byte_limit(self.max_bytes);
        let r = self.rec(now_ns(), raw::tid(), Event::Marker(Marker { text }));
        self.w.write(&r)?;
        self.w.flush()?;
        state::stop_recording();
        log!(Warn, "MEMTRACE_MAX_BYTES={} reached; recording stopped", self.max_bytes);
        Ok(())
    }
}

/// An event the hooks did not queue (recording stopped, no writer, a queue full): what it owns
/// is freed, and past `MEMTRACE_MAX_BYTES` it is counted as not recorded.
pub fn release(ev: &RawEvent) {
    if state::limit_reached() {
        raw::count_unrecorded();
    }
    free_owned(ev);
}

/// Free what an event owns when it is not written.
fn free_owned(ev: &RawEvent) {
    if ev.kind == RawKind::Marker && ev.aux != 0 {
        // Safety: see Ctx::handle; an event is either written or released, never both.
        drop(unsafe { CString::from_raw(ev.aux as *mut c_char) });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_sleeps_grow_to_the_longest_and_reset_on_events() {
        let mut idle = Idle::new();
        let us = |d: Duration| d.as_micros();
        let first: Vec<_> = (0..6).map(|_| us(idle.sleep(false))).collect();
        assert_eq!(first, [200, 400, 800, 1600, 2000, 2000]);
        // An exit in progress never waits long, and does not move the schedule.
        assert_eq!(us(idle.sleep(true)), 200);
        assert_eq!(us(idle.sleep(false)), 2000);
        idle.busy();
        assert_eq!(us(idle.sleep(false)), 200);
        assert_eq!(us(idle.sleep(false)), 400);
    }
}
