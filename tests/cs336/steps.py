"""One `FN(device) -> step()` per recorded window of the cs336 snapshots in
../shared/data/snapshots/ (see docs/validation.md for the sources and the comparison).

Convention: `FN` builds everything alive when `torch.cuda.memory._record_memory_history` started
(model, optimizer state, data, the warm-up steps the script ran before recording, with their
leftovers), and `step()` runs exactly what the snapshot records. Trace with `--steps 1`; the
window is the trace's `iter:0`.
"""

from __future__ import annotations

from typing import Any

import torch

from cs336 import basics_model as basics
from cs336 import kk_model as kk

CONFIGS = {  # the assignment's Table 1
    "small": dict(d_model=768, d_ff=3072, num_layers=12, num_heads=12),
    "medium": dict(d_model=1024, d_ff=4096, num_layers=24, num_heads=16),
    "2.7b": dict(d_model=2560, d_ff=10240, num_layers=32, num_heads=32),
}


# --- kkaitlyn111/cs336-a2-systems -------------------------------------------------------------


def _kk_model(size: str, context_length: int, device: Any) -> kk.TransformerLM:
    c = CONFIGS[size]
    return kk.TransformerLM(
        d_model=c["d_model"], num_heads=c["num_heads"], d_ff=c["d_ff"], vocab_size=10000,
        context_length=context_length, num_layers=c["num_layers"], theta=10000,
        device=device, dtype=torch.float32,
    )  # fmt: skip


def kk_fullstep_ctx128(device: Any) -> Any:
    """memory_ctx128_fullstep.pickle (9aa5e31a12) and memory_files/memory_ctx128_fullstep_.pickle
    (c1272e189a): `run_memory_foward_fullstep` with the 2.7B config, batch 4, context 128, fp32,
    no autocast, no warm-up. Before recording: the model (built on the GPU), its AdamW (no state
    yet) and the batch (inputs = targets). The window: reset_peak_memory_stats, empty_cache,
    zero_grad (no gradients yet), forward, loss, backward, the first optimizer step (creates
    exp_avg/exp_avg_sq); logits and loss stay alive to the end (locals of the function)."""
    model = _kk_model("2.7b", 128, device)
    model.to(device)
    opt = kk.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, eps=1e-8, betas=(0.9, 0.95))
    batch = torch.randint(low=0, high=10000, size=(4, 128)).to(device)

    def step() -> None:
        torch.cuda.reset_peak_memory_stats(device)
        torch.cuda.empty_cache()
        torch.cuda.synchronize()
        opt.zero_grad()
        logits = model(batch)
        loss = kk.cross_entropy_loss(logits, batch)
        loss.backward()
        opt.step()
        torch.cuda.synchronize()

    return step


def _kk_compiled_forward(size: str, context_length: int, device: Any) -> Any:
    model = torch.compile(_kk_model(size, context_length, device))
    batch = torch.randint(low=0, high=10000, size=(4, context_length)).to(device)
    kept: list[torch.Tensor] = []

    def step() -> None:
        torch.cuda.empty_cache()
        kept.append(model(batch))  # alive when the snapshot is dumped

    return step


def kk_small_forward(device: Any) -> Any:
    """memory_small_forward.pickle (9aa5e31a12): the small config, batch 4, context 128, fp32,
    `torch.compile`d, first call (compilation, Triton autotuning, then the forward; grad mode on,
    the output kept). The function that ran it (profile_all_models_memory_forward_and_fullstep)
    is not in any stored version of benchmark.py; the window is read off the snapshot's frames:
    benchmark.py:424 empty_cache (segment_free burst), :428 the compiled call."""
    return _kk_compiled_forward("small", 128, device)


def kk_27b_forward(device: Any) -> Any:
    """memory_2.7b_forward.pickle (9aa5e31a12): as kk_small_forward with the 2.7B config. The
    snapshot's start state also holds ~16.4 GB left by earlier models of the same loop, which no
    step function can know; compare the window's growth only."""
    return _kk_compiled_forward("2.7b", 128, device)


def kk_ctx256_forward(device: Any) -> Any:
    """memory_ctx256_forward.pickle (9aa5e31a12): 2.7B, batch 4, context 256, compiled forward
    (profile_model_memory, from profile_all_context_lengths_memory_forward_and_fullstep:
    benchmark.py:295 empty_cache, :298 the compiled call)."""
    return _kk_compiled_forward("2.7b", 256, device)


# --- Wedsonlin/assignment2-systems (cs336_systems/nsys_profile.py, memory_profile) ------------


def _wl_setup(context_length: int, device: Any, training: bool) -> tuple[Any, ...]:
    c = CONFIGS["medium"]
    with torch.device(device):  # the script builds on the CPU, then model.to(device)
        model = basics.BasicsTransformerLM(
            vocab_size=10000, context_length=context_length, d_model=c["d_model"],
            num_layers=c["num_layers"], num_heads=c["num_heads"], d_ff=c["d_ff"],
        )  # fmt: skip
    model.to(device)
    opt = basics.AdamW(model.parameters(), decay_first=True)
    shape = (4, context_length)
    warm_in = torch.randint(0, 10000, (5, *shape), dtype=torch.long, device=device)
    exec_in = torch.randint(0, 10000, (1, *shape), dtype=torch.long, device=device)
    warm_tg = exec_tg = None
    if training:
        warm_tg = torch.randint(0, 10000, (5, *shape), dtype=torch.long, device=device)
        exec_tg = torch.randint(0, 10000, (1, *shape), dtype=torch.long, device=device)
    return model, opt, warm_in, exec_in, warm_tg, exec_tg


def wl_medium128_inference(device: Any) -> Any:
    """results/medium_128_inference_memory_snapshot.pickle (87b086417e): medium, batch 4,
    context 128, fp32 (autocast off), `pattern=forward-only`: model.eval(), five warm-up forwards
    under inference_mode, reset_peak_memory_stats, then the recorded forward (output dropped)."""
    model, _opt, warm_in, exec_in, _, _ = _wl_setup(128, device, training=False)
    model.eval()
    with torch.inference_mode():
        for i in range(5):
            with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=False):
                model(warm_in[i])
    torch.cuda.reset_peak_memory_stats()

    def step() -> None:
        with torch.inference_mode():
            with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=False):
                model(exec_in[0])

    return step


def wl_medium512_training(device: Any) -> Any:
    """results/medium_512_training_memory_snapshot.pickle (87b086417e): medium, batch 4,
    context 512, forward and loss under torch.autocast(cuda, bf16) (the allocation sizes show the
    bf16 casts: the run used --autocast true), the course AdamW (weight decay first),
    `pattern=full-training-step`: five warm-up steps (forward+loss under autocast, backward,
    step, zero_grad), `del output, loss`, zero_grad(set_to_none=True), reset_peak_memory_stats,
    then one recorded step; output and loss stay alive to the dump."""
    model, opt, warm_in, exec_in, warm_tg, exec_tg = _wl_setup(512, device, training=True)
    model.train()
    for i in range(5):
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=True):
            output = model(warm_in[i])
            loss = basics.cross_entropy(output, warm_tg[i])
        loss.backward()
        opt.step()
        opt.zero_grad()
    del output, loss
    opt.zero_grad(set_to_none=True)
    torch.cuda.reset_peak_memory_stats()

    def step() -> None:
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=True):
            output = model(exec_in[0])
            loss = basics.cross_entropy(output, exec_tg[0])
        loss.backward()
        opt.step()

    return step


# --- MAGMA27/assignment2-systems (cs336_systems/benchmarking_script.py) -----------------------


def magma27_small_fwd_bwd(device: Any) -> Any:
    """memory_snapshot.pickle (236a792d55): small config, vocab 10000, context 256, batch 32,
    fp32, no optimizer and no zero_grad (gradients accumulate), five warm-up forward+loss+
    backward at module level (so the last warm-up's logits `lm_head` [32,256,10000] and `loss`
    are alive when recording starts, with the accumulated gradients), then one recorded
    forward, loss, backward (the old logits are freed only when `lm_head` is reassigned)."""
    c = CONFIGS["small"]
    with torch.device(device):  # the script builds on the CPU, then model.to("cuda")
        model = basics.BasicsTransformerLM(
            10000, 256, c["d_model"], c["num_layers"], c["num_heads"], c["d_ff"], 10000
        )
    model = model.to("cuda")
    data = torch.randint(0, 10000, (32, 256)).to("cuda")
    target = torch.randint(0, 10000, (32, 256)).to("cuda")
    g: dict[str, torch.Tensor] = {}  # the script's module-level `lm_head` and `loss`

    def once() -> None:
        g["lm_head"] = model(data)
        g["loss"] = basics.cross_entropy(g["lm_head"], target)
        g["loss"].backward()

    for _ in range(5):
        once()
    return once


# --- bcrafton/assignment2-systems (benchmarking_script.py) ------------------------------------


def bcrafton_small_train(device: Any) -> Any:
    """memory_snapshot.pickle (484099c0ed; stored at 0c0e8a736e): small config with vocab 50257,
    context 64, batch 1, fp32, `m.compile()`, the course AdamW(lr=1e-4) (weight decay last), no
    zero_grad (gradients accumulate); ten warm-up `fake_train` steps, then one recorded step:
    fresh x and y, forward, loss, backward, optimizer step (x, y, p, loss are locals of
    fake_train: nothing but parameters, gradients and AdamW state survives between steps)."""
    c = CONFIGS["small"]
    with torch.device(device):  # the script builds on the CPU, then .to("cuda")
        m = basics.BasicsTransformerLM(
            vocab_size=50257, context_length=64, d_model=c["d_model"], num_layers=c["num_layers"],
            num_heads=c["num_heads"], d_ff=c["d_ff"], rope_theta=10000, rope="interleave",
        )  # fmt: skip
    m = m.to("cuda")
    m.compile()
    optimizer = basics.AdamW(m.parameters(), lr=1e-4, decay_first=False)

    def fake_train() -> None:
        x = torch.randint(low=0, high=50257, size=(1, 64)).to("cuda")
        y = torch.randint(low=0, high=50257, size=(1, 64)).to("cuda")
        p = m(x)
        loss = basics.cross_entropy(p, y)
        loss.backward()
        optimizer.step()

    for _ in range(10):
        fake_train()
    return fake_train
