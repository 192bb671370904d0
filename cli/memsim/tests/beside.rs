//! What is printed beside a verdict says what the verdict rests on: a failed request's floor,
//! the configuration replayed, the report page's notes, colocate's sum at a capacity, and the
//! counts of what was replayed.

use std::path::Path;

use serde_json::{json, Value};

use crate::support::{alloc, free, json, memsim};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

const HEADER: &str = r#"{"kind":"header","format_version":1,"producer":{"name":"probe","version":"1"},"level":"allocator","caching_disabled":false}"#;

/// A JSON Lines trace of `lines` under a real run's header (no margin applies).
fn trace(dir: &Path, name: &str, lines: &[String]) -> String {
    let p = dir.join(name);
    let exit = r#"{"kind":"process_exit","lost_events":0}"#;
    std::fs::write(&p, format!("{HEADER}\n{}\n{exit}\n", lines.join("\n"))).unwrap();
    p.to_str().unwrap().to_string()
}

/// 12 GiB allocated and freed, then 14 GiB: unlimited, the cached 12 GiB segment stays beside the
/// new one (26 GiB reserved); at 20 GiB the allocator frees it and retries (14 GiB).
fn cache(dir: &Path) -> String {
    trace(dir, "cache.jsonl", &[alloc(GIB, 12 * GIB), free(GIB), alloc(64 * GIB, 14 * GIB), free(64 * GIB)])
}

/// A free of an address never allocated, three times: every request is rejected.
fn only_frees(dir: &Path) -> String {
    trace(dir, "onlyfrees.jsonl", &[free(GIB), free(2 * GIB), free(3 * GIB)])
}

/// The floor `max-batch` stops probing at left out a request no device holds: 400 MiB beside a
/// need of 300 TiB, and a number beside a need that overflows.
#[test]
fn the_need_floor_counts_a_failed_request() {
    let dir = tempfile::tempdir().unwrap();
    let huge = trace(dir.path(), "huge.jsonl", &[alloc(GIB, 300 << 40)]);
    let (code, out, _) = memsim(&["replay", &huge, "--profile", "a100-40gb", "--json"]);
    assert_eq!(code, 1, "{out}");
    let v: Value = serde_json::from_str(&out).unwrap();
    let floor = v["need_floor_bytes"].as_u64().unwrap();
    assert!(floor >= 300 << 40, "{v}");
    assert!(floor <= v["verdict"]["need_bytes"].as_u64().unwrap(), "{v}");
    let max = trace(dir.path(), "u64max.jsonl", &[alloc(GIB, u64::MAX)]);
    let (_, out, _) = memsim(&["replay", &max, "--profile", "a100-40gb", "--json"]);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!((&v["need_floor_bytes"], &v["need_unbounded"]), (&Value::Null, &json!("overflow")), "{v}");
}

/// Pickle bytes of a snapshot with no segments, one 3 MiB allocation and these settings.
fn snapshot(dir: &Path, name: &str, settings: &Value) -> String {
    let entries = json!([
        {"action": "alloc", "addr": GIB, "size": 3 * MIB, "stream": 0},
        {"action": "free_requested", "addr": GIB, "size": 3 * MIB, "stream": 0},
        {"action": "free_completed", "addr": GIB, "size": 3 * MIB, "stream": 0},
    ]);
    let snap = json!({"segments": [], "device_traces": [entries], "allocator_settings": settings});
    let p = dir.join(name);
    std::fs::write(&p, serde_pickle::to_vec(&snap, serde_pickle::SerOptions::new()).unwrap()).unwrap();
    p.to_str().unwrap().to_string()
}

/// A snapshot whose fields contradict its string, or set what it does not name, was replayed
/// as the fields say and shown as the string: the configuration printed was not the one replayed.
#[test]
fn the_configuration_shown_is_the_one_replayed() {
    let dir = tempfile::tempdir().unwrap();
    let contra = snapshot(
        dir.path(),
        "contra.pickle",
        &json!({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False", "expandable_segments": true}),
    );
    let v = json(&["replay", &contra, "--json"]);
    assert_eq!(v["alloc_conf"], "expandable_segments:True", "{v}");
    assert!(v["alloc_conf_note"].as_str().unwrap().contains("expandable_segments from the snapshot's"), "{v}");
    let (_, out, _) = memsim(&["replay", &contra]);
    assert!(
        out.contains(
            "  alloc conf          expandable_segments:True (expandable_segments from the snapshot's \
                      allocator_settings fields, not its PYTORCH_CUDA_ALLOC_CONF string \"expandable_segments:False\")"
        ),
        "{out}"
    );
    let added = snapshot(
        dir.path(),
        "added.pickle",
        &json!({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False", "max_split_size": 128 * MIB}),
    );
    let v = json(&["replay", &added, "--json"]);
    assert_eq!(v["alloc_conf"], "expandable_segments:False,max_split_size_mb:128", "{v}");
    assert!(v["alloc_conf_note"].as_str().unwrap().contains("does not name"), "{v}");
    // validate exits 1 on a snapshot whose peak it does not reproduce: its JSON says what it compared.
    let (_, out, _) = memsim(&["validate", &added, "--json"]);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["alloc_conf"], "expandable_segments:False,max_split_size_mb:128", "{v}");
    // Where the fields agree with the string, the string is shown as recorded.
    let same = snapshot(
        dir.path(),
        "same.pickle",
        &json!({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "expandable_segments": true}),
    );
    let v = json(&["replay", &same, "--json"]);
    assert_eq!((&v["alloc_conf"], &v["alloc_conf_note"]), (&json!("expandable_segments:True"), &Value::Null));
}

/// The page headed with the unlimited peak (26 GiB, over the 20 GiB device) beside a verdict of
/// 14 GiB FITS, and with 0 MiB beside DOES NOT FIT for a request no device holds, saying neither
/// why.
#[test]
fn the_report_page_says_why_a_verdict_is_not_its_peak() {
    let dir = tempfile::tempdir().unwrap();
    let t = cache(dir.path());
    let page = dir.path().join("c.html");
    let base = ["report", &t, "--profile", "a100-40gb", "--html", page.to_str().unwrap()];
    let (code, _, err) = memsim(&[&base[..], &["--capacity", "20GiB"]].concat());
    assert_eq!(code, 0, "{err}");
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(html.contains("replayed at this capacity") && html.contains("frees its cached blocks"), "{html}");
    assert!(html.contains("where a verdict below needs another amount"), "{html}");
    let v = json(&["report", &t, "--profile", "a100-40gb", "--capacity", "20GiB", "--json"]);
    assert!(v["verdicts"][0]["note"].as_str().unwrap().contains("14336.00 MiB"), "{v}");
    // At the profile's own 40 GiB the verdict is the peak plus the context: nothing to explain.
    let v = json(&["report", &t, "--profile", "a100-40gb", "--json"]);
    assert_eq!(v["verdicts"][0]["note"], Value::Null, "{v}");
    let max = trace(dir.path(), "u64max.jsonl", &[alloc(GIB, u64::MAX)]);
    let (code, _, err) = memsim(&["report", &max, "--profile", "a100-40gb", "--html", page.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(html.contains("an allocation fails at record 0 whatever the capacity"), "{html}");
}

/// `report --point` on a trace without a margin changed nothing and said nothing, where `replay`
/// and `colocate` warn.
#[test]
fn report_point_without_a_margin_is_warned() {
    let dir = tempfile::tempdir().unwrap();
    let t = cache(dir.path());
    let (code, out, err) = memsim(&["report", &t, "--profile", "a100-40gb", "--point", "--json"]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("--point has no effect: the safe number is the point here"), "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert!(v["warnings"].to_string().contains("--point has no effect"), "{v}");
}

/// Summing peaks, a job's term was its unlimited peak while `fits alone` gave its need at the
/// capacity: DOES NOT FIT at 27444 MiB beside a job that needs 14736 MiB there and another of
/// 420 MiB, and a "smallest capacity" no replay had found.
#[test]
fn colocate_sums_each_jobs_need_at_the_capacity() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (cache(dir.path()), trace(dir.path(), "small.jsonl", &[alloc(GIB, 4 * MIB), free(GIB)]));
    let at = |cap: &str| {
        let (code, out, err) = memsim(&["colocate", &a, &b, "--profile", "a100-40gb", "--capacity", cap, "--json"]);
        let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {err}"));
        assert_eq!(code, if v["fits"] == true { 0 } else { 1 }, "{v}");
        v
    };
    let v = at("20GiB");
    assert_eq!(v["mode"], "sum-of-peaks");
    let alone: u64 = v["jobs"].as_array().unwrap().iter().map(|j| j["need_alone_bytes"].as_u64().unwrap()).sum();
    assert_eq!(v["combined_need_bytes"].as_u64(), Some(alone), "{v}");
    assert_eq!(alone, (14336 + 400 + 420) * MIB, "{v}");
    assert_eq!(v["fits"], true, "{v}");
    // The smallest capacity is one the same rule fits at, and the byte below it does not.
    let least = v["smallest_fitting_capacity"].as_u64().unwrap();
    assert_eq!(at(&format!("{least}B"))["fits"], true);
    let below = at(&format!("{}B", least - 1));
    assert_eq!(below["fits"], false, "{below}");
    assert!(below["combined_need_bytes"].as_u64().unwrap() >= least, "{below}");
    let (_, out, _) = memsim(&["colocate", &a, &b, "--profile", "a100-40gb", "--capacity", "20GiB"]);
    assert!(out.contains("replayed alone at this capacity, summed") && out.contains("FITS"), "{out}");
    // Without a capacity the need is the unlimited peaks' sum; the smallest capacity is below it.
    let v = json(&["colocate", &a, &b, "--profile", "a100-40gb", "--json"]);
    assert_eq!(v["smallest_fitting_capacity"].as_u64(), Some(least), "{v}");
    assert_eq!(v["combined_need_bytes"].as_u64(), Some((26624 + 400 + 420) * MIB), "{v}");
}

/// "replayed 3 requests of 4 records" beside "3 requests rejected ... left out of the replay",
/// and "more than any device holds at least".
#[test]
fn replay_counts_and_words_agree() {
    let dir = tempfile::tempdir().unwrap();
    let t = only_frees(dir.path());
    let (_, out, err) = memsim(&["replay", &t]);
    assert!(out.contains("replayed 0 requests of 4 records (3 more rejected and left out; allocator rules"), "{out}");
    assert!(err.contains("3 requests rejected"), "{err}");
    let v = json(&["replay", &t, "--json"]);
    assert_eq!((v["requests"].as_u64(), v["rejected"].as_u64()), (Some(0), Some(3)), "{v}");
    let max = trace(dir.path(), "u64max.jsonl", &[alloc(GIB, u64::MAX)]);
    let (_, out, _) = memsim(&["replay", &max, "--profile", "a100-40gb"]);
    assert!(out.contains("  peak device         more than any device holds (an allocation failed"), "{out}");
    assert!(!out.contains("holds at least"), "{out}");
}
