//! Datasets of measured runs, read by the crate's one loader for every consumer (`memest
//! compare`, calibration, and the ML estimators through [`crate::ml::dataset::Dataset`]):
//! GPUMemNet-format CSVs (`Filename`, `Activations-Params`, `Total Activations`, `Total
//! Parameters`, `Batch Size`, `Max GPU Memory (MiB)`; optional `Depth`, `Activation Function`,
//! `Status` and the DCGM `Avg ...` columns), and the trainer's `dataset` output, which has those
//! columns plus `spec`, `optimizer`, `amp`, `oom`, `device_peak_mib`, `max_memory_reserved_mib`,
//! ... (trainer/README.md). A GPUMemNet row is rebuilt as `gpumemnet:FILENAME`; a trainer row by
//! its own `spec`, optimizer and AMP setting.
//!
//! Every malformed cell is an [`EstimateError::Csv`] naming the file, the 1-based data row and
//! the column.

use std::io::Read;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{EstimateError, Result};
use crate::features::{Family, Features, Layer};

const MIB: f64 = 1024.0 * 1024.0;

/// One measured run (or, from [`DatasetRow::unmeasured`], a job described but not run).
#[derive(Debug, Clone, PartialEq)]
pub struct DatasetRow {
    /// Stable id: the dataset file stem and the row number.
    pub id: String,
    /// 1-based data row number (the header is row 0; 0 for a row not read from a file).
    pub row: usize,
    /// What the row holds ([`crate::rows::digest`]): it names the row in whatever file or order
    /// it comes (empty for a row not read from a file).
    pub digest: String,
    /// The row's `Filename` (the generator configuration).
    pub filename: String,
    /// Features from the CSV itself (what GPUMemNet and Horus used); `layers` is the parsed
    /// `Activations-Params` cell.
    pub features: Features,
    /// Batch size.
    pub batch: u64,
    /// Measured device-level peak, bytes; `None` for OOM crashes.
    pub truth: Option<f64>,
    /// The run crashed with OOM (`Status` `OOM_CRASH`, or the trainer's `oom` column).
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
    /// GPUMemNet's `Depth` (what its ML feature sets use), where present.
    pub depth: Option<f64>,
    /// `Activation Function` (empty where the dataset has none).
    pub activation: String,
    /// DCGM utilisation means (`Avg ...` columns).
    pub util: Utilization,
    /// The run's other settings (`job` column: `seq_len`, `input_shape`, `checkpointing`, ...),
    /// which the trainer traces the row with; empty where the dataset has none.
    pub job: serde_json::Map<String, serde_json::Value>,
    /// The profile of the GPU the run was measured on (`profile` column), where recorded.
    pub profile: Option<String>,
    /// The name of the GPU the run was measured on (`gpu` column, as NVML reports it), where
    /// recorded: it says the GPU where no profile of it is known.
    pub gpu: Option<String>,
    /// The row is the trainer's own measurement (`dataset` output: its file has the `spec`
    /// column), not a row of GPUMemNet's CSVs, whose licence (CC BY-NC 4.0) models trained on
    /// them carry.
    pub own_run: bool,
}

/// Settings a `job` cell may not carry: the row's own columns (and the tracer's own switches)
/// say them.
const JOB_OWN_COLUMNS: [&str; 9] =
    ["name", "model", "entry", "step", "batch_size", "optimizer", "amp", "profile", "no_cuda_emulation"];

/// A `job` cell: a JSON object of the run's other settings.
fn job_of(cell: &str) -> std::result::Result<serde_json::Map<String, serde_json::Value>, String> {
    let expected = "a JSON object of the run's other settings (e.g. {\"seq_len\": 128})";
    let map = match serde_json::from_str::<serde_json::Value>(cell) {
        Ok(serde_json::Value::Object(m)) => m,
        _ => return Err(format!("expected {expected}, got {cell:?}")),
    };
    if let Some(k) = map.keys().find(|k| JOB_OWN_COLUMNS.contains(&k.as_str())) {
        return Err(format!("{k:?} is a column of its own; expected {expected}"));
    }
    Ok(map)
}

/// DCGM utilisation means of one run; `None` where the CSV says −1 (or any negative value: no
/// sample), leaves the cell empty, or lacks the column.
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

/// The DCGM columns of [`Utilization`], in field order.
pub const UTILIZATION_COLUMNS: [&str; 5] = ["Avg GPUTL", "Avg GRACT", "Avg SMACT", "Avg SMOCC", "Avg FP32A"];

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
    /// A job described (by `features --json`) but not run: no truth, no file row. `name` is the
    /// model spec (or entry) the features were taken of; the family comes from the layers.
    pub fn unmeasured(name: &str, mut features: Features, batch: u64, depth: Option<f64>, activation: &str) -> Self {
        features.batch_size = Some(batch);
        DatasetRow {
            id: name.to_string(),
            row: 0,
            digest: String::new(),
            filename: name.to_string(),
            family: features.family(),
            features,
            batch,
            truth: None,
            real_oom: false,
            spec: Spec::parse(name),
            optimizer: None,
            amp: None,
            truth_column: DEVICE_TRUTH_COLUMNS[1],
            reserved_truth: None,
            depth,
            activation: activation.to_string(),
            util: Utilization::default(),
            job: serde_json::Map::new(),
            profile: None,
            gpu: None,
            own_run: true,
        }
    }

    /// The device-level truth in MiB (the unit of the CSVs and of the ML models).
    pub fn truth_mib(&self) -> Option<f64> {
        self.truth.map(|t| t / MIB)
    }

    /// GPUMemNet's `Depth`: the column where the dataset has it, else what GPUMemNet's generators
    /// count (a Transformer's every listed layer, as its cleaner's `depth` counts each Embedding,
    /// attention, Linear, LayerNorm and Dropout line; the convolutions of a CNN; else the linear
    /// layers).
    pub fn gpumemnet_depth(&self) -> f64 {
        self.depth.unwrap_or_else(|| {
            if self.family == Family::Transformer {
                return self.features.layers.len() as f64;
            }
            let convs = self.count_layers(|k| k == "conv2d");
            (if convs > 0 { convs } else { self.count_layers(|k| k == "linear") }) as f64
        })
    }

    /// The activation function; `None` (GPUMemNet's word for none) where the dataset leaves the
    /// cell empty.
    pub fn activation_name(&self) -> &str {
        if self.activation.is_empty() {
            "None"
        } else {
            &self.activation
        }
    }

    /// Number of layers whose type, lower-cased, satisfies `pred`.
    pub fn count_layers(&self, pred: impl Fn(&str) -> bool) -> usize {
        self.features.layers.iter().filter(|l| pred(&l.kind.to_ascii_lowercase())).count()
    }

    /// The `arch:` field of the generator file name (`pyramid`, `residual`, ...), if present.
    pub fn architecture(&self) -> Option<&str> {
        let start = self.filename.find("arch:")? + "arch:".len();
        let rest = &self.filename[start..];
        Some(rest.split('_').next().unwrap_or(rest))
    }
}

/// Parse GPUMemNet's `Activations-Params` cell: torchsummary's Python-literal list of
/// `('type', activations, params)` tuples, e.g. `[('linear', 1173, 2753031), ('ReLU', 1173, 0)]`.
/// The message names the layer (0-based) at fault.
pub fn parse_activations_params(cell: &str) -> std::result::Result<Vec<Layer>, String> {
    let s = cell.trim();
    let inner = s
        .strip_prefix('[')
        .and_then(|t| t.strip_suffix(']'))
        .ok_or_else(|| format!("expected a list like [('linear', 10, 20), ...], found {}", preview(s)))?;
    let mut layers = Vec::new();
    let mut rest = inner.trim();
    while !rest.is_empty() {
        let at = |m: String| format!("layer {}: {m}", layers.len());
        let open = rest.strip_prefix('(').ok_or_else(|| at(format!("expected '(' at {}", preview(rest))))?;
        let close = open.find(')').ok_or_else(|| at(format!("unterminated tuple at {}", preview(rest))))?;
        layers.push(parse_tuple(&open[..close]).map_err(at)?);
        rest = open[close + 1..].trim_start();
        rest = rest.strip_prefix(',').unwrap_or(rest).trim_start();
    }
    Ok(layers)
}

fn parse_tuple(tuple: &str) -> std::result::Result<Layer, String> {
    let parts: Vec<&str> = tuple.split(',').map(str::trim).collect();
    if parts.len() != 3 {
        return Err(format!("expected ('type', activations, params), found ({tuple})"));
    }
    let name = parts[0];
    let kind = name
        .strip_prefix('\'')
        .and_then(|n| n.strip_suffix('\''))
        .or_else(|| name.strip_prefix('"').and_then(|n| n.strip_suffix('"')))
        .ok_or_else(|| format!("expected a quoted layer type, found {name}"))?;
    let int = |s: &str, what: &str| {
        s.parse::<u64>().map_err(|_| format!("expected a non-negative integer {what}, found {s:?}"))
    };
    Ok(Layer {
        kind: kind.to_string(),
        activations: int(parts[1], "activation count")?,
        parameters: int(parts[2], "parameter count")?,
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

/// A dataset's rows, and what its header leaves unsaid.
#[derive(Debug, Clone)]
pub struct Loaded {
    /// Every row, in file order.
    pub rows: Vec<DatasetRow>,
    /// Columns of no format read (a misspelt name is never read: its cells are ignored), and a
    /// missing `Status` where OOM rows cannot then be told from measured ones.
    pub warnings: Vec<String>,
}

/// Read a GPUMemNet-format CSV or the trainer's `dataset` output (told apart by its `spec`
/// column). Every column of `required` must be in the header and non-empty in every row (what a
/// consumer's features need beyond the format's own columns; the ML estimators require `Depth`
/// and `Activation Function`).
pub fn load(path: &Path, required: &[&str]) -> Result<Loaded> {
    let file = std::fs::File::open(path).map_err(|source| EstimateError::Io {
        path: path.to_path_buf(),
        action: "cannot read dataset",
        source,
    })?;
    read(path, file, required)
}

/// [`load`] from any reader; `path` names the input in errors and row ids.
pub fn read(path: &Path, reader: impl Read, required: &[&str]) -> Result<Loaded> {
    let mut rdr = csv::Reader::from_reader(reader);
    let headers = rdr.headers().map_err(|e| csv_err(path, 0, "<header>", &e.to_string()))?.clone();
    if headers.iter().all(|h| h.trim().is_empty()) {
        return Err(csv_err(
            path,
            0,
            "<header>",
            "expected a header line with the GPUMemNet columns; the file is empty",
        ));
    }
    // JSON (a features file, runs.jsonl, a model) read as CSV names a column it lacks; say what
    // the file is not.
    let first = headers.get(0).unwrap_or("").trim_start();
    if first.starts_with('{') || first.starts_with('[') {
        return Err(csv_err(
            path,
            0,
            "<header>",
            "expected a GPUMemNet CSV (or the trainer's `dataset` output); this file is JSON, not a GPUMemNet CSV",
        ));
    }
    // A column named twice was read from its first copy, whichever the writer meant.
    if let Some((column, msg)) = crate::columns::column_twice(&headers) {
        return Err(csv_err(path, 0, &column, &msg));
    }
    let opt_col = |name: &str| headers.iter().position(|h| h.trim() == name);
    let col = |name: &str| {
        opt_col(name).ok_or_else(|| csv_err(path, 0, name, "missing column: the header has no such column"))
    };
    let (c_file, c_ap, c_act, c_par, c_batch, c_mem) = (
        col("Filename")?,
        col("Activations-Params")?,
        col("Total Activations")?,
        col("Total Parameters")?,
        col("Batch Size")?,
        col("Max GPU Memory (MiB)")?,
    );
    let needed: Vec<(usize, &str)> = required.iter().map(|&name| Ok((col(name)?, name))).collect::<Result<_>>()?;
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
    let (c_job, c_profile, c_gpu) = (opt_col("job"), opt_col("profile"), opt_col("gpu"));
    let c_util = UTILIZATION_COLUMNS.map(opt_col);
    let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let mut rows = Vec::new();
    for (i, rec) in rdr.records().enumerate() {
        let row = i + 1;
        let rec = rec.map_err(|e| csv_err(path, row, "<row>", &e.to_string()))?;
        let get = |c: usize, name: &str| rec.get(c).ok_or_else(|| csv_err(path, row, name, "cell missing"));
        let opt_cell = |c: Option<usize>| c.and_then(|c| rec.get(c)).map(str::trim).filter(|s| !s.is_empty());
        let num = |c: usize, name: &str| -> Result<u64> {
            let s = get(c, name)?;
            crate::cells::whole_number(s).ok_or_else(|| {
                csv_err(
                    path,
                    row,
                    name,
                    &format!(
                        "expected a whole number >= 0 and <= {} (in float notation <= 2^53 = {}, past which it is not \
                         exact), got {s:?}",
                        u64::MAX,
                        crate::cells::EXACT_IN_F64
                    ),
                )
            })
        };
        let mib =
            |text: &str, name: &str| -> Result<f64> {
                text.trim().parse::<f64>().ok().filter(|v| v.is_finite() && *v >= 0.0).map(|v| v * MIB).ok_or_else(
                    || csv_err(path, row, name, &format!("expected a finite number of MiB >= 0, got {text:?}")),
                )
            };
        let finite = |c: Option<usize>, name: &str, what: &str| -> Result<Option<f64>> {
            opt_cell(c)
                .map(|s| {
                    s.parse::<f64>()
                        .ok()
                        .filter(|v| v.is_finite())
                        .ok_or_else(|| csv_err(path, row, name, &format!("expected {what}, got {s:?}")))
                })
                .transpose()
        };
        for &(c, name) in &needed {
            if opt_cell(Some(c)).is_none() {
                return Err(csv_err(path, row, name, "expected a value (required here), found an empty cell"));
            }
        }
        let layers = parse_activations_params(get(c_ap, "Activations-Params")?)
            .map_err(|e| csv_err(path, row, "Activations-Params", &e))?;
        let batch = num(c_batch, "Batch Size")?;
        if batch == 0 {
            return Err(csv_err(path, row, "Batch Size", "expected a batch of at least 1, got 0"));
        }
        let status_oom = match c_status {
            None => false,
            Some(c) => match get(c, "Status")?.trim() {
                s if s.eq_ignore_ascii_case("SUCCESSFUL") => false,
                s if s.eq_ignore_ascii_case("OOM_CRASH") => true,
                s => return Err(csv_err(path, row, "Status", &format!("expected SUCCESSFUL or OOM_CRASH, got {s:?}"))),
            },
        };
        let label_oom = match opt_cell(c_oom) {
            None => false,
            Some(s) => s
                .to_ascii_lowercase()
                .parse::<bool>()
                .map_err(|_| csv_err(path, row, "oom", &format!("expected true or false, got {s:?}")))?,
        };
        let real_oom = status_oom || label_oom;
        // Device-level truth: the trainer's NVML peak where present, else GPUMemNet's label. Only
        // the trainer's rows may lack one (CPU-fallback runs have no GPU labels). An OOM row's
        // label is not a measurement and is not read.
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
            model: None,
            seq_len: None,
            input_shape: None,
            layers,
        };
        let filename = get(c_file, "Filename")?.trim().to_string();
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
        // GPUMemNet writes -1 where DCGM produced no non-zero sample. Anything else outside the
        // metric's range (GPUTL is a percent, the others fractions) is no measurement: a 1.5 was
        // trained on as "high", a -0.2 said to be a missing sample.
        let util = |k: usize| -> Result<Option<f64>> {
            let (name, top) = (UTILIZATION_COLUMNS[k], if k == 0 { 100.0 } else { 1.0 });
            match finite(c_util[k], name, "a finite number (-1: no sample)")? {
                Some(-1.0) => Ok(None),
                Some(v) if !(0.0..=top).contains(&v) => Err(csv_err(
                    path,
                    row,
                    name,
                    &format!(
                        "expected a {} in [0, {top}], or -1 (no sample), got {v}",
                        if k == 0 { "percent" } else { "fraction" }
                    ),
                )),
                v => Ok(v),
            }
        };
        rows.push(DatasetRow {
            id: format!("{stem}-{row:05}"),
            row,
            digest: crate::rows::digest(headers.iter(), rec.iter()),
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
            depth: match finite(c_depth, "Depth", "a finite number >= 0")? {
                Some(d) if d < 0.0 => {
                    return Err(csv_err(path, row, "Depth", &format!("expected a layer count >= 0, got {d}")))
                }
                d => d,
            },
            activation: opt_cell(c_activation).unwrap_or("").to_string(),
            util: Utilization { gputl: util(0)?, gract: util(1)?, smact: util(2)?, smocc: util(3)?, fp32a: util(4)? },
            job: opt_cell(c_job)
                .map(job_of)
                .transpose()
                .map_err(|e| csv_err(path, row, "job", &e))?
                .unwrap_or_default(),
            profile: opt_cell(c_profile).map(str::to_string),
            gpu: opt_cell(c_gpu).map(str::to_string),
            own_run: c_spec.is_some(),
        });
    }
    if rows.is_empty() {
        // Every consumer (compare, calibrate, safety) would write an empty report and exit 0.
        return Err(csv_err(path, 0, "<rows>", "at least one data row (the file holds only its header)"));
    }
    let warnings = crate::columns::warnings(path, &headers, &rows);
    Ok(Loaded { rows, warnings })
}

fn csv_err(path: &Path, row: usize, column: &str, expected: &str) -> EstimateError {
    EstimateError::Csv { path: path.to_path_buf(), row, column: column.to_string(), expected: expected.to_string() }
}

/// A measured peak past any device (the allocator model's largest capacity, 256 TiB): a typo or
/// a unit slip that would outweigh every other row of a metric or a fit.
pub fn past_any_device(bytes: f64) -> bool {
    bytes > trace::units::MAX_CAPACITY as f64
}

/// The first row of `rows` (read from `path`) whose measured peak is past any device, as the
/// loader's error naming the file, row and column: `compare` scores truths, and one such row
/// dominated its metrics (`ml` leaves such a row out instead, with a warning).
pub fn refuse_past_any_device(path: &Path, rows: &[DatasetRow]) -> Result<()> {
    for r in rows {
        for (column, v) in [(r.truth_column, r.truth), ("max_memory_reserved_mib", r.reserved_truth)] {
            if let Some(b) = v.filter(|b| past_any_device(*b)) {
                let msg =
                    format!("expected a measured peak of at most 256 TiB (past any device), got {:e} MiB", b / MIB);
                return Err(csv_err(path, r.row, column, &msg));
            }
        }
    }
    Ok(())
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
