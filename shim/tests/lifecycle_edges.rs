//! The program's own signal semantics under the shim (its handler's flags), a fork child's
//! fresh size limit, and an exit wait that runs out.

use std::os::unix::process::ExitStatusExt;
use std::time::{Duration, Instant};

use crate::harness::{build_dir, command, run};
use crate::stats::Stats;

/// A handler installed without `SA_RESTART` keeps it: the shim's handler in its place does not
/// restart the read the program relies on being interrupted (it hung until SIGALRM).
#[test]
fn a_handler_without_sa_restart_still_interrupts_a_read() {
    let r = run("p_sig_eintr", &[("MEMTRACE_QUIET", "1")]);
    assert!(r.out.status.success(), "{:?}\nstderr:\n{}", r.out.status, r.stderr());
    let s = r.stats();
    assert!(s.whole());
    assert_eq!(s.calls(), [("cudaFree", 1), ("cudaMalloc", 1)]);
}

/// A handler installed with `SA_RESETHAND` runs once; the second SIGINT kills the program, and
/// the trace is completed first (the handler ran twice and the program survived).
#[test]
fn a_resethand_handler_runs_once_and_the_next_signal_kills() {
    let r = run("p_sig_resethand", &[("MEMTRACE_QUIET", "1")]);
    let err = r.stderr();
    assert_eq!(r.out.status.signal(), Some(libc::SIGINT), "{:?}\nstderr:\n{err}", r.out.status);
    assert_eq!(err.matches("handler").count(), 1, "{err}");
    assert!(!err.contains("survived"), "{err}");
    let s = r.stats();
    assert!(s.whole());
    assert_eq!(s.calls(), [("cudaMalloc", 1)]);
    assert_eq!(s.exit.unwrap().signal, Some(libc::SIGINT));
}

/// A fork child writes a trace file of its own: the parent's `MEMTRACE_MAX_BYTES`, reached
/// before the fork, does not stop the child's recording (its five allocations were lost, and
/// nothing said so).
#[test]
fn a_fork_child_records_after_the_parent_reached_its_size_limit() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let limit = "4096";
    let out = command("p_fork_past_limit", dir.path(), &[("MEMTRACE_MAX_BYTES", limit), ("MEMTRACE_QUIET", "1")])
        .args([d, limit])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}\nstderr:\n{err}", out.status);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let child: u32 = stdout.trim().strip_prefix("child ").unwrap().parse().unwrap();
    let t = dir.path().join(format!("{child}.mtrace"));
    let s = Stats::read(&t).unwrap_or_else(|e| panic!("{}: {e:#}\nstderr:\n{err}", t.display()));
    assert!(s.whole(), "{s:?}");
    assert_eq!(s.calls(), [("cudaMalloc", 5)], "stderr:\n{err}");
}

/// A FIFO whose reader stops reading: the exit wait runs out, and the program says that the
/// trace, named, is incomplete (it ended in silence).
#[test]
fn an_exit_wait_that_runs_out_says_the_trace_is_incomplete() {
    use std::os::unix::fs::OpenOptionsExt;
    let _ = build_dir();
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("stalled.fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // Safety: a NUL-terminated path this test owns.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    // Opened for reading and never read: the writer blocks once the pipe's buffer is full.
    let reader = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(&fifo).unwrap();
    // The shim names the file as `/proc/self/fd` links to it: its canonical path (a temporary
    // directory may lie behind a symbolic link).
    let fifo = fifo.canonicalize().unwrap();
    let f = fifo.to_str().unwrap();
    let started = Instant::now();
    let out = command("p_many_allocs", dir.path(), &[("MEMTRACE_OUT", f)]).arg("50000").output().unwrap();
    drop(reader);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}\nstderr:\n{err}", out.status);
    assert!(started.elapsed() < Duration::from_secs(30));
    assert!(err.contains(&format!("the trace {f} is incomplete")), "{err}");
}
