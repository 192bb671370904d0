//! Classification and regression scores used by the ML protocols.
//!
//! Kept private to `ml` because the crate-wide `metrics` module (another owner) had no
//! classification metrics when this was written; these follow sklearn's definitions.

/// Fraction of predictions equal to the truth; 0 for no rows.
pub fn accuracy(truth: &[usize], pred: &[usize]) -> f64 {
    if truth.is_empty() {
        return 0.0;
    }
    truth.iter().zip(pred).filter(|(t, p)| t == p).count() as f64 / truth.len() as f64
}

/// Per-class (precision, recall, f1, support) over classes `0..n`.
fn per_class(truth: &[usize], pred: &[usize], n: usize) -> Vec<(f64, f64, f64, usize)> {
    (0..n)
        .map(|c| {
            let tp = truth.iter().zip(pred).filter(|&(&t, &p)| t == c && p == c).count() as f64;
            let support = truth.iter().filter(|&&t| t == c).count();
            let predicted = pred.iter().filter(|&&p| p == c).count() as f64;
            let precision = if predicted > 0.0 { tp / predicted } else { 0.0 };
            let recall = if support > 0 { tp / support as f64 } else { 0.0 };
            let f1 = if precision + recall > 0.0 { 2.0 * precision * recall / (precision + recall) } else { 0.0 };
            (precision, recall, f1, support)
        })
        .collect()
}

fn present(truth: &[usize], pred: &[usize]) -> (usize, Vec<bool>) {
    let n = truth.iter().chain(pred).max().map_or(0, |m| m + 1);
    let mut seen = vec![false; n];
    for &c in truth.iter().chain(pred) {
        seen[c] = true;
    }
    (n, seen)
}

/// Macro F1 over the classes present in truth or predictions (sklearn `average="macro"`).
pub fn f1_macro(truth: &[usize], pred: &[usize]) -> f64 {
    let (n, seen) = present(truth, pred);
    let stats = per_class(truth, pred, n);
    let used: Vec<f64> = stats.iter().zip(&seen).filter(|(_, s)| **s).map(|(s, _)| s.2).collect();
    if used.is_empty() {
        0.0
    } else {
        used.iter().sum::<f64>() / used.len() as f64
    }
}

/// Support-weighted F1 (sklearn `average="weighted"`, the figure GPUMemNet's k-fold JSON reports).
pub fn f1_weighted(truth: &[usize], pred: &[usize]) -> f64 {
    let (n, _) = present(truth, pred);
    if truth.is_empty() {
        return 0.0;
    }
    per_class(truth, pred, n).iter().map(|s| s.2 * s.3 as f64).sum::<f64>() / truth.len() as f64
}

/// Recall of class `c`; `None` when the truth has no row of that class.
pub fn recall_of(truth: &[usize], pred: &[usize], c: usize) -> Option<f64> {
    let support = truth.iter().filter(|&&t| t == c).count();
    if support == 0 {
        return None;
    }
    let tp = truth.iter().zip(pred).filter(|&(&t, &p)| t == c && p == c).count();
    Some(tp as f64 / support as f64)
}

/// Fraction of rows predicted in a lower bin than the truth (GPUMemNet's "below diagonal").
pub fn below_diagonal(truth: &[usize], pred: &[usize]) -> f64 {
    if truth.is_empty() {
        return 0.0;
    }
    truth.iter().zip(pred).filter(|(t, p)| p < t).count() as f64 / truth.len() as f64
}

/// Mean relative error `mean(|est − truth| / truth)` over rows with `truth > 0`; `None` if none.
pub fn mre(truth: &[f64], est: &[f64]) -> Option<f64> {
    let v: Vec<f64> = truth.iter().zip(est).filter(|(t, _)| **t > 0.0).map(|(t, e)| (e - t).abs() / t).collect();
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

/// Mean absolute error; `None` for no rows.
pub fn mae(truth: &[f64], est: &[f64]) -> Option<f64> {
    (!truth.is_empty()).then(|| truth.iter().zip(est).map(|(t, e)| (e - t).abs()).sum::<f64>() / truth.len() as f64)
}

/// Fraction of estimates below the truth (an underestimate means OOM when used as a cap).
pub fn under_rate(truth: &[f64], est: &[f64]) -> Option<f64> {
    (!truth.is_empty()).then(|| truth.iter().zip(est).filter(|(t, e)| e < t).count() as f64 / truth.len() as f64)
}

/// Nearest-rank percentile (`q` in 0..=100) of unsorted values; `None` for no values.
pub fn percentile(values: &[f64], q: f64) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let rank = ((q / 100.0) * v.len() as f64).ceil().max(1.0) as usize;
    Some(v[rank.min(v.len()) - 1])
}

/// Mean and population standard deviation; (0, 0) for no values.
pub fn mean_std(values: &[f64]) -> (f64, f64) {
    if values.is_empty() {
        return (0.0, 0.0);
    }
    let m = values.iter().sum::<f64>() / values.len() as f64;
    let var = values.iter().map(|v| (v - m) * (v - m)).sum::<f64>() / values.len() as f64;
    (m, var.sqrt())
}
