//! Datasets of measured runs: GPUMemNet-format CSVs (`Filename`, `Activations-Params`, `Batch
//! Size`, `Max GPU Memory (MiB)`, optional `Status`). Each row's `Filename` lets the trainer
//! rebuild the model (`gpumemnet:FILENAME`).

use std::path::Path;

use crate::error::{EstimateError, Result};
use crate::features::{Family, Features, Layer};

const MIB: f64 = 1024.0 * 1024.0;

/// One measured run.
#[derive(Debug, Clone, PartialEq)]
pub struct DatasetRow {
    /// Stable id: the dataset file stem and the row number.
    pub id: String,
    /// The row's `Filename` (the generator configuration).
    pub filename: String,
    /// Features from the CSV itself (what GPUMemNet and Horus used).
    pub features: Features,
    /// Batch size.
    pub batch: u64,
    /// Measured device-level peak, bytes; `None` for OOM crashes.
    pub truth: Option<f64>,
    /// The run crashed with OOM.
    pub real_oom: bool,
    /// Family from the layer types.
    pub family: Family,
}

/// Parse GPUMemNet's `Activations-Params` cell: a Python list of `('type', activations, params)`.
pub fn parse_activations_params(cell: &str) -> std::result::Result<Vec<Layer>, String> {
    let mut out = Vec::new();
    let body = cell.trim();
    let body = body
        .strip_prefix('[')
        .and_then(|b| b.strip_suffix(']'))
        .ok_or_else(|| format!("expected a list like [('linear', 10, 20), ...], got {:.40}", body))?;
    for tuple in body.split(')').map(str::trim).filter(|t| !t.is_empty()) {
        let t = tuple
            .trim_start_matches(',')
            .trim()
            .strip_prefix('(')
            .ok_or_else(|| format!("expected '(' in {tuple:.40}"))?;
        let parts: Vec<&str> = t.split(',').map(str::trim).collect();
        if parts.len() != 3 {
            return Err(format!("expected ('type', activations, params), got ({t:.60})"));
        }
        let kind = parts[0].trim_matches(|c| c == '\'' || c == '"').to_string();
        let num = |s: &str| s.parse::<u64>().map_err(|_| format!("{s:?} is not a whole number in ({t:.60})"));
        out.push(Layer { kind, activations: num(parts[1])?, parameters: num(parts[2])? });
    }
    Ok(out)
}

/// Read a GPUMemNet-format CSV.
pub fn load_gpumemnet_csv(path: &Path) -> Result<Vec<DatasetRow>> {
    let mut rdr = csv::Reader::from_path(path).map_err(|e| csv_err(path, 0, "<file>", &e.to_string()))?;
    let headers = rdr.headers().map_err(|e| csv_err(path, 0, "<header>", &e.to_string()))?.clone();
    let col = |name: &str| {
        headers.iter().position(|h| h == name).ok_or_else(|| csv_err(path, 0, name, "column missing from the header"))
    };
    let (c_file, c_ap, c_act, c_par, c_batch, c_mem) = (
        col("Filename")?,
        col("Activations-Params")?,
        col("Total Activations")?,
        col("Total Parameters")?,
        col("Batch Size")?,
        col("Max GPU Memory (MiB)")?,
    );
    let c_status = headers.iter().position(|h| h == "Status");
    let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let mut rows = Vec::new();
    for (i, rec) in rdr.records().enumerate() {
        let row = i + 1;
        let rec = rec.map_err(|e| csv_err(path, row, "<row>", &e.to_string()))?;
        let get = |c: usize, name: &str| rec.get(c).ok_or_else(|| csv_err(path, row, name, "cell missing"));
        let num = |c: usize, name: &str| -> Result<u64> {
            let s = get(c, name)?;
            s.trim()
                .parse::<f64>()
                .ok()
                .filter(|v| *v >= 0.0 && v.fract() == 0.0)
                .map(|v| v as u64)
                .ok_or_else(|| csv_err(path, row, name, &format!("expected a whole number >= 0, got {s:?}")))
        };
        let layers = parse_activations_params(get(c_ap, "Activations-Params")?)
            .map_err(|e| csv_err(path, row, "Activations-Params", &e))?;
        let batch = num(c_batch, "Batch Size")?;
        let mem_text = get(c_mem, "Max GPU Memory (MiB)")?;
        let real_oom = c_status.and_then(|c| rec.get(c)).is_some_and(|s| s.trim().eq_ignore_ascii_case("OOM_CRASH"));
        let truth = if real_oom {
            None
        } else {
            let v: f64 = mem_text.trim().parse().map_err(|_| {
                csv_err(path, row, "Max GPU Memory (MiB)", &format!("expected a number of MiB, got {mem_text:?}"))
            })?;
            Some(v * MIB)
        };
        let features = Features {
            total_parameters: num(c_par, "Total Parameters")?,
            total_activations: num(c_act, "Total Activations")?,
            batch_size: Some(batch),
            layers,
        };
        // An empty layer list (torchsummary failed upstream) says nothing: the generator does.
        let family = if features.layers.is_empty() && get(c_file, "Filename")?.contains("base_filters:") {
            Family::Cnn
        } else {
            features.family()
        };
        rows.push(DatasetRow {
            id: format!("{stem}-{row:05}"),
            filename: get(c_file, "Filename")?.to_string(),
            features,
            batch,
            truth,
            real_oom,
            family,
        });
    }
    Ok(rows)
}

fn csv_err(path: &Path, row: usize, column: &str, expected: &str) -> EstimateError {
    EstimateError::Csv { path: path.to_path_buf(), row, column: column.to_string(), expected: expected.to_string() }
}

/// A seeded subset of `n` rows (all rows when `n` is at least their count), in file order.
/// SplitMix64 keeps the choice reproducible across platforms and crate versions.
pub fn seeded_subset<T: Clone>(rows: &[T], n: usize, seed: u64) -> Vec<T> {
    if n >= rows.len() {
        return rows.to_vec();
    }
    let mut idx: Vec<usize> = (0..rows.len()).collect();
    let mut s = seed;
    for i in (1..idx.len()).rev() {
        let j = (splitmix64(&mut s) % (i as u64 + 1)) as usize;
        idx.swap(i, j);
    }
    let mut chosen: Vec<usize> = idx[..n].to_vec();
    chosen.sort_unstable();
    chosen.into_iter().map(|i| rows[i].clone()).collect()
}

/// SplitMix64 step.
pub fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
