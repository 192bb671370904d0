//! Datasets of measured runs: GPUMemNet-format CSVs (`Filename`, `Activations-Params`, `Batch
//! Size`, `Max GPU Memory (MiB)`, optional `Status`), and the trainer's `dataset` output, which has
//! those columns plus `spec`, `optimizer`, `amp`, `oom`, `device_peak_mib`,
//! `max_memory_reserved_mib`, ... (trainer/README.md). A GPUMemNet row is rebuilt as
//! `gpumemnet:FILENAME`; a trainer row by its own `spec`, optimizer and AMP setting.

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
    /// How the trainer rebuilds the model: a model spec, or a `module:function` entry.
    pub spec: Spec,
    /// The row's optimizer (`optimizer` column), where the dataset records one.
    pub optimizer: Option<String>,
    /// The row's autocast dtype (`amp` column: `bf16`, `fp16`; `None` for fp32).
    pub amp: Option<String>,
    /// Column the device-level truth was read from.
    pub truth_column: &'static str,
    /// Measured allocator-level peak (`max_memory_reserved_mib`), bytes, where the dataset has it.
    pub reserved_truth: Option<f64>,
    /// GPUMemNet's `Depth` (what its ML feature sets use), where present and numeric.
    pub depth: Option<f64>,
    /// `Activation Function` (empty where the dataset has none).
    pub activation: String,
}

/// What the trainer rebuilds a row from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Spec {
    /// A model spec (`gpumemnet:FILENAME`, `torchvision:NAME`, `synthetic:{...}`, ...).
    Model(String),
    /// A user's `package.module:function` (`symtrace --entry`).
    Entry(String),
}

/// Prefixes of the trainer's model specs (`memtrace_trainer.models.zoo.build_workload`); any other
/// `spec` of a trainer row came from `run --entry`.
const MODEL_SOURCES: [&str; 6] = ["torchvision", "timm", "hf", "dlrm", "gpumemnet", "synthetic"];

impl Spec {
    /// The spec of a trainer `spec` cell.
    pub fn parse(cell: &str) -> Spec {
        let source = cell.split(':').next().unwrap_or("");
        if MODEL_SOURCES.contains(&source) {
            Spec::Model(cell.to_string())
        } else {
            Spec::Entry(cell.to_string())
        }
    }

    /// The text the trainer takes (`--model` or `--entry` value).
    pub fn as_str(&self) -> &str {
        match self {
            Spec::Model(s) | Spec::Entry(s) => s,
        }
    }
}

/// Column names of the device-level truth, in order of preference.
pub const DEVICE_TRUTH_COLUMNS: [&str; 2] = ["device_peak_mib", "Max GPU Memory (MiB)"];

impl DatasetRow {
    /// The row as the ML estimators' dataset sees it, so a model file from `memest ml train`
    /// applies to it exactly as to the CSV it was trained on.
    pub fn ml_row(&self) -> crate::ml::dataset::RunRow {
        use crate::ml::dataset::{Layer, RunRow, RunStatus, Utilization};
        let f = &self.features;
        RunRow {
            row: 0,
            filename: self.filename.clone(),
            // GPUMemNet's Depth counts the convolutions of a CNN, else the linear layers.
            depth: self.depth.unwrap_or_else(|| {
                let count = |k: &str| f.layers.iter().filter(|l| l.kind.eq_ignore_ascii_case(k)).count();
                let convs = count("conv2d");
                (if convs > 0 { convs } else { count("linear") }) as f64
            }),
            layers: f
                .layers
                .iter()
                .map(|l| Layer { kind: l.kind.clone(), activations: l.activations, params: l.parameters })
                .collect(),
            activation: if self.activation.is_empty() { "None".into() } else { self.activation.clone() },
            total_activations: f.total_activations as f64,
            total_parameters: f.total_parameters as f64,
            batch_size: self.batch as f64,
            max_memory_mib: self.truth.map_or(0.0, |t| t / MIB),
            status: if self.real_oom { RunStatus::OomCrash } else { RunStatus::Successful },
            util: Utilization::default(),
        }
    }
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

/// Read a GPUMemNet-format CSV or the trainer's `dataset` output (told apart by its `spec` column).
pub fn load_gpumemnet_csv(path: &Path) -> Result<Vec<DatasetRow>> {
    let mut rdr = csv::Reader::from_path(path).map_err(|e| csv_err(path, 0, "<file>", &e.to_string()))?;
    let headers = rdr.headers().map_err(|e| csv_err(path, 0, "<header>", &e.to_string()))?.clone();
    let opt_col = |name: &str| headers.iter().position(|h| h.trim() == name);
    let col = |name: &str| opt_col(name).ok_or_else(|| csv_err(path, 0, name, "column missing from the header"));
    let (c_file, c_ap, c_act, c_par, c_batch, c_mem) = (
        col("Filename")?,
        col("Activations-Params")?,
        col("Total Activations")?,
        col("Total Parameters")?,
        col("Batch Size")?,
        col("Max GPU Memory (MiB)")?,
    );
    let c_status = opt_col("Status");
    // The trainer's extra columns; `spec` marks its format.
    let c_spec = opt_col("spec");
    let (c_opt, c_amp, c_oom, c_device, c_reserved) = (
        opt_col("optimizer"),
        opt_col("amp"),
        opt_col("oom"),
        opt_col(DEVICE_TRUTH_COLUMNS[0]),
        opt_col("max_memory_reserved_mib"),
    );
    let (c_depth, c_activation, c_family) = (opt_col("Depth"), opt_col("Activation Function"), opt_col("family"));
    let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let mut rows = Vec::new();
    for (i, rec) in rdr.records().enumerate() {
        let row = i + 1;
        let rec = rec.map_err(|e| csv_err(path, row, "<row>", &e.to_string()))?;
        let get = |c: usize, name: &str| rec.get(c).ok_or_else(|| csv_err(path, row, name, "cell missing"));
        let opt_cell = |c: Option<usize>| c.and_then(|c| rec.get(c)).map(str::trim).filter(|s| !s.is_empty());
        let num = |c: usize, name: &str| -> Result<u64> {
            let s = get(c, name)?;
            s.trim()
                .parse::<f64>()
                .ok()
                .filter(|v| *v >= 0.0 && v.fract() == 0.0)
                .map(|v| v as u64)
                .ok_or_else(|| csv_err(path, row, name, &format!("expected a whole number >= 0, got {s:?}")))
        };
        let mib = |text: &str, name: &str| -> Result<f64> {
            text.trim()
                .parse::<f64>()
                .ok()
                .filter(|v| v.is_finite() && *v >= 0.0)
                .map(|v| v * MIB)
                .ok_or_else(|| csv_err(path, row, name, &format!("expected a number of MiB >= 0, got {text:?}")))
        };
        let layers = parse_activations_params(get(c_ap, "Activations-Params")?)
            .map_err(|e| csv_err(path, row, "Activations-Params", &e))?;
        let batch = num(c_batch, "Batch Size")?;
        let status_oom = opt_cell(c_status).is_some_and(|s| s.eq_ignore_ascii_case("OOM_CRASH"));
        let label_oom = match opt_cell(c_oom) {
            None => false,
            Some(s) => s
                .to_ascii_lowercase()
                .parse::<bool>()
                .map_err(|_| csv_err(path, row, "oom", &format!("expected true or false, got {s:?}")))?,
        };
        let real_oom = status_oom || label_oom;
        // Device-level truth: the trainer's NVML peak where present, else GPUMemNet's label. Only
        // the trainer's rows may lack one (CPU-fallback runs have no GPU labels).
        let device_cell = opt_cell(c_device).map(|t| (t, DEVICE_TRUTH_COLUMNS[0]));
        let mem_text = get(c_mem, DEVICE_TRUTH_COLUMNS[1])?;
        let (truth_text, truth_column) = device_cell.unwrap_or((mem_text, DEVICE_TRUTH_COLUMNS[1]));
        let truth = if real_oom || (c_spec.is_some() && truth_text.trim().is_empty()) {
            None
        } else {
            Some(mib(truth_text, truth_column)?)
        };
        let reserved_truth = match opt_cell(c_reserved) {
            Some(t) if !real_oom => Some(mib(t, "max_memory_reserved_mib")?),
            _ => None,
        };
        let features = Features {
            total_parameters: num(c_par, "Total Parameters")?,
            total_activations: num(c_act, "Total Activations")?,
            batch_size: Some(batch),
            layers,
        };
        let filename = get(c_file, "Filename")?.to_string();
        // An empty layer list (torchsummary failed upstream) says nothing: the generator, or the
        // trainer's own family column, does.
        let family = if !features.layers.is_empty() {
            features.family()
        } else if filename.contains("base_filters:") {
            Family::Cnn
        } else {
            match opt_cell(c_family).map(str::to_ascii_lowercase).as_deref() {
                Some("cnn") => Family::Cnn,
                Some("transformer") => Family::Transformer,
                _ => features.family(),
            }
        };
        let spec = match opt_cell(c_spec) {
            Some(s) => Spec::parse(s),
            None if c_spec.is_some() => return Err(csv_err(path, row, "spec", "a model spec or module:function")),
            None => Spec::Model(format!("gpumemnet:{filename}")),
        };
        let optimizer = opt_cell(c_opt).map(str::to_string);
        if let Some(o) = &optimizer {
            o.parse::<crate::analytic::Optimizer>().map_err(|e| csv_err(path, row, "optimizer", &e))?;
        }
        let amp = opt_cell(c_amp).filter(|a| !a.eq_ignore_ascii_case("fp32")).map(str::to_string);
        if let Some(a) = &amp {
            a.parse::<crate::analytic::Precision>().map_err(|e| csv_err(path, row, "amp", &e))?;
        }
        let depth = match opt_cell(c_depth) {
            None => None,
            Some(d) => Some(
                d.parse::<f64>()
                    .ok()
                    .filter(|v| v.is_finite())
                    .ok_or_else(|| csv_err(path, row, "Depth", &format!("expected a number, got {d:?}")))?,
            ),
        };
        rows.push(DatasetRow {
            id: format!("{stem}-{row:05}"),
            filename,
            features,
            batch,
            truth,
            real_oom,
            family,
            spec,
            optimizer,
            amp,
            truth_column,
            reserved_truth,
            depth,
            activation: opt_cell(c_activation).unwrap_or("").to_string(),
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
