//! Kernel-statistics features: the `k_` columns `python -m memtrace_trainer kernel-stats
//! --gpumemnet CSV --out FILE` estimates from each row's symbolic training step, joined onto the
//! dataset rows by `Filename` and appended to every model family's feature vector.
//!
//! Cells are parsed when a dataset row asks for them, so rows the dataset does not use (extra
//! keys, or rows its filters drop) may be anything, including the trainer's `status=error` rows.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::error::MlError;

/// The join key, shared with the GPUMemNet CSVs.
pub const KEY: &str = "Filename";
/// Prefix of the feature columns; every other column is carried along, not learned from.
pub const PREFIX: &str = "k_";

/// One row of the feature file, cells unparsed.
#[derive(Debug, Clone)]
struct Entry {
    /// 1-based data row number in the feature file.
    row: usize,
    /// The `k_` cells, in [`KernelFeatures::columns`] order.
    cells: Vec<String>,
    /// The trainer's `status` and `error` cells, quoted in messages about this row.
    status: Option<String>,
}

/// A loaded kernel-statistics file.
#[derive(Debug, Clone)]
pub struct KernelFeatures {
    /// The file (for messages).
    pub path: PathBuf,
    /// Its `k_` column names, in file order: the names of the appended features.
    pub columns: Vec<String>,
    rows: HashMap<String, Entry>,
}

impl KernelFeatures {
    /// Reads a kernel-statistics CSV: a `Filename` column and at least one `k_` column.
    pub fn load(path: &Path) -> Result<KernelFeatures, MlError> {
        let file = std::fs::File::open(path).map_err(|source| MlError::Io { path: path.to_path_buf(), source })?;
        Self::from_reader(path, file)
    }

    /// Parses CSV text from any reader; `path` is only used in messages.
    pub fn from_reader(path: &Path, reader: impl std::io::Read) -> Result<KernelFeatures, MlError> {
        let csv_err = |source| MlError::Csv { path: path.to_path_buf(), source };
        let mut rdr = csv::ReaderBuilder::new().flexible(false).from_reader(reader);
        let headers = rdr.headers().map_err(csv_err)?.clone();
        let missing = |column: &str| MlError::MissingColumn {
            path: path.to_path_buf(),
            column: column.to_string(),
            needed_for: "joining kernel-statistics features onto dataset rows",
        };
        let key = headers.iter().position(|h| h.trim() == KEY).ok_or_else(|| missing(KEY))?;
        let feature_cols: Vec<usize> = (0..headers.len()).filter(|&i| headers[i].trim().starts_with(PREFIX)).collect();
        if feature_cols.is_empty() {
            return Err(missing("k_* (at least one)"));
        }
        let status_col = headers.iter().position(|h| h.trim() == "status");
        let error_col = headers.iter().position(|h| h.trim() == "error");
        let mut rows: HashMap<String, Entry> = HashMap::new();
        for (i, rec) in rdr.records().enumerate() {
            let rec = rec.map_err(csv_err)?;
            let row = i + 1;
            let cell = |c: usize| rec.get(c).unwrap_or("").trim().to_string();
            let status = status_col.map(|s| {
                let err = error_col.map(cell).unwrap_or_default();
                if err.is_empty() {
                    cell(s)
                } else {
                    format!("{}: {err}", cell(s))
                }
            });
            let entry = Entry { row, cells: feature_cols.iter().map(|&c| cell(c)).collect(), status };
            if let Some(first) = rows.insert(cell(key), entry) {
                return Err(MlError::BadCell {
                    path: path.to_path_buf(),
                    row,
                    column: KEY.into(),
                    message: format!("{:?} already appears in row {}; keys must be unique", cell(key), first.row),
                });
            }
        }
        Ok(KernelFeatures {
            path: path.to_path_buf(),
            columns: feature_cols.iter().map(|&c| headers[c].trim().to_string()).collect(),
            rows,
        })
    }

    /// Number of rows in the file.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// True when the file has no data rows.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The `k_` values of the dataset row keyed `filename` (data row `row` of `dataset`).
    pub fn lookup(&self, filename: &str, dataset: &Path, row: usize) -> Result<Vec<f64>, MlError> {
        let entry = self.rows.get(filename).ok_or_else(|| MlError::MissingKey {
            path: self.path.clone(),
            column: KEY.into(),
            key: filename.to_string(),
            dataset: dataset.to_path_buf(),
            row,
        })?;
        entry
            .cells
            .iter()
            .zip(&self.columns)
            .map(|(cell, column)| match cell.parse::<f64>() {
                Ok(v) if v.is_finite() => Ok(v),
                _ => Err(MlError::BadCell {
                    path: self.path.clone(),
                    row: entry.row,
                    column: column.clone(),
                    message: format!(
                        "{KEY} {filename:?}: expected a finite number, found {cell:?}{}",
                        entry.status.as_deref().map(|s| format!(" (status {s})")).unwrap_or_default()
                    ),
                }),
            })
            .collect()
    }
}
