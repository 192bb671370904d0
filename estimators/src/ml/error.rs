//! The ML estimators' error type.

use std::path::PathBuf;

/// Everything that can go wrong loading GPUMemNet-style data, training, evaluating or persisting
/// an ML estimator.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MlError {
    /// A file could not be opened, read, written or renamed.
    #[error("{path}: {source}")]
    Io {
        /// The file involved.
        path: PathBuf,
        /// The underlying I/O error.
        source: std::io::Error,
    },
    /// A dataset did not load: the crate's one loader names the file, the data row and the column
    /// ([`crate::error::EstimateError::Csv`]).
    #[error(transparent)]
    Dataset(crate::error::EstimateError),
    /// The CSV reader rejected the file (bad quoting, ragged rows, invalid UTF-8).
    #[error("{path}: CSV error: {source}")]
    Csv {
        /// The CSV file.
        path: PathBuf,
        /// The underlying parser error.
        source: csv::Error,
    },
    /// A column that a joined file (kernel features) needs is absent from its header.
    #[error("{path}: missing column {column:?} (needed for {needed_for})")]
    MissingColumn {
        /// The CSV file.
        path: PathBuf,
        /// The column name that was expected in the header.
        column: String,
        /// What the column is needed for.
        needed_for: &'static str,
    },
    /// One cell could not be parsed as the expected type.
    #[error("{path}: row {row}, column {column:?}: {message}")]
    BadCell {
        /// The CSV file.
        path: PathBuf,
        /// 1-based data row number (the header is row 0).
        row: usize,
        /// The column name.
        column: String,
        /// What was found and what was expected.
        message: String,
    },
    /// A dataset row has no row in a file joined onto the dataset by key.
    #[error("{path}: no row with {column} {key:?} (needed by {dataset}, data row {row})")]
    MissingKey {
        /// The joined file.
        path: PathBuf,
        /// The key column.
        column: String,
        /// The key value the dataset row has.
        key: String,
        /// The dataset.
        dataset: PathBuf,
        /// 1-based data row number in the dataset.
        row: usize,
    },
    /// A model file parsed but its parts disagree (edited by hand, or damaged): its feature
    /// names, the scaler's width, its bins, its target, or a model body that would panic or loop
    /// (an index out of range, a tree node pointing back, a zero deviation).
    #[error("{path}: field {field}: {expected}")]
    ModelFileField {
        /// The model file.
        path: PathBuf,
        /// The field at fault.
        field: &'static str,
        /// What was found and what was expected.
        expected: String,
    },
    /// The file parsed but holds no usable rows for the requested task.
    #[error("{path}: no usable rows ({reason})")]
    Empty {
        /// The CSV file.
        path: PathBuf,
        /// Why every row was excluded.
        reason: String,
    },
    /// The rows span several model families where one was required.
    #[error("{path}: rows mix model families ({found}); split the file per family")]
    MixedFamilies {
        /// The CSV file.
        path: PathBuf,
        /// The families seen, e.g. "mlp, cnn".
        found: String,
    },
    /// A model or protocol was asked for something its inputs cannot give (e.g. fewer rows of a
    /// class than folds, a feature vector of the wrong width).
    #[error("{0}")]
    Invalid(String),
    /// A linfa learner failed to fit.
    #[error("{model}: fit failed: {message}")]
    Fit {
        /// The model family name.
        model: &'static str,
        /// The learner's error text.
        message: String,
    },
    /// A model file could not be encoded or decoded.
    #[error("{path}: not an ML model file as `memest ml train` writes one: {source}")]
    ModelFile {
        /// The model file.
        path: PathBuf,
        /// The JSON error.
        source: serde_json::Error,
    },
    /// A model file was written by an incompatible version of this format.
    #[error("{path}: model file format version {found}, this build reads version {expected}")]
    ModelFileVersion {
        /// The model file.
        path: PathBuf,
        /// The version in the file.
        found: u32,
        /// The version this build writes and reads.
        expected: u32,
    },
}

impl From<crate::error::EstimateError> for MlError {
    /// A dataset loader error; a file that cannot be read stays [`MlError::Io`].
    fn from(e: crate::error::EstimateError) -> MlError {
        match e {
            crate::error::EstimateError::Io { path, source, .. } => MlError::Io { path, source },
            other => MlError::Dataset(other),
        }
    }
}
