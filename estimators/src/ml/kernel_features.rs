//! Kernel-statistics features: the `k_` columns `python -m memtrace_trainer kernel-stats
//! --gpumemnet CSV --out FILE` estimates from each row's symbolic training step, joined onto the
//! dataset rows by `Filename` and appended to every model family's feature vector.
//!
//! Cells are parsed when a dataset row asks for them, so rows the dataset does not use (extra
//! keys, or rows its filters drop) may be anything, including the trainer's `status=error` rows.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::error::MlError;
use crate::dataset::DatasetRow;

/// The join key, shared with the GPUMemNet CSVs.
pub const KEY: &str = "Filename";
/// Prefix of the feature columns; every other column is carried along, not learned from.
pub const PREFIX: &str = "k_";
/// The step settings `kernel-stats` computed a file with, one value per file.
pub const SETTINGS: [&str; 3] = ["optimizer", "amp", "device"];

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
    /// The step settings the file was computed with ([`SETTINGS`] present in it), as
    /// `(column, value)`: said beside every result, since a dataset's runs had their own.
    pub settings: Vec<(String, String)>,
    /// Columns of no kind the file has (not `Filename`, a `k_` feature, `status`, `error` or a
    /// setting): not read, and said (a misspelt `kflops` is no feature).
    pub ignored: Vec<String>,
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
        if let Some((column, message)) = crate::columns::column_twice(&headers) {
            return Err(MlError::BadCell { path: path.to_path_buf(), row: 0, column, message });
        }
        let key = headers.iter().position(|h| h.trim() == KEY).ok_or_else(|| missing(KEY))?;
        let feature_cols: Vec<usize> = (0..headers.len()).filter(|&i| headers[i].trim().starts_with(PREFIX)).collect();
        if feature_cols.is_empty() {
            return Err(missing("k_* (at least one)"));
        }
        let status_col = headers.iter().position(|h| h.trim() == "status");
        let error_col = headers.iter().position(|h| h.trim() == "error");
        let setting_cols: Vec<(usize, &str)> =
            SETTINGS.iter().filter_map(|&n| headers.iter().position(|h| h.trim() == n).map(|c| (c, n))).collect();
        // Per setting: its value and the first row that gave it.
        let mut settings: Vec<Option<(String, usize)>> = vec![None; setting_cols.len()];
        let mut rows: HashMap<String, Entry> = HashMap::new();
        for (i, rec) in rdr.records().enumerate() {
            let rec = rec.map_err(csv_err)?;
            let row = i + 1;
            let cell = |c: usize| rec.get(c).unwrap_or("").trim().to_string();
            // One file, one step: features of an SGD step beside an Adam step's would be joined
            // onto runs that trained one way (kernel-stats itself refuses to mix them).
            for (k, &(c, name)) in setting_cols.iter().enumerate() {
                let value = cell(c);
                match &settings[k] {
                    Some((first, at)) if *first != value => {
                        return Err(MlError::BadCell {
                            path: path.to_path_buf(),
                            row,
                            column: name.into(),
                            message: format!(
                                "{value:?} here but {first:?} in row {at}: a kernel-statistics file holds one step's \
                                 settings (compute one file per setting)"
                            ),
                        })
                    }
                    Some(_) => {}
                    None => settings[k] = Some((value, row)),
                }
            }
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
        let known =
            |h: &str| h == KEY || h.starts_with(PREFIX) || h == "status" || h == "error" || SETTINGS.contains(&h);
        Ok(KernelFeatures {
            path: path.to_path_buf(),
            ignored: headers.iter().map(str::trim).filter(|h| !known(h)).map(str::to_string).collect(),
            columns: feature_cols.iter().map(|&c| headers[c].trim().to_string()).collect(),
            settings: setting_cols
                .iter()
                .zip(settings)
                .filter_map(|(&(_, name), v)| v.map(|(v, _)| (name.to_string(), v)))
                .collect(),
            rows,
        })
    }

    /// What the file's settings say against the runs of `rows` it is joined onto, a line per
    /// setting that differs: the runs' optimizer (GPUMemNet's: Adam) and precision (fp32), and
    /// their GPU where the dataset names it; then the columns the file holds and nothing reads.
    pub fn mismatches(&self, rows: &[DatasetRow]) -> Vec<String> {
        let ignored = (!self.ignored.is_empty()).then(|| {
            format!(
                "{}: columns {:?} ignored: a kernel-statistics file holds {KEY}, {PREFIX}* features, status, error and \
                 the step's settings ({})",
                self.path.display(),
                self.ignored,
                SETTINGS.join(", ")
            )
        });
        self.settings
            .iter()
            .filter_map(|(name, value)| {
                let ran = |r: &DatasetRow| -> Option<String> {
                    match name.as_str() {
                        "optimizer" => Some(r.optimizer.clone().unwrap_or_else(|| "adam".into())),
                        "amp" => Some(r.amp.clone().unwrap_or_else(|| "fp32".into())),
                        _ => r.gpu.clone(),
                    }
                };
                let other: Vec<&DatasetRow> = rows.iter().filter(|r| ran(r).is_some_and(|v| v != *value)).collect();
                let first = other.first()?;
                Some(format!(
                    "{}: its statistics are of a step with {name} {value:?}, but {} of {} dataset rows ran with \
                     another (row {}: {:?}): the features describe a step those runs did not take",
                    self.path.display(),
                    other.len(),
                    rows.len(),
                    first.row,
                    ran(first).unwrap_or_default()
                ))
            })
            .chain(ignored)
            .collect()
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
        // A row whose statistics were not computed may still hold numbers (a partial row): its
        // status says whether they are the step's.
        if let Some(status) = entry.status.as_deref().filter(|s| *s != "ok") {
            return Err(MlError::BadCell {
                path: self.path.clone(),
                row: entry.row,
                column: "status".into(),
                message: format!(
                    "{KEY} {filename:?}: expected status ok, found {status:?}: its statistics were not computed"
                ),
            });
        }
        entry
            .cells
            .iter()
            .zip(&self.columns)
            .map(|(cell, column)| match cell.parse::<f64>().map(|v| (v, super::features::out_of_domain(column, v))) {
                Ok((v, None)) => Ok(v),
                Ok((v, Some(expected))) if v.is_finite() => Err(MlError::BadCell {
                    path: self.path.clone(),
                    row: entry.row,
                    column: column.clone(),
                    message: format!("{KEY} {filename:?}: expected {expected}, found {v}"),
                }),
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
