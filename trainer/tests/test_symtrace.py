"""The symbolic tracer: event stream invariants, the FakeTensor-style baseline, emulation."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import weakref
from math import prod
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import SCHEMA, cli, read_trace
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from memtrace_trainer.binaries import find_binary
from memtrace_trainer.errors import UserError
from memtrace_trainer.models.zoo import build_workload
from memtrace_trainer.profile import load_profile
from memtrace_trainer.symtrace.recorder import decomposes_on_cuda
from memtrace_trainer.symtrace.step import StepConfig
from memtrace_trainer.symtrace.tracer import summarize, trace
from memtrace_trainer.workload import call_model

MLP = 'synthetic:{"family":"mlp","input_size":64,"output_size":10,"depth":3,"dropout":0.2,"batchnorm":true}'
CNN = 'synthetic:{"family":"cnn","input_channels":3,"num_classes":10,"depth":3,"architecture":"residual","base_filters":8,"input_size":16,"batchnorm":true}'
TRF = 'synthetic:{"family":"transformer","seq_len":16,"embed_dim":32,"layers":2,"heads":4,"vocab_size":100,"num_classes":5}'


def events_of(spec: str, **cfg: Any) -> list[dict[str, Any]]:
    rec, _ = trace(build_workload(spec, 4), StepConfig(**cfg), load_profile(None))
    return rec.events


def check_live_never_negative(events: list[dict[str, Any]]) -> None:
    live: dict[int, int] = {}
    total = 0
    for e in events:
        if e["kind"] == "alloc":
            assert e["addr"] not in live, "address reused while live"
            live[e["addr"]] = e["size"]
            total += e["size"]
        elif e["kind"] == "free":
            assert live.pop(e["addr"]) == e["size"]
            total -= e["size"]
        assert total >= 0


@pytest.mark.parametrize("spec", [MLP, CNN, TRF])
@pytest.mark.parametrize("emulation", [True, False])
def test_live_bytes_never_negative(spec: str, emulation: bool) -> None:
    check_live_never_negative(events_of(spec, cuda_emulation=emulation))


class StorageAccounting(TorchDispatchMode):
    """FakeTensor-style accounting, independent of the recorder: after every op, the bytes of
    all meta storages still alive, found through plain weak references."""

    def __init__(self) -> None:
        super().__init__()
        self.refs: dict[int, tuple[weakref.ref[Any], int]] = {}
        self.peak = 0

    def add(self, t: Any) -> None:
        if isinstance(t, torch.Tensor) and t.device.type == "meta":
            st = t.untyped_storage()
            if st.nbytes():
                self.refs.setdefault(st._cdata, (weakref.ref(st), st.nbytes()))

    def sample(self) -> None:
        self.refs = {k: v for k, v in self.refs.items() if v[0]() is not None}
        self.peak = max(self.peak, sum(n for _, n in self.refs.values()))

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        self.sample()
        for t in tree_flatten(out)[0]:
            self.add(t)
        self.sample()
        return out


def baseline_peak(spec: str, iterations: int = 2) -> int:
    w = build_workload(spec, 4)
    acc = StorageAccounting()
    for t in [*w.model.parameters(), *w.model.buffers()]:
        acc.add(t)
    opt = torch.optim.Adam(w.model.parameters(), lr=1e-3)
    with acc:
        for _ in range(iterations):
            inputs, target = w.make_batch()
            out = call_model(w.model, inputs)
            loss = w.loss(out, target)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    return acc.peak


@pytest.mark.parametrize("spec", [MLP, CNN, TRF])
def test_peak_equals_storage_accounting_without_emulation(spec: str) -> None:
    peak = summarize(events_of(spec, cuda_emulation=False)).peak_live_bytes
    assert peak == baseline_peak(spec)


def test_optimizer_state_appears_at_step_one() -> None:
    events = events_of(MLP, iterations=2)
    it1 = next(i for i, e in enumerate(events) if e.get("text") == "iter:1")
    state = [e for e in events if e.get("category") == "optimizer_state"]
    w = build_workload(MLP, 4)
    n_params = sum(1 for _ in w.model.parameters())
    assert len(state) == 2 * n_params  # exp_avg and exp_avg_sq, created in the first step only
    assert all(events.index(e) < it1 for e in state)


def test_markers_and_categories() -> None:
    events = events_of(MLP, iterations=2)
    texts = [e["text"] for e in events if e["kind"] == "marker"]
    phases = ["phase:data", "phase:forward", "phase:backward", "phase:optimizer"]
    assert texts == ["iter:0", *phases, "iter:1", *phases]
    cats = {e["category"] for e in events if e["kind"] == "alloc"}
    assert {"parameter", "gradient", "optimizer_state", "activation", "input", "workspace"} <= cats


@pytest.mark.parametrize("amp", [None, "bf16", "fp16"])
@pytest.mark.parametrize("checkpointing", [False, True])
@pytest.mark.parametrize("spec", [MLP, CNN, TRF])
def test_amp_and_checkpointing_variants_run(
    spec: str, amp: str | None, checkpointing: bool
) -> None:
    events = events_of(spec, amp=amp, checkpointing=checkpointing, grad_accum=2)
    check_live_never_negative(events)
    assert summarize(events).peak_live_bytes > 0


def test_checkpointing_lowers_activation_peak() -> None:
    spec = 'synthetic:{"family":"transformer","seq_len":64,"embed_dim":64,"layers":4,"heads":4,"vocab_size":100,"num_classes":5}'
    plain = summarize(events_of(spec, cuda_emulation=False)).peak_live_bytes
    ckpt = summarize(events_of(spec, cuda_emulation=False, checkpointing=True)).peak_live_bytes
    assert ckpt < plain


def test_amp_adds_half_weight_copies() -> None:
    fp32 = events_of(MLP, cuda_emulation=False)
    bf16 = events_of(MLP, cuda_emulation=False, amp="bf16")
    w = build_workload(MLP, 4)
    weight_sizes = {p.numel() * 2 for p in w.model.parameters() if p.dim() == 2}

    def fwd_sizes(ev):
        return [e["size"] for e in ev if e["kind"] == "alloc" and e["category"] == "activation"]

    assert weight_sizes <= set(fwd_sizes(bf16))
    act = lambda ev: summarize(ev).allocated_bytes_by_category["activation"]  # noqa: E731
    assert act(bf16) != act(fp32)


def test_emulation_cases() -> None:
    events = events_of(MLP)
    ws = [e["size"] for e in events if e["kind"] == "alloc" and e["category"] == "workspace"]
    # cuBLAS: one per handle, never freed: the main thread's and autograd's backward thread's.
    assert ws[0] == 8_519_680 and ws.count(8_519_680) == 2
    assert 1 << 20 in ws  # cuBLASLt per addmm with bias
    frees = {e["addr"] for e in events if e["kind"] == "free"}
    first = next(e for e in events if e["kind"] == "alloc" and e["category"] == "workspace")
    assert first["addr"] not in frees
    # fused dropout keeps a 1-byte mask: 4 samples x 64/2 ... features of the first hidden layer
    assert 4 * 32 in [e["size"] for e in events if e["kind"] == "alloc"]


def cnn_with(act: str) -> str:
    return (
        'synthetic:{"family":"cnn","input_channels":3,"num_classes":10,"depth":2,'
        f'"architecture":"uniform","base_filters":8,"input_size":16,"activation":"{act}"}}'
    )


def alloc_sizes(events: list[dict[str, Any]]) -> list[int]:
    return [e["size"] for e in events if e["kind"] == "alloc"]


@pytest.mark.parametrize(
    ("act", "emulation", "same_as_relu"),
    [
        # CUDA's fused mish_backward writes one grad_input, as threshold_backward does for ReLU.
        ("mish", True, True),
        # Meta decomposes mish_backward (CompositeImplicitAutograd) into full-size temporaries.
        ("mish", False, False),
        ("gelu", True, True),
        # silu_backward has a composite for other backends and its own CUDA kernel: it ran as
        # its parts (seven full-size temporaries) from the day composites were decomposed.
        ("swish", True, True),
    ],
)
def test_mish_backward_is_one_fused_kernel(act: str, emulation: bool, same_as_relu: bool) -> None:
    relu = alloc_sizes(events_of(cnn_with("relu"), cuda_emulation=emulation))
    other = alloc_sizes(events_of(cnn_with(act), cuda_emulation=emulation))
    assert (other == relu) is same_as_relu


def test_an_op_decomposes_where_the_dispatcher_gives_cuda_its_composite() -> None:
    # PyTorch's own computed dispatch table says which kernel a CUDA tensor gets: its
    # CompositeImplicitAutograd ("math") kernel, or one registered for CUDA.
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    names = [
        n for n in torch._C._dispatch_get_all_op_names() if has(n, "CompositeImplicitAutograd")
    ]
    assert len(names) > 500
    table = {}
    for name in names:
        lines = torch._C._dispatch_dump_table(name).splitlines()
        table[name] = next(line for line in lines if line.startswith("CUDA:")).endswith(
            "[math kernel]"
        )
    assert {n: decomposes_on_cuda(n) for n in names} == table
    assert not table["aten::silu_backward"] and table["aten::linear"]


def test_mish_swap_is_undone_after_the_trace() -> None:
    before = torch.nn.functional.mish
    events_of(cnn_with("mish"))
    assert torch.nn.functional.mish is before


def test_sdpa_backend_by_profile() -> None:
    w = build_workload(TRF, 4)
    _, extra = trace(w, StepConfig(amp="bf16"), load_profile(None))
    assert extra["sdpa_backends"] == {"flash": 4}
    sm75 = dataclasses.replace(load_profile(None), name="t4", compute_capability=(7, 5))
    _, extra = trace(build_workload(TRF, 4), StepConfig(amp="fp16"), sm75)
    assert extra["sdpa_backends"] == {"efficient": 4}
    # bf16 takes the memory-efficient kernel only from sm80 (sdp_utils.cpp): math on a T4.
    _, extra = trace(build_workload(TRF, 4), StepConfig(amp="bf16"), sm75)
    assert extra["sdpa_backends"] == {"math": 4}


def test_deterministic_event_sequence() -> None:
    def shape(ev: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
        return [
            (e["kind"], e.get("size"), e.get("category"), e.get("text"), e.get("addr")) for e in ev
        ]

    assert shape(events_of(CNN)) == shape(events_of(CNN))


def test_cli_writes_schema_valid_jsonl(tmp_path: Path) -> None:
    import jsonschema

    out = tmp_path / "t.jsonl"
    res = json.loads(
        cli("symtrace", "--model", MLP, "--batch-size", "4", "--out", str(out), "--json").stdout
    )
    lines = read_trace(out)
    assert lines[0]["kind"] == "header" and lines[0]["synthetic_addresses"] is True
    assert lines[-1] == {"kind": "process_exit", "lost_events": 0}
    assert res["allocs"] == sum(1 for x in lines if x["kind"] == "alloc")
    if not SCHEMA.is_file():
        pytest.fail(f"trace schema {SCHEMA} is missing: cannot validate the JSON Lines output")
    validator = jsonschema.Draft202012Validator(json.loads(SCHEMA.read_text()))
    for line in lines:
        validator.validate(line)


def test_cli_entry_and_batch_mode(tmp_path: Path) -> None:
    out = tmp_path / "e.jsonl"
    cli("symtrace", "--entry", "entry_example:make", "--batch-size", "8", "--out", str(out))
    assert read_trace(out)[0]["metadata"]["batch_size"] == "8"
    configs = tmp_path / "c.jsonl"
    configs.write_text(
        json.dumps({"model": MLP, "batch_size": 2, "name": "a"})
        + "\n"
        + json.dumps({"model": "nope:x", "batch_size": 2, "name": "b"})
        + "\n"
    )
    done = cli("symtrace", "--batch", str(configs), "--out-dir", str(tmp_path / "d"), check=False)
    assert done.returncode == 1 and "1 of 2 configs failed (b)" in done.stderr
    results = [json.loads(x) for x in done.stdout.splitlines()]
    assert results[0]["name"] == "a" and (tmp_path / "d" / "a.jsonl").is_file()
    assert "unknown model spec" in results[1]["error"]


def test_cli_errors_are_clean(tmp_path: Path) -> None:
    def check(args: list[str], msg: str) -> None:
        done = cli("symtrace", *args, check=False)
        assert done.returncode == 2 and msg in done.stderr and "Traceback" not in done.stderr

    base = ["--model", MLP, "--batch-size", "2"]
    check([*base, "--out", str(tmp_path / "x.txt")], "expected a .jsonl or .mtrace")
    check([*base, "--out", str(tmp_path / "t.jsonl"), "--optimizer", "lion"], "--optimizer 'lion'")
    check(
        [*base, "--out", str(tmp_path / "t.jsonl"), "--profile", "nope"], 'profile "nope" not found'
    )
    check(["--model", MLP, "--out", str(tmp_path / "t.jsonl")], "--batch-size is required")
    # --out-dir without --batch was told "--out FILE is required" as if it were not given.
    check(
        [*base, "--out-dir", str(tmp_path / "d")],
        f"--out-dir {tmp_path / 'd'}: --out-dir is "
        "for --batch CONFIGS.jsonl (a trace per config); one job's trace goes to --out FILE",
    )
    assert not (tmp_path / "d").exists()
    assert not (tmp_path / "t.jsonl").exists()


def test_mtrace_output_through_memsim(tmp_path: Path) -> None:
    # The same search the command does ($MEMTRACE_BIN_DIR, PATH, target/release, target/debug);
    # a missing binary fails here with the build hint.
    try:
        find_binary("memsim", debug_fallback=True)
    except UserError as e:
        pytest.fail(str(e))
    out = tmp_path / "t.mtrace"
    done = cli("symtrace", "--model", MLP, "--batch-size", "2", "--out", str(out), check=False)
    assert done.returncode == 0, done.stderr
    assert out.stat().st_size > 0


def test_resnet50_smoke(tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    res = json.loads(
        cli(
            "symtrace",
            "--model",
            "torchvision:resnet50",
            "--batch-size",
            "8",
            "--profile",
            "a100-40gb",
            "--out",
            str(out),
            "--json",
        ).stdout
    )
    assert res["allocated_bytes_by_category"]["parameter"] == 25_557_032 * 4
    check_live_never_negative(read_trace(out)[1:-1])


def test_header_says_which_cuda_libraries_the_step_loads(tmp_path: Path) -> None:
    # memsim colocate adds the profile's cuBLAS/cuDNN memory per process from these flags.
    def meta(spec: str, *extra: str) -> dict[str, str]:
        out = tmp_path / "m.jsonl"
        cli("symtrace", "--model", spec, "--batch-size", "2", *extra, "--out", str(out))
        return read_trace(out)[0]["metadata"]

    mlp, cnn = meta(MLP), meta(CNN)
    assert (mlp["uses_gemm"], mlp["uses_conv"]) == ("true", "false")
    assert (cnn["uses_gemm"], cnn["uses_conv"]) == ("true", "true")
    # The libraries are the job's, not the tracing mode's: the plain meta path says the same, so
    # memsim and memest count the same memory outside the allocator for it.
    plain = meta(CNN, "--no-cuda-emulation")
    assert plain["cuda_emulation"] == "false"
    assert (plain["uses_gemm"], plain["uses_conv"]) == ("true", "true")


def test_header_names_the_input_size_as_the_features_do(tmp_path: Path) -> None:
    # memest warns when features of one size are read beside a trace of another: both name it.
    def meta(spec: str) -> dict[str, str]:
        out = tmp_path / "m.jsonl"
        cli("symtrace", "--model", spec, "--batch-size", "2", "--out", str(out))
        return read_trace(out)[0]["metadata"]

    trf, cnn = meta(TRF), meta(CNN)
    assert trf["seq_len"] == "16" and "input_shape" not in trf
    assert cnn["input_shape"] == "3,16,16" and "seq_len" not in cnn


def test_every_cudnn_workspace_is_named_by_its_call() -> None:
    events = events_of(CNN, iterations=1)
    factor = load_profile(None).cudnn_workspace_factor
    calls = []
    for i, e in enumerate(events):
        if e["kind"] == "marker" and e["text"].startswith("cudnn:"):
            head, *fields = e["text"].split()
            kv = dict(f.split("=", 1) for f in fields)
            nxt, after = events[i + 1], events[i + 2]
            assert nxt["kind"] == "alloc" and nxt["category"] == "workspace"
            assert after["kind"] == "free" and after["addr"] == nxt["addr"]
            x = [int(d) for d in kv["x"].split("x")]
            y = [int(d) for d in kv["y"].split("x")]
            assert nxt["size"] == int(kv["workspace"]) == int(factor * 4 * max(prod(x), prod(y)))
            calls.append((head.removeprefix("cudnn:"), x[1]))
    directions = [d for d, _ in calls]
    convs = directions.count("fwd")
    assert convs >= 3 and directions.count("wgrad") == convs
    # The input image does not require grad: the first convolution has no dgrad.
    assert directions.count("dgrad") == convs - sum(1 for d, c in calls if d == "fwd" and c == 3)


def test_inference_mode_runs_composites_as_their_parts() -> None:
    from memtrace_trainer.symtrace.emulation import Workspaces
    from memtrace_trainer.symtrace.recorder import Recorder

    sizes = {}
    for ctx in (torch.no_grad, torch.inference_mode):
        ws = Workspaces(load_profile(None))
        rec = Recorder([ws])
        lin = torch.nn.Linear(64, 64, device="meta")
        with rec, ctx():
            lin(torch.randn(8, 64, device="meta"))
        assert ws.cublas_handles, ctx.__name__
        sizes[ctx.__name__] = [e["size"] for e in rec.events if e["kind"] == "alloc"]
    # The same requests either way: inference_mode skips autograd, not the GEMM's workspace.
    assert sizes["no_grad"] == sizes["inference_mode"]


def test_backward_zero_fills_are_in_place_as_on_a_gpu() -> None:
    from memtrace_trainer.symtrace.recorder import Recorder

    rec = Recorder([])
    x = torch.randn(32, 1000, device="meta", requires_grad=True)
    idx = torch.randint(0, 1000, (32, 1), device="meta")
    with rec:
        x.gather(1, idx).sum().backward()
    big = [e for e in rec.events if e["kind"] == "alloc" and e["size"] == 32 * 1000 * 4]
    # gather's backward: new_zeros(...).scatter_add_(...) on CUDA, one block (x.grad), not two.
    assert len(big) == 1
    assert x.grad is not None and rec.address(x.grad) == big[0]["addr"]


def test_batch_on_a_cluster_answers_like_the_local_backend(tmp_path: Path) -> None:
    mlp = 'synthetic:{"family":"mlp","input_size":32,"output_size":4,"depth":2}'
    configs = tmp_path / "configs.jsonl"
    lines = [{"name": "a", "model": mlp, "batch_size": 4}, {"name": "b", "model": "nope:x", "batch_size": 4},
             {"name": "c", "model": mlp, "batch_size": 2}]  # fmt: skip
    configs.write_text("".join(json.dumps(c) + "\n" for c in lines))
    out = {}
    for backend in (["--backend", "local"], ["--backend", "slurm", "--submitit-cluster", "debug",
                                             "--array-parallelism", "2"]):  # fmt: skip
        d = tmp_path / backend[1]
        done = cli("symtrace", "--batch", str(configs), "--out-dir", str(d), *backend, check=False)
        assert done.returncode == 1, done.stderr  # b failed, a and c did not
        results = [json.loads(line) for line in done.stdout.splitlines()]
        assert [r["name"] for r in results] == ["a", "b", "c"]
        assert "error" in results[1] and "nope:x" in results[1]["error"]
        out[backend[1]] = [r.get("peak_live_bytes") for r in results]
    assert out["local"] == out["slurm"]
    done = cli("symtrace", "--batch", str(configs), "--out-dir", str(tmp_path / "x"), "--backend",
               "slurm", check=False)  # fmt: skip
    assert done.returncode == 2 and "no sbatch on PATH" in done.stderr
    done = cli("symtrace", "--model", mlp, "--batch-size", "2", "--out", str(tmp_path / "y.jsonl"),
               "--backend", "slurm", check=False)  # fmt: skip
    assert done.returncode == 2 and "give --batch FILE" in done.stderr


@pytest.mark.parametrize("name", ["t.jsonl", "t.mtrace"])
def test_out_is_written_atomically_and_readable_by_all(tmp_path: Path, name: str) -> None:
    # One writer for the Python side (memtrace_trainer.atomic), 0644 as the Rust side's files
    # are: mkstemp's 0600 must not leak into a trace a team reads, and no temporary is left.
    out = tmp_path / name
    cli("symtrace", "--model", MLP, "--batch-size", "2", "--out", str(out))
    assert out.stat().st_mode & 0o777 == 0o644
    assert [p.name for p in tmp_path.iterdir()] == [name]
    # A refused name leaves nothing behind.
    bad = cli("symtrace", "--model", MLP, "--batch-size", "2", "--out", str(tmp_path / "t.txt"),
              check=False)  # fmt: skip
    assert bad.returncode == 2 and "expected a .jsonl or .mtrace" in bad.stderr
    assert [p.name for p in tmp_path.iterdir()] == [name]


def test_an_output_through_a_link_lands_on_its_target(tmp_path: Path) -> None:
    """Moved over a symbolic link, the output replaced the link and left its target as it was;
    a shell's `>`, and the Rust side's writer, write the target (relative and dangling alike)."""
    from memtrace_trainer.atomic import write_text

    (tmp_path / "keep").mkdir()
    (tmp_path / "keep" / "real.json").write_text("old")
    (tmp_path / "rel.json").symlink_to("keep/real.json")
    (tmp_path / "dangling.json").symlink_to(tmp_path / "keep" / "new.json")
    for link, target in [("rel.json", "real.json"), ("dangling.json", "new.json")]:
        write_text(tmp_path / link, "new")
        assert (tmp_path / link).is_symlink(), link
        assert (tmp_path / "keep" / target).read_text() == "new", target
    assert sorted(p.name for p in (tmp_path / "keep").iterdir()) == ["new.json", "real.json"]


@pytest.mark.parametrize("name", ["t.jsonl", "t.mtrace"])
def test_an_output_that_cannot_be_written_is_said_of_the_output(tmp_path: Path, name: str) -> None:
    # A directory in the way and a file size limit were "internal error: IsADirectoryError ...
    # '.t.jsonl.d0c2lh_l'" and "internal error: OSError: [Errno 27]", naming a temporary file
    # or nothing.
    (tmp_path / name).mkdir()
    done = cli("symtrace", "--model", MLP, "--batch-size", "2", "--out", str(tmp_path / name),
               check=False)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert f"cannot write {tmp_path / name}: Is a directory" in done.stderr
    assert "internal error" not in done.stderr
    assert [p.name for p in tmp_path.iterdir()] == [name]
    limited = tmp_path / "limited"
    limited.mkdir()
    out = limited / name
    # A file size limit with SIGXFSZ ignored, as a batch system's quota would make it.
    code = (
        "import resource, signal, sys; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
        "resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096)); "
        "from memtrace_trainer.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, "symtrace", "--model", MLP, "--batch-size", "2", "--out",
         str(out)],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(Path(__file__).parent)},
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert f"cannot write {out}: File too large" in done.stderr, done.stderr
    assert "internal error" not in done.stderr
    assert list(limited.iterdir()) == []
