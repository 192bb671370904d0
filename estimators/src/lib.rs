//! memest library: estimators of a training job's GPU memory (analytic, FakeTensor baseline,
//! symbolic, ML), their calibration, and batch comparison with the field's metrics.

pub mod ml;
