//! Shared test helpers: paths to shared data and the venv (failing loudly when missing), and
//! small trace builders.

use std::path::PathBuf;

/// The repository root: the workspace directory holding `Cargo.lock`, above the crate whose
/// tests include this file.
pub fn repo() -> PathBuf {
    let crate_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    crate_dir.ancestors().find(|d| d.join("Cargo.lock").is_file()).unwrap_or(&crate_dir).to_path_buf()
}

/// A file under ../shared/data; panics with instructions when it is missing.
pub fn shared(rel: &str) -> PathBuf {
    let p = repo().join("../shared/data").join(rel);
    assert!(p.is_file(), "missing shared data {} (expected next to the repository at ../shared/data)", p.display());
    p
}

/// The files under ../shared/data/`dir` whose names end in `.ext`, sorted; panics when there is
/// none.
pub fn shared_files(dir: &str, ext: &str) -> Vec<PathBuf> {
    let d = repo().join("../shared/data").join(dir);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&d)
        .unwrap_or_else(|e| panic!("missing shared data {} ({e})", d.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == ext))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no .{ext} files in {}", d.display());
    files
}

/// The venv's python; panics when missing.
pub fn venv_python() -> PathBuf {
    let p = repo().join(".venv/bin/python");
    assert!(p.is_file(), "missing {}: run scripts/setup.sh to create the venv the trainer needs", p.display());
    p
}

/// A JSON Lines allocator-level trace: `('a', addr, size)` alloc, `('f', addr, _)` free, `('i', _, n)` marker
/// `iter:n`, `('m', _, k)` the k-th of forward/backward/optimizer phase markers.
pub fn jsonl_trace(meta: &[(&str, &str)], ops: &[(char, u64, u64)]) -> String {
    let meta: serde_json::Map<String, serde_json::Value> =
        meta.iter().map(|(k, v)| (k.to_string(), serde_json::Value::String(v.to_string()))).collect();
    let header = serde_json::json!({
        "kind": "header", "format_version": 1,
        "producer": {"name": "test", "version": "0"},
        "level": "allocator", "caching_disabled": false, "synthetic_addresses": true, "metadata": meta,
    });
    let mut s = header.to_string() + "\n";
    for (i, &(op, addr, size)) in ops.iter().enumerate() {
        let line = match op {
            'a' => {
                serde_json::json!({"kind": "alloc", "ts_ns": i, "device": 0, "addr": addr, "size": size, "stream": 0,
                "mem": "device", "api": "allocator", "result": 0, "origin": "request"})
            }
            'f' => serde_json::json!({"kind": "free", "ts_ns": i, "device": 0, "addr": addr, "stream": 0,
                "mem": "device", "api": "allocator", "result": 0, "origin": "request", "stage": "immediate"}),
            'i' => serde_json::json!({"kind": "marker", "ts_ns": i, "device": 0, "text": format!("iter:{size}")}),
            _ => {
                let text = ["phase:forward", "phase:backward", "phase:optimizer"][size as usize];
                serde_json::json!({"kind": "marker", "ts_ns": i, "device": 0, "text": text})
            }
        };
        s += &(line.to_string() + "\n");
    }
    s
}
