//! Test harness: compiles the C stubs and programs once per test run (with the system `cc`),
//! finds the built `libmemtrace.so`, runs programs under it with RAII-guarded children.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;

use crate::stats::Stats;

fn manifest() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn src() -> PathBuf {
    manifest().join("tests/c")
}

/// The shim under test: `$MEMTRACE_SHIM`, else the `libmemtrace.so` that `cargo test` built
/// beside this test binary (`target/<profile>/deps`: `cargo test` rebuilds it there but copies
/// it up to `target/<profile>` only on `cargo build`, so the copy up there can be stale), else
/// that copy. Panics (failing the test) when none is there.
pub fn shim() -> PathBuf {
    if let Ok(p) = std::env::var("MEMTRACE_SHIM") {
        let p = PathBuf::from(p);
        assert!(p.is_file(), "MEMTRACE_SHIM={} is not a file", p.display());
        return p;
    }
    let exe = std::env::current_exe().expect("current_exe");
    let deps = exe.parent().expect("test binary lives in target/<profile>/deps");
    let fresh = deps.join("libmemtrace.so");
    if fresh.is_file() {
        return fresh;
    }
    let profile = deps.parent().expect("test binary lives in target/<profile>/deps");
    let p = profile.join("libmemtrace.so");
    assert!(
        p.is_file(),
        "{} not found: build it with `cargo build -p memtrace-shim` or set MEMTRACE_SHIM",
        p.display()
    );
    p
}

fn cc(args: &[&str], cwd: &Path) {
    let out = Command::new("cc").args(args).current_dir(cwd).output().expect("running cc (is a C compiler installed?)");
    assert!(out.status.success(), "cc {} failed:\n{}", args.join(" "), String::from_utf8_lossy(&out.stderr));
}

const PROGRAMS: [&str; 47] = [
    "p_runtime_alloc",
    "p_launch",
    "p_internal_driver",
    "p_entry_point",
    "p_triton",
    "p_plt_driver",
    "p_rtld_local",
    "p_fork",
    "p_threads",
    "p_oom",
    "p_signal",
    "p_rtld_next",
    "p_marker",
    "p_exit_thread",
    "p_underscore_exit",
    "p_more_entry_points",
    "p_thread_teardown",
    "p_dlopen_shim",
    "p_every_alloc",
    "p_dlvsym",
    "p_fork_outlives",
    "p_main_pthread_exit",
    "p_sig_ignored",
    "p_chdir",
    "p_exec_self",
    "p_main_exit_fds",
    "p_own_mark",
    "p_sig_eintr",
    "p_sig_resethand",
    "p_fork_past_limit",
    "p_many_allocs",
    "p_close_fds",
    "p_exit_backlog",
    "p_past_max_bytes",
    "p_shared_exit",
    "p_fork_pthread_exit",
    "p_sig_chain",
    "p_abort",
    "p_quick_exit",
    "p_fault",
    "p_fault_chain",
    "p_fault_writer",
    "p_fault_survive",
    "p_main_returns",
    "p_exit_blocked",
    "p_cross_thread_free",
    "p_long_name",
];

/// The directory with the stub libraries and test programs, built on first use.
pub fn build_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
        // One directory per test process (concurrent runs must not clobber each other's stubs);
        // directories of test processes that are gone are removed.
        for e in std::fs::read_dir(&tmp).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some(pid) = name.strip_prefix("shim-c-") {
                if !Path::new("/proc").join(pid).exists() {
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
        }
        let dir = tmp.join(format!("shim-c-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create build dir");
        let s = src();
        let s = s.to_str().unwrap();
        let inc = format!("-I{s}");
        cc(
            &[
                "-shared",
                "-fPIC",
                "-O1",
                "-Wl,-soname,libcuda.so.1",
                "-Wl,-Bsymbolic-functions",
                &format!("{s}/stub_cuda.c"),
                "-o",
                "libcuda.so.1",
            ],
            &dir,
        );
        for ver in ["12", "13"] {
            let map = dir.join(format!("cudart{ver}.map"));
            std::fs::write(&map, format!("libcudart.so.{ver} {{ global: cuda*; __cuda*; local: *; }};\n")).unwrap();
            cc(
                &[
                    "-shared",
                    "-fPIC",
                    "-O1",
                    &format!("-Wl,-soname,libcudart.so.{ver}"),
                    "-Wl,-Bsymbolic-functions",
                    &format!("-Wl,--version-script={}", map.display()),
                    &format!("{s}/stub_cudart.c"),
                    "-o",
                    &format!("libcudart.so.{ver}"),
                    "-ldl",
                    "-lpthread",
                ],
                &dir,
            );
        }
        for (link, target) in [("libcuda.so", "libcuda.so.1"), ("libcudart.so", "libcudart.so.13")] {
            let _ = std::fs::remove_file(dir.join(link));
            std::os::unix::fs::symlink(target, dir.join(link)).unwrap();
        }
        cc(
            &[
                "-shared",
                "-fPIC",
                "-O1",
                &inc,
                &format!("{s}/libuser.c"),
                "-o",
                "libuser.so",
                "-L.",
                "-lcudart",
                "-Wl,-rpath,$ORIGIN",
            ],
            &dir,
        );
        cc(&["-shared", "-fPIC", "-O1", &format!("{s}/libsecond.c"), "-o", "libsecond.so", "-ldl"], &dir);
        // The stub libcupti lives apart (cupti/), so that tests choose whether it can be found:
        // on LD_LIBRARY_PATH, next to the libcudart in use (nextto/), or not at all.
        std::fs::create_dir_all(dir.join("cupti")).unwrap();
        cc(
            &[
                "-shared",
                "-fPIC",
                "-O1",
                "-Wl,-soname,libcupti.so.13",
                &format!("{s}/stub_cupti.c"),
                "-o",
                "cupti/libcupti.so.13",
            ],
            &dir,
        );
        let next_to = dir.join("nextto");
        std::fs::create_dir_all(&next_to).unwrap();
        for (link, target) in [
            ("cupti/libcupti.so", "libcupti.so.13"),
            ("nextto/libcudart.so.13", "../libcudart.so.13"),
            ("nextto/libcuda.so.1", "../libcuda.so.1"),
            ("nextto/libcupti.so.13", "../cupti/libcupti.so.13"),
        ] {
            let _ = std::fs::remove_file(dir.join(link));
            std::os::unix::fs::symlink(target, dir.join(link)).unwrap();
        }
        // p_runtime_alloc linked against the runtime only: libcuda.so.1 is loaded by the stub
        // runtime's first call, as a real libcudart does.
        cc(
            &[
                "-O1",
                "-rdynamic",
                &inc,
                &format!("{s}/p_runtime_alloc.c"),
                "-o",
                "p_runtime_alloc_lazy_driver",
                "-L.",
                "-Wl,--no-as-needed",
                "-lcudart",
                "-Wl,--as-needed",
                "-ldl",
                "-lpthread",
                "-Wl,-rpath,$ORIGIN",
            ],
            &dir,
        );
        for p in PROGRAMS {
            cc(
                &[
                    "-O1",
                    "-rdynamic",
                    &inc,
                    &format!("{s}/{p}.c"),
                    "-o",
                    p,
                    "-L.",
                    "-Wl,--no-as-needed",
                    "-lcudart",
                    "-lcuda",
                    "-Wl,--as-needed",
                    "-ldl",
                    "-lpthread",
                    "-Wl,-rpath,$ORIGIN",
                ],
                &dir,
            );
        }
        dir
    })
}

/// A child that is killed if the test fails before reaping it.
pub struct Guard(pub Option<Child>);

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(c) = self.0.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// One program run: its output directory (traces are `<pid>.mtrace` in it).
pub struct Run {
    pub out: Output,
    pub dir: tempfile::TempDir,
}

impl Run {
    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.out.stderr).into_owned()
    }

    pub fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.out.stdout).into_owned()
    }

    /// Every trace written, sorted by path.
    pub fn traces(&self) -> Vec<PathBuf> {
        traces_in(self.dir.path())
    }

    /// The only trace; fails if there is not exactly one.
    pub fn stats(&self) -> Stats {
        let t = self.traces();
        assert_eq!(t.len(), 1, "expected one trace, found {t:?}; stderr:\n{}", self.stderr());
        Stats::read(&t[0]).unwrap_or_else(|e| panic!("reading {}: {e:#}", t[0].display()))
    }
}

pub fn traces_in(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "mtrace"))
        .collect();
    v.sort();
    v
}

/// A command for `prog` (a built program name or an absolute path) under the shim, writing
/// traces into `dir`.
pub fn command(prog: &str, dir: &Path, env: &[(&str, &str)]) -> Command {
    let b = build_dir();
    let path = if prog.starts_with('/') { PathBuf::from(prog) } else { b.join(prog) };
    let mut c = Command::new(path);
    c.env("LD_PRELOAD", shim())
        .env("LD_LIBRARY_PATH", b)
        .env("MEMTRACE_OUT", dir.join("%p.mtrace"))
        .env_remove("MEMTRACE_QUIET")
        .env_remove("MEMTRACE_KERNELS")
        .env_remove("MEMTRACE_MAX_BYTES")
        .env_remove("MEMTRACE_FOLLOW_FORK")
        .env_remove("MEMTRACE_LOG");
    for (k, v) in env {
        c.env(k, v);
    }
    c.stdin(Stdio::null());
    c
}

/// Run `prog` to completion under the shim.
pub fn run(prog: &str, env: &[(&str, &str)]) -> Run {
    let dir = tempfile::tempdir().unwrap();
    let out = command(prog, dir.path(), env).output().expect("spawn test program");
    Run { out, dir }
}

/// Run and require a zero exit status.
pub fn run_ok(prog: &str, env: &[(&str, &str)]) -> Run {
    let r = run(prog, env);
    assert!(r.out.status.success(), "{prog} failed: {:?}\nstderr:\n{}", r.out.status, r.stderr());
    r
}
