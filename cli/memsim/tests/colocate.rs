//! `memsim colocate` on real snapshots: how the recordings are lined up on one time axis.

use crate::support::{alloc, free, json, memsim};

const GIB: u64 = 1 << 30;

fn snap(name: &str) -> String {
    crate::snapshot_support::shared_path(name).to_str().unwrap().to_string()
}

/// Two recordings say nothing of when their jobs start relative to each other. Lined up at their
/// own starts only, the job that peaks later met the other one's low and the pair FIT on 84 GiB,
/// where their peaks together need about 121 GiB. The replay at the start that lines up their
/// peaks decides, and says so.
#[test]
fn the_aligned_replay_lets_the_peaks_coincide() {
    let a = snap("kkaitlyn111--cs336-a2-systems--memory_ctx256_forward.pickle");
    let b = snap("kkaitlyn111--cs336-a2-systems--memory_ctx128_fullstep.pickle");
    let args = ["colocate", &a, &b, "--profile", "a100-40gb", "--capacity", "84GiB"];
    let (code, out, _) = memsim(&[&args[..], &["--json"]].concat());
    assert_eq!(code, 1, "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["mode"], "timestamps");
    assert_eq!(v["start"], "peaks-aligned", "{v}");
    assert_eq!(v["fits"], false);
    let need = v["combined_need_bytes"].as_u64().unwrap();
    let sum: u64 = v["jobs"].as_array().unwrap().iter().map(|j| j["device_peak_bytes"].as_u64().unwrap()).sum();
    assert!(need > 84 * GIB && need <= sum, "need {need}, sum of peaks {sum}");
    assert!(v["smallest_fitting_capacity"].as_u64().unwrap() > 84 * GIB);
    let (_, text, _) = memsim(&args);
    assert!(text.contains("each job's own peak at one instant") && text.contains("DOES NOT FIT"), "{text}");
}

/// Two copies of one job peak at the same instant however they are lined up: the need is the
/// replay with both started together. On 80 GiB it is below the sum of their peaks (each
/// allocator frees its own cache when the device is full), and the text says why.
#[test]
fn a_need_below_the_sum_of_peaks_is_explained() {
    let a = snap("kkaitlyn111--cs336-a2-systems--memory_2.7b_forward.pickle");
    let args = ["colocate", &a, &a, "--profile", "a100-40gb", "--capacity", "80GiB"];
    let v = json(&[&args[..], &["--json"]].concat());
    assert_eq!(v["start"], "together", "{v}");
    assert_eq!(v["fits"], true, "{v}");
    let need = v["combined_need_bytes"].as_u64().unwrap();
    let sum: u64 = v["jobs"].as_array().unwrap().iter().map(|j| j["device_peak_bytes"].as_u64().unwrap()).sum();
    assert!(need <= 80 * GIB && need < sum, "need {need}, sum {sum}");
    let (code, text, _) = memsim(&args);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("below the sum of their peaks") && text.contains("frees its own cached blocks"), "{text}");
}

/// A job whose one request (2^49 B) fails at any capacity, beside a small one: the combined need
/// left the failed request out (2 MiB) and the verdict said "needs 2.00 MiB of 81920.00 MiB: DOES
/// NOT FIT". The need counts it, as `memsim replay` does, with or without a capacity, so the
/// verdict agrees with the number beside it.
#[test]
fn a_failed_request_counts_in_the_combined_need() {
    let dir = tempfile::tempdir().unwrap();
    let header = r#"{"kind":"header","format_version":1,"producer":{"name":"t","version":"1"},"level":"allocator","caching_disabled":false}"#;
    let timed = |ts: u64, rec: String| rec.replacen('{', &format!("{{\"ts_ns\":{ts},"), 1);
    let huge = 1u64 << 49;
    let write = |name: &str, lines: &[String]| {
        let path = dir.path().join(name);
        std::fs::write(&path, format!("{header}\n{}\n", lines.join("\n"))).unwrap();
        path.to_str().unwrap().to_string()
    };
    let big = write("huge.jsonl", &[timed(1, alloc(1 << 20, huge))]);
    let small = write("small.jsonl", &[timed(1, alloc(1 << 40, 1 << 20)), timed(2, free(1 << 40))]);
    for capacity in [Some("80GiB"), None] {
        let mut args = vec!["colocate", &big, &small, "--json"];
        args.extend(capacity.iter().flat_map(|c| ["--capacity", *c]));
        let (code, out, err) = memsim(&args);
        assert_eq!(code, i32::from(capacity.is_some()), "{capacity:?}: {out}{err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        let need = v["combined_need_bytes"].as_u64().unwrap();
        assert!(need >= huge, "{capacity:?}: need {need}");
        assert!(v["smallest_fitting_capacity"].as_u64().unwrap() >= need, "{capacity:?}: {v}");
        if capacity.is_some() {
            assert_eq!((v["verdict"]["need_bytes"].as_u64(), &v["verdict"]["fits"]), (Some(need), &false.into()));
        }
    }
}
