//! A need no device holds (a program whose memory fraction is 0) is said as one: `null` with the
//! reason in `--json`, never 2^64 B written as 17592186044416.0 MiB beside a verdict.

use crate::common::jsonl_trace;
use crate::support::memest_code;

const MIB: u64 = 1024 * 1024;

/// A symbolic trace whose program sets a memory fraction of `fraction` before it allocates.
fn fraction_trace(dir: &std::path::Path, fraction: &str) -> String {
    let meta = [("batch_size", "8"), ("optimizer", "adam"), ("amp", "fp32"), ("cuda_emulation", "true")];
    let text = jsonl_trace(&meta, &[('a', 1, 3 * MIB)]);
    let (header, rest) = text.split_once('\n').unwrap();
    let control =
        format!(r#"{{"ts_ns":0,"device":0,"kind":"control","op":"set_memory_fraction","fraction":{fraction}}}"#);
    let t = dir.join(format!("fraction-{fraction}.jsonl"));
    std::fs::write(&t, format!("{header}\n{control}\n{rest}")).unwrap();
    t.display().to_string()
}

/// Every number in a JSON value, with its path.
fn numbers(v: &serde_json::Value, at: &str, out: &mut Vec<(String, f64)>) {
    match v {
        serde_json::Value::Number(n) => out.push((at.to_string(), n.as_f64().unwrap())),
        serde_json::Value::Array(a) => a.iter().enumerate().for_each(|(i, x)| numbers(x, &format!("{at}[{i}]"), out)),
        serde_json::Value::Object(m) => m.iter().for_each(|(k, x)| numbers(x, &format!("{at}.{k}"), out)),
        _ => {}
    }
}

#[test]
fn a_fraction_of_0_is_a_null_need_with_its_reason_not_2_to_the_64_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let t = fraction_trace(dir.path(), "0");
    for point in [false, true] {
        let mut args = vec!["estimate", "--trace", &t, "--json"];
        if point {
            args.push("--point");
        }
        let (code, out, err) = memest_code(&args);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}{err}"));
        let case = format!("--point {point}: {}", v["verdict"]);
        assert_eq!(code, 1, "{case}: {err}");
        let verdict = &v["verdict"];
        assert_eq!(verdict["need_unbounded"], "memory_fraction", "{case}");
        assert!(verdict["need_mib"].is_null() && verdict["point_mib"].is_null(), "{case}");
        assert_eq!(verdict["fits"], false, "{case}");
        let sym = &v["estimates"]["symbolic"];
        assert!(sym["device_mib"].is_null() && sym.get("safe_mib").is_none(), "{case}: {sym}");
        // What the replay reserved is a size, and stays one.
        assert_eq!(sym["reserved_mib"], 20.0, "{case}");
        // No saturated count anywhere (u64::MAX B is 17592186044416 MiB).
        let mut all = Vec::new();
        numbers(&v, "", &mut all);
        let huge: Vec<_> = all.iter().filter(|(_, n)| *n >= 1e12).collect();
        assert!(huge.is_empty(), "{case}: {huge:?}");
        let words = &v["text"]["headline"];
        assert!(words.as_str().unwrap().starts_with("needs more than any device holds on "), "{case}: {words}");
        assert!(words.as_str().unwrap().contains("memory fraction"), "{case}: {words}");
        assert!(err.contains("set_per_process_memory_fraction"), "{case}: {err}");

        // The text says the same, and `memest render` words the JSON as `estimate` printed it.
        args.retain(|a| *a != "--json");
        let (code, text, _) = memest_code(&args);
        assert_eq!(code, 1, "{case}: {text}");
        assert!(text.starts_with("needs more than any device holds") && !text.contains("17592186044416"), "{text}");
        let est = dir.path().join("est.json");
        std::fs::write(&est, &out).unwrap();
        let (code, rendered, err) = memest_code(&["render", est.to_str().unwrap()]);
        assert_eq!((code, rendered.as_str()), (0, text.as_str()), "{case}: {err}");
    }
}

#[test]
fn render_refuses_a_null_need_without_its_reason_and_a_number_beside_one() {
    let dir = tempfile::tempdir().unwrap();
    let t = fraction_trace(dir.path(), "0");
    let v: serde_json::Value = serde_json::from_str(&memest_code(&["estimate", "--trace", &t, "--json"]).1).unwrap();
    let est = dir.path().join("est.json");
    let render = |value: &serde_json::Value| {
        std::fs::write(&est, value.to_string()).unwrap();
        memest_code(&["render", est.to_str().unwrap()])
    };
    let mut no_reason = v.clone();
    no_reason["verdict"]["need_unbounded"] = serde_json::Value::Null;
    let (code, _, err) = render(&no_reason);
    assert!(code == 2 && err.contains("`verdict.need_mib` is null without `verdict.need_unbounded`"), "{err}");
    let mut a_number = v.clone();
    a_number["verdict"]["need_mib"] = serde_json::json!(50000.0);
    let (code, _, err) = render(&a_number);
    assert!(code == 2 && err.contains("`verdict.need_unbounded` says no device holds it"), "{err}");
    let mut a_point = v.clone();
    a_point["estimates"]["symbolic"]["device_mib"] = serde_json::json!(500.0);
    let (code, _, err) = render(&a_point);
    assert!(code == 2 && err.contains("or all null when `verdict.need_unbounded`"), "{err}");
    // A fraction whose share of a device holds the run is a number, as before.
    let t = fraction_trace(dir.path(), "0.5");
    let (_, out, _) = memest_code(&["estimate", "--trace", &t, "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(v["verdict"]["need_unbounded"].is_null() && v["verdict"]["need_mib"].as_f64().is_some(), "{out}");
}

/// An allocation larger than any segment (past 256 TiB) fails at every capacity, and a real run's
/// trace can record its own out-of-memory error: the reserved figure is then that failure's
/// floor, not a peak, and the words say so beside the peaks and per-step figures that never
/// count the request.
#[test]
fn a_failed_allocations_floor_is_said_as_one_not_as_a_peak() {
    let dir = tempfile::tempdir().unwrap();
    let meta = [("batch_size", "8"), ("optimizer", "adam"), ("amp", "fp32"), ("cuda_emulation", "true")];
    let huge = 1u64 << 50;
    let ops = [('i', 0, 1), ('a', 1, 3 * MIB), ('a', 2, huge), ('f', 2, 0), ('f', 1, 0), ('i', 0, 2), ('a', 3, MIB)];
    let t = dir.path().join("huge.jsonl");
    std::fs::write(&t, jsonl_trace(&meta, &ops)).unwrap();
    let t = t.display().to_string();
    let (code, out, err) = memest_code(&["estimate", "--trace", &t, "--json"]);
    assert_eq!(code, 1, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}{err}"));
    let sym = &v["estimates"]["symbolic"];
    assert_eq!(sym["reserved_oom_floor"], true, "{sym}");
    assert!(sym["reserved_mib"].as_f64().unwrap() >= (huge / MIB) as f64, "{sym}");
    // A baseline's reserved figure is its own model's, never a floor: the key is left out.
    for (name, a) in v["estimates"].as_object().unwrap() {
        if name != "symbolic" && !a.is_null() {
            assert!(a.get("reserved_oom_floor").is_none(), "{name}: {a}");
        }
    }
    let (_, text, _) = memest_code(&["estimate", "--trace", &t]);
    assert!(text.starts_with("needs at least ") && text.contains("symbolic: reserved at least "), "{text}");
    assert!(text.contains("an allocation failed"), "{text}");
    assert!(!text.contains("peak reserved"), "{text}");
    assert!(text.contains("the failed allocation is in no step's peak"), "{text}");
    // `render` reads the flag back from the JSON and words it the same.
    let est = dir.path().join("est.json");
    std::fs::write(&est, &out).unwrap();
    let (code, rendered, err) = memest_code(&["render", est.to_str().unwrap()]);
    assert_eq!((code, rendered.as_str()), (0, text.as_str()), "{err}");

    // A real run's trace that records its own out-of-memory error: the need is that failure's
    // floor too, and a floor that fits is said as one that fits.
    let room = dir.path().join("room.jsonl");
    let text = jsonl_trace(&[], &[('a', 1, MIB)]) + "{\"kind\":\"oom\",\"device\":0,\"size\":2147483648}\n";
    std::fs::write(&room, text).unwrap();
    let (code, out, err) = memest_code(&["estimate", "--trace", room.to_str().unwrap(), "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["estimates"]["symbolic"]["reserved_oom_floor"], true, "{}", v["estimates"]["symbolic"]);
    assert!(v["text"]["headline"].as_str().unwrap().starts_with("needs at least "), "{}", v["text"]);
    assert_eq!(v["text"]["verdict"], "FITS", "{}", v["text"]);

    // A job that fits keeps the word "peak" and writes no flag.
    let small = dir.path().join("small.jsonl");
    std::fs::write(&small, jsonl_trace(&meta, &[('a', 1, 3 * MIB), ('f', 1, 0)])).unwrap();
    let (code, out, err) = memest_code(&["estimate", "--trace", small.to_str().unwrap(), "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(v["estimates"]["symbolic"].get("reserved_oom_floor").is_none(), "{}", v["estimates"]["symbolic"]);
    assert!(v["text"]["details"].to_string().contains("peak reserved"), "{}", v["text"]);
}
