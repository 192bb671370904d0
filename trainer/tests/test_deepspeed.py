"""DeepSpeed's own buffers beside the PyTorch code its ZeRO strategies run as
(symtrace/deepspeed.py, docs/distributed.md): the contiguous gradient reduce buffer of
`reduce_bucket_size` elements, ZeRO-1 without DDP's buckets and at its heaviest rank, and the
strategy flags that change nothing (one rank, `--reduce-bucket-size` without ZeRO)."""

from __future__ import annotations

import json
import warnings
from typing import Any

import pytest
import torch
from conftest import cli
from test_finetune import LLAMA, workload
from torch import nn

import memtrace
from memtrace import EstimateError
from memtrace_trainer import notes, serve_worker
from memtrace_trainer.errors import UserError
from memtrace_trainer.profile import load_profile
from memtrace_trainer.serve_schema import Policy, RequestError, Schema, estimate_parser
from memtrace_trainer.symtrace.step import StepConfig
from memtrace_trainer.symtrace.tracer import summarize, trace

MIB = 2**20


def _run(w: Any, **cfg: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    rec, extra = trace(w, StepConfig(**{"optimizer": "adamw", "iterations": 2, **cfg}),
                       load_profile(None))  # fmt: skip
    return rec.events, extra


def _lives(events: list[dict[str, Any]], size: int) -> list[tuple[int, int | None]]:
    """(index of the allocation, index of its free or None) of each "other" block of `size`."""
    out = []
    for i, e in enumerate(events):
        if e["kind"] == "alloc" and e["category"] == "other" and e["size"] == size:
            end = next((j for j in range(i + 1, len(events)) if events[j]["kind"] == "free"
                        and events[j]["addr"] == e["addr"]), None)  # fmt: skip
            out.append((i, end))
    return out


def test_zero3_holds_deepspeeds_reduce_buffer_from_the_optimizer_on() -> None:
    """stage3.py `_setup_for_real_optimizer`: `__ipg_bucket_flat_buffer`, reduce_bucket_size
    elements (5e8 by default) in the parameters' dtype, made once after the optimizer state and
    kept. It was missing: gpt2 at 8 ranks peaked at 569.5 MiB allocated, ~954 MiB short."""
    events, extra = _run(workload(dtype="bf16", seq=16), strategy="zero3", world_size=2)
    first = next(i for i, e in enumerate(events) if e.get("text") == "iter:0")
    lives = _lives(events, 500_000_000 * 2)  # bf16, as DeepSpeed's bf16 mode keeps it
    assert len(lives) == 1 and lives[0][0] < first and lives[0][1] is None, lives
    bucket = extra["distributed"]["reduce_bucket"]
    assert bucket == {"elements": 500_000_000, "dtype": "bf16", "buffers": 1,
                      "bytes": 10**9, "held": "optimizer"}  # fmt: skip
    assert "953.7 MiB" in extra["distributed"]["equivalence"]
    assert summarize(events).peak_live_bytes > 10**9
    # --reduce-bucket-size sets it; an fp32 job's buffer is fp32.
    events, _ = _run(workload(seq=16), strategy="zero3", world_size=2, reduce_bucket_size=1000)
    assert len(_lives(events, 4000)) == 1 and not _lives(events, 500_000_000 * 4)


def test_zero2_makes_the_reduce_buffer_at_each_backward() -> None:
    """stage_1_and_2.py `backward`: `ipg_buffer` is made as each backward starts (one, as
    overlap_comm defaults to False for these stages); stage 2 reduces in each backward's hooks
    and drops it (`_release_ipg_buffers`): one per micro-batch, alive while the gradients are
    made."""
    n = 12_345
    events, extra = _run(workload(dtype="bf16", seq=16), strategy="zero2", world_size=2,
                         grad_accum=2, reduce_bucket_size=n)  # fmt: skip
    lives = _lives(events, 2 * n)
    assert len(lives) == 2 * 2, lives  # two steps of two micro-batches
    for k, ((start, end), (after, _)) in enumerate(
        zip(lives, [*lives[1:], (len(events), None)], strict=True)
    ):
        assert end is not None and end < after  # freed before the next backward's
        # Alive through the backward: the first micro-batch's makes the gradients (the second
        # accumulates into them).
        made = {e["category"] for e in events[start:end] if e["kind"] == "alloc"}
        assert made and ("gradient" in made or k % 2), (k, made)
    assert extra["distributed"]["reduce_bucket"]["held"] == "backward"
    assert f"reduce_bucket_size {n} elements of bf16" in extra["distributed"]["equivalence"]


def test_zero1_keeps_one_reduce_buffer_through_the_accumulation() -> None:
    """Stage 1 reduces only at the accumulation boundary (the engine's `allreduce_gradients`,
    `reduce_gradients`), and each backward replaces `ipg_buffer`: one buffer from the first
    backward to the boundary's reduction, alive through the later micro-batches' forwards. It
    was freed after each backward, as stage 2's."""
    n = 12_345
    events, extra = _run(workload(dtype="bf16", seq=16), strategy="zero1", world_size=2,
                         grad_accum=2, reduce_bucket_size=n)  # fmt: skip
    lives = _lives(events, 2 * n)
    assert len(lives) == 2, lives  # one per step of two micro-batches
    for start, end in lives:
        assert end is not None
        # Alive through the second micro-batch's forward, after the first's backward.
        marks = [e.get("text") for e in events[start:end]]
        assert "phase:backward" in marks and "phase:forward" in marks, marks
        assert marks.index("phase:forward") > marks.index("phase:backward")
    assert extra["distributed"]["reduce_bucket"]["held"] == "accumulation"
    assert "accumulation boundary" in extra["distributed"]["equivalence"]


def _zro_partition(w: Any, world: int) -> int:
    """Elements of rank 0's ZeroRedundancyOptimizer partition (largest first, to the lightest)."""
    sizes = [0] * world
    for numel in sorted((p.numel() for p in w.model.parameters()), reverse=True):
        sizes[sizes.index(min(sizes))] += numel
    return sizes[0]


def _live_by_category(events: list[dict[str, Any]], upto: int) -> dict[str, int]:
    live: dict[int, tuple[int, str]] = {}
    for e in events[:upto]:
        if e["kind"] == "alloc":
            live[e["addr"]] = (e["size"], e["category"])
        elif e["kind"] == "free":
            live.pop(e["addr"], None)
    out: dict[str, int] = {}
    for size, category in live.values():
        out[category] = out.get(category, 0) + size
    return out


def test_zero1_keeps_its_partitions_gradients_and_drops_the_rest() -> None:
    """stage_1_and_2.py: `reduce_gradients` moves each gradient into the reduce buffer,
    `copy_grads_in_partition` copies this rank's into `grads_in_partition` (one flat tensor in
    the parameters' dtype), the epilogue's `zero_grad` drops every full gradient, and `step`
    makes a flat copy and an fp32 copy of the partition (the fp32 one held through the
    optimizer). The trace kept every full gradient through the step (4x the partition at 4
    ranks) and had neither copy."""
    w = workload(dtype="bf16", seq=16)
    mine = _zro_partition(w, 4)
    total = sum(p.numel() for p in w.model.parameters())
    events, _ = _run(w, strategy="zero1", world_size=4, reduce_bucket_size=1000, iterations=1)
    flats = [i for i, e in enumerate(events) if e["kind"] == "alloc"
             and e["category"] == "gradient" and e["size"] == 2 * mine]  # fmt: skip
    # grads_in_partition (bf16), then the fp32 gradient's bytes beyond it (4 - 2 per element).
    assert len(flats) >= 2, flats
    held = _live_by_category(events, flats[1] + 1)["gradient"]
    assert held < 2 * total / 2, (held, 2 * total)  # the full gradients are gone
    assert held >= 4 * mine  # the partition's, fp32 (as bf16 plus the rest)


def test_zero1_holds_no_ddp_bucket() -> None:
    """ZeRO-1 ran over DDP, whose flat buckets (as large as every gradient, alive for the run)
    DeepSpeed does not have: TinyLlama in bf16 showed 2362 MiB of `other` where DeepSpeed holds
    its ~954 MiB reduce buffer. It runs over the model itself now, with DeepSpeed's buffer."""
    w = workload(dtype="bf16", seq=16)
    params = w.details["parameter_bytes"]
    events, extra = _run(w, strategy="zero1", world_size=2, reduce_bucket_size=1000)
    assert extra["distributed"]["runs_as"] == "ZeroRedundancyOptimizer"
    assert len(_lives(events, 2000)) == 2  # DeepSpeed's buffer, one per backward
    assert not any(e["kind"] == "alloc" and e["category"] == "other" and e["size"] >= params / 2
                   for e in events)  # fmt: skip


def test_zero1_need_is_the_heaviest_ranks() -> None:
    """ZeroRedundancyOptimizer partitions whole parameters (largest first, to the lightest
    rank); at 3 ranks rank 2's partition is the largest. The estimate was rank 0's beside a
    warning naming rank 2; now the state rank 2 holds beyond rank 0 is in the trace."""
    w = workload(dtype="bf16", seq=16)
    sizes = [0, 0, 0]
    for numel in sorted((p.numel() for p in w.model.parameters()), reverse=True):
        sizes[sizes.index(min(sizes))] += numel
    assert sizes.index(max(sizes)) == 2 and sizes[0] < sizes[2]
    events, extra = _run(w, strategy="zero1", world_size=3)
    state = summarize(events).allocated_bytes_by_category["optimizer_state"]
    # DeepSpeed's bf16 mode: fp32 master (4) and AdamW moments (8) per parameter of rank 2's.
    assert state == 12 * sizes[2]
    assert "the need is rank 2's" in extra["distributed"]["ranks"]
    done = cli("estimate", "--model", LLAMA, "--batch-size", "1", "--seq-len", "16", "--dtype",
               "bf16", "--optimizer", "adamw", "--strategy", "zero1", "--world-size", "3",
               "--json")  # fmt: skip
    answer = json.loads(done.stdout)
    assert "the need is rank 2's" in answer["inputs"]["distributed"]["ranks"]
    assert not any("holds proportionally more" in m for m in answer["warnings"])


def _said(fn: Any) -> list[str]:
    said: list[str] = []
    with notes.captured(said.append):
        fn()
    return said


def test_one_rank_is_warned_about_in_the_cli_the_api_and_serve() -> None:
    """A strategy over one rank shards nothing and still holds its buffers (gpt2 under fsdp2:
    5084.6 MiB against 4540.1 unsharded), and was said nowhere."""
    for strategy, held in (("fsdp2", "FSDP2's all-gather"), ("ddp", "DDP's gradient buckets"),
                           ("zero3", "DeepSpeed's gradient reduce buffer")):  # fmt: skip
        said = _said(lambda s=strategy: StepConfig(strategy=s, world_size=1).validate())
        assert any(f"--world-size 1: --strategy {strategy} at one rank" in m and held in m
                   for m in said)  # fmt: skip
    assert not _said(lambda: StepConfig(strategy="fsdp2", world_size=2).validate())
    done = cli("estimate", "--model", LLAMA, "--batch-size", "1", "--seq-len", "16",
               "--strategy", "fsdp2", "--world-size", "1")  # fmt: skip
    assert "--world-size 1: --strategy fsdp2 at one rank shards and reduces nothing" in done.stderr
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        memtrace.estimate(model, torch.randn(4, 8), strategy="ddp", world_size=1)
    messages = [str(w.message) for w in seen if issubclass(w.category, memtrace.MemtraceWarning)]
    assert any("world_size=1: strategy='ddp' at one rank" in m for m in messages), messages
    status, body = _serve({"model": LLAMA, "batch_size": 1, "seq_len": 16, "strategy": "zero3",
                           "world_size": 1})  # fmt: skip
    assert status == 200, body
    assert any("--world-size 1: --strategy zero3 at one rank" in m for m in body["warnings"])


def _serve(request: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """One request as the server's worker answers it, in this process."""
    argv = Schema(estimate_parser()).argv(json.dumps(request).encode(), Policy())
    status, text = serve_worker.answer(argv)
    return status, json.loads(text)


def test_fsdp_mp_without_effect_names_the_dtype() -> None:
    """`--fsdp-mp fp32:fp32` said "the trainable parameters are fp32:fp32 already"."""
    said = _said(lambda: _run(workload(seq=16), iterations=1, strategy="fsdp2", world_size=2,
                              fsdp_mp="fp32:fp32"))  # fmt: skip
    assert any("the trainable parameters are fp32 already" in m for m in said), said


@pytest.mark.parametrize("value", [-5, 2.5])
def test_a_bad_reduce_bucket_size_names_the_flag(value: float) -> None:
    with pytest.raises(UserError, match=rf"--reduce-bucket-size {value}: expected a whole"):
        StepConfig(strategy="zero3", world_size=2, reduce_bucket_size=value).validate()
    done = cli("estimate", "--model", LLAMA, "--batch-size", "1", "--seq-len", "16",
               "--strategy", "zero2", "--world-size", "2", f"--reduce-bucket-size={value}",
               check=False)  # fmt: skip
    assert done.returncode == 2 and "--reduce-bucket-size" in done.stderr, done.stderr
    with pytest.raises(EstimateError, match=rf"reduce_bucket_size={value}"):
        memtrace.estimate(nn.Linear(4, 2), torch.randn(2, 4), strategy="zero1", world_size=2,
                          reduce_bucket_size=value)  # fmt: skip
    try:  # refused by the request's own parsing (2.5) or by the job's check (-5)
        status, body = _serve({"model": LLAMA, "batch_size": 1, "seq_len": 16,
                               "strategy": "zero3", "world_size": 2,
                               "reduce_bucket_size": value})  # fmt: skip
    except RequestError as e:
        status, body = e.status, {"field": e.field}
    assert status == 400 and body["field"] == "reduce_bucket_size", body


def test_a_reduce_bucket_size_that_is_not_a_number_exits_2() -> None:
    done = cli("estimate", "--model", LLAMA, "--strategy", "zero3", "--world-size", "2",
               "--reduce-bucket-size", "lots", check=False)  # fmt: skip
    assert done.returncode == 2 and "argument --reduce-bucket-size: invalid" in done.stderr


def test_reduce_bucket_size_as_deepspeed_writes_it() -> None:
    """DeepSpeed's configs (and these docs) write 5e8: it exited 2, "invalid int". 0 is valid
    there too (`ge=0`: every parameter is extra-large, no buffer): it was refused."""
    args = ["estimate", "--model", LLAMA, "--batch-size", "1", "--seq-len", "16", "--dtype",
            "bf16", "--strategy", "zero2", "--world-size", "2", "--json"]  # fmt: skip
    big = json.loads(cli(*args, "--reduce-bucket-size", "5e8").stdout)
    bucket = big["inputs"]["distributed"]["reduce_bucket"]
    assert bucket["elements"] == 500_000_000 and bucket["buffers"] == 1
    none = json.loads(cli(*args, "--reduce-bucket-size", "0").stdout)
    assert none["inputs"]["distributed"]["reduce_bucket"]["buffers"] == 0
    assert "no buffer is held" in none["inputs"]["distributed"]["equivalence"]
    found = [d["estimates"]["symbolic"]["allocated_mib"] for d in (big, none)]
    assert found[0] - found[1] == pytest.approx(953.7, abs=1.0)
    events, _ = _run(workload(dtype="bf16", seq=16), strategy="zero1", world_size=2,
                     reduce_bucket_size=0, iterations=1)  # fmt: skip
    assert not _lives(events, 0)
    status, body = _serve({"model": LLAMA, "batch_size": 1, "seq_len": 16, "strategy": "zero3",
                           "world_size": 2, "reduce_bucket_size": 5e8})  # fmt: skip
    assert status == 200, body
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        memtrace.estimate(nn.Linear(4, 2), torch.randn(2, 4), strategy="zero1", world_size=2,
                          reduce_bucket_size=5e8)  # fmt: skip


def test_reduce_bucket_size_without_zero_has_no_effect_and_says_so() -> None:
    for cfg, what in (({"strategy": "fsdp2", "world_size": 2}, "--strategy fsdp2"),
                      ({}, "an unsharded job")):  # fmt: skip
        said = _said(lambda c=cfg: StepConfig(reduce_bucket_size=1000, **c).validate())
        assert any(f"--reduce-bucket-size 1000 has no effect with {what}" in m for m in said)


def test_reduce_bucket_size_reaches_the_answer() -> None:
    """The CLI's flag (Hugging Face's "auto" config sets hidden_size^2), as the answer states
    it and as the trace holds it."""
    args = ["estimate", "--model", LLAMA, "--batch-size", "1", "--seq-len", "16", "--dtype",
            "bf16", "--strategy", "zero3", "--world-size", "2", "--json"]  # fmt: skip
    default = json.loads(cli(*args).stdout)
    small = json.loads(cli(*args, "--reduce-bucket-size", "4096").stdout)
    said = small["inputs"]["distributed"]["equivalence"]
    assert "reduce_bucket_size 4096 elements of bf16" in said
    found = [d["estimates"]["symbolic"]["allocated_mib"] for d in (default, small)]
    assert found[0] - found[1] == pytest.approx(953.7, abs=1.0)


def test_the_api_names_its_keyword_and_a_batch_line_takes_the_field(tmp_path: Any) -> None:
    """The API's warning said `--reduce-bucket-size`, and `symtrace --batch` refused the field."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        memtrace.estimate(nn.Sequential(nn.Linear(8, 8)), torch.randn(4, 8),
                          reduce_bucket_size=1000)  # fmt: skip
    said = [str(w.message) for w in seen if "has no effect" in str(w.message)]
    assert said and all("reduce_bucket_size=1000 has no effect" in m and "--reduce" not in m
                        for m in said)  # fmt: skip
    assert all("for strategy='zero1', 'zero2' and 'zero3'" in m for m in said), said
    lines = tmp_path / "b.jsonl"
    lines.write_text(json.dumps({"model": LLAMA, "batch_size": 1, "seq_len": 16, "strategy": "zero3",
                                 "world_size": 2, "reduce_bucket_size": 4096}) + "\n")  # fmt: skip
    cli("symtrace", "--batch", str(lines), "--out-dir", str(tmp_path / "out"))
    meta = json.loads((tmp_path / "out" / "config-00001.jsonl").open().readline())["metadata"]
    assert meta["strategy"] == "zero3"


def test_a_buffer_of_a_dtype_without_a_short_name_is_made_in_that_dtype() -> None:
    """An fp64 model's bucket said `torch.float64` and its buffer was made fp32 (the stated
    bytes were 8 per element, the traced 4): one dtype map names and makes both."""
    from memtrace_trainer.dtypes import dtype_of, name_of
    from memtrace_trainer.symtrace.deepspeed import reduce_buffers

    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        assert dtype_of(name_of(dtype)) == dtype
    made = reduce_buffers({"elements": 8, "dtype": name_of(torch.float64), "buffers": 1},
                          torch.device("meta"))  # fmt: skip
    assert [b.dtype for b in made] == [torch.float64]
    with pytest.raises(ValueError, match="not a dtype"):
        dtype_of("torch.nn")


def test_fp32_adapters_over_a_16_bit_base_say_which_deepspeed_mode_is_modelled() -> None:
    """LoRA with --dtype bf16 under ZeRO: the buffer is the fp32 adapters' dtype (DeepSpeed's
    fp32 mode), and the answer says its bf16 mode would halve it; a model of one dtype says
    nothing."""
    from memtrace_trainer.symtrace.deepspeed import bucket_said, reduce_bucket

    base, adapter = nn.Linear(8, 8).to(torch.bfloat16).requires_grad_(False), nn.Linear(8, 8)
    bucket = reduce_bucket("zero2", nn.Sequential(base, adapter), 1000)
    assert bucket is not None and bucket["dtype"] == "fp32"
    assert "in its bf16 mode" in bucket_said(bucket) and "half that" in bucket_said(bucket)
    plain = reduce_bucket("zero2", nn.Sequential(nn.Linear(8, 8)).to(torch.bfloat16), 1000)
    assert plain is not None and plain["dtype"] == "bf16" and "mode" not in plain
