//! Running the memest binary, for every module that drives it end to end, and reading what
//! `memest compare` wrote.

use std::path::Path;
use std::process::Command;

/// `cmd` run to its end: its exit code (-1 when a signal ended it), stdout and stderr.
pub fn ran(cmd: &mut Command) -> (i32, String, String) {
    let out = cmd.output().expect("memest runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// memest with `args`: its exit code, stdout and stderr.
pub fn memest_code(args: &[&str]) -> (i32, String, String) {
    ran(Command::new(env!("CARGO_BIN_EXE_memest")).args(args))
}

/// memest with `args`: whether it succeeded, its stdout and stderr.
pub fn memest(args: &[&str]) -> (bool, String, String) {
    let (code, out, err) = memest_code(args);
    (code == 0, out, err)
}

/// `memest compare --dataset data --out out` and `extra`, not yet run.
pub fn compare_command(data: &Path, out: &Path, extra: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_memest"));
    cmd.args(["compare", "--dataset", data.to_str().unwrap(), "--out", out.to_str().unwrap()]).args(extra);
    cmd
}

/// `memest compare --dataset data --out out` and `extra`: whether it succeeded, stdout, stderr.
pub fn memest_compare(data: &Path, out: &Path, extra: &[&str]) -> (bool, String, String) {
    let (code, stdout, err) = ran(&mut compare_command(data, out, extra));
    (code == 0, stdout, err)
}

/// The run records compare wrote in `out` (its runs.jsonl).
pub fn records(out: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(out.join("runs.jsonl")).unwrap();
    text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// The metrics compare wrote in `out` (its metrics.json).
pub fn metrics_json(out: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(out.join("metrics.json")).unwrap()).unwrap()
}
