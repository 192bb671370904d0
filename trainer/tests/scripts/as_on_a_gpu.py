"""A script written for a GPU, as people write one: the optimizer built before `.cuda()`, tied
embeddings, DataParallel, a checkpoint saved and loaded onto the GPU, the allocator's statistics
printed, and a pinned DataLoader with workers. Each of these failed, or was silently wrong,
under the tracer (tests/test_userstep.py)."""

import io
import sys

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(1000, 256)
        self.body = nn.Linear(256, 256)
        self.head = nn.Linear(256, 1000, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.body(self.emb(ids))))


model = Tied()
opt = torch.optim.AdamW(model.parameters())  # before the move, as Accelerate's recipes do
model = nn.DataParallel(model.cuda())
print("same parameters:", opt.param_groups[0]["params"][0] is model.module.emb.weight,
      file=sys.stderr)  # fmt: skip
path = sys.argv[1]
torch.save({"model": model.state_dict()}, path)
# A checkpoint read back onto the GPU (map_location="cuda" needs a driver in PyTorch's reader).
buffer = io.BytesIO()
torch.save({"step": torch.zeros(4)}, buffer)  # a real host tensor, to a buffer of the script's
buffer.seek(0)
restored = torch.load(buffer, map_location="cuda")
print("restored on", restored["step"].device.type, file=sys.stderr)
data = TensorDataset(torch.randint(0, 1000, (64, 16)))
loader = DataLoader(data, batch_size=8, num_workers=2, pin_memory=True)
for (ids,) in loader:
    ids = ids.cuda(non_blocking=True)
    logits = model(ids)
    F.cross_entropy(logits.flatten(0, 1), ids.flatten()).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    stats = torch.cuda.memory_stats()
    print(stats["allocated_bytes.all.peak"], torch.cuda.memory_summary()[:9], file=sys.stderr)
