//! ML estimators: the `memest ml` subcommands (module compiled into this test binary).

use clap::Parser;
use estimators::ml::modelfile::ModelFile;

use memest_cli::ml::{run, MlArgs};

use crate::support::memest_code;

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
    excerpt_of(dir, "mlp_data_step2.csv", 240)
}

/// The first `rows` rows of the GPUMemNet CSV `file`, as `excerpt.csv` in `dir`.
fn excerpt_of(dir: &std::path::Path, file: &str, rows: usize) -> String {
    let text = std::fs::read_to_string(crate::ml_data::gpumemnet(file)).unwrap();
    let head: Vec<&str> = text.lines().take(rows + 1).collect();
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
    // A negative number is a bad value of its flag, not an unknown argument.
    for (flag, value) in [("--folds", "-1"), ("--epochs", "-3"), ("--trees", "-1"), ("--budget", "-0.5")] {
        check_err(&["cv", "--dataset", &csv, flag, value], &[&format!("invalid value '{value}' for '{flag}")]);
    }
    // More folds than the rows left after the test set: the flag is named (it was "k=50").
    check_err(
        &["cv", "--dataset", &csv, "--folds", "50", "--test-frac", "0.9"],
        &["--folds 50", "folds = 50: more than the", "development rows", "test fraction 0.9"],
    );
    assert!(!std::path::Path::new(&out).exists(), "no model file after a failed train");
}

/// The memest binary with `args`: its exit code and stderr.
fn memest_bin(args: &[&str]) -> (i32, String) {
    let (code, _, err) = memest_code(args);
    (code, err)
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
    assert!(err.contains("was trained on all 239 scored rows of"), "{err}");
    // Training rows are known by what they hold: the excerpt differs in row 1 alone (its label
    // was left out of training), and a renamed copy in reverse order is the same rows. The file
    // name was the evidence before, so both read as held out.
    let (code, err) = memest_bin(&["ml", "predict", "--model", m, "--dataset", &csv]);
    assert!(code == 0 && err.contains("was trained on 239 of the 240 rows scored from"), "{err}");
    let text = std::fs::read_to_string(&huge).unwrap();
    let mut lines: Vec<&str> = text.lines().collect();
    lines[1..].reverse();
    let copy = dir.path().join("renamed.csv");
    std::fs::write(&copy, lines.join("\n")).unwrap();
    let (code, err) = memest_bin(&["ml", "predict", "--model", m, "--dataset", copy.to_str().unwrap()]);
    assert!(code == 0 && err.contains("was trained on all 239 scored rows of"), "renamed copy: {err}");
    // Rows of the same source the model never saw.
    let full = std::fs::read_to_string(crate::ml_data::gpumemnet("mlp_data_step2.csv")).unwrap();
    let rest: Vec<&str> = full.lines().take(1).chain(full.lines().skip(1000).take(100)).collect();
    let other = dir.path().join("other.csv");
    std::fs::write(&other, rest.join("\n")).unwrap();
    let (code, err) = memest_bin(&["ml", "predict", "--model", m, "--dataset", other.to_str().unwrap()]);
    assert!(code == 0 && !err.contains("in-sample"), "rows never trained on: {err}");
    // Every absent feature is named at once.
    let (code, err) = memest_bin(&["ml", "predict", "--model", m, "--features", "{}"]);
    assert!(
        code == 2
            && err.contains("features \"layers\", \"batch_size\",")
            && err.contains("are missing or not a number"),
        "{code} {err}"
    );
    let (code, err) = memest_bin(&["ml", "predict", "--model", m, "--features", "[]"]);
    assert!(code == 2 && err.contains("no feature object to predict"), "{code} {err}");
    let busy = with_cell(dir.path(), "Avg SMACT", "1.5");
    let (code, err) = memest_bin(&["util", "cv", "--dataset", &busy, "--metric", "smact"]);
    assert!(code == 2 && err.contains("row 1: column \"Avg SMACT\": expected a fraction in [0, 1]"), "{code} {err}");
}

/// What a probe found the ML commands took in silence: a model file written over its own
/// training data, cells out of their domain read from a CSV (refused from `--features`), an
/// empty file or a column named twice, a model file whose parts disagree, a one-class problem
/// called a success, a model repeated, and our own runs labelled with GPUMemNet's licence.
#[test]
fn ml_inputs_a_probe_found_taken_in_silence_are_refused_or_said() {
    let dir = tempfile::tempdir().unwrap();
    let csv = excerpt(dir.path());
    let (code, err) = memest_bin(&["ml", "train", "--dataset", &csv, "--model", "tree", "--out", &csv]);
    assert!(
        code == 2 && err.contains(&format!("--out {csv} is the --dataset {csv}: writing it would destroy")),
        "{code} {err}"
    );
    assert!(std::fs::read_to_string(&csv).unwrap().contains("Max GPU Memory (MiB)"), "the data is kept");
    for (column, value, says) in [
        ("Batch Size", "0", "row 1: column \"Batch Size\": expected a batch of at least 1, got 0"),
        ("Depth", "-3", "row 1: column \"Depth\": expected a layer count >= 0, got -3"),
    ] {
        let bad = with_cell(dir.path(), column, value);
        let (code, err) = memest_bin(&["ml", "train", "--dataset", &bad, "--model", "tree", "--out", "/dev/null"]);
        assert!(code == 2 && err.contains(says), "{column}: {code} {err}");
    }
    let empty = dir.path().join("empty.csv");
    std::fs::write(&empty, "").unwrap();
    let (code, err) = memest_bin(&["ml", "cv", "--dataset", empty.to_str().unwrap()]);
    assert!(code == 2 && err.contains("the file is empty"), "{code} {err}");
    let text = std::fs::read_to_string(&csv).unwrap();
    let twice = dir.path().join("twice.csv");
    let doubled: Vec<String> = text.lines().map(|l| format!("{l},{}", l.rsplit(',').next().unwrap())).collect();
    let last = text.lines().next().unwrap().rsplit(',').next().unwrap().to_string();
    std::fs::write(&twice, doubled.join("\n")).unwrap();
    let (code, err) = memest_bin(&["ml", "cv", "--dataset", twice.to_str().unwrap()]);
    assert!(code == 2 && err.contains(&format!("column \"{last}\": expected each column once")), "{code} {err}");

    // A model file edited by hand: each part checked at load, the same for both predict paths.
    let model = dir.path().join("m.json");
    let m = model.to_str().unwrap();
    let (code, err) = memest_bin(&["ml", "train", "--dataset", &csv, "--model", "tree", "--out", m]);
    assert!(code == 0 && err.contains("GPUMemNet data (CC BY-NC 4.0)"), "{err}");
    let good: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&model).unwrap()).unwrap();
    let edited = |name: &str, f: &dyn Fn(&mut serde_json::Value)| {
        let mut v = good.clone();
        f(&mut v);
        let p = dir.path().join(format!("{name}.json"));
        std::fs::write(&p, v.to_string()).unwrap();
        p.display().to_string()
    };
    for (edit, says) in [
        (edited("names", &|v| v["feature_names"][0] = "bogus".into()), "field feature_names"),
        (edited("seven", &|v| v["feature_names"].as_array_mut().unwrap().truncate(7)), "field feature_names"),
        (edited("edges", &|v| v["target"]["binning"]["edges"] = serde_json::json!([1.0, 2.0])), "field target.binning"),
        (edited("kind", &|v| v["target"]["kind"] = "smact".into()), "field target.kind"),
    ] {
        for how in [["--dataset", csv.as_str()], ["--features", r#"{"layers": 3}"#]] {
            let (code, err) = memest_bin(&["ml", "predict", "--model", &edit, how[0], how[1]]);
            assert!(code == 2 && err.contains(says), "{says} {how:?}: {code} {err}");
        }
    }

    // A device as a model file was read until memory ran out (a serve request can name one).
    let (code, err) = memest_bin(&["ml", "predict", "--model", "/dev/zero", "--features", "{}"]);
    assert!(code == 2 && err.contains("/dev/zero: not a regular file"), "{code} {err}");
    let (code, err) = memest_bin(&["util", "cv", "--dataset", &csv, "--metric", "smact", "--thresholds", "0.99,0.995"]);
    assert!(code == 2 && err.contains("every row falls in one class"), "{code} {err}");
    let (code, err) = memest_bin(&["ml", "cv", "--dataset", &csv, "--models", "tree,tree", "--folds", "500"]);
    assert!(code == 2 && err.contains("--models names tree twice"), "{err}");
    assert!(err.contains("--folds 500: expected at most the 240 usable rows"), "{err}");

    // The trainer's own `dataset` output (its `spec` column): not GPUMemNet's data or licence.
    let own = dir.path().join("own.csv");
    std::fs::write(&own, crate::ml_data::with_column(&text, "spec", "synthetic:{}")).unwrap();
    let (code, err) = memest_bin(&["ml", "train", "--dataset", own.to_str().unwrap(), "--model", "tree", "--out", m]);
    assert!(code == 0 && err.contains("your own runs") && !err.contains("CC BY-NC"), "{code} {err}");
}

/// `reproduce` is GPUMemNet's protocol, classifiers only: regressors alone gave an empty report
/// (exit 0), and a regressor beside a classifier vanished from it in silence.
#[test]
fn reproduce_refuses_regressors_alone_and_says_those_it_drops() {
    let dir = tempfile::tempdir().unwrap();
    let csv = excerpt(dir.path());
    let (code, err) = memest_bin(&["ml", "reproduce", "--dataset", &csv, "--models", "linear-reg"]);
    assert!(code == 2 && err.contains("--models linear-reg: reproduce runs GPUMemNet's protocol"), "{code} {err}");
    let (code, err) = memest_bin(&["ml", "reproduce", "--dataset", &csv, "--models", "tree,linear-reg,gbm-reg"]);
    assert!(code == 0 && err.contains("--models linear-reg, gbm-reg left out of reproduce"), "{code} {err}");
}

/// The first `n` data rows of a GPUMemNet CSV in `dir`.
fn head_of(dir: &std::path::Path, file: &str, n: usize) -> std::path::PathBuf {
    let text = std::fs::read_to_string(crate::ml_data::gpumemnet(file)).unwrap();
    let p = dir.join(format!("head-{file}"));
    std::fs::write(&p, text.lines().take(n + 1).collect::<Vec<_>>().join("\n") + "\n").unwrap();
    p
}

/// A regressor's truth is a measured peak: an OOM row's relabelled 42000 MiB (or a 0-MiB row) was
/// scored as one.
#[test]
fn predict_scores_a_regressor_on_measured_rows_only() {
    let dir = tempfile::tempdir().unwrap();
    let csv = head_of(dir.path(), "cnn_data_step1_early.csv", 200);
    let (c, m) = (csv.to_str().unwrap(), dir.path().join("reg.json"));
    let train = ["ml", "train", "--dataset", c, "--model", "forest-reg", "--trees", "5", "--out", m.to_str().unwrap()];
    let (code, err) = memest_bin(&train);
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = memest_code(&["ml", "predict", "--model", m.to_str().unwrap(), "--dataset", c, "--json"]);
    assert!(code == 0, "{err}");
    let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
    let rows = doc["predictions"].as_array().unwrap();
    // The OOM crashes and 0-MiB rows among the first 200 (those the feature set keeps).
    let left = rows.iter().filter(|r| r["truth"].is_null()).count();
    assert!(left > 0, "{doc}");
    assert!(rows.iter().all(|r| r["truth"].as_f64() != Some(42_000.0)), "no placeholder is a truth");
    let s = &doc["summary"];
    let scored = rows.len() - left;
    assert_eq!(
        (s["scored_rows"].as_u64(), s["unmeasured_rows_left_out"].as_u64()),
        (Some(scored as u64), Some(left as u64))
    );
    let pairs: Vec<(f64, f64)> =
        rows.iter().filter_map(|r| Some((r["truth"].as_f64()?, r["estimate"].as_f64().unwrap()))).collect();
    let mae = pairs.iter().map(|(t, e)| (e - t).abs()).sum::<f64>() / pairs.len() as f64;
    assert!((s["mae"].as_f64().unwrap() - mae).abs() < 1e-6, "{s}");
    let says = format!("{left} of the {} rows of {c} have no measured peak", rows.len());
    assert!(err.contains(&says) && err.contains(&format!("scored on the other {scored} only")), "{err}");
}

/// A classifier trained where every row is in one class answers that class whatever the job:
/// written, and said. A column of no format (a misspelt one) is said too.
#[test]
fn training_on_one_class_and_unknown_columns_are_said() {
    use estimators::ml::{Dataset, Examples, Family, Target};
    let dir = tempfile::tempdir().unwrap();
    let csv = excerpt(dir.path());
    let ex =
        Examples::build(&Dataset::load(std::path::Path::new(&csv)).unwrap(), &Target::memory(Family::Mlp)).unwrap();
    let text = std::fs::read_to_string(&csv).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let one: Vec<&str> = std::iter::once(lines[0])
        .chain(ex.row_ids.iter().zip(&ex.class).filter(|(_, c)| **c == ex.class[0]).map(|(r, _)| lines[*r]))
        .collect();
    let single = dir.path().join("one.csv");
    std::fs::write(&single, one.join("\n").replace("Dropout Layers", "Dropout Layerz") + "\n").unwrap();
    let (one, m) = (single.to_str().unwrap(), dir.path().join("m.json"));
    let (code, err) = memest_bin(&["ml", "train", "--dataset", one, "--model", "tree", "--out", m.to_str().unwrap()]);
    assert!(
        code == 0 && err.contains("falls in one class") && err.contains("the tree classifier learns"),
        "{code} {err}"
    );
    assert!(err.contains("column \"Dropout Layerz\" of no dataset format read here"), "{err}");
    let (code, err) = memest_bin(&["ml", "train", "--dataset", &csv, "--model", "tree", "--out", m.to_str().unwrap()]);
    assert!(code == 0 && !err.contains("one class") && !err.contains("no dataset format"), "{code} {err}");
}

/// A regressor scored on its own training CSV is in-sample on every row it scores: the rows it
/// cannot score (OOM crashes) were counted as rows scored ("trained on 45 of the rows scored
/// (60 in all)"), and the JSON summary did not say how many were in-sample.
#[test]
fn a_regressors_in_sample_rows_are_counted_over_the_rows_it_scores() {
    let dir = tempfile::tempdir().unwrap();
    let csv = excerpt_of(dir.path(), "cnn_data_step1_early.csv", 60);
    let model = dir.path().join("lr.json");
    let m = model.to_str().unwrap();
    let (code, err) = memest_bin(&["ml", "train", "--dataset", &csv, "--model", "linear-reg", "--out", m]);
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = memest_code(&["ml", "predict", "--model", m, "--dataset", &csv, "--json"]);
    assert_eq!(code, 0, "{err}");
    let summary = &serde_json::from_str::<serde_json::Value>(&out).unwrap()["summary"];
    let (scored, left_out) = (summary["scored_rows"].as_u64().unwrap(), summary["unmeasured_rows_left_out"].as_u64());
    assert!(left_out.unwrap() > 0 && scored > 0, "the excerpt has OOM rows and measured ones: {summary}");
    assert_eq!(summary["in_sample_rows"].as_u64(), Some(scored), "{summary}");
    let says = format!("was trained on all {scored} scored rows of {csv}: the summary is in-sample, not held out");
    assert!(err.contains(&says), "{err}");
}

/// `ml train --seed` on a model whose fit has no randomness is said to have no effect, as the
/// other knobs are (it was taken in silence); the repeated rows of the dataset are said once.
#[test]
fn train_says_a_seed_without_effect_and_repeated_rows() {
    let dir = tempfile::tempdir().unwrap();
    let csv = excerpt_of(dir.path(), "mlp_data_step2.csv", 60);
    let out = dir.path().join("m.json");
    let o = out.to_str().unwrap();
    for (model, seed, said) in
        [("logistic", "7", true), ("tree", "7", true), ("linear-reg", "7", true), ("forest", "7", false)]
    {
        let (code, err) = memest_bin(&["ml", "train", "--dataset", &csv, "--model", model, "--seed", seed, "--out", o]);
        assert_eq!(code, 0, "{model}: {err}");
        let says = format!("--seed 7 has no effect on a {model} model");
        assert_eq!(err.contains(&says), said, "{model}: {err}");
    }
    let (_, err) = memest_bin(&["ml", "train", "--dataset", &csv, "--model", "tree", "--out", o]);
    assert!(!err.contains("--seed"), "the default seed is not given: {err}");
    // Rows 1 and 2 again after the last: each would be trained on twice.
    let text = std::fs::read_to_string(&csv).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let dup = dir.path().join("dup.csv");
    std::fs::write(&dup, [&lines[..], &lines[1..3]].concat().join("\n")).unwrap();
    let (code, err) = memest_bin(&["ml", "train", "--dataset", dup.to_str().unwrap(), "--model", "tree", "--out", o]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(err.matches("repeat an earlier row").count(), 1, "{err}");
    assert!(
        err.contains("2 rows repeat an earlier row cell for cell (row 61 repeats row 1, row 62 repeats row 2)"),
        "{err}"
    );
}
