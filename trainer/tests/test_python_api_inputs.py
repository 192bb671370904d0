"""The Python API on what callers pass beyond the plain case: step builders that reach the
caller's modules, inputs it can only partly use or not at all, hooks, Hugging Face masks, and
asking again of an estimate that was pickled, printed with a capacity or plotted without
matplotlib. Each refusal is an `EstimateError` that names the argument; each partial use a
`MemtraceWarning`."""

from __future__ import annotations

import copy
import dataclasses
import pickle
import re
import shutil
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import REPO, cli
from torch import nn

import memtrace
from memtrace import EstimateError, MemtraceWarning

X = torch.randn(4, 16)


def _said(seen: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in seen if issubclass(w.category, MemtraceWarning)]


def _estimate_said(*args: Any, **kwargs: Any) -> tuple[memtrace.Estimate, list[str]]:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        est = memtrace.estimate(*args, **kwargs)
    return est, _said(seen)


# --- step builders that reach the caller's modules ---------------------------------------------

_GLOBAL_NET: nn.Module | None = None


def _reaching(how: str) -> tuple[Any, nn.Module, str]:
    """A step builder that moves a module the caller holds, reached `how`; the module; the name
    the warning must give it."""
    global _GLOBAL_NET
    net = nn.Linear(64, 64)
    held = {"net": net}

    class Config:
        def __init__(self) -> None:
            self.net = net

    cfg = Config()

    def use(module: nn.Module, device: torch.device) -> Any:
        x = torch.randn(8, 64, device=device)

        def step() -> None:
            module(x).sum().backward()

        return step

    if how == "nonlocal":
        return (lambda device: use(net.to(device), device)), net, "`net`"
    if how == "in a dict":
        return (lambda device: use(held["net"].to(device), device)), net, "`held['net']`"
    if how == "an attribute":
        return (lambda device: use(cfg.net.to(device), device)), net, "`cfg.net`"
    _GLOBAL_NET = net
    if how == "global":
        return (lambda device: use(_GLOBAL_NET.to(device), device)), net, "`_GLOBAL_NET`"

    def named_in_step_only(device: torch.device) -> Any:
        x = torch.randn(8, 64, device=device)

        def step() -> None:
            _GLOBAL_NET.to(device)(x).sum().backward()

        return step

    return named_in_step_only, net, "`_GLOBAL_NET`"


@pytest.mark.parametrize("how", ["nonlocal", "global", "in a dict", "an attribute", "step only"])
def test_a_step_builder_that_moves_the_callers_module_is_said(how: str) -> None:
    """`net = model.to(device)` in a builder left the caller's model on meta, its weights gone,
    without a word."""
    make, net, name = _reaching(how)
    _, said = _estimate_said(make, steps=1)
    assert net.weight.is_meta  # what the builder did, which memtrace cannot undo
    moved = [s for s in said if s.startswith(f"the step builder moved {name} (Linear)")]
    assert moved and "values gone" in moved[0] and "copy.deepcopy" in moved[0], said


def test_a_step_builder_that_moves_a_copy_or_fails_is_said_only_when_it_moved() -> None:
    net = nn.Linear(64, 64)
    before = net.weight.detach().clone()

    def copies(device: torch.device) -> Any:
        mine = copy.deepcopy(net).to(device)
        x = torch.randn(8, 64, device=device)
        return lambda: mine(x).sum().backward()

    _, said = _estimate_said(copies, steps=1)
    assert not [s for s in said if "step builder" in s], said
    assert torch.equal(net.weight, before)

    def moves_then_fails(device: torch.device) -> Any:
        net.to(device)
        raise RuntimeError("boom")

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with pytest.raises(EstimateError, match=r"^model=\S*moves_then_fails: building the step"):
            memtrace.estimate(moves_then_fails)
    assert any(s.startswith("the step builder moved `net`") for s in _said(seen))


def _returns_none(device: torch.device) -> None:
    return None


def _takes_nothing() -> Any:
    return lambda: None


def _raises(device: torch.device) -> Any:
    raise ValueError("no data")


def _allocates_nothing(device: torch.device) -> Any:
    return lambda: None


@pytest.mark.parametrize(
    ("builder", "expect"),
    [(_returns_none, r"^model=_returns_none: expected a zero-argument step\(\) back"),
     (_takes_nothing, r"^model=_takes_nothing: _takes_nothing must take one argument"),
     (_raises, r"^model=_raises: building the step raised ValueError: no data"),
     (_allocates_nothing, r"^model=_allocates_nothing: nothing was allocated on the GPU")],
)  # fmt: skip
def test_a_failing_step_builder_is_named_one_way(builder: Any, expect: str) -> None:
    """It was `model=<lambda>`, `model <function ... at 0x...>` and `step:<lambda>`; a builder
    that allocates nothing was warned of as `step:NAME` before the error named it `model=NAME`."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with pytest.raises(EstimateError, match=expect):
            memtrace.estimate(builder)
    assert not [s for s in _said(seen) if "nothing was allocated" in s or "step:" in s]


# --- what cannot be traced, said as such ---------------------------------------------------------


class _SparseEmbedding(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.e = nn.Embedding(100, 16, sparse=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.e(x)


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))


def _loss_that_raises(output: torch.Tensor, target: Any) -> torch.Tensor:
    return {"out": output}["logits"]


@pytest.mark.parametrize(
    ("model", "inputs", "kwargs", "expect"),
    [
        (_mlp, torch.randn(0, 16), {}, r"^example_inputs: the batch is empty \(shape \(0, 16\)\)"),
        (_mlp, X, {"loss_fn": lambda o, t: None}, r"^loss_fn returned None: expected a scalar"),
        (_mlp, X, {"loss_fn": lambda o, t: 1.0}, r"^loss_fn returned a float: expected a scalar"),
        (_mlp, X, {"loss_fn": lambda o, t: o},
         r"^loss_fn returned a tensor of shape \(4, 4\): .*reduce it"),
        # The loss function's own failure, with its line: it was "the model failed at batch 4".
        (_mlp, X, {"loss_fn": _loss_that_raises},
         r"^loss_fn failed at batch 4: KeyError: 'logits'\n  at \S*test_python_api_inputs\.py:\d+ "
         r"in _loss_that_raises: return \{\"out\": output\}\[\"logits\"\]$"),
        (_SparseEmbedding, torch.randint(0, 100, (4, 8)), {"optimizer": "sgd"},
         r"sparse_coo tensor: sparse tensors are not supported .*sparse=True"),
        (lambda: torch.jit.script(_mlp()), X, {}, r"^model is a TorchScript module"),
        (lambda: torch.jit.trace(_mlp(), X), X, {}, r"^model is a TorchScript module"),
        (lambda: nn.Sequential(torch.jit.script(_mlp()), nn.ReLU()), X, {},
         r"^model: its submodule '0' is a TorchScript module"),
        (lambda: _mlp().requires_grad_(False), X, {},
         r"^the model has no parameter that requires grad: nothing to train"),
        (_mlp, X, {"checkpointing": []}, r"^checkpointing=\[\]: expected False, True"),
        (_mlp, X, {"checkpointing": 1}, r"^checkpointing=1: expected False, True"),
        (_mlp, X, {"steps": 10**6}, r"^steps=1000000: expected at most 1000"),
        (_mlp, X, {"gpu": b"h200"}, r"^gpu=b'h200': expected a non-empty name"),
        (_mlp, X, {"capacity": ["1GiB"]}, r"^capacity=\['1GiB'\]: expected a size such as '40GiB'"),
        (_mlp, X, {"capacity": {}}, r"^capacity=\{\}: expected a size such as '40GiB'"),
    ],
)  # fmt: skip
def test_what_cannot_be_traced_is_an_estimate_error(
    model: Any, inputs: Any, kwargs: dict, expect: str
) -> None:
    """Each was a raw ZeroDivisionError, AttributeError, NotImplementedError or TypeError, a
    misleading "the model failed" (ScriptModule hooks, an empty optimizer), or hours of
    tracing (steps=10**6)."""
    with pytest.raises(EstimateError, match=expect):
        memtrace.estimate(model(), inputs, **kwargs)


def test_max_batch_refuses_what_estimate_refuses() -> None:
    """An empty example batch returned 65536 (the limit) where `estimate` failed."""
    for kwargs, expect in [({}, r"^example_inputs: the batch is empty"),
                           ({"steps": 1001}, r"^steps=1001: expected at most 1000"),
                           ({"loss_fn": _loss_that_raises},
                            r"^loss_fn failed at batch 1: KeyError: 'logits'\n  at ")]:  # fmt: skip
        with pytest.raises(EstimateError, match=expect):
            x = torch.randn(0, 16) if not kwargs else X
            memtrace.max_batch(_mlp(), x, limit=4, **kwargs)


class _CastsItsInput(nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.float())


def _embedded() -> nn.Module:
    return nn.Sequential(nn.Embedding(100, 8), nn.Flatten(), nn.Linear(8 * 16, 4))


_INTS = torch.randint(0, 100, (4, 16))


@pytest.mark.parametrize(
    ("model", "inputs", "expect"),
    [
        # A GPU refuses integer input to a Linear or Conv ("mat1 and mat2 must have the same
        # dtype"); the tracer's device did not, and nothing was said (float64 was).
        (_mlp, _INTS, r"^the model's Linear '0' is given torch.int64 input and its parameters are "
                      r"torch.float32: on a GPU it fails there"),
        (lambda: nn.Linear(16, 4), _INTS.bool(), r"^the model \(a Linear\) is given torch.bool"),
        (_mlp, X.double(), r"^example_inputs are torch.float64 and the model's parameters"),
        # Integer indices to an embedding are what it takes; a layer that casts is not refused.
        (_embedded, _INTS, None),
        (lambda: nn.Sequential(_CastsItsInput(16, 4)), _INTS, None),
        (_mlp, X, None),
    ],
)  # fmt: skip
def test_inputs_a_gpus_first_layer_refuses_are_said(model: Any, inputs: Any, expect: Any) -> None:
    _, said = _estimate_said(model(), inputs)
    dtypes = [s for s in said if s.startswith("example_inputs are") or " is given torch." in s]
    if expect is None:
        assert not dtypes, said
    else:
        assert len(dtypes) == 1 and re.match(expect, dtypes[0]), said


def test_what_pytorch_refuses_inside_the_tracers_modes_is_the_models_failure() -> None:
    # PyTorch's C++ refusal of a uint8 batch to a bias-free Conv2d has no Python frame: the
    # tracer's mode that handed the op on was innermost, and the raw RuntimeError reached the
    # caller as memtrace's own fault.
    model = nn.Conv2d(3, 8, 3, bias=False)
    batch = torch.zeros(4, 3, 8, 8, dtype=torch.uint8)
    with (
        pytest.warns(MemtraceWarning),
        pytest.raises(EstimateError, match="the model failed at batch 4"),
    ):
        memtrace.estimate(model, batch, loss_fn=lambda out, _: out.float().sum())
    from memtrace_trainer.errors import raised_by_memtrace

    # A fault in the tool's own line (not a hand-on) is still its own.
    with pytest.raises(AttributeError) as caught:
        raised_by_memtrace(None)  # type: ignore[arg-type]
    assert raised_by_memtrace(caught.value)


def test_the_step_limit_is_the_clis() -> None:
    from memtrace_trainer.errors import UserError
    from memtrace_trainer.symtrace.step import StepConfig
    from memtrace_trainer.symtrace.userstep import MAX_STEPS

    MLP = 'synthetic:{"family":"mlp","input_size":256,"output_size":10,"depth":3}'
    done = cli("estimate", "--model", MLP, "--batch-size", "2", "--steps", str(MAX_STEPS + 1),
               check=False)  # fmt: skip
    assert done.returncode == 2 and f"--steps {MAX_STEPS + 1}: expected at most" in done.stderr
    with pytest.raises(UserError, match=f"expected at most {MAX_STEPS}"):
        StepConfig(iterations=MAX_STEPS + 1).validate()
    from memtrace.checks import steps
    from memtrace_trainer.symtrace.userstep import check_steps

    assert MAX_STEPS == 1000
    check_steps(1000)  # the bound itself is taken
    steps(1000)
    with pytest.raises(UserError, match=r"^--steps 1001: expected at most 1000"):
        check_steps(1001)
    with pytest.raises(EstimateError, match=r"^steps=1001: expected at most 1000"):
        steps(1001)


@pytest.mark.parametrize("command", ["estimate", "max-batch"])
def test_the_step_limit_counts_every_micro_batch(command: str) -> None:
    """--grad-accum 1000000 traced two million micro-batches, op by op, for days, where
    --steps 1001 was refused."""
    from memtrace_trainer.errors import UserError
    from memtrace_trainer.symtrace.step import StepConfig, check_loop

    MLP = 'synthetic:{"family":"mlp","input_size":256,"output_size":10,"depth":3}'
    sizes = ["--batch-size", "8"] if command == "estimate" else ["--limit", "8"]
    done = cli(command, "--model", MLP, *sizes, "--grad-accum", "1000000", check=False)
    assert done.returncode == 2, done.stderr
    assert "--grad-accum 1000000: 2 steps x 1000000 micro-batches = 2000000, expected at most " \
        "1000" in done.stderr  # fmt: skip
    check_loop(2, 500)  # the bound itself is taken
    with pytest.raises(UserError, match=r"^--grad-accum 501: 2 steps x 501 micro-batches"):
        StepConfig(iterations=2, grad_accum=501).validate()


# --- inputs used as given, or in part --------------------------------------------------------------


@dataclasses.dataclass
class _Out:
    note: str
    logits: torch.Tensor


class _DataclassOut(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> _Out:
        return _Out("a", self.lin(x))


def test_a_dataclass_output_is_taken_a_loss_of() -> None:
    """ "the model's output has no floating-point tensor", beside one in a dataclass field."""
    y = torch.randint(0, 4, (4,))
    got = memtrace.estimate(_DataclassOut(), X, target=y)
    plain = memtrace.estimate(_DataclassOut(), X, target=y, loss_fn=lambda o, t:
                              nn.functional.cross_entropy(o.logits, t))  # fmt: skip
    assert got.breakdown == plain.breakdown


def test_gpu_as_a_path_is_taken_everywhere() -> None:
    """`fits(Path)` worked, `estimate(gpu=Path)` and `max_batch` raised AttributeError."""
    h200 = REPO / "profiles" / "h200.toml"
    by_path, _ = _estimate_said(_mlp(), X, gpu=h200)
    by_name, _ = _estimate_said(_mlp(), X, gpu="h200")
    assert by_path.device_mib == by_name.device_mib and by_path.gpu == by_name.gpu
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MemtraceWarning)
        assert by_name.fits(h200) is by_name.fits("h200")
        assert memtrace.max_batch(_mlp(), X, gpu=h200, limit=4) == 4
        assert memtrace.replay(by_path.trace_path, h200)["verdict"]["fits"] is True


def test_the_callers_hooks_are_said() -> None:
    """A forward hook ran on the tracer's copy and left meta tensors in the caller's dict; a
    tensor's gradient hook was dropped; neither was said."""
    m = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))
    kept: dict[str, torch.Tensor] = {}
    m[0].register_forward_hook(lambda mod, i, o: kept.__setitem__("fc0", o))
    m[2].weight.register_hook(lambda g: g * 2)
    _, said = _estimate_said(m, X)
    ran = [s for s in said if s.startswith("hooks registered on the model ran on the tracer's")]
    assert ran and "<lambda> on '0'" in ran[0], said
    assert kept["fc0"].is_meta  # what the warning says
    left = [s for s in said if s.startswith("gradient hooks on the model's tensors (2.weight)")]
    assert left and "left out of the trace" in left[0], said
    _, quiet = _estimate_said(_mlp(), X)
    assert not [s for s in quiet if "hook" in s], quiet


def test_a_warning_points_at_the_callers_line() -> None:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        memtrace.estimate(_mlp(), X.double())
    said = [w for w in seen if issubclass(w.category, MemtraceWarning)]
    assert said and all(w.filename == __file__ for w in said), [w.filename for w in said]


# --- Hugging Face attention masks -------------------------------------------------------------------


def _hf(kind: str, attn: str = "sdpa") -> nn.Module:
    import transformers

    if kind == "gpt2":
        config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=500,
                                         attn_implementation=attn)  # fmt: skip
        return transformers.GPT2LMHeadModel(config)
    config = transformers.BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=2,
                                     intermediate_size=128, vocab_size=500,
                                     attn_implementation=attn)  # fmt: skip
    return transformers.BertForMaskedLM(config)


@pytest.mark.parametrize(("kind", "attn"), [("gpt2", "sdpa"), ("gpt2", "eager"), ("bert", "sdpa")])
def test_an_attention_mask_is_traced_as_transformers_runs_it(kind: str, attn: str) -> None:
    """transformers reads a mask's values (masking_utils) and takes one without padding for
    none: on the tracer's device that read failed ("Tensor.item() cannot be called on meta
    tensors"), or, in the trace, took every mask for a padded one. An all-ones mask is left out,
    as transformers leaves it out; a padded one is traced on the padded path."""
    model = _hf(kind, attn)
    ids = torch.randint(0, 500, (2, 32))
    padded = torch.ones_like(ids)
    padded[1, 20:] = 0
    plain, _ = _estimate_said(model, {"input_ids": ids, "labels": ids})
    ones, said = _estimate_said(model, {"input_ids": ids, "labels": ids,
                                        "attention_mask": torch.ones_like(ids)})  # fmt: skip
    assert ones.breakdown == plain.breakdown
    # A tokenizer's mask of every unpadded batch: dropped as transformers drops it, not said.
    assert not [s for s in said if "attention_mask" in s], said
    pad, said = _estimate_said(model, {"input_ids": ids, "labels": ids, "attention_mask": padded})
    assert pad.allocated_mib > plain.allocated_mib  # the padded path holds the mask it builds
    assert not [s for s in said if "attention_mask" in s], said
    # Token ids and an integer mask are what a transformers model takes: no layer refuses them.
    assert not [s for s in said if " is given torch." in s], said
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MemtraceWarning)
        batch = {"input_ids": ids, "labels": ids, "attention_mask": padded}
        assert memtrace.max_batch(model, batch, limit=2) == 2


def test_a_transformers_hook_of_its_own_is_not_the_callers() -> None:
    model = _hf("gpt2")
    model.enable_input_require_grads()  # a forward hook defined in transformers
    ids = torch.randint(0, 500, (2, 16))
    _, said = _estimate_said(model, {"input_ids": ids, "labels": ids})
    assert not [s for s in said if "hook" in s], said


# --- the answer, asked again ---------------------------------------------------------------------


def test_the_capacity_judged_is_printed_beside_the_verdict() -> None:
    """With capacity=, `str(est)` said DOES NOT FIT beside a need far below the GPU's memory."""
    model = _mlp()
    at = memtrace.estimate(model, X, capacity="1000MiB")
    assert str(at).endswith("DOES NOT FIT (capacity 1000.0 MiB)"), str(at)
    assert "(capacity 1000.0 MiB)" in at._repr_html_()
    own = memtrace.estimate(model, X)
    assert str(own).endswith(": FITS") and "capacity" not in own._repr_html_()


@pytest.mark.parametrize(
    ("verdict", "beside"),
    [({"capacity_source": "profile", "need_mib": 1.0, "capacity_mib": 40536.0}, ""),
     ({"capacity_source": "flag", "need_mib": 1460.1, "capacity_mib": 1000.0},
      " (capacity 1000.0 MiB)"),
     # The two would print alike: both in bytes, as memsim words the headline then.
     ({"capacity_source": "flag", "need_mib": 1024.04, "capacity_mib": 1024.01},
      " (capacity 1073752310 B)")],
)  # fmt: skip
def test_the_first_line_says_a_given_capacity(verdict: dict, beside: str) -> None:
    from memtrace_trainer.estimate import capacity_beside

    assert capacity_beside(verdict) == beside


def test_a_pickled_estimate_keeps_its_trace() -> None:
    """It loaded as "closed", its trace left behind in the process that made it."""
    est = memtrace.estimate(_mlp(), X)
    blob = pickle.dumps(est)
    est.close()
    loaded = pickle.loads(blob)
    assert loaded.trace_path != est.trace_path and loaded.trace_path.is_file()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MemtraceWarning)
        assert loaded.fits("h200") is True and loaded.device_mib == est.device_mib
    assert copy.copy(loaded).trace_path == loaded.trace_path  # a copy still shares it
    closed = pickle.loads(pickle.dumps(est))
    with pytest.raises(EstimateError, match="this estimate was closed"):
        closed.fits("h200")


def test_a_file_name_that_begins_with_a_dash_is_a_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`-x.mtrace` reached memsim as a flag ("unexpected argument '-x'"), and `--help` as one."""
    est = memtrace.estimate(_mlp(), X)
    monkeypatch.chdir(tmp_path)
    shutil.copy(est.trace_path, "-t.jsonl")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MemtraceWarning)
        assert memtrace.replay("-t.jsonl", "h200")["peak_reserved_bytes"] > 0
    with pytest.raises(EstimateError, match="--help"):
        memtrace.replay("--help")
    assert est.to_memory_viz("-v.pickle").is_file()
    assert est.report("-r.html").read_text().startswith("<!DOCTYPE html>")


def test_asking_again_with_a_wrong_argument_is_an_estimate_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    est = memtrace.estimate(_mlp(), X)
    for ask, expect in [(lambda: est.report(5), r"^report\(5\): expected a path ending in .html"),
                        # Refused in the API's words, before memsim runs (its flags were quoted).
                        (lambda: est.report("a.pdf"),
                         r"^report\('a.pdf'\): expected a path ending in .html or .htm"),
                        (lambda: est.to_memory_viz(5), r"^to_memory_viz\(5\): expected a path"),
                        (lambda: est.plot(ax=5), r"^plot\(ax=5\): expected a matplotlib Axes")]:  # fmt: skip
        with pytest.raises(EstimateError, match=expect):
            ask()
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)  # not installed
    with pytest.raises(EstimateError, match=r"^plot\(\) draws with matplotlib, which is not"):
        est.plot()


@pytest.mark.parametrize("capacity", [["2GiB"], {}])
def test_max_batch_refuses_a_capacity_or_limit_of_another_type(capacity: Any) -> None:
    """A list or dict capacity, and `limit=None`, were raw TypeErrors (unhashable; `<` against
    None)."""
    with pytest.raises(EstimateError, match=r"^capacity=.*: expected a size such as '40GiB'"):
        memtrace.max_batch(_mlp(), X, capacity=capacity)
    with pytest.raises(EstimateError, match=r"^limit=None: expected the largest batch to try"):
        memtrace.max_batch(_mlp(), X, limit=None)


class _Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 4)

    def forward(self, scale: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * scale


def test_a_scalar_before_the_batch_is_no_batch() -> None:
    """`(x, scale)` was taken and `(scale, x)` refused: the batch was the first tensor's first
    dimension, and a 0-dim tensor has none."""
    est = memtrace.estimate(_Scaled(), (torch.tensor(2.0), X))
    assert est.device_mib > 0
    assert memtrace.max_batch(_Scaled(), (torch.tensor(2.0), X), limit=8) == 8


def test_lora_targets_of_a_model_that_is_one_linear_layer_say_so() -> None:
    """The list of its linear layers was empty (`its linear layers are named `): the model
    itself is named "", which no target names."""
    with pytest.raises(EstimateError, match=r"nope matches no module .*it has no linear submodule"):
        memtrace.estimate(nn.Linear(16, 4), X, lora=4, lora_targets="nope")
