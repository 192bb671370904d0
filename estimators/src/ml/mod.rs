//! GPUMemNet-style ML estimators: classifiers over memory (or utilisation) bins and regressors
//! of the raw target, trained on GPUMemNet's CSVs.
//!
//! Pipeline: [`dataset::Dataset::load`] (the crate's one dataset loader, [`crate::dataset`]) → [`examples::Examples::build`] (GPUMemNet's feature set
//! for the family, its bins, its row filters) → [`protocol`] (GPUMemNet's own 70/20/10 split and
//! 3-fold KFold, or a stratified seeded 3-fold CV under a stratified held-out test set) over the
//! model families in [`models`]. [`modelfile`] persists one trained [`models::Pipeline`].
//!
//! Models trained on the CC BY-NC GPUMemNet data are non-commercial build outputs and are never
//! committed.

pub mod bins;
pub mod cart;
pub mod dataset;
pub mod error;
pub mod examples;
pub mod features;
pub mod job;
pub mod kernel_features;
pub mod mlp;
pub mod modelfile;
pub mod models;
pub mod protocol;
pub mod render;
pub mod scale;
pub mod score;
pub mod split;
pub mod utilization;

pub use bins::{Binning, Closed, OOM_RELABEL_MIB};
pub use dataset::{Dataset, DatasetRow, Family, Layer};
pub use error::MlError;
pub use examples::{Examples, Target, TargetKind};
pub use kernel_features::KernelFeatures;
pub use models::{ModelKind, Pipeline, TrainConfig};
