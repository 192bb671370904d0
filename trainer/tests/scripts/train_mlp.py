"""An unmodified training script, as written for a GPU (tests/test_userstep.py traces it)."""

import argparse

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

p = argparse.ArgumentParser()
p.add_argument("--width", type=int, default=256)
p.add_argument("--epochs", type=int, default=100)
args = p.parse_args()

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = nn.Sequential(nn.Linear(64, args.width), nn.ReLU(), nn.Linear(args.width, 10)).to(device)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
data = TensorDataset(torch.randn(512, 64), torch.randint(0, 10, (512,)))
loader = DataLoader(data, batch_size=32, shuffle=True, pin_memory=True)

for epoch in range(args.epochs):
    for x, y in loader:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if not torch.isfinite(loss).item():
            raise SystemExit("diverged")
    print(f"epoch {epoch}: loss {loss.item():.3f}, {torch.cuda.memory_allocated() / 2**20:.1f} MiB")
