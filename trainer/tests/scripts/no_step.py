"""Inference only: no optimizer step and no marks."""

import torch

model = torch.nn.Linear(16, 16).cuda()
with torch.no_grad():
    print(model(torch.randn(4, 16, device="cuda")).sum().item())
