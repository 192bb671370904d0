//! What `memest estimate` makes of its inputs: a header that says one library key of two, a
//! batch past 2^64 bytes, a need that is one capacity's, a plain-meta trace as the headline.

use crate::common::jsonl_trace;
use crate::support::memest_code;

const MIB: u64 = 1024 * 1024;

/// A trace with `meta` (and a batch of 8) and a features file with one Linear layer.
fn job(dir: &std::path::Path, name: &str, meta: &[(&str, &str)]) -> (String, String) {
    let mut all = vec![("batch_size", "8"), ("optimizer", "adam"), ("amp", "fp32")];
    all.extend_from_slice(meta);
    let t = dir.join(name);
    std::fs::write(&t, jsonl_trace(&all, &[('a', 1, 3 * MIB), ('a', 2, MIB)])).unwrap();
    let f = dir.join("f.json");
    std::fs::write(&f, r#"{"total_parameters": 100, "total_activations": 10, "sequence": [["Linear", 10, 100]]}"#)
        .unwrap();
    (t.display().to_string(), f.display().to_string())
}

fn estimate_json(args: &[&str]) -> (i32, serde_json::Value, String) {
    let mut all = vec!["estimate", "--json"];
    all.extend_from_slice(args);
    let (code, out, err) = memest_code(&all);
    (code, serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out} {err}")), err)
}

/// Each library key on its own: a header that says `uses_conv` but not `uses_gemm` (absent or
/// unreadable) leaves cuBLAS to the features, with a warning; it used to count cuBLAS as 0 and
/// call that "libraries from trace".
#[test]
fn a_library_key_the_header_lacks_comes_from_the_evidence() {
    let dir = tempfile::tempdir().unwrap();
    let check = |name: &str, meta: &[(&str, &str)], source: &str, warned: bool| {
        let (t, f) = job(dir.path(), name, meta);
        let (code, v, err) = estimate_json(&["--trace", &t, "--features", &f]);
        assert_eq!(code, 0, "{name}: {err}");
        let o = &v["outside_allocator"];
        assert_eq!(o["libraries"]["source"], source, "{name}");
        assert!(o["cublas_mib"].as_f64().unwrap() > 0.0, "{name}: {o}");
        assert_eq!(err.contains("but not `uses_gemm`"), warned, "{name}: {err}");
    };
    check("both.jsonl", &[("uses_gemm", "true"), ("uses_conv", "true")], "trace", false);
    check("nogemm.jsonl", &[("uses_conv", "true")], "trace and features", true);
    check("maybe.jsonl", &[("uses_gemm", "maybe"), ("uses_conv", "true")], "trace and features", true);
    check("none.jsonl", &[], "features", false);
}

/// The analytic baseline saturates: a batch near 2^61 wrapped to less than batch 1 needs; now it
/// is null with the reason, and a bigger batch never gives a smaller number.
#[test]
fn the_analytic_baseline_never_shrinks_with_the_batch() {
    let dir = tempfile::tempdir().unwrap();
    let (t, f) = job(dir.path(), "t.jsonl", &[]);
    let analytic = |batch: &str| {
        let (_, v, err) = estimate_json(&["--trace", &t, "--features", &f, "--batch-size", batch]);
        (v["estimates"]["analytic"]["device_mib"].as_f64(), v["unavailable"]["analytic"].clone(), err)
    };
    let mut last = 0.0;
    for batch in ["1", "1000000000000", "100000000000000"] {
        let (mib, _, err) = analytic(batch);
        let mib = mib.unwrap_or_else(|| panic!("batch {batch}: {err}"));
        assert!(mib >= last, "batch {batch}: {mib} < {last}");
        last = mib;
    }
    for batch in ["2305843009213693952", "18446744073709551615"] {
        let (mib, why, _) = analytic(batch);
        assert_eq!(mib, None, "batch {batch}");
        assert!(why.as_str().unwrap().contains("past 2^64 bytes"), "{why}");
    }
}

/// The need is the replay within this capacity's allocator budget: the text and the JSON say so,
/// and that at another capacity it can differ.
#[test]
fn the_need_is_said_to_be_this_capacitys() {
    let dir = tempfile::tempdir().unwrap();
    let (t, f) = job(dir.path(), "t.jsonl", &[]);
    let (_, v, _) = estimate_json(&["--trace", &t, "--features", &f, "--capacity", "2GiB"]);
    let budget = v["verdict"]["allocator_budget_mib"].as_f64().unwrap();
    let outside = v["outside_allocator"]["total_mib"].as_f64().unwrap();
    assert!((budget - (2048.0 - outside)).abs() < 0.1, "{}", v["verdict"]);
    assert_eq!(v["verdict"]["need_at_capacity"], true);
    let details = v["text"]["details"].to_string();
    assert!(details.contains("the need is the replay at this capacity") && details.contains("another --capacity"));
    let (_, text, _) = memest_code(&["estimate", "--trace", &t, "--features", &f, "--capacity", "2GiB"]);
    assert!(text.contains(&format!("allocator budget of {budget:.1} MiB")), "{text}");
}

/// A plain-meta trace (header `cuda_emulation` false) as the headline is warned of, naming the
/// key and what it changes (it was taken silently).
#[test]
fn a_plain_meta_headline_trace_is_warned_of() {
    let dir = tempfile::tempdir().unwrap();
    let check = |emulation: &str, warned: bool| {
        let (t, f) = job(dir.path(), "t.jsonl", &[("cuda_emulation", emulation)]);
        let (_, v, err) = estimate_json(&["--trace", &t, "--features", &f]);
        let said = err.contains("`cuda_emulation` is \"false\"") && err.contains("below what the job needs");
        assert_eq!(said, warned, "{emulation}: {err}");
        assert_eq!(v["warnings"].to_string().contains("cuda_emulation"), warned);
    };
    check("false", true);
    check("true", false);
}
