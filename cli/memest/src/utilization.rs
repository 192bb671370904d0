//! `memest util`: GPUUtilNet-style utilisation classes (SMACT / SMOCC) from model features.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Subcommand};
use estimators::ml::protocol::ProtocolConfig;
use estimators::ml::utilization::{self as util, UtilMetric, DEFAULT_THRESHOLDS};
use estimators::ml::{render, KernelFeatures, TrainConfig};

/// Predict DCGM utilisation classes (low / medium / high) from model features.
#[derive(Args, Debug)]
pub struct UtilArgs {
    #[command(subcommand)]
    command: UtilCommand,
}

#[derive(Subcommand, Debug)]
enum UtilCommand {
    /// Stratified, seeded k-fold CV under a stratified held-out test set, every model family.
    Cv(CvArgs),
}

#[derive(Args, Debug)]
struct CvArgs {
    /// GPUMemNet-format CSV with `Avg SMACT` / `Avg SMOCC` columns.
    #[arg(long)]
    dataset: PathBuf,
    /// smact or smocc.
    #[arg(long)]
    metric: String,
    /// Inner thresholds: "LOW_MED,MED_HIGH", or "tertiles" for the metric's tertiles over the
    /// dataset's usable rows (three equal classes). Default: thirds of 0–1. The paper's bins
    /// are not in the reference material.
    #[arg(long, value_name = "LOW_MED,MED_HIGH|tertiles")]
    thresholds: Option<String>,
    /// Number of CV folds.
    #[arg(long, default_value_t = 3, allow_negative_numbers = true)]
    folds: usize,
    /// Split seed and model seed.
    #[arg(long, default_value_t = 42, allow_negative_numbers = true)]
    seed: u64,
    /// Epochs for the MLP ensembles.
    #[arg(long, default_value_t = 100, value_parser = crate::ml::at_least_one, allow_negative_numbers = true)]
    epochs: usize,
    /// Append the `k_` columns of this file (`python -m memtrace_trainer kernel-stats
    /// --gpumemnet CSV --out FILE`), joined by `Filename`, to every model's features.
    #[arg(long, value_name = "FILE.csv")]
    kernel_features: Option<PathBuf>,
    /// Print `{"accuracy","high_class_recall","f1","model","models":[...],"report":{...}}` as JSON
    /// (`report`: the whole CV report the text renders).
    #[arg(long)]
    json: bool,
}

/// Runs `memest util ...`.
pub fn run(args: UtilArgs) -> anyhow::Result<u8> {
    match args.command {
        UtilCommand::Cv(a) => cv(a),
    }
}

fn cv(a: CvArgs) -> anyhow::Result<u8> {
    let metric =
        UtilMetric::parse(&a.metric).with_context(|| format!("--metric {:?}: expected smact or smocc", a.metric))?;
    if a.folds < 2 || a.folds > 1000 {
        anyhow::bail!("--folds {}: expected at least 2 (and no more than the usable rows)", a.folds);
    }
    let ds = crate::ml::load_dataset(&a.dataset)?;
    let thresholds = match a.thresholds.as_deref().map(str::trim) {
        None => DEFAULT_THRESHOLDS,
        Some("tertiles") => util::tertiles(&ds, metric)?,
        Some(t) => match t.split(',').map(|x| x.trim().parse::<f64>()).collect::<Result<Vec<_>, _>>() {
            Ok(v) if v.len() == 2 => [v[0], v[1]],
            _ => anyhow::bail!("--thresholds {t:?}: expected two numbers \"LOW_MED,MED_HIGH\" or \"tertiles\""),
        },
    };
    let kernel = a.kernel_features.as_deref().map(KernelFeatures::load).transpose()?;
    for w in kernel.iter().flat_map(|k| k.mismatches(&ds.rows)) {
        eprintln!("memest: warning: {}", trace::terminal::printable(&w));
    }
    let cfg = ProtocolConfig {
        seed: a.seed,
        folds: a.folds,
        train: TrainConfig { seed: a.seed, mlp_epochs: a.epochs, ..TrainConfig::default() },
        ..ProtocolConfig::default()
    };
    let (summary, report) = util::cross_validate(&ds, metric, thresholds, &cfg, kernel.as_ref())?;
    let mut out = std::io::stdout().lock();
    if a.json {
        // Every number the text prints (rows, excluded, test rows, CV means and spreads, weighted
        // F1, below-diagonal, the regressors' MRE and under-rate) is in the report it renders.
        let mut v = serde_json::to_value(&summary)?;
        v["report"] = serde_json::to_value(&report)?;
        writeln!(out, "{}", serde_json::to_string_pretty(&v)?)?;
    } else {
        write!(out, "{}", render::markdown(&report))?;
        writeln!(
            out,
            "\nbest by CV accuracy: {} (test accuracy {:.3}, high-class recall {}, macro F1 {:.3})",
            summary.model,
            summary.accuracy,
            summary.high_class_recall.map_or("–".into(), |r| format!("{r:.3}")),
            summary.f1
        )?;
    }
    Ok(0u8)
}
