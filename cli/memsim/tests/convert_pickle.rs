//! `memsim convert` to a memory_viz snapshot and to Perfetto: a pickle replays to the trace's
//! verdict or says why it may not, counts what it leaves out in the input, numbers errors as
//! `replay` does, and an empty trace is an empty snapshot; the Perfetto words are true of it.

use std::path::Path;

use serde_json::json;

use crate::support::{alloc, free, memsim};

const MIB: u64 = 1 << 20;

const HEADER: &str = r#"{"kind":"header","format_version":1,"producer":{"name":"t","version":"1"},"level":"allocator","caching_disabled":false,"synthetic_addresses":true"#;

/// A JSON Lines trace of `lines`, its header with `extra` fields.
fn trace(dir: &Path, name: &str, extra: &str, lines: &[String]) -> String {
    let p = dir.join(name);
    let body: String = lines.iter().map(|l| format!("{l}\n")).collect();
    std::fs::write(&p, format!("{HEADER}{extra}}}\n{body}")).unwrap();
    p.to_str().unwrap().to_string()
}

/// `convert IN OUT` (which must succeed): its standard error.
fn convert(input: &str, output: &Path) -> String {
    let (code, _, err) = memsim(&["convert", input, output.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    err
}

/// `replay FILE` at 20 GiB: exit status and the verdict line.
fn verdict(file: &str) -> (i32, String) {
    let (code, out, err) = memsim(&["replay", file, "--profile", "a100-40gb", "--capacity", "20GiB"]);
    let line = out.lines().find(|l| l.starts_with("verdict:")).unwrap_or_else(|| panic!("{out}{err}"));
    (code, line.to_string())
}

/// The realised replay dropped a recorded OOM, the trace's allocator configuration and a
/// `set_memory_fraction`, saying nothing: the pickle FITS where the trace DOES NOT FIT.
#[test]
fn a_converted_pickle_gives_the_trace_verdict_or_says_why_not() {
    let dir = tempfile::tempdir().unwrap();
    let oom = r#"{"device":0,"kind":"oom","size":31457280000,"device_free":0,"stream":0}"#.to_string();
    let t = trace(dir.path(), "oom.jsonl", "", &[alloc(1, 100 * MIB), oom, free(1)]);
    let p = dir.path().join("oom.pickle");
    convert(&t, &p);
    let (traced, pickled) = (verdict(&t), verdict(p.to_str().unwrap()));
    assert!(traced.1.contains("DOES NOT FIT"), "{traced:?}");
    assert_eq!(traced, pickled);

    // 300 MiB under max_split_size_mb:200 is an oversize block the 100 MiB request cannot split:
    // 400 MiB reserved, 300 under the defaults.
    let env = r#","env":{"PYTORCH_CUDA_ALLOC_CONF":"max_split_size_mb:200"}"#;
    let t = trace(dir.path(), "env.jsonl", env, &[alloc(1, 300 * MIB), free(1), alloc(2, 100 * MIB)]);
    let p = dir.path().join("env.pickle");
    convert(&t, &p);
    let peak = |f: &str| crate::support::json(&["replay", f, "--json"])["peak_reserved_bytes"].clone();
    assert_eq!(peak(&t), json!(400 * MIB));
    assert_eq!(peak(p.to_str().unwrap()), json!(400 * MIB));

    let fraction = r#"{"kind":"control","op":"set_memory_fraction","fraction":0.0001}"#.to_string();
    let t = trace(dir.path(), "frac.jsonl", "", &[fraction, alloc(1, 300 * MIB), free(1)]);
    let err = convert(&t, &dir.path().join("frac.pickle"));
    assert!(err.contains("no place for a memory fraction: the 1 set_per_process_memory_fraction calls"), "{err}");
    assert!(err.contains("verdict may differ"), "{err}");
    let key = r#","env":{"PYTORCH_CUDA_ALLOC_CONF":"per_process_memory_fraction:0.01"}"#;
    let t = trace(dir.path(), "key.jsonl", key, &[alloc(1, 300 * MIB)]);
    let err = convert(&t, &dir.path().join("key.pickle"));
    assert!(err.contains("\"per_process_memory_fraction:0.01\" is not in the snapshot"), "{err}");
    assert!(err.contains("verdict may differ"), "{err}");
}

/// The markers were counted in the realised replay, which holds none: "0 markers" of 2, and
/// no warning at all where no allocation had a category.
#[test]
fn the_left_out_markers_are_counted_in_the_input() {
    let dir = tempfile::tempdir().unwrap();
    let mark = |i: u32| format!(r#"{{"kind":"marker","text":"iter:{i}"}}"#);
    let cat = alloc(1, 300 * MIB).replace(r#""kind":"alloc""#, r#""kind":"alloc","category":"activation""#);
    let t = trace(dir.path(), "mark.jsonl", "", &[mark(0), cat, mark(1), free(1)]);
    let err = convert(&t, &dir.path().join("mark.pickle"));
    assert!(err.contains("1 categorized allocations and 2 markers are not in it"), "{err}");
    let t = trace(dir.path(), "plain.jsonl", "", &[mark(0), alloc(1, MIB), mark(1), free(1), mark(2)]);
    let err = convert(&t, &dir.path().join("plain.pickle"));
    assert!(err.contains("0 categorized allocations and 3 markers are not in it"), "{err}");
}

/// A device past PyTorch's at the third record (record 2, as `replay` numbers it) was named
/// "record 3", a record of the replay's own output.
#[test]
fn an_export_error_names_the_input_record() {
    let dir = tempfile::tempdir().unwrap();
    let far = alloc(2, MIB).replace(r#""device":0"#, r#""device":200"#);
    let t = trace(dir.path(), "dev.jsonl", "", &[alloc(1, MIB), free(1), far]);
    let out = dir.path().join("dev.pickle");
    let (code, _, err) = memsim(&["convert", &t, out.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("record 2: device 200"), "{err}");
    assert!(!out.exists());
}

/// A trace of only its header, or one ending with the cache emptied, was refused as "nothing to
/// export" (exit 2), though a snapshot with no segment is one, and every other format wrote it.
#[test]
fn a_trace_with_no_segment_at_its_end_is_a_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let t = trace(dir.path(), "hdr.jsonl", "", &[]);
    let p = dir.path().join("hdr.pickle");
    let err = convert(&t, &p);
    assert!(err.contains("the snapshot holds no events and no segments"), "{err}");
    for other in ["hdr.mtrace", "hdr.json"] {
        let err = convert(&t, &dir.path().join(other));
        assert!(!err.contains("warning"), "{other}: {err}");
    }
    let v = crate::support::json(&["replay", p.to_str().unwrap(), "--json"]);
    assert_eq!(v["peak_reserved_bytes"], 0, "{v}");

    let empty = r#"{"kind":"control","op":"empty_cache","device":0}"#.to_string();
    let t = trace(dir.path(), "ec.jsonl", "", &[alloc(1, MIB), free(1), empty]);
    let p = dir.path().join("ec.pickle");
    let err = convert(&t, &p);
    assert!(!err.contains("no events"), "{err}");
    let v = crate::support::json(&["replay", p.to_str().unwrap(), "--json"]);
    assert_eq!(v["peak_reserved_bytes"], 2 * MIB, "{v}");
}

/// Perfetto's caveat line said "read back, it gives none of these warnings": memsim reads no
/// Perfetto trace back.
#[test]
fn the_perfetto_caveat_says_what_its_viewer_shows() {
    let dir = tempfile::tempdir().unwrap();
    let seg = json!({"device": 0, "address": 1u64 << 30, "total_size": 20 * MIB, "stream": 0, "segment_type": "large",
                     "allocated_size": 0, "active_size": 0,
                     "blocks": [{"address": 1u64 << 30, "size": 20 * MIB, "requested_size": 0, "state": "inactive"}]});
    let snap = json!({"segments": [seg], "device_traces": [[]]});
    let p = dir.path().join("state.pickle");
    std::fs::write(&p, serde_pickle::to_vec(&snap, serde_pickle::SerOptions::new()).unwrap()).unwrap();
    let err = convert(p.to_str().unwrap(), &dir.path().join("state.json"));
    assert!(err.contains("does not carry the snapshot's caveats"), "{err}");
    assert!(err.contains("opened in Perfetto") && !err.contains("read back"), "{err}");
}

/// A stack id defined twice gave every entry made under it the last definition's frames in the
/// snapshot: each entry keeps the frames its id named when it was made.
#[test]
fn a_redefined_stack_id_keeps_earlier_entries_frames() {
    let dir = tempfile::tempdir().unwrap();
    let (t, out) = (crate::support::redefined_stack_trace(dir.path()), dir.path().join("stk.pickle"));
    let (code, _, err) = memsim(&["convert", t.to_str().unwrap(), out.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let snap: serde_json::Value =
        serde_pickle::from_slice(&std::fs::read(&out).unwrap(), serde_pickle::DeOptions::new()).unwrap();
    let allocs: Vec<(u64, String)> = snap["device_traces"][0]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["action"] == "alloc")
        .map(|e| (e["size"].as_u64().unwrap(), e["frames"].to_string()))
        .collect();
    assert_eq!(allocs.len(), 2, "{allocs:?}");
    for ((_, frames), file) in allocs.iter().zip(["first.py", "second.py"]) {
        assert!(
            frames.contains(file) && !frames.contains(if file == "first.py" { "second" } else { "first" }),
            "{allocs:?}"
        );
    }
}
