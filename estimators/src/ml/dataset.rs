//! Loading GPUMemNet-format CSVs (`mlp_data_step1/2.csv`, `cnn_data_step1*.csv`, transformer CSVs).
//!
//! Only the columns every GPUMemNet sweep shares are required. Layer-type counts are always parsed
//! from `Activations-Params`, never taken from the per-type count columns, because step-1 MLP files
//! have no such columns and the family decision must see the same layer list as the features.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::error::MlError;

/// Model family, decided from the layer types (any convolution → CNN, any attention → Transformer).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    /// Fully connected networks only.
    Mlp,
    /// At least one convolution layer.
    Cnn,
    /// At least one attention layer.
    Transformer,
}

impl Family {
    /// Lower-case name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Family::Mlp => "mlp",
            Family::Cnn => "cnn",
            Family::Transformer => "transformer",
        }
    }

    /// Parses `mlp`, `cnn` or `transformer` (case-insensitive).
    pub fn parse(s: &str) -> Option<Family> {
        match s.to_ascii_lowercase().as_str() {
            "mlp" => Some(Family::Mlp),
            "cnn" => Some(Family::Cnn),
            "transformer" => Some(Family::Transformer),
            _ => None,
        }
    }

    /// The family a list of layers belongs to, by the one rule of `crate::features`
    /// ([`crate::features::Family::from_layer_types`]): attention wins over convolution, and
    /// GPT-2's `Conv1D` is a GEMM, not a convolution.
    pub fn of_layers(layers: &[Layer]) -> Family {
        match crate::features::Family::from_layer_types(layers.iter().map(|l| l.kind.as_str())) {
            crate::features::Family::Transformer => Family::Transformer,
            crate::features::Family::Cnn => Family::Cnn,
            crate::features::Family::Mlp => Family::Mlp,
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One entry of `Activations-Params`: (layer type, #activations, #parameters).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Layer {
    /// Layer type as torchsummary named it, e.g. `linear`, `conv2d`, `batchnorm2d`, `ReLU`.
    pub kind: String,
    /// Output activations of the layer, per sample.
    pub activations: u64,
    /// Parameters of the layer.
    pub params: u64,
}

/// Whether the run finished or crashed with OOM (CNN and Transformer sweeps only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RunStatus {
    /// The run trained for its time limit.
    Successful,
    /// The run crashed with CUDA out-of-memory; its memory label is not a measurement.
    OomCrash,
}

/// DCGM utilisation means of one run; `None` where the CSV says −1 (no sample) or lacks the column.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Utilization {
    /// `Avg GPUTL` (percent, 0–100).
    pub gputl: Option<f64>,
    /// `Avg GRACT` (ratio).
    pub gract: Option<f64>,
    /// `Avg SMACT` (ratio).
    pub smact: Option<f64>,
    /// `Avg SMOCC` (ratio).
    pub smocc: Option<f64>,
    /// `Avg FP32A` (ratio).
    pub fp32a: Option<f64>,
}

/// One CSV row, typed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRow {
    /// 1-based data row number (the header is row 0); the stable row id used by splits.
    pub row: usize,
    /// `Filename`: the generator configuration.
    pub filename: String,
    /// `Depth` column.
    pub depth: f64,
    /// Parsed `Activations-Params`.
    pub layers: Vec<Layer>,
    /// `Activation Function` (e.g. `ReLU`; `None` in some CNN rows).
    pub activation: String,
    /// `Total Activations` (per sample).
    pub total_activations: f64,
    /// `Total Parameters`.
    pub total_parameters: f64,
    /// `Batch Size`.
    pub batch_size: f64,
    /// `Max GPU Memory (MiB)` as measured (0 or garbage for OOM rows).
    pub max_memory_mib: f64,
    /// `Status` column; `Successful` where the file has none (MLP sweeps never OOM).
    pub status: RunStatus,
    /// DCGM utilisation columns.
    pub util: Utilization,
}

impl RunRow {
    /// The family this row's layers make it.
    pub fn family(&self) -> Family {
        Family::of_layers(&self.layers)
    }

    /// Number of layers whose type, lower-cased, satisfies `pred`.
    pub fn count_layers(&self, pred: impl Fn(&str) -> bool) -> usize {
        self.layers.iter().filter(|l| pred(&l.kind.to_ascii_lowercase())).count()
    }

    /// The `arch:` field of the generator file name (`pyramid`, `residual`, ...), if present.
    pub fn architecture(&self) -> Option<&str> {
        let start = self.filename.find("arch:")? + "arch:".len();
        let rest = &self.filename[start..];
        Some(rest.split('_').next().unwrap_or(rest))
    }
}

/// A loaded GPUMemNet CSV.
#[derive(Debug, Clone)]
pub struct Dataset {
    /// The file it came from (for error messages and reports).
    pub path: PathBuf,
    /// All rows, in file order.
    pub rows: Vec<RunRow>,
}

const REQUIRED: [&str; 8] = [
    "Filename",
    "Depth",
    "Activations-Params",
    "Activation Function",
    "Total Activations",
    "Total Parameters",
    "Batch Size",
    "Max GPU Memory (MiB)",
];

impl Dataset {
    /// Reads a GPUMemNet CSV. Every malformed cell is an error naming the file, the data row and
    /// the column.
    pub fn load(path: &Path) -> Result<Dataset, MlError> {
        let file = std::fs::File::open(path).map_err(|source| MlError::Io { path: path.to_path_buf(), source })?;
        Self::from_reader(path, file)
    }

    /// Parses CSV text from any reader; `path` is only used in messages.
    pub fn from_reader(path: &Path, reader: impl std::io::Read) -> Result<Dataset, MlError> {
        let csv_err = |source| MlError::Csv { path: path.to_path_buf(), source };
        let mut rdr = csv::ReaderBuilder::new().flexible(false).from_reader(reader);
        let headers = rdr.headers().map_err(csv_err)?.clone();
        let col = |name: &str| headers.iter().position(|h| h.trim() == name);
        let mut idx = [0usize; REQUIRED.len()];
        for (slot, name) in idx.iter_mut().zip(REQUIRED) {
            *slot = col(name).ok_or_else(|| MlError::MissingColumn {
                path: path.to_path_buf(),
                column: name.to_string(),
                needed_for: "every GPUMemNet feature set",
            })?;
        }
        let status_col = col("Status");
        let util_cols = [col("Avg GPUTL"), col("Avg GRACT"), col("Avg SMACT"), col("Avg SMOCC"), col("Avg FP32A")];
        let mut rows = Vec::new();
        for (i, rec) in rdr.records().enumerate() {
            let rec = rec.map_err(csv_err)?;
            let row = i + 1;
            let cell = |c: usize| rec.get(c).unwrap_or("").trim();
            let bad = |c: usize, message: String| MlError::BadCell {
                path: path.to_path_buf(),
                row,
                column: headers.get(c).unwrap_or("?").to_string(),
                message,
            };
            let num = |c: usize| -> Result<f64, MlError> {
                let s = cell(c);
                match s.parse::<f64>() {
                    Ok(v) if v.is_finite() => Ok(v),
                    _ => Err(bad(c, format!("expected a finite number, found {s:?}"))),
                }
            };
            let opt_util = |c: Option<usize>| -> Result<Option<f64>, MlError> {
                match c {
                    None => Ok(None),
                    Some(c) => {
                        let v = num(c)?;
                        // GPUMemNet writes -1 where DCGM produced no non-zero sample.
                        Ok(if v < 0.0 { None } else { Some(v) })
                    }
                }
            };
            let layers = parse_layers(cell(idx[2])).map_err(|m| bad(idx[2], m))?;
            let status = match status_col {
                None => RunStatus::Successful,
                Some(c) => match cell(c) {
                    "SUCCESSFUL" => RunStatus::Successful,
                    "OOM_CRASH" => RunStatus::OomCrash,
                    other => return Err(bad(c, format!("expected SUCCESSFUL or OOM_CRASH, found {other:?}"))),
                },
            };
            let activation = cell(idx[3]).to_string();
            if activation.is_empty() {
                return Err(bad(idx[3], "expected an activation function name, found an empty cell".into()));
            }
            rows.push(RunRow {
                row,
                filename: cell(idx[0]).to_string(),
                depth: num(idx[1])?,
                layers,
                activation,
                total_activations: num(idx[4])?,
                total_parameters: num(idx[5])?,
                batch_size: num(idx[6])?,
                max_memory_mib: num(idx[7])?,
                status,
                util: Utilization {
                    gputl: opt_util(util_cols[0])?,
                    gract: opt_util(util_cols[1])?,
                    smact: opt_util(util_cols[2])?,
                    smocc: opt_util(util_cols[3])?,
                    fp32a: opt_util(util_cols[4])?,
                },
            });
        }
        if rows.is_empty() {
            return Err(MlError::Empty {
                path: path.to_path_buf(),
                reason: "the file has a header but no data rows".into(),
            });
        }
        Ok(Dataset { path: path.to_path_buf(), rows })
    }

    /// The single family of all rows that list layers; an error if the file mixes families or
    /// no row lists any layer.
    pub fn family(&self) -> Result<Family, MlError> {
        let mut seen: Vec<Family> = self.rows.iter().filter(|r| !r.layers.is_empty()).map(RunRow::family).collect();
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

/// Parses torchsummary's Python-literal list `[('linear', 1173, 2753031), ...]`.
pub fn parse_layers(text: &str) -> Result<Vec<Layer>, String> {
    let s = text.trim();
    let inner = s
        .strip_prefix('[')
        .and_then(|t| t.strip_suffix(']'))
        .ok_or_else(|| format!("expected a list like [('linear', 10, 20)], found {}", preview(s)))?;
    let mut layers = Vec::new();
    let mut rest = inner.trim();
    while !rest.is_empty() {
        let open = rest.strip_prefix('(').ok_or_else(|| format!("expected '(' at {}", preview(rest)))?;
        let close = open.find(')').ok_or_else(|| format!("unterminated tuple at {}", preview(rest)))?;
        let tuple = &open[..close];
        layers.push(parse_tuple(tuple).map_err(|m| format!("layer {}: {m}", layers.len()))?);
        rest = open[close + 1..].trim_start();
        rest = rest.strip_prefix(',').unwrap_or(rest).trim_start();
    }
    Ok(layers)
}

fn parse_tuple(tuple: &str) -> Result<Layer, String> {
    let parts: Vec<&str> = tuple.split(',').map(str::trim).collect();
    if parts.len() != 3 {
        return Err(format!("expected (name, activations, params), found ({tuple})"));
    }
    let name = parts[0];
    let kind = name
        .strip_prefix('\'')
        .and_then(|n| n.strip_suffix('\''))
        .or_else(|| name.strip_prefix('"').and_then(|n| n.strip_suffix('"')))
        .ok_or_else(|| format!("expected a quoted layer name, found {name}"))?;
    let int = |s: &str, what: &str| {
        s.parse::<u64>().map_err(|_| format!("expected a non-negative integer {what}, found {s:?}"))
    };
    Ok(Layer {
        kind: kind.to_string(),
        activations: int(parts[1], "activation count")?,
        params: int(parts[2], "parameter count")?,
    })
}

fn preview(s: &str) -> String {
    let p: String = s.chars().take(40).collect();
    if p.len() < s.len() {
        format!("{p:?}...")
    } else {
        format!("{p:?}")
    }
}
