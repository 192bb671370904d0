//! The features file (`features --json`) that `memest estimate --features` reads: fields of no
//! format are said, layers that cannot be used are said with what the estimates lose, and a
//! field of the wrong shape is refused naming it.

use crate::cli::inputs;
use crate::support::memest_code;

/// The trainer's features of a depth-3 MLP (`synthetic:{"family":"mlp",...,"depth":3}`, batch 8).
const MLP: &str = r#"{"model": "mlp", "total_parameters": 2888, "total_activations": 136, "batch_size": 8,
    "input_shape": [64], "depth": 4, "layer_counts": {"Linear": 4, "ReLU": 3, "Softmax": 1},
    "activation_function": "ReLU", "activation_encoding": [0.0, 1.0],
    "layers": {"0": {"type": "Linear", "activations": 32, "parameters": 2080}, "1": {"type": "ReLU", "activations": 32, "parameters": 0},
               "2": {"type": "Linear", "activations": 16, "parameters": 528}, "3": {"type": "ReLU", "activations": 16, "parameters": 0},
               "4": {"type": "Linear", "activations": 10, "parameters": 170}, "5": {"type": "ReLU", "activations": 10, "parameters": 0},
               "6": {"type": "Linear", "activations": 10, "parameters": 110}, "7": {"type": "Softmax", "activations": 10, "parameters": 0}},
    "sequence": [["Linear", 32, 2080], ["ReLU", 32, 0], ["Linear", 16, 528], ["ReLU", 16, 0], ["Linear", 10, 170],
                 ["ReLU", 10, 0], ["Linear", 10, 110], ["Softmax", 10, 0]],
    "gpumemnet_sequence": [["linear", 32, 2080], ["ReLU", 32, 0], ["linear", 16, 528], ["ReLU", 16, 0],
                           ["linear", 10, 170], ["ReLU", 10, 0], ["linear", 10, 110], ["Softmax", 10, 0]]}"#;

/// `memest estimate --json` of the trace in `dir` with the features `text`: exit code, the
/// report (null when none) and stderr.
fn estimate(dir: &std::path::Path, text: &str) -> (i32, serde_json::Value, String) {
    let (t, _, _) = inputs(dir);
    let f = dir.join("features.json");
    std::fs::write(&f, text).unwrap();
    let (code, out, err) = memest_code(&["estimate", "--trace", &t, "--features", f.to_str().unwrap(), "--json"]);
    (code, serde_json::from_str(&out).unwrap_or(serde_json::Value::Null), err)
}

fn warnings(v: &serde_json::Value) -> String {
    v["warnings"].as_array().unwrap().iter().map(|w| w.as_str().unwrap()).collect::<Vec<_>>().join("\n")
}

/// `"layers": {}` and `"sequence": []` took the analytic estimate from 1437.2 to 400.1 MiB with no
/// word, and a misspelt `"totl_parameters"` or an `"extra_field"` was read as nothing.
#[test]
fn unusable_layers_and_unknown_fields_are_said() {
    let dir = tempfile::tempdir().unwrap();
    let (code, whole, err) = estimate(dir.path(), MLP);
    assert_eq!(code, 0, "{err}");
    assert_eq!(warnings(&whole).matches("features.json").count(), 0, "{}", warnings(&whole));
    let analytic = whole["estimates"]["analytic"]["device_mib"].as_f64().unwrap();

    let no_layers = MLP
        .replace(r#""layers": {"0""#, r#""layers": {}, "was_layers": {"0""#)
        .replace(r#""sequence": [["Linear""#, r#""sequence": [], "was_sequence": [["Linear""#);
    let (code, v, err) = estimate(dir.path(), &no_layers);
    assert_eq!(code, 0, "{err}");
    let w = warnings(&v);
    assert!(v["estimates"]["analytic"]["device_mib"].as_f64().unwrap() < analytic, "the probe's drop");
    assert!(w.contains("features.json: no layers") && w.contains("analytic"), "{w}");
    assert!(w.contains("unknown fields \"was_layers\", \"was_sequence\""), "{w}");
    assert!(err.contains("no layers"), "{err}");

    // One of the two lists empty, the other whole: the whole one is used, and the disagreement said.
    let half = MLP.replace(r#""sequence": [["Linear""#, r#""sequence": [], "was_sequence": [["Linear""#);
    let (code, v, err) = estimate(dir.path(), &half);
    assert_eq!(code, 0, "{err}");
    assert_eq!(v["estimates"]["analytic"]["device_mib"].as_f64(), Some(analytic));
    assert!(warnings(&v).contains("`sequence` is empty"), "{}", warnings(&v));

    let misspelt = MLP.replace(r#""model": "mlp","#, r#""model": "mlp", "totl_parameters": 9, "extra_field": 1,"#);
    let (code, v, err) = estimate(dir.path(), &misspelt);
    assert_eq!(code, 0, "{err}");
    let w = warnings(&v);
    assert!(
        w.contains("\"totl_parameters\" (did you mean \"total_parameters\"?)") && w.contains("\"extra_field\""),
        "{w}"
    );
}

/// A field of the wrong shape is refused, naming the file, the field and what was expected.
#[test]
fn a_field_of_the_wrong_shape_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    for (from, to, field, expected) in [
        (r#""sequence": [["Linear""#, r#""sequence": {}, "x": [["Linear""#, "\"sequence\"", "a list"),
        (r#""layers": {"0""#, r#""layers": [], "x": {"0""#, "\"layers\"", "an object"),
        (r#""depth": 4"#, r#""depth": "four""#, "\"depth\"", "a whole number"),
        (r#""activation_function": "ReLU""#, r#""activation_function": 3"#, "\"activation_function\"", "a string"),
        (r#""gpumemnet_sequence": ["#, r#""gpumemnet_sequence": 7, "x": ["#, "\"gpumemnet_sequence\"", "a list"),
        (r#"["ReLU", 16, 0], ["Linear", 10, 170]"#, r#"["ReLU", 16], ["Linear", 10, 170]"#, "\"sequence[3]\"", "[type"),
        // A key given twice was read as its last value in silence.
        (r#""batch_size": 8,"#, r#""batch_size": 8, "batch_size": 64,"#, "\"batch_size\"", "each key once"),
        (
            r#""0": {"type": "Linear","#,
            r#""0": {"type": "Linear", "type": "ReLU","#,
            "\"layers.0.type\"",
            "each key once",
        ),
    ] {
        let bad = MLP.replacen(from, to, 1);
        assert_ne!(bad, MLP, "{from}");
        let (code, _, err) = estimate(dir.path(), &bad);
        assert!(
            code == 2 && err.contains("features.json") && err.contains(field) && err.contains(expected),
            "{to}: {code} {err}"
        );
        assert!(!err.contains("panicked"), "{err}");
    }
    let (code, _, err) = estimate(dir.path(), "[1, 2]");
    assert!(code == 2 && err.contains("features.json") && err.contains("a JSON object"), "{code} {err}");
}

/// A total whose formulas pass 2^64 B printed as a float of 20 digits where analytic's own
/// overflow is null with its reason. A total that is not the layers' sum is no fault (tied
/// embeddings count once in it): not warned.
#[test]
fn totals_that_overflow_are_said() {
    let dir = tempfile::tempdir().unwrap();
    let (code, v, err) = estimate(dir.path(), &MLP.replace("\"total_parameters\": 2888", "\"total_parameters\": 5"));
    assert_eq!(code, 0, "{err}");
    assert!(!warnings(&v).contains("total_parameters") && !err.contains("total_parameters"), "{err}");

    let huge = MLP.replace("\"total_parameters\": 2888", &format!("\"total_parameters\": {}", u64::MAX - 1));
    let (code, v, err) = estimate(dir.path(), &huge);
    assert_eq!(code, 0, "{err}");
    for name in ["accelerate", "deepspeed", "horus"] {
        assert!(v["estimates"][name].is_null(), "{name}: {}", v["estimates"][name]);
        let why = v["unavailable"][name].as_str().unwrap_or_else(|| panic!("{name}: no reason in {v}"));
        assert!(why.contains("past 2^64 bytes"), "{name}: {why}");
    }
    let (code, text, err) = crate::support::memest_code(&[
        "estimate",
        "--trace",
        &inputs(dir.path()).0,
        "--features",
        dir.path().join("features.json").to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(!text.contains("e19") && !text.contains("17592186044416"), "{text}");
}
