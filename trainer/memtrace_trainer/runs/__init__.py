"""GPU runs, sweeps and the dataset of measured labels (`run`, `launch`, `dataset`)."""
