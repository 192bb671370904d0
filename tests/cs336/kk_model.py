"""kkaitlyn111's assignment-1 Transformer LM (`cs336_basics/transformer.py` of
kkaitlyn111/cs336-assignment1, imported by cs336-a2-systems' `cs336_systems/benchmark.py`), its
AdamW (`cs336_basics/optimizers.py`) and cross-entropy (`cs336_basics/training.py`).

Parameterisation (checked against the snapshots' allocation sizes and frames):
- every tensor is created with the model's `device`/`dtype` (no CPU init then `.to`);
- Linear: one weight [in, out], no bias, `einsum("io,...i->...o")`;
- Embedding: weight [vocab, d_model], `weight[ids]`;
- RMSNorm: `vector_norm` (kept), `sqrt(norm**2 / d + eps)`, `x / rms`, `einsum("d,bsd->bsd")`;
- one RoPE module per attention layer, buffer cos_sin [max_seq_len, d_k/2, 2] fp32; positions
  `arange(seq)` expanded over the batch; cos/sin gathered per call; `zeros_like` of the paired
  view (which keeps its permuted strides) filled slice by slice;
- attention: q/k/v projections, heads split by a permuting view, causal mask
  `~triu(ones(s, s), 1).bool()` expanded over (batch, heads), `masked_fill(mask == False, -1e9)`,
  a max-subtracting softmax, heads merged by a copying reshape, output projection;
- SwiGLU: t1 = w1(x); t3 = w3(x); t2 = sigmoid(t1) * t1; w2(t2 * t3);
- LM: embedding, pre-norm blocks, final RMSNorm, LM head Linear(d_model -> vocab).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn


class Linear(nn.Module):
    """Weight stored [in, out]: with it the weight gradient of the einsum comes out in the
    parameter's own layout and autograd keeps it as `.grad` (the snapshot shows one allocation per
    weight gradient); an [out, in] weight would get a transposed gradient and a clone."""

    def __init__(self, d_in: int, d_out: int, device=None, dtype=None) -> None:
        super().__init__()
        std = math.sqrt(2 / (d_in + d_out))
        w = torch.zeros(d_in, d_out, device=device, dtype=dtype)
        nn.init.trunc_normal_(w, mean=0.0, std=std, a=-3 * std, b=3 * std)
        self.weight = nn.Parameter(w)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.einsum("io,...i->...o", self.weight, x)


class Embedding(nn.Module):
    def __init__(self, vocab: int, d_model: int, device=None, dtype=None) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(vocab, d_model, device=device, dtype=torch.float32))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.weight[ids]


class RMSNorm(nn.Module):
    def __init__(self, d_model: int, eps: float = 1e-5, device=None) -> None:
        super().__init__()
        self.eps, self.d_model = eps, d_model
        self.weight = nn.Parameter(torch.ones(d_model, device=device, dtype=torch.float32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        in_dtype = x.dtype
        x = x.to(torch.float32)
        norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
        rms = torch.sqrt(norm**2 / self.d_model + self.eps)
        normed = x / rms
        return torch.einsum("d,bsd->bsd", self.weight, normed).to(in_dtype)


class RoPE(nn.Module):
    def __init__(self, theta: float, d_k: int, max_seq_len: int, device=None) -> None:
        super().__init__()
        self.d_k = d_k
        pos = torch.arange(max_seq_len, device=device)
        freq = 1.0 / (theta ** (torch.arange(0, d_k, 2, device=device).float() / d_k))
        angles = torch.outer(pos, freq)
        cos_sin = torch.zeros(max_seq_len, d_k // 2, 2, device=device)
        cos_sin[:, :, 0] = torch.cos(angles)
        cos_sin[:, :, 1] = torch.sin(angles)
        self.register_buffer("cos_sin", cos_sin, persistent=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        pairs = x.unflatten(-1, (self.d_k // 2, 2))  # a view, strides of x kept
        cos = self.cos_sin[positions, :, 0].unsqueeze(1)  # [b, 1, s, d_k/2]
        sin = self.cos_sin[positions, :, 1].unsqueeze(1)
        rotated = torch.zeros_like(pairs)  # preserve_format: the permuted strides of `pairs`
        rotated[..., 0] = cos * pairs[..., 0] - sin * pairs[..., 1]
        rotated[..., 1] = sin * pairs[..., 0] + cos * pairs[..., 1]
        return rotated.reshape(x.shape)


def softmax(t: torch.Tensor, dim: int) -> torch.Tensor:
    max_vals = torch.max(t, dim=dim, keepdim=True)[0]
    e = torch.exp(t - max_vals)
    return e / torch.sum(e, dim=dim, keepdim=True)


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    scores = torch.einsum("...qd,...kd->...qk", q, k)
    scores = scores / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(mask == False, -1e9)  # noqa: E712 (as written: a full-size bool)
    weights = softmax(scores, dim=-1)
    return torch.einsum("...qk,...kd->...qd", weights, v)


class MultiheadSelfAttention(nn.Module):
    def __init__(
        self, d_model: int, heads: int, max_seq_len: int, theta: float, device=None, dtype=None
    ):
        super().__init__()
        self.heads, self.d_k = heads, d_model // heads
        self.q_proj = Linear(d_model, d_model, device, dtype)
        self.k_proj = Linear(d_model, d_model, device, dtype)
        self.v_proj = Linear(d_model, d_model, device, dtype)
        self.output_proj = Linear(d_model, d_model, device, dtype)
        self.rope = RoPE(theta, self.d_k, max_seq_len, device=device)

    def _split(self, t: torch.Tensor) -> torch.Tensor:  # "b s (h d) -> b h s d": a view
        b, s, _ = t.shape
        return t.view(b, s, self.heads, self.d_k).permute(0, 2, 1, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Every intermediate is a local of the original forward: the projections stay alive until
        # it returns, also where RoPE has replaced the views of them.
        b, s, _ = x.shape
        q_x = self.q_proj(x)
        k_x = self.k_proj(x)
        v_x = self.v_proj(x)
        q, k, v = self._split(q_x), self._split(k_x), self._split(v_x)
        positions = torch.arange(s, device=x.device).unsqueeze(0).expand(b, -1)
        q = self.rope(q, positions)
        k = self.rope(k, positions)
        mask = torch.triu(torch.ones(s, s, device=x.device), diagonal=1).to(torch.bool)
        mask = ~mask
        mask = mask.unsqueeze(0).unsqueeze(0).expand(b, self.heads, -1, -1)
        result = attention(q, k, v, mask)
        result = result.permute(0, 2, 1, 3).reshape(
            b, s, self.heads * self.d_k
        )  # "b h s d -> b s (h d)"
        result = self.output_proj(result)
        return result


class SwiGLU(nn.Module):
    def __init__(self, d_model: int, d_ff: int, device=None, dtype=None) -> None:
        super().__init__()
        self.w1 = Linear(d_model, d_ff, device, dtype)
        self.w2 = Linear(d_ff, d_model, device, dtype)
        self.w3 = Linear(d_model, d_ff, device, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t1 = self.w1(x)
        t3 = self.w3(x)
        t2 = torch.sigmoid(t1) * t1
        return self.w2(t2 * t3)


class Block(nn.Module):
    def __init__(self, d_model, heads, d_ff, max_seq_len, theta, device=None, dtype=None) -> None:
        super().__init__()
        self.ln1 = RMSNorm(d_model, device=device)
        self.attn = MultiheadSelfAttention(d_model, heads, max_seq_len, theta, device, dtype)
        self.ln2 = RMSNorm(d_model, device=device)
        self.ffn = SwiGLU(d_model, d_ff, device, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        h = self.attn(h)
        x = x + h
        h = self.ln2(x)  # the attention output dies here
        h = self.ffn(h)
        x = x + h
        return x


class TransformerLM(nn.Module):
    def __init__(self, d_model, num_heads, d_ff, vocab_size, context_length, num_layers, theta,
                 device=None, dtype=None) -> None:  # fmt: skip
        super().__init__()
        self.token_embeddings = Embedding(vocab_size, d_model, device, dtype)
        self.layers = nn.ModuleList(
            Block(d_model, num_heads, d_ff, context_length, theta, device, dtype)
            for _ in range(num_layers)
        )
        self.ln_final = RMSNorm(d_model, device=device)
        self.lm_head = Linear(d_model, vocab_size, device, dtype)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.token_embeddings(ids)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.ln_final(x))


def cross_entropy_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Max-subtracted log-sum-exp minus the target logit, averaged (training.py's order: max with
    indices, shift, exp, sum, target pick by arange indexing, log, subtract, mean)."""
    maxes = torch.max(logits, dim=-1, keepdim=True)[0]
    shifted = logits - maxes
    exps = torch.exp(shifted)
    sumexps = exps.sum(dim=-1)
    flat = shifted.reshape(-1, shifted.shape[-1])
    picked = flat[torch.arange(flat.shape[0], device=flat.device), targets.reshape(-1)]
    losses = torch.log(sumexps).reshape(-1) - picked
    return losses.mean()


class AdamW(torch.optim.Optimizer):
    """One parameter at a time: moments created on the first step (zeros_like x2), updated in
    place; the denominator is `(v.sqrt() / sqrt(bc2)).add_(eps)` (two temporaries); decoupled weight
    decay in place."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1) -> None:
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure: Callable | None = None):
        for group in self.param_groups:
            lr, (b1, b2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad
                state = self.state[p]
                if len(state) == 0:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                m, v = state["exp_avg"], state["exp_avg_sq"]
                state["step"] += 1
                t = state["step"]
                m.mul_(b1).add_(grad, alpha=1 - b1)
                v.mul_(b2).addcmul_(grad, grad, value=1 - b2)
                denom = (v.sqrt() / math.sqrt(1 - b2**t)).add_(eps)
                p.addcdiv_(m, denom, value=-lr / (1 - b1**t))
                if wd != 0:
                    p.add_(p, alpha=-lr * wd)
        return None
