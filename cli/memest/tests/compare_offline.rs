//! `memest compare` on traces already made (`--reuse-traces`, no trainer): the terminal summary
//! words PEF as report.md does, a measured peak of 0 MiB is said and scored nowhere, and a
//! `--limit` above the rows is said to have no effect.

use std::path::{Path, PathBuf};

use crate::common::{jsonl_trace, shared};
use crate::support::{compare_command, metrics_json, ran};

const MIB: u64 = 1024 * 1024;

/// Three MLP rows (`three.csv`, the second's peak 0 MiB) and an output directory holding their
/// traces: the first two replayable, the third's unreadable (no capped rerun can be simulated).
fn setup(dir: &Path) -> (PathBuf, PathBuf) {
    let text = std::fs::read_to_string(shared("gpumemnet/mlp_data_step1.csv")).unwrap();
    let mut rdr = csv::Reader::from_reader(text.as_bytes());
    let header = rdr.headers().unwrap().clone();
    let mem = header.iter().position(|h| h == "Max GPU Memory (MiB)").unwrap();
    let data = dir.join("three.csv");
    let mut w = csv::Writer::from_path(&data).unwrap();
    w.write_record(&header).unwrap();
    for (i, rec) in rdr.records().take(3).enumerate() {
        let mut cells: Vec<String> = rec.unwrap().iter().map(String::from).collect();
        if i == 1 {
            cells[mem] = "0".into();
        }
        w.write_record(&cells).unwrap();
    }
    w.flush().unwrap();
    let out = dir.join("cmp");
    let traces = out.join("traces");
    std::fs::create_dir_all(&traces).unwrap();
    for row in 1..=2 {
        let trace = jsonl_trace(&[], &[('a', 1, 100 * MIB), ('a', 2, 50 * MIB), ('f', 1, 0)]);
        std::fs::write(traces.join(format!("three-{row:05}.jsonl")), trace).unwrap();
    }
    std::fs::write(traces.join("three-00003.jsonl"), "not a trace\n").unwrap();
    (data, out)
}

/// `memest compare` over `data` into `out`, traces reused; the trainer is never run.
fn compare(data: &Path, out: &Path, extra: &[&str]) -> (bool, String, String) {
    let mut cmd = compare_command(data, out, &["--reuse-traces", "--no-fake-tensor"]);
    // Any trainer run fails: every trace this test needs is already made.
    let (code, stdout, err) = ran(cmd.args(extra).env("MEMTRACE_PYTHON", "/bin/false"));
    (code == 0, stdout, err)
}

/// [`setup`] in `dir`, then [`compare`] with `extra`, which succeeds: the dataset, the output
/// directory, stdout and stderr.
fn compared(dir: &Path, extra: &[&str]) -> (PathBuf, PathBuf, String, String) {
    let (data, out) = setup(dir);
    let (ok, stdout, err) = compare(&data, &out, extra);
    assert!(ok, "{err}");
    (data, out, stdout, err)
}

fn metrics(out: &Path, estimator: &str) -> serde_json::Value {
    let all = metrics_json(out);
    let row = all.as_array().unwrap().iter().find(|g| g["group"] == "all" && g["estimator"] == estimator);
    row.unwrap().clone()
}

#[test]
fn the_summary_words_a_proxy_pef_as_the_report_does() {
    let dir = tempfile::tempdir().unwrap();
    let (_, out, stdout, _) = compared(dir.path(), &[]);
    // One row had no trace: horus's PEF is the proxy's, which is no memsim PEF.
    assert_eq!(metrics(&out, "horus")["metrics"]["pef_kind"], "proxy");
    let line = stdout.lines().find(|l| l.starts_with("horus ")).unwrap();
    assert!(line.contains("PEF(memsim) – (some runs had no trace)"), "{stdout}");
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    let row = report.lines().find(|l| l.starts_with("| horus |")).unwrap();
    assert!(row.contains("| – (some runs had no trace) |"), "{row}");
}

#[test]
fn a_measured_peak_of_zero_is_said_and_left_out_of_pef_and_mcp() {
    let dir = tempfile::tempdir().unwrap();
    let (_, out, _, err) = compared(dir.path(), &[]);
    assert!(err.contains("1 of the 3 rows have a measured peak of 0 MiB"), "{err}");
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(report.contains("- horus: 1 of 3 runs have a measured peak of 0 MiB"), "{report}");
    // Of the two rows judged, horus is under one's peak and over the other's: a PEF of 50%. The
    // 0-MiB row was judged accurate too ("estimate >= 0"), a PEF of 33.3%.
    let h = metrics(&out, "horus");
    assert_eq!(h["metrics"]["zero_truth"], 1);
    assert_eq!(h["metrics"]["under_fraction"], 0.5, "{h}");
    assert_eq!(h["pef_proxy"], 50.0, "{h}");
}

#[test]
fn a_limit_above_the_rows_is_said_to_have_no_effect() {
    let dir = tempfile::tempdir().unwrap();
    let (data, out, _, err) = compared(dir.path(), &["--limit", "10"]);
    let says = format!("--limit 10 has no effect on --dataset {}: it has 3 rows", data.display());
    assert!(err.contains(&says), "{err}");
    let (ok, _, err) = compare(&data, &out, &["--limit", "2"]);
    assert!(ok && !err.contains("--limit"), "{err}");
}

/// A row that crashed with OOM has no measured peak, but PEF and MCP score it (was it predicted?):
/// it was said to be "estimated, not scored".
#[test]
fn an_oom_crash_row_is_not_said_to_be_unscored() {
    let dir = tempfile::tempdir().unwrap();
    let (data, out) = setup(dir.path());
    let text = std::fs::read_to_string(&data).unwrap();
    let lines: Vec<String> = text
        .lines()
        .enumerate()
        .map(|(i, l)| format!("{l},{}", ["Status", "SUCCESSFUL", "SUCCESSFUL", "OOM_CRASH"][i]))
        .collect();
    std::fs::write(&data, lines.join("\n")).unwrap();
    let (ok, _, err) = compare(&data, &out, &[]);
    assert!(ok, "{err}");
    assert!(!err.contains("no measured peak (truth)"), "{err}");
    assert_eq!(metrics(&out, "horus")["metrics"]["estimated"], 3);
}

/// An ML model asked about rows outside the range it was trained on: `memest estimate` and
/// `ml predict` warn per feature, and compare said nothing of any row. Each row now carries what
/// `estimate` would say of it (runs.jsonl), and stderr counts them and shows the first few.
#[test]
fn ml_rows_outside_the_training_range_are_said_per_row() {
    let dir = tempfile::tempdir().unwrap();
    // A tree trained on 20 rows of the step-2 MLP CSV.
    let text = std::fs::read_to_string(shared("gpumemnet/mlp_data_step2.csv")).unwrap();
    let train = dir.path().join("train.csv");
    std::fs::write(&train, text.lines().take(21).collect::<Vec<_>>().join("\n")).unwrap();
    let model = dir.path().join("tree.json");
    let (t, m) = (train.to_str().unwrap(), model.to_str().unwrap());
    let (ok, _, err) =
        crate::support::memest(&["ml", "train", "--dataset", t, "--family", "mlp", "--model", "tree", "--out", m]);
    assert!(ok, "{err}");
    // Seven of its rows, six at a batch of 100000 (no longer training rows, and outside).
    let mut rdr = csv::Reader::from_reader(text.as_bytes());
    let header = rdr.headers().unwrap().clone();
    let batch = header.iter().position(|h| h == "Batch Size").unwrap();
    let data = dir.path().join("far.csv");
    let mut w = csv::Writer::from_path(&data).unwrap();
    w.write_record(&header).unwrap();
    for (i, rec) in rdr.records().take(7).enumerate() {
        let mut cells: Vec<String> = rec.unwrap().iter().map(String::from).collect();
        if i > 0 {
            cells[batch] = "100000".into();
        }
        w.write_record(&cells).unwrap();
    }
    w.flush().unwrap();
    let out = dir.path().join("cmp");
    std::fs::create_dir_all(out.join("traces")).unwrap();
    for row in 1..=7 {
        let trace = jsonl_trace(&[], &[('a', 1, 100 * MIB)]);
        std::fs::write(out.join("traces").join(format!("far-{row:05}.jsonl")), trace).unwrap();
    }
    let (ok, _, err) = compare(&data, &out, &["--ml-model", m, "--ml-include-training-rows"]);
    assert!(ok, "{err}");
    let recs = crate::support::records(&out);
    for (i, r) in recs.iter().enumerate() {
        let ml = &r["estimates"]["ml"];
        assert!(ml["device_bytes"].as_u64().is_some(), "{ml}");
        let warnings: Vec<&str> =
            ml["warnings"].as_array().map_or(vec![], |a| a.iter().flat_map(|w| w.as_str()).collect());
        if i == 0 {
            assert!(warnings.is_empty(), "a training row is inside its range: {warnings:?}");
            continue;
        }
        // `memest estimate`'s words, naming the model and the row.
        let at = format!("{m}: {} row {}: ", data.display(), r["id"].as_str().unwrap());
        let says = format!("{at}feature \"batch_size\" is 100000, outside the training range");
        assert!(warnings.iter().any(|w| w.starts_with(&says)), "{says} in {warnings:?}");
    }
    assert!(
        err.contains("memest: warning: ml: 6 of the 7 rows lie outside the range their ML model was trained on")
            && err.contains("; the first 5:"),
        "{err}"
    );
    let shown: std::collections::BTreeSet<&str> = err
        .lines()
        .filter(|l| l.contains("outside the training range"))
        .filter_map(|l| l.split(" row ").nth(1)?.split(':').next())
        .collect();
    assert_eq!(shown.len(), 5, "{err}");
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(report.contains("6 of the 7 rows lie outside the range"), "{report}");
}

/// What compare took in silence: an --exclude-runs file that matches no row, rows repeated cell
/// for cell (scored twice), and the optimizer each run was traced with (safety labelled every
/// margin "fp32 adam").
#[test]
fn compare_says_what_it_used_and_records_the_optimizer() {
    let dir = tempfile::tempdir().unwrap();
    let (data, out, _, err) = compared(dir.path(), &[]);
    assert!(!err.contains("--exclude-runs") && !err.contains("repeat an earlier row"), "{err}");
    let records = crate::support::records(&out);
    assert!(records.iter().all(|r| r["optimizer"] == "adam" && r["amp"] == "fp32"), "{records:?}");
    // Runs of other rows: nothing excluded, said.
    let other = dir.path().join("other.jsonl");
    let mut run = records[0].clone();
    (run["id"], run["digest"]) = ("elsewhere-00001".into(), "0000000000000000".into());
    std::fs::write(&other, run.to_string() + "\n").unwrap();
    let (ok, _, err) = compare(&data, &out, &["--exclude-runs", other.to_str().unwrap()]);
    assert!(ok && err.contains("--exclude-runs has no effect: none of the 1 runs of"), "{err}");
    // Its own runs exclude rows: not said.
    let own = dir.path().join("own.jsonl");
    std::fs::write(&own, records[0].to_string() + "\n").unwrap();
    let (ok, _, err) = compare(&data, &out, &["--exclude-runs", own.to_str().unwrap()]);
    assert!(ok && !err.contains("--exclude-runs has no effect"), "{err}");
    // Row 3 a copy of row 1: said once, with the rows.
    let text = std::fs::read_to_string(&data).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    std::fs::write(&data, [lines[0], lines[1], lines[2], lines[1]].join("\n") + "\n").unwrap();
    let (ok, _, err) = compare(&data, &out, &[]);
    assert!(ok, "{err}");
    assert_eq!(err.matches("repeat an earlier row").count(), 1, "{err}");
    assert!(err.contains("three.csv: 1 rows repeat an earlier row cell for cell (row 3 repeats row 1)"), "{err}");
    // A measured peak past any device (1e12 MiB) is refused, naming the file, row and column.
    let mut rdr = csv::Reader::from_reader(text.as_bytes());
    let header = rdr.headers().unwrap().clone();
    let mem = header.iter().position(|h| h == "Max GPU Memory (MiB)").unwrap();
    let mut w = csv::Writer::from_path(&data).unwrap();
    w.write_record(&header).unwrap();
    for rec in rdr.records() {
        let mut cells: Vec<String> = rec.unwrap().iter().map(String::from).collect();
        cells[mem] = "1e12".into();
        w.write_record(&cells).unwrap();
    }
    w.flush().unwrap();
    let (ok, _, err) = compare(&data, &out, &[]);
    assert!(
        !ok && err.contains("three.csv: row 1: column \"Max GPU Memory (MiB)\"") && err.contains("256 TiB"),
        "{err}"
    );
}
