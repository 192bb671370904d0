//! The ML estimators' dataset: the rows of the crate's one loader ([`crate::dataset::load`]),
//! checked for what GPUMemNet's feature sets need (`Depth` and `Activation Function` in every
//! row, at least one row). GPUMemNet CSVs (`mlp_data_step1/2.csv`, `cnn_data_step1*.csv`,
//! transformer CSVs) and the trainer's `dataset` output load alike.
//!
//! Layer-type counts are always taken from the parsed `Activations-Params`, never from the
//! per-type count columns, because step-1 MLP files have no such columns and the family decision
//! must see the same layer list as the features.

use std::path::{Path, PathBuf};

pub use crate::dataset::{DatasetRow, Utilization};
pub use crate::features::{Family, Layer};

use super::error::MlError;

/// Columns every ML feature set needs in every row, beyond those the dataset format requires.
pub const ML_COLUMNS: [&str; 2] = ["Depth", "Activation Function"];

/// A loaded dataset.
#[derive(Debug, Clone)]
pub struct Dataset {
    /// The file it came from (for error messages and reports).
    pub path: PathBuf,
    /// All rows, in file order; `row` is each one's 1-based data row number.
    pub rows: Vec<DatasetRow>,
    /// What the header leaves unsaid ([`crate::dataset::Loaded::warnings`]), for the caller to say.
    pub warnings: Vec<String>,
}

impl Dataset {
    /// Reads a dataset. Every malformed cell is an error naming the file, the data row and the
    /// column.
    pub fn load(path: &Path) -> Result<Dataset, MlError> {
        Self::from_rows(path, crate::dataset::load(path, &ML_COLUMNS)?)
    }

    /// Parses CSV text from any reader; `path` names it in messages.
    pub fn from_reader(path: &Path, reader: impl std::io::Read) -> Result<Dataset, MlError> {
        Self::from_rows(path, crate::dataset::read(path, reader, &ML_COLUMNS)?)
    }

    fn from_rows(path: &Path, loaded: crate::dataset::Loaded) -> Result<Dataset, MlError> {
        let crate::dataset::Loaded { rows, warnings } = loaded;
        if rows.is_empty() {
            return Err(MlError::Empty {
                path: path.to_path_buf(),
                reason: "the file has a header but no data rows".into(),
            });
        }
        Ok(Dataset { path: path.to_path_buf(), rows, warnings })
    }

    /// The single family of all rows that list layers; an error if the file mixes families or
    /// no row lists any layer.
    pub fn family(&self) -> Result<Family, MlError> {
        let mut seen: Vec<Family> =
            self.rows.iter().filter(|r| !r.features.layers.is_empty()).map(|r| r.family).collect();
        seen.sort();
        seen.dedup();
        match seen.as_slice() {
            [one] => Ok(*one),
            [] => Err(MlError::Empty {
                path: self.path.clone(),
                reason: "no row lists any layer in Activations-Params".into(),
            }),
            _ => Err(MlError::MixedFamilies {
                path: self.path.clone(),
                found: seen.iter().map(|f| f.name()).collect::<Vec<_>>().join(", "),
            }),
        }
    }
}
