//! Integration tests of the estimators crate (one binary; one module per concept).

/// Shared helpers: shared-data and venv paths (failing loudly), trace builders.
mod common;

/// Metrics (MRE, PEF, MCP, percentiles, bins, F1, latency) against hand-computed cases.
mod metrics;
/// Horus reproduces GPUMemNet's published numbers; analytic terms.
mod analytic;
/// Feature parsing and the family rule.
mod features;
/// GPUMemNet CSV reading and seeded subsets.
mod dataset;
/// Calibration fit, held-out evaluation and profile rewriting.
mod calibrate;
/// Symbolic replay, capped reruns, live-peak and FakeTensor-style peaks on hand-built traces.
mod symbolic;
/// The memest binary: JSON contract, errors, compare through the trainer.
mod cli;
/// Property tests of metric invariants.
mod props;
