"""Step functions for tests/test_userstep.py and the README's examples: `FN(device)` builds the
model, optimizer and data on `device` and returns `step()`, one iteration of the author's loop."""

from __future__ import annotations

import sys
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.optimizer import _default_to_fused_or_foreach

SEEN: dict[str, Any] = {}


def _mlp(device: Any, width: int = 256) -> nn.Module:
    return nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10)).to(device)


class PlainAdamW:
    """A hand-written AdamW, one parameter at a time (no foreach temporaries)."""

    def __init__(self, params: list[nn.Parameter], lr: float = 1e-3) -> None:
        self.params, self.lr = params, lr
        self.m = [torch.zeros_like(p) for p in params]
        self.v = [torch.zeros_like(p) for p in params]

    @torch.no_grad()
    def step(self) -> None:
        for p, m, v in zip(self.params, self.m, self.v, strict=True):
            m.mul_(0.9).add_(p.grad, alpha=0.1)
            v.mul_(0.999).addcmul_(p.grad, p.grad, value=0.001)
            p.mul_(1 - self.lr * 0.01).addcdiv_(m, v.sqrt().add_(1e-8), value=-self.lr)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None


def custom_optimizer(device: Any) -> Any:
    model = _mlp(device)
    opt = PlainAdamW(list(model.parameters()))
    x = torch.randn(32, 256, device=device)
    y = torch.randint(0, 10, (32,), device=device)

    def step() -> None:
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()

    return step


def default_adamw(device: Any) -> Any:
    """torch.optim.AdamW with foreach left to PyTorch's own default."""
    model = _mlp(device)
    opt = torch.optim.AdamW(model.parameters())
    x, y = torch.randn(32, 256, device=device), torch.randint(0, 10, (32,), device=device)
    params = list(model.parameters())

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        SEEN["foreach"] = _default_to_fused_or_foreach(params, False, False)
        opt.step()

    return step


def _built_with(device: Any, make: Any, batch_size: int = 32) -> Any:
    model = _mlp(device, 1024)
    opt = make(model.parameters())
    x = torch.randn(batch_size, 1024, device=device)
    y = torch.randint(0, 10, (batch_size,), device=device)

    def step() -> None:
        F.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def fused_adamw(device: Any) -> Any:
    return _built_with(device, lambda p: torch.optim.AdamW(p, fused=True))


def foreach_adamw(device: Any) -> Any:
    return _built_with(device, lambda p: torch.optim.AdamW(p, foreach=True))


def fused_sgd(device: Any) -> Any:
    """SGD with momentum, `fused=True`: `_fused_sgd_` has no meta kernel in PyTorch."""
    return _built_with(device, lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, fused=True))


class _MlpWithSpareConv(nn.Module):
    """An MLP that also builds a convolution its forward never calls."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
        self.spare = nn.Conv2d(3, 8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def unused_conv(device: Any) -> Any:
    """The family is of the layers that ran: this job is an MLP, its unused Conv2d aside."""
    model = _MlpWithSpareConv().to(device)
    opt = torch.optim.SGD(model.parameters())
    x, y = torch.randn(32, 256, device=device), torch.randint(0, 10, (32,), device=device)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()

    return step


def bf16_params(device: Any) -> Any:
    """bf16 parameters, no autocast: the regime is bf16, as for `--model ... --dtype bf16`."""
    model = _mlp(device).to(torch.bfloat16)
    opt = torch.optim.SGD(model.parameters())
    x = torch.randn(32, 256, device=device, dtype=torch.bfloat16)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        model(x).float().sum().backward()
        opt.step()

    return step


def matrix_vector(device: Any) -> Any:
    """A step whose only products are matrix-vector ones (cuBLAS gemv)."""
    w = torch.randn(512, 512, device=device, requires_grad=True)
    x = torch.randn(512, device=device)

    def step() -> None:
        torch.mv(w, x).sum().backward()

    return step


def _wide_sgd(device: Any) -> tuple[nn.Module, torch.optim.Optimizer, Any, Any]:
    """A wide MLP, its SGD and a large batch: the zero_grad placements' job."""
    model = _mlp(device, 1024)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(4096, 1024, device=device), torch.randint(0, 10, (4096,), device=device)
    return model, opt, x, y


def zero_grad_after_forward(device: Any) -> Any:
    """Stale gradients stay alive through the next forward."""
    model, opt, x, y = _wide_sgd(device)

    def step() -> None:
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def zero_grad_before_forward(device: Any) -> Any:
    model, opt, x, y = _wide_sgd(device)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()

    return step


def _eval_step(device: Any, mode: Any) -> Any:
    """A forward alone, under `mode` (no_grad or inference_mode)."""
    model = _mlp(device).eval()
    x = torch.randn(64, 256, device=device)

    def step() -> None:
        with mode():
            model(x)

    return step


def forward_only(device: Any) -> Any:
    return _eval_step(device, torch.no_grad)


def inference(device: Any) -> Any:
    return _eval_step(device, torch.inference_mode)


def grad_accumulation(device: Any) -> Any:
    model = _mlp(device)
    opt = torch.optim.Adam(model.parameters())
    batches = [torch.randn(16, 256, device=device) for _ in range(4)]
    y = torch.randint(0, 10, (16,), device=device)

    def step() -> None:
        for x in batches:
            (F.cross_entropy(model(x), y) / len(batches)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def chunked_cross_entropy(device: Any) -> Any:
    """An LM head whose loss is computed in sequence chunks, each chunk's logits freed early."""
    vocab, dim, seq = 5000, 128, 256
    emb = nn.Embedding(vocab, dim).to(device)
    head = nn.Linear(dim, vocab, bias=False).to(device)
    opt = torch.optim.AdamW([*emb.parameters(), *head.parameters()])
    tokens = torch.randint(0, vocab, (4, seq), device=device)

    def step() -> None:
        h = emb(tokens)
        total = h.new_zeros(())
        for chunk, target in zip(h.split(64, dim=1), tokens.split(64, dim=1), strict=True):
            logits = head(chunk)
            total = total + F.cross_entropy(logits.flatten(0, 1), target.flatten())
        total.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def cuda_literals(device: Any) -> Any:
    """Code written for a GPU: `"cuda"` strings, `.cuda()`, pinned batches, torch.cuda queries."""
    assert torch.cuda.is_available()
    model = _mlp("cpu").cuda()
    opt = torch.optim.Adam(model.parameters())
    batch = torch.randn(32, 256).pin_memory()
    target = torch.randint(0, 10, (32,))

    def step() -> None:
        x = batch.to("cuda", non_blocking=True)
        y = target.to(torch.device("cuda"))
        F.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        torch.cuda.synchronize()
        SEEN["allocated"] = torch.cuda.memory_allocated()
        SEEN["max_allocated"] = torch.cuda.max_memory_allocated()
        SEEN["name"] = torch.cuda.get_device_name()
        torch.cuda.empty_cache()

    return step


class EinsumMLP(nn.Module):
    """Linear layers written with torch.einsum, as the cs336 models are."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(width, width))
        self.w2 = nn.Parameter(torch.randn(10, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.einsum("bi,oi->bo", x, self.w1).relu()
        return torch.einsum("bi,oi->bo", h, self.w2)


def _einsum_step(device: Any, amp: torch.dtype | None) -> Any:
    with torch.device(device):
        model = EinsumMLP(512)
    opt = torch.optim.AdamW(model.parameters())
    x, y = torch.randn(256, 512, device=device), torch.randint(0, 10, (256,), device=device)

    def step() -> None:
        with torch.autocast("cuda", dtype=amp or torch.float16, enabled=amp is not None):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def einsum_fp32(device: Any) -> Any:
    return _einsum_step(device, None)


def einsum_bf16(device: Any) -> Any:
    return _einsum_step(device, torch.bfloat16)


def _attention_step(device: Any, backends: list[Any] | None) -> Any:
    from torch.nn.attention import sdpa_kernel

    q = torch.randn(2, 8, 1024, 64, device=device, dtype=torch.bfloat16, requires_grad=True)
    k, v = torch.randn_like(q, requires_grad=True), torch.randn_like(q, requires_grad=True)

    def step() -> None:
        if backends is None:
            out = F.scaled_dot_product_attention(q, k, v)
        else:
            with sdpa_kernel(backends):
                out = F.scaled_dot_product_attention(q, k, v)
        out.sum().backward()
        q.grad = k.grad = v.grad = None

    return step


def attention_default(device: Any) -> Any:
    return _attention_step(device, None)


def attention_math(device: Any) -> Any:
    """The math kernel, as a program asks for it: the (2, 8, 1024, 1024) scores and their
    softmax are allocated, which flash never does."""
    from torch.nn.attention import SDPBackend

    return _attention_step(device, [SDPBackend.MATH])


def sized(device: Any, batch_size: int) -> Any:
    """`max-batch --step` searches the second argument."""
    return _built_with(device, torch.optim.Adam, batch_size)


def raises(device: Any) -> Any:
    model = _mlp(device)

    def step() -> None:
        model(torch.randn(4, 7, device=device))  # wrong width: the user's bug

    return step


def exits(device: Any) -> Any:
    """A step that ends the program (`sys.exit(0)`) in its second call."""
    model = _mlp(device)
    calls = [0]

    def step() -> None:
        calls[0] += 1
        if calls[0] == 2:
            sys.exit(0)
        model(torch.randn(4, 256, device=device)).sum().backward()

    return step


def exits_building(device: Any) -> Any:
    sys.exit(3)


def allocates_nothing(device: Any) -> Any:
    def step() -> None:
        pass

    return step


def asks_reserved(device: Any) -> Any:
    def step() -> None:
        torch.cuda.memory_reserved()

    return step


def not_a_step(device: Any) -> Any:
    return 42


def compiled(device: Any) -> Any:
    model = torch.compile(_mlp(device))
    x = torch.randn(8, 256, device=device)

    @torch.compile(mode="reduce-overhead")
    def loss_of(x: torch.Tensor) -> torch.Tensor:
        return model(x).sum()

    def step() -> None:
        loss_of(x).backward()

    return step


def side_stream(device: Any) -> Any:
    """A prefetch on a side stream, handed to the default stream with record_stream."""
    model = _mlp(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    copy = torch.cuda.Stream()
    host = torch.randn(64, 256)

    def step() -> None:
        with torch.cuda.stream(copy):
            x = host.to("cuda", non_blocking=True)
        torch.cuda.current_stream().wait_stream(copy)
        x.record_stream(torch.cuda.current_stream())
        model(x).sum().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def ddp_step(device: torch.device, batch_size: int = 32) -> Any:
    """A data-parallel loop as written for torchrun: the process group, DDP, AdamW."""
    import os

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("nccl")
    rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(rank)
    model = DistributedDataParallel(
        nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 10)).to(device),
        device_ids=[rank],
    )
    opt = torch.optim.AdamW(model.parameters())

    def step() -> None:
        x = torch.randn(batch_size, 256, device=device)
        y = torch.randint(0, 10, (batch_size,), device=device)
        F.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def fsdp2_meta_init_step(device: torch.device) -> Any:
    """FSDP2 as its recipes write it: build on the meta device, shard each block and the root
    over a "cuda" mesh, materialise the shards with `to_empty`, then train."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("nccl")
    mesh = init_device_mesh("cuda", (dist.get_world_size(),))
    with torch.device("meta"):
        model = nn.Sequential(*(nn.Linear(512, 512) for _ in range(4)))
        scratch = torch.empty(1 << 24)  # 64 MiB on the meta device proper: no memory
        del scratch
    for block in model:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    model.to_empty(device=device)
    opt = torch.optim.AdamW(model.parameters())

    def step() -> None:
        x = torch.randn(8, 512, device=device)
        model(x).sum().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def meta_device_step(device: torch.device) -> Any:
    """Work on the meta device proper (a shape check, as libraries do) beside the GPU's."""
    with torch.device("meta"):
        probe = torch.empty(4096, 4096)  # 64 MiB: no memory
    derived = probe * 2  # derived from a meta tensor: no memory either
    del derived
    weight = torch.empty(1024, 1024, device=device)  # 4 MiB on the GPU

    def step() -> None:
        (weight * 2).sum()

    return step


def counted_builds(device: Any) -> Any:
    """`default_adamw`, appending a line to `$MEMTRACE_TEST_BUILDS` per call: how often a
    command builds the user's step."""
    import os

    with open(os.environ["MEMTRACE_TEST_BUILDS"], "a") as f:
        f.write("build\n")
    return default_adamw(device)


# A name that is no function, for `--step step_examples:NOT_CALLABLE`.
NOT_CALLABLE = 42
