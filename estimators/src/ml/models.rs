//! The model families compared: linfa logistic regression; CART decision tree, random forest
//! and bagging ([`super::cart`]: deterministic, unlike linfa-trees 0.8.1); perpetual gradient
//! boosting; GPUMemNet's MLP ensemble; and regressors of the raw target (linfa OLS, random
//! forest, perpetual, MLP ensemble). Each is wrapped with a [`Standardizer`] fitted on the
//! training rows only.

use linfa::traits::{Fit, Predict};
use linfa::Dataset;
use linfa_linear::{FittedLinearRegression, LinearRegression};
use linfa_logistic::{MultiFittedLogisticRegression, MultiLogisticRegression};
use ndarray::{Array1, Array2, Axis};
use perpetual::objective::Objective;
use perpetual::{Matrix, MultiOutputBooster, PerpetualBooster};
use serde::{Deserialize, Serialize};

use super::cart::{Forest, TreeParams, TreeTask};
use super::error::MlError;
use super::mlp::{MlpEnsemble, MlpParams, MlpTask};
use super::scale::Standardizer;
use crate::features::Family;

/// A model family, by its command-line name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ModelKind {
    /// Multinomial logistic regression (linfa-logistic, L-BFGS).
    Logistic,
    /// One CART decision tree (Gini, grown to purity).
    Tree,
    /// Random forest: bootstrapped trees, √d candidate features per split (sklearn's default).
    Forest,
    /// Bagging: bootstrapped trees, all features at every split.
    Bagging,
    /// Gradient-boosted trees (perpetual, log-loss, one booster per class or native multiclass).
    Gbm,
    /// GPUMemNet's small-MLP ensemble.
    MlpEnsemble,
    /// Ordinary least squares on the target (linfa-linear).
    LinearReg,
    /// Random-forest regression (bootstrapped trees, d/3 candidate features per split).
    ForestReg,
    /// Gradient-boosted regression trees (perpetual, squared loss).
    GbmReg,
    /// The MLP ensemble with one output and squared loss.
    MlpReg,
}

impl ModelKind {
    /// Every classifier, in report order.
    pub const CLASSIFIERS: [ModelKind; 6] = [
        ModelKind::Logistic,
        ModelKind::Tree,
        ModelKind::Forest,
        ModelKind::Bagging,
        ModelKind::Gbm,
        ModelKind::MlpEnsemble,
    ];
    /// Every regressor, in report order.
    pub const REGRESSORS: [ModelKind; 4] =
        [ModelKind::LinearReg, ModelKind::ForestReg, ModelKind::GbmReg, ModelKind::MlpReg];

    /// Command-line name.
    pub fn name(self) -> &'static str {
        match self {
            ModelKind::Logistic => "logistic",
            ModelKind::Tree => "tree",
            ModelKind::Forest => "forest",
            ModelKind::Bagging => "bagging",
            ModelKind::Gbm => "gbm",
            ModelKind::MlpEnsemble => "mlp-ensemble",
            ModelKind::LinearReg => "linear-reg",
            ModelKind::ForestReg => "forest-reg",
            ModelKind::GbmReg => "gbm-reg",
            ModelKind::MlpReg => "mlp-reg",
        }
    }

    /// Parses a command-line name.
    pub fn parse(s: &str) -> Option<ModelKind> {
        Self::CLASSIFIERS.into_iter().chain(Self::REGRESSORS).find(|k| k.name() == s)
    }

    /// True for the models that predict the target value rather than its bin.
    pub fn is_regressor(self) -> bool {
        Self::REGRESSORS.contains(&self)
    }
}

/// Settings shared by every model family.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainConfig {
    /// Seed for every random choice (bootstraps, initialisation, batch order, boosting).
    pub seed: u64,
    /// Epochs for the MLP ensembles.
    pub mlp_epochs: usize,
    /// Trees in the forest and bagging ensembles.
    pub trees: usize,
    /// perpetual's complexity budget.
    pub gbm_budget: f32,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig { seed: 42, mlp_epochs: 100, trees: 50, gbm_budget: 0.5 }
    }
}

/// Boosters trained on the classes present in the training rows; `classes[i]` is booster `i`'s
/// class. A single present class makes a constant predictor.
#[derive(Clone, Serialize, Deserialize)]
pub struct GbmClassifier {
    classes: Vec<usize>,
    booster: Option<MultiOutputBooster>,
}

impl std::fmt::Debug for GbmClassifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GbmClassifier").field("classes", &self.classes).finish_non_exhaustive()
    }
}

/// A perpetual regressor (its type has no `Debug`).
#[derive(Clone, Serialize, Deserialize)]
pub struct GbmRegressor(PerpetualBooster);

impl std::fmt::Debug for GbmRegressor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GbmRegressor")
    }
}

/// A perpetual booster's trees as prediction walks them: from node 0, each split on a feature
/// below `n_features` with its children (and missing-value child) present, no node reached twice.
/// perpetual indexes its node map and the input row unchecked: a damaged file panicked, and a
/// child pointing back looped forever.
fn boosted_trees(b: &PerpetualBooster, n_features: usize) -> Result<(), String> {
    for (t, tree) in b.get_prediction_trees().iter().enumerate() {
        if tree.nodes.is_empty() {
            continue; // predicts the base score
        }
        let mut seen = std::collections::HashSet::new();
        let mut stack = vec![0usize];
        while let Some(i) = stack.pop() {
            let at = format!("trees[{t}].nodes[{i}]");
            let Some(node) = tree.nodes.get(&i) else {
                return Err(format!("{at}: no such node: expected every child of a split to be present"));
            };
            if !seen.insert(i) {
                return Err(format!("{at}: reached twice: expected a tree (a child points back)"));
            }
            if node.is_leaf {
                continue;
            }
            if node.split_feature >= n_features {
                return Err(format!(
                    "{at}: splits on feature {}: expected below {n_features}, the feature count",
                    node.split_feature
                ));
            }
            let mut children = vec![node.left_child, node.right_child, node.missing_node];
            children.sort_unstable();
            children.dedup();
            stack.extend(children);
        }
    }
    Ok(())
}

/// OLS over the non-constant training columns: a constant column (e.g. the BN count of the
/// step-1 MLP sweep, always 0) makes the normal equations singular.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LinearModel {
    columns: Vec<usize>,
    model: FittedLinearRegression<f64>,
}

/// A fitted model of any family.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "kind", content = "model", rename_all = "kebab-case")]
pub enum Fitted {
    /// See [`ModelKind::Logistic`].
    Logistic(MultiFittedLogisticRegression<f64, usize>),
    /// See [`ModelKind::Tree`], [`ModelKind::Forest`], [`ModelKind::Bagging`] and
    /// [`ModelKind::ForestReg`].
    Trees(Forest),
    /// See [`ModelKind::Gbm`].
    Gbm(GbmClassifier),
    /// See [`ModelKind::MlpEnsemble`] and [`ModelKind::MlpReg`].
    Mlp(MlpEnsemble),
    /// See [`ModelKind::LinearReg`].
    Linear(LinearModel),
    /// See [`ModelKind::GbmReg`].
    GbmReg(GbmRegressor),
}

/// Standardiser plus fitted model: what is trained, saved and used for prediction.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Pipeline {
    /// The model family.
    pub kind: ModelKind,
    /// Feature scaling fitted on the training rows.
    pub scaler: Standardizer,
    /// The fitted model.
    pub model: Fitted,
}

fn col_major(x: &Array2<f64>) -> Vec<f64> {
    x.t().iter().copied().collect()
}

impl Pipeline {
    /// Fits `kind` on raw features `x` with class labels `class` (classifiers, `n_classes` bins)
    /// or target values `value` (regressors). Only these rows are seen, scaling included.
    pub fn fit(
        kind: ModelKind,
        family: Family,
        x: &Array2<f64>,
        class: &[usize],
        value: &[f64],
        n_classes: usize,
        cfg: &TrainConfig,
    ) -> Result<Pipeline, MlError> {
        if x.nrows() < 2 {
            return Err(MlError::Invalid(format!("{}: need at least 2 training rows, got {}", kind.name(), x.nrows())));
        }
        let scaler = Standardizer::fit(x);
        let xs = scaler.transform(x);
        let labels = || Dataset::new(xs.clone(), Array1::from(class.to_vec()));
        let model = match kind {
            ModelKind::Logistic => Fitted::Logistic(
                MultiLogisticRegression::default()
                    .max_iterations(200)
                    .fit(&labels())
                    .map_err(|e| MlError::Fit { model: kind.name(), message: e.to_string() })?,
            ),
            ModelKind::Tree | ModelKind::Forest | ModelKind::Bagging | ModelKind::ForestReg => {
                let d = xs.ncols();
                let (task, y): (_, Vec<f64>) = if kind == ModelKind::ForestReg {
                    (TreeTask::Regress, value.to_vec())
                } else {
                    (TreeTask::Classify(n_classes), class.iter().map(|&c| c as f64).collect())
                };
                let max_features = match kind {
                    ModelKind::Forest => Some((d as f64).sqrt().ceil() as usize),
                    ModelKind::ForestReg => Some((d as f64 / 3.0).ceil() as usize),
                    _ => None,
                };
                let params = TreeParams { max_features, ..TreeParams::default() };
                let (n_trees, bootstrap) = if kind == ModelKind::Tree { (1, false) } else { (cfg.trees, true) };
                Fitted::Trees(Forest::fit(&xs, &y, task, params, n_trees, bootstrap, cfg.seed))
            }
            ModelKind::Gbm => Fitted::Gbm(fit_gbm(&xs, class, cfg)?),
            ModelKind::MlpEnsemble | ModelKind::MlpReg => {
                let params = MlpParams::gpumemnet(family, cfg.mlp_epochs, cfg.seed);
                let (y, task): (Vec<f64>, _) = if kind == ModelKind::MlpEnsemble {
                    (class.iter().map(|&c| c as f64).collect(), MlpTask::Classify(n_classes))
                } else {
                    (value.to_vec(), MlpTask::Regress)
                };
                Fitted::Mlp(MlpEnsemble::fit(&xs, &y, task, &params)?)
            }
            ModelKind::LinearReg => {
                let columns: Vec<usize> =
                    (0..xs.ncols()).filter(|&j| xs.column(j).iter().any(|v| v.abs() > 1e-12)).collect();
                let model = LinearRegression::new()
                    .fit(&Dataset::new(xs.select(Axis(1), &columns), Array1::from(value.to_vec())))
                    .map_err(|e| MlError::Fit { model: kind.name(), message: e.to_string() })?;
                Fitted::Linear(LinearModel { columns, model })
            }
            ModelKind::GbmReg => {
                let data = col_major(&xs);
                let m = Matrix::new(&data, xs.nrows(), xs.ncols());
                let mut b = PerpetualBooster::default()
                    .set_objective(Objective::SquaredLoss)
                    .set_budget(cfg.gbm_budget)
                    .set_num_threads(Some(1))
                    .set_seed(cfg.seed);
                b.fit(&m, value, None, None)
                    .map_err(|e| MlError::Fit { model: kind.name(), message: e.to_string() })?;
                Fitted::GbmReg(GbmRegressor(b))
            }
        };
        Ok(Pipeline { kind, scaler, model })
    }

    /// Predicted class per row of raw features `x` (classifiers only).
    pub fn predict_class(&self, x: &Array2<f64>) -> Result<Vec<usize>, MlError> {
        self.check_width(x)?;
        let xs = self.scaler.transform(x);
        Ok(match &self.model {
            Fitted::Logistic(m) => m.predict(&xs).to_vec(),
            Fitted::Trees(m) if m.task() != TreeTask::Regress => m.predict_class(&xs),
            Fitted::Gbm(m) => predict_gbm(m, &xs),
            Fitted::Mlp(m) if self.kind == ModelKind::MlpEnsemble => m.predict_class(&xs),
            _ => {
                return Err(MlError::Invalid(format!(
                    "{} is a regressor: it predicts values, not bins",
                    self.kind.name()
                )))
            }
        })
    }

    /// Predicted target value per row of raw features `x` (regressors only).
    pub fn predict_value(&self, x: &Array2<f64>) -> Result<Vec<f64>, MlError> {
        self.check_width(x)?;
        let xs = self.scaler.transform(x);
        Ok(match &self.model {
            Fitted::Linear(m) => m.model.predict(&xs.select(Axis(1), &m.columns)).to_vec(),
            Fitted::Trees(m) if m.task() == TreeTask::Regress => m.predict_value(&xs),
            Fitted::GbmReg(m) => {
                let data = col_major(&xs);
                m.0.predict(&Matrix::new(&data, xs.nrows(), xs.ncols()), false)
            }
            Fitted::Mlp(m) if self.kind == ModelKind::MlpReg => m.predict_value(&xs),
            _ => {
                return Err(MlError::Invalid(format!(
                    "{} is a classifier: it predicts bins, not values",
                    self.kind.name()
                )))
            }
        })
    }

    /// Whether a pipeline read from a file can predict `n_features` columns into `n_classes`
    /// bins without a panic: finite means, positive finite deviations (a zero one divided every
    /// input into infinity), and a model whose indices and shapes fit. The error is the field
    /// at fault (under `pipeline`) and what was expected.
    pub fn check_body(&self, n_features: usize, n_classes: usize) -> Result<(), (&'static str, String)> {
        let s = &self.scaler;
        if let Some(j) = s.mean.iter().position(|m| !m.is_finite()) {
            return Err(("pipeline.scaler.mean", format!("mean {j} is {}: expected a finite number", s.mean[j])));
        }
        if let Some(j) = s.std.iter().position(|d| !(d.is_finite() && *d > 0.0)) {
            return Err((
                "pipeline.scaler.std",
                format!("deviation {j} is {}: expected a finite number above 0", s.std[j]),
            ));
        }
        let at = |field| move |e: String| (field, e);
        match &self.model {
            Fitted::Trees(f) => f.check(n_features, n_classes).map_err(at("pipeline.model.model")),
            Fitted::Mlp(m) => {
                let out = if self.kind == ModelKind::MlpReg { 1 } else { n_classes };
                m.check(n_features, out).map_err(at("pipeline.model.model"))
            }
            Fitted::Linear(m) => {
                if let Some(c) = m.columns.iter().find(|&&c| c >= n_features) {
                    return Err((
                        "pipeline.model.model.columns",
                        format!("column {c}: expected below {n_features}, the feature count"),
                    ));
                }
                if m.columns.windows(2).any(|w| w[0] >= w[1]) || m.model.params().len() != m.columns.len() {
                    return Err((
                        "pipeline.model.model.columns",
                        format!(
                            "{} columns for {} coefficients: expected rising columns, one per coefficient",
                            m.columns.len(),
                            m.model.params().len()
                        ),
                    ));
                }
                Ok(())
            }
            Fitted::Logistic(m)
                if m.params().nrows() != n_features
                    || m.intercept().len() != m.params().ncols()
                    || m.classes().len() != m.params().ncols() =>
            {
                Err((
                    "pipeline.model.model",
                    format!(
                        "{}x{} coefficients, {} intercepts and {} classes: expected {n_features} rows, one intercept \
                         and one class per column",
                        m.params().nrows(),
                        m.params().ncols(),
                        m.intercept().len(),
                        m.classes().len()
                    ),
                ))
            }
            Fitted::Logistic(m) if m.classes().iter().any(|&c| c >= n_classes) => Err((
                "pipeline.model.model.classes",
                format!("{:?}: expected each class below {n_classes}, the bin count", m.classes()),
            )),
            Fitted::Gbm(m) if m.classes.is_empty() || m.classes.iter().any(|&c| c >= n_classes) => Err((
                "pipeline.model.model.classes",
                format!("{:?}: expected at least one class, each below {n_classes}, the bin count", m.classes),
            )),
            Fitted::Gbm(m) => m.booster.as_ref().map_or(Ok(()), |b| {
                b.get_boosters()
                    .iter()
                    .enumerate()
                    .try_for_each(|(i, b)| boosted_trees(b, n_features).map_err(|e| format!("boosters[{i}].{e}")))
                    .map_err(at("pipeline.model.model.booster"))
            }),
            Fitted::GbmReg(m) => boosted_trees(&m.0, n_features).map_err(at("pipeline.model.model")),
            Fitted::Logistic(_) => Ok(()),
        }
    }

    fn check_width(&self, x: &Array2<f64>) -> Result<(), MlError> {
        let want = self.scaler.mean.len();
        if x.ncols() != want {
            return Err(MlError::Invalid(format!(
                "{}: expected {want} features per row, got {}",
                self.kind.name(),
                x.ncols()
            )));
        }
        Ok(())
    }
}

fn fit_gbm(xs: &Array2<f64>, class: &[usize], cfg: &TrainConfig) -> Result<GbmClassifier, MlError> {
    let mut classes: Vec<usize> = class.to_vec();
    classes.sort_unstable();
    classes.dedup();
    if classes.len() < 2 {
        return Ok(GbmClassifier { classes, booster: None });
    }
    let n = xs.nrows();
    // One-hot targets, column-major like the features.
    let mut y = vec![0.0; n * classes.len()];
    for (i, c) in class.iter().enumerate() {
        let k = classes.binary_search(c).expect("class listed");
        y[k * n + i] = 1.0;
    }
    let data = col_major(xs);
    let mut booster = MultiOutputBooster::default()
        .set_n_boosters(classes.len())
        .set_objective(Objective::LogLoss)
        .set_budget(cfg.gbm_budget)
        .set_num_threads(Some(1))
        .set_seed(cfg.seed);
    booster
        .fit(&Matrix::new(&data, n, xs.ncols()), &Matrix::new(&y, n, classes.len()), None, None)
        .map_err(|e| MlError::Fit { model: "gbm", message: e.to_string() })?;
    Ok(GbmClassifier { classes, booster: Some(booster) })
}

fn predict_gbm(m: &GbmClassifier, xs: &Array2<f64>) -> Vec<usize> {
    let Some(b) = &m.booster else {
        return vec![m.classes.first().copied().unwrap_or(0); xs.nrows()];
    };
    let data = col_major(xs);
    let p = b.predict_proba(&Matrix::new(&data, xs.nrows(), xs.ncols()), false);
    p.chunks(m.classes.len())
        .map(|row| {
            let best =
                row.iter().enumerate().fold((0, f64::NEG_INFINITY), |b, (i, &v)| if v > b.1 { (i, v) } else { b }).0;
            m.classes[best]
        })
        .collect()
}
