//! Inputs that can be used only in part, said alike by every command: a snapshot's caveats kept
//! through `convert`, `--strict` on a snapshot with no history and on unknown records, a double
//! free in `stats`, APIs a newer writer named, and outputs and inputs named in every error.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use crate::support::{alloc, free, json, memsim};

const MIB: u64 = 1 << 20;

const HEADER: &str = r#"{"kind":"header","format_version":1,"producer":{"name":"probe","version":"1"},"level":"allocator","caching_disabled":false}"#;

const EXIT: &str = r#"{"kind":"process_exit","lost_events":0}"#;

/// A JSON Lines trace of the header and `lines`.
fn trace(dir: &Path, name: &str, lines: &[String]) -> String {
    let p = dir.join(name);
    std::fs::write(&p, format!("{HEADER}\n{}\n", lines.join("\n"))).unwrap();
    p.to_str().unwrap().to_string()
}

/// A pickled snapshot of one 20 MiB segment at 1 GiB, its one block `state`, and the trace
/// `entries` of device 0.
fn snapshot(dir: &Path, name: &str, state: &str, entries: Value) -> String {
    let (addr, size) = (1u64 << 30, 20 * MIB);
    let held = if state == "inactive" { 0 } else { size };
    let segment = json!({"device": 0, "address": addr, "total_size": size, "stream": 0, "segment_type": "large",
        "allocated_size": held, "active_size": held,
        "blocks": [{"address": addr, "size": size, "requested_size": held, "state": state}]});
    let snap = json!({"segments": [segment], "device_traces": [entries]});
    let p = dir.join(name);
    std::fs::write(&p, serde_pickle::to_vec(&snap, serde_pickle::SerOptions::new()).unwrap()).unwrap();
    p.to_str().unwrap().to_string()
}

/// `dir/name` as a string.
fn path(dir: &Path, name: &str) -> String {
    dir.join(name).to_str().unwrap().to_string()
}

/// The command `args` with `input` (and for `convert` an output in `dir`): its status and stderr.
fn run(dir: &Path, cmd: &str, input: &str, strict: bool) -> (i32, String, PathBuf) {
    let out = dir.join(format!("out-{cmd}.mtrace"));
    let mut args = vec![cmd, input];
    if cmd == "convert" {
        args.push(out.to_str().unwrap());
    }
    if strict {
        args.push("--strict");
    }
    let (code, _, err) = memsim(&args);
    (code, err, out)
}

/// A snapshot converted to a trace lost its caveats: convert said so, and the converted trace
/// replayed with no warning that its peaks were only the state at dump time. The trace's header
/// now carries them, through JSON Lines and the binary form alike; only a Perfetto trace cannot.
#[test]
fn a_snapshots_caveats_travel_with_the_trace_it_converts_to() {
    let dir = tempfile::tempdir().unwrap();
    let p = snapshot(dir.path(), "state.pickle", "active_allocated", json!([]));
    let caveat = "the snapshot records no allocator events";
    for (out, lost) in [("s.mtrace", false), ("s.jsonl", false), ("s.json", true), ("s.pickle", false)] {
        let out = path(dir.path(), out);
        let (code, _, err) = memsim(&["convert", &p, &out]);
        assert_eq!(code, 0, "{err}");
        assert!(err.contains(&format!("state.pickle: {caveat}")), "{out}: {err}");
        assert_eq!(err.contains(&format!("{out}: the output does not carry")), lost, "{out}: {err}");
    }
    // Read back, every command says them, naming the file read; --strict refuses the state alone.
    for name in ["s.mtrace", "s.jsonl", "s.pickle"] {
        let file = path(dir.path(), name);
        for cmd in ["replay", "stats"] {
            let (code, _, err) = memsim(&[cmd, &file]);
            assert_eq!(code, 0, "{cmd} {name}: {err}");
            assert!(err.contains(&format!("{name}: {caveat}")), "{cmd} {name}: {err}");
            let (code, _, err) = memsim(&[cmd, &file, "--strict"]);
            assert_eq!(code, 2, "{cmd} --strict {name}: {err}");
            assert!(err.contains("records no allocator events") && err.contains("(--strict)"), "{err}");
        }
        let v = json(&["replay", &file, "--json"]);
        let said = v["warnings"].as_array().unwrap().iter().any(|w| w.as_str().unwrap().contains(caveat));
        assert!(said, "{name}: {v}");
        // Once, however many conversions it went through.
        let (_, _, err) = memsim(&["replay", &file]);
        assert_eq!(err.matches(caveat).count(), 1, "{name}: {err}");
    }
    // JSON Lines to the binary form and back keeps them, and says nothing is left out.
    for (from, to) in [("s.jsonl", "back.mtrace"), ("back.mtrace", "back.jsonl")] {
        let (code, _, err) = memsim(&["convert", &path(dir.path(), from), &path(dir.path(), to)]);
        assert_eq!(code, 0, "{err}");
        assert!(err.contains(caveat) && !err.contains("does not carry"), "{from} -> {to}: {err}");
        let (_, _, err) = memsim(&["stats", &path(dir.path(), to)]);
        assert!(err.contains(&format!("{to}: {caveat}")), "{to}: {err}");
    }
    let text = std::fs::read_to_string(path(dir.path(), "back.jsonl")).unwrap();
    let header: Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    assert_eq!(header["metadata"]["snapshot.state_only"], "true", "{header}");
    assert!(header["metadata"]["snapshot.caveats"].as_str().unwrap().starts_with(caveat), "{header}");
    // A snapshot with its history and nothing to doubt converts without a word, and says none.
    let entries = json!([{"action": "free_requested", "addr": 1u64 << 30, "size": 20 * MIB, "stream": 0},
                         {"action": "free_completed", "addr": 1u64 << 30, "size": 20 * MIB, "stream": 0}]);
    let p = snapshot(dir.path(), "history.pickle", "inactive", entries);
    let h = path(dir.path(), "h.mtrace");
    let (code, _, err) = memsim(&["convert", &p, &h]);
    assert_eq!(code, 0, "{err}");
    assert!(!err.contains("warning"), "{err}");
    let (code, _, err) = memsim(&["replay", &h, "--strict"]);
    assert_eq!(code, 0, "{err}");
    assert!(!err.contains("warning"), "{err}");
}

/// `--strict` passed a snapshot that records no allocator event (its peaks only the state when
/// it was dumped) and a trace with records of kinds this version skips, in every command.
#[test]
fn strict_refuses_a_snapshot_without_history_and_unknown_records() {
    let dir = tempfile::tempdir().unwrap();
    let state = snapshot(dir.path(), "state.pickle", "active_allocated", json!([]));
    let unknown_line = r#"{"kind":"alloc2","device":0,"addr":4096,"size":1024}"#.to_string();
    let unknown_jsonl = trace(dir.path(), "unk.jsonl", &[alloc(4096, MIB), unknown_line, EXIT.into()]);
    let unknown_bin = unknown_tag_trace(dir.path());
    let check = |input: &str, words: &str| {
        for cmd in ["replay", "stats", "convert"] {
            let (code, err, out) = run(dir.path(), cmd, input, false);
            assert_eq!(code, 0, "{cmd} {input}: {err}");
            assert!(err.contains(words), "{cmd} {input}: {err}");
            std::fs::remove_file(&out).ok();
            let (code, err, out) = run(dir.path(), cmd, input, true);
            assert_eq!(code, 2, "{cmd} --strict {input}: {err}");
            assert!(err.contains(words) && err.contains("(--strict)"), "{cmd} --strict {input}: {err}");
            assert!(!out.exists(), "{cmd} --strict {input} wrote {}", out.display());
        }
    };
    check(&state, "records no allocator events");
    // Where the first one is, said too (the refusal named no place).
    check(
        &unknown_jsonl,
        "records of kinds this version does not know were skipped (written by a newer memtrace?); it is at line 3",
    );
    check(&unknown_bin, "records of kinds this version does not know were skipped (written by a newer memtrace?); it is tag 200 at byte");
    // Fields a newer writer appended to a known record were dropped without a word.
    let newer = alloc(4096, MIB).replacen('{', r#"{"newer_field":7,"#, 1);
    let extended_jsonl = trace(dir.path(), "ext.jsonl", &[newer, EXIT.into()]);
    check(
        &extended_jsonl,
        "1 record carried fields this version does not read (misspelt, or written by a newer memtrace?): those fields \
         were ignored; the record is at line 2, key \"newer_field\"",
    );
    check(
        &extended_trace(dir.path()),
        "1 record carried fields this version does not read (written by a newer memtrace?): those fields were \
         ignored; the record is at byte",
    );
}

/// A device 0 allocator request of 1 MiB at `addr`, stamped `addr`.
fn rec(addr: u64) -> trace::Record {
    use trace::{Alloc, Api, Event, Origin};
    let event = Event::Alloc(Alloc::device(addr, MIB, Api::Allocator, Origin::Request));
    trace::Record { ts_ns: Some(addr), tid: None, device: Some(0), event }
}

/// A binary trace with one alloc whose body has a byte after its fields (a field a newer writer
/// appended, FORMAT.md §1.9 rule 1), and an ordinary one.
fn extended_trace(dir: &Path) -> String {
    use trace::{Header, Level};
    let header = Header::new("probe", "1", Level::Allocator);
    let mut bytes = trace::BinaryWriter::new(Vec::new(), &header).unwrap().finish().unwrap();
    let mut state = trace::codec::PrefixState::default();
    let at = bytes.len();
    trace::codec::encode_frame(&mut state, &rec(4096), &mut bytes).unwrap();
    assert!(bytes[at + 1] < 0x7f, "a one-byte length");
    bytes[at + 1] += 1;
    bytes.push(0);
    trace::codec::encode_frame(&mut state, &rec(8 << 20), &mut bytes).unwrap();
    let p = dir.join("ext.mtrace");
    std::fs::write(&p, bytes).unwrap();
    p.to_str().unwrap().to_string()
}

/// A binary trace with one alloc, then a frame of a tag no version has written.
fn unknown_tag_trace(dir: &Path) -> String {
    use trace::{Header, Level};
    let mut header = Header::new("probe", "1", Level::Allocator);
    header.devices.push(trace::DeviceInfo {
        index: 0,
        name: None,
        total_memory: None,
        sm_count: None,
        compute_capability: None,
    });
    let mut bytes = trace::BinaryWriter::new(Vec::new(), &header).unwrap().finish().unwrap();
    let mut state = trace::codec::PrefixState::default();
    trace::codec::encode_frame(&mut state, &rec(4096), &mut bytes).unwrap();
    let at = bytes.len();
    trace::codec::encode_frame(&mut state, &rec(8 << 20), &mut bytes).unwrap();
    bytes[at] = 200;
    let p = dir.join("unk.mtrace");
    std::fs::write(&p, bytes).unwrap();
    p.to_str().unwrap().to_string()
}

/// A Perfetto output that could not be written said only "Is a directory (os error 21)".
#[test]
fn a_perfetto_output_that_cannot_be_written_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let t = trace(dir.path(), "t.jsonl", &[alloc(4096, MIB)]);
    let folder = path(dir.path(), "dd.json");
    std::fs::create_dir(&folder).unwrap();
    for out in [folder, path(dir.path(), "nodir/x.json")] {
        let (code, _, err) = memsim(&["convert", &t, &out]);
        assert_eq!(code, 2, "{err}");
        assert!(err.contains(&format!("writing {out} from {t}")), "{err}");
    }
}

/// `stats` explained a double free as a free of a block allocated before the trace began, in a
/// trace with no start state, where `replay` warned of a damaged trace.
#[test]
fn stats_says_a_free_of_an_address_the_trace_does_not_hold() {
    let dir = tempfile::tempdir().unwrap();
    let check = |lines: &[String], expect: &[&str], refuse: &[&str]| {
        let t = trace(dir.path(), "t.jsonl", lines);
        let (code, out, err) = memsim(&["stats", &t]);
        assert_eq!(code, 0, "{err}");
        let text = format!("{out}{err}");
        for w in expect {
            assert!(text.contains(w), "lacks {w:?}: {text}");
        }
        for w in refuse {
            assert!(!text.contains(w), "says {w:?}: {text}");
        }
    };
    let double = [alloc(4096, MIB), alloc(2 * MIB, MIB), free(4096), free(4096), EXIT.to_string()];
    let damaged = "t.jsonl: 1 free of an address no allocation in the trace holds (freed twice, or never \
                   allocated: a damaged trace), e.g. record 3 (device 0): free of unknown address 0x1000";
    let old = "frees of addresses allocated before the trace began";
    check(&double, &[damaged, "unknown frees     1 (freed twice or never allocated"], &[old]);
    check(&[free(4096)], &["record 0 (device 0): free of unknown address 0x1000"], &[old]);
    check(&[alloc(4096, MIB), free(4096)], &[], &["unknown frees", "warning"]);
    // A free the caching allocator's own module made is one replay applies, and rejects: damage
    // too, as replay says; another module's free is replay's to leave out.
    let named = |text: &str| format!(r#"{{"kind":"name","id":1,"text":"{text}"}}"#);
    let by_caller = free(4096).replace(r#""origin""#, r#""caller":1,"origin""#);
    let framework = [named("/usr/lib/libc10_cuda.so"), by_caller.clone(), EXIT.to_string()];
    check(&framework, &["record 1 (device 0): free of unknown address 0x1000"], &[old]);
    let t = trace(dir.path(), "t.jsonl", &framework);
    let (code, _, err) = memsim(&["replay", &t]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("1 requests rejected by the model"), "{err}");
    check(&[named("libnccl.so.2"), by_caller, EXIT.to_string()], &[old], &["damaged"]);
    // A converted snapshot's free of a block alive when its trace began is no damage.
    let entries = json!([{"action": "free_requested", "addr": 1u64 << 30, "size": 20 * MIB, "stream": 0},
                         {"action": "free_completed", "addr": 1u64 << 30, "size": 20 * MIB, "stream": 0}]);
    let p = snapshot(dir.path(), "history.pickle", "inactive", entries);
    let (code, out, err) = memsim(&["stats", &p]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("unknown frees     1 (frees of blocks allocated before the trace began"), "{out}");
    assert!(!err.contains("damaged"), "{err}");
    let v = json(&["stats", &trace(dir.path(), "j.jsonl", &double), "--json"]);
    let warned = v["warnings"].as_array().unwrap().iter().any(|w| w.as_str().unwrap().contains("freed twice"));
    assert!(warned, "{v}");
}

/// A JSON Lines trace naming an API this version does not know failed whole, where the binary
/// form keeps the unknown code; read, it is said, and so is the name a conversion cannot keep.
#[test]
fn an_api_a_newer_writer_named_is_kept_and_said() {
    let dir = tempfile::tempdir().unwrap();
    let lines = [alloc(4096, MIB).replace(r#""api":"allocator""#, r#""api":"cudaMallocNew""#), EXIT.to_string()];
    let t = trace(dir.path(), "new.jsonl", &lines);
    let (code, out, err) = memsim(&["stats", &t]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("new.jsonl: 1 record names an API this version does not know"), "{err}");
    assert!(out.contains("unknown"), "{out}");
    let back = path(dir.path(), "back.jsonl");
    let (code, _, err) = memsim(&["convert", &t, &back]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("written as unknown:0"), "{err}");
    assert!(std::fs::read_to_string(&back).unwrap().contains(r#""api":"unknown:0""#));
}

/// A snapshot pickle named .mtrace was told to be given "as a .pickle/.pkl file, not a stream",
/// though it was a file.
#[test]
fn a_pickle_named_as_a_trace_is_said_to_be_one() {
    let dir = tempfile::tempdir().unwrap();
    let p = snapshot(dir.path(), "snap.pickle", "active_allocated", json!([]));
    let named = path(dir.path(), "snap.mtrace");
    std::fs::copy(&p, &named).unwrap();
    let (code, _, err) = memsim(&["stats", &named]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("a PyTorch snapshot pickle named .mtrace") && !err.contains("stream"), "{err}");
}

/// Every unknown free of a trace without start-state records (every shim trace) was "freed twice
/// or never allocated: a damaged trace", warned, with "replay rejects them", though replay
/// refuses a device-level trace with the cache on, and a shim that began after an allocation
/// sees its free alone; and a free of address 0 (`cudaFree(NULL)`, the context's initialisation
/// by other producers; `cuMemFree(0)`, `cudaFreeHost(NULL)`, which the shim records) frees
/// nothing and was counted. Damage is said of allocator-level traces only, which replay reads.
#[test]
fn stats_calls_damaged_only_what_replay_reads_and_a_free_of_null_no_free() {
    let dir = tempfile::tempdir().unwrap();
    let free_of = |addr: u64, api: &str, mem: &str| {
        free(addr)
            .replace(r#""api":"allocator""#, &format!(r#""api":"{api}""#))
            .replace(r#""mem":"device""#, &format!(r#""mem":"{mem}""#))
    };
    let lines = [
        free_of(0, "cudaFree", "device"),
        free_of(0, "cudaFreeHost", "pinned_host"),
        free_of(65536, "cudaFree", "device"),
    ];
    for (level, caching_disabled) in [("device", false), ("device", true), ("allocator", false)] {
        let header = HEADER
            .replace(r#""level":"allocator""#, &format!(r#""level":"{level}""#))
            .replace(r#""caching_disabled":false"#, &format!(r#""caching_disabled":{caching_disabled}"#));
        let p = dir.path().join(format!("{level}-{caching_disabled}.jsonl"));
        std::fs::write(&p, format!("{header}\n{}\n{EXIT}\n", lines.join("\n"))).unwrap();
        let t = p.to_str().unwrap();
        let case = format!("{level}, caching disabled {caching_disabled}");
        let (code, out, err) = memsim(&["stats", t]);
        assert_eq!(code, 0, "{case}: {err}");
        // Address 0 is no unknown free: of the three frees, 0x10000 alone is counted.
        assert!(out.contains("unknown frees     1 ("), "{case}: {out}");
        let v = json(&["stats", t, "--json"]);
        assert_eq!(v["unknown_frees"], 1, "{case}");
        if level == "device" {
            assert!(out.contains("unknown frees     1 (frees of addresses allocated before the trace began)"), "{out}");
            assert!(!format!("{out}{err}").contains("damaged"), "{case}: {out}{err}");
            assert_eq!(v["warnings"], json!([]), "{case}");
        } else {
            assert!(out.contains("unknown frees     1 (freed twice or never allocated: a damaged trace"), "{out}");
            assert!(err.contains("record 2 (device 0): free of unknown address 0x10000"), "{case}: {err}");
            assert!(err.contains("replay rejects them"), "{case}: {err}");
        }
        // Replay, where it reads the trace, rejects the free of 0x10000 only.
        if level == "allocator" || caching_disabled {
            let (code, _, err) = memsim(&["replay", t]);
            assert_eq!(code, 0, "{case}: {err}");
            assert!(err.contains("1 requests rejected by the model"), "{case}: {err}");
            assert!(!err.contains("free of unknown address 0x0"), "{case}: {err}");
        }
    }
}

/// `validate` of a snapshot whose events hold no allocation (a free of a block its state held)
/// said "the snapshot records no allocator events": it records two, none of them to place.
#[test]
fn validate_says_what_a_snapshot_without_allocations_records() {
    let dir = tempfile::tempdir().unwrap();
    let (addr, size) = (1u64 << 30, 20 * MIB);
    let entry = |action: &str| json!({"action": action, "addr": addr, "size": size, "stream": 0, "frames": []});
    let frees =
        snapshot(dir.path(), "frees.pickle", "inactive", json!([entry("free_requested"), entry("free_completed")]));
    let none = snapshot(dir.path(), "none.pickle", "inactive", json!([]));
    for (file, says) in [
        (&frees, "EXACT, but vacuously: the snapshot records 2 allocator events and no allocation among them"),
        (&none, "EXACT, but vacuously: the snapshot records no allocator events"),
    ] {
        let (code, out, err) = memsim(&["validate", file]);
        assert_eq!(code, 0, "{file}: {err}");
        assert!(out.contains(says), "{file}: {out}");
    }
}
