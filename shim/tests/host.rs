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
    // The trace says it was stopped, and counts what it dropped.
    let s = Stats::read(&traces_in(dir.path())[0]).unwrap();
    let said = s.records.iter().any(|r| {
        matches!(&r.event, trace::Event::Marker(m) if m.text.ends_with("could not be allocated; recording stopped"))
    });
    assert!(said && s.lost_events >= 1, "{:?}", s.exit);
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
    let r = run("p_exec_self", &[]);
    assert!(r.out.status.success(), "{}", r.stderr());
    let t = r.traces();
    assert_eq!(t.len(), 2, "{t:?}: {}", r.stderr());
    assert!(r.stderr().contains("holds this process's trace from before it exec'd this program"), "{}", r.stderr());
    let (before, after) = (Stats::read(&t[0]).unwrap(), Stats::read(&t[1]).unwrap());
    let (before, after) = if before.allocs == 10 { (before, after) } else { (after, before) };
    // The image before the exec never reached its exit: its trace is cut short, as memsim says.
    assert_eq!((before.allocs, before.frees), (10, 0));
    assert_eq!((after.allocs, after.frees), (1, 1));
    assert!(after.whole());
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
