"""Step functions (`--step MOD:FN`): the user's own loop traced as written (symtrace/userstep.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import step_examples
from conftest import cli, read_trace

SCRIPTS = Path(__file__).parent / "scripts"
# A hand-written update of a script's loop body (`m`'s parameters, plain SGD).
UPDATE = (
    "    with torch.no_grad():\n        for p in m.parameters():\n"
    "            p -= 0.1 * p.grad\n            p.grad = None\n"
)
TRAIN = str(SCRIPTS / "train_mlp.py")


def symtrace(tmp_path: Path, fn: str, *extra: str, check: bool = True) -> Any:
    out = tmp_path / f"{fn}.jsonl"
    done = cli("symtrace", "--step", f"step_examples:{fn}", "--out", str(out), "--json", *extra,
               check=check)  # fmt: skip
    if done.returncode != 0:
        return done, None
    return json.loads(done.stdout), read_trace(out)


def markers(events: list[dict[str, Any]]) -> list[str]:
    return [e["text"] for e in events if e["kind"] == "marker"]


def test_steps_default_to_three_and_split_the_peaks(tmp_path: Path) -> None:
    summary, events = symtrace(tmp_path, "custom_optimizer")
    assert [m for m in markers(events) if m.startswith("iter:")] == ["iter:0", "iter:1", "iter:2"]
    assert summary["steps"] == 3
    assert summary["peak_live_bytes"] == max(
        summary["first_step_peak_live_bytes"], summary["steady_peak_live_bytes"]
    )
    header = events[0]["metadata"]
    assert header["model"] == "step:step_examples:custom_optimizer"
    assert header["iterations"] == "3" and header["amp"] == "fp32"
    # The hand-written optimizer is not a torch.optim.Optimizer: no optimizer phase, and its
    # moments (zeros_like in FN) are setup memory, allocated before iter:0.
    assert "phase:optimizer" not in markers(events)
    assert header["optimizer"] == "none"
    # Parameters are labelled as such, whoever built them.
    cats = {e["category"] for e in events if e["kind"] == "alloc"}
    assert {"parameter", "activation"} <= cats


def test_default_optimizer_choice_is_pytorchs_own_for_cuda(tmp_path: Path) -> None:
    step_examples.SEEN.clear()
    _, events = symtrace(tmp_path, "default_adamw", "--steps", "2")
    assert step_examples.SEEN["foreach"] == (False, True)  # (fused, foreach) as on CUDA
    header = events[0]["metadata"]
    assert header["optimizer"] == "adamw"
    assert "phase:optimizer" in markers(events) and "phase:backward" in markers(events)
    cats = {e["category"] for e in events if e["kind"] == "alloc"}
    assert {"gradient", "optimizer_state"} <= cats


def test_family_is_of_the_layers_that_ran(tmp_path: Path) -> None:
    """The tracer lists the module types whose forward ran; memest derives the family from them
    (one rule, in Rust), so a built but unused Conv2d leaves an MLP an MLP."""
    _, events = symtrace(tmp_path, "unused_conv", "--steps", "1")
    header = events[0]["metadata"]
    assert header["layer_types"] == "Linear,ReLU", header
    assert "family" not in header  # the family is derived, never written by Python
    done = cli("estimate", "--step", "step_examples:unused_conv", "--steps", "1", "--profile",
               "a100-40gb", "--json")  # fmt: skip
    r = json.loads(done.stdout)
    assert r["family"] == "MLP", r["family"]
    assert r["margin"]["regime"].startswith("mlp "), r["margin"]


def test_precision_regime_is_the_parameters_without_autocast(tmp_path: Path) -> None:
    """A step with bf16 parameters and no autocast is in the bf16 regime (its safety margin's),
    as the same job traced by the tracer's own loop is; fp32 parameters stay fp32."""
    _, events = symtrace(tmp_path, "bf16_params", "--steps", "1")
    header = events[0]["metadata"]
    assert (header["amp"], header["param_dtype"]) == ("bf16", "bf16"), header
    _, events = symtrace(tmp_path, "default_adamw", "--steps", "1")
    header = events[0]["metadata"]
    assert (header["amp"], header["param_dtype"]) == ("fp32", "fp32"), header


def test_a_matrix_vector_product_loads_cublas(tmp_path: Path) -> None:
    """gemv takes the thread's cuBLAS handle, and so its workspace, as a GEMM does."""
    _, events = symtrace(tmp_path, "matrix_vector", "--steps", "1")
    assert events[0]["metadata"]["uses_gemm"] == "true", events[0]["metadata"]
    workspaces = [e["size"] for e in events if e.get("category") == "workspace"]
    assert workspaces, "no cuBLAS workspace"
    # No module ran: the tracer lists no layer types, and the family is unknown (not an MLP's).
    assert events[0]["metadata"]["layer_types"] == ""
    r = json.loads(cli("estimate", "--step", "step_examples:matrix_vector", "--steps", "1",
                       "--json").stdout)  # fmt: skip
    assert r["family"] == "unknown" and r["margin"]["regime"].startswith("unknown-family")


def forward_peak(events: list[dict[str, Any]], step: int) -> int:
    """Max live bytes from `iter:<step>` to that step's first backward."""
    live = peak = 0
    inside = False
    for e in events:
        if e["kind"] == "alloc":
            live += e["size"]
        elif e["kind"] == "free":
            live -= e["size"]
        elif e["kind"] == "marker":
            if e["text"] == f"iter:{step}":
                inside, peak = True, live
            elif inside and e["text"] == "phase:backward":
                return peak
        if inside:
            peak = max(peak, live)
    raise AssertionError(f"no backward in step {step}")


def test_the_programs_attention_kernel_choice_is_pytorchs(tmp_path: Path) -> None:
    """`sdpa_kernel(SDPBackend.MATH)` in the user's step was ignored: flash was recorded, and the
    score matrices the math kernel allocates were missing from the estimate."""
    _, flash_events = symtrace(tmp_path, "attention_default", "--steps", "1")
    _, math_events = symtrace(tmp_path, "attention_math", "--steps", "1")
    assert flash_events[0]["metadata"]["sdpa_backends"] == "flash:1", flash_events[0]
    assert math_events[0]["metadata"]["sdpa_backends"] == "math:1", math_events[0]
    scores = 2 * 8 * 1024 * 1024 * 2  # one (2, 8, 1024, 1024) bf16 score matrix
    assert forward_peak(math_events, 0) - forward_peak(flash_events, 0) >= scores


def test_zero_grad_after_forward_keeps_stale_gradients_alive(tmp_path: Path) -> None:
    _, after = symtrace(tmp_path, "zero_grad_after_forward")
    _, before = symtrace(tmp_path, "zero_grad_before_forward")
    grads = (1024 * 1024 + 1024 + 10 * 1024 + 10) * 4
    # The first step has no stale gradients; from the second on they live through the forward
    # (whose activations, 4096 x 1024 floats, outweigh them: the whole difference shows).
    assert forward_peak(after, 0) == forward_peak(before, 0)
    assert forward_peak(after, 1) - forward_peak(before, 1) == grads


def test_forward_only_and_inference_mode(tmp_path: Path) -> None:
    for fn in ("forward_only", "inference"):
        summary, events = symtrace(tmp_path, fn)
        assert "phase:backward" not in markers(events)
        params = (256 * 256 + 256 + 256 * 10 + 10) * 4
        cats = summary["allocated_bytes_by_category"]
        assert "gradient" not in cats and "optimizer_state" not in cats, fn
        # Without autograd's saved tensors each activation dies at the next layer: the peak is
        # parameters, the cuBLAS workspaces and at most two 64 x 256 activations at once.
        workspaces = 8519680 + (1 << 20)
        assert summary["peak_live_bytes"] <= params + workspaces + 2 * 64 * 256 * 4 + 64 * 10 * 4
        assert summary["first_step_peak_live_bytes"] == summary["steady_peak_live_bytes"]


def test_accumulation_and_chunked_cross_entropy_run(tmp_path: Path) -> None:
    _, events = symtrace(tmp_path, "grad_accumulation")
    assert markers(events).count("phase:backward") == 4 * 3
    _, chunked = symtrace(tmp_path, "chunked_cross_entropy")
    # The loss as written: logits made one 64-token chunk (4 x 64 x 5000 fp32) at a time, four
    # chunks per step, never the whole sequence's at once.
    sizes = [e["size"] for e in chunked if e["kind"] == "alloc" and e["category"] == "activation"]
    assert sizes.count(4 * 64 * 5000 * 4) >= 4 * 3
    assert 4 * 256 * 5000 * 4 not in sizes


def test_cuda_literals_mean_the_tracers_device(tmp_path: Path) -> None:
    step_examples.SEEN.clear()
    summary, events = symtrace(tmp_path, "cuda_literals")
    assert summary["allocs"] > 0
    assert step_examples.SEEN["allocated"] > 0
    assert step_examples.SEEN["max_allocated"] >= step_examples.SEEN["allocated"]
    assert step_examples.SEEN["name"] == "NVIDIA A100-SXM4-40GB"
    assert sum(1 for e in events if e["kind"] == "control" and e["op"] == "empty_cache") == 3


def test_autocast_in_user_code_applies_to_einsum(tmp_path: Path) -> None:
    _, fp32 = symtrace(tmp_path, "einsum_fp32")
    _, bf16 = symtrace(tmp_path, "einsum_bf16")
    assert bf16[0]["metadata"]["amp"] == "bf16" and fp32[0]["metadata"]["amp"] == "fp32"

    def hidden(events: list[dict[str, Any]], itemsize: int) -> int:
        # The einsum's 256 x 512 hidden activation, once per step.
        size = 256 * 512 * itemsize
        return sum(1 for e in events if e["kind"] == "alloc" and e["size"] == size
                   and e["category"] == "activation")  # fmt: skip

    assert hidden(bf16, 2) >= 3 and hidden(fp32, 2) == 0
    assert hidden(fp32, 4) >= 3


def test_fused_optimizers_run_as_on_cuda(tmp_path: Path) -> None:
    """`fused=True` failed the whole estimate: AdamW in the FakeTensor baseline (fused kernels
    refuse meta parameters there), SGD in the trace itself (`_fused_sgd_` has no meta kernel).
    The fused update holds no temporaries: less than foreach's."""
    need = {}
    for fn in ("fused_adamw", "foreach_adamw", "fused_sgd"):
        r = json.loads(cli("estimate", "--step", f"step_examples:{fn}", "--json").stdout)
        need[fn] = r["estimates"]["symbolic"]["allocated_mib"]
        if fn != "foreach_adamw":
            why = r["unavailable"]["fake_tensor"]
            assert why.startswith("the job fails on the plain meta device"), why
            assert "\n" not in why
    assert need["fused_adamw"] < need["foreach_adamw"], need
    assert need["fused_sgd"] < need["fused_adamw"], need  # no second moment


def test_a_step_of_the_batch_size_takes_batch_size(tmp_path: Path) -> None:
    """`FN(device, batch_size)`, the step `max-batch --step` searches, could not be traced at a
    batch: `estimate --step FN --batch-size N` said the flag had no effect and then failed.
    `max-batch --step --world-size` dropped the world size (the torchrun-style step failed)."""

    def need(*flags: str) -> dict[str, Any]:
        done = cli("estimate", "--step", "step_examples:ddp_step", "--world-size", "2",
                   "--capacity", "2GiB", "--json", *flags, check=False)  # fmt: skip
        assert done.returncode in (0, 1), done.stderr  # 1: does not fit
        return json.loads(done.stdout)

    small, big = need("--batch-size", "8"), need("--batch-size", "4096")
    assert not any("--batch-size" in w for w in small["warnings"]), small["warnings"]
    assert small["inputs"]["batch_size"] == 8
    assert (small["estimates"]["symbolic"]["allocated_mib"]
            < big["estimates"]["symbolic"]["allocated_mib"])  # fmt: skip
    found = json.loads(cli("max-batch", "--step", "step_examples:ddp_step", "--world-size", "2",
                           "--capacity", "2GiB", "--json").stdout)  # fmt: skip
    assert found["max_batch"] > 0 and not found["hit_limit"], found
    at = need("--batch-size", str(found["max_batch"]))
    past = need("--batch-size", str(found["max_batch"] + 1))
    assert at["verdict"]["fits"] and not past["verdict"]["fits"]
    # Without --world-size, torchrun's rendezvous is missing: the error names the flag.
    done = cli("estimate", "--step", "step_examples:ddp_step", check=False)
    assert done.returncode == 2 and "give --world-size N" in done.stderr, done.stderr
    for bad in ("0", "-3"):  # a batch of none trained nothing, silently
        done = cli("estimate", "--step", "step_examples:sized", f"--batch-size={bad}", check=False)
        assert done.returncode == 2 and f"--batch-size {bad}: expected a positive" in done.stderr
    done = cli("estimate", "--step", "step_examples:sized", check=False)
    assert done.returncode == 2 and "give --batch-size N" in done.stderr, done.stderr
    plain = cli("estimate", "--step", "step_examples:default_adamw", "--batch-size", "8", "--json")
    assert "--batch-size has no effect with --step" in " ".join(
        json.loads(plain.stdout)["warnings"]
    )


def test_an_entry_of_a_fixed_batch_is_said_and_never_searched() -> None:
    done = cli("estimate", "--entry", "entry_example:fixed_batch", "--batch-size", "64", "--json")
    said = json.loads(done.stdout)["warnings"]
    assert any("--batch-size 64 has no effect" in w and "4 samples" in w for w in said), said
    for search, name in (("max-batch", "batch_size"), ("max-seq", "seq_len")):
        done = cli(search, "--entry", "entry_example:fixed_batch", check=False)
        assert done.returncode == 2, done.stdout
        assert f"takes no `{name}` parameter, so there is no {name} to search" in done.stderr


# An entry function without a `batch_size` parameter builds its own batch, yet `estimate` and
# `symtrace` refused it without a --batch-size it could not take (and then said the flag had no
# effect); `run` and `fake-tensor` still did. Its batch is now the job's, as a `--step` of the
# device alone takes none; an entry that takes `batch_size` is refused without one, saying so.
TAKES_BATCH = "--batch-size is required with --entry entry_example:make: the function takes"


@pytest.mark.parametrize(
    ("argv", "batch", "error"),
    [
        (["estimate", "--entry", "entry_example:fixed_batch", "--json"], 4, None),
        (["symtrace", "--entry", "entry_example:fixed_batch", "--json"], 4, None),
        (["fake-tensor", "--entry", "entry_example:fixed_batch", "--json"], 4, None),
        (["run", "--entry", "entry_example:fixed_batch", "--iterations", "1"], 4, None),
        (["estimate", "--entry", "entry_example:make", "--json"], None, TAKES_BATCH),
        (["symtrace", "--entry", "entry_example:make", "--json"], None, TAKES_BATCH),
        (["fake-tensor", "--entry", "entry_example:make", "--json"], None, TAKES_BATCH),
        (["run", "--entry", "entry_example:make", "--iterations", "1"], None, TAKES_BATCH),
    ],
)  # fmt: skip
def test_an_entry_of_its_own_batch_needs_no_batch_size(
    tmp_path: Path, argv: list[str], batch: int | None, error: str | None
) -> None:
    if argv[0] == "symtrace":
        argv = [*argv, "--out", str(tmp_path / "t.jsonl")]
    if argv[0] == "run":
        argv = [*argv, "--out", str(tmp_path / "r")]
    done = cli(*argv, check=False)
    if error is not None:
        assert done.returncode == 2 and error in done.stderr, done.stderr
        assert not (tmp_path / "r").exists() and not (tmp_path / "t.jsonl").exists()
        return
    assert done.returncode in (0, 1), done.stderr
    if argv[0] == "run":
        # The job's own batch: config.json says none was given, features.json counts the
        # entry's, and the run id claims no batch ("b1" before, whatever the real one).
        config = json.loads((tmp_path / "r" / "config.json").read_text())
        feats = json.loads((tmp_path / "r" / "features.json").read_text())
        assert config["batch_size"] is None and feats["batch_size"] == batch
        assert re.fullmatch(r"entry-example-fixed-batch-[0-9a-f]{12}", config["id"]), config
        return
    out = json.loads(done.stdout)
    assert out["warnings"] == [], out["warnings"]
    if argv[0] == "estimate":
        assert out["inputs"]["batch_size"] == batch
    elif argv[0] == "fake-tensor":
        assert out["peak_bytes"] > 0
    else:
        assert read_trace(tmp_path / "t.jsonl")[0]["metadata"]["batch_size"] == str(batch)


def test_the_searches_take_an_entry_of_its_own_batch() -> None:
    """`max-seq` traced such an entry at its --batch-size default of 1, which it could not take:
    a warning about a flag never given, and an answer "at batch 1" of a job of 3; `min-world-size`
    refused it without --batch-size (argparse's required flag, under the whole usage)."""
    done = cli("max-seq", "--entry", "entry_example:own_batch_seq", "--limit", "64", "--json")
    out = json.loads(done.stdout)
    assert out["batch_size"] == 3 and out["max_seq_len"] == 64, out
    assert not any("--batch-size" in w for w in out["warnings"]), out["warnings"]
    text = cli("max-seq", "--entry", "entry_example:own_batch_seq", "--limit", "64").stdout
    assert "longest sequence that fits at batch 3 " in text, text
    done = cli("min-world-size", "--entry", "entry_example:fixed_batch", "--strategy", "ddp",
               "--world-sizes", "2", "--json", check=False)  # fmt: skip
    assert done.returncode in (0, 1) and json.loads(done.stdout)["batch_size"] == 4, done.stderr
    done = cli("min-world-size", "--entry", "entry_example:make", "--strategy", "ddp",
               check=False)  # fmt: skip
    assert done.returncode == 2 and TAKES_BATCH in done.stderr and "usage:" not in done.stderr


def test_estimate_and_max_batch_take_a_step(tmp_path: Path) -> None:
    done = cli("estimate", "--step", "step_examples:default_adamw", "--json")
    r = json.loads(done.stdout)
    sym = r["estimates"]["symbolic"]
    assert sym["steps"]["count"] == 3 and sym["steps"]["steady_device_mib"] is not None
    assert r["estimates"]["analytic"] is None and "--features" in r["unavailable"]["analytic"]
    assert r["inputs"]["step"] == "step_examples:default_adamw"
    text = cli("estimate", "--step", "step_examples:default_adamw").stdout
    assert text.startswith("needs ") and "per step: first" in text
    mb = cli("max-batch", "--step", "step_examples:sized", "--profile", "a100-40gb",
             "--capacity", "3GiB", "--steps", "1", "--json")  # fmt: skip
    out = json.loads(mb.stdout)
    assert out["max_batch"] > 1 and out["model"] == "step:step_examples:sized"
    bad = cli("max-batch", "--step", "step_examples:default_adamw", "--profile", "a100-40gb",
              check=False)  # fmt: skip
    assert bad.returncode == 2 and "the device and the batch size" in bad.stderr


def test_bad_steps_fail_clearly(tmp_path: Path) -> None:
    done, _ = symtrace(tmp_path, "raises", check=False)
    assert done.returncode == 2
    assert "step() raised in step 1" in done.stderr and "step_examples.py" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "raises.jsonl").exists()
    done, _ = symtrace(tmp_path, "not_a_step", check=False)
    assert done.returncode == 2 and "zero-argument step()" in done.stderr
    done, _ = symtrace(tmp_path, "asks_reserved", check=False)
    assert done.returncode == 2 and "memory_reserved" in done.stderr
    assert "(at " in done.stderr and "step_examples.py:" in done.stderr  # the caller's line
    # sys.exit in the user's step is their code ending early, never the command's status (0
    # read as "fits").
    for step, says in [("exits", "step() raised in step 2 SystemExit: 0"),
                       ("exits_building", "building the step raised SystemExit: 3")]:  # fmt: skip
        done, _ = symtrace(tmp_path, step, check=False)
        assert done.returncode == 2 and says in done.stderr, done.stderr
        assert "step_examples.py:" in done.stderr
    summary, _ = symtrace(tmp_path, "allocates_nothing")
    assert any("nothing was allocated" in w for w in summary["warnings"])
    done = cli("symtrace", "--step", "step_examples:nope", "--out", str(tmp_path / "x.jsonl"),
               check=False)  # fmt: skip
    assert done.returncode == 2 and "has no function 'nope'" in done.stderr
    # A name that is there but no function is said as such, not as missing.
    done = cli("symtrace", "--step", "step_examples:NOT_CALLABLE", "--out",
               str(tmp_path / "x.jsonl"), check=False)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "step_examples.NOT_CALLABLE is not callable (it is an int)" in done.stderr
    done = cli("symtrace", "--step", "step_examples:custom_optimizer", "--amp", "bf16",
               "--out", str(tmp_path / "y.jsonl"), "--json")  # fmt: skip
    assert any("--amp has no effect with --step" in w for w in json.loads(done.stdout)["warnings"])
    # The default's own value given explicitly has no effect either (it was taken for unset).
    done = cli("symtrace", "--step", "step_examples:custom_optimizer", "--optimizer", "adam",
               "--grad-accum", "1", "--out", str(tmp_path / "y.jsonl"), "--json")  # fmt: skip
    said = json.loads(done.stdout)["warnings"]
    assert any("--optimizer has no effect with --step" in w for w in said), said
    assert any("--grad-accum has no effect with --step" in w for w in said), said


def test_torch_compile_is_traced_eagerly_and_said(tmp_path: Path) -> None:
    summary, events = symtrace(tmp_path, "compiled")
    assert "phase:backward" in markers(events)
    assert any(
        "torch.compile: compiled regions are traced eagerly" in w for w in summary["warnings"]
    )


def test_cublas_workspace_per_handle_and_streams(tmp_path: Path) -> None:
    _, events = symtrace(tmp_path, "default_adamw")
    cublas = 8519680  # the A100 profile's CUBLAS_WORKSPACE_CONFIG default
    held = [i for i, e in enumerate(events) if e["kind"] == "alloc" and e["size"] == cublas]
    # One for the main thread's handle (first forward GEMM), one for autograd's backward thread.
    assert len(held) == 2
    first_backward = next(i for i, e in enumerate(events) if e.get("text") == "phase:backward")
    assert held[0] < first_backward < held[1]
    freed = {e["addr"] for e in events if e["kind"] == "free"}
    assert not {events[i]["addr"] for i in held} & freed
    _, events = symtrace(tmp_path, "side_stream")
    side = [e for e in events if e["kind"] == "alloc" and e["stream"] != 0]
    assert len(side) == 3 and all(e["size"] == 64 * 256 * 4 for e in side)
    frees = {e["addr"]: e["stream"] for e in events if e["kind"] == "free"}
    assert all(frees.get(e["addr"], e["stream"]) == e["stream"] for e in side)
    recorded = [e for e in events if e["kind"] == "control" and e["op"] == "record_stream"]
    assert len(recorded) == 3 and recorded[0]["stream"] == 0


def test_unmodified_script_runs_as_written_and_stops_after_n_steps(tmp_path: Path) -> None:
    out = tmp_path / "s.jsonl"
    done = cli("symtrace", "--script", TRAIN, "--out", str(out), "--json",
               "--steps", "2", "--", "--width", "128")  # fmt: skip
    summary = json.loads(done.stdout)  # the script's own prints went to stderr
    events = read_trace(out)
    assert [m for m in markers(events) if m.startswith("iter:")] == ["iter:0", "iter:1"]
    assert markers(events).count("phase:optimizer") == 2
    assert events[0]["metadata"]["amp"] == "bf16" and events[0]["metadata"]["optimizer"] == "adamw"
    assert (
        summary["allocated_bytes_by_category"]["parameter"] == (64 * 128 + 128 + 128 * 10 + 10) * 4
    )
    r = json.loads(cli("estimate", "--script", TRAIN, "--json").stdout)
    assert r["estimates"]["symbolic"]["steps"]["count"] == 3
    assert r["inputs"]["script"] == TRAIN


def test_a_script_written_for_a_gpu_runs_as_on_one(tmp_path: Path) -> None:
    """The optimizer built before `.cuda()` held the replaced parameters (no optimizer state),
    tied weights came apart (counted twice), DataParallel refused the tracer's device, a pinned
    DataLoader with workers and `memory_stats()` failed, and `torch.save` overwrote the user's
    file with one of empty tensors."""
    out, ck = tmp_path / "s.jsonl", tmp_path / "ck.pt"
    ck.write_bytes(b"the user's real checkpoint")
    done = cli("symtrace", "--script", str(SCRIPTS / "as_on_a_gpu.py"), "--out", str(out),
               "--json", "--steps", "2", "--", str(ck))  # fmt: skip
    assert "same parameters: True" in done.stderr, done.stderr
    assert ck.read_bytes() == b"the user's real checkpoint"
    assert f"torch.save to {ck} skipped while tracing" in done.stderr
    cats = json.loads(done.stdout)["allocated_bytes_by_category"]
    params = (1000 * 256 + 256 * 256 + 256) * 4  # the tied weight once
    assert cats["parameter"] == params, cats
    assert cats["optimizer_state"] == 2 * params, cats  # AdamW's two moments, every parameter
    r = json.loads(cli("estimate", "--script", str(SCRIPTS / "as_on_a_gpu.py"), "--json",
                       "--steps", "2", "--", str(ck)).stdout)  # fmt: skip
    assert r["unavailable"]["fake_tensor"].startswith("not run for a script")


def test_a_script_that_exits_with_a_message_says_it(tmp_path: Path) -> None:
    script = tmp_path / "needs_gpus.py"
    script.write_text('import sys\nsys.exit("need 2 GPUs")\n')
    done = cli("symtrace", "--script", str(script), "--out", str(tmp_path / "t.jsonl"),
               check=False)  # fmt: skip
    assert done.returncode == 2 and "the script exited saying: need 2 GPUs" in done.stderr
    # sys.exit(0) after one step: said as such, not blamed on values read back.
    script.write_text(
        "import sys, torch\nm = torch.nn.Linear(8, 1).cuda()\nopt = torch.optim.SGD(m.parameters(), 0.1)\n"
        "m(torch.randn(4, 8, device='cuda')).sum().backward(); opt.step()\nsys.exit(0)\n"
    )
    done = cli("symtrace", "--script", str(script), "--out", str(tmp_path / "t.jsonl"))
    assert "called sys.exit after 1 of 3 iterations" in done.stderr and ".item()" not in done.stderr


def test_a_script_that_ran_fewer_iterations_says_how_many_it_ran(tmp_path: Path) -> None:
    """A script without a backward is one iteration: the answer said "iterations = 3 (traced
    iterations)" beside that warning, and the trace's header recorded 3."""
    script = tmp_path / "forward_only.py"
    script.write_text(
        "import torch\nm = torch.nn.Linear(64, 64).cuda()\n"
        "for _ in range(5):\n    y = m(torch.randn(8, 64, device='cuda'))\n"
    )
    done = cli("estimate", "--script", str(script))
    assert "the whole run is traced as one iteration" in done.stderr, done.stderr
    assert "iterations = 3" not in done.stderr, done.stderr
    r = json.loads(cli("estimate", "--script", str(script), "--json").stdout)
    assert (r["inputs"]["iterations"], r["inputs"]["iterations_asked"]) == (1, 3), r["inputs"]
    assert "iterations" not in r["inputs"]["defaults"], r["inputs"]
    out = tmp_path / "t.jsonl"
    done = cli("symtrace", "--script", str(script), "--out", str(out))
    assert "iterations = 3" not in done.stderr, done.stderr
    assert json.loads(out.read_text().splitlines()[0])["metadata"]["iterations"] == "1"
    r = json.loads(cli("symtrace", "--script", str(script), "--out", str(out), "--json").stdout)
    assert (r["iterations"], r["iterations_asked"]) == (1, 3), r
    assert "iterations" not in r["defaults"], r


def test_a_script_that_stops_on_its_loss_is_told_why(tmp_path: Path) -> None:
    """Early stopping reads the loss back (`.item()`, 0 while tracing): the loop stopped after
    one step, and the warning said only that it ended."""
    script = tmp_path / "early.py"
    script.write_text(
        "import torch\nm = torch.nn.Linear(8, 1).cuda()\nopt = torch.optim.SGD(m.parameters(), 0.1)\n"
        "for _ in range(100):\n    loss = m(torch.randn(4, 8, device='cuda')).square().mean()\n"
        "    loss.backward(); opt.step(); opt.zero_grad()\n"
        "    if loss.item() < 1e-3:\n        break\n"
    )
    done = cli("symtrace", "--script", str(script), "--out", str(tmp_path / "t.jsonl"))
    assert "ended after 1 of 3 iterations" in done.stderr and "`.item()`" in done.stderr


def test_a_script_with_a_hand_written_update_stops_after_n_steps(tmp_path: Path) -> None:
    """No `torch.optim` optimizer: the loop ran all its iterations (`--steps` had no effect),
    and a bare `except:` around it swallowed the stop in silence."""
    loop = (
        "import torch\nm = torch.nn.Linear(8, 8).cuda()\n"
        "for i in range(1000):\n"
        "    m(torch.randn(4, 8, device='cuda')).square().sum().backward()\n"
        "    with torch.no_grad():\n"
        "        for p in m.parameters():\n"
        "            p -= 0.1 * p.grad\n"
        "            p.grad = None\n"
        "    print('ran', i)\n"
    )
    script = tmp_path / "sgd.py"
    script.write_text(loop)
    out = tmp_path / "sgd.jsonl"
    done = cli("symtrace", "--script", str(script), "--steps", "2", "--out", str(out), "--json")
    texts = markers(read_trace(out))
    assert [t for t in texts if t.startswith("iter:")] == ["iter:0", "iter:1"], texts
    assert "ran 1" in done.stderr and "ran 2" not in done.stderr
    assert json.loads(done.stdout)["warnings"] == []
    caught = tmp_path / "caught.py"
    indented = "".join("    " + line + "\n" for line in loop.splitlines())
    caught.write_text(f"try:\n{indented}except:\n    pass\nprint('after the loop')\n")
    done = cli("symtrace", "--script", str(caught), "--steps", "2", "--out", str(out))
    assert "after the loop" in done.stderr
    assert "the script caught the stop after 2 iterations" in done.stderr, done.stderr


@pytest.mark.parametrize(
    "body, backwards",
    [
        # Four micro-batches per update: one iteration, not four.
        ("    for k in range(4):\n        m(x()).square().sum().backward()\n" + UPDATE, 4),
        # A reentrant checkpoint's recompute runs a backward and module calls inside the
        # backward: not an iteration boundary.
        (
            "    checkpoint(m, x().requires_grad_(), use_reentrant=True).square().sum().backward()\n"
            + UPDATE,
            2,
        ),
        # An update through `.data` leaves the parameters' versions: its reset gradients tell.
        (
            "    m(x()).square().sum().backward()\n    for p in m.parameters():\n"
            "        p.data.add_(p.grad.data, alpha=-0.1)\n        p.grad = None\n",
            1,
        ),
    ],
)
def test_a_hand_written_loops_iterations_are_its_updates(
    tmp_path: Path, body: str, backwards: int
) -> None:
    script, out = tmp_path / "loop.py", tmp_path / "loop.jsonl"
    script.write_text(
        "import sys, torch\nfrom torch.utils.checkpoint import checkpoint\n"
        "m = torch.nn.Linear(8, 8).cuda()\nx = lambda: torch.randn(4, 8, device='cuda')\n"
        "for i in range(int(sys.argv[1])):\n" + body + "    print('ran', i)\n"
    )
    done = cli("symtrace", "--script", str(script), "--steps", "2", "--out", str(out), "--json",
               "--", "100")  # fmt: skip
    texts = markers(read_trace(out))
    assert [t for t in texts if t.startswith("iter:")] == ["iter:0", "iter:1"], texts
    assert texts.count("phase:backward") == 2 * backwards, texts
    assert "ran 1" in done.stderr and "ran 2" not in done.stderr
    # A loop of exactly --steps iterations ends without a word (it was said to end short).
    done = cli("symtrace", "--script", str(script), "--steps", "2", "--out", str(out), "--json",
               "--", "2")  # fmt: skip
    assert json.loads(done.stdout)["warnings"] == [], done.stdout


def test_a_script_with_two_optimizers_counts_an_iteration_once_both_stepped(
    tmp_path: Path,
) -> None:
    """A GAN's discriminator (five steps) and generator: each step was an iteration, so
    `--steps 2` traced a third of one; an optimizer that never steps is left out, and said."""
    gan = (
        "import torch\nfrom torch import nn\n"
        "G, D = nn.Linear(8, 16).cuda(), nn.Linear(16, 1).cuda()\n"
        "og, od = torch.optim.Adam(G.parameters()), torch.optim.Adam(D.parameters())\n"
        "{unused}"
        "for i in range(1000):\n"
        "    for _ in range(5):\n"
        "        D(G(torch.randn(4, 8, device='cuda')).detach()).mean().backward()\n"
        "        od.step(); od.zero_grad()\n"
        "    D(G(torch.randn(4, 8, device='cuda'))).mean().backward(); og.step(); og.zero_grad()\n"
        "    print('iteration', i)\n"
    )
    script, out = tmp_path / "gan.py", tmp_path / "gan.jsonl"
    script.write_text(gan.format(unused=""))
    done = cli("symtrace", "--script", str(script), "--steps", "2", "--out", str(out), "--json")
    texts = markers(read_trace(out))
    assert [t for t in texts if t.startswith("iter:")] == ["iter:0", "iter:1"], texts
    assert texts.count("phase:optimizer") == 12, texts
    assert "iteration 0" in done.stderr and "iteration 1" not in done.stderr
    assert json.loads(done.stdout)["warnings"] == []
    script.write_text(gan.format(unused="spare = torch.optim.SGD(nn.Linear(2, 2).parameters())\n"))
    done = cli("symtrace", "--script", str(script), "--steps", "2", "--out", str(out))
    assert "did not step while the others stepped 64 times (SGD)" in done.stderr, done.stderr
    assert "iteration 999" not in done.stderr


def test_a_script_that_autotunes_its_convolutions_is_said_to(tmp_path: Path) -> None:
    """`cudnn.benchmark = True` sizes cuDNN's search workspaces to free memory, which no trace
    has: the header says so and the verdict warns; the setting does not outlive the trace."""
    import torch

    script, out = tmp_path / "tuned.py", tmp_path / "tuned.jsonl"
    script.write_text(
        "import torch\ntorch.backends.cudnn.benchmark = True\n"
        "m = torch.nn.Conv2d(3, 8, 3).cuda()\nopt = torch.optim.SGD(m.parameters(), 0.1)\n"
        "for _ in range(5):\n"
        "    m(torch.randn(2, 3, 16, 16, device='cuda')).sum().backward(); opt.step()\n"
    )
    # A test before this one may have run PyTorch's test harness, which forbids setting cuDNN
    # flags outside its context manager (`disable_global_flags`); a user's process has not.
    allowed = getattr(torch.backends, "__allow_nonbracketed_mutation")
    with allowed():
        cli("symtrace", "--script", str(script), "--out", str(out))
        r = json.loads(cli("estimate", "--script", str(script), "--json").stdout)
    assert read_trace(out)[0]["metadata"]["cudnn_benchmark"] == "true"
    assert any("torch.backends.cudnn.benchmark" in w for w in r["warnings"]), r["warnings"]
    assert torch.backends.cudnn.benchmark is False
    script.write_text(script.read_text().replace("torch.backends.cudnn.benchmark = True", ""))
    cli("symtrace", "--script", str(script), "--out", str(out))
    header = read_trace(out)[0]["metadata"]
    assert header["uses_conv"] == "true" and "cudnn_benchmark" not in header


def test_a_scripts_marks_follow_the_marker_grammar(tmp_path: Path) -> None:
    """`mark("iter")` ends an iteration; other text, even text starting with "iter", is the
    user's marker and ends nothing."""
    script = tmp_path / "marks.py"
    script.write_text(
        "import torch\nfrom torch import nn\nimport memtrace_trainer\n"
        "m = nn.Linear(8, 8).cuda()\n"
        "for i in range(10):\n"
        "    memtrace_trainer.mark('iterator ready')\n"
        "    m(torch.randn(4, 8, device='cuda')).sum().backward()\n"
        "    memtrace_trainer.mark('iter')\n"
    )
    out = tmp_path / "marks.jsonl"
    cli("symtrace", "--script", str(script), "--steps", "2", "--out", str(out))
    texts = markers(read_trace(out))
    assert [t for t in texts if t.startswith("iter:")] == ["iter:0", "iter:1"], texts
    assert texts.count("iterator ready") == 2, texts


def test_script_without_a_step_or_with_value_dependent_shapes(tmp_path: Path) -> None:
    done = cli("symtrace", "--script", str(SCRIPTS / "no_step.py"), "--out",
               str(tmp_path / "n.jsonl"), "--json")  # fmt: skip
    assert any("without an optimizer.step()" in w for w in json.loads(done.stdout)["warnings"])
    done = cli("symtrace", "--script", str(SCRIPTS / "data_dependent.py"), "--out",
               str(tmp_path / "d.jsonl"), check=False)  # fmt: skip
    assert done.returncode == 2 and "nonzero" in done.stderr
    assert "data_dependent.py:6" in done.stderr and "Traceback" not in done.stderr
    done = cli("symtrace", "--script", str(SCRIPTS / "nope.py"), "--out", str(tmp_path / "x.jsonl"),
               check=False)  # fmt: skip
    assert done.returncode == 2 and "no such file" in done.stderr
    done = cli("symtrace", "--step", "step_examples:forward_only", "--out",
               str(tmp_path / "y.jsonl"), "--", "--lr", "3", check=False)  # fmt: skip
    assert done.returncode == 2 and "only --script takes arguments" in done.stderr


def test_the_fused_meta_kernels_last_only_while_tracing() -> None:
    """Registered for the whole process, they made the caller's own meta code skip fused
    updates that PyTorch refuses there."""
    import torch

    from memtrace_trainer.symtrace.userstep import fused_meta_kernels

    def has() -> bool:
        return torch._C._dispatch_has_kernel_for_dispatch_key("aten::_fused_sgd_", "Meta")

    assert not has()
    with fused_meta_kernels():
        assert has()
    assert not has()


def test_a_script_with_lazy_modules_moved_to_the_gpu(tmp_path: Path) -> None:
    """`.cuda()` made a lazy module's uninitialized parameter an empty `Parameter` (the move
    swaps tensors to keep parameter objects), which its first forward refused."""
    script, out = tmp_path / "lazy.py", tmp_path / "lazy.jsonl"
    script.write_text(
        "import torch\nfrom torch import nn\n"
        "m = nn.Sequential(nn.LazyConv2d(8, 3), nn.Flatten(), nn.LazyLinear(10)).cuda()\n"
        "m(torch.randn(2, 3, 16, 16, device='cuda'))\n"
        "opt = torch.optim.SGD(m.parameters(), 0.1)\n"
        "for _ in range(5):\n"
        "    m(torch.randn(2, 3, 16, 16, device='cuda')).sum().backward(); opt.step()\n"
    )
    done = cli("symtrace", "--script", str(script), "--out", str(out), "--json")
    params = (8 * 3 * 3 * 3 + 8 + 10 * 8 * 14 * 14 + 10) * 4
    assert json.loads(done.stdout)["allocated_bytes_by_category"]["parameter"] == params


def test_a_scripts_allocator_settings_are_the_traces(tmp_path: Path) -> None:
    """`PYTORCH_CUDA_ALLOC_CONF` set by the script, or `_set_allocator_settings`, changed
    nothing: the trace had no settings and memsim replayed the default allocator."""
    import os

    script, out = tmp_path / "conf.py", tmp_path / "conf.jsonl"
    script.write_text(
        "import os, torch\nos.environ['PYTORCH_CUDA_ALLOC_CONF'] = 'expandable_segments:True'\n"
        "torch.cuda.memory._set_allocator_settings('garbage_collection_threshold:0.6')\n"
        "m = torch.nn.Linear(64, 64).cuda()\nopt = torch.optim.SGD(m.parameters(), 0.1)\n"
        "for _ in range(5):\n"
        "    m(torch.randn(8, 64, device='cuda')).sum().backward(); opt.step()\n"
    )
    before = os.environ.get("PYTORCH_CUDA_ALLOC_CONF")
    cli("symtrace", "--script", str(script), "--out", str(out))
    env = read_trace(out)[0]["env"]
    assert env == {
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True,garbage_collection_threshold:0.6"
    }, env
    assert os.environ.get("PYTORCH_CUDA_ALLOC_CONF") == before  # the caller's again
    from memtrace_trainer.binaries import run_tool

    shown = run_tool("memsim", ["replay", str(out)])
    assert "expandable_segments:True" in shown.stdout, shown.stdout
    plain = tmp_path / "plain.jsonl"
    cli("symtrace", "--step", "step_examples:custom_optimizer", "--out", str(plain))
    assert "env" not in read_trace(plain)[0]
