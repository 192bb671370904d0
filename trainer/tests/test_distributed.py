"""Sharded training, traced as one rank under a fake process group (docs/distributed.md):
FSDP2 and its equivalents, DDP, ZeRO-1, FSDP2's mixed precision, the baselines beside them,
a user's own sharded step, and the fit questions."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import cli
from test_finetune import LLAMA, workload

from memtrace_trainer.errors import UserError
from memtrace_trainer.profile import load_profile
from memtrace_trainer.symtrace.step import StepConfig
from memtrace_trainer.symtrace.tracer import summarize, trace


def _chunk_rows(rows: int, world: int) -> int:
    """Rows of rank 0's chunk: torch.chunk's ceil(rows / world)."""
    return -(-rows // world)


@pytest.mark.parametrize("world", [1, 3, 4])
def test_fsdp2_rank_holds_its_shard_of_parameters_gradients_and_state(world: int) -> None:
    w = workload(dtype="bf16")
    expect = sum(
        _chunk_rows(p.shape[0], world) * (p.numel() // p.shape[0]) * p.element_size()
        for p in w.model.parameters()
    )
    rec, extra = trace(w, StepConfig("adamw", 2, strategy="fsdp2", world_size=world),
                       load_profile(None))  # fmt: skip
    cats = summarize(rec.events).allocated_bytes_by_category
    d = extra["distributed"]
    assert d["local_parameter_bytes"] == expect  # padding included: rank 0 has ceil(rows / N)
    first = next(i for i, e in enumerate(rec.events) if e.get("text") == "iter:0")
    before = [e for e in rec.events[:first] if e["kind"] == "alloc"]
    assert sum(e["size"] for e in before if e["category"] == "parameter") == expect
    # Each unit's all-gathers (its unsharded parameters, once per pass) are parameters too.
    full = sum(p.numel() * p.element_size() for p in workload(dtype="bf16").model.parameters())
    assert cats["parameter"] >= expect + 2 * full
    assert cats["optimizer_state"] == 2 * expect  # bf16 moments of the local shard
    assert cats["gradient"] == 2 * expect  # one sharded gradient per step, two steps
    # FSDP2's all-gather and reduce-scatter run on their own streams, which the trace carries.
    streams = {e.get("stream", 0) for e in rec.events if e["kind"] == "alloc"}
    assert len(streams) >= 2


def test_fsdp2_all_gathers_one_unit_at_a_time_within_the_full_model() -> None:
    """With more ranks the peak falls, but never below the largest unit's full parameters:
    FSDP2 all-gathers each block's parameters before its forward."""
    peaks = {}
    for world in (1, 2, 8):
        rec, _ = trace(workload(dtype="bf16", seq=16),
                       StepConfig("adamw", 2, strategy="fsdp2", world_size=world),
                       load_profile(None))  # fmt: skip
        peaks[world] = summarize(rec.events).peak_live_bytes
    assert peaks[8] < peaks[2] < peaks[1]


@pytest.mark.parametrize(
    ("cfg", "expect"),
    [
        ({"world_size": 4}, "--world-size needs --strategy"),
        ({"strategy": "nope", "world_size": 2}, "expected one of"),
        ({"strategy": "fsdp2", "world_size": 0}, "expected a positive number of ranks"),
        ({"strategy": "fsdp2"}, "--world-size is required with --strategy"),
    ],
)
def test_bad_distributed_settings(cfg: dict[str, Any], expect: str) -> None:
    with pytest.raises(UserError, match=expect):
        StepConfig(**cfg).validate()


def test_estimate_reports_the_rank() -> None:
    done = cli("estimate", "--model", LLAMA, "--batch-size", "2", "--seq-len", "32", "--dtype",
               "bf16", "--strategy", "fsdp2", "--world-size", "4", "--json")  # fmt: skip
    out = json.loads(done.stdout)
    assert out["inputs"]["strategy"] == "fsdp2" and out["inputs"]["world_size"] == 4
    # NCCL's buffers are a profile term outside the allocator, flagged while unmeasured.
    assert out["outside_allocator"]["nccl_mib"] == pytest.approx(64.0 + 2 * 32.0)
    assert any("nccl_per_peer_mib is marked unmeasured" in w for w in out["warnings"])


def test_ddp_holds_a_bucket_copy_of_every_gradient() -> None:
    """DDP's defaults (gradient_as_bucket_view=False): flat buckets as large as the parameters,
    alive for the model's life, beside the separate `.grad` tensors."""
    w = workload(dtype="bf16")
    params = w.details["parameter_bytes"]
    plain = summarize(trace(workload(dtype="bf16"), StepConfig("adamw", 2),
                            load_profile(None))[0].events)  # fmt: skip
    rec, extra = trace(w, StepConfig("adamw", 2, strategy="ddp", world_size=4), load_profile(None))
    ddp = summarize(rec.events)
    assert extra["distributed"]["runs_as"] == "ddp"
    # What stays: the buckets, covering every parameter (plus alignment).
    buckets = ddp.end_live_bytes - plain.end_live_bytes
    assert params <= buckets < params * 1.01
    # What passes: construction broadcasts the module states as one coalesced flat buffer.
    other = ddp.allocated_bytes_by_category["other"] - plain.allocated_bytes_by_category["other"]
    assert abs(other - buckets - params) <= 1024  # (alignment of the flat buffers)
    assert (
        ddp.allocated_bytes_by_category["gradient"] == plain.allocated_bytes_by_category["gradient"]
    )


@pytest.mark.parametrize(
    ("strategy", "runs_as"),
    [("fsdp1", "fsdp2"), ("fsdp1-grad-op", "fsdp2"), ("zero2", "fsdp2"), ("zero3", "fsdp2"),
     ("fsdp1-no-shard", "ddp"), ("zero1", "ZeroRedundancyOptimizer")],
)  # fmt: skip
def test_emulated_strategies_say_what_runs(strategy: str, runs_as: str) -> None:
    _, extra = trace(workload(dtype="bf16", seq=16),
                     StepConfig("adamw", 1, strategy=strategy, world_size=2),
                     load_profile(None))  # fmt: skip
    d = extra["distributed"]
    assert d["runs_as"] == runs_as and d["equivalence"]


def test_keeping_parameters_gathered_costs_memory() -> None:
    """SHARD_GRAD_OP (no reshard after forward) holds every unit's parameters through the
    forward: a higher peak than FULL_SHARD at the same world size."""
    peaks = {}
    for strategy in ("fsdp1", "fsdp1-grad-op"):
        rec, _ = trace(workload(dtype="bf16", seq=16),
                       StepConfig("adamw", 2, strategy=strategy, world_size=8),
                       load_profile(None))  # fmt: skip
        peaks[strategy] = summarize(rec.events).peak_live_bytes
    assert peaks["fsdp1-grad-op"] > peaks["fsdp1"]


def test_min_world_size_fits_by_estimate_and_the_next_smaller_does_not() -> None:
    # A 1B model: its 9 GiB of bf16 weights, gradients and AdamW state dominate, so sharding it
    # beats the NCCL buffers a second rank adds.
    args = ["--model", "hf:meta-llama/Llama-3.2-1B", "--batch-size", "1", "--seq-len", "32",
            "--dtype", "bf16", "--optimizer", "adamw", "--strategy", "fsdp2", "--profile",
            "a100-40gb"]  # fmt: skip
    # A capacity between the 1-rank and the 4-rank need, from estimates at those sizes.
    need = {}
    for world in (1, 4):
        out = json.loads(cli("estimate", *args, "--world-size", str(world), "--point",
                             "--json").stdout)  # fmt: skip
        need[world] = out["verdict"]["need_mib"]
    assert need[4] < need[1]
    cap = f"{(need[1] + need[4]) / 2:.0f}MiB"
    done = cli("min-world-size", *args, "--capacity", cap, "--point", "--world-sizes", "1,2,4",
               "--json", check=False)  # fmt: skip
    out = json.loads(done.stdout)
    best = out["min_world_size"]
    assert best in (2, 4) and done.returncode == 0
    fits = {p["world_size"]: p["fits"] for p in out["probes"]}
    assert fits[best] and not fits[1]


def test_min_world_size_refuses_bad_sizes() -> None:
    for sizes, expect in (("4,2", "ascending"), ("a", "integers"), ("0,1", "positive"),
                          ("1,2,100000", "at most 65536 ranks")):  # fmt: skip
        done = cli("min-world-size", "--model", LLAMA, "--batch-size", "1", "--strategy", "fsdp2",
                   "--profile", "a100-40gb", "--world-sizes", sizes, check=False)  # fmt: skip
        assert done.returncode == 2 and expect in done.stderr, done.stderr


def test_a_users_ddp_loop_runs_in_the_fake_world(tmp_path: Path) -> None:
    """The loop as written for torchrun (init_process_group("nccl"), LOCAL_RANK, DDP with
    device_ids) runs as rank 0 of --world-size ranks; DDP's bucket is in the trace."""
    out = tmp_path / "ddp.jsonl"
    done = cli("symtrace", "--step", "step_examples:ddp_step", "--world-size", "4", "--out",
               str(out), "--json")  # fmt: skip
    assert "answered by the tracer's fake process group: rank 0 of 4" in done.stderr
    header = json.loads(out.read_text().splitlines()[0])
    assert header["metadata"]["world_size"] == "4"
    params = 256 * 1024 + 1024 + 1024 * 10 + 10
    sizes = [json.loads(line)["size"] for line in out.read_text().splitlines()[1:]
             if json.loads(line)["kind"] == "alloc"]  # fmt: skip
    assert any(params * 4 <= s < params * 4 * 1.01 for s in sizes)  # the flat fp32 bucket


def test_a_step_that_runs_no_collective_is_charged_no_nccl(tmp_path: Path) -> None:
    """NCCL builds its communicators at the first collective: a single-GPU loop given
    --world-size runs none, so its header names no world size (memsim and memest charge no
    NCCL), and the flag is said to have had no effect."""
    plain, ranked = tmp_path / "plain.jsonl", tmp_path / "ranked.jsonl"
    cli("symtrace", "--step", "step_examples:default_adamw", "--out", str(plain))
    done = cli("symtrace", "--step", "step_examples:default_adamw", "--world-size", "4", "--out",
               str(ranked))  # fmt: skip
    assert "--world-size 4: --step step_examples:default_adamw ran no collective" in done.stderr
    assert "no NCCL memory is charged" in done.stderr
    header = json.loads(ranked.read_text().splitlines()[0])
    assert "world_size" not in header["metadata"] and "rank" not in header["metadata"]
    assert ranked.read_text().splitlines()[1:] == plain.read_text().splitlines()[1:]


def test_the_root_stays_gathered_from_forward_to_backward_as_fsdp2_keeps_it() -> None:
    """FSDP2's default for the root (`reshard_after_forward=None`) keeps its parameters (the
    embeddings, the final norm) gathered for backward, as FSDP1 does; the tracer resharded
    them and gathered them again at the start of backward, when activations peak. DeepSpeed's
    ZeRO-3 does release them."""
    gathers = {}
    for strategy in ("fsdp2", "zero3"):
        rec, _ = trace(workload(), StepConfig("adamw", 2, strategy=strategy, world_size=2),
                       load_profile(None))  # fmt: skip
        sizes = [e["size"] for e in rec.events
                 if e["kind"] == "alloc" and e["category"] == "parameter"]  # fmt: skip
        gathers[strategy] = sizes.count(max(sizes))  # the root's unit is the largest
    assert gathers == {"fsdp2": 2, "zero3": 4}, gathers  # per step: once, twice


def test_zero1_shards_optimizer_state_by_whole_parameters() -> None:
    """ZeroRedundancyOptimizer (over the model itself, no DDP): rank 0 keeps the AdamW state of
    its partition only (whole parameters, balanced greedily), gradients full until DeepSpeed's
    stage-1 reduction keeps the partition's (tests/test_deepspeed.py)."""
    from torch.distributed.optim import ZeroRedundancyOptimizer  # noqa: F401 (PyTorch's own)

    w = workload()
    params = w.details["parameter_bytes"]
    rec, extra = trace(w, StepConfig("adamw", 2, strategy="zero1", world_size=4),
                       load_profile(None))  # fmt: skip
    cats = summarize(rec.events).allocated_bytes_by_category
    assert extra["distributed"]["runs_as"] == "ZeroRedundancyOptimizer"
    assert 0 < cats["optimizer_state"] < 2 * params * 0.4  # about 1/4 of 2 x params
    # Full gradients, one per step, then the partition's copies (grads_in_partition, fp32).
    assert 2 * params < cats["gradient"] < 4 * params


def test_zero1_in_bf16_holds_deepspeeds_fp32_master_and_state(tmp_path: Path) -> None:
    """DeepSpeed's bf16 mode keeps fp32 master weights and fp32 AdamW moments of its partition
    (4 + 8 bytes per parameter); ZeroRedundancyOptimizer keeps bf16 moments (4). The rest, 8
    bytes per parameter of rank 0's partition, is one buffer held from the optimizer's
    construction. It was a warning only, beside a verdict of FITS below the job's need."""
    rec, extra = trace(workload(dtype="bf16"), StepConfig("adamw", 2, strategy="zero1",
                       world_size=4), load_profile(None))  # fmt: skip
    state = [e["size"] for e in rec.events if e["kind"] == "alloc"
             and e["category"] == "optimizer_state"]  # fmt: skip
    # The buffer comes first, before any step; at 4 ranks rank 0's partition is not the
    # largest, and the state the largest holds beyond it comes next (tests/test_deepspeed.py).
    assert "the need is rank 2's" in extra["distributed"]["ranks"]
    buffer, moments = state[0], sum(state[2:])
    assert moments * 1.9 < buffer <= moments * 2, (buffer, moments)  # 8 bytes against 4
    assert "DeepSpeed's bf16 mode" in extra["distributed"]["equivalence"]
    done = cli("estimate", "--model", LLAMA, "--batch-size", "2", "--seq-len", "64", "--dtype",
               "bf16", "--strategy", "zero1", "--world-size", "4", "--json")  # fmt: skip
    answer = json.loads(done.stdout)
    assert not any("DeepSpeed" in w for w in answer["warnings"]), answer["warnings"]
    assert (
        "8 bytes per parameter of rank 0's partition"
        in (answer["inputs"]["distributed"]["equivalence"])
    )


@pytest.mark.parametrize("strategy", ["zero2", "zero3"])
def test_zero_in_bf16_keeps_deepspeeds_fp32_master_and_state(strategy: str) -> None:
    """DeepSpeed's bf16 mode: fp32 master weights and Adam moments beside the bf16 parameters
    and gradients, 16 bytes per parameter partitioned. Run as bf16 parameters, the state was
    4 bytes (a third of DeepSpeed's 12); now fp32 shards under FSDP2's bf16 policy, which
    hold the same bytes (4 + 4 + 8) and gather and compute in bf16."""
    world = 4
    shard16 = sum(
        _chunk_rows(p.shape[0], world) * (p.numel() // p.shape[0]) * 2
        for p in workload(dtype="bf16").model.parameters()
    )
    rec, extra = trace(workload(dtype="bf16"), StepConfig("adamw", 2, strategy=strategy,
                       world_size=world), load_profile(None))  # fmt: skip
    cats = summarize(rec.events).allocated_bytes_by_category
    d = extra["distributed"]
    assert d["mp_policy"] == {"param_dtype": "torch.bfloat16", "reduce_dtype": "torch.bfloat16"}
    assert "DeepSpeed's bf16 mode" in d["equivalence"]
    # The header keeps the job's own regime (its margin and baselines), not the fp32 shards'.
    assert extra["regime"] == {"amp": "bf16", "param_dtype": "bf16"}
    assert d["local_parameter_bytes"] == 2 * shard16  # the fp32 master shards
    assert cats["optimizer_state"] == 4 * shard16  # fp32 exp_avg and exp_avg_sq
    assert cats["gradient"] == 2 * 2 * shard16  # one fp32 sharded gradient per step
    sides = [e for e in rec.events if e["kind"] == "alloc" and e["category"] == "parameter"]
    assert any(e["size"] < 2 * shard16 for e in sides)  # bf16 all-gathers of each unit


# --- FSDP2's mixed precision -------------------------------------------------------------------


def _side_streams(w: Any, fsdp_mp: str | None) -> list[int]:
    """Bytes allocated on each side stream (FSDP2's all-gather and reduce-scatter), in the
    order the streams were first used (stream ids differ from trace to trace)."""
    rec, _ = trace(w, StepConfig("adamw", 1, strategy="fsdp2", world_size=2, fsdp_mp=fsdp_mp),
                   load_profile(None))  # fmt: skip
    totals: dict[int, int] = {}
    for e in rec.events:
        if e["kind"] == "alloc" and e.get("stream", 0):
            totals[e["stream"]] = totals.get(e["stream"], 0) + e["size"]
    return list(totals.values())


def test_fsdp_mp_gathers_in_the_param_dtype_and_reduces_in_the_reduce_dtype() -> None:
    """Over fp32 parameters, bf16 halves what FSDP2 all-gathers, and its copy-in casts each
    rank's shard to bf16 first on the same stream (half of 1/N of the fp32 bytes, N = 2); the
    reduce-scatter's output stays fp32 with reduce dtype fp32; with bf16 it is half as large
    and is then cast to the fp32 sharded gradient on that stream."""
    plain = _side_streams(workload(), None)
    mixed = _side_streams(workload(), "bf16:fp32")
    low = _side_streams(workload(), "bf16")
    assert len(plain) == len(mixed) == len(low) == 2, (plain, mixed, low)
    gather, reduce = 0, 1  # all-gathers come first, in the forward
    cast = plain[gather] // 2 // 2
    assert mixed[gather] == plain[gather] // 2 + cast and low[gather] == mixed[gather]
    assert mixed[reduce] == plain[reduce]
    assert low[reduce] == plain[reduce] // 2 + plain[reduce]


def test_fsdp_mp_computes_in_the_param_dtype() -> None:
    """bf16 gathered parameters make bf16 activations: SDPA takes its flash kernel, which it
    refuses in fp32."""
    for fsdp_mp, backend in ((None, "efficient"), ("bf16:fp32", "flash")):
        _, extra = trace(workload(),
                         StepConfig("adamw", 1, strategy="fsdp2", world_size=2, fsdp_mp=fsdp_mp),
                         load_profile(None))  # fmt: skip
        assert set(extra["sdpa_backends"]) == {backend}, (fsdp_mp, extra["sdpa_backends"])


@pytest.mark.parametrize(
    ("cfg", "expect"),
    [
        ({"strategy": "ddp", "world_size": 2, "fsdp_mp": "bf16"}, "--strategy ddp has no FSDP2"),
        ({"strategy": "zero1", "world_size": 2, "fsdp_mp": "bf16"}, "--strategy zero1 has no"),
        # It dropped DeepSpeed's fp32 master weights and state (30% less), in silence.
        ({"strategy": "zero3", "world_size": 2, "fsdp_mp": "fp16"}, "is --dtype bf16 or fp16"),
        ({"strategy": "zero2", "world_size": 2, "fsdp_mp": "bf16:fp32"}, "DeepSpeed's ZeRO"),
        ({"fsdp_mp": "bf16"}, "an unsharded job has no FSDP2"),
        ({"strategy": "fsdp2", "world_size": 2, "fsdp_mp": "bf16:int8"}, "expected PARAM"),
        ({"strategy": "fsdp2", "world_size": 2, "fsdp_mp": "bf16:fp32:x"}, "expected PARAM"),
        (
            {"strategy": "fsdp2", "world_size": 2, "fsdp_mp": "fp16", "amp": "bf16"},
            "--fsdp-mp fp16 with --amp bf16 is contradictory",
        ),
        # Before, these failed inside PyTorch: an internal error, or a class name for the flag.
        (
            {"optimizer": "adafactor", "strategy": "fsdp2", "world_size": 2},
            "--optimizer adafactor with --strategy fsdp2",
        ),
        (
            {"optimizer": "adafactor", "strategy": "zero3", "world_size": 2},
            "--optimizer adafactor with --strategy zero3",
        ),
        (
            {"optimizer": "adamw-8bit", "strategy": "zero1", "world_size": 2},
            r"--optimizer adamw-8bit with --strategy zero1: .* bitsandbytes' \(emulated\)",
        ),
    ],
)
def test_bad_fsdp_mp(cfg: dict[str, Any], expect: str) -> None:
    with pytest.raises(UserError, match=expect):
        StepConfig(**cfg).validate()


def test_fsdp_mp_with_no_effect_is_warned_about(tmp_path: Path) -> None:
    done = cli("symtrace", "--model", LLAMA, "--batch-size", "1", "--seq-len", "8", "--dtype",
               "bf16", "--strategy", "fsdp2", "--world-size", "2", "--fsdp-mp", "bf16", "--out",
               str(tmp_path / "t.jsonl"))  # fmt: skip
    assert "--fsdp-mp bf16: the trainable parameters are bf16 already" in done.stderr
    assert "give fp32 parameters" in done.stderr
    # fp32 over fp32: the advice is a 16-bit PARAM, not the fp32 the parameters already are.
    done = cli("symtrace", "--model", LLAMA, "--batch-size", "1", "--seq-len", "8", "--strategy",
               "fsdp2", "--world-size", "2", "--fsdp-mp", "fp32", "--out",
               str(tmp_path / "f.jsonl"))  # fmt: skip
    assert "are fp32 already" in done.stderr and "give a 16-bit PARAM" in done.stderr
    done = cli("symtrace", "--step", "step_examples:ddp_step", "--world-size", "2", "--fsdp-mp",
               "bf16", "--out", str(tmp_path / "s.jsonl"))  # fmt: skip
    assert "--fsdp-mp has no effect with --step" in done.stderr


# --- FSDPMemTracker beside the estimate ----------------------------------------------------------


def test_fsdp_memtracker_agrees_with_the_trace_on_live_bytes() -> None:
    """PyTorch's FSDPMemTracker and memtrace's recorder count the same live tensors of the
    same FSDP2 steps (the plain trace, no CUDA-only allocations): the peaks agree within 2%."""
    from memtrace_trainer.baselines import fsdp_memtracker

    for world in (1, 4):
        seen: dict[str, int] = {}

        def run(world: int = world, seen: dict[str, int] = seen) -> None:
            cfg = StepConfig("adamw", 2, cuda_emulation=False, strategy="fsdp2", world_size=world)
            rec, _ = trace(workload(dtype="bf16"), cfg, load_profile(None))
            seen["peak"] = summarize(rec.events).peak_live_bytes

        answer = fsdp_memtracker(run)
        tracked = answer["device_mib"] * 2**20
        assert abs(tracked - seen["peak"]) / seen["peak"] < 0.02, (world, tracked, seen)
        kinds = answer["by_kind_mib"]
        assert kinds["sharded_param"] > 0 and kinds["opt"] > 0, kinds


def test_estimate_runs_fsdp_memtracker_for_fsdp_jobs_only() -> None:
    base = ("estimate", "--model", LLAMA, "--batch-size", "1", "--seq-len", "16", "--dtype",
            "bf16", "--optimizer", "adamw", "--json")  # fmt: skip
    out = json.loads(cli(*base, "--strategy", "fsdp2", "--world-size", "2", "--memtracker").stdout)
    fsdp, plain = out["estimates"]["fsdp_memtracker"], out["estimates"]["memtracker"]
    assert fsdp["role"] == "baseline" and "FSDPMemTracker" in fsdp["ignores"]
    assert fsdp["device_mib"] == pytest.approx(plain["device_mib"], rel=0.02)
    out = json.loads(cli(*base, "--strategy", "fsdp2", "--world-size", "2").stdout)
    assert "give --memtracker" in out["unavailable"]["fsdp_memtracker"]
    out = json.loads(cli(*base, "--strategy", "ddp", "--world-size", "2").stdout)
    assert "fsdp_memtracker" not in out["estimates"]
    assert "fsdp_memtracker" not in out.get("unavailable", {})


# --- a user's own sharded step, and the meta device proper --------------------------------------


def test_a_users_fsdp2_step_with_meta_init_holds_only_its_shards(tmp_path: Path) -> None:
    """Built on the meta device, sharded over a "cuda" mesh, materialised with to_empty: the
    trace holds rank 0's shards once, never the full model, and the 64 MiB scratch tensor of
    the meta device is not allocated."""
    out = tmp_path / "fsdp.jsonl"
    cli("symtrace", "--step", "step_examples:fsdp2_meta_init_step", "--world-size", "4",
        "--steps", "2", "--out", str(out))  # fmt: skip
    events = [json.loads(line) for line in out.read_text().splitlines()[1:]]
    allocs = [e for e in events if e["kind"] == "alloc"]
    first = next(i for i, e in enumerate(events) if e.get("text") == "iter:0")
    params = [
        e["size"] for e in events[:first] if e["kind"] == "alloc" and e["category"] == "parameter"
    ]
    shard = 4 * (4 * (512 // 4) * 512 + 4 * (512 // 4))  # weights and biases, fp32, 1/4 of rows
    assert sum(params) == shard, (sum(params), shard)
    # In the steps, the all-gathered units are parameters (they were said to be activations).
    gathered = [
        e["size"] for e in events[first:] if e["kind"] == "alloc" and e["category"] == "parameter"
    ]
    assert sum(gathered) >= 2 * 4 * shard
    assert max(e["size"] for e in allocs) < 1 << 24  # no scratch tensor, no full model
    # The layers are the user's Linears, not fully_shard's FSDPLinear subclasses.
    assert json.loads(out.read_text().splitlines()[0])["metadata"]["layer_types"] == "Linear"


def test_the_meta_device_proper_holds_no_memory(tmp_path: Path) -> None:
    out = tmp_path / "meta.jsonl"
    cli("symtrace", "--step", "step_examples:meta_device_step", "--steps", "1", "--out", str(out))
    sizes = [json.loads(line)["size"] for line in out.read_text().splitlines()[1:]
             if json.loads(line)["kind"] == "alloc"]  # fmt: skip
    assert max(sizes) == 4 << 20, sizes  # the GPU's weight (and its double); not the probe


def test_torchtitans_step_runs_as_written(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """scripts/public/torchtitan_llama3.py (the public per-GPU check, docs/validation.md) on
    a two-layer Llama: meta init, FSDP2 with bf16 mixed precision, selective op checkpointing
    written by the user (recomputed under the tracer's modes), clip_grad_norm_."""
    import sys

    repo = Path(__file__).resolve().parents[2]
    monkeypatch.syspath_prepend(str(repo / "scripts" / "public"))
    monkeypatch.setenv("MEMTRACE_TT_CONFIG", str(Path(__file__).parent / "hf_configs" /
                                                 "tiny-llama.json"))  # fmt: skip
    monkeypatch.setenv("MEMTRACE_TT_SEQ", "64")
    out = tmp_path / "tt.jsonl"
    cli("symtrace", "--step", "torchtitan_llama3:step", "--world-size", "2", "--steps", "2",
        "--out", str(out))  # fmt: skip
    sys.modules.pop("torchtitan_llama3", None)
    header = json.loads(out.read_text().splitlines()[0])
    assert header["metadata"]["sdpa_backends"].startswith("flash:")
    assert header["metadata"]["world_size"] == "2"


def test_bitsandbytes_optimizers_under_fsdp2_are_warned_about(tmp_path: Path) -> None:
    done = cli("symtrace", "--model", LLAMA, "--batch-size", "1", "--seq-len", "8", "--steps", "1",
               "--optimizer", "adamw-8bit", "--strategy", "fsdp2", "--world-size", "2", "--out",
               str(tmp_path / "t.jsonl"))  # fmt: skip
    assert "bitsandbytes' optimizers are not known to run on FSDP2's sharded DTensor" in done.stderr


@pytest.mark.parametrize(("strategy", "storage"), [("fsdp2", "bf16"), ("fsdp1", "bf16"),
                                                   ("zero3", "bf16"), ("ddp", None)])  # fmt: skip
def test_qlora_under_fsdp_stores_its_4bit_weights_as_fsdp_qlora_does(
    strategy: str, storage: str | None
) -> None:
    """FSDP shards 4-bit weights only with bnb_4bit_quant_storage=bf16; QLoRA under FSDP was
    accepted in silence with uint8 storage. DDP replicates and keeps bitsandbytes' uint8."""
    import torch

    from memtrace_trainer.models.finetune import Lora
    from memtrace_trainer.models.qlora import Linear4bit

    w = workload(dtype="bf16", qlora=True, lora=Lora(8))
    _, extra = trace(w, StepConfig("adamw", 1, strategy=strategy, world_size=2),
                     load_profile(None))  # fmt: skip
    d = extra["distributed"]
    assert d.get("quant_storage") == storage
    packed = {m.weight.dtype for m in w.model.modules() if isinstance(m, Linear4bit)}
    assert packed == {torch.bfloat16 if storage else torch.uint8}
    assert ("bnb_4bit_quant_storage=bf16" in (d["equivalence"] or "")) == bool(storage)
    if strategy == "fsdp2":
        # The estimate's answer says it too, as docs/distributed.md promises.
        done = cli("estimate", "--model", LLAMA, "--batch-size", "1", "--seq-len", "16", "--dtype",
                   "bf16", "--qlora", "--strategy", strategy, "--world-size", "2", "--json")  # fmt: skip
        assert json.loads(done.stdout)["inputs"]["distributed"]["quant_storage"] == "bf16"


@pytest.mark.parametrize("strategy", ["ddp", "fsdp1-no-shard"])
def test_min_world_size_of_a_replicating_strategy_probes_the_smallest_size_only(
    strategy: str,
) -> None:
    """More DDP ranks never lower a rank's need; every size of --world-sizes was probed, in
    silence, and the answer said "1 ranks"."""
    args = ["min-world-size", "--model", LLAMA, "--batch-size", "1", "--seq-len", "16",
            "--strategy", strategy, "--world-sizes", "1,2,4"]  # fmt: skip
    done = cli(*args, "--capacity", "1MiB", check=False)
    assert done.returncode == 1
    assert f"--strategy {strategy} replicates the parameters" in done.stderr
    assert "every rank holds the whole model" in done.stdout and "at 1 rank," in done.stdout
    assert "1 ranks" not in done.stdout + done.stderr
    out = json.loads(cli(*args, "--capacity", "1MiB", "--json", check=False).stdout)
    assert [p["world_size"] for p in out["probes"]] == [1]
    done = cli(*args, "--capacity", "40GiB")
    assert "fits on 1 GPU of" in done.stdout
    # zero1 shards the optimizer state, so its search goes on.
    out = json.loads(cli(*args[:-3], "zero1", "--world-sizes", "1,2", "--capacity", "1MiB",
                         "--json", check=False).stdout)  # fmt: skip
    assert [p["world_size"] for p in out["probes"]] == [1, 2]


def test_min_world_size_names_its_own_probe_of_one_rank_not_a_flag_never_given() -> None:
    """The search's 1-rank probe warned "--world-size 1: ...", a flag the user never gave (and
    that min-world-size refuses); it is said as the search's probe, once."""
    args = ["min-world-size", "--entry", "entry_example:fixed_batch", "--strategy", "fsdp2",
            "--world-sizes", "1,2", "--capacity", "1MiB"]  # fmt: skip
    done = cli(*args, "--json", check=False)
    warnings = json.loads(done.stdout)["warnings"]
    assert not any("--world-size" in w for w in warnings), warnings
    said = [w for w in warnings if w.startswith("min-world-size, probing 1 rank: --strategy fsdp2 "
                                                "at one rank shards and reduces nothing")]  # fmt: skip
    assert len(said) == 1 and "without --strategy" in said[0], warnings
    done = cli(*args, check=False)
    assert "--world-size" not in done.stderr, done.stderr
    assert done.stderr.count("min-world-size, probing 1 rank:") == 1, done.stderr


@pytest.mark.parametrize(
    ("flags", "said"),
    [(["--strategy", "fsdp2", "--world-size", "4"], " (fsdp2 over 4 ranks; the batch and the need "
      "are per GPU): largest batch that fits on 2048.0 MiB per GPU"),
     ([], ": largest batch that fits on 2048.0 MiB (")],
)  # fmt: skip
def test_max_batch_of_a_sharded_job_says_the_strategy_and_per_gpu(
    flags: list[str], said: str
) -> None:
    """The sharded answer read as a whole job's: no strategy, no world size, no "per GPU"."""
    done = cli("max-batch", "--model", LLAMA, "--seq-len", "16", "--capacity", "2GiB",
               "--limit", "2", *flags)  # fmt: skip
    assert f"{LLAMA}{said}" in done.stdout, done.stdout


@pytest.mark.parametrize("qlora", [False, True], ids=["lora", "qlora"])
def test_zero2_keeps_a_frozen_base_whole_and_shards_the_adapters(qlora: bool) -> None:
    """DeepSpeed's ZeRO-1 and -2 partition the optimizer's parameters only: a LoRA or QLoRA
    base stays whole on every rank. Emulated by FSDP2 over every parameter, each rank held the
    gathered base and a 1/N shard of it beside (Llama-3-8B, 2 ranks: 7.8 GiB more than one
    GPU). ZeRO-3 partitions every parameter, the base included."""
    from memtrace_trainer.models.finetune import Lora

    world = 4

    def built() -> Any:
        return workload(dtype="bf16", qlora=qlora, lora=Lora(8))

    model = built().model
    frozen = sum(p.numel() * p.element_size() for p in model.parameters() if not p.requires_grad)
    trainable = [p for p in model.parameters() if p.requires_grad]
    shards = sum(_chunk_rows(p.shape[0], world) * (p.numel() // p.shape[0]) * p.element_size()
                 for p in trainable)  # fmt: skip
    for strategy, local in (("zero2", frozen + shards), ("zero3", None)):
        # No reduce buffer (DeepSpeed's, of 5e8 elements by default): the parameters alone.
        step = StepConfig("adamw", 2, strategy=strategy, world_size=world, reduce_bucket_size=0)
        rec, extra = trace(built(), step, load_profile(None))
        d = extra["distributed"]
        if local is None:  # ZeRO-3: the base is sharded too
            assert d["local_parameter_bytes"] < frozen, d
            assert "frozen parameters are not sharded" not in d["equivalence"]
            continue
        assert d["local_parameter_bytes"] == local, d
        assert "the frozen parameters are not sharded" in d["equivalence"], d["equivalence"]
        # The base is allocated once before the step, not gathered beside its shard.
        one = summarize(trace(built(), StepConfig("adamw", 2), load_profile(None))[0].events)
        two = summarize(rec.events)
        assert two.peak_live_bytes < one.peak_live_bytes + frozen // world, (
            two.peak_live_bytes,
            one.peak_live_bytes,
        )
