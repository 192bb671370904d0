//! Damaged traces, as a fuzzer made them: sizes and counts near 2^64, impossible device
//! ordinals, integer tags, and refusals that must leave the user's files as they were.

use std::path::{Path, PathBuf};

use serde_json::Value;
use simulator::units::UNBOUNDED;

use crate::support::{alloc, free, json, memsim, no_huge_numbers};

const HEADER: &str = r#"{"kind":"header","format_version":1,"producer":{"name":"probe","version":"1"},"level":"allocator","caching_disabled":false}"#;

/// A JSON Lines trace of `lines` after the header.
fn trace(dir: &Path, name: &str, lines: &[&str]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, format!("{HEADER}\n{}\n", lines.join("\n"))).unwrap();
    path
}

/// A job of 1 GiB, and one asking for 2^64 - 1 B at once, whose need saturates.
fn small_and_huge(dir: &Path) -> (PathBuf, PathBuf) {
    (trace(dir, "small.jsonl", &[&alloc(4096, 1 << 30)]), trace(dir, "huge.jsonl", &[&alloc(4096, u64::MAX)]))
}

/// A job whose need saturates at 2^64 - 1 B was summed with wrapping: the set "needed" 1424 MiB
/// and FIT, beside a line saying that job does not fit alone.
#[test]
fn colocate_never_wraps_a_saturated_need_into_a_fit() {
    let dir = tempfile::tempdir().unwrap();
    let (small, huge) = small_and_huge(dir.path());
    let (s, h) = (small.to_str().unwrap(), huge.to_str().unwrap());
    let (code, out, err) = memsim(&["colocate", s, h, "--profile", "a100-40gb"]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.contains("DOES NOT FIT") && !out.contains(": FITS"), "{out}");
    let (code, out, _) = memsim(&["colocate", s, h, "--profile", "a100-40gb", "--json"]);
    assert_eq!(code, 1, "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    // The saturated need is no size: null, with why (as `memest estimate --json` says it).
    assert_eq!((v["fits"].as_bool(), v["combined_need_bytes"].is_null()), (Some(false), true), "{v}");
    assert_eq!(
        (&v["need_unbounded"], &v["verdict"]["need_unbounded"]),
        (&"overflow".into(), &"overflow".into()),
        "{v}"
    );
}

/// `stats` summed live bytes with wrapping: an alloc and free of 2^64 - 1 B left a peak of 1 MiB
/// and no word, and two lost-event counts of 2^63 read as 0 beside a warning of 2^64 - 1.
#[test]
fn stats_totals_stop_at_the_largest_count_instead_of_wrapping() {
    let dir = tempfile::tempdir().unwrap();
    let free = r#"{"kind":"free","device":0,"addr":8192,"size":18446744073709551615,"stream":0,"mem":"device","api":"allocator","result":0,"origin":"request","stage":"immediate"}"#;
    let t = trace(dir.path(), "wrap.jsonl", &[&alloc(4096, 1 << 20), &alloc(8192, u64::MAX), free]);
    let v = json(&["stats", t.to_str().unwrap(), "--json"]);
    // The peak is at least what was live, which no number says: null (not 2^64 - 1, past 2^53,
    // where JSON readers round), and why; freed, the 1 MiB still live is what is left.
    assert_eq!((&v["peak_live_device_bytes"], &v["bytes_unbounded"]), (&Value::Null, &"overflow".into()), "{v}");
    assert_eq!(v["live_device_bytes"].as_u64(), Some(1 << 20), "{v}");
    no_huge_numbers(&v, "stats");
    let out = crate::support::memsim_ok(&["stats", t.to_str().unwrap()]);
    let line = out.lines().find(|l| l.contains("peak live device")).unwrap_or_else(|| panic!("{out}"));
    assert!(line.contains(UNBOUNDED) && !line.contains("18446744073709551615"), "{line}");
    let v = json(&["stats", trace(dir.path(), "fine.jsonl", &[&alloc(4096, 1 << 20)]).to_str().unwrap(), "--json"]);
    assert_eq!((&v["peak_live_device_bytes"], &v["bytes_unbounded"]), (&(1 << 20).into(), &Value::Null), "{v}");

    let lost = r#"{"kind":"process_exit","lost_events":9223372036854775808}"#;
    let t = trace(dir.path(), "lost.jsonl", &[lost, lost]);
    let v = json(&["stats", t.to_str().unwrap(), "--json"]);
    assert_eq!(v["lost_events"].as_u64(), Some(u64::MAX), "{v}");
}

/// A snapshot holds one trace list per device from 0: device 2^32 - 1 made `convert` to a pickle
/// allocate 96 GiB and abort.
#[test]
fn a_snapshot_is_not_written_for_a_device_pytorch_cannot_have() {
    let dir = tempfile::tempdir().unwrap();
    let line = alloc(1, 512).replace(r#""device":0"#, r#""device":4294967295"#);
    let t = trace(dir.path(), "dev.jsonl", &[&line]);
    let out = dir.path().join("out.pickle");
    let (code, _, err) = memsim(&["convert", t.to_str().unwrap(), out.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("device 4294967295") && err.contains("stops at 127"), "{err}");
    assert!(!out.exists());
}

/// `convert --strict` refused a truncated input after its copy had replaced the file at the
/// output path, then removed it: the user's earlier file was gone.
#[test]
fn a_strict_refusal_leaves_an_earlier_output_file_alone() {
    let dir = tempfile::tempdir().unwrap();
    let t = trace(dir.path(), "cut.jsonl", &[&alloc(1, 512)]);
    let text = std::fs::read_to_string(&t).unwrap();
    std::fs::write(&t, &text[..text.len() - 5]).unwrap();
    let out = dir.path().join("o.mtrace");
    std::fs::write(&out, "earlier").unwrap();
    let (code, _, err) = memsim(&["convert", "--strict", t.to_str().unwrap(), out.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "earlier");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2, "a temporary file was left behind");
}

/// A header's allocator configuration that cannot be read was refused by `convert` without the
/// input's name (`replay` named it).
#[test]
fn convert_names_the_input_whose_configuration_it_cannot_read() {
    let dir = tempfile::tempdir().unwrap();
    let header = HEADER.replace(
        r#""caching_disabled":false"#,
        r#""caching_disabled":false,"env":{"PYTORCH_CUDA_ALLOC_CONF":"expandable_segments:maybe"}"#,
    );
    let t = dir.path().join("conf.jsonl");
    std::fs::write(&t, format!("{header}\n{}\n", alloc(4096, 1024))).unwrap();
    for out in ["x.json", "x.pickle"] {
        let out = dir.path().join(out);
        let (code, _, err) = memsim(&["convert", t.to_str().unwrap(), out.to_str().unwrap()]);
        assert_eq!(code, 2, "{err}");
        assert!(err.contains("conf.jsonl: cannot replay") && err.contains("maybe"), "{err}");
    }
}

/// A request of 2^64 - 1 B fails at any capacity: its need saturates. `colocate --json` wrote the
/// job's `peak_reserved_bytes` (that need's floor) as 18446744073709551615 and `replay --json`
/// its `oom_need_bytes`: past 2^53, where JSON readers round, and read as a size.
#[test]
fn a_saturated_reserved_need_is_null_in_every_json_output() {
    let dir = tempfile::tempdir().unwrap();
    let (small, huge) = small_and_huge(dir.path());
    let (s, h) = (small.to_str().unwrap(), huge.to_str().unwrap());
    let (_, out, err) = memsim(&["colocate", s, h, "--profile", "a100-40gb", "--json"]);
    let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}{err}"));
    let job = &v["jobs"][1];
    assert_eq!((&job["peak_reserved_bytes"], &job["need_unbounded"]), (&Value::Null, &"overflow".into()), "{job}");
    assert_eq!(v["jobs"][0]["peak_reserved_bytes"], 1u64 << 30, "{v}");
    no_huge_numbers(&v, "colocate");
    let (_, out, _) = memsim(&["colocate", s, h, "--profile", "a100-40gb"]);
    let line = out.lines().find(|l| l.contains("huge.jsonl")).unwrap_or_else(|| panic!("{out}"));
    assert!(line.contains(&format!("reserved {UNBOUNDED}")), "{line}");

    for flags in [&[][..], &["--profile", "a100-40gb"][..]] {
        let mut args = vec!["replay", h, "--json"];
        args.extend_from_slice(flags);
        let (_, out, err) = memsim(&args);
        let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}{err}"));
        assert_eq!((&v["oom"], &v["oom_need_bytes"]), (&true.into(), &Value::Null), "{flags:?}");
        assert_eq!(v["need_unbounded"], "overflow", "{flags:?}");
        no_huge_numbers(&v, "replay");
    }

    // The page says it as the text does, not as 2^64 B in MiB.
    let page = dir.path().join("huge.html");
    let (code, out, err) = memsim(&["report", h, "--html", page.to_str().unwrap(), "--profile", "a100-40gb", "--json"]);
    assert_eq!(code, 0, "{out}{err}");
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(html.contains(&format!(r#"<td class="n">{UNBOUNDED}</td>"#)) && !html.contains("17592186044416"));
    let v: Value = serde_json::from_str(&out).unwrap();
    let row = &v["verdicts"][0];
    assert_eq!(
        (&row["need_mib"], &row["reserved_mib"], &row["need_unbounded"]),
        (&Value::Null, &Value::Null, &"overflow".into())
    );
}

/// Memory a trace holds outside the allocator (managed memory here) of 2^64 - 1 B, twice: the
/// running total wrapped (a debug build aborted on it), and what was held came out as
/// 18446744073709551615 B, and what it adds to the reserved peak as that less 2 MiB, a size.
#[test]
fn memory_held_outside_the_allocator_saturates_and_is_null() {
    let dir = tempfile::tempdir().unwrap();
    let managed = |addr| alloc(addr, u64::MAX).replace(r#""mem":"device""#, r#""mem":"managed""#);
    let t = trace(dir.path(), "held.jsonl", &[&managed(4096), &managed(8192), &alloc(1 << 40, 1 << 20)]);
    let t = t.to_str().unwrap();
    let (code, out, err) = memsim(&["replay", t, "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}{err}"));
    assert_eq!(
        (&v["recorded_outside_bytes"], &v["outside_beside_peak_bytes"], &v["peak_device_bytes"]),
        (&Value::Null, &Value::Null, &Value::Null),
        "{v}"
    );
    assert_eq!((&v["peak_reserved_bytes"], &v["need_unbounded"]), (&(2u64 << 20).into(), &"overflow".into()));
    no_huge_numbers(&v, "replay");
    let (_, out, err) = memsim(&["colocate", t, "--capacity", "40GiB", "--json"]);
    let c: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}{err}"));
    assert_eq!((&c["jobs"][0]["held_outside_bytes"], &c["fits"]), (&Value::Null, &false.into()), "{c}");
    no_huge_numbers(&c, "colocate");
}

/// A run's recorded out-of-memory error for 2^64 - 1 B: its need (what was allocated plus the
/// request) came out as 18446744073709551615 in `replay --json`'s `recorded_oom`.
#[test]
fn a_recorded_oom_past_any_device_is_null() {
    let dir = tempfile::tempdir().unwrap();
    let oom = r#"{"kind":"oom","device":0,"size":18446744073709551615}"#;
    let t = trace(dir.path(), "oom.jsonl", &[&alloc(4096, 1 << 20), oom]);
    let (_, out, err) = memsim(&["replay", t.to_str().unwrap(), "--json"]);
    let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}{err}"));
    let o = &v["recorded_oom"];
    assert_eq!((&o["need_bytes"], &o["size"], &v["need_unbounded"]), (&Value::Null, &Value::Null, &"overflow".into()));
    no_huge_numbers(&v, "replay");
}

/// An allocation past the largest segment (256 TiB) fails at any capacity, as a traced batch far
/// too large asks; the program's frees of it then have nothing to free. They were counted as
/// requests "rejected ... (a damaged trace ...)"; they are the failure's consequence, counted
/// apart, while a free of an address nothing ever held is still a rejection.
#[test]
fn frees_of_an_allocation_no_capacity_places_are_not_a_damaged_trace() {
    let dir = tempfile::tempdir().unwrap();
    let huge = 1u64 << 50;
    let lines = [alloc(4096, 1 << 20), alloc(8192, huge), free(8192), alloc(8192, 1 << 20), free(8192), free(4096)];
    let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
    let t = trace(dir.path(), "failed.jsonl", &lines);
    let (code, out, err) = memsim(&["replay", t.to_str().unwrap(), "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!((v["failed_frees"].as_u64(), v["rejected"].as_u64()), (Some(1), Some(0)), "{v}");
    assert!(!err.contains("rejected") && !err.contains("damaged"), "{err}");
    // The address is reused by a placed allocation, whose free frees it: nothing is left live.
    assert_eq!(v["memory_stats"]["allocated_bytes.all.current"], 0, "{}", v["memory_stats"]);
    assert!(v["oom_detail"].as_str().unwrap().contains(&format!("request of {huge} B")), "{v}");

    // The text says what was left out.
    let (_, text, _) = memsim(&["replay", t.to_str().unwrap()]);
    assert!(text.contains("left out: 1 frees of allocations the model could not place"), "{text}");
    // A free in two stages (requested, then completed) is one free.
    let staged = |stage: &str| free(8192).replace("immediate", stage);
    let lines = [alloc(8192, huge), staged("requested"), staged("completed")];
    let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
    let t = trace(dir.path(), "staged.jsonl", &lines);
    let v: Value = serde_json::from_str(&memsim(&["replay", t.to_str().unwrap(), "--json"]).1).unwrap();
    assert_eq!((v["failed_frees"].as_u64(), v["rejected"].as_u64()), (Some(1), Some(0)), "{v}");

    // A free of an address no allocation ever named stays a rejection.
    let lines = [alloc(4096, 1 << 20), free(12288), free(4096)];
    let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
    let t = trace(dir.path(), "damaged.jsonl", &lines);
    let (_, out, err) = memsim(&["replay", t.to_str().unwrap(), "--json"]);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!((v["failed_frees"].as_u64(), v["rejected"].as_u64()), (Some(0), Some(1)), "{v}");
    assert!(err.contains("rejected"), "{err}");
}

/// A trace's strings reached the terminal raw: a producer named with escape codes cleared the
/// screen and printed a green "verdict: FITS" of its own. Every text output (the lines, the
/// warnings, the error) shows a control character as its escape.
#[test]
fn a_traces_control_characters_are_escaped_on_the_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let evil = r"\u001b[2J\u001b[32mverdict: FITS\u001b[0m\nforged line";
    let head = |extra: &str| {
        format!(
            r#"{{"kind":"header","format_version":1,"producer":{{"name":"{evil}","version":"1"}},"level":"allocator","caching_disabled":false{extra}}}"#
        )
    };
    let a = alloc(1 << 30, 1 << 20);
    let write = |name: &str, header: String| {
        let path = dir.path().join(name);
        std::fs::write(&path, format!("{header}\n{a}\n")).unwrap();
        path.to_str().unwrap().to_string()
    };
    let named = write("named.jsonl", head(""));
    let conf = write("conf.jsonl", head(&format!(r#","env":{{"PYTORCH_CUDA_ALLOC_CONF":"{evil}:1"}}"#)));
    let meta = write("meta.jsonl", head(&format!(r#","metadata":{{"iterations":"{evil}"}}"#)));
    // (arguments, exit status)
    for (args, code) in [
        (vec!["stats", named.as_str()], 0),
        (vec!["replay", named.as_str()], 0),
        (vec!["replay", conf.as_str()], 2),
        (vec!["replay", meta.as_str()], 0),
        (vec!["stats", meta.as_str()], 0),
    ] {
        let (got, out, err) = memsim(&args);
        assert_eq!(got, code, "{args:?}: {err}");
        let all = format!("{out}{err}");
        assert!(!all.contains('\u{1b}') && !all.contains("\nforged line"), "{args:?}: {all:?}");
    }
    let (_, out, _) = memsim(&["stats", &named]);
    assert!(out.contains(r"trace by \u{1b}[2J\u{1b}[32mverdict: FITS\u{1b}[0m\nforged line 1"), "{out}");
}

/// A `record_stream` at an address no block starts at was warned as a "free of unknown
/// address": said as the operation it was.
#[test]
fn an_unknown_record_stream_is_said_as_one() {
    let dir = tempfile::tempdir().unwrap();
    let a = alloc(1 << 20, 4096);
    let t = trace(dir.path(), "rs.jsonl", &[&a, r#"{"kind":"control","op":"record_stream","addr":99999,"stream":5}"#]);
    let v = json(&["replay", t.to_str().unwrap(), "--json"]);
    let said = v["warnings"].to_string();
    assert!(said.contains("record_stream on unknown address 0x1869f") && !said.contains("free of"), "{said}");
}
