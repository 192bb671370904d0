//! Running the `memsim` binary.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use trace::{Header, Record};

/// Write `records` under `header` to `dir/name` (the format by the name's extension).
pub fn write_records(dir: &Path, name: &str, header: &Header, records: &[Record]) -> PathBuf {
    let path = dir.join(name);
    let mut w = trace::TraceWriter::create(&path, header).unwrap();
    for r in records {
        w.write(r).unwrap();
    }
    w.finish().unwrap();
    path
}

/// `memsim ARGS`: exit status, stdout, stderr.
pub fn memsim(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_memsim")).args(args).output().expect("run memsim");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

/// `memsim ARGS`'s stdout, which must be a success.
pub fn memsim_ok(args: &[&str]) -> String {
    let (code, out, err) = memsim(args);
    assert_eq!(code, 0, "memsim {args:?} failed: {err}");
    out
}

/// `memsim ARGS`'s stdout as JSON, which must be a success.
pub fn json(args: &[&str]) -> Value {
    let out = memsim_ok(args);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("memsim {args:?}: not JSON ({e}): {out}"))
}

/// A JSON Lines allocator request of device 0, stream 0.
pub fn alloc(addr: u64, size: u64) -> String {
    format!(
        r#"{{"kind":"alloc","device":0,"addr":{addr},"size":{size},"stream":0,"mem":"device","api":"allocator","result":0,"origin":"request"}}"#
    )
}

/// A JSON Lines allocator free of device 0, stream 0.
pub fn free(addr: u64) -> String {
    format!(
        r#"{{"kind":"free","device":0,"addr":{addr},"stream":0,"mem":"device","api":"allocator","result":0,"origin":"request","stage":"immediate"}}"#
    )
}

/// No number in `v` is past 2^53 (where JSON readers round), with its path.
pub fn no_huge_numbers(v: &Value, at: &str) {
    match v {
        Value::Number(n) => assert!(n.as_u64().is_none_or(|n| n < 1 << 53), "{at} = {n}"),
        Value::Array(a) => a.iter().enumerate().for_each(|(i, x)| no_huge_numbers(x, &format!("{at}[{i}]"))),
        Value::Object(m) => m.iter().for_each(|(k, x)| no_huge_numbers(x, &format!("{at}.{k}"))),
        _ => {}
    }
}

/// A trace whose stack id 7 is defined twice (`first.py`, then `second.py`), with a 1 MiB
/// allocation made under the first definition and a 2 MiB one under the second.
pub fn redefined_stack_trace(dir: &std::path::Path) -> std::path::PathBuf {
    let header = r#"{"kind":"header","format_version":1,"producer":{"name":"t","version":"1"},"level":"allocator","caching_disabled":false}"#;
    let stack = |file: &str| {
        format!(r#"{{"kind":"stack","tid":1,"id":7,"frames":[{{"filename":"{file}.py","line":1,"name":"{file}"}}]}}"#)
    };
    let with_stack = |addr: u64, size: u64| alloc(addr, size).replacen('{', r#"{"stack":7,"#, 1);
    let lines = [stack("first"), with_stack(1 << 30, 1 << 20), stack("second"), with_stack(2 << 30, 2 << 20)];
    let t = dir.join("stk.jsonl");
    std::fs::write(&t, format!("{header}\n{}\n", lines.join("\n"))).unwrap();
    t
}
