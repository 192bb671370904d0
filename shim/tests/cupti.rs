//! The CUPTI layer against the stub libcupti (tests/c/stub_cupti.c): kernel execution records
//! through the buffer callbacks, on the trace's clock; and the one-line fallbacks when libcupti
//! is missing or another profiler holds CUPTI.

use trace::{Event, KernelExec};

use crate::harness::{build_dir, run_ok, Run};

fn lib_path(dirs: &[&str]) -> String {
    let b = build_dir();
    dirs.iter().map(|d| b.join(d).display().to_string()).collect::<Vec<_>>().join(":")
}

fn memtrace_lines(r: &Run) -> Vec<String> {
    r.stderr().lines().filter(|l| l.starts_with("memtrace:")).map(str::to_string).collect()
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
    let lines = memtrace_lines(&r);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].contains("3 kernel execs from CUPTI"), "{lines:?}");
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
