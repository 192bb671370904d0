"""Transformer-encoder classifier family (GPUMemNet's Transformer sweep ranges)."""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from memtrace_trainer.models.config import ModelConfig, field

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
    seq_len: int = field(least=1)
    embed_dim: int = field(least=1)
    layers: int = field(least=1)
    heads: int = field(least=1)
    vocab_size: int = field(least=1)
    num_classes: int = field(least=1)
    ff_mult: int = field(4, least=1)
    dropout: float = field(0.1, least=0, below=1)
    activation: str = field("gelu", choices=ACTIVATIONS)
    norm_first: bool = True

    def constraints(self) -> list[str]:
        if self.embed_dim % self.heads:
            return [f"embed_dim {self.embed_dim} is not divisible by heads {self.heads}"]
        return []

    def _build(self) -> nn.Module:
        return EncoderClassifier(self)

    def default_input_shape(self) -> tuple[int, ...]:
        return (self.seq_len,)

    def classes(self) -> int:
        return self.num_classes
