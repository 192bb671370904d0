"""A value-dependent shape: cannot be traced without the values."""

import torch

x = torch.randn(100, device="cuda")
kept = x[x > 0]  # boolean indexing: the output size depends on the values
print(kept.shape)
