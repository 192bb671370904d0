"""The course's `cs336_basics` package as shipped with assignment 2 (`cs336-basics/cs336_basics/
model.py`, `nn_utils.py`, `optimizer.py`), used by Wedsonlin, MAGMA27 and bcrafton.

Parameterisation:
- parameters built on the CPU and moved with `model.to(device)` (here: built on the device the
  step gives; the GPU sees the same parameter allocations either way);
- Linear: weight [d_out, d_in], no bias, `einsum("...i,oi->...o")`;
- Embedding: weight [vocab, d_model], `weight[ids, :]`;
- RMSNorm: `x * rsqrt(mean(x**2) + eps)` in fp32, times the weight, cast back;
- RotaryEmbedding: one buffer [2, context_length, d_head/2] shared by every layer; the default
  path (no token positions) slices it, splits x into even/odd halves by a view, rotates with four
  products and two sums, and concatenates the halves (`rope="concat"`); bcrafton's variant
  (`rope="interleave"`) gathers cos/sin at `arange(seq)` positions and interleaves the halves
  back (`stack(..., -1).flatten(-2)`), with the causal mask built from two broadcast aranges;
- attention: q/k/v projections, heads split by a permuting view, `einsum(Q, K) / sqrt(d_k)`,
  `where(mask, scores, -inf)`, max-subtracting softmax, `einsum(weights, V)`, heads merged by a
  copying reshape, output projection;
- SwiGLU: w2(silu(w1 x) * w3 x) with silu(x) = x * sigmoid(x);
- pre-norm blocks: h = x + attn(ln1 x); h + ffn(ln2 h); final RMSNorm; LM head d_model -> vocab.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn


class Linear(nn.Module):
    def __init__(self, d_in: int, d_out: int) -> None:
        super().__init__()
        std = math.sqrt(2 / (d_in + d_out))
        self.weight = nn.Parameter(
            nn.init.trunc_normal_(torch.empty(d_out, d_in), std=std, a=-3 * std, b=3 * std)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.einsum("...i,oi->...o", x, self.weight)


class Embedding(nn.Module):
    def __init__(self, vocab: int, d_model: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(
            nn.init.trunc_normal_(torch.empty(vocab, d_model), std=1.0, a=-3.0, b=3.0)
        )

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.weight[ids, :]


class RMSNorm(nn.Module):
    def __init__(self, hidden: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        in_dtype = x.dtype
        x = x.to(torch.float32)
        rms = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        x = x * rms
        return (self.weight * x).to(in_dtype)


class RotaryEmbedding(nn.Module):
    def __init__(self, context_length: int, dim: int, theta: float, rope: str) -> None:
        super().__init__()
        d = torch.arange(0, dim, 2) / dim
        freqs = torch.tensor(theta) ** -d
        t = torch.arange(context_length)
        freqs = torch.outer(t, freqs)
        self.register_buffer(
            "cache", torch.stack((torch.cos(freqs), torch.sin(freqs))), persistent=False
        )
        self.rope = rope

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        seq = x.size(-2)
        pairs = x.unflatten(-1, (-1, 2))  # "... (half_d xy) -> xy ... half_d", as views
        x1, x2 = pairs[..., 0], pairs[..., 1]
        if self.rope == "concat":
            cos, sin = self.cache[:, :seq, :].unbind(0)
        else:  # einx.get_at at positions arange(seq), shaped [1, 1, seq]
            pos = torch.arange(seq, device=x.device).view(1, 1, seq)
            cos, sin = self.cache[:, pos, :].unbind(0)
        x1_rot = cos * x1 - sin * x2
        x2_rot = sin * x1 + cos * x2
        if self.rope == "concat":
            return torch.concat((x1_rot, x2_rot), dim=-1)
        return torch.stack((x1_rot, x2_rot), dim=-1).flatten(-2).contiguous()


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    shifted = x - torch.max(x, dim=dim, keepdim=True)[0]
    e = torch.exp(shifted)
    return e / torch.sum(e, dim=dim, keepdim=True)


def log_softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    x_max = torch.max(x, dim=dim, keepdim=True)[0]
    x = x - x_max
    return x - torch.log(torch.sum(torch.exp(x), dim=dim, keepdim=True))


def cross_entropy(inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    nls = -log_softmax(inputs)
    return torch.mean(torch.gather(nls, -1, targets.unsqueeze(-1)))


def scaled_dot_product_attention(q, k, v, mask):
    scores = torch.einsum("...qd,...kd->...qk", q, k) / math.sqrt(k.shape[-1])
    scores = torch.where(mask, scores, float("-inf"))
    weights = softmax(scores, dim=-1)
    return torch.einsum("...qk,...kd->...qd", weights, v)


class CausalMultiHeadSelfAttention(nn.Module):
    def __init__(self, d_model: int, heads: int, rope: RotaryEmbedding) -> None:
        super().__init__()
        self.heads, self.d_k = heads, d_model // heads
        self.q_proj = Linear(d_model, d_model)
        self.k_proj = Linear(d_model, d_model)
        self.v_proj = Linear(d_model, d_model)
        self.output_proj = Linear(d_model, d_model)
        self.positional_encoder = rope

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape

        def split(t: torch.Tensor) -> torch.Tensor:  # "... seq (heads d) -> ... heads seq d"
            return t.view(b, s, self.heads, self.d_k).transpose(1, 2)

        q, k, v = split(self.q_proj(x)), split(self.k_proj(x)), split(self.v_proj(x))
        q = self.positional_encoder(q)
        k = self.positional_encoder(k)
        if self.positional_encoder.rope == "concat":
            iota = torch.arange(s, device=x.device)
            mask = (iota.view(s, 1) >= iota.view(1, s))[None, ...]
        else:
            seq = torch.arange(s, device=x.device)
            mask = seq.view(1, 1, s, 1) >= seq.view(1, 1, 1, s)
        out = scaled_dot_product_attention(q, k, v, mask)
        out = out.transpose(1, 2).reshape(b, s, self.heads * self.d_k).contiguous()
        return self.output_proj(out)


class SwiGLU(nn.Module):
    def __init__(self, d_model: int, d_ff: int) -> None:
        super().__init__()
        self.w1 = Linear(d_model, d_ff)
        self.w2 = Linear(d_ff, d_model)
        self.w3 = Linear(d_model, d_ff)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(silu(self.w1(x)) * self.w3(x))


def silu(x: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(x)


class TransformerBlock(nn.Module):
    def __init__(self, d_model: int, heads: int, d_ff: int, rope: RotaryEmbedding) -> None:
        super().__init__()
        self.keep_norms = rope.rope == "interleave"  # bcrafton names both norms' outputs
        self.attn = CausalMultiHeadSelfAttention(d_model, heads, rope)
        self.ffn = SwiGLU(d_model, d_ff)
        self.ln1 = RMSNorm(d_model)
        self.ln2 = RMSNorm(d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Locals of the original: the attention output (and, in bcrafton's copy, both norms'
        # outputs) stay alive until the block returns.
        ln1 = self.ln1(x)
        x_attn = self.attn(ln1)
        if not self.keep_norms:  # the course's copy: `self.attn(self.ln1(x))`
            del ln1
        attn_sublayer_output = x + x_attn
        ln2 = self.ln2(attn_sublayer_output)
        x_ffn = self.ffn(ln2)
        if not self.keep_norms:
            del ln2
        ffn_sublayer_output = attn_sublayer_output + x_ffn
        return ffn_sublayer_output


class BasicsTransformerLM(nn.Module):
    def __init__(self, vocab_size, context_length, d_model, num_layers, num_heads, d_ff,
                 rope_theta: float = 10000.0, rope: str = "concat") -> None:  # fmt: skip
        super().__init__()
        self.config = dict(vocab_size=vocab_size, context_length=context_length)
        self.token_embeddings = Embedding(vocab_size, d_model)
        self.positional_encoder = RotaryEmbedding(
            context_length, d_model // num_heads, rope_theta, rope
        )
        self.layers = nn.ModuleList(
            TransformerBlock(d_model, num_heads, d_ff, self.positional_encoder)
            for _ in range(num_layers)
        )
        self.ln_final = RMSNorm(d_model)
        self.lm_head = Linear(d_model, vocab_size)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.token_embeddings(ids)
        # The course's copy keeps the embedding output as `embedded_tokens` for the whole forward
        # (it matters where nothing is saved for backward: inference); bcrafton's reassigns x.
        embedded_tokens = x if self.positional_encoder.rope == "concat" else None
        for layer in self.layers:
            x = layer(x)
        x = self.ln_final(x)
        logits = self.lm_head(x)
        del embedded_tokens
        return logits


class AdamW(torch.optim.Optimizer):
    """The course's AdamW, one parameter at a time, out of place: `state.get("m",
    torch.zeros_like(grad))` builds a zeros tensor every step (the default is evaluated even when
    the state exists), new m_t and v_t replace the state (the previous ones stay referenced by
    the loop's locals until the next parameter), and the update and the decoupled weight decay
    are `p.data -= <temporary>`. `decay_first`: weight decay before the moments (Wedsonlin's copy)
    or after the update (bcrafton's)."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01,
                 decay_first: bool = False) -> None:  # fmt: skip
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self.decay_first = decay_first

    def step(self, closure: Callable | None = None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad.data
                state = self.state[p]
                alpha, (b1, b2), eps = group["lr"], group["betas"], group["eps"]
                t = state.get("t", 1)
                if self.decay_first:
                    p.data -= alpha * group["weight_decay"] * p.data
                prev_m_t = state.get("m", torch.zeros_like(grad))
                prev_v_t = state.get("v", torch.zeros_like(grad))
                m_t = b1 * prev_m_t + ((1 - b1) * grad)
                v_t = b2 * prev_v_t + ((1 - b2) * torch.square(grad))
                alpha_t = alpha * (math.sqrt(1 - (b2**t)) / (1 - (b1**t)))
                p.data -= alpha_t * m_t / (torch.sqrt(v_t) + eps)
                if not self.decay_first:
                    p.data -= alpha * group["weight_decay"] * p.data
                state["m"] = m_t
                state["v"] = v_t
                state["t"] = t + 1
        return None
