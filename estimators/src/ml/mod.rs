//! GPUMemNet-style ML estimators (classifiers over memory bins, regressors).
