//! Damaged traces, as a fuzzer made them: sizes and counts near 2^64, impossible device
//! ordinals, integer tags, and refusals that must leave the user's files as they were.

use std::path::{Path, PathBuf};

use crate::support::{alloc, json, memsim};

const HEADER: &str = r#"{"kind":"header","format_version":1,"producer":{"name":"probe","version":"1"},"level":"allocator","caching_disabled":false}"#;

/// A JSON Lines trace of `lines` after the header.
fn trace(dir: &Path, name: &str, lines: &[&str]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, format!("{HEADER}\n{}\n", lines.join("\n"))).unwrap();
    path
}

/// A job whose need saturates at 2^64 - 1 B was summed with wrapping: the set "needed" 1424 MiB
/// and FIT, beside a line saying that job does not fit alone.
#[test]
fn colocate_never_wraps_a_saturated_need_into_a_fit() {
    let dir = tempfile::tempdir().unwrap();
    let small = trace(dir.path(), "small.jsonl", &[&alloc(4096, 1 << 30)]);
    let huge = trace(dir.path(), "huge.jsonl", &[&alloc(4096, u64::MAX)]);
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
    // The peak is at least what was live; freed, the 1 MiB still live is what is left.
    assert_eq!(v["peak_live_device_bytes"].as_u64(), Some(u64::MAX), "{v}");
    assert_eq!(v["live_device_bytes"].as_u64(), Some(1 << 20), "{v}");

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
