//! `memest ml`: train, apply and evaluate GPUMemNet-style ML estimators.
//!
//! Model files trained on the GPUMemNet CSVs (CC BY-NC 4.0) are non-commercial build outputs and
//! are not committed; every command that writes one says so.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use estimators::ml::modelfile::{ModelFile, LICENCE_NOTE, OWN_DATA_NOTE};
use estimators::ml::protocol::{self, ProtocolConfig};
use estimators::ml::{render, Dataset, Examples, Family, ModelKind, Target, TrainConfig};

/// Train, apply and evaluate ML estimators (classifiers over memory bins, regressors of MiB).
#[derive(Args, Debug)]
pub struct MlArgs {
    #[command(subcommand)]
    command: MlCommand,
}

#[derive(Subcommand, Debug)]
enum MlCommand {
    /// Train one model on every usable row of a GPUMemNet CSV and write a model file.
    Train(TrainArgs),
    /// Apply a model file to feature JSON or to a GPUMemNet CSV.
    Predict(PredictArgs),
    /// Stratified, seeded k-fold CV under a stratified held-out test set, all model families.
    Cv(EvalArgs),
    /// GPUMemNet's own protocol: 70/20/10 split and 3-fold shuffled KFold, seed 42.
    Reproduce(EvalArgs),
}

/// Training knobs shared by every subcommand that fits models.
#[derive(Args, Debug, Clone)]
struct Knobs {
    /// Seed for splits, bootstraps, initialisation and batch order [default: 42].
    #[arg(long, allow_negative_numbers = true)]
    seed: Option<u64>,
    /// Epochs for the MLP ensembles (mlp-ensemble, mlp-reg) [default: 100].
    #[arg(long, value_parser = at_least_one, allow_negative_numbers = true)]
    epochs: Option<usize>,
    /// Trees in the forest and bagging ensembles (forest, bagging, forest-reg) [default: 50].
    #[arg(long, value_parser = at_least_one, allow_negative_numbers = true)]
    trees: Option<usize>,
    /// perpetual's gradient-boosting budget (gbm, gbm-reg) [default: 0.5].
    #[arg(long, value_parser = positive_budget, allow_negative_numbers = true)]
    budget: Option<f32>,
}

/// A count of epochs or trees: 0 trained nothing (an untrained model written as a result) or was
/// taken as 1.
pub(crate) fn at_least_one(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err("expected a whole number, at least 1".into()),
    }
}

/// perpetual's budget: a finite number above zero (NaN was taken).
fn positive_budget(s: &str) -> Result<f32, String> {
    match s.trim().parse::<f32>() {
        Ok(b) if b.is_finite() && b > 0.0 => Ok(b),
        _ => Err("expected a finite number above 0, e.g. 0.5".into()),
    }
}

impl Knobs {
    fn train_config(&self) -> TrainConfig {
        TrainConfig {
            seed: self.seed(),
            mlp_epochs: self.epochs.unwrap_or(100),
            trees: self.trees.unwrap_or(50),
            gbm_budget: self.budget.unwrap_or(0.5),
        }
    }

    fn seed(&self) -> u64 {
        self.seed.unwrap_or(42)
    }

    /// `--seed`, given to train a model with no randomness (no split, bootstrap or
    /// initialisation in `ml train`), as a warning line; `cv` splits with it whatever the model.
    fn seed_unused_by(&self, kind: ModelKind) -> Option<String> {
        use ModelKind::*;
        let seed = self.seed.filter(|_| matches!(kind, Logistic | Tree | LinearReg))?;
        Some(format!(
            "--seed {seed} has no effect on a {} model: its fit is deterministic (the seed is for the forests, \
             bagging, gradient boosting and the MLP ensembles)",
            kind.name()
        ))
    }

    /// The knobs given that none of `kinds` uses, each as a warning line.
    fn unused_by(&self, kinds: &[ModelKind]) -> Vec<String> {
        use ModelKind::*;
        let uses = |f: fn(ModelKind) -> bool| kinds.iter().any(|k| f(*k));
        let given = [
            (
                "--epochs",
                self.epochs.map(|v| v.to_string()),
                uses(|k| matches!(k, MlpEnsemble | MlpReg)),
                "the MLP ensembles",
            ),
            (
                "--trees",
                self.trees.map(|v| v.to_string()),
                uses(|k| matches!(k, Forest | Bagging | ForestReg)),
                "the forests",
            ),
            ("--budget", self.budget.map(|v| v.to_string()), uses(|k| matches!(k, Gbm | GbmReg)), "gradient boosting"),
        ];
        let names = kinds.iter().map(|k| k.name()).collect::<Vec<_>>().join(", ");
        let models = if kinds.len() == 1 { "model" } else { "models" };
        given
            .into_iter()
            .filter_map(|(flag, v, used, whose)| match (v, used) {
                (Some(v), false) => Some(format!("{flag} {v} has no effect on a {names} {models}: it is for {whose}")),
                _ => None,
            })
            .collect()
    }
}

#[derive(Args, Debug)]
struct TrainArgs {
    /// GPUMemNet-format CSV.
    #[arg(long)]
    dataset: PathBuf,
    /// Expected family (mlp, cnn, transformer); checked against the layer types in the file.
    #[arg(long)]
    family: Option<String>,
    /// Model family: logistic, tree, forest, bagging, gbm, mlp-ensemble (classifiers); linear-reg,
    /// forest-reg, gbm-reg, mlp-reg (regressors).
    #[arg(long)]
    model: String,
    /// Where to write the model file (JSON).
    #[arg(long)]
    out: PathBuf,
    #[command(flatten)]
    knobs: Knobs,
}

#[derive(Args, Debug)]
struct PredictArgs {
    /// Model file written by `memest ml train`.
    #[arg(long)]
    model: PathBuf,
    /// Features as inline JSON (an object or an array of objects keyed by feature name) or a
    /// path to such a JSON file (the names are listed in --help), or the trainer's features
    /// document (`memtrace_trainer features --json`).
    #[arg(long, conflicts_with = "dataset", required_unless_present = "dataset", long_help = features_help())]
    features: Option<String>,
    /// A GPUMemNet-format CSV to predict every usable row of (and score, since it has labels).
    #[arg(long)]
    dataset: Option<PathBuf>,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

/// `--features`' long help: the feature names of each family, from the one feature list.
fn features_help() -> String {
    let families: Vec<String> = Family::ALL
        .iter()
        .map(|&f| format!("  {f}: {}", estimators::ml::features::feature_names(f).join(", ")))
        .collect();
    format!(
        "Features as inline JSON (an object or an array of objects keyed by feature name) or a path to such a JSON \
         file. The keys are exactly the model family's features:\n{}\nCounts are whole numbers; activation_sin and \
         activation_cos are the activation's (sin, cos) encoding.\n\nOr the trainer's features document \
         (`memtrace_trainer features --json`, an object with `total_parameters`): the features are computed from it \
         as `memest estimate --features` computes them, the same answer.",
        families.join("\n")
    )
}

#[derive(Args, Debug)]
struct EvalArgs {
    /// GPUMemNet-format CSV.
    #[arg(long)]
    dataset: PathBuf,
    /// Comma-separated model families (default: all).
    #[arg(long, value_delimiter = ',')]
    models: Vec<String>,
    /// Number of CV folds.
    #[arg(long, default_value_t = 3, allow_negative_numbers = true)]
    folds: usize,
    /// Held-out test fraction, in (0, 1) (stratified CV only; `reproduce` holds out GPUMemNet's
    /// 10%) [default: 0.2].
    #[arg(long, allow_negative_numbers = true)]
    test_frac: Option<f64>,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    knobs: Knobs,
}

/// Runs `memest ml ...`.
pub fn run(args: MlArgs) -> anyhow::Result<u8> {
    match args.command {
        MlCommand::Train(a) => train(a),
        MlCommand::Predict(a) => predict(a),
        MlCommand::Cv(a) => evaluate(a, false),
        MlCommand::Reproduce(a) => evaluate(a, true),
    }
}

fn parse_model(name: &str) -> anyhow::Result<ModelKind> {
    ModelKind::parse(name).with_context(|| {
        let all: Vec<&str> = ModelKind::CLASSIFIERS.iter().chain(&ModelKind::REGRESSORS).map(|k| k.name()).collect();
        format!("unknown model {name:?}; expected one of {}", all.join(", "))
    })
}

/// The dataset at `path`, saying what its header leaves unsaid (columns never read, no `Status`).
pub(crate) fn load_dataset(path: &Path) -> anyhow::Result<Dataset> {
    let ds = Dataset::load(path)?;
    for w in &ds.warnings {
        eprintln!("memest: warning: {}", trace::terminal::printable(w));
    }
    Ok(ds)
}

/// The rows of `path` as examples, and whether every row is the trainer's own run (its licence
/// is then not GPUMemNet's).
fn load_examples(path: &Path, family: Option<&str>) -> anyhow::Result<(Examples, bool)> {
    let ds = load_dataset(path)?;
    let detected = ds.family()?;
    if let Some(f) = family {
        let want = Family::parse(f).with_context(|| format!("--family {f:?}: expected mlp, cnn or transformer"))?;
        if want != detected {
            bail!("{}: --family {want} but the layer types make these rows {detected}", path.display());
        }
    }
    let own = ds.rows.iter().all(|r| r.own_run);
    Ok((Examples::build(&ds, &Target::memory(detected))?, own))
}

fn train(a: TrainArgs) -> anyhow::Result<u8> {
    let kind = parse_model(&a.model)?;
    for w in a.knobs.unused_by(&[kind]).into_iter().chain(a.knobs.seed_unused_by(kind)) {
        eprintln!("memest: warning: {}", trace::terminal::printable(&w));
    }
    // The model file would replace the data it was trained on.
    crate::outputs::refuse_input("--out", &a.out, [("the --dataset", a.dataset.as_path())])?;
    let (ex, own) = load_examples(&a.dataset, a.family.as_deref())?;
    say_excluded(&a.dataset, &ex.excluded);
    let classes: Vec<&String> =
        ex.target.binning.names.iter().zip(ex.class_counts()).filter(|(_, n)| *n > 0).map(|(c, _)| c).collect();
    if !kind.is_regressor() && classes.len() == 1 {
        eprintln!(
            "memest: warning: every training row of {} falls in one class ({}): the {} classifier learns to answer \
             that class alone, whatever the job",
            a.dataset.display(),
            classes[0],
            kind.name()
        );
    }
    let cfg = a.knobs.train_config();
    let licence = if own { OWN_DATA_NOTE } else { LICENCE_NOTE };
    let file = ModelFile::train(&ex, kind, &cfg, &a.dataset.display().to_string(), licence)?;
    file.save(&a.out)?;
    eprintln!(
        "wrote {} ({} {} model, {} training rows)\nnote: {licence}",
        a.out.display(),
        ex.family,
        kind.name(),
        file.training_rows
    );
    Ok(0u8)
}

fn predict(a: PredictArgs) -> anyhow::Result<u8> {
    let model = ModelFile::load(&a.model)?;
    let mut out = std::io::stdout().lock();
    if let Some(f) = &a.features {
        let (text, source) = if f.trim_start().starts_with(['{', '[']) {
            (f.clone(), "--features".to_string())
        } else {
            let text =
                trace::read_small_string(std::path::Path::new(f), 256 << 20).with_context(|| format!("reading {f}"))?;
            (text, f.clone())
        };
        let json: serde_json::Value =
            serde_json::from_str(&text).with_context(|| format!("{source}: not valid JSON"))?;
        let answers = if json.get("total_parameters").is_some() {
            // The trainer's features document: the one parser and feature extraction the `ml`
            // estimate of `memest estimate --features` uses, so both give one answer.
            let file = estimators::features_file::FeaturesFile::parse(&text, Path::new(&source))?;
            for w in &file.warnings {
                eprintln!("memest: warning: {}", trace::terminal::printable(w));
            }
            let job = estimators::ml::job::predict_job(&model, &a.model, &file, &source)?;
            for w in &job.warnings {
                eprintln!("memest: warning: {}", trace::terminal::printable(w));
            }
            vec![(job.prediction, job.warnings)]
        } else {
            // serde_json keeps the last of a key given twice, as the features file refuses.
            if let Some(key) = estimators::features_file::duplicate_key(&text) {
                bail!("{source}: key {key:?} is given twice: expected each key once (the last would be read)");
            }
            let x = model.features_from_json(&json, &source)?;
            if x.nrows() == 0 {
                bail!("{source}: no feature object to predict (expected an object, or an array of at least one)");
            }
            if let Some(w) = model.range_unknown(&a.model) {
                eprintln!("memest: warning: {}", trace::terminal::printable(&w));
            }
            let preds = model.predict(&x)?;
            let n = preds.len();
            preds
                .into_iter()
                .zip(x.rows())
                .enumerate()
                .map(|(i, (p, row))| {
                    let at = if n > 1 { format!("{source}: entry {i}") } else { source.clone() };
                    let warnings = model.outside_training_at(&row.to_vec(), &at);
                    for w in &warnings {
                        eprintln!("memest: warning: {}: {}", a.model.display(), trace::terminal::printable(w));
                    }
                    (p, warnings)
                })
                .collect()
        };
        let mut docs = Vec::with_capacity(answers.len());
        for (p, warnings) in &answers {
            let (estimate, why) = match p.mib() {
                Ok(mib) => (Some(mib), None),
                Err(why) => (None, Some(why)),
            };
            if a.json {
                let mut doc =
                    serde_json::json!({"class": p.class, "bin": p.bin, "estimate": estimate, "warnings": warnings});
                if let Some(why) = why {
                    doc["unavailable"] = why.into();
                }
                docs.push(doc);
            } else {
                let bin = p.bin.as_ref().map(|b| format!(" (bin {b})")).unwrap_or_default();
                match estimate {
                    Some(mib) => writeln!(out, "{mib} MiB{bin}")?,
                    None => writeln!(out, "no estimate{bin}: {}", why.unwrap_or_default())?,
                }
            }
        }
        if a.json {
            writeln!(out, "{}", serde_json::to_string_pretty(&docs)?)?;
        }
        return Ok(0u8);
    }
    let path = a.dataset.as_ref().context("--features or --dataset is required")?;
    let ds = load_dataset(path)?;
    let family = ds.family()?;
    if family != model.family {
        bail!("{}: rows are {family} but {} was trained for {}", path.display(), a.model.display(), model.family);
    }
    let ex = Examples::build(&ds, &model.target)?;
    say_excluded(path, &ex.excluded);
    let preds = model.predict(&ex.x)?;
    let regressor = model.pipeline.kind.is_regressor();
    // A regressor's truth is a measured peak: an OOM row's relabelled value (or a 0-MiB row's)
    // is none, and is not scored.
    let scored = |i: usize| !regressor || ex.measured[i];
    // A score on rows the model was trained on is no held-out result, whatever the file's name.
    let measured: Vec<usize> = (0..preds.len()).filter(|&i| scored(i)).collect();
    let n_scored = measured.len();
    let in_sample = measured.iter().filter(|&&i| model.trained_on_row(&ex.digests[i], path)).count();
    if in_sample > 0 {
        let which = if in_sample == n_scored {
            format!("all {n_scored} scored rows of {}: the summary is in-sample", path.display())
        } else {
            format!(
                "{in_sample} of the {n_scored} rows scored from {}: the summary is in-sample for them",
                path.display()
            )
        };
        eprintln!("memest: warning: {} was trained on {which}, not held out", a.model.display());
    }
    say_outside_training(&model, &a.model, path, &ex);
    let rows: Vec<serde_json::Value> = (0..preds.len())
        .map(|i| {
            let truth = if scored(i) { serde_json::json!(ex.value[i]) } else { serde_json::Value::Null };
            let mut row = serde_json::json!({"row": ex.row_ids[i], "estimate": preds[i].mib().ok(), "bin": preds[i].bin,
                                             "truth": truth});
            if let Err(why) = preds[i].mib() {
                row["unavailable"] = why.into();
            }
            row
        })
        .collect();
    let none = rows.iter().filter(|r| r["estimate"].is_null()).count();
    if none > 0 {
        eprintln!(
            "memest: warning: {none} of the {} rows of {} have no estimate (the model's answer is negative or not a \
             finite number: the input is outside what it was trained on): they are printed as none and scored by the \
             model's answer",
            rows.len(),
            path.display()
        );
    }
    let summary = if regressor {
        let left_out = preds.len() - measured.len();
        if left_out > 0 {
            eprintln!(
                "memest: warning: {left_out} of the {} rows of {} have no measured peak (an OOM crash, or 0 MiB): the \
                 regressor is scored on the other {} only",
                preds.len(),
                path.display(),
                measured.len()
            );
        }
        let truth: Vec<f64> = measured.iter().map(|&i| ex.value[i]).collect();
        let est: Vec<f64> = measured.iter().map(|&i| preds[i].raw).collect();
        serde_json::json!({"mre": estimators::ml::score::mre(&truth, &est),
                           "mae": estimators::ml::score::mae(&truth, &est),
                           "scored_rows": n_scored, "unmeasured_rows_left_out": left_out,
                           "in_sample_rows": in_sample})
    } else {
        let pred: Vec<usize> = preds.iter().filter_map(|p| p.class).collect();
        serde_json::json!({"accuracy": estimators::ml::score::accuracy(&ex.class, &pred),
                           "f1_macro": estimators::ml::score::f1_macro(&ex.class, &pred),
                           "scored_rows": n_scored, "in_sample_rows": in_sample})
    };
    if a.json {
        let doc = serde_json::json!({"predictions": rows, "summary": summary});
        writeln!(out, "{}", serde_json::to_string_pretty(&doc)?)?;
    } else {
        for r in &rows {
            let truth =
                if r["truth"].is_null() { "none measured: not scored".to_string() } else { r["truth"].to_string() };
            match r["estimate"].as_f64() {
                Some(mib) => writeln!(out, "row {} estimate {mib} MiB (truth {truth})", r["row"])?,
                None => writeln!(
                    out,
                    "row {} no estimate: {} (truth {truth})",
                    r["row"],
                    r["unavailable"].as_str().unwrap_or("")
                )?,
            }
        }
        writeln!(out, "summary: {summary}")?;
    }
    Ok(0u8)
}

/// The rows of `path` with a feature outside the range `model` (at `model_path`) was trained on,
/// counted, the first named; or that the model file does not record the range.
fn say_outside_training(model: &ModelFile, model_path: &Path, path: &Path, ex: &Examples) {
    if let Some(w) = model.range_unknown(model_path) {
        eprintln!("memest: warning: {}", trace::terminal::printable(&w));
    }
    let outside: Vec<(usize, Vec<String>)> =
        ex.x.rows()
            .into_iter()
            .enumerate()
            .map(|(i, row)| (ex.row_ids[i], model.outside_training(&row.to_vec())))
            .filter(|(_, w)| !w.is_empty())
            .collect();
    if let Some((row, first)) = outside.first() {
        eprintln!(
            "memest: warning: {}: {} of the {} rows of {} lie outside the range the model was trained on (row {row}: \
             {}): its answers there are extrapolations",
            model_path.display(),
            outside.len(),
            ex.len(),
            path.display(),
            first.join("; ")
        );
    }
}

/// The rows of `path` left out, per reason (`ml cv` prints them in its report).
fn say_excluded(path: &std::path::Path, excluded: &std::collections::BTreeMap<String, usize>) {
    for (reason, n) in excluded {
        eprintln!("memest: warning: {}: {n} rows left out: {reason}", path.display());
    }
}

fn evaluate(a: EvalArgs, gpumemnet: bool) -> anyhow::Result<u8> {
    if a.folds < 2 {
        bail!("--folds {}: expected at least 2", a.folds);
    }
    let test_frac = match a.test_frac {
        // NaN fails this too.
        Some(f) if !(f > 0.0 && f < 1.0) => bail!("--test-frac {f}: expected a fraction in (0, 1)"),
        Some(f) if gpumemnet => {
            eprintln!("memest: warning: --test-frac {f} has no effect on reproduce: it holds out GPUMemNet's 10%");
            f
        }
        f => f.unwrap_or(0.2),
    };
    let mut cfg = ProtocolConfig {
        seed: a.knobs.seed(),
        folds: a.folds,
        test_frac,
        train: a.knobs.train_config(),
        ..ProtocolConfig::default()
    };
    if !a.models.is_empty() {
        cfg.models = Vec::new();
        for m in &a.models {
            let kind = parse_model(m)?;
            if cfg.models.contains(&kind) {
                eprintln!("memest: warning: --models names {} twice: it runs once", kind.name());
            } else {
                cfg.models.push(kind);
            }
        }
    }
    if gpumemnet {
        cfg.models = gpumemnet_models(&cfg.models, !a.models.is_empty())?;
    }
    for w in a.knobs.unused_by(&cfg.models) {
        eprintln!("memest: warning: {}", trace::terminal::printable(&w));
    }
    let (ex, _) = load_examples(&a.dataset, None)?;
    if a.folds > ex.len() {
        bail!("--folds {}: expected at most the {} usable rows of {}", a.folds, ex.len(), a.dataset.display());
    }
    if !gpumemnet {
        // The folds share the rows left after the test set: said here, as a flag's error.
        protocol::plan(&ex, &cfg).with_context(|| format!("--folds {}", a.folds))?;
    }
    let name = a.dataset.display().to_string();
    let report =
        if gpumemnet { protocol::reproduce(&ex, &name, &cfg)? } else { protocol::cross_validate(&ex, &name, &cfg)? };
    let mut out = std::io::stdout().lock();
    if a.json {
        writeln!(out, "{}", serde_json::to_string_pretty(&report)?)?;
    } else {
        write!(out, "{}", render::markdown(&report))?;
    }
    Ok(0u8)
}

/// The models `reproduce` runs of `models`: GPUMemNet's protocol has classifiers only. The
/// regressors `--models` named (`asked`) are said to be dropped; none left is an error.
fn gpumemnet_models(models: &[ModelKind], asked: bool) -> anyhow::Result<Vec<ModelKind>> {
    let (regressors, classifiers): (Vec<ModelKind>, Vec<ModelKind>) =
        models.iter().copied().partition(|k| k.is_regressor());
    let names = |v: &[ModelKind]| v.iter().map(|k| k.name()).collect::<Vec<_>>().join(", ");
    if classifiers.is_empty() {
        bail!(
            "--models {}: reproduce runs GPUMemNet's protocol, which has classifiers only ({}); score regressors with \
             `memest ml cv`",
            names(&regressors),
            names(&ModelKind::CLASSIFIERS)
        );
    }
    if asked && !regressors.is_empty() {
        eprintln!(
            "memest: warning: --models {} left out of reproduce: GPUMemNet's protocol has classifiers only (`memest \
             ml cv` scores regressors)",
            names(&regressors)
        );
    }
    Ok(classifiers)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_model_help_lists_every_model() {
        use clap::Args as _;
        let help = TrainArgs::augment_args(clap::Command::new("train")).render_long_help().to_string();
        for k in ModelKind::CLASSIFIERS.iter().chain(&ModelKind::REGRESSORS) {
            assert!(help.contains(k.name()), "--model's help leaves out {}:\n{help}", k.name());
        }
    }

    #[test]
    fn knobs_a_model_does_not_use_are_said() {
        let knobs = Knobs { seed: Some(1), epochs: Some(7), trees: Some(3), budget: None };
        let said = knobs.unused_by(&[ModelKind::Tree]);
        assert_eq!(said.len(), 2, "{said:?}");
        assert!(said[0].starts_with("--epochs 7 has no effect on a tree model"), "{said:?}");
        assert!(said[1].starts_with("--trees 3 has no effect on a tree model"), "{said:?}");
        assert_eq!(
            knobs.unused_by(&[ModelKind::Forest]),
            vec!["--epochs 7 has no effect on a forest model: it is for the MLP ensembles".to_string()]
        );
        // Among several models (cv), a knob one of them uses is not said.
        assert_eq!(
            knobs.unused_by(&[ModelKind::Logistic, ModelKind::Forest]),
            vec!["--epochs 7 has no effect on a logistic, forest models: it is for the MLP ensembles".to_string()]
        );
        let none = Knobs { seed: None, epochs: None, trees: None, budget: None };
        assert!(none.unused_by(&[ModelKind::Tree]).is_empty());
        assert_eq!(none.train_config().mlp_epochs, 100);
    }
}
