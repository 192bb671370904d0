//! Turning a loaded CSV into a feature matrix and labels for one prediction target.

use std::collections::BTreeMap;

use ndarray::Array2;
use serde::{Deserialize, Serialize};

use super::bins::{Binning, OOM_RELABEL_MIB};
use super::dataset::{Dataset, DatasetRow, Family};
use super::error::MlError;
use super::features::{self, RowIssue};
use super::kernel_features::KernelFeatures;

/// What is predicted from the features.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TargetKind {
    /// `Max GPU Memory (MiB)`, OOM rows relabelled to [`OOM_RELABEL_MIB`].
    MemoryMib,
    /// DCGM SM activity (`Avg SMACT`).
    Smact,
    /// DCGM SM occupancy (`Avg SMOCC`).
    Smocc,
}

impl TargetKind {
    /// Short name for reports.
    pub fn name(self) -> &'static str {
        match self {
            TargetKind::MemoryMib => "memory_mib",
            TargetKind::Smact => "smact",
            TargetKind::Smocc => "smocc",
        }
    }
}

/// A target column plus the bins its classifiers predict.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Target {
    /// The column predicted.
    pub kind: TargetKind,
    /// Its class bins.
    pub binning: Binning,
}

impl Target {
    /// GPUMemNet's memory target and bins for a family.
    pub fn memory(family: Family) -> Target {
        Target { kind: TargetKind::MemoryMib, binning: Binning::memory_for(family) }
    }
}

/// Feature matrix and labels, one row per usable CSV row.
#[derive(Debug, Clone)]
pub struct Examples {
    /// Family of every row.
    pub family: Family,
    /// The target the labels are for.
    pub target: Target,
    /// Column names of `x`.
    pub feature_names: Vec<String>,
    /// Raw (unscaled) features.
    pub x: Array2<f64>,
    /// Target value per row (MiB after OOM relabelling, or the utilisation ratio).
    pub value: Vec<f64>,
    /// Bin of `value`.
    pub class: Vec<usize>,
    /// Whether `value` is a real measurement a regressor may learn from (false for OOM rows
    /// and for rows whose memory reads 0).
    pub measured: Vec<bool>,
    /// CSV data-row number of each example: the identity splits are made of.
    pub row_ids: Vec<usize>,
    /// Content digest of each example's row ([`crate::rows::digest`]): what a model file
    /// records of its training rows, so they are known again in a copy or another order.
    pub digests: Vec<String>,
    /// Rows left out, counted per reason.
    pub excluded: BTreeMap<String, usize>,
}

impl Examples {
    /// Builds the examples of `ds` for `target`, applying GPUMemNet's row filters (CNN rows with
    /// activation `None` and residual/dense architectures are dropped, as its dataloader does).
    pub fn build(ds: &Dataset, target: &Target) -> Result<Examples, MlError> {
        Self::build_with(ds, target, None)
    }

    /// [`Examples::build`], with the `k_` columns of `kernel` appended to every feature vector
    /// (joined by `Filename`; a kept row without a numeric feature row is an error).
    pub fn build_with(ds: &Dataset, target: &Target, kernel: Option<&KernelFeatures>) -> Result<Examples, MlError> {
        let family = ds.family()?;
        let mut names: Vec<String> = features::feature_names(family).iter().map(|s| s.to_string()).collect();
        names.extend(kernel.iter().flat_map(|k| k.columns.iter().cloned()));
        let mut data = Vec::with_capacity(ds.rows.len() * names.len());
        let mut ex = Examples {
            family,
            target: target.clone(),
            feature_names: names.clone(),
            x: Array2::zeros((0, names.len())),
            value: Vec::new(),
            class: Vec::new(),
            measured: Vec::new(),
            row_ids: Vec::new(),
            digests: Vec::new(),
            excluded: BTreeMap::new(),
        };
        for row in &ds.rows {
            if let Some(reason) = gpumemnet_filter(family, row) {
                *ex.excluded.entry(reason.to_string()).or_default() += 1;
                continue;
            }
            if row.features.layers.is_empty() {
                *ex.excluded.entry("empty Activations-Params (no layers)".to_string()).or_default() += 1;
                continue;
            }
            let feats = match features::extract(family, row) {
                Ok(f) => f,
                Err(RowIssue::UnknownActivation(message)) => {
                    return Err(MlError::BadCell {
                        path: ds.path.clone(),
                        row: row.row,
                        column: "Activation Function".into(),
                        message,
                    })
                }
            };
            let (value, measured) = match target_value(target.kind, row) {
                Ok(v) => v,
                Err(reason) => {
                    *ex.excluded.entry(reason.to_string()).or_default() += 1;
                    continue;
                }
            };
            let Some(class) = target.binning.class_of(value) else {
                *ex.excluded.entry(format!("{} {value} outside every bin", target.kind.name())).or_default() += 1;
                continue;
            };
            data.extend(feats);
            if let Some(k) = kernel {
                data.extend(k.lookup(&row.filename, &ds.path, row.row)?);
            }
            ex.value.push(value);
            ex.class.push(class);
            ex.measured.push(measured);
            ex.row_ids.push(row.row);
            ex.digests.push(row.digest.clone());
        }
        if ex.row_ids.is_empty() {
            return Err(MlError::Empty {
                path: ds.path.clone(),
                reason: format!("every row was excluded: {}", said(&ex.excluded)),
            });
        }
        ex.x = Array2::from_shape_vec((ex.row_ids.len(), names.len()), data)
            .map_err(|e| MlError::Invalid(format!("feature matrix shape: {e}")))?;
        Ok(ex)
    }

    /// Number of examples.
    pub fn len(&self) -> usize {
        self.row_ids.len()
    }

    /// True when there are no examples.
    pub fn is_empty(&self) -> bool {
        self.row_ids.is_empty()
    }

    /// The examples at positions `idx` (positions into this set, not CSV row ids).
    pub fn subset(&self, idx: &[usize]) -> Examples {
        Examples {
            family: self.family,
            target: self.target.clone(),
            feature_names: self.feature_names.clone(),
            x: self.x.select(ndarray::Axis(0), idx),
            value: idx.iter().map(|&i| self.value[i]).collect(),
            class: idx.iter().map(|&i| self.class[i]).collect(),
            measured: idx.iter().map(|&i| self.measured[i]).collect(),
            row_ids: idx.iter().map(|&i| self.row_ids[i]).collect(),
            digests: idx.iter().map(|&i| self.digests[i].clone()).collect(),
            excluded: self.excluded.clone(),
        }
    }

    /// Examples per class, indexed by class.
    pub fn class_counts(&self) -> Vec<usize> {
        let mut c = vec![0; self.target.binning.classes()];
        for &k in &self.class {
            c[k] += 1;
        }
        c
    }
}

/// The reasons rows were left out, the most common first and at most five: one reason per
/// distinct value ("memory_mib 1445 outside every bin") made a 10 KB line.
fn said(excluded: &BTreeMap<String, usize>) -> String {
    let mut by_count: Vec<(&String, &usize)> = excluded.iter().collect();
    by_count.sort_by(|a, b| b.1.cmp(a.1));
    let mut out: Vec<String> = by_count.iter().take(5).map(|(r, n)| format!("{n} rows: {r}")).collect();
    if by_count.len() > 5 {
        let rest: usize = by_count[5..].iter().map(|(_, n)| **n).sum();
        out.push(format!("{rest} rows for {} other reasons", by_count.len() - 5));
    }
    out.join("; ")
}

fn gpumemnet_filter(family: Family, row: &DatasetRow) -> Option<&'static str> {
    if family != Family::Cnn {
        return None;
    }
    if row.activation_name() == "None" {
        return Some("activation None (GPUMemNet's dropna drops it)");
    }
    match row.architecture() {
        Some("residual") | Some("dense") => Some("residual/dense architecture (GPUMemNet drops them before training)"),
        _ => None,
    }
}

fn target_value(kind: TargetKind, row: &DatasetRow) -> Result<(f64, bool), &'static str> {
    match kind {
        TargetKind::MemoryMib => match row.truth_mib() {
            _ if row.real_oom => Ok((OOM_RELABEL_MIB, false)),
            // No device holds more than the allocator model's largest capacity.
            Some(mib) if mib > (trace::units::MAX_CAPACITY >> 20) as f64 => {
                Err("a memory label above any device's memory (256 TiB)")
            }
            Some(mib) => Ok((mib, mib > 0.0)),
            None => Err("no device-level memory label"),
        },
        TargetKind::Smact | TargetKind::Smocc => {
            if row.real_oom {
                return Err("OOM run (no steady-state utilisation)");
            }
            let v = if kind == TargetKind::Smact { row.util.smact } else { row.util.smocc };
            v.map(|v| (v, true)).ok_or("no DCGM sample (-1 or missing column)")
        }
    }
}
