//! `memsim report` end to end: the page with profiles and --estimate, and bad input refused
//! without writing (the report's contents: simulator's tests).

use std::path::{Path, PathBuf};

use crate::records::{header, records};
use crate::report_estimate::estimate;
use crate::support::{memsim, write_records};

fn write(dir: &Path) -> PathBuf {
    write_records(dir, "t.jsonl", &header(), &records())
}

#[test]
fn memsim_report_writes_the_page_with_verdicts_and_estimators() {
    let dir = tempfile::tempdir().unwrap();
    let t = write(dir.path());
    let est = dir.path().join("est.json");
    let mut v = estimate(1200.0, 1234.5, 150.0, 2000.0);
    v["gpu"] = "NVIDIA A100-SXM4-40GB & more".into();
    std::fs::write(&est, v.to_string()).unwrap();
    let out = dir.path().join("r.html");
    let args = ["report", t.to_str().unwrap(), "--html", out.to_str().unwrap(), "--profile", "a100-40gb"];
    let (code, stdout, err) = memsim(&[&args[..], &["--estimate", est.to_str().unwrap()]].concat());
    assert_eq!(code, 0, "{err}");
    assert!(stdout.contains("peak reserved 150.0 MiB"), "{stdout}");
    let page = std::fs::read_to_string(&out).unwrap();
    // The headline is memest's words (escaped), the verdict word coloured by `fits`.
    assert!(page.contains(
        r#"data-mib="1234.5">needs 1234.5 MiB on NVIDIA A100-SXM4-40GB &amp; more (point 1200.0): <span class="fits">FITS</span>"#
    ), "{page}");
    // Under it, the capacity the estimate was judged at, in memest's words.
    assert!(page.contains(r#"<p class="muted" id="details">capacity 2000.0 MiB (--capacity); margin: m<br>"#));
    assert!(page.contains("The estimators side by side") && page.contains("no model"));
    assert!(page.contains("The verdict per GPU profile") && page.contains(">a100-40gb<"));
}

#[test]
fn memsim_report_refuses_bad_input_without_writing() {
    let dir = tempfile::tempdir().unwrap();
    let t = write(dir.path());
    let out = dir.path().join("r.html");
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, "{\"not\": \"an estimate\"}").unwrap();
    let contradicted = dir.path().join("contradicted.json");
    let mut v = estimate(99999.0, 99999.0, 150.0, 40536.0);
    v["verdict"]["fits"] = true.into();
    std::fs::write(&contradicted, v.to_string()).unwrap();
    for (args, expect) in [
        (
            vec![
                "report",
                t.to_str().unwrap(),
                "--html",
                out.to_str().unwrap(),
                "--estimate",
                contradicted.to_str().unwrap(),
            ],
            "field `verdict.fits` is true but need_mib 99999.0 > capacity_mib 40536.0",
        ),
        (
            vec!["report", t.to_str().unwrap(), "--html", out.to_str().unwrap(), "--estimate", bad.to_str().unwrap()],
            "missing field `schema` (expected `estimate --json` output, schema 3)",
        ),
        (vec!["report", "/nonexistent.jsonl", "--html", out.to_str().unwrap()], "no such file"),
        (vec!["report", t.to_str().unwrap(), "--html", out.to_str().unwrap(), "--profile", "nope"], "nope"),
    ] {
        let (code, _, err) = memsim(&args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains(expect), "{args:?}: {err}");
        assert!(!out.exists(), "{args:?}: no partial page");
    }
}

#[test]
fn memsim_report_says_when_the_estimate_is_of_another_job() {
    let dir = tempfile::tempdir().unwrap();
    let mut h = header();
    h.set_meta(&trace::metadata::MODEL, "torchvision:resnet18");
    h.set_meta(&trace::metadata::BATCH_SIZE, "16");
    h.set_meta(&trace::metadata::INPUT_SHAPE, "3,224,224");
    let path = write_records(dir.path(), "t.jsonl", &h, &records());
    let est = dir.path().join("est.json");
    let out = dir.path().join("r.html");
    let same = r#""inputs": {"input_shape": "3,224,224", "seq_len": null}"#;
    let other = r#""inputs": {"input_shape": [3, 64, 64]}"#;
    for (model, batch, inputs, warned) in [
        ("hf:gpt2", 2, same, true),
        ("torchvision:resnet18", 16, same, false),
        ("torchvision:resnet18", 16, other, true),
    ] {
        let mut body = estimate(1200.0, 1234.5, 150.0, 2000.0);
        let job: serde_json::Value =
            serde_json::from_str(&format!(r#"{{"model": "{model}", "batch_size": {batch}, {inputs}}}"#)).unwrap();
        body.as_object_mut().unwrap().extend(job.as_object().unwrap().clone());
        std::fs::write(&est, body.to_string()).unwrap();
        let args =
            ["report", path.to_str().unwrap(), "--html", out.to_str().unwrap(), "--estimate", est.to_str().unwrap()];
        let (code, _, err) = memsim(&args);
        assert_eq!(code, 0, "{err}");
        let said = "is of another job than";
        assert_eq!(err.contains(said), warned, "{model}: {err}");
        if model == "hf:gpt2" {
            assert!(err.contains("model hf:gpt2 against torchvision:resnet18, batch_size 2 against 16"), "{err}");
        } else if warned {
            // Another input size is another job, as memest estimate says of features.
            assert!(err.contains("(input_shape 3,64,64 against 3,224,224)"), "{err}");
        }
    }
}

/// `--capacity` judges every profile's verdict at that device memory, as `replay --capacity`
/// does (`estimate --report --capacity` passes its own, so the table agrees with the headline).
#[test]
fn memsim_report_judges_the_profiles_at_the_capacity_given() {
    let dir = tempfile::tempdir().unwrap();
    let t = write(dir.path());
    let verdict = |extra: &[&str]| {
        let mut args = vec!["report", t.to_str().unwrap(), "--json", "--profile", "a100-40gb"];
        args.extend_from_slice(extra);
        let (code, out, err) = memsim(&args);
        assert_eq!(code, 0, "{err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        v["verdicts"][0].clone()
    };
    let own = verdict(&[]);
    assert!(own["capacity_mib"].as_f64().unwrap() > 40000.0 && own["fits"] == true, "{own}");
    let small = verdict(&["--capacity", "100MiB"]);
    assert_eq!((small["capacity_mib"].as_f64(), small["fits"].as_bool()), (Some(100.0), Some(false)), "{small}");
}

/// The help said the pictures followed "the first profile's" rules: with no --profile they were
/// the newest (2.9), while `replay --profile` of the trace's own profile used its 2.4.
#[test]
fn memsim_report_pictures_follow_the_profile_the_trace_was_emulated_for() {
    let dir = tempfile::tempdir().unwrap();
    let mut h = header();
    h.metadata.insert("profile".into(), "a100-40gb".into());
    let path = write_records(dir.path(), "t.jsonl", &h, &records());
    let allocator = |extra: &[&str]| {
        let (code, out, err) = memsim(&[&["report", path.to_str().unwrap(), "--json"][..], extra].concat());
        assert_eq!(code, 0, "{err}");
        serde_json::from_str::<serde_json::Value>(&out).unwrap()["allocator"].clone()
    };
    assert_eq!(allocator(&[]), "2.4");
    assert_eq!(allocator(&["--profile", "h200"]), "2.9");
    assert_eq!(allocator(&["--torch", "2.5"]), "2.5");
    // A trace that names no profile: the newest rules.
    assert_eq!(memsim_json(&write(dir.path()))["allocator"], "2.9");
}

fn memsim_json(t: &Path) -> serde_json::Value {
    let (code, out, err) = memsim(&["report", t.to_str().unwrap(), "--json"]);
    assert_eq!(code, 0, "{err}");
    serde_json::from_str(&out).unwrap()
}

#[test]
fn memsim_report_json_says_which_flags_shape_only_the_page() {
    let dir = tempfile::tempdir().unwrap();
    let t = write(dir.path());
    let (code, out, err) = memsim(&["report", t.to_str().unwrap(), "--json", "--title", "x", "--profile", "a100-40gb"]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("--title has no effect without --html"), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["peak_reserved_bytes"], 150 * (1u64 << 20));
    let (code, _, err) = memsim(&["report", t.to_str().unwrap()]);
    assert_eq!(code, 2);
    assert!(err.contains("give --html OUT.html (the page) or --json"), "{err}");
}

/// The estimate's headline and the table's row for its profile must rest on the same things: a
/// capacity, a point or safe number, and this trace's point. Each difference made the page
/// contradict itself with no word.
#[test]
fn memsim_report_says_when_the_headline_and_the_table_differ() {
    let dir = tempfile::tempdir().unwrap();
    let t = write(dir.path());
    let (t, out) = (t.to_str().unwrap(), dir.path().join("r.html"));
    let (_, table, _) = memsim(&["report", t, "--json", "--profile", "a100-40gb"]);
    let row = serde_json::from_str::<serde_json::Value>(&table).unwrap()["verdicts"][0].clone();
    let (point, cap) = (row["point_mib"].as_f64().unwrap(), row["capacity_mib"].as_f64().unwrap());
    let reserved = row["reserved_mib"].as_f64().unwrap();
    let est = dir.path().join("est.json");
    let report = |reserved: f64, cap: f64, extra: &[&str]| {
        // A margin of 10%: the safe number and the point differ; judged on the safe number.
        let mut body = estimate(point, point * 1.1, row["reserved_mib"].as_f64().unwrap(), cap);
        body["estimates"]["symbolic"]["reserved_mib"] = reserved.into();
        std::fs::write(&est, body.to_string()).unwrap();
        let mut args = vec!["report", t, "--html", out.to_str().unwrap(), "--profile", "a100-40gb"];
        args.extend_from_slice(&["--estimate", est.to_str().unwrap()]);
        args.extend_from_slice(extra);
        let (code, _, err) = memsim(&args);
        assert_eq!(code, 0, "{err}");
        err
    };
    let err = report(reserved, cap, &[]);
    assert!(!err.contains("the headline and the table") && !err.contains("another trace"), "judged alike: {err}");
    let err = report(reserved, 2000.0, &[]);
    assert!(err.contains("was judged on a device of 2000.0 MiB and the table's a100-40gb row on one of"), "{err}");
    assert!(!err.contains("another trace"), "at another capacity the peaks differ anyway: {err}");
    let err = report(reserved, cap, &["--point"]);
    assert!(err.contains("judges the safe number and the table the point (--point)"), "{err}");
    // Another reserved peak in the same need (a larger one would be more than the need: refused).
    let err = report(reserved - 100.0, cap, &[]);
    assert!(err.contains("where this replay has") && err.contains("the headline is of another trace"), "{err}");
}

/// A stack id defined twice re-credited the allocations made under its first definition to the
/// second's frames. Each allocation keeps the frames its id named when it was made.
#[test]
fn a_redefined_stack_id_keeps_earlier_allocations_frames() {
    let dir = tempfile::tempdir().unwrap();
    let t = crate::support::redefined_stack_trace(dir.path());
    let v = crate::support::json(&["report", t.to_str().unwrap(), "--json"]);
    let frames: Vec<(u64, String)> =
        v["top"].as_array().unwrap().iter().map(|a| (a["size"].as_u64().unwrap(), a["frames"].to_string())).collect();
    // (size, the frames it was made under)
    for (size, file) in [(1u64 << 20, "first.py"), (2 << 20, "second.py")] {
        let f = &frames.iter().find(|(s, _)| *s == size).unwrap().1;
        assert!(f.contains(file), "{size}: {f}");
    }
}
