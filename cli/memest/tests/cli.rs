//! The memest binary: the estimate JSON contract, table output, and clear errors (no panics, no
//! partial files).

use crate::common::{jsonl_trace, shared, venv_python};
use crate::support::{memest, memest_code, memest_compare, records};

const MIB: u64 = 1024 * 1024;

pub(crate) fn inputs(dir: &std::path::Path) -> (String, String, String) {
    let meta = [("batch_size", "8"), ("optimizer", "adam"), ("amp", "fp32"), ("cuda_emulation", "true")];
    let t = dir.join("t.jsonl");
    std::fs::write(&t, jsonl_trace(&meta, &[('a', 1, 3 * MIB), ('m', 0, 2), ('a', 2, MIB)])).unwrap();
    let plain_meta = [("batch_size", "8"), ("cuda_emulation", "false")];
    let p = dir.join("p.jsonl");
    std::fs::write(&p, jsonl_trace(&plain_meta, &[('a', 1, 3 * MIB), ('m', 0, 2), ('a', 2, MIB)])).unwrap();
    let f = dir.join("f.json");
    std::fs::write(
        &f,
        r#"{"total_parameters": 100, "total_activations": 10, "layers": {"0": {"type": "Linear", "activations": 10, "parameters": 100}}}"#,
    )
    .unwrap();
    (t.display().to_string(), p.display().to_string(), f.display().to_string())
}

#[test]
fn estimate_json_contract() {
    let dir = tempfile::tempdir().unwrap();
    let (t, p, f) = inputs(dir.path());
    let (ok, out, err) = memest(&["estimate", "--trace", &t, "--features", &f, "--fake-trace", &p, "--json"]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let e = &v["estimates"];
    for k in ["symbolic", "analytic", "horus", "live_peak", "fake_tensor"] {
        assert!(e[k]["device_mib"].as_f64().is_some(), "{k} in {out}");
        assert!(v["seconds"][k].as_f64().is_some(), "seconds.{k}");
    }
    assert!(e["ml"].is_null());
    assert!(v["unavailable"]["ml"].as_str().is_some());
    // Horus at the trace's batch 8: 4·(10·8 + 100 + 8·100) bytes.
    assert_eq!(e["horus"]["device_mib"].as_f64().unwrap(), 4.0 * 980.0 / MIB as f64);
    assert_eq!(e["symbolic"]["reserved_mib"].as_f64().unwrap(), 22.0, "20 MiB large segment + 2 MiB small");
    assert_eq!(e["live_peak"]["device_mib"].as_f64().unwrap(), 4.0);
    assert_eq!(e["fake_tensor"]["device_mib"].as_f64().unwrap(), 3.0);
    assert_eq!(v["family"], "MLP");
    assert!(!err.contains("another job"), "{err}");
    // A plain trace of another job is said to be one.
    let other = dir.path().join("other.jsonl");
    let other_meta = [("batch_size", "64"), ("cuda_emulation", "false"), ("model", "resnet50")];
    std::fs::write(&other, jsonl_trace(&other_meta, &[('a', 1, 3 * MIB)])).unwrap();
    let o = other.to_str().unwrap();
    let (ok, _, err) = memest(&["estimate", "--trace", &t, "--features", &f, "--fake-trace", o, "--json"]);
    assert!(ok, "{err}");
    assert!(
        err.contains("other.jsonl is of another job than the trace") && err.contains("batch_size 64 there, 8 here"),
        "{err}"
    );
    // Without a plain trace fake_tensor is null, with the reason.
    let (ok, out, _) = memest(&["estimate", "--trace", &t, "--features", &f, "--json"]);
    assert!(ok);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(v["estimates"]["fake_tensor"].is_null());
    assert!(v["unavailable"]["fake_tensor"].as_str().unwrap().contains("--fake-trace"));
    // The table form names every estimator.
    let (ok, out, _) = memest(&["estimate", "--trace", &t, "--features", &f]);
    assert!(ok && out.contains("symbolic") && out.contains("horus"), "{out}");
}

#[test]
fn estimate_schema_3_verdict_and_exit_codes() {
    let dir = tempfile::tempdir().unwrap();
    let (t, _, f) = inputs(dir.path());
    let (code, out, err) = memest_code(&["estimate", "--trace", &t, "--features", &f, "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["schema"], 3);
    assert_eq!(v["headline"], "symbolic");
    assert_eq!(v["estimates"]["symbolic"]["role"], "headline");
    assert_eq!(v["estimates"]["analytic"]["role"], "baseline");
    assert!(v["estimates"]["analytic"]["ignores"].as_str().unwrap().contains("frozen weights"));
    assert!(v["estimates"]["symbolic"]["allocated_mib"].as_f64().is_some());
    let need = v["verdict"]["need_mib"].as_f64().unwrap();
    assert_eq!(need, v["estimates"]["symbolic"]["device_mib"].as_f64().unwrap());
    assert_eq!(v["verdict"]["capacity_source"], "profile");
    assert_eq!(v["verdict"]["fits"], true);
    // The trace has no uses_gemm/uses_conv: the features (one Linear layer) decide, and say so.
    assert_eq!(v["outside_allocator"]["libraries"]["source"], "features");
    assert_eq!(v["outside_allocator"]["libraries"]["gemm"], true);
    let outside = v["outside_allocator"]["total_mib"].as_f64().unwrap();
    assert_eq!(need, 22.0 + outside);
    // A capacity below the need: DOES NOT FIT, exit 1, and the verdict agrees with its numbers.
    let small = format!("{}MiB", need as u64 - 1);
    let (code, out, _) = memest_code(&["estimate", "--trace", &t, "--features", &f, "--capacity", &small, "--json"]);
    assert_eq!(code, 1, "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["verdict"]["fits"], false);
    assert_eq!(v["verdict"]["capacity_source"], "flag");
    assert!(v["verdict"]["need_mib"].as_f64().unwrap() > v["verdict"]["capacity_mib"].as_f64().unwrap());
    // The text leads with the verdict on the headline number, then the labelled baselines.
    let (code, out, _) = memest_code(&["estimate", "--trace", &t, "--features", &f, "--capacity", "40GiB"]);
    assert_eq!(code, 0);
    let first = out.lines().next().unwrap();
    assert!(first.starts_with(&format!("needs {need:.1} MiB on ")) && first.ends_with("FITS"), "{out}");
    assert!(out.contains("baselines (for comparison, not for decisions):") && out.contains("ignores"), "{out}");
    // Bad input exits 2.
    let (code, _, err) = memest_code(&["estimate", "--trace", &t, "--features", &f, "--capacity", "lots"]);
    assert_eq!(code, 2, "{err}");
}

/// One wording: `memest estimate` prints its JSON's `text`, and `memest render` words the same
/// JSON (or the trainer's, which adds baselines) identically; a file without the fields the words
/// need is exit 2, naming the file and the field.
#[test]
fn render_words_an_estimate_as_estimate_prints_it() {
    let dir = tempfile::tempdir().unwrap();
    let (t, _, f) = inputs(dir.path());
    let (_, json, _) = memest_code(&["estimate", "--trace", &t, "--features", &f, "--json"]);
    let (_, text, _) = memest_code(&["estimate", "--trace", &t, "--features", &f]);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let words = &v["text"];
    let first = format!("{}: {}", words["headline"].as_str().unwrap(), words["verdict"].as_str().unwrap());
    assert_eq!(text.lines().next(), Some(first.as_str()), "{text}");
    let est = dir.path().join("est.json");
    std::fs::write(&est, &json).unwrap();
    let (code, rendered, err) = memest_code(&["render", est.to_str().unwrap()]);
    assert_eq!((code, rendered.as_str()), (0, text.as_str()), "{err}");
    let (code, parts, _) = memest_code(&["render", est.to_str().unwrap(), "--json"]);
    assert_eq!(code, 0);
    assert_eq!(&serde_json::from_str::<serde_json::Value>(&parts).unwrap(), words);
    // The memory outside the allocator is split by library in the words every view shows.
    assert!(
        text.contains("(context ") && text.contains("cuBLAS") && text.contains("libraries from features"),
        "{text}"
    );
    // The trainer's JSON names the profile as given and moves the path to `profile_path`: the
    // same words.
    let mut trainer = v.clone();
    trainer["profile_path"] = v["profile"].clone();
    trainer["profile"] = serde_json::json!("a100-40gb");
    std::fs::write(&est, trainer.to_string()).unwrap();
    let (_, rendered, _) = memest_code(&["render", est.to_str().unwrap()]);
    assert_eq!(rendered, text);
    // A baseline added after memest (the trainer's MemTracker) is worded like memest's own.
    let mut with_tracker = v.clone();
    with_tracker["estimates"]["memtracker"] =
        serde_json::json!({"device_mib": 12.5, "level": "live", "ignores": "the allocator", "role": "baseline"});
    std::fs::write(&est, with_tracker.to_string()).unwrap();
    let (_, rendered, _) = memest_code(&["render", est.to_str().unwrap()]);
    assert!(
        rendered
            .lines()
            .any(|l| l.starts_with("  memtracker") && l.contains("12.5 MiB  live    ignores the allocator")),
        "{rendered}"
    );
    // Bad input: the file and the field.
    let mut bad = v.clone();
    bad["verdict"]["need_mib"] = serde_json::json!("lots");
    std::fs::write(&est, bad.to_string()).unwrap();
    let (code, _, err) = memest_code(&["render", est.to_str().unwrap()]);
    assert!(code == 2 && err.contains("est.json: field `verdict.need_mib`"), "{code} {err}");
    std::fs::write(&est, "{}").unwrap();
    let (code, _, err) = memest_code(&["render", est.to_str().unwrap()]);
    assert!(code == 2 && err.contains("missing field"), "{code} {err}");
    std::fs::write(&est, "[1]").unwrap();
    let (code, _, err) = memest_code(&["render", est.to_str().unwrap()]);
    assert!(code == 2 && err.contains("est.json: not a JSON object"), "{code} {err}");
    // A verdict its own numbers contradict is refused, not worded.
    let mut lying = v.clone();
    lying["verdict"]["fits"] = serde_json::json!(!v["verdict"]["fits"].as_bool().unwrap());
    std::fs::write(&est, lying.to_string()).unwrap();
    let (code, _, err) = memest_code(&["render", est.to_str().unwrap()]);
    assert!(code == 2 && err.contains("field `verdict.fits` is"), "{code} {err}");
    // A need below zero was worded ("needs -5.0 MiB ... FITS").
    let mut negative = v.clone();
    negative["verdict"]["need_mib"] = serde_json::json!(-5.0);
    negative["verdict"]["fits"] = serde_json::json!(true);
    std::fs::write(&est, negative.to_string()).unwrap();
    let (code, _, err) = memest_code(&["render", est.to_str().unwrap()]);
    assert!(code == 2 && err.contains("field `verdict.need_mib` is -5: expected a number of MiB >= 0"), "{code} {err}");
    // Numbers that disagree with each other or with the estimate the headline names are refused.
    let point = v["verdict"]["point_mib"].as_f64().unwrap();
    let need = v["verdict"]["need_mib"].as_f64().unwrap();
    for (field, value, says) in [
        (
            "basis",
            serde_json::json!("estimates.horus.safe_mib"),
            "field `verdict.basis` is \"estimates.horus.safe_mib\"",
        ),
        ("point_mib", serde_json::json!(point + 100.0), "but `estimates.symbolic.device_mib` is"),
        ("need_mib", serde_json::json!(point + 50.0), "but the basis is the point"),
    ] {
        let mut spliced = v.clone();
        if field == "need_mib" {
            spliced["verdict"]["basis"] = serde_json::json!("estimates.symbolic.device_mib");
        }
        spliced["verdict"][field] = value;
        std::fs::write(&est, spliced.to_string()).unwrap();
        let (code, _, err) = memest_code(&["render", est.to_str().unwrap()]);
        assert!(code == 2 && err.contains(says), "{field}: {code} {err}");
    }
    let mut below = v.clone();
    below["estimates"]["symbolic"]["device_mib"] = serde_json::json!(need + 10.0);
    below["verdict"]["point_mib"] = serde_json::json!(need + 10.0);
    std::fs::write(&est, below.to_string()).unwrap();
    let (code, _, err) = memest_code(&["render", est.to_str().unwrap()]);
    assert!(code == 2 && err.contains("a safe number is never below the point"), "{code} {err}");
    // A detail line of parts above the whole ("peak reserved 99999.0 MiB + outside ..." under a
    // need of 2485) was worded.
    let mut parts = v.clone();
    parts["estimates"]["symbolic"]["reserved_mib"] = serde_json::json!(99999.0);
    std::fs::write(&est, parts.to_string()).unwrap();
    let (code, _, err) = memest_code(&["render", est.to_str().unwrap()]);
    assert!(code == 2 && err.contains("(99999.0) and `outside_allocator.total_mib`"), "{code} {err}");
    // A number no device holds is said as one, not in 309 digits.
    let mut huge = v.clone();
    huge["verdict"]["point_mib"] = serde_json::json!(1e308);
    std::fs::write(&est, huge.to_string()).unwrap();
    let (code, _, err) = memest_code(&["render", est.to_str().unwrap()]);
    assert!(code == 2 && err.contains("is 1e308 but") && err.len() < 400, "{code} {err}");
    // The words are of schema 3 alone: another version, or none, is refused.
    let mut later = v.clone();
    later["schema"] = serde_json::json!(4);
    std::fs::write(&est, later.to_string()).unwrap();
    let (code, _, err) = memest_code(&["render", est.to_str().unwrap()]);
    assert!(code == 2 && err.contains("field `schema` is 4: expected 3"), "{code} {err}");
    later.as_object_mut().unwrap().remove("schema");
    std::fs::write(&est, later.to_string()).unwrap();
    let (code, _, err) = memest_code(&["render", est.to_str().unwrap()]);
    assert!(code == 2 && err.contains("missing field `schema`"), "{code} {err}");
}

#[test]
fn estimate_warns_on_a_truncated_trace() {
    let dir = tempfile::tempdir().unwrap();
    let (t, _, f) = inputs(dir.path());
    let text = std::fs::read_to_string(&t).unwrap();
    let cut = dir.path().join("cut.jsonl");
    std::fs::write(&cut, &text[..text.len() - 10]).unwrap();
    let cut = cut.display().to_string();
    let (code, out, err) = memest_code(&["estimate", "--trace", &cut, "--features", &f, "--json"]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("cut.jsonl: truncated") && err.contains("after byte"), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(v["warnings"][0].as_str().unwrap().contains("truncated"));
    let (code, _, err) = memest_code(&["estimate", "--trace", &cut, "--features", &f, "--strict"]);
    assert_eq!(code, 2, "{err}");
}

#[test]
fn errors_are_clear_and_exit_nonzero() {
    let dir = tempfile::tempdir().unwrap();
    let (t, _, f) = inputs(dir.path());
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, r#"{"total_parameters": "many"}"#).unwrap();
    let check = |args: &[&str], needles: &[&str]| {
        let (ok, _, err) = memest(args);
        assert!(!ok, "{args:?} should fail");
        assert!(err.starts_with("memest: error: ") && !err.contains("panicked"), "{err}");
        for n in needles {
            assert!(err.contains(n), "{err:?} lacks {n:?}");
        }
    };
    check(&["estimate", "--trace", &t, "--features", bad.to_str().unwrap()], &["bad.json", "total_parameters"]);
    check(&["estimate", "--trace", "/nonexistent.jsonl", "--features", &f], &["/nonexistent.jsonl"]);
    check(&["estimate", "--trace", &t, "--features", &f, "--profile", "no-such-gpu"], &["no-such-gpu"]);
    check(&["estimate", "--trace", &f, "--features", &f], &["f.json"]);
    let runs = dir.path().join("runs.jsonl");
    std::fs::write(&runs, "{\"id\": 1}\n").unwrap();
    let out = dir.path().join("p.toml");
    check(&["calibrate", runs.to_str().unwrap(), "--write", out.to_str().unwrap()], &["runs.jsonl:1"]);
    assert!(!out.exists(), "no partial profile written");
}

/// A `memest compare` run through the trainer (needs the venv): a temporary directory, the
/// output directory in it, and the shared dataset `csv`.
fn compare_setup(csv: &str) -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf) {
    venv_python();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("cmp");
    (dir, out, shared(csv))
}

#[test]
fn compare_rebuilds_real_rows_through_the_trainer() {
    // Two real GPUMemNet MLP rows, traced by the trainer (needs the venv), every estimator run.
    let (dir, out, data) = compare_setup("gpumemnet/mlp_data_step2.csv");
    let (ok, stdout, err) = memest_compare(&data, &out, &["--limit", "2", "--seed", "5"]);
    assert!(ok, "{err}");
    assert!(stdout.contains("symbolic"), "{stdout}");
    let recs = records(&out);
    assert_eq!(recs.len(), 2);
    for r in &recs {
        for k in ["horus", "analytic", "fake_tensor", "live_peak", "symbolic"] {
            let o = &r["estimates"][k];
            assert!(o["device_bytes"].as_u64().is_some_and(|b| b > 0), "{k}: {o}");
        }
        // The allocator can only add to what the program asked for.
        let sym = r["estimates"]["symbolic"]["reserved_bytes"].as_u64().unwrap();
        assert!(sym >= r["estimates"]["live_peak"]["device_bytes"].as_u64().unwrap());
    }
    for f in [
        "report.md",
        "metrics.json",
        "runs.csv",
        "estimate_vs_actual.svg",
        "estimate_vs_actual.png",
        "per_run_bars.svg",
        "error_distribution.png",
    ] {
        assert!(out.join(f).is_file(), "{f} written");
    }
    // Plots are drawn under a temporary name and renamed: none is left behind.
    let left: Vec<_> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".tmp."))
        .collect();
    assert!(left.is_empty(), "temporary plot files left: {left:?}");
    // Seed 5 picks none of the A100 profile's calibration rows: the report says all are held out.
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(report.contains("every row here is held out"), "{report}");
    // A profile calibrated on the first of the two rows: marked, counted, warned, or left out.
    let first = recs[0]["id"].as_str().unwrap();
    let (stem, n) = first.rsplit_once('-').unwrap();
    let profile = crate::compare_trainer::calibrated_on(dir.path(), stem, &[n.parse().unwrap()]);
    let base = ["--limit", "2", "--seed", "5", "--no-fake-tensor", "--profile", profile.to_str().unwrap()];
    let args = |out: &std::path::Path, extra: &[&str]| memest_compare(&data, out, &[&base[..], extra].concat());
    let out2 = dir.path().join("cmp2");
    let (ok, _, err) = args(&out2, &[]);
    assert!(ok, "{err}");
    assert!(err.contains("1 of 2 rows were calibrated on"), "{err}");
    let csv = std::fs::read_to_string(out2.join("runs.csv")).unwrap();
    assert!(csv.lines().any(|l| l.starts_with(&format!("{first},")) && l.contains(",true,")), "{csv}");
    assert!(std::fs::read_to_string(out2.join("report.md")).unwrap().contains("1 of the 2 rows scored here"));
    let out3 = dir.path().join("cmp3");
    let (ok, _, err) = args(&out3, &["--exclude-calibrated"]);
    assert!(ok, "{err}");
    let runs = std::fs::read_to_string(out3.join("runs.jsonl")).unwrap();
    assert!(runs.lines().all(|l| !l.contains(first)), "the calibrated row is left out");
}

#[test]
fn calibration_rows_are_recognised_in_a_renamed_or_reordered_copy() {
    // `--exclude-calibrated` matched rows by file stem and row number: the shipped profile's own
    // calibration rows, copied into a file of another name or order, were scored as held out.
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(shared("gpumemnet/mlp_data_step2.csv")).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    // Data rows 16 and 3 (both calibration rows of the A100 profile), in reverse order; the
    // second file has the calibration file's own stem.
    for name in ["heldout_mlp.csv", "mlp_data_step2.csv"] {
        let sub = dir.path().join(name);
        std::fs::write(&sub, format!("{}\n{}\n{}\n", lines[0], lines[16], lines[3])).unwrap();
        let out = dir.path().join("cmp");
        let (ok, _, err) = memest_compare(&sub, &out, &["--exclude-calibrated", "--no-fake-tensor"]);
        assert!(!ok && err.contains("all of them were left out (2 by --exclude-calibrated)"), "{name}: {err}");
        assert!(!out.exists(), "nothing written");
    }
}

#[test]
fn compare_traces_with_several_trainer_processes() {
    let (dir, out, data) = compare_setup("gpumemnet/mlp_data_step1.csv");
    let run = |extra: &[&str]| {
        memest_compare(&data, &out, &[&["--limit", "4", "--seed", "9", "--no-fake-tensor"][..], extra].concat())
    };
    let (ok, _, err) = run(&["--jobs", "2"]);
    assert!(ok, "{err}");
    let runs = std::fs::read_to_string(out.join("runs.jsonl")).unwrap();
    let recs: Vec<serde_json::Value> = runs.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(recs.len(), 4);
    assert!(recs.iter().all(|r| r["estimates"]["symbolic"]["device_bytes"].as_u64().is_some()), "{runs}");
    // Each worker wrote its own config file; a rerun with --reuse-traces resumes from the traces.
    assert!(out.join("traces/configs.jsonl").is_file() && out.join("traces/configs-1.jsonl").is_file());
    let symbolic = |text: &str| -> Vec<(String, u64)> {
        text.lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .map(|r| {
                (r["id"].as_str().unwrap().to_string(), r["estimates"]["symbolic"]["device_bytes"].as_u64().unwrap())
            })
            .collect()
    };
    let (ok, _, err) = run(&["--jobs", "2", "--reuse-traces"]);
    assert!(ok, "{err}");
    let again = std::fs::read_to_string(out.join("runs.jsonl")).unwrap();
    assert_eq!(symbolic(&again), symbolic(&runs), "same answers from reused traces");
    assert!(!err.contains("traced again"), "{err}");
    // Another --optimizer: the traces were made with adam, so they are not reused for sgd.
    let (ok, _, err) = run(&["--jobs", "2", "--reuse-traces", "--optimizer", "sgd"]);
    assert!(ok, "{err}");
    assert!(err.contains("4 traces were made with other settings") && err.contains("optimizer adam, not sgd"), "{err}");
    let sgd = std::fs::read_to_string(out.join("runs.jsonl")).unwrap();
    assert!(symbolic(&sgd).iter().zip(symbolic(&runs)).all(|(s, a)| s.1 <= a.1), "sgd keeps no more than adam");
    assert!(symbolic(&sgd).iter().zip(symbolic(&runs)).any(|(s, a)| s.1 < a.1), "{sgd}");
    // The traces emulate the profile the runs are judged on.
    let header = std::fs::read_to_string(out.join("traces").join(format!("{}.jsonl", symbolic(&runs)[0].0))).unwrap();
    assert!(header.lines().next().unwrap().contains("\"profile\":\"a100-40gb\""), "{header:.300}");
    // Two datasets of one file stem would name their rows alike: refused, naming both.
    let twin = dir.path().join("other");
    std::fs::create_dir_all(&twin).unwrap();
    std::fs::copy(&data, twin.join("mlp_data_step1.csv")).unwrap();
    let twin = twin.join("mlp_data_step1.csv");
    let (ok, _, err) = memest_compare(&data, &out, &["--dataset", twin.to_str().unwrap()]);
    assert!(!ok && err.contains("are named mlp_data_step1-NNNNN") && err.contains("other/mlp_data_step1.csv"), "{err}");
    let (ok, _, err) = run(&["--jobs", "0"]);
    assert!(!ok && err.contains("--jobs 0"), "{err}");
    // No rows: it wrote a report of nothing and exited 0.
    let (ok, _, err) = memest_compare(&data, &out, &["--limit", "0"]);
    assert!(!ok && err.contains("--limit 0: expected at least 1 row"), "{err}");
}

#[test]
fn estimate_without_features_is_a_step_function_estimate_with_per_step_peaks() {
    let dir = tempfile::tempdir().unwrap();
    // A step function's trace: no batch size, family from the layer types the tracer lists;
    // step 0 peaks at 5 MiB requested (setup 1 MiB + 4 MiB), step 1 at 31 MiB.
    let meta = [("layer_types", "BatchNorm2d,Conv2d,ReLU"), ("cuda_emulation", "true")];
    let ops = [('a', 1, MIB), ('i', 0, 0), ('a', 2, 4 * MIB), ('f', 2, 0), ('i', 0, 1), ('a', 3, 30 * MIB)];
    let t = dir.path().join("t.jsonl");
    std::fs::write(&t, jsonl_trace(&meta, &ops)).unwrap();
    let t = t.display().to_string();
    let (ok, out, err) = memest(&["estimate", "--trace", &t, "--json"]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let e = &v["estimates"];
    for k in ["analytic", "horus"] {
        assert!(e[k].is_null(), "{k}");
        assert!(v["unavailable"][k].as_str().unwrap().contains("--features"), "{k}: {}", v["unavailable"]);
    }
    assert!(e["ml"].is_null());
    assert_eq!(v["family"], "CNN");
    let steps = &e["symbolic"]["steps"];
    assert_eq!(steps["count"], 2);
    // Reserved: a 2 MiB small-pool segment holds the 1 MiB setup block from the start; the 4 MiB
    // block of step 0 takes a 20 MiB large segment, cached in step 1, whose 30 MiB block takes
    // a segment of its own.
    let first = steps["first_step_reserved_mib"].as_f64().unwrap();
    let steady = steps["steady_reserved_mib"].as_f64().unwrap();
    assert_eq!((first, steady), (22.0, 52.0), "{steps}");
    let outside = v["outside_allocator"]["total_mib"].as_f64().unwrap();
    assert_eq!(steps["first_step_device_mib"].as_f64().unwrap(), first + outside);
    assert_eq!(e["symbolic"]["device_mib"].as_f64().unwrap(), first.max(steady) + outside);
    let (ok, out, _) = memest(&["estimate", "--trace", &t]);
    assert!(ok && out.contains("per step: first") && out.contains("steady (steps 2-2)"), "{out}");
    // `--help` names every key of the JSON it documents.
    let (_, help, _) = memest(&["estimate", "--help"]);
    let keys = |o: &serde_json::Value| o.as_object().unwrap().keys().cloned().collect::<Vec<_>>();
    let sym = &e["symbolic"];
    for k in keys(&v).iter().chain(&keys(&v["verdict"])).chain(&keys(sym)).chain(&keys(&v["text"])) {
        assert!(help.contains(&format!("\"{k}\"")), "estimate --help leaves out {k:?}:\n{help}");
    }
    // Without features, what only the feature-based baselines use is said to have no effect.
    let (ok, _, err) = memest(&["estimate", "--trace", &t, "--batch-size", "8", "--ml-model", "/nonexistent.json"]);
    assert!(ok, "{err}");
    for flag in ["--batch-size 8", "--ml-model /nonexistent.json"] {
        assert!(err.contains(&format!("{flag} has no effect without --features")), "{flag}: {err}");
    }
}

/// Features of another job than the trace, or baselines at another batch, put two jobs' answers
/// side by side: said, not silent. A batch of 0 is refused.
#[test]
fn features_of_another_job_are_warned_about() {
    let dir = tempfile::tempdir().unwrap();
    let meta = [("batch_size", "8"), ("model", "hf:gpt2"), ("seq_len", "128"), ("cuda_emulation", "true")];
    let t = dir.path().join("t.jsonl");
    std::fs::write(&t, jsonl_trace(&meta, &[('a', 1, 3 * MIB)])).unwrap();
    let feats = |name: &str, body: &str| {
        let f = dir.path().join(name);
        std::fs::write(&f, format!(r#"{{"total_parameters": 100, "total_activations": 10, {body} "layers": {{}}}}"#))
            .unwrap();
        f.display().to_string()
    };
    let t = t.display().to_string();
    let warnings = |f: &str, extra: &[&str]| -> Vec<String> {
        let mut args = vec!["estimate", "--trace", &t, "--features", f, "--json"];
        args.extend_from_slice(extra);
        let (ok, out, err) = memest(&args);
        assert!(ok, "{err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        v["warnings"].as_array().unwrap().iter().map(|w| w.as_str().unwrap().to_string()).collect()
    };
    let same = feats("same.json", r#""model": "hf:gpt2", "batch_size": 8, "seq_len": 128,"#);
    assert!(!warnings(&same, &[]).iter().any(|w| w.contains("another job") || w.contains("batch 8's")));
    let other = feats("other.json", r#""model": "torchvision:resnet18","#);
    assert!(warnings(&other, &[]).iter().any(|w| w.contains("of torchvision:resnet18") && w.contains("another job")));
    assert!(warnings(&same, &["--batch-size", "16"]).iter().any(|w| w.contains("baselines are for batch 16")));
    // Another input size: the trace's `seq_len` against the features'.
    let longer = feats("longer.json", r#""model": "hf:gpt2", "batch_size": 8, "seq_len": 512,"#);
    assert!(warnings(&longer, &[])
        .iter()
        .any(|w| w.contains("the features are for seq_len 512") && w.contains("for seq_len 128")));
    let images = feats("images.json", r#""input_shape": [3, 224, 224],"#);
    assert!(!warnings(&images, &[]).iter().any(|w| w.contains("input_shape")), "the trace names no shape");
    for (body, field) in [
        (r#""seq_len": 0,"#, "seq_len"),
        (r#""input_shape": [3, -1],"#, "input_shape"),
        (r#""input_shape": [],"#, "input_shape"),
    ] {
        let bad = feats("bad.json", body);
        let (ok, _, err) = memest(&["estimate", "--trace", &t, "--features", &bad]);
        assert!(!ok && err.contains(field) && err.contains(">= 1"), "{body}: {err}");
    }
    let (ok, _, err) = memest(&["estimate", "--trace", &t, "--features", &same, "--batch-size", "0"]);
    assert!(!ok && err.contains("--batch-size"), "{err}");
    let zero = feats("zero.json", r#""batch_size": 0,"#);
    let (ok, _, err) = memest(&["estimate", "--trace", &t, "--features", &zero]);
    assert!(!ok && err.contains("batch_size") && err.contains(">= 1"), "{err}");
}

/// A row whose Filename the trainer cannot rebuild was only counted in report.md: stderr names
/// it, with the reason (needs the venv).
#[test]
fn compare_names_the_rows_the_trainer_cannot_rebuild() {
    let (dir, out, data) = compare_setup("gpumemnet/mlp_data_step1.csv");
    let text = std::fs::read_to_string(&data).unwrap();
    let mut rdr = csv::Reader::from_reader(text.as_bytes());
    let two = dir.path().join("two.csv");
    let mut w = csv::Writer::from_path(&two).unwrap();
    w.write_record(rdr.headers().unwrap()).unwrap();
    for (i, rec) in rdr.records().take(2).enumerate() {
        let mut cells: Vec<String> = rec.unwrap().iter().map(String::from).collect();
        if i == 1 {
            cells[0] = "weird name.out".into();
        }
        w.write_record(&cells).unwrap();
    }
    w.flush().unwrap();
    let (ok, _, err) = memest_compare(&two, &out, &["--no-fake-tensor"]);
    assert!(ok, "{err}");
    assert!(err.contains("the trainer could not rebuild 1 of the 2 rows"), "{err}");
    assert!(err.contains("row two-00002 (Filename \"weird name.out\"): ") && err.contains("key:value"), "{err}");
}

/// A trace string with a control character (a header's `profile` "h\x1b[2Jx") reached the
/// terminal raw in memest's warnings and lines, where memsim escapes it; the JSON stays as it is.
#[test]
fn trace_strings_are_escaped_on_the_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let (_, _, f) = inputs(dir.path());
    let meta = [("batch_size", "8"), ("cuda_emulation", "true"), ("profile", "h\u{1b}[2Jx"), ("model", "m\u{1b}[1m")];
    let t = dir.path().join("evil.jsonl");
    std::fs::write(&t, jsonl_trace(&meta, &[('a', 1, 3 * MIB), ('m', 0, 2), ('a', 2, MIB)])).unwrap();
    let t = t.display().to_string();
    let (code, out, err) = memest_code(&["estimate", "--trace", &t, "--features", &f]);
    assert!(code == 0 || code == 1, "{err}");
    assert!(err.contains(r"h\u{1b}[2Jx"), "the warning names the profile, escaped: {err}");
    assert!(!out.contains('\u{1b}') && !err.contains('\u{1b}'), "{out}\n{err}");
    let (_, out, _) = memest_code(&["estimate", "--trace", &t, "--features", &f, "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(v["warnings"].to_string().contains(r"\u001b[2J"), "JSON keeps the string: {}", v["warnings"]);
}
