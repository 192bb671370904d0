//! Feature standardisation, fitted on training rows only.

use ndarray::{Array1, Array2, Axis};
use serde::{Deserialize, Serialize};

/// Per-column `(x − mean) / std`. Constant columns get `std = 1`, so they map to 0 rather than NaN.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Standardizer {
    /// Column means of the training rows.
    pub mean: Array1<f64>,
    /// Column population standard deviations of the training rows.
    pub std: Array1<f64>,
}

impl Standardizer {
    /// Fits on `x` (the training rows, and only those).
    pub fn fit(x: &Array2<f64>) -> Standardizer {
        let n = x.nrows().max(1) as f64;
        let mean = x.sum_axis(Axis(0)) / n;
        let var = x
            .rows()
            .into_iter()
            .fold(Array1::zeros(x.ncols()), |acc: Array1<f64>, r| acc + (&r - &mean).mapv(|d| d * d))
            / n;
        let std = var.mapv(|v| if v > 1e-24 { v.sqrt() } else { 1.0 });
        Standardizer { mean, std }
    }

    /// Applies the fitted transform.
    pub fn transform(&self, x: &Array2<f64>) -> Array2<f64> {
        (x - &self.mean) / &self.std
    }
}
