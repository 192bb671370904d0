//! Exit paths, signals, fork, threads, markers and configuration.

use std::io::{BufRead, BufReader};
use std::os::unix::process::ExitStatusExt;
use std::process::Stdio;
use std::time::{Duration, Instant};

use trace::Event;

use crate::harness::{command, run, run_ok, traces_in, Guard};
use crate::stats::Stats;

#[test]
fn fork_child_traces_into_its_own_file() {
    let r = run_ok("p_fork", &[]);
    let child: u32 = r.stdout().trim().strip_prefix("child ").unwrap().parse().unwrap();
    let traces = r.traces();
    assert_eq!(traces.len(), 2, "{traces:?}");
    for t in traces {
        let s = Stats::read(&t).unwrap();
        assert!(s.whole(), "{}", t.display());
        if t.file_stem().unwrap().to_str().unwrap() == child.to_string() {
            assert_eq!(s.calls(), [("cudaFree", 1), ("cudaMalloc", 2)]);
            assert_eq!(s.peak_live_device_bytes, 5000);
        } else {
            assert_eq!(s.calls(), [("cudaFree", 1), ("cudaMalloc", 1)]);
            assert_eq!(s.peak_live_device_bytes, 1000);
        }
    }
}

/// One file for two processes (MEMTRACE_OUT without %p): the child finds the parent's trace
/// locked and writes beside it, saying so, where it truncated the parent's trace and left it
/// corrupt.
#[test]
fn fork_child_under_a_fixed_path_writes_beside_the_parents_trace() {
    let dir = tempfile::tempdir().unwrap();
    let same = dir.path().join("same.mtrace");
    let out = command("p_fork", dir.path(), &[("MEMTRACE_OUT", same.to_str().unwrap())]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let child: u32 = stdout.trim().strip_prefix("child ").unwrap().parse().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let beside = dir.path().join(format!("same.{child}.mtrace"));
    assert!(
        stderr.contains(&format!("has no %p: fork child pid {child} traces into {}", beside.display())),
        "{stderr}"
    );
    let parent = Stats::read(&same).unwrap();
    assert!(parent.whole(), "the parent's trace is whole");
    assert_eq!(parent.calls(), [("cudaFree", 1), ("cudaMalloc", 1)]);
    let child = Stats::read(&beside).unwrap();
    assert!(child.whole());
    assert_eq!(child.calls(), [("cudaFree", 1), ("cudaMalloc", 2)]);
}

/// A fork child that outlives its parent (a daemon, a data-loader worker) does not keep the
/// parent's trace file open: it held the lock, and the next run given that path wrote beside it.
#[test]
fn a_fork_child_does_not_hold_the_parents_finished_trace() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run.mtrace");
    let mut c = command("p_fork_outlives", dir.path(), &[("MEMTRACE_OUT", path.to_str().unwrap())])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // The child waits on this pipe; dropping it (also on a failed assertion) lets it exit.
    let _child_stdin = c.stdin.take().unwrap();
    assert!(c.wait().unwrap().success());
    // A child not yet scheduled after the fork still holds every inherited descriptor (under a
    // loaded CI machine the parent had ended first): wait for the byte it writes once its fork
    // handlers have run.
    let mut ready = [0u8; 1];
    std::io::Read::read_exact(c.stdout.as_mut().unwrap(), &mut ready).unwrap();
    assert_eq!(&ready, b"r");
    let parent = Stats::read(&path).unwrap();
    assert!(parent.whole(), "the parent's trace is whole");
    assert_eq!(parent.calls(), [("cudaFree", 1), ("cudaMalloc", 1)]);
    let f = std::fs::File::open(&path).unwrap();
    use std::os::fd::AsRawFd;
    // Safety of the test: flock on a descriptor the test owns; LOCK_NB never blocks.
    let locked = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    assert_eq!(
        locked,
        0,
        "the trace file is still locked after its process exited: {}",
        std::io::Error::last_os_error()
    );
}

/// Two processes given one MEMTRACE_OUT (two ranks, or an exec'd child): the second finds the
/// file locked by the first, which is still writing it, and writes beside it.
#[test]
fn a_second_process_on_a_locked_trace_file_writes_beside_it() {
    let dir = tempfile::tempdir().unwrap();
    let one = dir.path().join("one.mtrace");
    let env = [("MEMTRACE_OUT", one.to_str().unwrap())];
    let c = command("p_signal", dir.path(), &env).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let first = c.id();
    let mut g = Guard(Some(c));
    let mut line = String::new();
    BufReader::new(g.0.as_mut().unwrap().stdout.take().unwrap()).read_line(&mut line).unwrap();
    assert_eq!(line, "ready\n");
    // The writer opens (and locks) the file on its own thread; its header marks that done.
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::fs::metadata(&one).map_or(0, |m| m.len()) == 0 {
        assert!(Instant::now() < deadline, "the first process never wrote its header");
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = command("p_fork", dir.path(), &[("MEMTRACE_OUT", one.to_str().unwrap()), ("MEMTRACE_FOLLOW_FORK", "0")])
        .output()
        .unwrap();
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("is being written by another process"), "{stderr}");
    let c = g.0.as_mut().unwrap();
    // Safety of the test: plain kill(2) of our own child.
    assert_eq!(unsafe { libc::kill(first as i32, libc::SIGTERM) }, 0);
    c.wait().unwrap();
    g.0 = None;
    let kept = Stats::read(&one).unwrap();
    assert!(kept.whole(), "the first process's trace is whole");
    assert_eq!(kept.calls(), [("cudaMalloc", 100)]);
    let second: Vec<_> = traces_in(dir.path()).into_iter().filter(|t| t != &one).collect();
    assert_eq!(second.len(), 1, "{second:?}");
    assert_eq!(Stats::read(&second[0]).unwrap().calls(), [("cudaFree", 1), ("cudaMalloc", 1)]);
}

/// A FIFO as `MEMTRACE_OUT`: with a reader the trace streams to it whole; with none, opening it
/// blocked the writer for good (the rings filled, the program's exit waited on the writer, and
/// the trace was lost without a word). Now it is said, and the program runs untraced.
#[test]
fn a_fifo_streams_when_read_and_is_said_when_not() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("trace.fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // Safety: a NUL-terminated path this test owns.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let f = fifo.to_str().unwrap();
    let out = command("p_runtime_alloc", dir.path(), &[("MEMTRACE_OUT", f)]).output().unwrap();
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("MEMTRACE_OUT {f} is a pipe no process reads; recording disabled")), "{err}");
    // With a reader (opened first, so the program finds it; the small trace fits the pipe's
    // buffer, read once the program is done), the whole trace.
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let mut reader = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(&fifo).unwrap();
    let out = command("p_runtime_alloc", dir.path(), &[("MEMTRACE_OUT", f), ("MEMTRACE_QUIET", "1")]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let mut bytes = Vec::new();
    reader.read_to_end(&mut bytes).unwrap();
    let t = dir.path().join("read.mtrace");
    std::fs::write(&t, bytes).unwrap();
    let s = Stats::read(&t).unwrap();
    assert!(s.whole() && s.allocs == 2, "{s:?}");
}

/// A trace streamed to a pipe (`MEMTRACE_OUT=/dev/stdout`) is written whole: there is nothing to
/// lock or truncate there (truncating failed, and recording was disabled).
#[test]
fn a_trace_streams_to_stdout() {
    let dir = tempfile::tempdir().unwrap();
    let out = command("p_runtime_alloc", dir.path(), &[("MEMTRACE_OUT", "/dev/stdout"), ("MEMTRACE_QUIET", "1")])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.stdout.starts_with(b"MEMTRACE"), "{}", String::from_utf8_lossy(&out.stderr));
    let t = dir.path().join("piped.mtrace");
    std::fs::write(&t, &out.stdout).unwrap();
    let s = Stats::read(&t).unwrap();
    assert!(s.whole());
    assert_eq!(s.allocs, 2);
    // A fork child does not write into the parent's stream, nor beside a device.
    let out =
        command("p_fork", dir.path(), &[("MEMTRACE_OUT", "/dev/stdout"), ("MEMTRACE_QUIET", "1")]).output().unwrap();
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("MEMTRACE_OUT /dev/stdout is a stream: fork child pid"), "{err}");
    let stray: Vec<_> = std::fs::read_dir("/dev")
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("stdout."))
        .collect();
    assert!(stray.is_empty(), "files written beside /dev/stdout: {stray:?}");
}

/// Runs `prog ARGS` under the shim with `MEMTRACE_OUT=/dev/stdout` and stdout redirected to a
/// file (`prog > out`); asserts it succeeds; returns the file and its stderr.
fn to_redirected_stdout(dir: &std::path::Path, prog: &str, args: &[&str]) -> (std::path::PathBuf, String) {
    let redirected = dir.join("out");
    let f = std::fs::File::create(&redirected).unwrap();
    let out = command(prog, dir, &[("MEMTRACE_OUT", "/dev/stdout"), ("MEMTRACE_QUIET", "1")])
        .args(args)
        .stdout(Stdio::from(f))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{err}");
    (redirected, err)
}

/// `MEMTRACE_OUT=/dev/stdout` with stdout redirected to a file (`prog > out`) writes the trace
/// into that stream, beside the program's own output, as through a pipe. It opened the file
/// afresh: the trace was truncated over the program's output, or that output over the trace.
#[test]
fn a_trace_to_stdout_redirected_to_a_file_keeps_the_programs_output() {
    let dir = tempfile::tempdir().unwrap();
    let (redirected, err) = to_redirected_stdout(dir.path(), "p_fork", &[]);
    // The fork child takes the redirected stdout for the parent's stream, as it does a pipe.
    assert!(err.contains("MEMTRACE_OUT /dev/stdout is a stream: fork child pid"), "{err}");
    let bytes = std::fs::read(&redirected).unwrap();
    let text = b"child ";
    let at = bytes.windows(text.len()).position(|w| w == text).expect("the program's output is in the file");
    let end = at + bytes[at..].iter().position(|&b| b == b'\n').unwrap() + 1;
    let mut trace = bytes[..at].to_vec();
    trace.extend_from_slice(&bytes[end..]);
    let t = dir.path().join("trace.mtrace");
    std::fs::write(&t, &trace).unwrap();
    let s = Stats::read(&t).unwrap();
    assert!(s.whole(), "the trace around the program's output is whole");
    assert_eq!(s.calls(), [("cudaFree", 1), ("cudaMalloc", 1)]);
}

/// Two traced processes writing into one redirected stdout (a shell running two, or a launcher
/// and its exec'd workers) would leave two traces in one stream, unreadable apart: the second
/// finds the first one's trace there and does not trace, saying so.
#[test]
fn a_second_process_does_not_trace_into_a_redirected_stdout_that_holds_a_trace() {
    let dir = tempfile::tempdir().unwrap();
    let prog = crate::harness::build_dir().join("p_runtime_alloc");
    let (redirected, err) =
        to_redirected_stdout(dir.path(), "/bin/sh", &["-c", "\"$0\" && \"$0\"", prog.to_str().unwrap()]);
    assert!(err.contains("where another process already writes a trace"), "{err}");
    let s = Stats::read(&redirected).unwrap();
    assert!(s.whole(), "one whole trace in the stream");
    assert_eq!(s.allocs, 2, "the first process's");
}

#[test]
fn fork_child_stops_when_not_followed() {
    let r = run_ok("p_fork", &[("MEMTRACE_FOLLOW_FORK", "0")]);
    let s = r.stats();
    assert_eq!(s.calls(), [("cudaFree", 1), ("cudaMalloc", 1)]);
}

/// A block one thread allocates and hands to another, which frees it: the free was stamped
/// before the allocation (`rdtsc` ran ahead of the load that received the pointer), so the
/// trace held frees of unknown blocks and a peak above anything ever live (140 MiB of 65).
#[test]
fn a_block_freed_by_another_thread_is_freed_after_its_allocation() {
    let env = [("MEMTRACE_QUIET", "1"), ("MEMTRACE_MAX_WAIT_MS", "60000"), ("STUB_CUDA_MEM_LOG", "0")];
    let r = run_ok("p_cross_thread_free", &env);
    let s = r.stats();
    assert_eq!((s.allocs, s.frees, s.lost_events), (100_000, 100_000, 0));
    let (mut live, mut peak) = (std::collections::HashSet::<u64>::new(), 0);
    for (i, rec) in s.records.iter().enumerate() {
        match &rec.event {
            Event::Alloc(a) => {
                assert!(live.insert(a.addr), "record {i}: {:#x} allocated while live", a.addr);
                peak = peak.max(live.len());
            }
            Event::Free(f) => assert!(live.remove(&f.addr), "record {i}: free of {:#x}, not live", f.addr),
            _ => {}
        }
    }
    assert!(peak <= 65, "{peak} blocks of 1 MiB live at once; at most 65 can be");
}

#[test]
fn eight_threads_lose_and_duplicate_nothing() {
    // Eight producers on a loaded machine can keep the writer off the cores for over the
    // default second, after which the shim drops (and counts) an event by design; this test is
    // about losing nothing while the writer lives, so it gives the writer a minute.
    let r = run_ok("p_threads", &[("MEMTRACE_QUIET", "1"), ("MEMTRACE_MAX_WAIT_MS", "60000")]);
    let s = r.stats();
    assert_eq!(s.lost_events, 0, "lost events");
    assert_eq!(s.calls(), [("cudaFree", 800_000), ("cudaMalloc", 800_000)]);
    assert_eq!((s.allocs, s.frees, s.lost_events), (800_000, 800_000, 0));
    // Per thread: exactly 100k allocations, each freed once, in order.
    let mut per_tid = std::collections::HashMap::<u32, (u64, u64)>::new();
    let mut live = std::collections::HashMap::<(u32, u64), ()>::new();
    for rec in s.records.iter().filter(|r| matches!(r.event, Event::Alloc(_) | Event::Free(_))) {
        let tid = rec.tid.expect("allocations and frees carry their thread");
        match &rec.event {
            Event::Alloc(a) => {
                per_tid.entry(tid).or_default().0 += 1;
                assert!(live.insert((tid, a.addr), ()).is_none(), "duplicate allocation {:#x}", a.addr);
            }
            Event::Free(f) => {
                per_tid.entry(tid).or_default().1 += 1;
                assert!(live.remove(&(tid, f.addr)).is_some(), "free of unknown {:#x}", f.addr);
            }
            _ => {}
        }
    }
    assert_eq!(per_tid.len(), 8);
    assert!(per_tid.values().all(|c| *c == (100_000, 100_000)), "{per_tid:?}");
    assert!(r.stderr().is_empty(), "MEMTRACE_QUIET=1 still printed: {}", r.stderr());
}

/// Spawn p_signal, wait for "ready", then wait until the trace holds all 100 allocations.
pub(crate) fn started(env: &[(&str, &str)]) -> (Guard, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let mut c = command("p_signal", dir.path(), env).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let mut line = String::new();
    BufReader::new(c.stdout.take().unwrap()).read_line(&mut line).unwrap();
    assert_eq!(line, "ready\n");
    (Guard(Some(c)), dir)
}

#[test]
fn sigterm_completes_the_trace_and_still_kills() {
    let (mut g, dir) = started(&[]);
    let c = g.0.as_mut().unwrap();
    // Safety of the test: plain kill(2) of our own child.
    assert_eq!(unsafe { libc::kill(c.id() as i32, libc::SIGTERM) }, 0);
    let status = c.wait().unwrap();
    g.0 = None;
    assert_eq!(status.signal(), Some(libc::SIGTERM));
    let t = traces_in(dir.path());
    let s = Stats::read(&t[0]).unwrap();
    assert!(s.whole());
    assert_eq!(s.calls(), [("cudaMalloc", 100)]);
    assert_eq!(s.exit.unwrap().signal, Some(libc::SIGTERM));
}

#[test]
fn sigkill_leaves_a_readable_truncated_trace() {
    let (mut g, dir) = started(&[]);
    // The writer flushes periodically; wait (bounded) until all 100 allocations are on disk.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let t = traces_in(dir.path());
        if let Some(p) = t.first() {
            if Stats::read(p).map(|s| s.allocs == 100).unwrap_or(false) {
                break;
            }
        }
        assert!(Instant::now() < deadline, "the 100 allocations never reached the file");
        std::thread::sleep(Duration::from_millis(20));
    }
    let c = g.0.as_mut().unwrap();
    c.kill().unwrap();
    assert_eq!(c.wait().unwrap().signal(), Some(libc::SIGKILL));
    g.0 = None;
    let s = Stats::read(&traces_in(dir.path())[0]).unwrap();
    assert!(!s.complete && s.exit.is_none());
    assert_eq!(s.calls(), [("cudaMalloc", 100)]);
}

#[test]
fn exit_from_another_thread_and_underscore_exit() {
    for (prog, status) in [("p_exit_thread", 3), ("p_underscore_exit", 4)] {
        let r = run(prog, &[]);
        assert_eq!(r.out.status.code(), Some(status), "{prog}: {}", r.stderr());
        let s = r.stats();
        assert!(s.whole(), "{prog}");
        assert_eq!(s.calls(), [("cudaMalloc", 1)], "{prog}");
        assert_eq!(s.exit.unwrap().status, Some(status), "{prog}");
    }
}

#[test]
fn markers_and_nvtx_ranges() {
    let s = run_ok("p_marker", &[]).stats();
    let marks: Vec<_> = s.events(|e| match e {
        Event::Marker(m) => Some(m.text.clone()),
        _ => None,
    });
    assert_eq!(marks, ["iter:0", "phase:forward", "iter:1"]);
    assert_eq!(s.calls(), [("cudaMalloc", 1)]);
}

#[test]
fn kernels_off_records_no_launches() {
    let s = run_ok("p_internal_driver", &[("MEMTRACE_KERNELS", "0")]).stats();
    assert_eq!(s.kernel_launches, 0);
    assert!(!s.calls.contains_key("cudaGraphLaunch") && s.calls["cudaMallocAsync"] == 1, "{:?}", s.calls);
    // A process that records nothing writes no file at all.
    assert!(run_ok("p_launch", &[("MEMTRACE_KERNELS", "0")]).traces().is_empty());
}

#[test]
fn invalid_config_value_warns_and_uses_default() {
    let r = run_ok("p_runtime_alloc", &[("MEMTRACE_MAX_BYTES", "lots"), ("MEMTRACE_QUIET", "1")]);
    let err = r.stderr();
    assert!(err.contains("MEMTRACE_MAX_BYTES=\"lots\" is invalid") && err.contains("using the default \"0\""), "{err}");
    assert_eq!(r.stats().allocs, 2);
}

/// A misspelt variable (recorded 5 launches, silently, for `MEMTRACE_KERNEL=0`) and a binary
/// trace named `.jsonl` are said; the run is traced as before.
#[test]
fn a_misspelt_variable_and_a_jsonl_name_are_said() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("t.jsonl");
    let env = [("MEMTRACE_KERNEL", "0"), ("MEMTRACE_OUT", out.to_str().unwrap()), ("MEMTRACE_QUIET", "1")];
    let r = command("p_runtime_alloc", dir.path(), &env).output().unwrap();
    assert!(r.status.success());
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(err.contains("MEMTRACE_KERNEL is not a variable of the shim (did you mean MEMTRACE_KERNELS?)"), "{err}");
    assert!(err.contains("the shim writes the binary trace format whatever the name"), "{err}");
    assert_eq!(Stats::read(&out).unwrap().allocs, 2);
}

/// A file at MEMTRACE_OUT that is not a trace is someone's data: it was emptied in silence and
/// the trace written over it. It is left as it is, the trace beside it, and said; an earlier
/// run's trace is written over as before.
#[test]
fn a_file_that_is_not_a_trace_is_left_as_it_is() {
    let dir = tempfile::tempdir().unwrap();
    for (name, held, kept) in [
        ("notes.mtrace", &b"precious user data\n"[..], true),
        ("short.mtrace", &b"hi"[..], true),
        // Text that opens as the magic does is still no trace: the version bytes say so.
        ("env.mtrace", &b"MEMTRACE_OUT=/tmp/x.mtrace\n"[..], true),
        ("cut.mtrace", &b"MEMT"[..], false),
        ("empty.mtrace", &b""[..], false),
    ] {
        let out = dir.path().join(name);
        std::fs::write(&out, held).unwrap();
        let env = [("MEMTRACE_OUT", out.to_str().unwrap()), ("MEMTRACE_QUIET", "1")];
        let r = command("p_runtime_alloc", dir.path(), &env).output().unwrap();
        assert!(r.status.success(), "{name}");
        let err = String::from_utf8_lossy(&r.stderr);
        let said =
            err.contains(&format!("MEMTRACE_OUT: {} is a file that is not a trace, left as it is", out.display()));
        assert_eq!(said, kept, "{name}: {err}");
        if kept {
            assert_eq!(std::fs::read(&out).unwrap(), held, "{name}: untouched");
            let stem = format!("{}.", name.trim_end_matches(".mtrace"));
            let beside = std::fs::read_dir(dir.path())
                .unwrap()
                .map(|e| e.unwrap().path())
                .find(|p| p.file_name().unwrap().to_str().unwrap().starts_with(&stem) && *p != out)
                .unwrap_or_else(|| panic!("{name}: no trace beside it"));
            assert!(err.contains(&format!("traces into {}", beside.display())), "{name}: {err}");
            assert_eq!(Stats::read(&beside).unwrap().allocs, 2, "{name}");
        } else {
            assert_eq!(Stats::read(&out).unwrap().allocs, 2, "{name}: an earlier trace is written over");
        }
    }
    // A second run over the first's trace writes over it (a rerun), and says nothing.
    let out = dir.path().join("empty.mtrace");
    let env = [("MEMTRACE_OUT", out.to_str().unwrap()), ("MEMTRACE_QUIET", "1")];
    let r = command("p_runtime_alloc", dir.path(), &env).output().unwrap();
    assert!(!String::from_utf8_lossy(&r.stderr).contains("not a trace"));
    assert_eq!(Stats::read(&out).unwrap().allocs, 2);
}

/// A name memsim does not read a trace by is said: it wrote `x.trace` without a word, and memsim
/// refused it as an unknown format.
#[test]
fn an_out_name_memsim_does_not_read_is_said() {
    let dir = tempfile::tempdir().unwrap();
    for (name, warned) in [("x.trace", true), ("noext", true), ("ok.mtrace", false), ("OK.MTRACE", false)] {
        let out = dir.path().join(name);
        let env = [("MEMTRACE_OUT", out.to_str().unwrap()), ("MEMTRACE_QUIET", "1")];
        let r = command("p_runtime_alloc", dir.path(), &env).output().unwrap();
        let err = String::from_utf8_lossy(&r.stderr);
        assert_eq!(err.contains("memsim reads a trace file by its name"), warned, "{name}: {err}");
        assert_eq!(Stats::read(&out).unwrap().allocs, 2, "{name}: traced as before");
    }
}

/// A relative MEMTRACE_OUT is taken from the start directory, which a path of text cannot name
/// when the directory's name is not UTF-8: said (the trace went where the program later was).
#[test]
fn a_relative_out_under_a_directory_not_named_in_utf8_is_said() {
    use std::os::unix::ffi::OsStrExt;
    let dir = tempfile::tempdir().unwrap();
    let odd = dir.path().join(std::ffi::OsStr::from_bytes(b"bad\xff"));
    std::fs::create_dir(&odd).unwrap();
    let env = [("MEMTRACE_OUT", "r.mtrace"), ("MEMTRACE_QUIET", "1")];
    let r = command("p_runtime_alloc", &odd, &env).current_dir(&odd).output().unwrap();
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(r.status.success(), "{err}");
    assert!(err.contains("MEMTRACE_OUT=\"r.mtrace\" is relative and the start directory's name is not UTF-8"), "{err}");
    assert_eq!(Stats::read(&odd.join("r.mtrace")).unwrap().allocs, 2, "traced where it started (no chdir)");
}

#[test]
fn max_bytes_stops_with_a_marker() {
    let r = run_ok("p_threads", &[("MEMTRACE_MAX_BYTES", "64K"), ("MEMTRACE_QUIET", "1")]);
    let t = r.traces();
    let s = Stats::read(&t[0]).unwrap();
    assert!(s.whole());
    assert!(s.allocs > 100 && s.allocs < 800_000, "{}", s.allocs);
    let last_marker = s.records.iter().rev().find_map(|r| match &r.event {
        Event::Marker(m) => Some(m.text.clone()),
        _ => None,
    });
    assert!(last_marker.unwrap().contains("MEMTRACE_MAX_BYTES=65536 reached"));
    let size = std::fs::metadata(&t[0]).unwrap().len();
    assert!(size < 65536 + 4096, "{size}");
}

#[test]
fn log_debug_prints_the_config_table() {
    let r = run_ok("p_runtime_alloc", &[("MEMTRACE_LOG", "debug"), ("MEMTRACE_QUIET", "1")]);
    for var in [
        "MEMTRACE_OUT",
        "MEMTRACE_KERNELS",
        "MEMTRACE_CUPTI",
        "MEMTRACE_MAX_BYTES",
        "MEMTRACE_QUIET",
        "MEMTRACE_FOLLOW_FORK",
    ] {
        assert!(r.stderr().contains(&format!("memtrace: {var} = ")), "{var} missing:\n{}", r.stderr());
    }
}

/// Python's own SIGINT handler (KeyboardInterrupt) keeps working: the shim flushes and chains to
/// it, the program carries on, and the trace completes at its normal exit.
#[test]
fn sigint_chains_to_python_keyboard_interrupt() {
    let py = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python");
    assert!(py.is_file(), "{} missing: create the venv (scripts/setup.sh)", py.display());
    let script = r#"
import ctypes, os, signal, time
# Python leaves SIGINT ignored when it starts with it ignored (a background job of a
# non-interactive shell): install its KeyboardInterrupt handler before the shim chains to it.
signal.signal(signal.SIGINT, signal.default_int_handler)
rt = ctypes.CDLL("libcudart.so.13")
p = ctypes.c_void_p()
assert rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(1000)) == 0
try:
    os.kill(os.getpid(), signal.SIGINT)
    # Not signal.pause(): the signal is delivered during kill(), and pause() would wait for
    # another one if the interpreter had not run the handler yet. A loop checks every round.
    for _ in range(3000):
        time.sleep(0.01)
except KeyboardInterrupt:
    print("interrupted")
assert rt.cudaFree(p) == 0
"#;
    let dir = tempfile::tempdir().unwrap();
    let out = command(py.to_str().unwrap(), dir.path(), &[]).args(["-c", script]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "interrupted");
    let s = Stats::read(&traces_in(dir.path())[0]).unwrap();
    assert!(s.whole());
    assert_eq!(s.calls(), [("cudaFree", 1), ("cudaMalloc", 1)]);
    assert_eq!(s.exit.unwrap().signal, None);
}

/// Hooks run from a pthread key destructor, after the shim's thread-locals are gone (so through
/// the shared queue), are recorded under the right thread and in order with the thread's ring;
/// a second wave of threads, which may take over the first wave's rings, records under its own
/// thread ids.
#[test]
fn hooks_during_thread_teardown_and_reused_rings() {
    let r = run_ok("p_thread_teardown", &[]);
    let mut tids: Vec<u32> = r.stdout().lines().map(|l| l.parse().unwrap()).collect();
    tids.sort();
    let s = r.stats();
    assert!(s.whole());
    assert_eq!(s.calls(), [("cudaFree", 16), ("cudaMalloc", 16)]);
    assert_eq!((s.allocs, s.frees, s.unknown_frees, s.lost_events), (16, 16, 0, 0));
    // Per thread: its body's allocation, then the destructor's allocation and two frees.
    let mut per_tid = std::collections::BTreeMap::<u32, Vec<(&str, u64)>>::new();
    for rec in &s.records {
        match &rec.event {
            Event::Alloc(a) => per_tid.entry(rec.tid.unwrap()).or_default().push(("alloc", a.size)),
            Event::Free(f) => per_tid.entry(rec.tid.unwrap()).or_default().push(("free", f.size.unwrap_or(0))),
            _ => {}
        }
    }
    assert_eq!(per_tid.keys().copied().collect::<Vec<_>>(), tids);
    for (tid, seq) in &per_tid {
        assert_eq!(seq, &[("alloc", 128), ("alloc", 32), ("free", 32), ("free", 128)], "thread {tid}");
    }
}
