//! A logger that cannot re-enter the hooks: it formats into a stack buffer and writes with a raw
//! `write(2)` to stderr. No allocation, no locks, no stdio buffering shared with the host.

use std::fmt::{self, Write};
use std::sync::atomic::{AtomicU8, Ordering};

/// How much the shim says on stderr (`MEMTRACE_LOG`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    /// Nothing at all.
    Off = 0,
    /// Problems that change what gets recorded.
    Warn = 1,
    /// One-off facts (output path, CUPTI state).
    Info = 2,
    /// The configuration table and resolver decisions.
    Debug = 3,
}

static LEVEL: AtomicU8 = AtomicU8::new(LogLevel::Warn as u8);

/// Set the process-wide level (done once when the configuration is read).
pub fn set_level(level: LogLevel) {
    LEVEL.store(level as u8, Ordering::Relaxed);
}

/// Whether messages at `level` are written.
pub fn enabled(level: LogLevel) -> bool {
    level as u8 <= LEVEL.load(Ordering::Relaxed)
}

/// A fixed-capacity text buffer; text past the end is cut, never reallocated.
pub struct StackBuf {
    buf: [u8; 1024],
    len: usize,
}

impl StackBuf {
    /// An empty buffer.
    pub const fn new() -> Self {
        StackBuf { buf: [0; 1024], len: 0 }
    }

    /// The bytes written so far.
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl Default for StackBuf {
    fn default() -> Self {
        Self::new()
    }
}

impl Write for StackBuf {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let room = self.buf.len() - self.len;
        let n = s.len().min(room);
        self.buf[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
        self.len += n;
        Ok(())
    }
}

/// Write all of `bytes` to a file descriptor with raw syscalls, retrying on EINTR.
/// Async-signal-safe.
pub fn write_fd(fd: i32, mut bytes: &[u8]) {
    while !bytes.is_empty() {
        // Safety: the pointer and length describe a live slice.
        let n = unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) };
        if n < 0 {
            // Safety: reading errno of this thread.
            if unsafe { *libc::__errno_location() } == libc::EINTR {
                continue;
            }
            return;
        }
        if n == 0 {
            return;
        }
        bytes = &bytes[n as usize..];
    }
}

/// Write one `memtrace: ...` line to stderr if `level` is enabled.
pub fn log(level: LogLevel, args: fmt::Arguments<'_>) {
    if !enabled(level) {
        return;
    }
    let mut b = StackBuf::new();
    let _ = b.write_str("memtrace: ");
    let _ = b.write_fmt(args);
    if b.len == b.buf.len() {
        b.len -= 1;
    }
    let _ = b.write_str("\n");
    write_fd(2, b.as_bytes());
}

/// `log!(Level, "fmt", args..)`.
#[macro_export]
macro_rules! log {
    ($lvl:ident, $($arg:tt)*) => {
        $crate::log::log($crate::log::LogLevel::$lvl, format_args!($($arg)*))
    };
}
