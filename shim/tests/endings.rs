//! Endings that complete the trace beyond `exit` and SIGINT/SIGTERM: SIGHUP and SIGQUIT,
//! `abort()`, `quick_exit()`, and the faults (SIGSEGV, SIGBUS, SIGFPE, SIGILL), each ending the
//! process as it would end without the shim.

use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{ExitStatus, Output};
use std::time::{Duration, Instant};

use crate::harness::{command, run, run_ok, traces_in};
use crate::lifecycle::started;
use crate::stats::Stats;

/// SIGHUP (a closed terminal) and SIGQUIT (Ctrl-\) end the process by the signal, as before,
/// and the trace is completed first: it ended without its exit record.
#[test]
fn sighup_and_sigquit_complete_the_trace_and_still_kill() {
    for sig in [libc::SIGHUP, libc::SIGQUIT] {
        let (mut g, dir) = started(&[]);
        let c = g.0.as_mut().unwrap();
        // Safety of the test: plain kill(2) of our own child.
        assert_eq!(unsafe { libc::kill(c.id() as i32, sig) }, 0);
        let status = c.wait().unwrap();
        g.0 = None;
        assert_eq!(status.signal(), Some(sig));
        let s = Stats::read(&traces_in(dir.path())[0]).unwrap();
        assert!(s.whole(), "signal {sig}: the trace was not completed");
        assert_eq!(s.calls(), [("cudaMalloc", 100)]);
        assert_eq!(s.exit.unwrap().signal, Some(sig));
    }
}

/// A program's own SIGHUP and SIGQUIT handlers still run (the shim chains to them) and the
/// program goes on; the trace is completed at its exit, with no signal.
#[test]
fn sighup_and_sigquit_handlers_of_the_program_still_run() {
    let r = run_ok("p_sig_chain", &[("MEMTRACE_QUIET", "1")]);
    let s = r.stats();
    assert!(s.whole());
    assert_eq!(s.calls(), [("cudaFree", 1), ("cudaMalloc", 1)]);
    assert_eq!(s.exit.unwrap().signal, None);
}

/// `prog args` run in a directory of its own with core dumps allowed, with the shim or not:
/// its output, its trace directory and how long it ran.
fn run_with_cores(prog: &str, args: &[&str], shim: bool) -> (Output, tempfile::TempDir, Duration) {
    let dir = tempfile::tempdir().unwrap();
    let mut c = command(prog, dir.path(), &[("MEMTRACE_QUIET", "1")]);
    if !shim {
        c.env_remove("LD_PRELOAD");
    }
    c.args(args).current_dir(dir.path());
    // Safety: setrlimit is async-signal-safe, and only the child calls it, before exec.
    unsafe {
        c.pre_exec(|| {
            let lim = libc::rlimit { rlim_cur: libc::RLIM_INFINITY, rlim_max: libc::RLIM_INFINITY };
            // Not allowed to raise the hard limit: keep the soft one at it.
            if libc::setrlimit(libc::RLIMIT_CORE, &lim) != 0 {
                let mut cur = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
                libc::getrlimit(libc::RLIMIT_CORE, &mut cur);
                cur.rlim_cur = cur.rlim_max;
                libc::setrlimit(libc::RLIMIT_CORE, &cur);
            }
            Ok(())
        });
    }
    let t0 = Instant::now();
    let out = c.output().unwrap();
    (out, dir, t0.elapsed())
}

/// How a process ended: its signal and whether it dumped core.
fn ending(s: &ExitStatus) -> (Option<i32>, bool) {
    (s.signal(), s.core_dumped())
}

/// `prog args` under the shim ends exactly as without it, by `sig`, within the exit's wait, and
/// its trace is whole and says so.
fn dies_as_without_the_shim(prog: &str, args: &[&str], sig: i32) -> Stats {
    let (plain, _d, _) = run_with_cores(prog, args, false);
    assert_eq!(plain.status.signal(), Some(sig), "{prog} {args:?} without the shim: {:?}", plain.status);
    let (out, dir, took) = run_with_cores(prog, args, true);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(ending(&out.status), ending(&plain.status), "{prog} {args:?}: {:?}\nstderr:\n{err}", out.status);
    assert!(took < Duration::from_secs(4), "{prog} {args:?} took {took:?}");
    let t = traces_in(dir.path());
    assert_eq!(t.len(), 1, "{prog} {args:?}: {t:?}\nstderr:\n{err}");
    let s = Stats::read(&t[0]).unwrap();
    assert!(s.whole(), "{prog} {args:?}: the trace was not completed\nstderr:\n{err}");
    assert_eq!(s.exit.as_ref().unwrap().signal, Some(sig));
    s
}

/// `abort()` (a failed assert, an uncaught C++ exception) completes the trace, marked as ended
/// by SIGABRT, and the process still dies by SIGABRT, dumping core as it would without the shim
/// (glibc's abort raises SIGABRT; our handler completes the trace, restores the default action
/// and raises it again).
#[test]
fn abort_completes_the_trace_and_dies_by_sigabrt() {
    let s = dies_as_without_the_shim("p_abort", &[], libc::SIGABRT);
    assert_eq!(s.calls(), [("cudaMalloc", 3)]);
}

/// `quick_exit()` runs at_quick_exit handlers, not atexit ones: the trace is completed there,
/// with the status, after the program's own handler.
#[test]
fn quick_exit_completes_the_trace_with_its_status() {
    let stderr = exits_with("p_quick_exit", 5, &[("cudaMalloc", 1)]);
    assert!(stderr.contains("own handler"), "{stderr}");
}

/// A return from `main` ends the process through libc's own `exit`, which no export sees: the
/// start of `main` is wrapped, so its status is recorded all the same (a Python program's is).
#[test]
fn a_return_from_main_records_its_status() {
    exits_with("p_main_returns", 4, &[("cudaMalloc", 1)]);
}

/// A signal the program keeps blocked (for `sigwait`), pending when `main` leaves by
/// `pthread_exit`: the shim's writer ends the process with the mask of the thread that made it,
/// so the signal stays blocked and the exit is the program's, as without the shim.
#[test]
fn a_blocked_signal_stays_blocked_when_the_writer_ends_the_process() {
    let r = run("p_exit_blocked", &[("MEMTRACE_QUIET", "1")]);
    assert_eq!(r.out.status.code(), Some(0), "{:?}\nstderr:\n{}", r.out.status, r.stderr());
    let s = r.stats();
    assert!(s.whole(), "the trace was not completed");
    assert_eq!(s.calls(), [("cudaMalloc", 1)]);
    // The last thread's return exits through libc's own `exit`: no status is seen.
    assert_eq!(s.exit.unwrap().signal, None);
}

/// `prog` exits with `code`, its trace whole, with `calls` and that status and no signal in its
/// exit record; its stderr.
fn exits_with(prog: &str, code: i32, calls: &[(&str, u64)]) -> String {
    let r = run(prog, &[("MEMTRACE_QUIET", "1")]);
    assert_eq!(r.out.status.code(), Some(code), "{:?}\nstderr:\n{}", r.out.status, r.stderr());
    let s = r.stats();
    assert!(s.whole(), "{prog}: the trace was not completed");
    assert_eq!(s.calls(), calls, "{prog}");
    let exit = s.exit.unwrap();
    assert_eq!((exit.signal, exit.status), (None, Some(code)), "{prog}");
    r.stderr()
}

/// SIGSEGV, SIGBUS, SIGFPE and SIGILL complete the trace, marked as ended by the signal, and
/// the process dies by it with its default action (a core, as without the shim).
#[test]
fn faults_complete_the_trace_and_die_by_their_signal() {
    for (arg, sig) in [("segv", libc::SIGSEGV), ("bus", libc::SIGBUS), ("fpe", libc::SIGFPE), ("ill", libc::SIGILL)] {
        let s = dies_as_without_the_shim("p_fault", &[arg], sig);
        assert_eq!(s.calls(), [("cudaMalloc", 2)], "{arg}");
    }
}

/// A program's fault handler is chained to: one that recovers (a JVM's null checks) leaves the
/// program running and recording, the trace completed at its exit; one that restores the
/// default action and returns (a plain C handler; Rust's, for a fault off its stack guards)
/// dies by the fault, the trace completed first; so does one that raises the signal again
/// before it returns (pending until then), and one on an alternate stack after a stack
/// overflow (`SA_ONSTACK` kept). Python's faulthandler, which re-raises at once with
/// `SA_NODEFER`, is a known gap (`shim/README.md`).
#[test]
fn a_programs_fault_handler_is_chained_to() {
    let dir = tempfile::tempdir().unwrap();
    let out = command("p_fault_chain", dir.path(), &[("MEMTRACE_QUIET", "1")]).arg("recover").output().unwrap();
    assert!(out.status.success(), "{:?}\nstderr:\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    let s = Stats::read(&traces_in(dir.path())[0]).unwrap();
    assert!(s.whole());
    assert_eq!(s.calls(), [("cudaFree", 1), ("cudaMalloc", 1)]);
    assert_eq!(s.exit.unwrap().signal, None);
    for mode in ["reset", "raise", "overflow"] {
        let s = dies_as_without_the_shim("p_fault_chain", &[mode], libc::SIGSEGV);
        assert_eq!(s.calls(), [("cudaMalloc", 1)], "{mode}");
    }
}

/// A fault handler that restores the default action and fixes the cause (makes the page
/// writable) lets the program go on: it is not taken for dying, and the trace records the calls
/// after it and is completed at the exit, with its status and no signal.
#[test]
fn a_fault_the_program_survives_keeps_recording() {
    exits_with("p_fault_survive", 0, &[("cudaFree", 2), ("cudaMalloc", 3)]);
}

/// A fault on the shim's writer thread does not wait for the trace (the writer would wait for
/// itself until the exit's wait ran out): the process dies by it at once.
#[test]
fn a_fault_on_the_writer_thread_kills_at_once() {
    for sig in [libc::SIGSEGV, libc::SIGBUS] {
        let dir = tempfile::tempdir().unwrap();
        let mut c = command("p_fault_writer", dir.path(), &[]);
        let t0 = Instant::now();
        let out = c.arg(sig.to_string()).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.signal(), Some(sig), "{:?}\nstderr:\n{err}", out.status);
        assert!(t0.elapsed() < Duration::from_secs(3), "took {:?}\nstderr:\n{err}", t0.elapsed());
        assert!(!err.contains("is incomplete"), "{err}");
    }
}
