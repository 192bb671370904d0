//! The writer thread: drains the queue, turns raw events into `trace::Record`s, resolves names
//! (caller modules, kernels) off the hot path, writes the file, and prints the exit summary.

use std::collections::BTreeMap;
use std::ffi::{c_char, c_void, CStr, CString};
use std::fs::File;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicI64, AtomicU8, Ordering};
use std::time::Duration;

use hashbrown::HashMap;
use trace::{
    Alloc, BinaryWriter, Event, Free, FreeStage, Header, KernelExec, KernelLaunch, Level, Marker, MemoryKind, NameDef,
    NameId, Origin, PoolTrim, ProcessExit, Record, Vmm, VmmOp, ALLOCATOR_ENV_VARS,
};

use crate::clock::{self, now_ns};
use crate::config::{expand_out, Config};
use crate::cupti::{Activity, Exec, Mem};
use crate::raw::{self, mem, unpack, vmm, FuncKind, RawEvent, RawKind};
use crate::{log, real, ring, state};

/// Writer lifecycle, one value per process (reset in a fork child).
pub static WRITER: AtomicU8 = AtomicU8::new(NOT_STARTED);
/// No writer thread yet.
pub const NOT_STARTED: u8 = 0;
/// The writer thread runs.
pub const RUNNING: u8 = 1;
/// The trace is complete (or could not be written); nothing more is recorded.
pub const DONE: u8 = 2;

/// Set by the exit paths: write `ProcessExit` and stop.
pub static FINISH: AtomicBool = AtomicBool::new(false);
/// Set by a chained signal handler: flush now, the process may keep running.
pub static FLUSH: AtomicBool = AtomicBool::new(false);
/// Exit status for `ProcessExit`, `i64::MIN` = unknown.
pub static EXIT_STATUS: AtomicI64 = AtomicI64::new(i64::MIN);
/// Signal for `ProcessExit`, 0 = none.
pub static EXIT_SIGNAL: AtomicI32 = AtomicI32::new(0);

/// At most this many events per ring per sweep, so that a sweep's batch (72 bytes an event)
/// stays in the writer core's L2 cache: 16,384 made it 1.2 MB, and the batch was written and
/// read back from beyond L2 (a few ns less per launch when writer and caller share a core).
const SWEEP_PER_RING: usize = 2048;

/// How often buffered events reach the file while the process runs, so that a process killed
/// with SIGKILL leaves a trace readable up to a recent point.
const FLUSH_EVERY: Duration = Duration::from_millis(50);

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
    // signal arriving meanwhile stays pending for the host's threads.
    let old = block_signals();
    let spawned = std::thread::Builder::new().name("memtrace-writer".into()).spawn(|| {
        let r = std::panic::catch_unwind(run);
        if r.is_err() {
            log!(Warn, "writer thread failed; recording stopped");
        }
        WRITER.store(DONE, Ordering::Release);
    });
    // Safety: restores the mask saved above.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
    if let Err(e) = spawned {
        log!(Warn, "cannot start the writer thread ({e}); recording disabled");
        WRITER.store(DONE, Ordering::Release);
    }
}

/// Per-trace counters for the exit summary.
#[derive(Default)]
struct Tally {
    events: u64,
    allocs: u64,
    frees: u64,
    launches: u64,
    execs: u64,
    cupti_mem: u64,
    pinned: u64,
    failed: u64,
    live: HashMap<(bool, u64), u64>,
    live_bytes: u64,
    peak: u64,
    over_limit: u64,
}

/// Key space of CUPTI name pointers in `Names::kernels` (apart from the `FuncKind`s).
const CUPTI_NAME: u8 = 0xff;

struct Names {
    next: NameId,
    by_text: HashMap<String, NameId>,
    callers: HashMap<u64, Option<NameId>>,
    kernels: HashMap<(u8, u64), Option<NameId>>,
    /// Direct-mapped front of `kernels`: a training step launches a few hundred distinct
    /// kernels over and over, and a hit here costs a compare instead of a hash and a probe.
    recent: Box<[(u64, u8, Option<NameId>); RECENT]>,
}

/// Slots in [`Names::recent`] (a power of two).
const RECENT: usize = 512;

fn recent_slot(f: u64) -> usize {
    // Function handles and host stubs are at least 16-byte aligned; mix in higher bits so that
    // kernels from one module spread over the slots.
    ((f >> 4) ^ (f >> 13)) as usize & (RECENT - 1)
}

struct Ctx {
    w: BinaryWriter<File>,
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
    h.metadata.insert("memtrace.kernels".into(), (cfg.kernels as u8).to_string());
    h
}

/// PyTorch treats any value other than empty and "0" as set.
fn truthy(v: &str) -> bool {
    let v = v.trim();
    !v.is_empty() && v != "0"
}

/// Blocks SIGINT and SIGTERM in the calling thread; returns the previous mask.
fn block_signals() -> libc::sigset_t {
    // Safety: plain sigset manipulation on local sets; affects only this thread.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old);
        old
    }
}

fn run() {
    raw::set_internal(true);
    let cfg = state::config();
    let pid = state::owner_pid();
    let origin = state::clock_origin();
    let path = expand_out(&cfg.out, pid);
    // The trace goes straight to its final path, not through a rename: a process killed with
    // SIGKILL must still leave a trace readable up to its last complete frame.
    let file = match std::fs::OpenOptions::new().write(true).create(true).truncate(true).open(&path) {
        Ok(f) => f,
        Err(e) => {
            log!(Warn, "cannot create trace file {path}: {e}; recording disabled");
            return;
        }
    };
    let w = match BinaryWriter::new(file, &header(cfg, pid, origin)) {
        Ok(w) => w,
        Err(e) => {
            log!(Warn, "cannot write trace header to {path}: {e:#}; recording disabled");
            return;
        }
    };
    log!(Info, "tracing pid {pid} into {path}");
    let names = Names {
        next: 0,
        by_text: HashMap::new(),
        callers: HashMap::new(),
        kernels: HashMap::new(),
        recent: Box::new([(0, 0, None); RECENT]),
    };
    let clock = clock::Calibration::new(clock::anchor());
    let mut cx = Ctx { w, origin, clock, names, tally: Tally::default(), max_bytes: cfg.max_bytes, limit_hit: false };
    let mut last_flush = std::time::Instant::now();
    let mut dirty = false;
    let mut batch: Vec<(u32, RawEvent)> = Vec::new();
    let mut pending: Vec<(u32, RawEvent)> = Vec::new();
    let mut finishing_rounds = 0u32;
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
                return;
            }
        };
        dirty |= n > 0;
        if finishing && (n == 0 || finishing_rounds > 64) {
            cx.finish(&path);
            return;
        }
        if dirty && (FLUSH.swap(false, Ordering::AcqRel) || last_flush.elapsed() >= FLUSH_EVERY) {
            if let Err(e) = cx.w.flush() {
                log!(Warn, "flushing {path} failed: {e:#}; recording stopped");
                return;
            }
            last_flush = std::time::Instant::now();
            dirty = false;
        }
        if n == 0 {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

fn mem_kind(sub: u8) -> MemoryKind {
    match sub {
        mem::PINNED_HOST => MemoryKind::PinnedHost,
        mem::MANAGED => MemoryKind::Managed,
        mem::PHYSICAL => MemoryKind::Physical,
        mem::HOST_REGISTERED => MemoryKind::HostRegistered,
        mem::IPC_IMPORT => MemoryKind::IpcImport,
        _ => MemoryKind::Device,
    }
}

fn vmm_op(sub: u8) -> VmmOp {
    match sub {
        vmm::RESERVE => VmmOp::Reserve,
        vmm::ADDRESS_FREE => VmmOp::AddressFree,
        vmm::MAP => VmmOp::Map,
        vmm::UNMAP => VmmOp::Unmap,
        _ => VmmOp::SetAccess,
    }
}

/// The file name of the shared object containing `addr`, via `dladdr`.
fn module_of(addr: u64) -> Option<String> {
    // Safety: dladdr only reads loader tables; `info` is a valid out-pointer.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    if unsafe { libc::dladdr(addr as *const c_void, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    // Safety: dladdr returned a NUL-terminated path owned by the loader.
    let path = unsafe { CStr::from_ptr(info.dli_fname) }.to_string_lossy();
    let base = path.rsplit('/').next().unwrap_or(&path);
    Some(if base.is_empty() { "main".to_string() } else { base.to_string() })
}

/// The symbol at exactly `addr` (a runtime kernel's host stub).
fn symbol_at(addr: u64) -> Option<String> {
    // Safety: Dl_info is plain C data; all-zero is a valid value.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // Safety: as in module_of.
    if unsafe { libc::dladdr(addr as *const c_void, &mut info) } == 0 || info.dli_sname.is_null() {
        return None;
    }
    if info.dli_saddr as u64 != addr {
        return None;
    }
    // Safety: NUL-terminated name owned by the loader.
    Some(unsafe { CStr::from_ptr(info.dli_sname) }.to_string_lossy().into_owned())
}

/// `cuFuncGetName` through the real driver, when it exports it.
fn cu_func_name(f: u64) -> Option<String> {
    let p = real::driver_symbol(c"cuFuncGetName")?;
    type FuncGetName = unsafe extern "C" fn(*mut *const c_char, *mut c_void) -> i32;
    // Safety: cuFuncGetName has this signature in every driver that exports it (12.3+).
    let get: FuncGetName = unsafe { std::mem::transmute::<usize, FuncGetName>(p) };
    let mut name: *const c_char = std::ptr::null();
    // Safety: out-pointer is valid; the driver validates the function handle.
    let r = unsafe { get(&mut name, f as *mut c_void) };
    if r != 0 || name.is_null() {
        return None;
    }
    // Safety: the driver returns a NUL-terminated string it owns.
    Some(unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned())
}

impl Ctx {
    fn rec(&self, ts: u64, tid: u32, event: Event) -> Record {
        Record { ts_ns: Some(ts.saturating_sub(self.origin)), tid: Some(tid), device: None, event }
    }

    fn intern(&mut self, text: String) -> Result<NameId, trace::TraceError> {
        if let Some(id) = self.names.by_text.get(&text) {
            return Ok(*id);
        }
        let id = self.names.next;
        self.names.next += 1;
        self.w.write(&Record::bare(Event::Name(NameDef { id, text: text.clone() })))?;
        self.names.by_text.insert(text, id);
        Ok(id)
    }

    fn caller(&mut self, ra: u64) -> Result<Option<NameId>, trace::TraceError> {
        if ra == 0 {
            return Ok(None);
        }
        if let Some(c) = self.names.callers.get(&ra) {
            return Ok(*c);
        }
        let id = match module_of(ra) {
            Some(m) => Some(self.intern(m)?),
            None => None,
        };
        self.names.callers.insert(ra, id);
        Ok(id)
    }

    /// A launch's kernel name. Inlined: a training step launches the same few hundred kernels
    /// over and over, so almost every call is a hit in the direct-mapped `recent` cache.
    #[inline(always)]
    fn kernel(&mut self, kind: u8, f: u64) -> Result<Option<NameId>, trace::TraceError> {
        // Zeroed slots never match: f == 0 is not cached (and graph launches never are).
        let (rf, rk, rid) = self.names.recent[recent_slot(f)];
        if rf == f && rk == kind && f != 0 {
            return Ok(rid);
        }
        self.kernel_lookup(kind, f)
    }

    #[inline(never)]
    fn kernel_lookup(&mut self, kind: u8, f: u64) -> Result<Option<NameId>, trace::TraceError> {
        if f == 0 || kind == FuncKind::Graph as u8 {
            return Ok(None);
        }
        let slot = recent_slot(f);
        let id = match self.names.kernels.get(&(kind, f)) {
            Some(n) => *n,
            None => {
                let text = if kind == FuncKind::CuFunction as u8 { cu_func_name(f) } else { symbol_at(f) };
                let id = match text {
                    Some(t) => Some(self.intern(t)?),
                    None => None,
                };
                self.names.kernels.insert((kind, f), id);
                id
            }
        };
        self.names.recent[slot] = (f, kind, id);
        Ok(id)
    }

    /// A CUPTI kernel name, by the CUPTI-owned pointer shared by all records of the kernel.
    fn cupti_name(&mut self, p: u64) -> Result<Option<NameId>, trace::TraceError> {
        if p == 0 {
            return Ok(None);
        }
        if let Some(n) = self.names.kernels.get(&(CUPTI_NAME, p)) {
            return Ok(*n);
        }
        // Safety: CUPTI keeps kernel names alive until cuptiFinalize, which the shim never calls.
        let text = unsafe { CStr::from_ptr(p as *const c_char) }.to_string_lossy().into_owned();
        let id = Some(self.intern(text)?);
        self.names.kernels.insert((CUPTI_NAME, p), id);
        Ok(id)
    }

    /// One CUPTI record.
    fn cupti(&mut self, a: Activity) -> Result<(), trace::TraceError> {
        match a {
            Activity::Kernel(e) => self.exec(&e),
            Activity::Memory(m) => self.mem_activity(m),
        }
    }

    /// A CUPTI memory activity record (timestamp already on CLOCK_MONOTONIC).
    fn mem_activity(&mut self, m: Mem) -> Result<(), trace::TraceError> {
        if self.limit_hit {
            self.tally.over_limit += 1;
            return Ok(());
        }
        self.tally.cupti_mem += 1;
        self.tally.events += 1;
        let ts = Some(m.ts.saturating_sub(self.origin));
        let r = Record { ts_ns: ts, tid: None, device: Some(m.device), event: Event::MemActivity(m.event) };
        self.write_checked(&r)
    }

    /// A CUPTI kernel execution record (timestamps already on CLOCK_MONOTONIC).
    fn exec(&mut self, e: &Exec) -> Result<(), trace::TraceError> {
        if self.limit_hit {
            self.tally.over_limit += 1;
            return Ok(());
        }
        self.tally.execs += 1;
        let name = self.cupti_name(e.name)?;
        let exec = Event::KernelExec(KernelExec {
            start_ns: e.start.saturating_sub(self.origin),
            end_ns: e.end.saturating_sub(self.origin),
            name,
            grid: e.grid,
            block: e.block,
            registers_per_thread: e.registers,
            static_shared_mem: e.static_shared,
            dynamic_shared_mem: e.dynamic_shared,
            stream: i64::from(e.stream),
            correlation_id: e.correlation,
        });
        self.tally.events += 1;
        let r =
            Record { ts_ns: Some(e.start.saturating_sub(self.origin)), tid: None, device: Some(e.device), event: exec };
        self.write_checked(&r)
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

    #[inline(always)]
    fn handle(&mut self, tid: u32, ev: &RawEvent) -> Result<(), trace::TraceError> {
        if self.limit_hit {
            self.tally.over_limit += 1;
            release(ev);
            return Ok(());
        }
        let api = ev.api;
        let result = i32::from(ev.result);
        let event = match ev.kind {
            k if k == RawKind::Alloc as u8 => {
                let caller = self.caller(ev.caller)?;
                let m = mem_kind(ev.sub);
                if result == 0 {
                    self.tally.allocs += u64::from(m.is_device());
                    self.tally.pinned += u64::from(m == MemoryKind::PinnedHost);
                    if m.is_device() {
                        self.tally.live.insert((m == MemoryKind::Physical, ev.addr), ev.size);
                        self.tally.live_bytes += ev.size;
                        self.tally.peak = self.tally.peak.max(self.tally.live_bytes);
                    }
                } else {
                    self.tally.failed += 1;
                }
                Event::Alloc(Alloc {
                    addr: ev.addr,
                    size: ev.size,
                    stream: ev.stream as i64,
                    mem: m,
                    api,
                    result,
                    origin: Origin::Outcome,
                    category: None,
                    caller,
                    stack: None,
                })
            }
            k if k == RawKind::Free as u8 => {
                let caller = self.caller(ev.caller)?;
                let m = mem_kind(ev.sub);
                let mut size = (ev.size != 0).then_some(ev.size);
                if result == 0 && m.is_device() {
                    self.tally.frees += 1;
                    if let Some(s) = self.tally.live.remove(&(m == MemoryKind::Physical, ev.addr)) {
                        self.tally.live_bytes -= s;
                        size = Some(s);
                    }
                } else if result != 0 {
                    self.tally.failed += 1;
                }
                Event::Free(Free {
                    addr: ev.addr,
                    size,
                    stream: ev.stream as i64,
                    mem: m,
                    api,
                    result,
                    origin: Origin::Outcome,
                    stage: FreeStage::Immediate,
                    caller,
                    stack: None,
                })
            }
            k if k == RawKind::Vmm as u8 => {
                let caller = self.caller(ev.caller)?;
                Event::Vmm(Vmm {
                    op: vmm_op(ev.sub),
                    addr: ev.addr,
                    size: ev.size,
                    handle: ev.aux,
                    offset: ev.offset,
                    api,
                    result,
                    origin: Origin::Outcome,
                    stream: 0,
                    caller,
                })
            }
            k if k == RawKind::Launch as u8 => {
                self.tally.launches += 1;
                let name = self.kernel(ev.sub, ev.addr)?;
                let ((gx, gy), (gz, bx), (by, bz)) = (unpack(ev.size), unpack(ev.aux), unpack(ev.offset));
                let launch = KernelLaunch {
                    api,
                    name,
                    grid: [gx, gy, gz],
                    block: [bx, by, bz],
                    shared_mem: ev.caller as u32,
                    stream: ev.stream as i64,
                    result,
                };
                // Launches are most of a trace: written without building a `Record`.
                self.tally.events += 1;
                let ts = self.clock.to_ns(ev.ts).saturating_sub(self.origin);
                self.w.write_launch(Some(ts), Some(tid), None, &launch)?;
                return self.check_limit();
            }
            k if k == RawKind::PoolTrim as u8 => {
                Event::PoolTrim(PoolTrim { pool: ev.addr, min_bytes_to_keep: ev.size, api, result })
            }
            _ => {
                // Safety: markers carry a pointer from CString::into_raw made by the hook; only
                // the writer reclaims it, exactly once.
                let text = unsafe { CString::from_raw(ev.aux as *mut c_char) };
                Event::Marker(Marker { text: text.to_string_lossy().into_owned() })
            }
        };
        self.tally.events += 1;
        let ts = self.clock.to_ns(ev.ts);
        let r = self.rec(ts, tid, event);
        self.write_checked(&r)
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
        let text = format!("memtrace: MEMTRACE_MAX_BYTES={} reached; recording stopped", self.max_bytes);
        let r = self.rec(now_ns(), raw::tid(), Event::Marker(Marker { text }));
        self.w.write(&r)?;
        self.w.flush()?;
        state::stop_recording();
        log!(Warn, "MEMTRACE_MAX_BYTES={} reached; recording stopped", self.max_bytes);
        Ok(())
    }

    fn finish(mut self, path: &str) {
        let status = EXIT_STATUS.load(Ordering::Acquire);
        let signal = EXIT_SIGNAL.load(Ordering::Acquire);
        let lost = ring::LOST.load(Ordering::Acquire);
        let exit = ProcessExit {
            status: (status != i64::MIN).then_some(status as i32),
            signal: (signal != 0).then_some(signal),
            lost_events: lost,
        };
        let r = self.rec(now_ns(), raw::tid(), Event::ProcessExit(exit));
        let res = self.w.write(&r).and_then(|_| self.w.finish().map(|_| ()));
        if let Err(e) = res {
            log!(Warn, "finishing {path} failed: {e:#}");
        }
        if !state::config().quiet {
            let t = &self.tally;
            let mut b = log::StackBuf::new();
            use std::fmt::Write;
            let _ = writeln!(
                b,
                "memtrace: {} events ({} allocs, {} frees, {} kernel launches, {} pinned host allocs, {} failed calls{}), \
                 peak live device bytes {} ({:.1} MiB), lost {}{} -> {}",
                t.events,
                t.allocs,
                t.frees,
                t.launches,
                t.pinned,
                t.failed,
                match (crate::cupti::running(), t.cupti_mem) {
                    (false, _) => String::new(),
                    (true, 0) => format!(", {} kernel execs from CUPTI", t.execs),
                    (true, n) => format!(", {} kernel execs and {n} memory records from CUPTI", t.execs),
                },
                t.peak,
                t.peak as f64 / (1u64 << 20) as f64,
                lost,
                if t.over_limit > 0 { format!(", {} not recorded past MEMTRACE_MAX_BYTES", t.over_limit) } else { String::new() },
                path
            );
            log::write_fd(2, b.as_bytes());
        }
    }
}

/// Free what an event owns when it is not written.
pub fn release(ev: &RawEvent) {
    if ev.kind == RawKind::Marker as u8 && ev.aux != 0 {
        // Safety: see Ctx::handle; an event is either written or released, never both.
        drop(unsafe { CString::from_raw(ev.aux as *mut c_char) });
    }
}
