//! The memest command end to end (one binary; one module per concept).

/// The memest binary: JSON contract, errors, compare through the trainer.
mod cli;
/// `memest compare` on traces already made: the summary's PEF, 0-MiB truths, `--limit`.
mod compare_offline;
/// `memest compare` on the trainer's dataset output (specs, label columns) and with ML model files.
mod compare_trainer;
/// What estimate makes of its inputs: one library key of two, huge batches, the capacity's need, plain-meta traces.
mod estimate_inputs;
/// The features file `estimate --features` reads: unknown fields and unusable layers said, wrong shapes refused.
mod features_file;
/// The profile fits (`memest safety`, `memest calibrate`): held-out honesty, what they drop and refuse.
mod fits;
/// ML estimators: the `memest ml` subcommands, driven through the command's library.
mod ml_cli;
/// ML predictions outside the training range, negative ones, impossible features, the feature names.
mod ml_inputs;
/// GPU utilisation classes (issue 7): bins, CV summary, `memest util cv`.
mod ml_utilization;
/// No output replaces an input.
mod outputs;
/// `memest render` refuses verdict numbers that contradict each other.
mod render;
/// A trace converted from a snapshot: its caveats said, a state-only one refused under --strict.
mod snapshot_caveats;
/// Running the memest binary (`memest`, `memest_compare`) and reading what compare wrote.
mod support;
/// A need no device holds (a memory fraction of 0): null with its reason, never 2^64 B.
mod unbounded;

/// Shared-data and venv paths (failing loudly) and trace builders, from the estimators' tests.
#[path = "../../../estimators/tests/common.rs"]
#[allow(dead_code)]
mod common;

mod ml_data {
    /// A GPUMemNet CSV under ../shared/data/gpumemnet.
    pub fn gpumemnet(file: &str) -> std::path::PathBuf {
        crate::common::shared(&format!("gpumemnet/{file}"))
    }

    /// CSV `text` with one more column, `name`, holding `value` in every row.
    pub fn with_column(text: &str, name: &str, value: &str) -> String {
        let rows = text.lines().enumerate().map(|(i, l)| format!("{l},{}", if i == 0 { name } else { value }));
        rows.collect::<Vec<_>>().join("\n")
    }
}
