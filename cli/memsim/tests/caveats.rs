//! What replay and validate say beside their numbers: which replay the peaks are of, which
//! allocator configuration was followed (recorded, contradictory, overridden), snapshots that
//! hold only their state or that memsim wrote, and damaged snapshots every command refuses.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use crate::support::{alloc, free, json, memsim};

const MIB: u64 = 1 << 20;

/// Pickle bytes of plain JSON-like data, as Python writes a snapshot.
fn pickle(v: &Value) -> Vec<u8> {
    serde_pickle::to_vec(v, serde_pickle::SerOptions::new()).unwrap()
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> String {
    let p: PathBuf = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p.to_str().unwrap().to_string()
}

/// A snapshot segment at `addr` of `size` B: one block of `state` covering it.
fn segment(addr: u64, size: u64, state: &str) -> Value {
    let held = if state == "inactive" { 0 } else { size };
    json!({"device": 0, "address": addr, "total_size": size, "stream": 0, "segment_type": "large",
           "allocated_size": held, "active_size": held,
           "blocks": [{"address": addr, "size": size, "requested_size": held, "state": state}]})
}

/// A pickled snapshot of one inactive 20 MiB segment at `base`, the trace `entries` and the
/// recorded allocator `settings`.
fn settings_snapshot(dir: &Path, name: &str, base: u64, settings: &Value, entries: &Value) -> String {
    let snap = json!({"segments": [segment(base, 20 * MIB, "inactive")], "device_traces": [entries],
                      "allocator_settings": settings});
    write(dir, name, &pickle(&snap))
}

const HEADER: &str = r#"{"kind":"header","format_version":1,"producer":{"name":"probe","version":"1"},"level":"allocator","caching_disabled":false"#;

/// A JSON Lines trace: the header (with `extra` header fields) and `lines`.
fn trace(dir: &Path, name: &str, extra: &str, lines: &[String]) -> String {
    write(dir, name, format!("{HEADER}{extra}}}\n{}\n", lines.join("\n")).as_bytes())
}

fn warned(v: &Value, words: &str) -> bool {
    v["warnings"].as_array().unwrap().iter().any(|w| w.as_str().unwrap().contains(words))
}

/// At a budget the run does not fit, the peaks printed were the replay without a budget's, beside
/// "replayed within the allocator budget", and `memory_stats.num_ooms` 0 beside `oom: true`.
#[test]
fn the_peaks_say_which_replay_they_are_of() {
    let dir = tempfile::tempdir().unwrap();
    let lines: Vec<String> = (0..4).map(|i| alloc((1 + i) << 30, 8 * MIB)).collect();
    let t = trace(dir.path(), "four.jsonl", "", &lines);
    for (cap, oom, of) in [("20MiB", true, "unlimited"), ("1GiB", false, "budget")] {
        let (code, out, err) = memsim(&["replay", &t, "--capacity", cap, "--json"]);
        assert_eq!(code, i32::from(oom), "{out}{err}");
        let v: Value = serde_json::from_str(&out).unwrap();
        assert_eq!((v["oom"].as_bool(), v["peaks_of"].as_str()), (Some(oom), Some(of)), "{v}");
        assert!(v["peak_reserved_bytes"].as_u64().unwrap() >= 32 * MIB, "{v}");
    }
    let (_, out, _) = memsim(&["replay", &t, "--capacity", "20MiB"]);
    assert!(out.contains("fails at record 2; these peaks and stats are of the replay without a budget"), "{out}");
    assert!(!out.contains("replayed within the allocator budget"), "{out}");
}

/// A snapshot whose start state alone is over the budget was DOES NOT FIT with `oom: false` and
/// no reason; and a snapshot with no events was FITS with no word that its peak is only its
/// state when dumped.
#[test]
fn a_start_state_over_the_budget_and_a_state_only_snapshot_are_said() {
    let dir = tempfile::tempdir().unwrap();
    let snap = json!({"segments": [segment(1 << 30, 20 * MIB, "active_allocated")], "device_traces": [[]]});
    let p = write(dir.path(), "state.pickle", &pickle(&snap));
    let (code, out, err) = memsim(&["replay", &p, "--capacity", "10MiB", "--json"]);
    assert_eq!(code, 1, "{out}{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!((v["oom"].as_bool(), v["peaks_of"].as_str()), (Some(true), Some("unlimited")), "{v}");
    assert!(v["oom_detail"].as_str().unwrap().contains("the start state alone"), "{v}");
    assert!(warned(&v, "only the state at dump time"), "{v}");
    let (code, out, _) = memsim(&["replay", &p, "--capacity", "10MiB"]);
    assert_eq!(code, 1);
    assert!(out.contains("the start state alone") && out.contains("DOES NOT FIT"), "{out}");
    let v = json(&["replay", &p, "--capacity", "1GiB", "--json"]);
    assert!(warned(&v, "only the state at dump time") && v["verdict"]["fits"] == true, "{v}");
}

/// `--alloc-conf` dropped the recorded expandable_segments:True without a word (replay and
/// validate), and a snapshot whose string and field disagree was replayed by the string and
/// validated by the field.
#[test]
fn recorded_settings_follow_one_rule_and_an_override_names_what_it_drops() {
    let dir = tempfile::tempdir().unwrap();
    let env = r#","env":{"PYTORCH_CUDA_ALLOC_CONF":"expandable_segments:True"}"#;
    let t = trace(dir.path(), "exp.jsonl", env, &[alloc(1 << 30, 3 * MIB)]);
    let v = json(&["replay", &t, "--alloc-conf", "garbage_collection_threshold:0.6", "--json"]);
    assert!(warned(&v, "expandable_segments true (now false)"), "{v}");
    assert_eq!(v["alloc_conf_source"], "override", "{v}");
    let v = json(&["replay", &t, "--json"]);
    assert!(!warned(&v, "--alloc-conf"), "{v}");

    let base = 1u64 << 30;
    let settings = json!({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "expandable_segments": false});
    let entries = json!([
        {"action": "segment_alloc", "addr": base, "size": 20 * MIB, "stream": 0},
        {"action": "alloc", "addr": base, "size": 3 * MIB, "stream": 0},
        {"action": "free_requested", "addr": base, "size": 3 * MIB, "stream": 0},
        {"action": "free_completed", "addr": base, "size": 3 * MIB, "stream": 0},
    ]);
    let p = settings_snapshot(dir.path(), "contra.pickle", base, &settings, &entries);
    let r = json(&["replay", &p, "--json"]);
    assert!(warned(&r, "contradict each other"), "{r}");
    // A key is found by either of PyTorch's spellings, and a comma inside a bracket list does
    // not end its part: the HIP name's contradiction went unsaid.
    let hip = json!({"PYTORCH_CUDA_ALLOC_CONF": "roundup_power2_divisions:[1:2,4:8],release_lock_on_hipmalloc:True",
                     "release_lock_on_cudamalloc": false});
    let h = json(&["replay", &settings_snapshot(dir.path(), "hip.pickle", base, &hip, &entries), "--json"]);
    assert!(warned(&h, "says release_lock_on_cudamalloc true, its allocator_settings field says false"), "{h}");
    assert!(!warned(&h, "roundup_power2_divisions"), "{h}");
    let (code, out, err) = memsim(&["validate", &p, "--json"]);
    assert_eq!(code, 0, "{out}{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert!(warned(&v, "contradict each other"), "{v}");
    // One rule: both follow the field (not expandable: a 20 MiB segment).
    assert_eq!(v["verdict"], "exact", "{v}");
    assert_eq!(r["peak_reserved_bytes"], v["predicted_peak_reserved_bytes"], "{r}\n{v}");
    assert_eq!(r["peak_reserved_bytes"].as_u64(), Some(20 * MIB), "{r}");
    // validate says what it compared (the configuration replayed: the field over the string),
    // and an override is named.
    assert_eq!(
        (v["alloc_conf"].as_str(), v["alloc_conf_source"].as_str()),
        (Some("expandable_segments:False"), Some("recorded"))
    );
    let (code, out, err) = memsim(&["validate", &p, "--alloc-conf", "max_split_size_mb:100", "--json"]);
    assert_eq!(code, 0, "{out}{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!((v["alloc_conf_source"].as_str(), v["verdict"].as_str()), (Some("override"), Some("exact")), "{v}");
    // The override replaces both the string and the field: nothing of theirs contradicts.
    assert!(!warned(&v, "contradict each other"), "{v}");
    let r = json(&["replay", &p, "--alloc-conf", "max_split_size_mb:100", "--json"]);
    assert!(!warned(&r, "contradict each other"), "{r}");
    let (code, _, err) = memsim(&["validate", &p, "--alloc-conf", "bogus:1"]);
    assert_eq!(code, 2);
    assert!(err.contains("--alloc-conf") && err.contains("bogus"), "{err}");
}

/// Damaged snapshots: two segments at one address had a record silently dropped by replay and
/// were "explained by the start state" by validate; an enlarged total_size was refused by validate
/// and replayed by replay, its rejection only in text; a 2^63-byte segment replayed as 0 MiB, FITS.
#[test]
fn damaged_segments_are_refused_by_replay_and_validate_alike() {
    let dir = tempfile::tempdir().unwrap();
    let base = 1u64 << 30;
    let cases = [
        (
            "overlap",
            vec![segment(base, 20 * MIB, "inactive"), segment(base, 2 * MIB, "inactive")],
            "segments[1].address",
        ),
        ("badsum", vec![segment(base, 24 * MIB, "inactive"), segment(base + 20 * MIB, 2 * MIB, "inactive")], "overlap"),
        ("bb63", vec![segment(base, 1 << 63, "active_allocated")], "segments[0].total_size"),
        ("wrap", vec![segment(u64::MAX - 16 * MIB + 1, 20 * MIB, "inactive")], "past 2^64"),
        // A 30 MiB block in a 20 MiB segment was replayed cut to fit, and validated.
        (
            "overflow",
            vec![json!({"device": 0, "address": base, "total_size": 20 * MIB, "stream": 0,
            "segment_type": "large", "allocated_size": 30 * MIB, "active_size": 30 * MIB,
            "blocks": [{"address": base, "size": 30 * MIB, "requested_size": 30 * MIB, "state": "active_allocated"}]})],
            "segments[0].blocks[0]: expected a block inside its segment",
        ),
    ];
    for (name, segs, words) in cases {
        let snap = json!({"segments": segs, "device_traces": [[{"action": "alloc", "addr": base + (40 * MIB), "size": 512, "stream": 0}]]});
        let p = write(dir.path(), &format!("{name}.pickle"), &pickle(&snap));
        for cmd in ["replay", "validate"] {
            let (code, out, err) = memsim(&[cmd, &p, "--json"]);
            assert_eq!(code, 2, "{name} {cmd}: {out}{err}");
            assert!(out.is_empty() && err.contains(words) && err.contains("damaged snapshot"), "{name} {cmd}: {err}");
        }
    }
}

/// A request the model rejects was a "WARNING" line in text only, not in `--json` `warnings`.
#[test]
fn rejected_requests_are_listed_in_the_json_warnings() {
    let dir = tempfile::tempdir().unwrap();
    let t = trace(dir.path(), "rej.jsonl", "", &[alloc(1 << 30, MIB), free(5 << 30)]);
    let v = json(&["replay", &t, "--json"]);
    assert_eq!(v["rejected"], 1, "{v}");
    assert!(warned(&v, "1 requests rejected by the model"), "{v}");
}

/// A snapshot memsim wrote was EXACT with no word that the comparison is circular; one alloc and
/// no segment (recorded peak 0, predicted 2 MiB) was "explained by the start state", exit 0.
#[test]
fn validate_says_when_it_compares_the_model_with_itself_or_a_snapshot_at_odds_with_itself() {
    let dir = tempfile::tempdir().unwrap();
    let snap =
        json!({"segments": [segment(1 << 30, 20 * MIB, "inactive")], "device_traces": [[]], "memtrace_header": {}});
    let p = write(dir.path(), "ours.pickle", &pickle(&snap));
    let v = json(&["validate", &p, "--json"]);
    assert!(warned(&v, "circular"), "{v}");
    let snap = json!({"segments": [], "device_traces": [[{"action": "alloc", "addr": 0, "size": 512, "stream": 0}]]});
    let p = write(dir.path(), "oneev.pickle", &pickle(&snap));
    let (code, out, _) = memsim(&["validate", &p]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("MISMATCH") && !out.contains("explained by"), "{out}");
    assert!(out.contains("address 0x0"), "unrecoverable lines print hex addresses: {out}");
    assert!(out.contains("MISMATCH: the snapshot is inconsistent with itself: 1 of its entries"), "{out}");
}

/// Frees of an address no segment holds, and no allocation: every number printed was 0 of 0, yet
/// the verdict read "MISMATCH beyond what the start state explains", which nothing beside it said.
#[test]
fn a_mismatch_verdict_names_what_it_rests_on() {
    let dir = tempfile::tempdir().unwrap();
    let frees = json!([{"action": "free_requested", "addr": 4096, "size": 512, "stream": 0},
                       {"action": "free_completed", "addr": 4096, "size": 512, "stream": 0}]);
    let p = write(dir.path(), "frees.pickle", &pickle(&json!({"segments": [], "device_traces": [frees]})));
    let (code, out, err) = memsim(&["validate", &p]);
    assert_eq!(code, 1, "{out}{err}");
    let verdict = out.lines().find(|l| l.contains("verdict")).unwrap();
    assert!(!verdict.contains("beyond what the start state explains"), "{out}");
    assert!(
        verdict.contains("MISMATCH: 2 of its entries could not be replayed (the first: device 0, entry 0:"),
        "{out}"
    );
    assert!(verdict.contains("no allocation to compare"), "{out}");
}

/// `colocate` given one file twice said nothing (two copies of one job may be meant: a warning).
#[test]
fn colocate_says_when_one_file_is_given_twice() {
    let dir = tempfile::tempdir().unwrap();
    let t = trace(dir.path(), "one.jsonl", "", &[alloc(1 << 30, MIB)]);
    let (code, out, err) = memsim(&["colocate", &t, &t, "--capacity", "1GiB", "--json"]);
    assert_eq!(code, 0, "{out}{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert!(warned(&v, "is given twice"), "{v}");
    let other = trace(dir.path(), "two.jsonl", "", &[alloc(1 << 30, MIB)]);
    let v = json(&["colocate", &t, &other, "--capacity", "1GiB", "--json"]);
    assert!(!warned(&v, "given twice"), "{v}");
}

/// The warning of a profile whose total memory is unmeasured did not name the profile.
#[test]
fn an_unmeasured_total_memory_names_the_profile() {
    let dir = tempfile::tempdir().unwrap();
    let t = trace(dir.path(), "one.jsonl", "", &[alloc(1 << 30, MIB)]);
    let v = json(&["replay", &t, "--profile", "h200", "--json"]);
    assert!(warned(&v, "the profile's (NVIDIA H200) gpu.total_memory is marked unmeasured"), "{v}");
}

/// Recorded settings memsim cannot parse (an unknown key) were an error even under
/// `--alloc-conf`, which replaces them; and replay rebuilt a snapshot's start state under the
/// recorded settings, not the ones it replays with.
#[test]
fn an_override_gets_past_unreadable_recorded_settings() {
    let dir = tempfile::tempdir().unwrap();
    let base = 1u64 << 30;
    let settings = json!({"PYTORCH_CUDA_ALLOC_CONF": "throw_on_cudamalloc_oom:True"});
    let entries = json!([
        {"action": "alloc", "addr": base, "size": 2 * MIB, "stream": 0},
        {"action": "free_requested", "addr": base, "size": 2 * MIB, "stream": 0},
        {"action": "free_completed", "addr": base, "size": 2 * MIB, "stream": 0},
    ]);
    let p = settings_snapshot(dir.path(), "unknown.pickle", base, &settings, &entries);
    for cmd in ["validate", "replay"] {
        let (code, _, err) = memsim(&[cmd, &p]);
        assert_eq!(code, 2, "{cmd}: {err}");
        assert!(err.contains("throw_on_cudamalloc_oom"), "{cmd}: {err}");
        let (code, out, err) = memsim(&[cmd, &p, "--alloc-conf", "", "--json"]);
        assert_eq!(code, 0, "{cmd}: {out}{err}");
        let v: Value = serde_json::from_str(&out).unwrap();
        assert!(warned(&v, "recorded settings unreadable") && warned(&v, "replaced by --alloc-conf"), "{cmd}: {v}");
        assert_eq!(v["alloc_conf_source"], "override", "{cmd}: {v}");
    }
}

/// The start-state failure reported the running total at the segment that passed the budget
/// ("the start state alone reserves" a figure that followed the budget), and `oom_need_bytes`
/// was null beside `oom: true`.
#[test]
fn a_start_state_over_the_budget_is_reported_whole() {
    let dir = tempfile::tempdir().unwrap();
    let segs: Vec<Value> = (1..=3).map(|i| segment(i << 30, 20 * MIB, "active_allocated")).collect();
    let snap = json!({"segments": segs, "device_traces": [[]]});
    let p = write(dir.path(), "three.pickle", &pickle(&snap));
    for cap in ["30MiB", "50MiB"] {
        let (code, out, err) = memsim(&["replay", &p, "--capacity", cap, "--json"]);
        assert_eq!(code, 1, "{out}{err}");
        let v: Value = serde_json::from_str(&out).unwrap();
        let whole = 60 * MIB;
        assert!(v["oom_detail"].as_str().unwrap().contains(&format!("reserves {whole} B")), "{cap}: {v}");
        assert_eq!((v["oom"].as_bool(), v["oom_need_bytes"].as_u64()), (Some(true), Some(whole)), "{cap}: {v}");
    }
    // Exactly at the budget: it fits.
    let (code, out, err) = memsim(&["replay", &p, "--capacity", "60MiB", "--json"]);
    assert_eq!(code, 0, "{out}{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!((v["oom"].as_bool(), v["verdict"]["fits"].as_bool()), (Some(false), Some(true)), "{v}");
}

/// A plain allocator-level trace exported as a snapshot carried no memtrace_header, so validating
/// it (the model against itself) was EXACT with no word; a PyTorch snapshot converted to a trace
/// and back keeps PyTorch's records and is not warned about.
#[test]
fn every_exported_snapshot_is_marked_and_only_foreign_records_are_circular() {
    let dir = tempfile::tempdir().unwrap();
    let t = trace(dir.path(), "plain.jsonl", "", &[alloc(1 << 30, 3 * MIB), free(1 << 30)]);
    let p = dir.path().join("plain.pickle");
    assert_eq!(memsim(&["convert", &t, p.to_str().unwrap()]).0, 0);
    let v = json(&["validate", p.to_str().unwrap(), "--json"]);
    assert!(warned(&v, "circular") && warned(&v, "\"probe\""), "{v}");
    let real = real_snapshot("JasperSolt--EoR_NN--snapshot.pickle");
    let v = json(&["validate", &real, "--json"]);
    assert!(!warned(&v, "circular"), "{v}");
    let (mid, back) = (dir.path().join("real.jsonl"), dir.path().join("real.pickle"));
    assert_eq!(memsim(&["convert", &real, mid.to_str().unwrap()]).0, 0);
    assert_eq!(memsim(&["convert", mid.to_str().unwrap(), back.to_str().unwrap()]).0, 0);
    let v = json(&["validate", back.to_str().unwrap(), "--json"]);
    assert!(!warned(&v, "circular") && v["verdict"] == "exact", "{v}");
}

/// A file of ../shared/data/snapshots, when that checkout is there.
/// A shared real snapshot; a missing one fails the test with its path (never a silent skip).
fn real_snapshot(name: &str) -> String {
    crate::snapshot_support::shared_path(name).to_str().unwrap().to_string()
}

/// Replay warned that the start state "could not be fully recovered" for snapshots that validate
/// exactly, whose only doubts are the sizes of blocks the trace frees.
#[test]
fn replay_warns_only_of_start_states_that_matter() {
    for name in [
        "MAGMA27--assignment2-systems--memory_snapshot.pickle",
        "bcrafton--assignment2-systems--memory_snapshot.pickle",
    ] {
        let p = real_snapshot(name);
        let v = json(&["replay", &p, "--json"]);
        assert!(!warned(&v, "could not be fully recovered"), "{name}: {v}");
    }
    let p = real_snapshot("albi2--thesis-text-to-SQL--dump_snapshot.pickle");
    let v = json(&["replay", &p, "--json"]);
    assert!(warned(&v, "could not be fully recovered (2 items"), "{v}");
}

/// Replay printed no `alloc conf` line without a recorded string, and replayed a snapshot under
/// 2.9's rules where validate guessed another release.
#[test]
fn replay_says_its_config_and_follows_validates_release() {
    let dir = tempfile::tempdir().unwrap();
    let t = trace(dir.path(), "none.jsonl", "", &[alloc(1 << 30, MIB)]);
    let out = memsim(&["replay", &t]).1;
    assert!(out.contains("  alloc conf          (none recorded: PyTorch's defaults)"), "{out}");
    let snap = json!({"segments": [segment(1 << 30, 20 * MIB, "inactive")], "device_traces": [[]]});
    let p = write(dir.path(), "old.pickle", &pickle(&snap));
    let out = memsim(&["replay", &p]).1;
    assert!(out.contains("(allocator rules 2.4)") && out.contains("alloc conf"), "{out}");
    let v = json(&["replay", &p, "--torch", "2.9", "--json"]);
    assert_eq!(v["torch_allocator_version"], "2.9", "{v}");
}

/// A snapshot from PyTorch 2.15 with `torch.cuda.memory._annotate_tensor` entries (`annotate`),
/// or from a newer PyTorch with an action this version does not know, was refused whole by every
/// command. They change no memory a replay can model: left out, each said, and every other
/// entry keeps its index (validate's and the start-state walk's messages name them).
#[test]
fn annotations_and_unknown_actions_are_left_out_and_said() {
    let dir = tempfile::tempdir().unwrap();
    let base = 1u64 << 30;
    let entry = |action: &str, size: u64| json!({"action": action, "addr": base, "size": size, "stream": 0});
    let plain = [entry("alloc", 3 * MIB), entry("free_requested", 3 * MIB), entry("free_completed", 3 * MIB)];
    let mut marked = plain.to_vec();
    marked.insert(1, json!({"action": "annotate", "addr": base, "size": 0, "stream": 0, "user_metadata": "packed"}));
    marked.insert(2, json!({"action": "annotate", "addr": base, "size": 0, "stream": 0, "user_metadata": "again"}));
    // Fields of another shape than a known action's: not read.
    marked.insert(3, json!({"action": "prefetch", "addr": "somewhere", "frames": 7}));
    let snap =
        |entries: &[Value]| json!({"segments": [segment(base, 20 * MIB, "inactive")], "device_traces": [entries]});
    let p0 = write(dir.path(), "plain.pickle", &pickle(&snap(&plain)));
    let p1 = write(dir.path(), "marked.pickle", &pickle(&snap(&marked)));
    let (v0, v1) = (json(&["replay", &p0, "--json"]), json(&["replay", &p1, "--json"]));
    for key in ["peak_reserved_bytes", "peak_allocated_bytes", "memory_stats"] {
        assert_eq!(v0[key], v1[key], "{key}: {v1}");
    }
    assert!(
        warned(
            &v1,
            "2 'annotate' trace entries (metadata attached to allocations; the first: device_traces[0][1] of \
             marked.pickle) left out: leaving them out changes no peak"
        ),
        "{v1}"
    );
    assert!(
        warned(
            &v1,
            "1 trace entry of action \"prefetch\", which this version does not know (the first: device_traces[0][3] \
             of marked.pickle), left out: if it changes memory"
        ),
        "{v1}"
    );
    assert!(!warned(&v0, "left out"), "{v0}");
    let (code, out, err) = memsim(&["validate", &p1]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("EXACT") && err.contains("'annotate'") && err.contains("\"prefetch\""), "{out}{err}");
    // --strict refuses actions it does not know (as it does records of unknown kinds), not
    // annotations, converted or not.
    let (code, _, err) = memsim(&["replay", &p1, "--strict"]);
    assert!(code == 2 && err.contains("actions this version does not know (1)"), "{err}");
    assert!(err.contains("action \"prefetch\"") && err.contains("device_traces[0][3] of marked.pickle"), "{err}");
    let t1 = dir.path().join("marked.mtrace");
    assert_eq!(memsim(&["convert", &p1, t1.to_str().unwrap()]).0, 0);
    let (code, _, err) = memsim(&["stats", t1.to_str().unwrap(), "--strict"]);
    assert!(code == 2 && err.contains("(--strict)"), "{err}");
    // Written back as a snapshot, the caveat still names where the entry was: not in this file.
    let again = dir.path().join("again.pickle");
    assert_eq!(memsim(&["convert", t1.to_str().unwrap(), again.to_str().unwrap()]).0, 0);
    let v = json(&["replay", again.to_str().unwrap(), "--json"]);
    assert!(
        warned(&v, "again.pickle: 1 trace entry of action \"prefetch\"") && warned(&v, "[3] of marked.pickle"),
        "{v}"
    );
    // An annotation inside a burst of segment frees does not split it: validate replayed the
    // first half as empty_cache and found the second half's frees unpredicted (MISMATCH).
    let (b1, b2) = (base, base + 64 * MIB);
    let at = |action: &str, addr: u64| json!({"action": action, "addr": addr, "size": 20 * MIB, "stream": 0});
    let mut burst = Vec::new();
    for b in [b1, b2] {
        burst.extend([at("segment_alloc", b), at("alloc", b)]);
    }
    for b in [b1, b2] {
        burst.extend([at("free_requested", b), at("free_completed", b)]);
    }
    burst.extend([at("segment_free", b1), at("annotate", b1), at("segment_free", b2)]);
    let pb = write(dir.path(), "burst.pickle", &pickle(&json!({"segments": [], "device_traces": [burst]})));
    let (code, out, err) = memsim(&["validate", &pb]);
    assert!(code == 0 && out.contains("EXACT"), "{out}{err}");
    let annotated = write(dir.path(), "annotated.pickle", &pickle(&snap(&marked[..3])));
    assert_eq!(memsim(&["replay", &annotated, "--strict"]).0, 0);
    // A snapshot with nothing else recorded holds only its state.
    let p2 = write(dir.path(), "only.pickle", &pickle(&snap(&marked[1..3])));
    assert!(warned(&json(&["replay", &p2, "--json"]), "records no allocator events"));
}

/// PyTorch 2.15 tags the entries of a block placed where its caller chose (`allocateWithAddress`)
/// with `internal_metadata`; memsim replayed them by its own best fit in silence.
#[test]
fn entries_the_allocator_tagged_are_said() {
    let dir = tempfile::tempdir().unwrap();
    let base = 1u64 << 30;
    let tagged = |action: &str, addr: u64, size: u64, tag: &str| json!({"action": action, "addr": addr, "size": size, "stream": 0, "internal_metadata": tag});
    let entries = [
        tagged("alloc", base, 2 * MIB, "mallocWithAddress"),
        json!({"action": "alloc", "addr": base + 2 * MIB, "size": 4 * MIB, "stream": 0}),
        tagged("free_requested", base, 2 * MIB, "mallocWithAddress"),
        tagged("free_completed", base, 2 * MIB, "mallocWithAddress"),
        tagged("alloc", base, MIB, "resized"),
        json!({"action": "alloc", "addr": base + MIB, "size": MIB, "stream": 0, "internal_metadata": ""}),
        json!({"action": "alloc", "addr": base + 8 * MIB, "size": MIB, "stream": 0, "internal_metadata": 5}),
        json!({"action": "alloc", "addr": base + 9 * MIB, "size": MIB, "stream": 0, "internal_metadata": null}),
    ];
    let snap = json!({"segments": [segment(base, 20 * MIB, "inactive")], "device_traces": [entries]});
    let p = write(dir.path(), "placed.pickle", &pickle(&snap));
    let v = json(&["replay", &p, "--json"]);
    let placed = "3 trace entries tagged \"mallocWithAddress\" by the allocator (the first: device_traces[0][0] of \
                  placed.pickle): the prefix block PyTorch allocates and frees to place a block at an address its caller chose";
    assert!(warned(&v, placed), "{v}");
    assert!(warned(&v, "1 trace entry tagged \"resized\" by the allocator's internals, a tag this version"), "{v}");
    assert!(!warned(&v, "tagged \"\""), "an empty tag is no tag: {v}");
    assert!(warned(&v, "1 trace entry tagged \"(int)\" by the allocator's internals"), "said by its type: {v}");
    assert!(warned(&v, "(a snapshot memsim writes lacks the tags)"), "{v}");
    // Validate says it beside what it found (this made-up run's addresses need not match).
    let (code, out, err) = memsim(&["validate", &p]);
    assert!(code != 2 && out.contains("block addresses") && err.contains(placed), "{out}{err}");
    // Carried by the trace a conversion writes.
    let t = dir.path().join("placed.mtrace");
    assert_eq!(memsim(&["convert", &p, t.to_str().unwrap()]).0, 0);
    assert!(warned(&json(&["replay", t.to_str().unwrap(), "--json"]), placed));
    // Untagged, the same entries say nothing of it.
    let plain: Vec<Value> = entries
        .iter()
        .map(|e| {
            let mut e = e.clone();
            e.as_object_mut().unwrap().remove("internal_metadata");
            e
        })
        .collect();
    let p0 = write(
        dir.path(),
        "plain.pickle",
        &pickle(&json!({"segments": [segment(base, 20 * MIB, "inactive")], "device_traces": [plain]})),
    );
    assert!(!warned(&json(&["replay", &p0, "--json"]), "tagged"));
}

/// A key given twice in the allocator configuration ('expandable_segments:True,
/// expandable_segments:False') was followed as the last without a word. PyTorch's parser sets
/// the key again at each (the last is in force, no error), so the replay does too, and says so.
#[test]
fn a_configuration_key_given_twice_is_said() {
    let dir = tempfile::tempdir().unwrap();
    let twice = "expandable_segments:True,max_split_size_mb:300,expandable_segments:False";
    let env = format!(r#","env":{{"PYTORCH_CUDA_ALLOC_CONF":"{twice}"}}"#);
    // 25 MiB: 26 MiB reserved in a segment of its own, 40 MiB with expandable segments.
    let plain = trace(dir.path(), "plain.jsonl", "", &[alloc(1 << 30, 25 * MIB)]);
    let recorded = trace(dir.path(), "recorded.jsonl", &env, &[alloc(1 << 30, 25 * MIB)]);
    let says = "gives expandable_segments more than once: PyTorch follows the last (expandable_segments:False)";
    // (the trace, --alloc-conf, whether it is said)
    for (t, conf, said) in [
        (&plain, Some(twice), true),
        (&recorded, None, true),
        // Replaced by --alloc-conf, the recorded string is not followed: nothing to say of it.
        (&recorded, Some("expandable_segments:False"), false),
        (&plain, Some("max_split_size_mb:300,expandable_segments:False"), false),
    ] {
        let mut args = vec!["replay", t.as_str(), "--json"];
        args.extend(conf.iter().flat_map(|c| ["--alloc-conf", *c]));
        let v = json(&args);
        assert_eq!(warned(&v, says), said, "{t} {conf:?}: {}", v["warnings"]);
        assert_eq!(v["peak_reserved_bytes"], 26 * MIB, "{t} {conf:?}: the last is followed");
    }
}

/// Two divisions lists were said to follow the last, "the earlier ones have no effect", while the
/// parser (as c10's) lets a later list override only the intervals it names: the first list's
/// divisions for 256 MiB and above stayed in force in the replay.
#[test]
fn two_divisions_lists_are_said_to_merge() {
    let dir = tempfile::tempdir().unwrap();
    let t = trace(dir.path(), "plain.jsonl", "", &[alloc(1 << 30, 300 * MIB)]);
    let conf = "roundup_power2_divisions:[256:4,>:8],roundup_power2_divisions:[64:2]";
    let v = json(&["replay", &t, "--json", "--alloc-conf", conf]);
    assert!(!warned(&v, "PyTorch follows the last"), "{}", v["warnings"]);
    assert!(warned(&v, "a later one overrides just those"), "{}", v["warnings"]);
    // Single numbers do replace each other, and are still said to.
    let v = json(&["replay", &t, "--json", "--alloc-conf", "roundup_power2_divisions:4,roundup_power2_divisions:8"]);
    assert!(warned(&v, "PyTorch follows the last (roundup_power2_divisions:8)"), "{}", v["warnings"]);
}
