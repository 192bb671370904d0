//! The CUPTI layer against the stub libcupti (tests/c/stub_cupti.c): kernel execution and memory
//! activity records through the buffer callbacks, on the trace's clock; and the one-line
//! fallbacks when libcupti is missing, another profiler holds CUPTI, or CUPTI rejects `MEMORY2`;
//! the records CUPTI holds at a fatal signal.

use std::io::{BufRead, BufReader};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use trace::{CuptiMemoryKind, Event, KernelExec, MemActivity, MemActivityOp, MemoryKind};

use crate::harness::{build_dir, command, run_ok, traces_in, Guard, Run};
use crate::stats::Stats;

fn lib_path(dirs: &[&str]) -> String {
    let b = build_dir();
    dirs.iter().map(|d| b.join(d).display().to_string()).collect::<Vec<_>>().join(":")
}

fn memtrace_lines(r: &Run) -> Vec<String> {
    r.stderr().lines().filter(|l| l.starts_with("memtrace:")).map(str::to_string).collect()
}

/// The run said one `memtrace:` line, the summary (no fallback line), and it says `says`.
fn assert_summary_only(r: &Run, says: &str) {
    let lines = memtrace_lines(r);
    assert_eq!(lines.len(), 1, "no fallback line, only the summary: {lines:?}");
    assert!(lines[0].contains(says), "{lines:?}");
}

/// memsim's cross-check of CUPTI's memory records: allocations, releases, device allocations,
/// those matched by a traced allocation, and releases of addresses CUPTI saw no allocation of.
fn cross_check(s: &Stats) -> (u64, u64, u64, u64, u64) {
    let c = s.cupti_memory.as_ref().expect("cupti_memory");
    (c.allocations, c.releases, c.device_allocations, c.device_allocations_matched, c.unknown_releases)
}

/// (name, duration, grid, block, registers, static shared, dynamic shared, stream, correlation)
type Exec = (String, u64, [u32; 3], [u32; 3], u16, u32, u32, i64, u32);

fn check_execs(lib_dirs: &[&str]) {
    let path = lib_path(lib_dirs);
    let r = run_ok("p_launch", &[("MEMTRACE_CUPTI", "1"), ("LD_LIBRARY_PATH", &path)]);
    let s = r.stats();
    let exit_ts = s.records.iter().rev().find_map(|r| match r.event {
        Event::ProcessExit(_) => r.ts_ns,
        _ => None,
    });
    let execs: Vec<(KernelExec, Option<u64>)> = s
        .records
        .iter()
        .filter_map(|r| match &r.event {
            Event::KernelExec(k) => Some((k.clone(), r.ts_ns)),
            _ => None,
        })
        .collect();
    let got: Vec<Exec> = execs
        .iter()
        .map(|(k, _)| {
            (
                s.name(k.name).unwrap_or("?").to_string(),
                k.end_ns - k.start_ns,
                k.grid,
                k.block,
                k.registers_per_thread,
                k.static_shared_mem,
                k.dynamic_shared_mem,
                k.stream,
                k.correlation_id,
            )
        })
        .collect();
    let want: Vec<Exec> = (0..3u32)
        .map(|i| {
            let name = if i == 1 { "cupti_kernel_b" } else { "cupti_kernel_a" };
            (
                name.to_string(),
                1000 * u64::from(i + 1),
                [i + 1, 2, 3],
                [32 * (i + 1), 1, 1],
                10 + i as u16,
                100 + i,
                200 + i,
                7,
                1000 + i,
            )
        })
        .collect();
    assert_eq!(got, want, "stderr:\n{}", r.stderr());
    // On the trace's clock: the stub's clock runs 7 s ahead of CLOCK_MONOTONIC; converted, the
    // kernels start after the trace began and before the process exit record.
    let exit_ts = exit_ts.expect("process_exit has a timestamp");
    for (k, ts) in &execs {
        assert_eq!(*ts, Some(k.start_ns));
        assert!(k.start_ns > 0 && k.end_ns < exit_ts, "{k:?} outside (0, {exit_ts})");
    }
    // One name definition for the two records of cupti_kernel_a (shared pointer).
    let defs = s.names.values().filter(|n| n.as_str() == "cupti_kernel_a").count();
    assert_eq!(defs, 1);
    // Interposition is unchanged, and nothing but the summary was said.
    assert_eq!(s.kernel_launches, 5);
    assert_summary_only(&r, "3 kernel execs from CUPTI");
}

#[test]
fn kernel_exec_records_from_cupti_on_the_library_path() {
    check_execs(&[".", "cupti"]);
}

#[test]
fn libcupti_is_found_next_to_the_loaded_libcudart() {
    check_execs(&["nextto"]);
}

/// Fallbacks: exactly one line, then interposition only (same calls, no kernel execs).
fn check_fallback(env: &[(&str, &str)], line: &str) {
    let r = run_ok("p_launch", env);
    let s = r.stats();
    assert_eq!(s.kernel_launches, 5);
    assert!(!s.records.iter().any(|r| matches!(r.event, Event::KernelExec(_))));
    let lines = memtrace_lines(&r);
    assert_eq!(lines.len(), 2, "one fallback line and the summary: {lines:?}");
    assert!(lines[0].contains(line) && lines[0].contains("continuing with interposition only"), "{lines:?}");
}

#[test]
fn missing_libcupti_is_one_line_and_no_crash() {
    let path = lib_path(&["."]);
    check_fallback(&[("MEMTRACE_CUPTI", "1"), ("LD_LIBRARY_PATH", &path)], "libcupti not found");
}

#[test]
fn another_subscriber_is_one_line_and_no_crash() {
    let path = lib_path(&[".", "cupti"]);
    check_fallback(
        &[("MEMTRACE_CUPTI", "1"), ("LD_LIBRARY_PATH", &path), ("STUB_CUPTI", "busy")],
        "another profiler holds CUPTI (CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED from cuptiSubscribe)",
    );
}

/// (op, CUPTI memory kind, address, size, correlation id, pc)
type Mem = (MemActivityOp, CuptiMemoryKind, u64, u64, u32, u64);

/// p_runtime_alloc: cudaMalloc a (1 MiB), cudaMalloc b (4096), cudaFree a, cudaFree b,
/// cudaMallocHost h (8192), cudaFreeHost h. CUPTI starts when the first recorded call enters,
/// before it is forwarded, so the driver's allocation of `a` is reported too (the stub, like the
/// real one, reports only what happens while MEMORY2 is enabled).
#[test]
fn memory_activity_records_from_cupti() {
    let path = lib_path(&[".", "cupti"]);
    let r = run_ok("p_runtime_alloc", &[("MEMTRACE_CUPTI", "1"), ("LD_LIBRARY_PATH", &path)]);
    let s = r.stats();
    let traced: Vec<(MemoryKind, u64, u64)> = s.events(|e| match e {
        Event::Alloc(a) if a.result == 0 => Some((a.mem, a.addr, a.size)),
        _ => None,
    });
    let [(MemoryKind::Device, a, 1048576), (MemoryKind::Device, b, 4096), (MemoryKind::PinnedHost, h, 8192)] =
        traced[..]
    else {
        panic!("traced allocations: {traced:?}");
    };
    let mems: Vec<(&MemActivity, Option<u64>, Option<u32>)> = s
        .records
        .iter()
        .filter_map(|r| match &r.event {
            Event::MemActivity(m) => Some((m, r.ts_ns, r.device)),
            _ => None,
        })
        .collect();
    let got: Vec<Mem> =
        mems.iter().map(|(m, ..)| (m.op, m.memory_kind, m.addr, m.size, m.correlation_id, m.pc)).collect();
    use CuptiMemoryKind::{Device, Pinned};
    use MemActivityOp::{Allocation, Release};
    let want: Vec<Mem> = vec![
        (Allocation, Device, a, 1 << 20, 2000, 0x1000),
        (Allocation, Device, b, 4096, 2001, 0x1001),
        (Release, Device, a, 1 << 20, 2002, 0x1002),
        (Release, Device, b, 4096, 2003, 0x1003),
        (Allocation, Pinned, h, 8192, 2004, 0x1004),
        (Release, Pinned, h, 8192, 2005, 0x1005),
    ];
    assert_eq!(got, want, "stderr:\n{}", r.stderr());
    // Synchronous calls: no stream, no pool; device 0; CUPTI's clock converted to the trace's, in
    // the order the driver made them, inside the trace.
    assert!(mems.iter().all(|(m, _, d)| m.stream.is_none() && m.pool.is_none() && *d == Some(0)), "{mems:?}");
    let exit_ts = s.records.iter().rev().find_map(|r| match r.event {
        Event::ProcessExit(_) => r.ts_ns,
        _ => None,
    });
    let ts: Vec<u64> = mems.iter().map(|(_, t, _)| t.expect("a timestamp")).collect();
    assert!(ts.windows(2).all(|w| w[0] <= w[1]), "{ts:?}");
    assert!(ts[0] > 0 && ts[4] < exit_ts.expect("process_exit has a timestamp"), "{ts:?} vs exit {exit_ts:?}");
    // memsim's cross-check: both CUPTI device allocations match the traced cudaMallocs, and every
    // release has its allocation.
    assert_eq!(cross_check(&s), (3, 3, 2, 2, 0));
    // Interposition counts are unchanged; the summary names the memory records.
    assert_eq!((s.allocs, s.frees, s.host_allocs), (2, 2, 1));
    assert_summary_only(&r, "3 kernel execs and 6 memory records from CUPTI");
}

/// A program whose runtime loads libcuda.so.1 only during its first call: CUPTI cannot be
/// subscribed before that call (the real libcupti crashes without a driver), so it starts at
/// the second one. It misses the first allocation only; nothing else changes.
#[test]
fn cupti_waits_one_call_for_a_driver_the_runtime_loads_lazily() {
    let path = lib_path(&[".", "cupti"]);
    let r = run_ok("p_runtime_alloc_lazy_driver", &[("MEMTRACE_CUPTI", "1"), ("LD_LIBRARY_PATH", &path)]);
    let s = r.stats();
    assert_eq!((s.allocs, s.frees, s.host_allocs), (2, 2, 1));
    // a's allocation precedes CUPTI; b's allocation and every release follow it.
    assert_eq!(cross_check(&s), (2, 3, 1, 1, 1));
    assert_summary_only(&r, "and 5 memory records from CUPTI");
}

/// A CUPTI without `MEMORY2` (STUB_CUPTI=nomem): one line, then kernel records as before.
#[test]
fn cupti_rejecting_memory2_keeps_kernel_records() {
    let path = lib_path(&[".", "cupti"]);
    let env = [("MEMTRACE_CUPTI", "1"), ("LD_LIBRARY_PATH", path.as_str()), ("STUB_CUPTI", "nomem")];
    let r = run_ok("p_runtime_alloc", &env);
    let s = r.stats();
    assert!(!s.records.iter().any(|r| matches!(r.event, Event::MemActivity(_))));
    assert_eq!(s.kernel_exec_records, 3);
    assert_eq!(s.cupti_memory, None);
    let lines = memtrace_lines(&r);
    assert_eq!(lines.len(), 2, "one line about MEMORY2 and the summary: {lines:?}");
    assert!(
        lines[0].contains(
            "CUPTI memory activity (MEMORY2) is unavailable (cuptiActivityEnable(MEMORY2) failed with CUPTI \
             error 21); recording kernel executions only"
        ),
        "{lines:?}"
    );
    assert!(lines[1].contains("3 kernel execs from CUPTI") && !lines[1].contains("memory records"), "{lines:?}");
}

/// p_signal started under `env`, once it has said it is ready (its allocations made, waiting);
/// its stdout is taken, its stderr piped.
fn p_signal_ready(dir: &Path, env: &[(&str, &str)]) -> Guard {
    let c = command("p_signal", dir, env).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let mut g = Guard(Some(c));
    let mut line = String::new();
    BufReader::new(g.0.as_mut().unwrap().stdout.take().unwrap()).read_line(&mut line).unwrap();
    assert_eq!(line, "ready\n");
    g
}

/// p_signal (100 cudaMalloc, then waits) under CUPTI, killed by SIGTERM once ready: the stub
/// CUPTI still holds its kernel records and the allocations' memory records, which only a flush
/// delivers. The trace, what the reader's summary says of it, stderr, and how long the death took.
fn killed_by_sigterm(stub: &str) -> (Stats, trace::Summary, PathBuf, String, Duration) {
    let dir = tempfile::tempdir().unwrap();
    let path = lib_path(&[".", "cupti"]);
    let env = [("MEMTRACE_CUPTI", "1"), ("LD_LIBRARY_PATH", path.as_str()), ("STUB_CUPTI", stub)];
    let mut g = p_signal_ready(dir.path(), &env);
    let c = g.0.as_mut().unwrap();
    let sent = Instant::now();
    // Safety of the test: plain kill(2) of our own child.
    assert_eq!(unsafe { libc::kill(c.id() as i32, libc::SIGTERM) }, 0);
    let out = g.0.take().unwrap().wait_with_output().unwrap();
    let took = sent.elapsed();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.signal(), Some(libc::SIGTERM), "{err}");
    let t = traces_in(dir.path());
    assert_eq!(t.len(), 1, "{t:?}: {err}");
    let s = Stats::read(&t[0]).unwrap();
    let mut r = trace::Reader::open(&t[0]).unwrap();
    while r.next_record().is_some() {}
    (s, r.summary(), t[0].clone(), err, took)
}

/// The signal handler cannot flush CUPTI (not async-signal-safe), so a program killed by SIGTERM
/// lost every record CUPTI still held, and the trace read as complete. The writer thread has
/// CUPTI flushed off the signal's path now: they are in the trace.
#[test]
fn a_fatal_signal_still_delivers_the_records_cupti_holds() {
    let (s, summary, path, err, _) = killed_by_sigterm("");
    assert!(s.whole() && !summary.incomplete(), "{summary:?}: {:?}", summary.warnings(&path));
    assert_eq!(s.exit.as_ref().and_then(|e| e.signal), Some(libc::SIGTERM));
    assert_eq!(s.calls(), [("cudaMalloc", 100)]);
    assert_eq!(s.kernel_exec_records, 3, "{err}");
    let c = s.cupti_memory.clone().expect("cupti_memory");
    assert_eq!((c.allocations, c.device_allocations, c.device_allocations_matched), (100, 100, 100), "{err}");
    assert!(err.contains("3 kernel execs and 100 memory records from CUPTI"), "{err}");
}

/// A flush that cannot run at the signal (STUB_CUPTI=hang: it blocks, as on a lock the
/// interrupted thread holds) holds the death up for a bounded time only, and the trace says
/// that CUPTI records may be missing, which the reader counts as incomplete (what
/// `memsim --strict` refuses). Before, nothing said so.
#[test]
fn cupti_records_that_cannot_be_flushed_at_a_signal_mark_the_trace_incomplete() {
    let (s, summary, path, err, took) = killed_by_sigterm("hang");
    // The trace ends whole, with everything the hooks recorded.
    assert!(s.whole(), "{err}");
    assert_eq!(s.exit.as_ref().map(|e| (e.signal, e.lost_events)), Some((Some(libc::SIGTERM), 0)));
    assert_eq!(s.calls(), [("cudaMalloc", 100)]);
    assert_eq!(s.kernel_exec_records, 0);
    assert!(summary.cupti_undelivered && summary.incomplete(), "{summary:?}");
    let w = summary.warnings(&path);
    assert!(w[0].contains("CUPTI activity records were still buffered when a signal ended the process"), "{w:?}");
    assert!(err.contains("CUPTI's flush did not end within 2 s; the trace is marked incomplete"), "{err}");
    // The flush was waited for 2 s from the exit's start, not until the exit path gives up (5 s).
    assert!((Duration::from_millis(1900)..Duration::from_millis(4500)).contains(&took), "{took:?}: {err}");
}

/// `main` left by `pthread_exit` under CUPTI, whose start makes the thread that would flush it
/// at a fatal signal, parked: the writer took that thread for the program's, never found itself
/// the last one, and the process never ended (it blocks SIGTERM too).
#[test]
fn a_main_thread_leaving_by_pthread_exit_under_cupti_ends_the_process() {
    let dir = tempfile::tempdir().unwrap();
    let path = lib_path(&[".", "cupti"]);
    let env = [("MEMTRACE_CUPTI", "1"), ("LD_LIBRARY_PATH", path.as_str())];
    let c = command("p_main_pthread_exit", dir.path(), &env).stderr(Stdio::piped()).spawn().unwrap();
    let mut g = Guard(Some(c));
    let start = Instant::now();
    while g.0.as_mut().unwrap().try_wait().unwrap().is_none() {
        assert!(start.elapsed() < Duration::from_secs(30), "the process did not end");
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = g.0.take().unwrap().wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{:?}: {err}", out.status);
    let t = traces_in(dir.path());
    assert_eq!(t.len(), 1, "{t:?}: {err}");
    let s = Stats::read(&t[0]).unwrap();
    assert!(s.whole(), "the trace was not completed: {err}");
    assert_eq!((s.allocs, s.frees, s.lost_events), (400, 400, 0), "{err}");
    assert!(!err.contains("cannot start"), "{err}");
}

/// A fork child has no CUPTI and no flush thread of its own; it knew its parent's as its own,
/// so a child whose main thread left by `pthread_exit` was never alone, and never ended.
#[test]
fn a_fork_child_leaving_by_pthread_exit_under_cupti_ends() {
    let path = lib_path(&[".", "cupti"]);
    let r = run_ok("p_fork_pthread_exit", &[("MEMTRACE_CUPTI", "1"), ("LD_LIBRARY_PATH", &path)]);
    assert_eq!(r.stdout(), "child exited 0\n", "{}", r.stderr());
    let t = r.traces();
    assert_eq!(t.len(), 2, "{t:?}: {}", r.stderr());
    let mut got: Vec<(u64, u64, bool)> =
        t.iter().map(|p| Stats::read(p).unwrap()).map(|s| (s.allocs, s.frees, s.whole())).collect();
    got.sort();
    assert_eq!(got, [(1, 1, true), (1, 1, true)], "{}", r.stderr());
}

/// The names of `pid`'s threads.
fn thread_names(pid: u32) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|e| std::fs::read_to_string(e.ok()?.path().join("comm")).ok())
        .map(|n| n.trim_end().to_string())
        .collect();
    v.sort();
    v
}

/// The thread that flushes CUPTI at a fatal signal is made when CUPTI starts, parked: made at
/// the signal, it could block on a glibc or malloc lock the interrupted thread holds, and the
/// trace lost its end. Without `MEMTRACE_CUPTI` there is none. Either way SIGTERM still ends
/// the process by the signal with its trace complete.
#[test]
fn the_cupti_flush_thread_waits_from_cuptis_start_and_only_under_cupti() {
    let path = lib_path(&[".", "cupti"]);
    for (cupti, want) in
        [("1", vec!["memtrace-flush", "memtrace-writer", "p_signal"]), ("0", vec!["memtrace-writer", "p_signal"])]
    {
        let dir = tempfile::tempdir().unwrap();
        let env = [("MEMTRACE_CUPTI", cupti), ("LD_LIBRARY_PATH", path.as_str())];
        let mut g = p_signal_ready(dir.path(), &env);
        let c = g.0.as_mut().unwrap();
        // A Rust thread names itself once it runs: until then it bears its creator's name.
        let t0 = Instant::now();
        let mut names = thread_names(c.id());
        while names != want && t0.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(10));
            names = thread_names(c.id());
        }
        assert_eq!(names, want, "MEMTRACE_CUPTI={cupti}");
        // Safety of the test: plain kill(2) of our own child.
        assert_eq!(unsafe { libc::kill(c.id() as i32, libc::SIGTERM) }, 0);
        let out = g.0.take().unwrap().wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.signal(), Some(libc::SIGTERM), "{err}");
        let s = Stats::read(&traces_in(dir.path())[0]).unwrap();
        assert!(s.whole(), "MEMTRACE_CUPTI={cupti}: {err}");
        assert_eq!(s.kernel_exec_records, if cupti == "1" { 3 } else { 0 }, "{err}");
    }
}
