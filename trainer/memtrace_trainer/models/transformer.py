"""Transformer-encoder classifier family (GPUMemNet's Transformer sweep ranges)."""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from memtrace_trainer.models.config import ModelConfig

ACTIVATIONS = ("relu", "gelu")


class EncoderClassifier(nn.Module):
    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.tokens = nn.Embedding(cfg.vocab_size, cfg.embed_dim)
        self.positions = nn.Embedding(cfg.seq_len, cfg.embed_dim)
        layer = nn.TransformerEncoderLayer(
            cfg.embed_dim,
            cfg.heads,
            cfg.ff_mult * cfg.embed_dim,
            cfg.dropout,
            cfg.activation,
            batch_first=True,
            norm_first=cfg.norm_first,
        )
        self.encoder = nn.TransformerEncoder(layer, cfg.layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(cfg.embed_dim)
        self.fc = nn.Linear(cfg.embed_dim, cfg.num_classes)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(ids.shape[1], device=ids.device)
        x = self.encoder(self.tokens(ids) + self.positions(pos))
        return self.fc(self.norm(x.mean(dim=1)))


@dataclasses.dataclass(frozen=True)
class TransformerConfig(ModelConfig):
    """Token embedding, `layers` encoder layers, mean pooling, a classifier."""

    family = "transformer"
    seq_len: int
    embed_dim: int
    layers: int
    heads: int
    vocab_size: int
    num_classes: int
    ff_mult: int = 4
    dropout: float = 0.1
    activation: str = "gelu"
    norm_first: bool = True

    def problems(self) -> list[str]:
        p = []
        for name in ("seq_len", "embed_dim", "layers", "heads", "vocab_size", "num_classes"):
            if getattr(self, name) < 1:
                p.append(f"{name} {getattr(self, name)} < 1")
        if self.heads >= 1 and self.embed_dim % self.heads:
            p.append(f"embed_dim {self.embed_dim} is not divisible by heads {self.heads}")
        if self.ff_mult < 1:
            p.append(f"ff_mult {self.ff_mult} < 1")
        if self.activation not in ACTIVATIONS:
            p.append(f"activation {self.activation!r} not in {ACTIVATIONS}")
        if not 0.0 <= self.dropout < 1.0:
            p.append(f"dropout {self.dropout} outside [0, 1)")
        return p

    def build(self) -> nn.Module:
        self.validate()
        return EncoderClassifier(self)

    def default_input_shape(self) -> tuple[int, ...]:
        return (self.seq_len,)

    def classes(self) -> int:
        return self.num_classes
