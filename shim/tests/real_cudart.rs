//! The real `libcudart.so.13` (from the `nvidia-cuda-runtime` wheel in `.venv`), with no driver
//! on this machine: every call fails with 35 (cudaErrorInsufficientDriver); the shim must
//! intercept, forward, and record each failure with its code. Fails loudly if the library is
//! missing.

use std::path::PathBuf;

use trace::Event;

use crate::harness::{build_dir, run_ok};

fn real_cudart_dir() -> PathBuf {
    if let Ok(d) = std::env::var("MEMTRACE_REAL_CUDART_DIR") {
        return PathBuf::from(d);
    }
    let lib = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.venv/lib");
    let found: Vec<PathBuf> = std::fs::read_dir(&lib)
        .unwrap_or_else(|e| {
            panic!("{}: {e}; create the venv (scripts/setup.sh) or set MEMTRACE_REAL_CUDART_DIR", lib.display())
        })
        .filter_map(|e| e.ok())
        .map(|e| e.path().join("site-packages/nvidia/cu13/lib"))
        .filter(|d| d.join("libcudart.so.13").is_file())
        .collect();
    assert_eq!(found.len(), 1, "expected exactly one libcudart.so.13 under {}: {found:?}", lib.display());
    found.into_iter().next().unwrap()
}

/// p_real_cudart, linked against the real runtime in `real` (built once per test process).
fn build_real_program(real: &std::path::Path) -> PathBuf {
    static EXE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    EXE.get_or_init(|| link_real_program(real)).clone()
}

fn link_real_program(real: &std::path::Path) -> PathBuf {
    let exe = build_dir().join("p_real_cudart");
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/c");
    let out = std::process::Command::new("cc")
        .args(["-O1", "-rdynamic", &format!("-I{}", src.display())])
        .arg(src.join("p_real_cudart.c"))
        .arg("-o")
        .arg(&exe)
        .arg(format!("-L{}", real.display()))
        .arg("-l:libcudart.so.13")
        .arg(format!("-Wl,-rpath,{}", real.display()))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    exe
}

#[test]
fn real_runtime_failures_are_recorded_with_their_codes() {
    let real = real_cudart_dir();
    let exe = build_real_program(&real);
    // No LD_LIBRARY_PATH to the stubs: the real runtime must find no driver at all.
    let r = run_ok(exe.to_str().unwrap(), &[("LD_LIBRARY_PATH", "/nonexistent")]);
    assert_eq!(r.stdout().trim(), "35 35 35");
    let s = r.stats();
    assert_eq!(s.calls(), [("cudaLaunchKernel", 1), ("cudaMalloc", 1), ("cudaMallocHost", 1)]);
    assert_eq!((s.allocs, s.kernel_launches, s.failed()), (0, 0, 3));
    // The exit summary counts as memsim does: the failed launch ran no kernel, and failed.
    assert!(r.stderr().contains("0 kernel launches, 0 pinned host allocs, 3 failed calls"), "{}", r.stderr());
    let codes: Vec<i32> = s.events(|e| match e {
        Event::Alloc(a) => Some(a.result),
        Event::KernelLaunch(k) => Some(k.result),
        _ => None,
    });
    assert_eq!(codes, [35, 35, 35]);
}

/// MEMTRACE_CUPTI=1 with the real runtime and the real libcupti.so.13 of the wheel, but no
/// driver: one line, the same recorded failures, no crash (real CUPTI overflows its stack when
/// subscribed without a driver, so the shim must not subscribe).
#[test]
fn real_runtime_with_cupti_and_no_driver_is_one_line() {
    let real = real_cudart_dir();
    let exe = build_real_program(&real);
    let r = run_ok(exe.to_str().unwrap(), &[("LD_LIBRARY_PATH", real.to_str().unwrap()), ("MEMTRACE_CUPTI", "1")]);
    assert_eq!(r.stdout().trim(), "35 35 35");
    let lines: Vec<_> = r.stderr().lines().filter(|l| l.starts_with("memtrace:")).map(str::to_string).collect();
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(lines[0].contains("no CUDA driver (libcuda.so.1) is loaded"), "{lines:?}");
    assert_eq!(r.stats().failed(), 3);
}
