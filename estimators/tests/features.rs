//! Feature parsing and the family rule (any convolution: CNN; any attention: Transformer).

use std::path::Path;

use estimators::features::{is_convolution, is_gemm, Family};
use estimators::features_file::FeaturesFile;

#[test]
fn family_from_layer_types() {
    let check =
        |types: &[&str], want: Family| assert_eq!(Family::from_layer_types(types.iter().copied()), want, "{types:?}");
    check(&["Linear", "ReLU", "Softmax"], Family::Mlp);
    check(&["linear", "batch_normalization"], Family::Mlp);
    check(&["Conv2d", "BatchNorm2d", "Linear"], Family::Cnn);
    check(&["conv2d", "GELU"], Family::Cnn);
    check(&["Embedding", "Conv1D", "GPT2Attention", "LayerNorm"], Family::Transformer);
    check(&["Conv2d", "MultiheadAttention"], Family::Transformer);
    check(&[], Family::Mlp);
}

#[test]
fn library_terms_from_layer_types() {
    for (t, conv, gemm) in [
        ("Conv2d", true, false),
        ("ConvTranspose2d", true, false),
        ("conv2d", true, false),
        ("Conv1D", false, true),
        ("Linear", false, true),
        ("NonDynamicallyQuantizableLinear", false, true),
        ("ReLU", false, false),
    ] {
        assert_eq!((is_convolution(t), is_gemm(t)), (conv, gemm), "{t}");
    }
}

#[test]
fn parses_trainer_json() {
    let text = r#"{"total_parameters": 30, "total_activations": 7, "batch_size": 4,
        "layers": {"10": {"type": "Softmax", "activations": 2, "parameters": 0},
                   "2": {"type": "Linear", "activations": 5, "parameters": 30}}}"#;
    let file = FeaturesFile::parse(text, Path::new("f.json")).unwrap();
    assert!(file.warnings.is_empty(), "{:?}", file.warnings);
    let f = file.features;
    assert_eq!((f.total_parameters, f.total_activations, f.batch_size), (30, 7, Some(4)));
    // Numeric, not lexical, layer order.
    assert_eq!(f.layers.iter().map(|l| l.kind.as_str()).collect::<Vec<_>>(), ["Linear", "Softmax"]);
    assert!(f.uses_gemm() && !f.uses_conv());
}

#[test]
fn errors_name_file_and_field() {
    let check = |text: &str, needle: &str| {
        let e = FeaturesFile::parse(text, Path::new("feat.json")).unwrap_err().to_string();
        assert!(e.contains("feat.json") && e.contains(needle), "{e:?} lacks {needle:?}");
    };
    check("not json", "<document>");
    // `features --csv` output handed over for `--features`: said to be a CSV row.
    check("Filename,Depth,Activations-Params\nx.out,2,\"[]\"\n", "this is a CSV row (features --csv)");
    check(r#"{"total_activations": 1, "layers": {}}"#, "total_parameters");
    check(r#"{"total_parameters": -1, "total_activations": 1, "layers": {}}"#, "total_parameters");
    check(r#"{"total_parameters": 1, "total_activations": 1}"#, "layers");
    check(
        r#"{"total_parameters": 1, "total_activations": 1, "layers": {"0": {"type": "Linear", "activations": 1}}}"#,
        "layers.0.parameters",
    );
    check(r#"{"total_parameters": 1, "total_activations": 1, "layers": {"x": {}}}"#, "layers.x");
    // A field of the wrong shape, even one only the ML estimator reads, is refused.
    let seq = r#""sequence": [["Linear", 1, 1]]"#;
    for (field, body) in [
        ("\"layers\"", format!(r#"{seq}, "layers": []"#)),
        ("\"sequence\"", r#""sequence": {}"#.to_string()),
        ("\"depth\"", format!(r#"{seq}, "depth": 2.5"#)),
        ("\"activation_function\"", format!(r#"{seq}, "activation_function": ["ReLU"]"#)),
        ("\"gpumemnet_sequence[0]\"", format!(r#"{seq}, "gpumemnet_sequence": [["linear", 1]]"#)),
    ] {
        check(&format!(r#"{{"total_parameters": 1, "total_activations": 1, {body}}}"#), field);
    }
    check("[]", "expected a JSON object");
}

/// What the file holds that nothing reads, or layers that cannot be used, is said: a misspelt
/// field was read as absent, and `"layers": {}` with `"sequence": []` cut the analytic estimate.
#[test]
fn what_a_features_file_cannot_give_is_said() {
    let said = |text: &str| FeaturesFile::parse(text, Path::new("f.json")).unwrap().warnings.join("\n");
    let base = r#""total_parameters": 30, "total_activations": 7"#;
    for (body, says) in [
        (
            r#""sequence": [["Linear", 5, 30]], "totl_parameters": 3"#,
            "unknown field \"totl_parameters\" (did you mean \"total_parameters\"?)",
        ),
        (r#""sequence": [["Linear", 5, 30]], "extra_field": 1, "zz": 2"#, "unknown fields \"extra_field\", \"zz\""),
        (r#""sequence": [], "layers": {}"#, "f.json: no layers"),
        (
            r#""sequence": [], "layers": {"0": {"type": "Linear", "activations": 5, "parameters": 30}}"#,
            "`layers` is used",
        ),
        (
            r#""sequence": [["ReLU", 5, 0]], "layers": {"0": {"type": "Linear", "activations": 5, "parameters": 30}}"#,
            "describe different layers",
        ),
    ] {
        let w = said(&format!("{{{base}, {body}}}"));
        assert!(w.contains(says), "{body}: {w}");
    }
    let whole =
        r#""sequence": [["Linear", 5, 30]], "layers": {"0": {"type": "Linear", "activations": 5, "parameters": 30}}"#;
    assert_eq!(said(&format!(r#"{{{base}, {whole}, "depth": 1, "activation_function": null}}"#)), "");
}

#[test]
fn one_family_rule_for_features_and_ml_rows() {
    use estimators::features::{Family as F, Features};
    use estimators::ml::dataset::{Family as M, Layer};
    let cases: [(&[&str], F); 5] = [
        (&["Conv1D", "Linear"], F::Mlp),
        (&["conv2d", "linear"], F::Cnn),
        (&["Conv2d", "MultiheadAttention"], F::Transformer),
        (&["NonDynamicallyQuantizableLinear", "Linear"], F::Transformer),
        (&["ConvTranspose2d"], F::Cnn),
    ];
    for (kinds, f) in cases {
        assert_eq!(F::from_layer_types(kinds.iter().copied()), f, "{kinds:?}");
        let layers: Vec<Layer> =
            kinds.iter().map(|k| Layer { kind: k.to_string(), activations: 1, parameters: 1 }).collect();
        let features = Features {
            total_parameters: 0,
            total_activations: 0,
            batch_size: None,
            model: None,
            seq_len: None,
            input_shape: None,
            layers,
        };
        let m: M = features.family();
        assert_eq!(m, f, "{kinds:?}");
    }
}

/// One family type, two names: `as_str` for reports (`MLP`), `name`/Display for the command
/// line and model files (`mlp`); model files written in either spelling read back.
#[test]
fn family_names_parse_and_serde() {
    use estimators::features::Family;
    for f in Family::ALL {
        assert_eq!(Family::parse(f.name()), Some(f));
        assert_eq!(Family::parse(f.as_str()), Some(f));
        assert_eq!(f.to_string(), f.name());
        let json = serde_json::to_string(&f).unwrap();
        assert_eq!(json, format!("\"{}\"", f.name()));
        assert_eq!(serde_json::from_str::<Family>(&json).unwrap(), f);
        assert_eq!(serde_json::from_str::<Family>(&format!("\"{}\"", f.as_str())).unwrap(), f);
    }
    assert_eq!((Family::Mlp.as_str(), Family::Transformer.name()), ("MLP", "transformer"));
    assert_eq!(Family::parse("rnn"), None);
}

/// A trace's family is the rule's, of the layer types its header lists; a header written before
/// the tracer listed them is read by its recorded family; a real run's names none.
#[test]
fn family_of_a_trace_header() {
    use trace::{Header, Level};
    let header = |meta: &[(&str, &str)]| {
        let mut h = Header::new("memtrace_trainer", "0", Level::Allocator);
        for (k, v) in meta {
            h.metadata.insert(k.to_string(), v.to_string());
        }
        h
    };
    let check = |meta: &[(&str, &str)], expect: Option<Family>| {
        assert_eq!(Family::of_header(&header(meta)), expect, "{meta:?}");
    };
    check(&[("layer_types", "Linear,ReLU")], Some(Family::Mlp));
    check(&[("layer_types", "BatchNorm2d, Conv2d,Linear")], Some(Family::Cnn));
    check(&[("layer_types", "Conv1D,GPT2Attention,Linear")], Some(Family::Transformer));
    // No module ran (a functional step): the family is unknown, not an MLP's.
    check(&[("layer_types", "")], None);
    check(&[("layer_types", ""), ("family", "cnn")], Some(Family::Cnn));
    // The listed layers win over a recorded family: one rule decides.
    check(&[("layer_types", "Linear"), ("family", "cnn")], Some(Family::Mlp));
    check(&[("family", "CNN")], Some(Family::Cnn));
    check(&[("family", "rnn")], None);
    check(&[], None);
}
