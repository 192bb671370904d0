//! The host program runs as it would without the shim: how it ends, the signals it ignores, and
//! the limits it runs under.

use std::os::unix::process::CommandExt;
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::harness::{command, run, traces_in, Guard};
use crate::stats::Stats;

/// `main` left by `pthread_exit`: the process ends when its last thread does, and the writer
/// thread (which never ends by itself, and blocks SIGTERM) kept it alive for ever.
#[test]
fn a_main_thread_leaving_by_pthread_exit_ends_the_process() {
    let dir = tempfile::tempdir().unwrap();
    let c = command("p_main_pthread_exit", dir.path(), &[]).stderr(Stdio::null()).spawn().unwrap();
    let mut g = Guard(Some(c));
    let start = Instant::now();
    let status = loop {
        if let Some(s) = g.0.as_mut().unwrap().try_wait().unwrap() {
            break s;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "the process did not end");
        std::thread::sleep(Duration::from_millis(20));
    };
    g.0 = None;
    assert!(status.success(), "{status:?}");
    let t = traces_in(dir.path());
    let s = Stats::read(&t[0]).unwrap();
    assert!(s.whole(), "the trace was not completed");
    assert_eq!((s.allocs, s.frees, s.lost_events), (400, 400, 0));
}

/// An ignored SIGINT or SIGTERM was replaced by the shim's handler: blocking calls got EINTR
/// and an exec'd child no longer inherited the SIG_IGN.
#[test]
fn ignored_signals_stay_ignored() {
    let r = run("p_sig_ignored", &[]);
    assert!(r.out.status.success(), "{:?}: {}", r.out.status, r.stderr());
    assert!(r.stats().whole());
}

fn with_limit(
    prog: &str,
    env: &[(&str, &str)],
    resource: libc::__rlimit_resource_t,
    bytes: u64,
) -> (std::process::Output, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let mut c = command(prog, dir.path(), env);
    // Safety: setrlimit is async-signal-safe, and only the child calls it, before exec.
    unsafe {
        c.pre_exec(move || {
            let lim = libc::rlimit { rlim_cur: bytes, rlim_max: bytes };
            if libc::setrlimit(resource, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    (c.output().unwrap(), dir)
}

/// A file size limit sent SIGXFSZ to the writer's write, which ended the host. Now the write
/// fails, recording stops, and the host runs on.
#[test]
fn a_file_size_limit_stops_recording_not_the_host() {
    let (out, _dir) = with_limit("p_threads", &[], libc::RLIMIT_FSIZE, 1024);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}: {err}", out.status);
    assert!(err.contains("File too large") && err.contains("recording stopped"), "{err}");
}

/// A ring that cannot be allocated (a tight address-space limit) aborted the host: Rust aborts on
/// a failed allocation. Now recording stops, said, and the host runs on.
#[test]
fn a_ring_that_cannot_be_allocated_stops_recording_not_the_host() {
    // 16 Mi events of 64 bytes: a 1 GiB ring, under an 800 MiB address-space limit.
    let (out, dir) = with_limit("p_runtime_alloc", &[("MEMTRACE_QUEUE", "16777216")], libc::RLIMIT_AS, 800 << 20);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}: {err}", out.status);
    assert!(err.contains("cannot allocate a thread's ring (16777216 events"), "{err}");
    // The trace says recording stopped there, as the reader reads it.
    let path = &traces_in(dir.path())[0];
    let mut r = trace::Reader::open(path).unwrap();
    while r.next_record().is_some() {}
    let summary = r.summary();
    assert!(summary.queue_unallocated && summary.incomplete(), "{summary:?}");
    assert!(summary.warnings(path)[0].contains("could not allocate its event queue"), "{summary:?}");
}

/// A relative MEMTRACE_OUT is the directory the program started in: one that changed its
/// directory before its first CUDA call wrote its trace elsewhere, under the name printed.
#[test]
fn a_relative_output_path_is_where_the_program_started() {
    let dir = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let out = command("p_chdir", dir.path(), &[("MEMTRACE_OUT", "rel-%p.mtrace")])
        .arg(elsewhere.path())
        .current_dir(dir.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert_eq!(traces_in(dir.path()).len(), 1, "{err}");
    assert!(traces_in(elsewhere.path()).is_empty());
    assert!(err.contains(&format!("-> {}/rel-", dir.path().display())), "{err}");
}

/// exec without fork: the new image (same pid) opened the same `%p` path and truncated the
/// trace of the image before it, in silence. It writes beside it now, and says so.
#[test]
fn an_exec_without_fork_keeps_the_trace_from_before_it() {
    // Three images: two exec, the last exits. The third truncated the second's trace, which it
    // found beside the first's.
    let dir = tempfile::tempdir().unwrap();
    let out = command("p_exec_self", dir.path(), &[]).arg("2").output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let t = traces_in(dir.path());
    assert_eq!(t.len(), 3, "{t:?}: {err}");
    // Said by the second image (of the first's trace) and the third (of both).
    assert_eq!(err.matches("holds this process's trace from before it exec'd this program").count(), 3, "{err}");
    let mut counts: Vec<(u64, u64, bool)> =
        t.iter().map(|p| Stats::read(p).unwrap()).map(|s| (s.allocs, s.frees, s.whole())).collect();
    counts.sort();
    // The images before an exec never reached their exit: cut short, as memsim says.
    assert_eq!(counts, [(1, 1, true), (10, 0, false), (10, 0, false)], "{err}");
}

/// main left by pthread_exit with the descriptors used up: every other thread's state was
/// unreadable, read as ended, and the trace was completed while a worker still allocated.
#[test]
fn threads_that_cannot_be_read_are_not_taken_for_ended() {
    let (out, dir) = with_limit("p_main_exit_fds", &[], libc::RLIMIT_NOFILE, 64);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let s = Stats::read(&traces_in(dir.path())[0]).unwrap();
    assert_eq!(s.allocs, 16, "{}", String::from_utf8_lossy(&out.stderr));
}

/// A program's own `memtrace_mark` (a fallback for runs without the shim) was taken for a first
/// copy of the shim: recording was turned off.
#[test]
fn a_programs_own_memtrace_mark_is_no_second_shim() {
    let r = run("p_own_mark", &[]);
    assert!(r.out.status.success(), "{}", r.stderr());
    assert!(!r.stderr().contains("another copy"), "{}", r.stderr());
    assert_eq!(r.stats().allocs, 1);
}

/// Two copies of the shim preloaded both recorded every call, into two traces of one process
/// (the second said another process held the file). The second forwards only, and says so.
#[test]
fn a_second_copy_of_the_shim_records_nothing() {
    let copy = tempfile::tempdir().unwrap();
    let second = copy.path().join("libmemtrace-copy.so");
    std::fs::copy(crate::harness::shim(), &second).unwrap();
    let preload = format!("{} {}", crate::harness::shim().display(), second.display());
    let r = run("p_runtime_alloc", &[("LD_PRELOAD", &preload)]);
    assert!(r.out.status.success(), "{}", r.stderr());
    assert!(r.stderr().contains("another copy of libmemtrace is loaded before this one"), "{}", r.stderr());
    let s = r.stats();
    assert_eq!((s.allocs, s.frees), (2, 2));
}
