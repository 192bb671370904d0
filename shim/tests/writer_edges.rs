//! The writer's edges: a program that takes the trace's descriptor number for a file of its
//! own, a large backlog at exit, calls queued after the exit began, calls made past
//! `MEMTRACE_MAX_BYTES`.

use std::process::Output;

use crate::harness::{command, traces_in};
use crate::stats::Stats;

/// Runs `prog args` under the shim with `env`, traces into a fresh directory.
fn run_args(prog: &str, args: &[&str], env: &[(&str, &str)]) -> (Output, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let out = command(prog, dir.path(), env).args(args).output().expect("spawn test program");
    assert!(out.status.success(), "{prog} failed: {:?}\nstderr:\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    (out, dir)
}

/// A program that closes descriptors 3..1023 and opens its own file (given the number the trace
/// had) keeps its file to itself, and the trace, out of that range, is whole.
#[test]
fn closing_descriptors_in_bulk_leaves_the_trace_alone() {
    let (err, s) = close_fds("bulk");
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // Safety: getrlimit fills a local struct.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
    if lim.rlim_cur > 1024 + 64 {
        assert!(s.whole(), "{err}");
        assert_eq!(s.allocs, 1100, "{err}");
    } else {
        // No number above 1023 to move to: the bulk close took the trace's, and it was seen.
        assert!(err.contains("is no longer the trace file"), "{err}");
    }
}

/// A program that puts its own file under the trace's very number: not one byte of the trace
/// goes into it; recording stops, said on stderr, and the trace ends cut short (incomplete).
#[test]
fn a_descriptor_taken_over_gets_no_trace_bytes() {
    let (err, s) = close_fds("steal");
    assert!(err.contains("is no longer the trace file") && err.contains("incomplete"), "{err}");
    assert!(!s.whole() && s.exit.is_none(), "{err}");
}

/// Runs `p_close_fds FILE how` (`bulk` or `steal`): the program's file holds its own output
/// only, whatever became of the trace. Returns stderr and the trace.
fn close_fds(how: &str) -> (String, Stats) {
    let files = tempfile::tempdir().unwrap();
    let mine = files.path().join("out.txt");
    let (out, dir) = run_args("p_close_fds", &[mine.to_str().unwrap(), how], &[("MEMTRACE_QUIET", "1")]);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(std::fs::read(&mine).unwrap(), b"PROGRAM OUTPUT\n", "{err}");
    (err, Stats::read(&traces_in(dir.path())[0]).unwrap())
}

/// Far more events queued at exit than the writer took by then (a large `MEMTRACE_QUEUE`):
/// every one is written, or counted lost so the trace says it is incomplete; none vanish.
#[test]
fn a_backlog_at_exit_is_written_or_counted() {
    let env = [("MEMTRACE_QUEUE", "1048576"), ("MEMTRACE_QUIET", "1")];
    let (out, dir) = run_args("p_exit_backlog", &["2", "200000"], &env);
    let err = String::from_utf8_lossy(&out.stderr);
    let t = traces_in(dir.path());
    let s = Stats::read(&t[0]).unwrap();
    assert!(s.whole(), "{err}");
    assert_eq!(s.allocs + s.frees + s.lost_events, 800_000, "{:?} {err}", (s.allocs, s.frees, s.lost_events));
}

/// A thread that keeps calling through the shared queue while main exits: what it queued after
/// the exit began is not the exit's backlog. The shared queue is emptied every sweep, so what it
/// holds after the first sweep past the exit was queued later, and was counted lost: a complete
/// trace read as incomplete.
#[test]
fn calls_queued_after_the_exit_through_the_shared_queue_are_not_counted_lost() {
    let (out, dir) = run_args("p_shared_exit", &[], &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("could not be written in time"), "{err}");
    let s = Stats::read(&traces_in(dir.path())[0]).unwrap();
    assert!(s.whole(), "{err}");
    assert_eq!(s.lost_events, 0, "{err}");
    assert!(s.allocs > 2, "{:?} {err}", s.allocs);
}

/// Every call past `MEMTRACE_MAX_BYTES` is counted in the summary, those the hooks dropped too:
/// recorded and not recorded add up to the calls made.
#[test]
fn calls_past_the_size_limit_are_all_counted() {
    check_calls_past_the_size_limit(&["10000"], 30_000);
}

/// As above with four threads that end before main calls: the hooks count in each thread's ring
/// (main, whose first calls come past the limit, has none), and the summary adds them all up.
#[test]
fn calls_past_the_size_limit_are_counted_on_every_thread() {
    check_calls_past_the_size_limit(&["10000", "4"], 150_000);
}

/// Runs `p_past_max_bytes args` under a 2 KiB limit: recorded and not recorded add up to `calls`.
fn check_calls_past_the_size_limit(args: &[&str], calls: u64) {
    let (out, dir) = run_args("p_past_max_bytes", args, &[("MEMTRACE_MAX_BYTES", "2KiB")]);
    let err = String::from_utf8_lossy(&out.stderr);
    let not_recorded: u64 = err
        .split(", ")
        .find_map(|p| p.split_once(" not recorded past MEMTRACE_MAX_BYTES").map(|(n, _)| n))
        .unwrap_or_else(|| panic!("no count of calls not recorded: {err}"))
        .parse()
        .unwrap();
    let s = Stats::read(&traces_in(dir.path())[0]).unwrap();
    let recorded = s.allocs + s.frees + s.kernel_launches;
    assert_eq!(recorded + not_recorded, calls, "{recorded} recorded, {not_recorded} not: {err}");
}
