"""A DLRM-style recommender: bottom MLP on dense features, embedding tables, dot interactions."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from memtrace_trainer.errors import UserError
from memtrace_trainer.workload import Batch, Workload

META = torch.device("meta")


@dataclass(frozen=True)
class DLRMConfig:
    """Defaults follow the Criteo layout (13 dense, 26 sparse features) at a laptop-sized scale."""

    dense_features: int = 13
    tables: int = 26
    rows_per_table: int = 100_000
    embedding_dim: int = 64
    bottom: tuple[int, ...] = (512, 256, 64)
    top: tuple[int, ...] = (512, 256, 1)

    @staticmethod
    def from_spec(name: str) -> DLRMConfig:
        sizes = {"": DLRMConfig(), "small": DLRMConfig(rows_per_table=10_000, embedding_dim=16,
                 bottom=(64, 16), top=(64, 1)), "large": DLRMConfig(rows_per_table=1_000_000,
                 embedding_dim=128, bottom=(512, 256, 128))}  # fmt: skip
        if name not in sizes:
            raise UserError(f"unknown DLRM size {name!r}: expected dlrm, dlrm:small or dlrm:large")
        return sizes[name]


def _mlp(widths: list[int]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(itertools.pairwise(widths)):
        layers.append(nn.Linear(a, b))
        if i < len(widths) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class DLRM(nn.Module):
    def __init__(self, cfg: DLRMConfig) -> None:
        super().__init__()
        if cfg.bottom[-1] != cfg.embedding_dim:
            raise UserError("DLRM bottom MLP must end at embedding_dim (dot interactions)")
        self.cfg = cfg
        self.bottom = _mlp([cfg.dense_features, *cfg.bottom])
        self.tables = nn.ModuleList(
            nn.EmbeddingBag(cfg.rows_per_table, cfg.embedding_dim, mode="sum")
            for _ in range(cfg.tables)
        )
        pairs = (cfg.tables + 1) * cfg.tables // 2
        self.top = _mlp([cfg.embedding_dim + pairs, *cfg.top])

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        x = self.bottom(dense)
        feats = [x] + [t(sparse[:, i : i + 1]) for i, t in enumerate(self.tables)]
        z = torch.stack(feats, dim=1)
        inter = torch.bmm(z, z.transpose(1, 2))
        i, j = torch.tril_indices(z.shape[1], z.shape[1], offset=-1, device=z.device)
        return self.top(torch.cat([x, inter[:, i, j]], dim=1))

    @staticmethod
    def workload(spec: str, cfg: DLRMConfig, batch: int, device: torch.device = META) -> Workload:
        with device:
            model = DLRM(cfg)

        def make() -> Batch:
            dense = torch.randn(batch, cfg.dense_features, device=device)
            sparse = torch.randint(0, cfg.rows_per_table, (batch, cfg.tables), device=device)
            return (dense, sparse), torch.rand(batch, 1, device=device)

        def loss(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            return F.binary_cross_entropy_with_logits(out, target)

        return Workload(spec, model, make, loss, batch, "dlrm")
