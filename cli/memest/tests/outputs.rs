//! No output replaces an input: `calibrate --write` and `safety --write` over a runs file, and
//! `compare --out` where the --dataset or the --exclude-runs file lies, each refused naming both
//! paths, the input kept.

use crate::common::shared;
use crate::fits::runs_jsonl;
use crate::support::{memest, memest_compare};

#[test]
fn an_output_that_is_an_input_is_refused_naming_both() {
    let dir = tempfile::tempdir().unwrap();
    let runs = dir.path().join("in.jsonl");
    let text = runs_jsonl(120);
    std::fs::write(&runs, &text).unwrap();
    let other = dir.path().join("other.jsonl");
    std::fs::write(&other, runs_jsonl(3).replace("\"batch\":1", "\"batch\":2")).unwrap();
    let (r, o) = (runs.to_str().unwrap(), other.to_str().unwrap());
    // The runs became a TOML profile (calibrate), or a profile with a [safety] table (safety).
    let link = dir.path().join("link.jsonl");
    std::os::unix::fs::symlink(&runs, &link).unwrap();
    for (args, out) in [
        (vec!["calibrate", r, o, "--write", r], r),
        (vec!["safety", o, r, "--miss-rate", "0.1", "--write", r], r),
        (vec!["calibrate", r, "--write", link.to_str().unwrap()], link.to_str().unwrap()),
    ] {
        let (ok, _, err) = memest(&args);
        let says = format!("--write {out} is the runs file {r}: writing it would destroy that input");
        assert!(!ok && err.contains(&says), "{args:?}: {err}");
        assert_eq!(std::fs::read_to_string(&runs).unwrap(), text, "{args:?}: the runs are kept");
    }
    // compare: --out holds the dataset (as its runs.csv) or the runs to exclude (its runs.jsonl).
    let rows: Vec<String> = std::fs::read_to_string(shared("gpumemnet/mlp_data_step1.csv"))
        .unwrap()
        .lines()
        .take(3)
        .map(String::from)
        .collect();
    let csv = rows.join("\n") + "\n";
    let dd = dir.path().join("dd");
    std::fs::create_dir_all(&dd).unwrap();
    let data = dd.join("runs.csv");
    std::fs::write(&data, &csv).unwrap();
    let (d, out) = (data.to_str().unwrap(), dd.to_str().unwrap());
    let (ok, _, err) = memest_compare(&data, &dd, &["--no-fake-tensor"]);
    assert!(!ok && err.contains(&format!("--out {out}: its file {out}/runs.csv is the --dataset {d}")), "{err}");
    assert_eq!(std::fs::read_to_string(&data).unwrap(), csv, "the dataset is kept");
    assert!(!dd.join("report.md").exists(), "nothing written");
    let exclude = dd.join("runs.jsonl");
    std::fs::write(&exclude, &text).unwrap();
    let elsewhere = dir.path().join("two.csv");
    std::fs::write(&elsewhere, &csv).unwrap();
    let x = exclude.to_str().unwrap();
    let (ok, _, err) = memest_compare(&elsewhere, &dd, &["--exclude-runs", x]);
    assert!(!ok && err.contains(&format!("its file {x} is the --exclude-runs file {x}")), "{err}");
    assert_eq!(std::fs::read_to_string(&exclude).unwrap(), text, "the runs are kept");
}
