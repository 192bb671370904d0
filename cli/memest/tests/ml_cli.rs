//! ML estimators: the `memest ml` subcommands (module compiled into this test binary).

use clap::Parser;
use estimators::ml::modelfile::ModelFile;

use memest_cli::ml::{run, MlArgs};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    ml: MlArgs,
}

fn memest_ml(args: &[&str]) -> anyhow::Result<u8> {
    let mut argv = vec!["memest-ml"];
    argv.extend_from_slice(args);
    run(Cli::try_parse_from(argv)?.ml)
}

/// A 240-row excerpt of the step-2 CSV in a temporary directory (never in the repository).
fn excerpt(dir: &std::path::Path) -> String {
    let text = std::fs::read_to_string(crate::ml_data::gpumemnet("mlp_data_step2.csv")).unwrap();
    let head: Vec<&str> = text.lines().take(241).collect();
    let p = dir.join("excerpt.csv");
    std::fs::write(&p, head.join("\n")).unwrap();
    p.display().to_string()
}

fn check_err(args: &[&str], expect: &[&str]) {
    let err = format!("{:#}", memest_ml(args).expect_err("command must fail"));
    for e in expect {
        assert!(err.contains(e), "error {err:?} should contain {e:?}");
    }
}

#[test]
fn train_then_predict_through_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let csv = excerpt(dir.path());
    let out = dir.path().join("tree.json");
    let out_s = out.display().to_string();
    let code = memest_ml(&["train", "--dataset", &csv, "--family", "mlp", "--model", "tree", "--out", &out_s]).unwrap();
    assert_eq!(code, 0u8);
    let model = ModelFile::load(&out).unwrap();
    assert_eq!(model.training_rows, 240);
    assert!(model.licence.contains("CC BY-NC"));

    let features = r#"{"layers": 3, "batch_size": 996, "parameters": 3560152, "activations": 7430,
        "batch_norm_layers": 2, "dropout_layers": 2, "activation_sin": 0.99, "activation_cos": -0.14}"#;
    assert_eq!(memest_ml(&["predict", "--model", &out_s, "--features", features, "--json"]).unwrap(), 0u8);
    assert_eq!(memest_ml(&["predict", "--model", &out_s, "--dataset", &csv]).unwrap(), 0u8);
    check_err(&["predict", "--model", &out_s, "--features", r#"{"layers": 3}"#], &["--features", "batch_size"]);
    check_err(&["predict", "--model", &out_s, "--features", "/nonexistent/f.json"], &["/nonexistent/f.json"]);
    // Impossible features were answered ("2000 MiB" for a batch of -32).
    for (from, to, expect) in [
        ("\"batch_size\": 996", "\"batch_size\": -32", "feature \"batch_size\" is -32: expected a batch of at least 1"),
        ("\"parameters\": 3560152", "\"parameters\": -1", "feature \"parameters\" is -1: expected a count"),
        (
            "\"activation_sin\": 0.99",
            "\"activation_sin\": 7",
            "feature \"activation_sin\" is 7: expected a value in [-1, 1]",
        ),
    ] {
        let bad = features.replace(from, to);
        check_err(&["predict", "--model", &out_s, "--features", &bad], &["--features", expect]);
    }
}

#[test]
fn cv_and_reproduce_run_on_an_excerpt() {
    let dir = tempfile::tempdir().unwrap();
    let csv = excerpt(dir.path());
    for sub in ["cv", "reproduce"] {
        assert_eq!(
            memest_ml(&[sub, "--dataset", &csv, "--models", "tree,logistic,linear-reg", "--json"]).unwrap(),
            0u8
        );
    }
}

#[test]
fn cli_misuse_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let csv = excerpt(dir.path());
    let out = dir.path().join("m.json").display().to_string();
    check_err(
        &["train", "--dataset", &csv, "--family", "cnn", "--model", "tree", "--out", &out],
        &["--family cnn", "mlp"],
    );
    check_err(
        &["train", "--dataset", &csv, "--model", "svm", "--out", &out],
        &["unknown model \"svm\"", "mlp-ensemble"],
    );
    check_err(&["cv", "--dataset", "/nonexistent/x.csv"], &["/nonexistent/x.csv"]);
    // A test fraction outside (0, 1) panicked past 1, and took NaN and 0 for an empty test set.
    for bad in ["1.5", "1", "0", "NaN", "-0.1"] {
        let flag = format!("--test-frac={bad}");
        check_err(&["cv", "--dataset", &csv, &flag], &["--test-frac", "expected a fraction in (0, 1)"]);
    }
    check_err(&["cv", "--dataset", &csv, "--folds", "1"], &["--folds 1: expected at least 2"]);
    assert!(!std::path::Path::new(&out).exists(), "no model file after a failed train");
}

fn memest_bin(args: &[&str]) -> (i32, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_memest")).args(args).output().expect("memest runs");
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// The excerpt with one cell of row 1 replaced.
fn with_cell(dir: &std::path::Path, column: &str, value: &str) -> String {
    let text = std::fs::read_to_string(excerpt(dir)).unwrap();
    let mut rows: Vec<Vec<String>> = csv::Reader::from_reader(text.as_bytes())
        .records()
        .map(|r| r.unwrap().iter().map(str::to_string).collect())
        .collect();
    let header: Vec<String> = text.lines().next().unwrap().split(',').map(str::to_string).collect();
    let i = header.iter().position(|h| h == column).unwrap();
    rows[0][i] = value.to_string();
    let p = dir.join(format!("{}.csv", column.replace(' ', "_").replace(['(', ')'], "")));
    let mut w = csv::Writer::from_path(&p).unwrap();
    w.write_record(&header).unwrap();
    rows.iter().for_each(|r| w.write_record(r).unwrap());
    w.flush().unwrap();
    p.display().to_string()
}

/// Knobs that trained nothing (`--epochs 0`: an untrained model written as a result) or were
/// taken as another value (`--trees 0` as 1, `--budget nan`) are refused; rows a model leaves
/// out, a score on its own training rows and an empty feature list are said; a utilisation
/// outside its range was trained on as a label.
#[test]
fn what_ml_cannot_use_is_refused_or_said() {
    let dir = tempfile::tempdir().unwrap();
    let csv = excerpt(dir.path());
    for (flag, value, says) in [
        ("--trees", "0", "expected a whole number, at least 1"),
        ("--epochs", "0", "expected a whole number, at least 1"),
        ("--budget", "nan", "expected a finite number above 0"),
    ] {
        let (code, err) = memest_bin(&["ml", "cv", "--dataset", &csv, "--models", "forest", flag, value]);
        assert!(code == 2 && err.contains(says), "{flag} {value}: {code} {err}");
    }
    let huge = with_cell(dir.path(), "Max GPU Memory (MiB)", "1e300");
    let model = dir.path().join("m.json");
    let m = model.to_str().unwrap();
    let (code, err) = memest_bin(&["ml", "train", "--dataset", &huge, "--model", "tree", "--out", m]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("1 rows left out: a memory label above any device's memory"), "{err}");
    let (code, err) = memest_bin(&["ml", "predict", "--model", m, "--dataset", &huge]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("the summary scores its own training rows (in-sample"), "{err}");
    let (code, err) = memest_bin(&["ml", "predict", "--model", m, "--dataset", &csv]);
    assert!(code == 0 && !err.contains("in-sample"), "another file: {err}");
    let (code, err) = memest_bin(&["ml", "predict", "--model", m, "--features", "[]"]);
    assert!(code == 2 && err.contains("no feature object to predict"), "{code} {err}");
    let busy = with_cell(dir.path(), "Avg SMACT", "1.5");
    let (code, err) = memest_bin(&["util", "cv", "--dataset", &busy, "--metric", "smact"]);
    assert!(code == 2 && err.contains("row 1: column \"Avg SMACT\": expected a fraction in [0, 1]"), "{code} {err}");
}
