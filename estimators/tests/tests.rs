//! Integration tests of the estimators crate (one binary; one module per concept).

/// Shared helpers: shared-data and venv paths (failing loudly), trace builders.
mod common;

/// Horus reproduces GPUMemNet's published numbers; analytic terms.
mod analytic;
/// Calibration fit, held-out evaluation and profile rewriting.
mod calibrate;
/// The memest binary: JSON contract, errors, compare through the trainer.
mod cli;
/// `memest compare` on the trainer's dataset output (specs, label columns) and with ML model files.
mod compare_trainer;
/// GPUMemNet CSV reading (one loader for compare and the ML estimators) and seeded subsets.
mod dataset;
/// Feature parsing and the family rule.
mod features;
/// Metrics (MRE, PEF, MCP, percentiles, bins, F1, latency) against hand-computed cases.
mod metrics;
/// Property tests of metric invariants.
mod props;
/// The safe number: conformal margins per family, the profile table, margin selection.
mod safety;
/// Symbolic replay, capped reruns, live-peak and FakeTensor-style peaks on hand-built traces.
mod symbolic;

/// The `memest ml` command module itself, so `ml_cli` can drive it without a subprocess.
#[path = "../src/bin/memest/ml.rs"]
mod memest_ml;
/// The `memest util` command module itself, driven by `ml_util`.
#[path = "../src/bin/memest/util.rs"]
mod memest_util;
/// ML estimators: the `memest ml` subcommands, compiled in from the binary's module.
mod ml_cli;
/// ML estimators: GPUMemNet CSV loading, bins, feature sets, error messages.
mod ml_data;
/// ML estimators: model families learn, are deterministic, round-trip, never see held-out rows.
mod ml_job; // trainer features JSON -> the same ML feature vector as the dataset row
mod ml_models;
/// ML estimators: seeded and stratified splits, the no-leak CV plan, split properties.
mod ml_split;
/// GPU utilisation classes (issue 7): bins, CV summary, `memest util cv`.
mod ml_util;
