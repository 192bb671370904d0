//! Deterministic CART trees and bootstrap ensembles (bagging, random forest), for
//! classification (Gini) and regression (squared error).
//!
//! Written here instead of using linfa-trees/linfa-ensemble 0.8.1 because those are not
//! reproducible: `linfa-trees` sums Gini terms and picks modal classes by iterating a std
//! `HashMap` (random iteration order per process, so f32 sums and ties differ between runs), and
//! `EnsembleLearner` votes through a `HashMap` too. Here every loop runs in a fixed order, ties
//! go to the lowest feature / threshold / class, and all randomness comes from a seeded `StdRng`.

use ndarray::{Array2, ArrayView1};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

/// What a tree predicts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum TreeTask {
    /// Class probabilities over this many classes (Gini impurity).
    Classify(usize),
    /// The mean target (squared-error impurity).
    Regress,
}

/// Growth limits of one tree.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TreeParams {
    /// Maximum depth (root is depth 0); `None` grows until leaves are pure or too small.
    pub max_depth: Option<usize>,
    /// Fewest rows a node needs to be split.
    pub min_samples_split: usize,
    /// Fewest rows each child of a split must keep.
    pub min_samples_leaf: usize,
    /// Features drawn (without replacement) as split candidates at each node; `None` = all.
    pub max_features: Option<usize>,
}

impl Default for TreeParams {
    fn default() -> Self {
        TreeParams { max_depth: None, min_samples_split: 2, min_samples_leaf: 1, max_features: None }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
enum Node {
    /// Class probabilities, or `[mean]` for regression.
    Leaf(Vec<f64>),
    /// Rows with `x[feature] <= threshold` go left.
    Split { feature: usize, threshold: f64, left: usize, right: usize },
}

/// A fitted tree (nodes in an arena, root at index 0).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Tree {
    nodes: Vec<Node>,
    task: TreeTask,
}

struct Grower<'a> {
    x: &'a Array2<f64>,
    y: &'a [f64],
    task: TreeTask,
    params: TreeParams,
    rng: StdRng,
    nodes: Vec<Node>,
}

impl Grower<'_> {
    fn leaf(&self, idx: &[usize]) -> Node {
        match self.task {
            TreeTask::Classify(k) => {
                let mut p = vec![0.0; k];
                for &i in idx {
                    p[self.y[i] as usize] += 1.0;
                }
                let n = idx.len().max(1) as f64;
                Node::Leaf(p.into_iter().map(|c| c / n).collect())
            }
            TreeTask::Regress => {
                let n = idx.len().max(1) as f64;
                Node::Leaf(vec![idx.iter().map(|&i| self.y[i]).sum::<f64>() / n])
            }
        }
    }

    /// Impurity × rows of a node from its sufficient statistics.
    fn cost(&self, stats: &[f64], n: f64) -> f64 {
        match self.task {
            TreeTask::Classify(_) => n - stats.iter().map(|c| c * c).sum::<f64>() / n,
            TreeTask::Regress => stats[1] - stats[0] * stats[0] / n,
        }
    }

    fn add(&self, stats: &mut [f64], i: usize, sign: f64) {
        match self.task {
            TreeTask::Classify(_) => stats[self.y[i] as usize] += sign,
            TreeTask::Regress => {
                stats[0] += sign * self.y[i];
                stats[1] += sign * self.y[i] * self.y[i];
            }
        }
    }

    /// Grows the tree breadth-first from an explicit work list: a degenerate tree that peels
    /// one row per level is thousands of levels deep, too deep for recursion on a thread stack.
    fn grow(&mut self, root: Vec<usize>) {
        self.nodes.push(Node::Leaf(Vec::new()));
        let mut work = vec![(0usize, root, 0usize)];
        while let Some((slot, mut idx, depth)) = work.pop() {
            let n = idx.len();
            let width = match self.task {
                TreeTask::Classify(k) => k,
                TreeTask::Regress => 2,
            };
            let mut total = vec![0.0; width];
            for &i in idx.iter() {
                self.add(&mut total, i, 1.0);
            }
            let parent_cost = self.cost(&total, n as f64);
            let stop = n < self.params.min_samples_split
                || n < 2 * self.params.min_samples_leaf
                || self.params.max_depth.is_some_and(|d| depth >= d)
                || parent_cost <= 1e-12 * n as f64;
            let best = if stop { None } else { self.best_split(&mut idx, &total, parent_cost) };
            let Some((feature, threshold)) = best else {
                self.nodes[slot] = self.leaf(&idx);
                continue;
            };
            // Stable partition keeps row order, so children are grown from the same sequence.
            let (l, r): (Vec<usize>, Vec<usize>) = idx.iter().partition(|&&i| self.x[[i, feature]] <= threshold);
            if l.is_empty() || r.is_empty() {
                self.nodes[slot] = self.leaf(&idx);
                continue;
            }
            let left = self.nodes.len();
            let right = left + 1;
            self.nodes.push(Node::Leaf(Vec::new()));
            self.nodes.push(Node::Leaf(Vec::new()));
            self.nodes[slot] = Node::Split { feature, threshold, left, right };
            work.push((right, r, depth + 1));
            work.push((left, l, depth + 1));
        }
    }

    fn best_split(&mut self, idx: &mut [usize], total: &[f64], parent: f64) -> Option<(usize, f64)> {
        let d = self.x.ncols();
        let mut features: Vec<usize> = (0..d).collect();
        if let Some(m) = self.params.max_features.filter(|&m| m < d) {
            features.shuffle(&mut self.rng);
            features.truncate(m.max(1));
            features.sort_unstable();
        }
        let n = idx.len();
        let min_leaf = self.params.min_samples_leaf.max(1);
        let mut best: Option<(f64, usize, f64)> = None;
        for &f in &features {
            idx.sort_by(|&a, &b| self.x[[a, f]].total_cmp(&self.x[[b, f]]).then(a.cmp(&b)));
            let mut left = vec![0.0; total.len()];
            let mut right = total.to_vec();
            for pos in 0..n - 1 {
                let i = idx[pos];
                self.add(&mut left, i, 1.0);
                self.add(&mut right, i, -1.0);
                let (v, next) = (self.x[[i, f]], self.x[[idx[pos + 1], f]]);
                let nl = pos + 1;
                if v >= next || nl < min_leaf || n - nl < min_leaf {
                    continue;
                }
                let cost = self.cost(&left, nl as f64) + self.cost(&right, (n - nl) as f64);
                if cost < parent - 1e-12 && best.is_none_or(|b| cost < b.0) {
                    // The midpoint of two adjacent floats can round up to `next`, which would
                    // send every row left; `v` itself separates them exactly.
                    let mid = v + (next - v) / 2.0;
                    best = Some((cost, f, if mid < next { mid } else { v }));
                }
            }
        }
        best.map(|(_, f, t)| (f, t))
    }
}

impl Tree {
    /// Grows a tree on rows `idx` of `x`; `y` holds class indices (as f64) or targets.
    pub fn fit(x: &Array2<f64>, y: &[f64], idx: &[usize], task: TreeTask, params: TreeParams, seed: u64) -> Tree {
        let mut g = Grower { x, y, task, params, rng: StdRng::seed_from_u64(seed), nodes: Vec::new() };
        g.grow(idx.to_vec());
        Tree { nodes: g.nodes, task }
    }

    /// The leaf vector reached by one row.
    fn leaf(&self, row: ArrayView1<f64>) -> &[f64] {
        let mut at = 0;
        loop {
            match &self.nodes[at] {
                Node::Leaf(v) => return v,
                Node::Split { feature, threshold, left, right } => {
                    at = if row[*feature] <= *threshold { *left } else { *right }
                }
            }
        }
    }
}

/// Bootstrap ensemble of trees; one tree without bootstrap is a plain CART.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Forest {
    trees: Vec<Tree>,
    task: TreeTask,
}

impl Forest {
    /// Fits `n_trees` trees, each on a bootstrap sample of all rows when `bootstrap` is true
    /// (sampling with replacement, as sklearn does) or on all rows otherwise.
    pub fn fit(
        x: &Array2<f64>,
        y: &[f64],
        task: TreeTask,
        params: TreeParams,
        n_trees: usize,
        bootstrap: bool,
        seed: u64,
    ) -> Forest {
        let mut rng = StdRng::seed_from_u64(seed);
        let n = x.nrows();
        let trees = (0..n_trees.max(1))
            .map(|_| {
                let idx: Vec<usize> =
                    if bootstrap { (0..n).map(|_| rng.gen_range(0..n)).collect() } else { (0..n).collect() };
                Tree::fit(x, y, &idx, task, params, rng.gen())
            })
            .collect();
        Forest { trees, task }
    }

    /// Averaged leaf vectors (class probabilities, or `[mean]`) per row.
    fn average(&self, x: &Array2<f64>) -> Vec<Vec<f64>> {
        x.rows()
            .into_iter()
            .map(|row| {
                let mut acc: Vec<f64> = Vec::new();
                for t in &self.trees {
                    let v = t.leaf(row);
                    if acc.is_empty() {
                        acc = v.to_vec();
                    } else {
                        acc.iter_mut().zip(v).for_each(|(a, b)| *a += b);
                    }
                }
                acc.iter().map(|a| a / self.trees.len() as f64).collect()
            })
            .collect()
    }

    /// Most probable class per row (soft voting; ties go to the lower class).
    pub fn predict_class(&self, x: &Array2<f64>) -> Vec<usize> {
        self.average(x)
            .iter()
            .map(|p| p.iter().enumerate().fold((0, f64::NEG_INFINITY), |b, (i, &v)| if v > b.1 { (i, v) } else { b }).0)
            .collect()
    }

    /// Mean prediction per row (regression forests).
    pub fn predict_value(&self, x: &Array2<f64>) -> Vec<f64> {
        self.average(x).iter().map(|v| v[0]).collect()
    }

    /// The task the trees were grown for.
    pub fn task(&self) -> TreeTask {
        self.task
    }

    /// Whether a forest read from a file can be walked: at least one tree, every split's
    /// feature below `n_features`, every child after its parent and inside the tree (so a walk
    /// ends: an edited index pointing back looped forever), and every leaf as wide as the task
    /// (`n_classes` probabilities, or one mean). The error says where and what was expected.
    pub fn check(&self, n_features: usize, n_classes: usize) -> Result<(), String> {
        if self.trees.is_empty() {
            return Err("no trees: expected at least one".to_string());
        }
        let width = match self.task {
            TreeTask::Classify(k) if k != n_classes => {
                return Err(format!("task Classify({k}): expected Classify({n_classes}), one class per bin"))
            }
            TreeTask::Classify(k) => k,
            TreeTask::Regress => 1,
        };
        for (t, tree) in self.trees.iter().enumerate() {
            if tree.task != self.task {
                return Err(format!("trees[{t}].task {:?}: expected the forest's {:?}", tree.task, self.task));
            }
            if tree.nodes.is_empty() {
                return Err(format!("trees[{t}].nodes is empty: expected at least a root"));
            }
            let n = tree.nodes.len();
            for (i, node) in tree.nodes.iter().enumerate() {
                let at = format!("trees[{t}].nodes[{i}]");
                match node {
                    Node::Leaf(v) if v.len() != width => {
                        return Err(format!(
                            "{at}: a leaf of {} value{}: expected {width}",
                            v.len(),
                            if v.len() == 1 { "" } else { "s" }
                        ))
                    }
                    Node::Leaf(v) if v.iter().any(|p| !p.is_finite()) => {
                        return Err(format!("{at}: a leaf value is not a finite number"))
                    }
                    Node::Leaf(_) => {}
                    Node::Split { feature, .. } if *feature >= n_features => {
                        return Err(format!("{at}: feature {feature}: expected below {n_features}, the feature count"))
                    }
                    Node::Split { threshold, .. } if threshold.is_nan() => {
                        return Err(format!("{at}: threshold is not a number"))
                    }
                    Node::Split { left, right, .. } => {
                        if let Some(c) = [left, right].into_iter().find(|&&c| c <= i || c >= n) {
                            return Err(format!(
                                "{at}: child {c}: expected a node after {i} and below {n}, the tree's node count"
                            ));
                        }
                    }
                }
            }
        }
        Ok(())
    }
}
