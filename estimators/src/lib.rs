//! memest library: estimators of a training job's GPU memory (analytic, FakeTensor baseline,
//! symbolic, ML), their calibration, and batch comparison with the field's metrics.

pub mod analytic;
pub mod calibrate;
mod cells;
mod columns;
pub mod compare;
pub mod dataset;
pub mod error;
pub mod estimate;
pub mod estimate_file;
pub mod estimate_text;
pub mod features;
pub mod features_file;
pub mod metrics;
pub mod ml;
pub mod plots;
pub mod report;
pub mod rows;
mod runs_file;
pub mod safety;
pub mod symbolic;
pub mod trace_jobs;
pub mod tracefile;

pub use error::{EstimateError, Result};
