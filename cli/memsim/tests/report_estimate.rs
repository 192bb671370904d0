//! `memsim report --estimate` reads the estimate through the one parser `memest render` reads it
//! through: a file render refuses is refused here (exit 2, the field named, no page), and the
//! page's headline is worded from the numbers as render words them, never from the file's `text`.

use std::path::Path;

use estimators::estimate_file;
use estimators::estimate_text::EstimateText;
use serde_json::{json, Value};

use crate::records::{header, records};
use crate::support::{memsim, write_records};

/// A schema-3 estimate as `memest estimate --json` writes it (its baselines trimmed): the symbolic
/// headline's point of `point` MiB, of which `reserved` are reserved and the rest is outside the
/// allocator, its safe number `safe` the need, judged on a device of `capacity` MiB.
pub fn estimate(point: f64, safe: f64, reserved: f64, capacity: f64) -> Value {
    let outside = point - reserved;
    json!({
        "schema": 3,
        "headline": "symbolic",
        "verdict": {"basis": "estimates.symbolic.safe_mib", "point_mib": point, "need_mib": safe,
                    "need_unbounded": null, "capacity_mib": capacity, "capacity_source": "flag",
                    "fits": safe <= capacity},
        "estimates": {
            "symbolic": {"device_mib": point, "reserved_mib": reserved, "allocated_mib": reserved / 2.0,
                         "safe_mib": safe, "level": "device", "role": "headline", "ignores": "x"},
            "analytic": {"device_mib": 900.0, "level": "device", "role": "baseline", "ignores": "y"},
            "ml": null
        },
        "outside_allocator": {"context_mib": outside, "cublas_mib": 0.0, "cudnn_mib": 0.0, "nccl_mib": 0.0,
                              "recorded_mib": 0.0, "total_mib": outside, "libraries": {"source": "trace"}},
        "margin": {"note": "m"},
        "unavailable": {"ml": "no model"},
        "profile": "profiles/a100-40gb.toml",
        "profile_name": "a100-40gb",
        "gpu": "NVIDIA A100-SXM4-40GB",
        "family": "unknown",
        "text": {"headline": "needs 1.0 MiB on NVIDIA A100-SXM4-40GB (point 1.0)", "verdict": "FITS",
                 "details": ["  capacity 1.0 MiB (--capacity); margin: m"], "baselines": []}
    })
}

/// The good estimate of these tests: fits, with a margin.
fn good() -> Value {
    estimate(1200.0, 1234.5, 150.0, 2000.0)
}

/// `memsim report --html OUT --estimate EST` of a small trace: exit status, stderr, the page if written.
fn report(dir: &Path, est: &str) -> (i32, String, Option<String>, String) {
    let t = write_records(dir, "t.jsonl", &header(), &records());
    let (path, out) = (dir.join("est.json"), dir.join("r.html"));
    std::fs::write(&path, est).unwrap();
    let _ = std::fs::remove_file(&out);
    let args = ["report", t.to_str().unwrap(), "--html", out.to_str().unwrap(), "--profile", "a100-40gb"];
    let (code, _, err) = memsim(&[&args[..], &["--estimate", path.to_str().unwrap()]].concat());
    (code, err, std::fs::read_to_string(&out).ok(), path.display().to_string())
}

/// Each file `memest render` refuses (each built from the good one, as the reviewer's were from
/// a real estimate), with the field its message names.
#[test]
fn an_estimate_render_refuses_is_refused_with_the_field_and_no_page() {
    // (what, the good estimate's fields set (`None`: removed), what the message says)
    type Edit = (&'static str, Option<Value>);
    let cases: Vec<(&str, Vec<Edit>, &str)> = vec![
        (
            "a negative need",
            [
                "/verdict/need_mib",
                "/verdict/point_mib",
                "/estimates/symbolic/device_mib",
                "/estimates/symbolic/safe_mib",
            ]
            .map(|p| (p, Some(json!(-5.0))))
            .to_vec(),
            "field `verdict.need_mib` is -5: expected a number of MiB >= 0",
        ),
        ("another schema", vec![("/schema", Some(json!(99)))], "field `schema` is 99: expected 3"),
        ("no capacity", vec![("/verdict/capacity_mib", None)], "field `verdict`: missing field `capacity_mib`"),
        ("a zero capacity", vec![("/verdict/capacity_mib", Some(json!(0.0)))], "field `verdict.capacity_mib` is 0"),
        (
            "a headline the basis is not of",
            vec![("/headline", Some(json!("ml")))],
            r#"field `verdict.basis` is "estimates.symbolic.safe_mib": expected "estimates.ml.safe_mib""#,
        ),
        (
            "a fits the numbers contradict",
            vec![("/verdict/capacity_mib", Some(json!(1000.0)))],
            "field `verdict.fits` is true but need_mib 1234.5 > capacity_mib 1000.0",
        ),
        (
            "a need as a string",
            vec![("/verdict/need_mib", Some(json!("1234.5")))],
            "field `verdict.need_mib`: invalid type: string",
        ),
        (
            "a reserved peak beyond the need",
            vec![("/estimates/symbolic/reserved_mib", Some(json!(99999.0)))],
            "fields `estimates.symbolic.reserved_mib` (99999.0) and `outside_allocator.total_mib`",
        ),
        (
            "a safe number not the need",
            vec![("/estimates/symbolic/safe_mib", Some(json!(1300.0)))],
            "field `verdict.need_mib` is 1234.5 but the basis, `estimates.symbolic.safe_mib`, is 1300.0",
        ),
        ("no estimates", vec![("/estimates", None)], "missing field `estimates`"),
        // Another schema lacks fields this one has: said as its schema, not as the first field
        // it lacks (it was "missing field `headline`").
        ("an older schema", vec![("/schema", Some(json!(2))), ("/headline", None)], "field `schema` is 2: expected 3"),
        (
            "a negative baseline",
            vec![("/estimates/analytic/device_mib", Some(json!(-5.0)))],
            "field `estimates.analytic.device_mib` is -5: expected a number of MiB >= 0",
        ),
        ("warnings not strings", vec![("/warnings", Some(json!([1])))], "field `warnings[0]`: invalid type: integer"),
        (
            "a negative term outside the allocator",
            vec![("/outside_allocator/cudnn_mib", Some(json!(-1.0)))],
            "field `outside_allocator.cudnn_mib` is -1: expected a number of MiB >= 0",
        ),
    ];
    let mut files: Vec<(String, String, &str)> = cases
        .into_iter()
        .map(|(what, edits, said)| {
            let mut v = good();
            for (pointer, value) in edits {
                let (parent, key) = pointer.rsplit_once('/').unwrap();
                let object = v.pointer_mut(parent).and_then(Value::as_object_mut).unwrap();
                match value {
                    Some(x) => object.insert(key.to_string(), x),
                    None => object.remove(key),
                };
            }
            (what.to_string(), v.to_string(), said)
        })
        .collect();
    for (what, text, said) in [
        ("only a schema", r#"{"schema": 2}"#, "field `schema` is 2: expected 3"),
        ("not JSON", r#"{"schema": NaN}"#, "expected value at line 1 column 12"),
        ("not an object", "[1]", "not a JSON object"),
        ("not an estimate", r#"{"not": "an estimate"}"#, "missing field `schema`"),
    ] {
        files.push((what.into(), text.into(), said));
    }
    let dir = tempfile::tempdir().unwrap();
    for (what, text, said) in files {
        let (code, err, page, path) = report(dir.path(), &text);
        assert_eq!(code, 2, "{what}: {err}");
        assert!(page.is_none(), "{what}: no page, not even a partial one");
        assert!(err.contains(&format!("--estimate {path}: ")) && err.contains(said), "{what}: {err}");
        // Render's own words: the one parser refused it.
        let render = estimate_file::parse(&text).expect_err(&what).to_string();
        assert!(err.contains(&format!("--estimate {path}: {render}")), "{what}: {err} against {render}");
    }
    // Without --html the estimate is said to have no effect, and not read: a bad one is no error.
    let t = write_records(dir.path(), "t.jsonl", &header(), &records());
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, "[1]").unwrap();
    let (code, _, err) = memsim(&["report", t.to_str().unwrap(), "--json", "--estimate", bad.to_str().unwrap()]);
    assert!(code == 0 && err.contains("--estimate has no effect without --html"), "{code} {err}");
    assert!(!err.contains("not a JSON object"), "{err}");
}

/// The page's headline is render's words for the same file: with the file's `text` as written,
/// without one, and with one copied from another estimate (which said the opposite).
#[test]
fn the_headline_is_worded_from_the_numbers_as_render_words_them() {
    let dir = tempfile::tempdir().unwrap();
    let fits = good();
    let mut lies = estimate(1451.0, 1453.4, 22.0, 300.0);
    lies["text"] = json!({"headline": "needs 422.0 MiB on NVIDIA A100-SXM4-40GB (point 422.0)", "verdict": "FITS",
        "details": ["  capacity 40536.2 MiB (the profile's total memory); margin: copied"], "baselines": []});
    let mut untold = good();
    untold.as_object_mut().unwrap().remove("text");
    let cases = [
        ("as written", fits, "needs 1234.5 MiB on NVIDIA A100-SXM4-40GB (point 1200.0)", "fits", "FITS"),
        ("no text", untold, "needs 1234.5 MiB on NVIDIA A100-SXM4-40GB (point 1200.0)", "fits", "FITS"),
        ("copied text", lies, "needs 1453.4 MiB on NVIDIA A100-SXM4-40GB (point 1451.0)", "nofit", "DOES NOT FIT"),
    ];
    for (what, v, headline, class, word) in cases {
        let (code, err, page, _) = report(dir.path(), &v.to_string());
        assert_eq!(code, 0, "{what}: {err}");
        assert!(!err.contains("text.headline"), "{what}: the file's words are not needed: {err}");
        let page = page.unwrap();
        // Render's words, by the function render words them with.
        let words = EstimateText::of(&estimate_file::parse(&v.to_string()).unwrap().view);
        assert_eq!((words.headline.as_str(), words.verdict.as_str()), (headline, word), "{what}");
        let need = v["verdict"]["need_mib"].as_f64().unwrap();
        assert!(
            page.contains(&format!(
                r#"<p id="headline" data-mib="{need:.1}">{headline}: <span class="{class}">{word}</span></p>"#
            )),
            "{what}: {page}"
        );
        let details: Vec<&str> = words.details.iter().map(|l| l.trim()).collect();
        assert!(page.contains(&format!(r#"<p class="muted" id="details">{}</p>"#, details.join("<br>"))), "{what}");
        assert!(!page.contains("422.0") && !page.contains("margin: copied"), "{what}: the file's text is not shown");
        // The estimators beside it, the headline's marked, the unavailable with why.
        assert!(page.contains("symbolic (memtrace)") && page.contains("no model"), "{what}");
    }
}

/// The page made from an estimate showed only memsim's own warnings, not the estimate's (what
/// `estimate` had said on the terminal): they come first, each once, then memsim's it did not say.
#[test]
fn the_page_carries_the_estimates_warnings() {
    let dir = tempfile::tempdir().unwrap();
    let mut v = good();
    v["warnings"] = json!(["estimate said <one>", "estimate said two", "estimate said <one>"]);
    let (code, err, page, _) = report(dir.path(), &v.to_string());
    assert_eq!(code, 0, "{err}");
    let page = page.unwrap();
    let list = &page[page.find(r#"<h2 id="warnings">"#).expect("a warnings list")..];
    let at = |w: &str| list.find(w).unwrap_or_else(|| panic!("{w} not in {list}"));
    assert_eq!(list.matches("estimate said &lt;one&gt;").count(), 1, "{list}");
    assert!(at("estimate said &lt;one&gt;") < at("estimate said two"), "{list}");
    // memsim's own (the trace says nothing of the libraries it loads) after them.
    assert!(at("estimate said two") < at("CUDA libraries"), "{list}");
}

/// The trainer writes memest's warnings of its temporary trace as "the symbolic trace: X", then
/// reports that trace: memsim's own "<path>: X" was kept beside it, one finding listed twice.
#[test]
fn a_trace_warning_the_estimate_said_under_another_name_is_listed_once() {
    let dir = tempfile::tempdir().unwrap();
    let t = write_records(dir.path(), "t.jsonl", &header(), &records());
    let bytes = std::fs::read(&t).unwrap();
    std::fs::write(&t, &bytes[..bytes.len() - 5]).unwrap();
    let (code, out, err) = memsim(&["report", t.to_str().unwrap(), "--json"]);
    assert_eq!(code, 0, "{err}");
    let own = format!("{}: ", t.display());
    let said: Vec<String> = serde_json::from_str::<Value>(&out).unwrap()["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|w| w.as_str().unwrap().strip_prefix(&own).map(str::to_string))
        .collect();
    let what = said.iter().find(|w| w.contains("truncated")).unwrap_or_else(|| panic!("{said:?}"));
    let mut v = good();
    v["warnings"] = json!([format!("the symbolic trace: {what}")]);
    let (est, html) = (dir.path().join("est.json"), dir.path().join("r.html"));
    std::fs::write(&est, v.to_string()).unwrap();
    let args = ["report", t.to_str().unwrap(), "--html", html.to_str().unwrap(), "--estimate", est.to_str().unwrap()];
    let (code, _, err) = memsim(&args);
    assert_eq!(code, 0, "{err}");
    let page = std::fs::read_to_string(&html).unwrap();
    let list = &page[page.find(r#"<h2 id="warnings">"#).expect("a warnings list")..];
    assert!(list.contains("the symbolic trace: "), "{list}");
    assert!(!list.contains(&own), "listed again under the trace's path: {list}");
}
