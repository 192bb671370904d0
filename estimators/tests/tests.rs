//! Integration tests of the estimators crate (one binary; one module per concept).

/// Shared helpers: shared-data and venv paths (failing loudly), trace builders.
mod common;

/// Horus reproduces GPUMemNet's published numbers; analytic terms.
mod analytic;
/// Calibration fit, held-out evaluation and profile rewriting.
mod calibrate;
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

/// ML estimators: damaged model files refused at load, naming the field.
mod ml_damaged;
/// ML estimators: GPUMemNet CSV loading, bins, feature sets, error messages.
mod ml_data;
/// ML estimators: model families learn, are deterministic, round-trip, never see held-out rows.
mod ml_job; // trainer features JSON -> the same ML feature vector as the dataset row
mod ml_models;
/// ML estimators: seeded and stratified splits, the no-leak CV plan, split properties.
mod ml_split;
