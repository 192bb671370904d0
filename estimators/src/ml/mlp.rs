//! GPUMemNet's small-MLP ensemble, hand-written on ndarray (`Ensemble/models/mlp_models.py`).
//!
//! Each member is `[Linear → BatchNorm1d → ReLU] × depth → Linear`, widths `8, 4, 4, ...`
//! (halving from `max_width`, floored at `min_width`), Xavier-uniform weights and zero biases.
//! The members' outputs are averaged and the loss is taken on the average, so the members are
//! trained jointly exactly as GPUMemNet's `EnsembleModel.training_step` does. Adam (β 0.9/0.999,
//! ε 1e-8), mini-batches shuffled by a seeded RNG: training is deterministic for a seed.

use ndarray::{Array1, Array2, Axis};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use super::error::MlError;
use crate::features::Family;

const BN_EPS: f64 = 1e-5;
const BN_MOMENTUM: f64 = 0.1;

/// Hyper-parameters of the ensemble.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MlpParams {
    /// Hidden depth of each member; one member per entry.
    pub depths: Vec<usize>,
    /// Width of the first hidden layer.
    pub max_width: usize,
    /// Floor of the halving widths.
    pub min_width: usize,
    /// Adam learning rate.
    pub learning_rate: f64,
    /// Mini-batch size.
    pub batch_size: usize,
    /// Passes over the training rows.
    pub epochs: usize,
    /// Seed for initialisation and batch order.
    pub seed: u64,
}

impl MlpParams {
    /// GPUMemNet's configuration: 13 members with depths 1..=7 and 1..=6 for MLP data; 16 for
    /// CNN and Transformer data (the reference gives the count, not the depths: we append 1..=3).
    pub fn gpumemnet(family: Family, epochs: usize, seed: u64) -> MlpParams {
        let mut depths: Vec<usize> = (1..=7).chain(1..=6).collect();
        if family != Family::Mlp {
            depths.extend(1..=3);
        }
        MlpParams { depths, max_width: 8, min_width: 4, learning_rate: 1e-3, batch_size: 128, epochs, seed }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Linear {
    /// `out × in`, as torch stores it.
    w: Array2<f64>,
    b: Array1<f64>,
}

impl Linear {
    fn xavier(inp: usize, out: usize, rng: &mut StdRng) -> Linear {
        let bound = (6.0 / (inp + out) as f64).sqrt();
        Linear { w: Array2::from_shape_fn((out, inp), |_| rng.gen_range(-bound..bound)), b: Array1::zeros(out) }
    }
    fn zeros_like(&self) -> Linear {
        Linear { w: Array2::zeros(self.w.raw_dim()), b: Array1::zeros(self.b.len()) }
    }
    fn forward(&self, x: &Array2<f64>) -> Array2<f64> {
        x.dot(&self.w.t()) + &self.b
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct BatchNorm {
    gamma: Array1<f64>,
    beta: Array1<f64>,
    running_mean: Array1<f64>,
    running_var: Array1<f64>,
}

impl BatchNorm {
    fn new(n: usize) -> BatchNorm {
        BatchNorm {
            gamma: Array1::ones(n),
            beta: Array1::zeros(n),
            running_mean: Array1::zeros(n),
            running_var: Array1::ones(n),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Member {
    hidden: Vec<(Linear, BatchNorm)>,
    out: Linear,
}

/// Per-layer values the backward pass needs.
struct Cache {
    input: Array2<f64>,
    xhat: Array2<f64>,
    inv_std: Array1<f64>,
    activated: Array2<f64>,
}

impl Member {
    fn new(inp: usize, out: usize, depth: usize, p: &MlpParams, rng: &mut StdRng) -> Member {
        let mut hidden = Vec::with_capacity(depth);
        let mut cur = inp;
        for i in 0..depth {
            let w = ((p.max_width as f64 * 0.5f64.powi(i as i32)) as usize).max(p.min_width);
            hidden.push((Linear::xavier(cur, w, rng), BatchNorm::new(w)));
            cur = w;
        }
        Member { hidden, out: Linear::xavier(cur, out, rng) }
    }

    fn zeros_like(&self) -> Member {
        Member {
            hidden: self
                .hidden
                .iter()
                .map(|(l, bn)| {
                    let n = bn.gamma.len();
                    (
                        l.zeros_like(),
                        BatchNorm {
                            gamma: Array1::zeros(n),
                            beta: Array1::zeros(n),
                            running_mean: Array1::zeros(n),
                            running_var: Array1::zeros(n),
                        },
                    )
                })
                .collect(),
            out: self.out.zeros_like(),
        }
    }

    /// Trainable parameters as flat slices, in a fixed order shared by params, grads and moments.
    fn params_mut(&mut self) -> Vec<&mut [f64]> {
        let mut v: Vec<&mut [f64]> = Vec::new();
        for (l, bn) in &mut self.hidden {
            v.push(l.w.as_slice_mut().expect("standard layout"));
            v.push(l.b.as_slice_mut().expect("standard layout"));
            v.push(bn.gamma.as_slice_mut().expect("standard layout"));
            v.push(bn.beta.as_slice_mut().expect("standard layout"));
        }
        v.push(self.out.w.as_slice_mut().expect("standard layout"));
        v.push(self.out.b.as_slice_mut().expect("standard layout"));
        v
    }

    fn forward_eval(&self, x: &Array2<f64>) -> Array2<f64> {
        let mut a = x.clone();
        for (l, bn) in &self.hidden {
            let z = l.forward(&a);
            let inv = bn.running_var.mapv(|v| 1.0 / (v + BN_EPS).sqrt());
            let y = (z - &bn.running_mean) * &inv * &bn.gamma + &bn.beta;
            a = y.mapv(|v| v.max(0.0));
        }
        self.out.forward(&a)
    }

    fn forward_train(&mut self, x: &Array2<f64>) -> (Array2<f64>, Vec<Cache>) {
        let n = x.nrows() as f64;
        let mut a = x.clone();
        let mut caches = Vec::with_capacity(self.hidden.len());
        for (l, bn) in &mut self.hidden {
            let z = l.forward(&a);
            let mean = z.mean_axis(Axis(0)).expect("non-empty batch");
            let centered = &z - &mean;
            let var = centered.mapv(|v| v * v).mean_axis(Axis(0)).expect("non-empty batch");
            let inv_std = var.mapv(|v| 1.0 / (v + BN_EPS).sqrt());
            let xhat = &centered * &inv_std;
            let y = &xhat * &bn.gamma + &bn.beta;
            // torch updates running_var with the unbiased batch variance.
            let unbiased = &var * (n / (n - 1.0));
            bn.running_mean = &bn.running_mean * (1.0 - BN_MOMENTUM) + &mean * BN_MOMENTUM;
            bn.running_var = &bn.running_var * (1.0 - BN_MOMENTUM) + unbiased * BN_MOMENTUM;
            let activated = y.mapv(|v| v.max(0.0));
            caches.push(Cache { input: std::mem::replace(&mut a, activated.clone()), xhat, inv_std, activated });
        }
        let out = self.out.forward(&a);
        caches.push(Cache {
            input: a,
            xhat: Array2::zeros((0, 0)),
            inv_std: Array1::zeros(0),
            activated: Array2::zeros((0, 0)),
        });
        (out, caches)
    }

    /// Accumulates gradients of the loss into `g` given `dout` = ∂loss/∂output.
    fn backward(&self, dout: &Array2<f64>, caches: &[Cache], g: &mut Member) {
        let last = caches.last().expect("output cache");
        g.out.w = dout.t().dot(&last.input);
        g.out.b = dout.sum_axis(Axis(0));
        let mut da = dout.dot(&self.out.w);
        let n = dout.nrows() as f64;
        for (i, ((l, bn), c)) in self.hidden.iter().zip(caches).enumerate().rev() {
            let dy = &da * &c.activated.mapv(|v| if v > 0.0 { 1.0 } else { 0.0 });
            let (gl, gbn) = &mut g.hidden[i];
            gbn.gamma = (&dy * &c.xhat).sum_axis(Axis(0));
            gbn.beta = dy.sum_axis(Axis(0));
            let dxhat = &dy * &bn.gamma;
            let sum_dxhat = dxhat.sum_axis(Axis(0));
            let sum_dxhat_xhat = (&dxhat * &c.xhat).sum_axis(Axis(0));
            let dz = (&dxhat * n - &sum_dxhat - &c.xhat * &sum_dxhat_xhat) * &(&c.inv_std / n);
            gl.w = dz.t().dot(&c.input);
            gl.b = dz.sum_axis(Axis(0));
            da = dz.dot(&l.w);
        }
    }
}

/// What the ensemble's averaged output is trained against.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum MlpTask {
    /// Cross-entropy over this many classes.
    Classify(usize),
    /// Mean squared error on one output; targets are standardised internally.
    Regress,
}

/// A trained ensemble.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MlpEnsemble {
    members: Vec<Member>,
    task: MlpTask,
    /// (mean, std) of the regression target, to undo its standardisation.
    y_scale: (f64, f64),
    params: MlpParams,
}

struct Adam {
    m: Vec<Member>,
    v: Vec<Member>,
    t: i32,
}

impl MlpEnsemble {
    /// Trains on standardised features `x`. For `Classify`, `y` holds class indices as f64.
    pub fn fit(x: &Array2<f64>, y: &[f64], task: MlpTask, params: &MlpParams) -> Result<MlpEnsemble, MlError> {
        if x.nrows() < 2 || x.nrows() != y.len() {
            return Err(MlError::Invalid(format!(
                "mlp-ensemble needs at least 2 rows and one target per row, got {} rows and {} targets",
                x.nrows(),
                y.len()
            )));
        }
        if params.depths.is_empty() || params.batch_size < 2 {
            return Err(MlError::Invalid(
                "mlp-ensemble needs at least one member and a batch size of at least 2".into(),
            ));
        }
        let n_out = match task {
            MlpTask::Classify(c) => c,
            MlpTask::Regress => 1,
        };
        let mut rng = StdRng::seed_from_u64(params.seed);
        let members: Vec<Member> =
            params.depths.iter().map(|&d| Member::new(x.ncols(), n_out, d, params, &mut rng)).collect();
        let y_scale = match task {
            MlpTask::Regress => {
                let (m, s) = super::score::mean_std(y);
                (m, if s > 0.0 { s } else { 1.0 })
            }
            MlpTask::Classify(_) => (0.0, 1.0),
        };
        let mut model = MlpEnsemble { members, task, y_scale, params: params.clone() };
        let mut adam = Adam {
            m: model.members.iter().map(Member::zeros_like).collect(),
            v: model.members.iter().map(Member::zeros_like).collect(),
            t: 0,
        };
        let mut grads: Vec<Member> = model.members.iter().map(Member::zeros_like).collect();
        let mut order: Vec<usize> = (0..x.nrows()).collect();
        for _ in 0..params.epochs {
            order.shuffle(&mut rng);
            for batch in order.chunks(params.batch_size) {
                // BatchNorm cannot normalise a single row (torch raises on it too).
                if batch.len() < 2 {
                    continue;
                }
                let xb = x.select(Axis(0), batch);
                let yb: Vec<f64> = batch.iter().map(|&i| y[i]).collect();
                model.step(&xb, &yb, &mut grads, &mut adam);
            }
        }
        Ok(model)
    }

    fn step(&mut self, xb: &Array2<f64>, yb: &[f64], grads: &mut [Member], adam: &mut Adam) {
        let m = self.members.len() as f64;
        let b = xb.nrows() as f64;
        let mut outs = Vec::with_capacity(self.members.len());
        let mut avg: Option<Array2<f64>> = None;
        for member in &mut self.members {
            let (o, c) = member.forward_train(xb);
            avg = Some(match avg {
                None => o.clone(),
                Some(a) => a + &o,
            });
            outs.push(c);
        }
        let avg = avg.expect("at least one member") / m;
        let mut dout = match self.task {
            MlpTask::Classify(_) => {
                let mut p = softmax_rows(&avg);
                for (i, &c) in yb.iter().enumerate() {
                    p[[i, c as usize]] -= 1.0;
                }
                p / b
            }
            MlpTask::Regress => {
                let (mu, sd) = self.y_scale;
                let t = Array2::from_shape_fn((yb.len(), 1), |(i, _)| (yb[i] - mu) / sd);
                (&avg - &t) * (2.0 / b)
            }
        };
        dout /= m;
        for ((member, caches), g) in self.members.iter().zip(&outs).zip(grads.iter_mut()) {
            member.backward(&dout, caches, g);
        }
        adam.t += 1;
        let lr = self.params.learning_rate;
        let (b1, b2, eps) = (0.9f64, 0.999f64, 1e-8);
        let c1 = 1.0 - b1.powi(adam.t);
        let c2 = 1.0 - b2.powi(adam.t);
        for (((member, g), mm), vv) in
            self.members.iter_mut().zip(grads.iter_mut()).zip(adam.m.iter_mut()).zip(adam.v.iter_mut())
        {
            for (((p, g), m), v) in
                member.params_mut().into_iter().zip(g.params_mut()).zip(mm.params_mut()).zip(vv.params_mut())
            {
                for i in 0..p.len() {
                    m[i] = b1 * m[i] + (1.0 - b1) * g[i];
                    v[i] = b2 * v[i] + (1.0 - b2) * g[i] * g[i];
                    p[i] -= lr * (m[i] / c1) / ((v[i] / c2).sqrt() + eps);
                }
            }
        }
    }

    /// Averaged member outputs (logits, or the standardised regression output) in eval mode.
    pub fn forward(&self, x: &Array2<f64>) -> Array2<f64> {
        let sum = self.members.iter().map(|m| m.forward_eval(x)).reduce(|a, b| a + b).expect("at least one member");
        sum / self.members.len() as f64
    }

    /// Predicted class per row (classification ensembles).
    pub fn predict_class(&self, x: &Array2<f64>) -> Vec<usize> {
        self.forward(x)
            .rows()
            .into_iter()
            .map(|r| {
                r.iter()
                    .enumerate()
                    .fold((0, f64::NEG_INFINITY), |best, (i, &v)| if v > best.1 { (i, v) } else { best })
                    .0
            })
            .collect()
    }

    /// Predicted value per row (regression ensembles), in the target's units.
    pub fn predict_value(&self, x: &Array2<f64>) -> Vec<f64> {
        let (mu, sd) = self.y_scale;
        self.forward(x).column(0).iter().map(|v| v * sd + mu).collect()
    }

    /// Whether an ensemble read from a file can be evaluated on `n_features` columns: at least
    /// one member, each layer's input as wide as the previous output, and `n_out` outputs
    /// (ndarray panics on a mismatched product). The error says where and what was expected.
    pub fn check(&self, n_features: usize, n_out: usize) -> Result<(), String> {
        if self.members.is_empty() {
            return Err("no members: expected at least one".to_string());
        }
        for (m, member) in self.members.iter().enumerate() {
            let mut cur = n_features;
            for (i, (l, bn)) in member.hidden.iter().enumerate() {
                let w = l.w.nrows();
                let widths = [l.b.len(), bn.gamma.len(), bn.beta.len(), bn.running_mean.len(), bn.running_var.len()];
                if l.w.ncols() != cur || widths.iter().any(|&x| x != w) {
                    return Err(format!(
                        "members[{m}].hidden[{i}]: a {w}x{} layer: expected {cur} inputs and every vector {w} long",
                        l.w.ncols()
                    ));
                }
                cur = w;
            }
            let o = &member.out;
            if o.w.ncols() != cur || o.w.nrows() != n_out || o.b.len() != n_out {
                return Err(format!(
                    "members[{m}].out: a {}x{} layer: expected {n_out} outputs from {cur} inputs",
                    o.w.nrows(),
                    o.w.ncols()
                ));
            }
        }
        Ok(())
    }

    /// Total trainable parameters (GPUMemNet quotes 1,495–1,646 for its MLP estimator).
    pub fn parameter_count(&self) -> usize {
        let mut clone = self.members.clone();
        clone.iter_mut().map(|m| m.params_mut().iter().map(|s| s.len()).sum::<usize>()).sum()
    }
}

fn softmax_rows(x: &Array2<f64>) -> Array2<f64> {
    let mut out = x.clone();
    for mut r in out.rows_mut() {
        let max = r.fold(f64::NEG_INFINITY, |a, &b| a.max(b));
        r.mapv_inplace(|v| (v - max).exp());
        let s = r.sum();
        r /= s;
    }
    out
}
