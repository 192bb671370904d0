"""Synthetic model families, the GPUMemNet rebuilder, sweeps and the real-model zoo."""
