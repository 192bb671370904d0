//! The trace file: opened once per process where `MEMTRACE_OUT` asks (or beside it when that
//! is another process's trace, a stream or a folder), kept on a high descriptor the program
//! does not hand out, and checked to still be that file before each batch of bytes.

use std::fs::File;
use std::sync::atomic::Ordering;

use crate::log;
use crate::state;

/// The open trace file, published in [`state::TRACE_FD`] for a fork child to close. The
/// descriptor is withdrawn before it closes, so a later fork child never closes a reused number.
///
/// The descriptor is high ([`high_fd`], as `open_own` opens it), out of the numbers a program hands out and
/// closes in bulk (a daemon's `for fd in 3..1024: close(fd)`), and before each batch of bytes
/// it is checked to still be the file opened (device and inode): a program that closed it
/// anyway may have opened its own file under the same number, and the trace's bytes went into
/// that file. Then nothing more is written, and recording stops (the trace ends without its
/// `process_exit`, which `memsim` reports as cut short). No call checks and writes at once: a
/// number taken between the check and the write gets that one batch.
pub(super) struct TraceFile {
    /// Closed on drop unless `taken` (the number is the program's then).
    file: std::mem::ManuallyDrop<File>,
    /// Device and inode of the file opened, `None` when `fstat` failed (nothing to compare).
    id: Option<(u64, u64)>,
    /// Set once the descriptor was found to be another file: nothing more is written to it.
    taken: bool,
}

impl TraceFile {
    pub(super) fn new(file: File) -> Self {
        use std::os::fd::AsRawFd;
        let id = fd_id(file.as_raw_fd());
        state::TRACE_FD.store(file.as_raw_fd(), Ordering::Release);
        Self { file: std::mem::ManuallyDrop::new(file), id, taken: false }
    }

    /// Whether the descriptor still refers to the file opened; one `fstat`, once per batch.
    fn still_ours(&mut self) -> bool {
        use std::os::fd::AsRawFd;
        if self.taken {
            return false;
        }
        let Some(id) = self.id else { return true };
        if fd_id(self.file.as_raw_fd()) == Some(id) {
            return true;
        }
        self.taken = true;
        // A fork child must not close it either.
        state::TRACE_FD.store(-1, Ordering::Release);
        false
    }

    fn taken_error(&self) -> std::io::Error {
        use std::os::fd::AsRawFd;
        std::io::Error::other(format!(
            "descriptor {} is no longer the trace file (the program closed it, and may have opened another file \
             under its number); nothing more is written to it",
            self.file.as_raw_fd()
        ))
    }
}

/// Device and inode of what `fd` refers to.
fn fd_id(fd: i32) -> Option<(u64, u64)> {
    // Safety: an all-zero `stat` is a valid value of this plain C struct.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // Safety: fstat fills a local struct; a closed descriptor only returns an error.
    (unsafe { libc::fstat(fd, &mut st) } == 0).then_some((st.st_dev, st.st_ino))
}

/// The lowest descriptor number the trace moves to: above the numbers programs close in bulk
/// (3..1024, `FD_SETSIZE`), and below the descriptor limit (which may be 1024 itself: then as
/// high as it allows, and the check before each write catches a reused number).
fn fd_floor() -> i32 {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // Safety: getrlimit fills a local struct.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return 3;
    }
    let cur = lim.rlim_cur.min(1 << 20) as i32;
    if cur > 1024 + 64 {
        1024
    } else {
        (cur - 64).max(3)
    }
}

/// Device and inode of what `path` names now.
fn path_id(path: &str) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// `file`, just opened at `path`, moved to a descriptor at or above [`fd_floor`] (close-on-exec,
/// as before; the low number itself when no high one is free). `None` when the descriptor is no
/// longer the file at `path`: another thread closed the low number between the `open` and the
/// move and opened its own file under it. That number is the program's: it is left open, and
/// nothing is written to or truncated through it.
fn high_fd(file: File, path: &str) -> Option<File> {
    use std::os::fd::{FromRawFd, IntoRawFd};
    let low = file.into_raw_fd();
    // Safety: duplicating a descriptor this function holds; the new one is ours.
    let dup = unsafe { libc::fcntl(low, libc::F_DUPFD_CLOEXEC, fd_floor()) };
    let want = path_id(path);
    if dup < 0 {
        // Safety: `low` is the descriptor `open` returned, checked to still be that file.
        return (want.is_some() && fd_id(low) == want).then(|| unsafe { File::from_raw_fd(low) });
    }
    if want.is_none() || fd_id(dup) != want {
        // Safety: `dup` is ours (a second descriptor of the program's file): closing it leaves
        // the program's own descriptor open.
        unsafe { libc::close(dup) };
        return None;
    }
    // The low number is closed only while it is still the trace file (a program closing it
    // meanwhile gets EBADF from nothing of ours; the check narrows the window to two calls).
    if fd_id(low) == want {
        // Safety: `low` is the trace file's descriptor, which nothing else uses.
        unsafe { libc::close(low) };
    }
    // Safety: `dup` is a fresh descriptor nothing else owns.
    Some(unsafe { File::from_raw_fd(dup) })
}

/// Open `path` for the trace (write, create, non-blocking) on a high descriptor ([`high_fd`]),
/// trying twice when another thread's file took the descriptor's number; `Ok(None)` when both
/// times it did (said here).
fn open_high(path: &str) -> std::io::Result<Option<File>> {
    use std::os::unix::fs::OpenOptionsExt;
    for _ in 0..2 {
        // Non-blocking open: a FIFO no process reads would block the writer for good, the
        // rings would fill and the program's exit would wait on a writer that never started.
        let f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)?;
        // Moved high at once: a program closing descriptors in bulk meanwhile (on another
        // thread) closes the low number, which then is no longer the trace's.
        if let Some(f) = high_fd(f, path) {
            return Ok(Some(f));
        }
    }
    log!(
        Warn,
        "trace file {path}: its descriptor was closed and reused by the program as it was opened (twice); \
         recording disabled"
    );
    Ok(None)
}

impl std::io::Write for TraceFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if !self.still_ours() {
            return Err(self.taken_error());
        }
        self.file.write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }
}

impl Drop for TraceFile {
    fn drop(&mut self) {
        state::TRACE_FD.store(-1, Ordering::Release);
        if !self.taken {
            // Safety: dropped once, here; never used again. A taken number is the program's
            // now: closing it would close the program's file, so it is left open.
            unsafe { std::mem::ManuallyDrop::drop(&mut self.file) };
        }
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
pub(super) fn open_own(wanted: String, pid: u32) -> Option<(File, String)> {
    let mut path = wanted.clone();
    // Earlier images of this process (exec without fork) whose traces were found, each kept.
    let mut images = 0u32;
    for attempt in 0..16 {
        let file = match open_high(&path) {
            Ok(Some(f)) => f,
            Ok(None) => return None,
            // ENXIO is also a socket behind /proc/self/fd, or /dev/tty without a terminal.
            Err(e) if e.raw_os_error() == Some(libc::ENXIO) && is_fifo(&path) => {
                log!(Warn, "MEMTRACE_OUT {path} is a pipe no process reads; recording disabled");
                return None;
            }
            Err(e) => {
                log!(Warn, "MEMTRACE_OUT: cannot create trace file {path}: {e}; recording disabled");
                return None;
            }
        };
        if let Err(e) = blocking(&file) {
            log!(Warn, "MEMTRACE_OUT: cannot write the trace to {path}: {e}; recording disabled");
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
            let dup = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, fd_floor()) };
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
                // The next name not yet this one (an image that found its trace at `NAME.PID`
                // goes on to `NAME.PID.2`, not to the path it is at).
                let beside = loop {
                    images += 1;
                    let tag = if images == 1 { pid.to_string() } else { format!("{pid}.{images}") };
                    let beside = beside(&wanted, &tag);
                    if beside != path {
                        break beside;
                    }
                };
                log!(
                    Warn,
                    "trace file {path} holds this process's trace from before it exec'd this program; pid {pid} \
                     traces into {beside}"
                );
                path = beside;
                continue;
            }
            // A file that is neither empty nor a trace is someone's data under a mistyped
            // MEMTRACE_OUT: left as it is (it was emptied in silence), the trace beside it.
            if !empty_or_trace(&file) {
                let beside = beside(&wanted, &pid.to_string());
                if beside == path {
                    log!(Warn, "MEMTRACE_OUT: {path} is a file that is not a trace, left as it is; recording disabled");
                    return None;
                }
                log!(
                    Warn,
                    "MEMTRACE_OUT: {path} is a file that is not a trace, left as it is; pid {pid} traces into {beside}"
                );
                path = beside;
                continue;
            }
            // Locked, or a file system without locks (then as before: ours to truncate).
            if let Err(e) = file.set_len(0) {
                log!(Warn, "MEMTRACE_OUT: cannot truncate trace file {path}: {e}; recording disabled");
                return None;
            }
            // Said here, on the writer's thread and of a file this process records into: not
            // before `main` in every preloaded process, where a stat of the path could hang.
            let lower = path.to_ascii_lowercase();
            if !lower.ends_with(".mtrace") && !lower.ends_with(".jsonl") {
                log!(
                    Warn,
                    "MEMTRACE_OUT: memsim reads a trace file by its name, and {path} does not end in .mtrace: name \
                     it so, or read it as `memsim stats - < FILE`"
                );
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
    log!(Warn, "trace file {path} is being written by another process; recording disabled");
    None
}

/// Whether the regular file `file` is empty or opens as a trace of this format does (its magic
/// and version: an earlier run's, written again). Read through `/proc/self/fd`, the very file
/// about to be truncated (the writer's descriptor is write-only), non-blocking.
fn empty_or_trace(file: &File) -> bool {
    use std::io::Read;
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    if file.metadata().is_ok_and(|m| m.len() == 0) {
        return true;
    }
    // The preamble's magic and version; its flags may be any a writer set.
    let start = &trace::codec::preamble(trace::FORMAT_VERSION, 0)[..10];
    let mut head = Vec::with_capacity(start.len());
    let read = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(format!("/proc/self/fd/{}", file.as_raw_fd()))
        .and_then(|f| f.take(start.len() as u64).read_to_end(&mut head));
    // A trace cut inside its start (an earlier run killed at once) is one too; a file this
    // process cannot read is not known to be one, and is left as it is.
    read.is_ok_and(|n| n > 0 && head[..n] == start[..n])
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
pub(super) fn process_start() -> Option<u64> {
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
pub(super) fn std_stream_of(meta: &std::fs::Metadata) -> Option<i32> {
    use std::os::unix::fs::MetadataExt;
    [1, 2].into_iter().find(|&fd| fd_id(fd) == Some((meta.dev(), meta.ino())))
}

/// `dir/NAME.TAG.EXT` beside `dir/NAME.EXT` (`PATH.TAG` without an extension); the tag is a
/// pid.
pub(super) fn beside(path: &str, pid: &str) -> String {
    let p = std::path::Path::new(path);
    match (p.file_stem(), p.extension()) {
        (Some(stem), Some(ext)) => p
            .with_file_name(format!("{}.{pid}.{}", stem.to_string_lossy(), ext.to_string_lossy()))
            .to_string_lossy()
            .into_owned(),
        _ => format!("{path}.{pid}"),
    }
}
