//! The writer thread: drains the rings, writes the file, and flushes it while the process runs.
//! Turning raw events into records is [`translate`]; resolving caller modules and kernel names
//! off the hot path is [`names`]; the exit summary is [`summary`].

mod names;
mod summary;
mod translate;

use std::collections::BTreeMap;
use std::ffi::{c_char, CString};
use std::fs::File;
use std::sync::atomic::Ordering;
use std::time::Duration;

use trace::{BinaryWriter, Event, Header, Level, Marker, Record, ALLOCATOR_ENV_VARS};

use crate::clock::{self, now_ns};
use crate::config::{config, expand_out, names_pid, Config};
use crate::event::{RawEvent, RawKind};
use crate::state::{self, DONE, FINISH, FLUSH, NOT_STARTED, RUNNING, WRITER};
use crate::{log, raw, ring};

use names::Names;
use summary::Tally;

/// At most this many events per ring per sweep, so that a sweep's batch (72 bytes an event)
/// stays in the writer core's L2 cache: 16,384 made it 1.2 MB, and the batch was written and
/// read back from beyond L2 (a few ns less per launch when writer and caller share a core).
const SWEEP_PER_RING: usize = 2048;

/// How often buffered events reach the file while the process runs, so that a process killed
/// with SIGKILL leaves a trace readable up to a recent point.
const FLUSH_EVERY: Duration = Duration::from_millis(50);

/// How often an idle writer asks whether it is the process's last live thread ([`alone`]).
const ALONE_EVERY: Duration = Duration::from_millis(200);

/// Whether every other thread of the process has ended: the main thread left by
/// `pthread_exit`, and the others after it. A process ends when its last thread does, and the
/// writer, which never ends by itself, kept such a process alive for ever (deaf to SIGTERM, which
/// it blocks). The main thread's state is read first (one small file); the other threads only
/// once it is gone. Without /proc nothing is known, and the writer stays.
fn alone(pid: u32) -> bool {
    // One descriptor at a time, so that a program holding all but one open is still read; any
    // error (out of descriptors, no /proc) means "not known", never "ended".
    let main_gone = std::fs::read_to_string(format!("/proc/self/task/{pid}/stat"))
        .ok()
        .and_then(|stat| stat.rsplit_once(')')?.1.trim_start().chars().next())
        .is_some_and(|state| matches!(state, 'Z' | 'X'));
    if !main_gone {
        return false;
    }
    // The thread count keeps the ended main thread until the process ends: two is it and this
    // writer. One read of one file, so no thread started meanwhile is missed.
    std::fs::read_to_string("/proc/self/status").ok().is_some_and(|status| {
        status.lines().find_map(|l| l.strip_prefix("Threads:")).and_then(|n| n.trim().parse::<u32>().ok()) == Some(2)
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
    // The writer must never run the exit-signal handler: that handler waits for the writer. So
    // it is born with SIGINT and SIGTERM blocked (a new thread inherits its creator's mask); a
    // signal arriving meanwhile stays pending for the host's threads. SIGXFSZ (a file size
    // limit) and SIGPIPE (a FIFO's reader gone) are sent to the thread whose write caused them,
    // and by default end the process: blocked, the write fails instead, and recording stops.
    let old = block_signals();
    let spawned = std::thread::Builder::new().name("memtrace-writer".into()).spawn(|| {
        let r = std::panic::catch_unwind(run);
        if r.is_err() {
            log!(Warn, "writer thread failed; recording stopped");
        }
        WRITER.store(DONE, Ordering::Release);
        if r.unwrap_or(false) {
            // This thread ends the process (glibc calls exit(0) as its last thread returns), and
            // the program's exit handlers run on it: as on any thread of the program, with its
            // signals open and its calls its own.
            unblock_signals();
            raw::set_internal(false);
        }
    });
    // Safety: restores the mask saved above.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
    if let Err(e) = spawned {
        log!(Warn, "cannot start the writer thread ({e}); recording disabled");
        WRITER.store(DONE, Ordering::Release);
    }
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

/// The signals the writer blocks ([`block_signals`]).
const WRITER_BLOCKS: [libc::c_int; 4] = [libc::SIGINT, libc::SIGTERM, libc::SIGXFSZ, libc::SIGPIPE];

/// Unblocks [`WRITER_BLOCKS`] in the calling thread.
fn unblock_signals() {
    // Safety: plain sigset manipulation on a local set; affects only this thread.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for sig in WRITER_BLOCKS {
            libc::sigaddset(&mut set, sig);
        }
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
    }
}

/// Blocks SIGINT, SIGTERM, SIGXFSZ and SIGPIPE in the calling thread; returns the previous
/// mask.
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

/// The open trace file, published in [`state::TRACE_FD`] for a fork child to close. The
/// descriptor is withdrawn before it closes, so a later fork child never closes a reused number.
struct TraceFile(File);

impl TraceFile {
    fn new(file: File) -> Self {
        use std::os::fd::AsRawFd;
        state::TRACE_FD.store(file.as_raw_fd(), Ordering::Release);
        Self(file)
    }
}

impl std::io::Write for TraceFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

impl Drop for TraceFile {
    fn drop(&mut self) {
        state::TRACE_FD.store(-1, Ordering::Release);
    }
}

fn is_fifo(path: &str) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::metadata(path).is_ok_and(|m| m.file_type().is_fifo())
}

/// Writes to `file` wait for the reader again (it was opened non-blocking): a pipe's reader that
/// is slower than the program must not make the writer drop the trace.
fn blocking(file: &File) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let fd = file.as_raw_fd();
    // Safety: reading and setting the status flags of a descriptor this function's caller owns.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // Safety: as above.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The trace file of this process, locked for its lifetime. The trace goes straight to its final
/// path, not through a rename: a process killed with SIGKILL must still leave a trace readable up
/// to its last complete frame. A path another live process holds (a fork or exec child under an
/// `MEMTRACE_OUT` without `%p`, or two ranks given one file) is left to it: truncating it would
/// corrupt that process's trace, so this one writes beside it, `NAME.PID.EXT`, and says so.
fn open_own(wanted: String, pid: u32) -> Option<(File, String)> {
    let mut path = wanted.clone();
    // Earlier images of this process (exec without fork) whose traces were found, each kept.
    let mut images = 0u32;
    for attempt in 0..16 {
        use std::os::unix::fs::OpenOptionsExt;
        // Non-blocking open: a FIFO no process reads would block the writer for good, the
        // rings would fill and the program's exit would wait on a writer that never started.
        let opened = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .custom_flags(libc::O_NONBLOCK)
            .open(&path);
        let file = match opened {
            Ok(f) => f,
            // ENXIO is also a socket behind /proc/self/fd, or /dev/tty without a terminal.
            Err(e) if e.raw_os_error() == Some(libc::ENXIO) && is_fifo(&path) => {
                log!(Warn, "MEMTRACE_OUT {path} is a pipe no process reads; recording disabled");
                return None;
            }
            Err(e) => {
                log!(Warn, "cannot create trace file {path}: {e}; recording disabled");
                return None;
            }
        };
        if let Err(e) = blocking(&file) {
            log!(Warn, "cannot write the trace to {path}: {e}; recording disabled");
            return None;
        }
        // A device, pipe or terminal (`/dev/stdout`, a FIFO) streams the trace: nothing to
        // lock or truncate, and nothing written beside it.
        let meta = file.metadata();
        if !meta.as_ref().is_ok_and(|m| m.is_file()) {
            return Some((file, path));
        }
        // `/dev/stdout` with stdout redirected to a file opens that file afresh, at offset 0:
        // truncating it erased the program's output, and the program then wrote over the trace.
        // The trace shares the stream's offset instead, as it does through a pipe.
        if let Some(fd) = meta.as_ref().ok().and_then(std_stream_of) {
            // Safety: duplicating a descriptor the process has open; the new one is ours.
            let dup = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 3) };
            if dup < 0 {
                let e = std::io::Error::last_os_error();
                log!(Warn, "cannot write the trace to {path}, this program's fd {fd}: {e}; recording disabled");
                return None;
            }
            use std::os::fd::FromRawFd;
            // Safety: `dup` is a fresh descriptor nothing else owns.
            let stream = unsafe { File::from_raw_fd(dup) };
            // An exec'd child (torchrun's workers, a subprocess) inherits the stream its parent
            // traces into: two traces in one stream cannot be read apart.
            if traced_already(&path) {
                log!(
                    Warn,
                    "MEMTRACE_OUT {path} is this program's output, where another process already writes a trace: \
                     pid {pid} does not trace (give a path with %p)"
                );
                return None;
            }
            return Some((stream, path));
        }
        use std::os::fd::AsRawFd;
        // Safety: flock on a descriptor this function owns; LOCK_NB never blocks. The lock lives
        // as long as the descriptor, which the writer holds until the trace is complete.
        let locked = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        let held = locked != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EWOULDBLOCK);
        if !held {
            // This process's own trace, written before it exec'd this image (the lock went with
            // the old image's descriptor): truncating it erased that trace in silence.
            if own_earlier_trace(&path, pid) {
                images += 1;
                let tag = if images == 1 { pid.to_string() } else { format!("{pid}.{images}") };
                let beside = beside(&wanted, &tag);
                log!(
                    Warn,
                    "trace file {path} holds this process's trace from before it exec'd this program; pid {pid} \
                     traces into {beside}"
                );
                path = beside;
                continue;
            }
            // Locked, or a file system without locks (then as before: ours to truncate).
            if let Err(e) = file.set_len(0) {
                log!(Warn, "cannot truncate trace file {path}: {e}; recording disabled");
                return None;
            }
            return Some((file, path));
        }
        if attempt > 0 {
            break;
        }
        let beside = beside(&path, &pid.to_string());
        log!(
            Warn,
            "trace file {path} is being written by another process (MEMTRACE_OUT without %p?); \
             pid {pid} traces into {beside}"
        );
        path = beside;
    }
    log!(Warn, "trace file {path} is being written by another process too; recording disabled");
    None
}

/// Whether the first 64 KiB of a regular file hold a trace's magic (the parent's header, which
/// reaches the file as soon as its writer starts, after whatever the program printed first).
/// Opened afresh for reading: the stream itself is usually write-only.
fn traced_already(path: &str) -> bool {
    use std::io::Read;
    let mut head = Vec::with_capacity(64 << 10);
    let read = File::open(path).and_then(|f| f.take(64 << 10).read_to_end(&mut head));
    read.is_ok() && head.windows(trace::codec::MAGIC.len()).any(|w| w == trace::codec::MAGIC)
}

/// This process's start time (`/proc/self/stat` field 22, clock ticks since boot): an exec
/// keeps it, and a later process given the same pid (a container's pid 1, run again) has
/// another.
fn process_start() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command, which may hold spaces: the state is field 3, the start 22.
    stat.rsplit_once(')')?.1.split_whitespace().nth(19)?.parse().ok()
}

/// Whether the file at `path` holds a trace of this very process before an exec: its header's
/// pid and start time are this process's. Opened afresh for reading: the writer's descriptor
/// is write-only.
fn own_earlier_trace(path: &str, pid: u32) -> bool {
    let Some(start) = process_start() else { return false };
    let Ok(f) = File::open(path) else { return false };
    trace::open_reader(std::io::BufReader::new(f)).is_ok_and(|r| {
        let h = r.header();
        h.pid == Some(pid) && h.meta(&trace::metadata::SHIM_PROCESS_START) == Some(start.to_string().as_str())
    })
}

/// The program's stdout or stderr, when `meta` is the file one of them writes to.
fn std_stream_of(meta: &std::fs::Metadata) -> Option<i32> {
    use std::os::unix::fs::MetadataExt;
    [1, 2].into_iter().find(|&fd| {
        // Safety: an all-zero `stat` is a valid value of this plain C struct.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // Safety: fstat fills a local struct; a closed descriptor only returns an error.
        let ok = unsafe { libc::fstat(fd, &mut st) } == 0;
        ok && st.st_dev == meta.dev() && st.st_ino == meta.ino()
    })
}

/// `dir/NAME.TAG.EXT` beside `dir/NAME.EXT` (`PATH.TAG` without an extension); the tag is a
/// pid.
fn beside(path: &str, pid: &str) -> String {
    let p = std::path::Path::new(path);
    match (p.file_stem(), p.extension()) {
        (Some(stem), Some(ext)) => p
            .with_file_name(format!("{}.{pid}.{}", stem.to_string_lossy(), ext.to_string_lossy()))
            .to_string_lossy()
            .into_owned(),
        _ => format!("{path}.{pid}"),
    }
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
            log!(Warn, "cannot write trace header to {path}: {e:#}; recording disabled");
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
    let mut finishing_rounds = 0u32;
    let mut alone_checked = std::time::Instant::now();
    let mut ended_alone = false;
    loop {
        let finishing = FINISH.load(Ordering::Acquire);
        // Events stamped after this may still be overtaken by events of a ring swept earlier;
        // see `ring::order`.
        let watermark = clock::stamp();
        // Finishing: sweep until the rings are empty, but not forever if threads keep calling.
        finishing_rounds += u32::from(finishing);
        let lone = if pending.is_empty() { ring::lone_source() } else { None };
        let swept = match lone {
            Some(r) => cx.sweep_in_place(r),
            None => cx.sweep_merged(&mut batch, &mut pending, watermark, finishing, finishing_rounds, &mut last_flush),
        };
        let n = match swept.and_then(|n| cx.drain_cupti(&mut dirty).map(|_| n)) {
            Ok(n) => n,
            Err(e) => {
                log!(Warn, "writing {path} failed: {e:#}; recording stopped");
                return false;
            }
        };
        dirty |= n > 0;
        if finishing && (n == 0 || finishing_rounds > 64) {
            cx.finish(&path);
            return ended_alone;
        }
        if dirty && (FLUSH.swap(false, Ordering::AcqRel) || last_flush.elapsed() >= FLUSH_EVERY) {
            if let Err(e) = cx.w.flush() {
                log!(Warn, "flushing {path} failed: {e:#}; recording stopped");
                return false;
            }
            last_flush = std::time::Instant::now();
            dirty = false;
        }
        if n == 0 {
            if !finishing && alone_checked.elapsed() >= ALONE_EVERY {
                alone_checked = std::time::Instant::now();
                if alone(pid) {
                    // The trace is completed as at exit; the process ends when this thread does.
                    log!(
                        Info,
                        "every thread of pid {pid} has ended (the main thread by pthread_exit): completing the trace"
                    );
                    FINISH.store(true, Ordering::Release);
                    ended_alone = true;
                    continue;
                }
            }
            std::thread::sleep(Duration::from_micros(200));
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
    /// (`ring::order`). The last round (finishing, and nothing new or too many rounds) writes
    /// everything. Returns how many events the sweep took.
    fn sweep_merged(
        &mut self,
        batch: &mut Vec<(u32, RawEvent)>,
        pending: &mut Vec<(u32, RawEvent)>,
        watermark: u64,
        finishing: bool,
        finishing_rounds: u32,
        last_flush: &mut std::time::Instant,
    ) -> Result<usize, trace::TraceError> {
        let sweep = ring::drain_all(SWEEP_PER_RING, |tid, ev| batch.push((tid, *ev)));
        // After the sweep: every stamp it took is older than the clock map's newest sample.
        self.clock.refresh();
        let n = sweep.events;
        let last_round = finishing && (n == 0 || finishing_rounds > 64);
        if batch.is_empty() && pending.is_empty() {
            return Ok(n);
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
        Ok(n)
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

/// Free what an event owns when it is not written.
pub fn release(ev: &RawEvent) {
    if ev.kind == RawKind::Marker && ev.aux != 0 {
        // Safety: see Ctx::handle; an event is either written or released, never both.
        drop(unsafe { CString::from_raw(ev.aux as *mut c_char) });
    }
}
