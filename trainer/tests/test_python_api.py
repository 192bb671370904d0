"""The Python API (`import memtrace`): the same numbers as the CLI, the caller's model never
touched, every way to ask the answer again, and clear errors."""

from __future__ import annotations

import json
import pickle
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import cli
from torch import nn

import memtrace
from memtrace import EstimateError


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 10))


X, Y = torch.randn(32, 256), torch.randint(0, 10, (32,))


@pytest.fixture(scope="module")
def resnet() -> tuple[nn.Module, memtrace.Estimate]:
    import torchvision

    model = torchvision.models.resnet18()
    est = memtrace.estimate(model, torch.randn(4, 3, 224, 224), target=torch.randint(0, 1000, (4,)))
    return model, est


def test_the_api_answers_what_the_cli_answers(resnet: tuple[nn.Module, memtrace.Estimate]) -> None:
    _, est = resnet
    out = json.loads(cli("estimate", "--model", "torchvision:resnet18", "--batch-size", "4",
                         "--json").stdout)  # fmt: skip
    sym = out["estimates"]["symbolic"]
    assert est.device_mib == sym["device_mib"] and est.reserved_mib == sym["reserved_mib"]
    assert est.safe_mib == pytest.approx(sym["safe_mib"])
    assert est.verdict == out["verdict"]
    assert est.per_rank[0]["device_mib"] == est.device_mib


def test_the_callers_model_is_never_touched() -> None:
    model = _mlp()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model.eval()
    memtrace.estimate(model, X, target=Y, optimizer="adamw")
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert all(p.device.type == "cpu" and p.grad is None for p in model.parameters())
    assert not model.training  # not even switched to train mode


def test_the_breakdown_adds_up_to_the_point_estimate(
    resnet: tuple[nn.Module, memtrace.Estimate],
) -> None:
    _, est = resnet
    b = est.breakdown
    assert sum(b.values()) == pytest.approx(est.device_mib)
    assert b["parameters"] == pytest.approx(
        sum(p.numel() * 4 for p in resnet[0].parameters()) / 2**20, rel=0.01
    )
    assert b["optimizer_state"] >= 2 * b["parameters"]  # Adam's two moments, at least
    assert b["outside_allocator"] == est.raw["outside_allocator"]["total_mib"]


def test_the_breakdown_takes_the_estimates_reserved_peak() -> None:
    """At a tight capacity the estimate's replay (at the allocator's budget) can reserve less
    than the report's unlimited one; the parts still sum to the estimate's point, and a
    category memsim adds is a part of its own."""
    from memtrace.result import breakdown

    mib = 1 << 20
    raw = {
        "estimates": {"symbolic": {"reserved_mib": 30.0}},
        "outside_allocator": {"total_mib": 400.0},
    }
    report = {"categories": ["parameter", "activation", "new_kind"], "peak_reserved_bytes": 40 * mib,
              "categories_at_peak": {"parameter": 10 * mib, "activation": 12 * mib, "new_kind": 2 * mib}}  # fmt: skip
    parts = breakdown(raw, report)
    assert sum(parts.values()) == pytest.approx(430.0), parts
    assert parts["allocator_cache"] == pytest.approx(6.0) and parts["new_kind"] == pytest.approx(
        2.0
    )
    assert list(parts)[:2] == ["parameters", "activations"]


def test_fits_asks_again_on_another_gpu(resnet: tuple[nn.Module, memtrace.Estimate]) -> None:
    _, est = resnet
    assert est.fits() is est.verdict["fits"] is True
    for gpu in memtrace.profiles():
        replayed = memtrace.replay(est.trace_path, gpu)
        assert est.fits(gpu) is replayed["verdict"]["fits"]
    tiny = memtrace.replay(est.trace_path, "a100-40gb", capacity="1GiB")
    assert tiny["verdict"]["fits"] is False
    # What memsim says of the question reaches the caller: this trace was emulated for the
    # a100-40gb profile, and judging it on the h200's is said.
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        est.fits("h200")
    said = [str(w.message) for w in seen if w.category is memtrace.MemtraceWarning]
    assert any("emulated for the a100-40gb profile, not h200" in s for s in said), said


def test_asking_again_keeps_the_estimates_capacity_and_basis(tmp_path: Path) -> None:
    """`fits()` answers at the estimate's capacity, on the number it is asked about (the safe
    number, or the point with point=True), whichever number the estimate itself judged."""
    model = _mlp()
    est = memtrace.estimate(model, X, target=Y)
    assert est.safe_mib > est.device_mib  # the profile's margin is above zero
    below_point = f"{est.device_mib - 1:.3f}MiB"
    tight = memtrace.estimate(model, X, target=Y, capacity=below_point)
    assert tight.fits() is False and tight.fits(point=True) is False
    # The GPU named: its total memory, said to differ from the estimate's capacity.
    with pytest.warns(
        memtrace.MemtraceWarning, match=r"fits\('a100-40gb'\) judges that GPU's total"
    ):
        assert tight.fits("a100-40gb", point=True) is True
    assert tight.fits("a100-40gb", capacity=below_point, point=True) is False
    assert est.fits(capacity=below_point, point=True) is False  # a capacity asked of any estimate
    with pytest.raises(EstimateError, match=r"for 'capacity': .*did you mean 40GiB"):
        est.fits(capacity="40")
    between = f"{(est.device_mib + est.safe_mib) / 2:.3f}MiB"
    on_point = memtrace.estimate(model, X, target=Y, capacity=between, point=True)
    assert on_point.verdict["fits"] is True and on_point.fits(point=True) is True
    assert on_point.fits(point=False) is False  # the safe number is above the capacity
    assert on_point.fits() is True  # the estimate's own verdict, on its own number
    # The page judges its rows on the point too, and shows the capacity judged at.
    page = on_point.report(tmp_path / "r.html").read_text()
    assert '<span class="muted">(point)</span>' in page and "(given as capacity=)" in page
    assert "(capacity)" not in page, "the capacity's source said as the word it describes"
    assert "--capacity" not in page, "the API's page names its keyword, not the CLI flag"


def test_the_answer_in_every_form(
    resnet: tuple[nn.Module, memtrace.Estimate], tmp_path: Path
) -> None:
    _, est = resnet
    rows = est.timeline()
    rows = rows.to_dict("records") if hasattr(rows, "to_dict") else rows
    peak = max(r["allocated_mib"] for r in rows)
    assert peak == pytest.approx(est.allocated_mib, rel=1e-6)
    assert {"at", "reserved_mib", "parameter_mib", "activation_mib"} <= set(rows[0])
    snap = pickle.loads(est.to_memory_viz(tmp_path / "s.pickle").read_bytes())
    assert snap["segments"] or snap["device_traces"]
    page = est.report(tmp_path / "r.html").read_text()
    assert f'data-mib="{est.verdict["need_mib"]:.1f}"' in page
    assert json.loads(est.to_json())["breakdown_mib"] == est.breakdown
    assert "FITS" in est._repr_html_() and str(est).startswith("needs ")


def test_a_model_that_is_one_layer_is_its_layers_family() -> None:
    """The root counts when nothing under it ran: a bare Conv2d is a CNN."""
    est = memtrace.estimate(nn.Conv2d(3, 8, 3), torch.randn(2, 3, 16, 16),
                            target=torch.randn(2, 8, 14, 14), loss_fn=torch.nn.functional.mse_loss)  # fmt: skip
    assert est.raw["family"] == "CNN", est.raw["family"]


def test_a_step_builder_runs_as_written() -> None:
    from step_examples import default_adamw

    est = memtrace.estimate(default_adamw, steps=2)
    assert est.raw["model"] == "step:default_adamw"
    assert est.device_mib > est.reserved_mib > 0


def test_the_loops_arguments_with_a_step_builder_are_warned_about() -> None:
    from step_examples import default_adamw

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        memtrace.estimate(default_adamw, steps=1, optimizer="sgd", amp="bf16")
    said = [str(w.message) for w in seen if issubclass(w.category, memtrace.MemtraceWarning)]
    assert "optimizer= has no effect with a step builder: your step decides" in said
    assert "amp= has no effect with a step builder: your step decides" in said
    with pytest.raises(EstimateError, match="example_inputs has no effect"):
        memtrace.estimate(default_adamw, X)


@pytest.mark.parametrize(
    ("kwargs", "expect"),
    [({"steps": 0}, "^steps=0: expected"), ({"world_size": 0}, "^world_size=0: expected"),
     ({"world_size": -2}, "^world_size=-2: expected")],
)  # fmt: skip
def test_a_step_builders_counts_are_checked(kwargs: dict, expect: str) -> None:
    """Before, steps=0 became the default and world_size=0 a single GPU, silently."""
    from step_examples import default_adamw

    with pytest.raises(EstimateError, match=expect):
        memtrace.estimate(default_adamw, **kwargs)


def test_max_batch_is_the_boundary() -> None:
    model = _mlp()
    cap = "1600MiB"
    best = memtrace.max_batch(model, X, target=Y, capacity=cap, limit=1 << 20)
    assert best > 0
    at = memtrace.estimate(model, torch.randn(best, 256), target=torch.randint(0, 10, (best,)),
                           capacity=cap)  # fmt: skip
    over = memtrace.estimate(model, torch.randn(best + 1, 256),
                             target=torch.randint(0, 10, (best + 1,)), capacity=cap)  # fmt: skip
    assert at.fits() and not over.fits()


class _DataDependent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x)[x.nonzero()[:, 0]]  # a shape that depends on values


def test_a_model_that_fails_on_the_tracers_device_names_the_op_and_the_line() -> None:
    with pytest.raises(EstimateError) as e:
        memtrace.estimate(_DataDependent(), torch.randn(4, 8))
    msg = str(e.value)
    assert "nonzero" in msg and "test_python_api.py" in msg and "x.nonzero()" in msg


@pytest.mark.parametrize(
    ("kwargs", "expect"),
    [
        ({"gpu": "nope"}, "known profiles: a100-40gb, h200"),
        ({"example_inputs": None}, "example_inputs is required"),
        ({"world_size": 4}, "world_size=4 needs strategy="),
        ({"optimizer": "adamx"}, "^optimizer='adamx': expected one of"),
        ({"steps": 0}, r"^steps=0: expected a number of traced steps"),
        ({"strategy": "fsdp2"}, r"^strategy='fsdp2' needs world_size="),
        (
            {"target": torch.randint(0, 10, (3,))},
            # Not resized to the batch: the loss meets it as a real step does.
            r"^target: the default loss cannot pair the model's output \(32, 10\) with the "
            r"integer target \(3,\)",
        ),
        ({"steps": -1}, r"^steps=-1: expected"),
        ({"world_size": 0, "strategy": "fsdp2"}, r"^world_size=0: expected a number of ranks"),
        ({"lora": 4, "lora_targets": "zz"}, r"^lora_targets: zz matches no module"),
        ({"amp": "fp8"}, r"^amp='fp8': expected one of"),
        ({"capacity": "40"}, r"for 'capacity': .*did you mean 40GiB"),
        # A bare 40960 most likely means MiB (40 GiB), not 40960 GiB.
        ({"capacity": 40960}, r"for 'capacity': .*did you mean 40960MiB\?"),
        ({"capacity": "2048"}, r"for 'capacity': .*did you mean 2048MiB\?"),
        ({"checkpointing": "some"}, "checkpointing='some'"),
        ({"dtype": "bf16", "amp": "fp16"}, "contradictory"),
        ({"lora": 4}, r"not a Hugging Face model.*lora_targets="),
        # A rank of 0 is no adapter; it was said back as the text it became (lora='0').
        ({"lora": 0, "lora_targets": "0"}, r"^lora=0: expected a rank, an int of at least 1"),
        ({"lora": -2, "lora_targets": "0"}, r"^lora=-2: expected a rank, an int of at least 1"),
        ({"lora": 8.0, "lora_targets": "0"}, r"^lora=8.0: expected a rank .* or 'R:ALPHA'"),
        ({"lora": True, "lora_targets": "0"}, r"^lora=True: expected a rank"),
        ({"lora": "0", "lora_targets": "0"}, r"^lora='0': the rank and alpha must be positive"),
        ({"lora": "0:16", "lora_targets": "0"}, r"^lora='0:16': the rank and alpha must be"),
        ({"lora_targets": "0"}, "lora_targets= has no meaning without lora="),
        ({"target": 3}, r"^target: the default loss takes a tensor .* got int"),
        ({"target": [1] * 32}, r"^target: the default loss takes a tensor .* got list"),
        ({"loss_fn": "mse"}, r"^loss_fn='mse': expected a callable"),
        (
            {"loss_fn": lambda out: out.sum()},
            r"^loss_fn: it is called as loss_fn\(output, target\)",
        ),
        ({"gpu": 5}, r"^gpu=5: expected a non-empty name"),
        ({"gpu": ""}, r"^gpu='': expected a non-empty name"),
        ({"optimizer": ""}, r"^optimizer='': expected a non-empty name"),
        ({"point": "no"}, r"^point='no': expected True or False"),
        ({"lora": 4, "lora_targets": [0, 2]}, r"^lora_targets=\[0, 2\]: expected module names"),
        (
            {"world_size": 2_000_000, "strategy": "ddp"},
            r"^world_size=2000000: expected at most 65536 ranks",
        ),
    ],
)
def test_bad_arguments_raise_estimate_error(kwargs: dict, expect: str) -> None:
    args = {"example_inputs": X, **kwargs}
    with pytest.raises(EstimateError, match=expect):
        memtrace.estimate(_mlp(), **args)


def test_a_lora_rank_of_0_is_refused_by_the_cli_as_by_the_api() -> None:
    done = cli("estimate", "--model", "mlp", "--batch-size", "8", "--lora", "0", check=False)
    assert done.returncode == 2, done.stderr
    assert "--lora '0': the rank and alpha must be positive" in done.stderr, done.stderr


def test_warnings_are_python_warnings() -> None:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        est = memtrace.estimate(_mlp(), X, target=Y, gpu="h200")
    said = [str(w.message) for w in seen if issubclass(w.category, memtrace.MemtraceWarning)]
    assert said and said == est.warnings
    assert any("unmeasured" in s for s in said)


def test_preload_path_is_the_shim() -> None:
    path = memtrace.preload_path()
    assert path.name == "libmemtrace.so" and path.is_file()
    from memtrace.__main__ import main

    assert main(["preload"]) == 0 and main(["nope"]) == 2


def test_the_python_api_page_runs_as_written() -> None:
    """docs/python-api.md is a doctest: every example there works as written."""
    import doctest

    page = Path(__file__).resolve().parents[2] / "docs" / "python-api.md"
    flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", memtrace.MemtraceWarning)
        result = doctest.testfile(str(page), module_relative=False, optionflags=flags)
    assert result.attempted >= 15 and result.failed == 0, result


def test_plot_draws_the_categories_and_the_reserved_line(
    resnet: tuple[nn.Module, memtrace.Estimate], tmp_path: Path
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    _, est = resnet
    ax = est.plot()
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels[-1] == "reserved" and {"parameter", "activation"} <= set(labels)
    reserved = ax.get_lines()[-1].get_ydata()
    assert max(reserved) == pytest.approx(est.reserved_mib)
    ax.figure.savefig(tmp_path / "plot.png")
    assert (tmp_path / "plot.png").stat().st_size > 10_000


def test_lora_on_a_transformers_model_takes_peft_defaults_and_elsewhere_its_targets() -> None:
    import transformers

    cfg = json.loads((Path(__file__).parent / "hf_configs" / "tiny-llama.json").read_text())
    config = transformers.AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    llama = transformers.AutoModelForCausalLM.from_config(config)
    ids = torch.randint(0, config.vocab_size, (2, 16))
    tuned = memtrace.estimate(llama, {"input_ids": ids, "labels": ids}, lora=8)
    full = memtrace.estimate(llama, {"input_ids": ids, "labels": ids})
    assert tuned.safe_mib < full.safe_mib  # frozen base: no gradients or optimizer state
    assert memtrace.estimate(_mlp(), X, lora=4, lora_targets="0").safe_mib > 0


def test_max_batch_of_what_is_not_a_module_is_an_estimate_error() -> None:
    with pytest.raises(EstimateError, match=r"max_batch searches an nn\.Module"):
        memtrace.max_batch(lambda device: None, None)
    # A step builder alone (as `estimate` takes one) got a raw TypeError about the inputs.
    with pytest.raises(EstimateError, match=r"max_batch searches an nn\.Module"):
        memtrace.max_batch(lambda device: None)
    with pytest.raises(EstimateError, match=r"^example_inputs: max_batch needs one batch"):
        memtrace.max_batch(_mlp())


def test_fits_without_arguments_is_the_estimates_own_verdict() -> None:
    """An estimate judged on its point number at a capacity between the point and the safe
    number: `fits()` said False beside a FITS verdict, as it judged the safe number."""
    model = _mlp()
    est = memtrace.estimate(model, X, target=Y)
    between = f"{(est.device_mib + est.safe_mib) / 2:.3f}MiB"
    on_point = memtrace.estimate(model, X, target=Y, capacity=between, point=True)
    assert on_point.verdict["fits"] is True and "FITS" in str(on_point)
    assert on_point.fits() is True and on_point.fits(point=False) is False


def _same(a: memtrace.Estimate, b: memtrace.Estimate) -> None:
    assert (a.device_mib, a.breakdown) == (b.device_mib, b.breakdown)


def test_the_callers_torch_context_is_set_aside() -> None:
    """A notebook cell under no_grad or inference_mode trained nothing ("element 0 of tensors
    does not require grad"); under `with torch.device("meta")` every op was taken for one on
    the meta device proper, and the estimate lost its gradients and optimizer state. The same
    numbers now, and the caller's context as it was afterwards."""
    model = _mlp()
    plain = memtrace.estimate(model, X, target=Y)
    assert plain.breakdown["gradients"] > 0 and plain.breakdown["optimizer_state"] > 0
    with torch.no_grad():
        _same(memtrace.estimate(model, X, target=Y), plain)
        assert not torch.is_grad_enabled()
    with torch.inference_mode():
        _same(memtrace.estimate(model, X, target=Y), plain)
        assert torch.is_inference_mode_enabled()
    with torch.device("meta"):
        _same(memtrace.estimate(model, X, target=Y), plain)
        assert torch.get_default_device().type == "meta" and torch.empty(1).is_meta
        assert memtrace.max_batch(model, X, target=Y, limit=4) == 4


def test_estimates_from_threads_wait_their_turn() -> None:
    """Four threads at once: three failed with "nested traces are not supported", and one
    took another's warnings. Each now gets its own answer and its own warnings."""
    import threading

    model = _mlp()
    alone = {g: memtrace.estimate(model, X, target=Y, gpu=g) for g in ("a100-40gb", "h200")}
    got: list[tuple[str, object]] = []

    def one(gpu: str) -> None:
        try:
            got.append((gpu, memtrace.estimate(model, X, target=Y, gpu=gpu)))
        except Exception as e:
            got.append((gpu, e))

    threads = [threading.Thread(target=one, args=(g,)) for g in ("a100-40gb", "h200") * 2]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert len(got) == 4
    for gpu, est in got:
        assert isinstance(est, memtrace.Estimate), f"{gpu}: {est!r}"
        assert est.device_mib == alone[gpu].device_mib and est.warnings == alone[gpu].warnings


def test_a_sharded_estimate_leaves_the_callers_excepthook() -> None:
    """The fake process group's init installed PyTorch's `[rank0]:` excepthook, once more per
    estimate, on every later traceback of the caller's."""
    import sys

    hook = sys.excepthook
    memtrace.estimate(_mlp(), X, target=Y, strategy="ddp", world_size=2)
    assert sys.excepthook is hook


def test_a_dtype_asked_for_is_the_parameters_dtype() -> None:
    """`dtype="fp32"` of a bf16 model was taken as no dtype: its parameters stayed bf16."""
    bf16 = _mlp().to(torch.bfloat16)
    own = memtrace.estimate(bf16, X, target=Y).breakdown["parameters"]
    fp32 = memtrace.estimate(bf16, X, target=Y, dtype="fp32").breakdown["parameters"]
    assert fp32 == pytest.approx(2 * own, rel=0.01)
    assert memtrace.estimate(_mlp(), X, target=Y, dtype="fp32").breakdown["parameters"] == fp32
    # Without a dtype, the model's own stays, with LoRA too (it was cast to fp32).
    lora = memtrace.estimate(bf16, X, target=Y, lora=8, lora_targets="0,2")
    assert lora.breakdown["parameters"] < 1.2 * own


def test_the_default_loss_takes_class_scores_in_the_second_dimension() -> None:
    """A segmentation head's (N, C, H, W) output against (N, H, W) classes failed ("Expected
    input batch_size (320) to match target batch_size (2048)") and blamed the model."""
    seg = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 5, 1))
    x, y = torch.randn(2, 3, 32, 32), torch.randint(0, 5, (2, 32, 32))
    assert memtrace.estimate(seg, x, target=y).device_mib > 0
    with pytest.raises(EstimateError, match=r"cannot pair the model's output \(2, 5, 32, 32\)"):
        memtrace.estimate(seg, x, target=torch.randint(0, 5, (2, 7)))
    with pytest.raises(EstimateError, match=r"mean squared error.*shape \(32, 10\), got \(32,\)"):
        memtrace.estimate(_mlp(), X, target=torch.randn(32))


def test_max_batch_at_its_limit_says_larger_may_fit() -> None:
    with pytest.warns(memtrace.MemtraceWarning, match=r"limit=3 fits: .* larger batches may fit"):
        assert memtrace.max_batch(nn.Linear(4, 4), torch.randn(2, 4), limit=3) == 3


def test_replay_names_its_own_arguments_and_says_memsims_warnings(tmp_path: Path) -> None:
    est = memtrace.estimate(_mlp(), X, target=Y)
    text = est.trace_path.read_text()
    cut = tmp_path / "cut.jsonl"
    cut.write_text(text[: len(text) // 2])
    with pytest.warns(memtrace.MemtraceWarning, match="truncated"):
        memtrace.replay(cut, "a100-40gb")
    with pytest.raises(
        EstimateError, match=r"profile='a100-80gb': profile \"a100-80gb\" not found"
    ):
        memtrace.replay(est.trace_path, "a100-80gb")
    with pytest.raises(EstimateError, match=r"^profile=5: expected a non-empty name"):
        memtrace.replay(est.trace_path, 5)  # type: ignore[arg-type]


def test_a_model_that_fails_at_a_batch_says_the_batch() -> None:
    """BatchNorm cannot train on one sample: max_batch's first probe failed with PyTorch's words
    alone, and the CLI called it an internal error. A search that may go past batch 1 starts
    at 2 instead, and says so."""
    bn = nn.Sequential(nn.Linear(16, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 10))
    x, y = torch.randn(8, 16), torch.randint(0, 10, (8,))
    with pytest.raises(EstimateError, match=r"the model failed at batch 1: ValueError: Expected"):
        memtrace.max_batch(bn, x, target=y, limit=1)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        assert memtrace.max_batch(bn, x, target=y, limit=4) == 4
    starts = [str(w.message) for w in said if "the search starts at batch 2" in str(w.message)]
    assert starts and "fails at batch 1 (ValueError: Expected" in starts[0], said
    done = cli("max-batch", "--entry", "entry_example:batch_norm", "--limit", "1", check=False)
    assert done.returncode == 2 and "internal error" not in done.stderr, done.stderr
    assert "--entry 'entry_example:batch_norm': the model failed at batch 1" in done.stderr
    done = cli("max-batch", "--entry", "entry_example:batch_norm", "--limit", "4", "--json")
    assert json.loads(done.stdout)["max_batch"] == 4, done.stderr
    assert "the search starts at batch 2" in done.stderr, done.stderr


def test_inputs_a_gpu_would_refuse_and_compiled_models_are_said() -> None:
    with pytest.warns(memtrace.MemtraceWarning, match=r"example_inputs are torch.float64 and"):
        memtrace.estimate(_mlp(), X.double(), target=Y)
    with pytest.warns(memtrace.MemtraceWarning, match=r"torch.compile'd: its eager module"):
        compiled = memtrace.estimate(torch.compile(_mlp()), X, target=Y)
    assert compiled.device_mib == memtrace.estimate(_mlp(), X, target=Y).device_mib


def test_an_estimate_keeps_its_trace_while_a_copy_lives() -> None:
    """A deep copy asked again after the original was collected found no trace; a collected
    estimate gave a ResourceWarning. The trace is shared and removed with the last copy, or
    at close()."""
    import copy
    import gc

    est = memtrace.estimate(_mlp(), X, target=Y)
    path = est.trace_path
    twin = copy.deepcopy(est)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ResourceWarning)
        del est
        gc.collect()
        assert path.exists() and twin.fits() is True
        with twin:
            pass
    assert not path.exists()
    # Closed: asking again is an EstimateError that says so (it was a raw FileNotFoundError, or
    # memsim's "no such file"); the estimate's own verdict needs no trace.
    assert twin.fits() is True
    for ask in (lambda: twin.fits("h200"), lambda: twin.report(path.parent / "r.html"),
                lambda: twin.to_memory_viz(path.parent / "s.pickle")):  # fmt: skip
        with pytest.raises(memtrace.EstimateError, match="this estimate was closed"):
            ask()
    # Said before anything of the question: fits(gpu) of an estimate with a capacity of its
    # own warned that it judges the GPU's total, then raised.
    twin._capacity = "1GiB"
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with pytest.raises(memtrace.EstimateError, match="this estimate was closed"):
            twin.fits("h200")
    assert not seen, [str(w.message) for w in seen]


def test_to_memory_viz_writes_only_a_snapshot(tmp_path: Path) -> None:
    """A name that is not a pickle's was written as whatever `memsim convert` makes of it (a
    Perfetto trace for .json) under a docstring that promises a snapshot."""
    with memtrace.estimate(_mlp(), X, target=Y) as est:
        with pytest.raises(memtrace.EstimateError, match=r"ending in \.pickle or \.pkl"):
            est.to_memory_viz(tmp_path / "x.json")
        assert not (tmp_path / "x.json").exists()
        # What cannot be written is said of the path given: memsim's words named the estimate's
        # temporary trace (`writing X from /tmp/memtrace-.../symbolic.jsonl: ...`).
        (tmp_path / "d.pickle").mkdir()
        long_name = tmp_path / ("x" * 300 + ".pickle")
        for path, expect in [
            (tmp_path / "nodir" / "s.pickle", r"the folder \S*nodir does not exist$"),
            (tmp_path / "d.pickle", r"d\.pickle is a folder; expected a file name ending in"),
            (long_name, r"cannot write .*x\.pickle"),  # memsim's own refusal, reworded
        ]:
            with pytest.raises(memtrace.EstimateError, match=expect) as e:
                est.to_memory_viz(path)
            said = str(e.value)
            assert said.startswith(f"to_memory_viz({str(path)!r}): "), said
            assert str(est.trace_path.parent) not in said and "memsim" not in said, said
        # report() likewise: it said "memsim report failed (2)" of a missing folder.
        (tmp_path / "d.html").mkdir()
        for path, expect in [
            (tmp_path / "nodir" / "r.html", r"the folder \S*nodir does not exist$"),
            (tmp_path / "d.html", r"d\.html is a folder; expected a file name ending in \.html"),
        ]:
            with pytest.raises(memtrace.EstimateError, match=expect) as e:
                est.report(path)
            assert str(e.value).startswith(f"report({str(path)!r}): "), str(e.value)


def test_the_callers_modes_and_default_device_come_back_whatever_the_trace_did() -> None:
    """The caller's own torch-function mode keeps its place; a global default device of meta is
    set aside and comes back, after a failed estimate too; a step that sets its own default
    (`torch.set_default_device("cuda")`) failed with "trying to pop from empty mode stack"."""
    from torch.overrides import TorchFunctionMode, _get_current_function_mode_stack

    class Mine(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    def make(device: torch.device) -> Any:
        torch.set_default_device("cuda")
        model = nn.Linear(64, 64)
        x = torch.randn(16, 64)

        def step() -> None:
            model(x).sum().backward()

        return step

    plain = memtrace.estimate(_mlp(), X, target=Y)
    torch.set_default_device("meta")
    try:
        with Mine():
            before = _get_current_function_mode_stack()
            _same(memtrace.estimate(_mlp(), X, target=Y), plain)
            assert _get_current_function_mode_stack() == before
            with pytest.raises(EstimateError):
                memtrace.estimate(_mlp(), X, target=torch.randint(0, 10, (3,)))
            assert _get_current_function_mode_stack() == before
            assert memtrace.estimate(make, steps=1).allocated_mib > 0
            assert _get_current_function_mode_stack() == before
            assert torch.get_default_device().type == "meta"
    finally:
        torch.set_default_device(None)
    assert torch.get_default_device().type == "cpu"


def test_a_lazy_model_is_sized_by_its_first_forward_as_on_a_gpu() -> None:
    """A `LazyLinear`'s parameters were counted before its first forward (PyTorch refuses that),
    and moved to the tracer's device they became empty `Parameter`s its forward refused."""
    torch.manual_seed(0)

    def lazy() -> nn.Module:
        return nn.Sequential(nn.LazyConv2d(8, 3), nn.LazyBatchNorm2d(), nn.Flatten(),
                             nn.LazyLinear(10))  # fmt: skip

    def sized() -> nn.Module:
        return nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.Flatten(),
                             nn.Linear(8 * 14 * 14, 10))  # fmt: skip

    x = torch.randn(4, 3, 16, 16)
    model = lazy()
    for dtype in (None, "bf16"):
        got = memtrace.estimate(model, x, gpu="a100-40gb", dtype=dtype)
        want = memtrace.estimate(sized(), x, gpu="a100-40gb", dtype=dtype)
        assert got.breakdown == want.breakdown, (dtype, got.breakdown, want.breakdown)
    assert isinstance(model[3].weight, nn.parameter.UninitializedParameter)  # still the caller's


def test_a_step_count_given_is_not_called_a_default() -> None:
    x = torch.randn(4, 8)
    chosen = memtrace.estimate(nn.Linear(8, 2), x, steps=3).raw["inputs"]
    left = memtrace.estimate(nn.Linear(8, 2), x).raw["inputs"]
    assert chosen["iterations"] == 3 and "iterations" not in chosen["defaults"], chosen
    assert left["defaults"]["iterations"]["value"] == left["iterations"], left


def test_flags_are_said_as_keywords_only_where_the_page_says_what_to_do() -> None:
    """`Estimate.report()` rewords memsim's page: its headline, details and warnings, and there
    only a flag that starts a word (the whole page was rewritten, a title's `--lora` and a path's
    `exp--lora` with it)."""
    from memtrace.checks import as_keywords
    from memtrace.result import _in_keywords

    said = as_keywords("ResNet--step 3 at /data/exp--lora/t.jsonl; run with --profile h200: x")
    assert said == "ResNet--step 3 at /data/exp--lora/t.jsonl; run with gpu='h200': x"
    page = (
        "<title>mlp --lora 8</title><h1>mlp --lora 8</h1>"
        '<p id="headline" data-mib="1.0">needs 1.0 MiB: give --capacity</p>'
        '<p class="muted" id="details">capacity 2.0 MiB (--capacity)</p>'
        '<h2 id="warnings">Warnings</h2><ul><li>--lora 8: x</li></ul><p>--lora stays</p>'
    )
    assert _in_keywords(page) == (
        "<title>mlp --lora 8</title><h1>mlp --lora 8</h1>"
        '<p id="headline" data-mib="1.0">needs 1.0 MiB: give capacity</p>'
        '<p class="muted" id="details">capacity 2.0 MiB (given as capacity=)</p>'
        '<h2 id="warnings">Warnings</h2><ul><li>lora=8: x</li></ul><p>--lora stays</p>'
    )


@pytest.mark.parametrize(
    ("message", "said"),
    [
        # A value, with a colon after it or not, as the caller writes it: quoted where the
        # keyword takes a string (`gpu h200` was said, neither the flag nor the keyword).
        ("trace it again with --profile h200 to judge it", "estimate again with gpu='h200' to judge it"),
        ("--profile a100-40gb: not found", "gpu='a100-40gb': not found"),
        ("--profile /p/x.toml was read", "gpu='/p/x.toml' was read"),
        ("give --dtype bf16 or --amp bf16", "give dtype='bf16' or amp='bf16'"),
        ("--world-size 1: --strategy ddp at one rank", "world_size=1: strategy='ddp' at one rank"),
        ("give --attn sdpa or eager", "give attn='sdpa' or 'eager'"),
        ("for --strategy zero1, zero2 and zero3", "for strategy='zero1', 'zero2' and 'zero3'"),
        ("--strategy zero1, the rest", "strategy='zero1', the rest"),
        ("run with --point --capacity 1GiB", "run with point capacity='1GiB'"),
        ("--capacity 40GiB.", "capacity='40GiB'."),
        ("--lora 8: x", "lora=8: x"),
        ("--lora '8:16': x", "lora='8:16': x"),
        ("--reduce-bucket-size 5e8 x", "reduce_bucket_size=5e8 x"),
        ("--step make: raised", "model=make: raised"),
        # No value: the sentence goes on.
        ("--capacity without --profile: x", "capacity without gpu: x"),
        ("--world-size needs --strategy", "world_size needs strategy"),
        ("--qlora-double-quant has no meaning without --qlora", "qlora_double_quant has no meaning without qlora"),
        ("invalid value '40' for '--capacity <CAPACITY>': x", "invalid value '40' for 'capacity': x"),
        # Where a value came from: not the word it describes ("capacity 2.0 MiB (capacity)").
        ("capacity 2.0 MiB (--capacity); margin", "capacity 2.0 MiB (given as capacity=); margin"),
        ("(--point)", "(given as point=True)"),
        # `replay` names the profile as memsim does, and its caller traced the file themselves.
        ("replay: trace it again with --profile h200 to judge it",
         "replay: trace it again with profile='h200' to judge it"),
        # A value before a closing parenthesis and a colon ends at the parenthesis: it read
        # "(dtype='fp16)':".
        ("amp over fp16 trainable parameters (--dtype fp16): PyTorch's GradScaler",
         "amp over fp16 trainable parameters (dtype='fp16'): PyTorch's GradScaler"),
        # A size is one value with its unit: "capacity=81920.00 MiB" read as bytes and a word.
        ("--capacity 81920.00 MiB is more than the profile's GPU",
         "capacity='81920.00 MiB' is more than the profile's GPU"),
        ("--capacity 2.00 MiB: below the run's recorded peak", "capacity='2.00 MiB': below the run's recorded peak"),
        ("--reduce-bucket-size 500 MiB here", "reduce_bucket_size 500 MiB here"),
        # A list of a fixed choice's values ends at the first word that is not one.
        ("--dtype bf16 and 4 ranks", "dtype='bf16' and 4 ranks"),
        ("give --strategy zero3, or 8 ranks", "give strategy='zero3', or 8 ranks"),
    ],
)  # fmt: skip
def test_the_clis_words_are_said_as_the_caller_writes_them(message: str, said: str) -> None:
    from memtrace.api import REPLAY_KEYWORDS
    from memtrace.checks import KEYWORDS, as_keywords

    assert (
        as_keywords(message, REPLAY_KEYWORDS if message.startswith("replay:") else KEYWORDS) == said
    )


def test_no_warning_names_the_runs_temporary_files() -> None:
    """memest's notes on the layer features named `/tmp/memtrace-estimate-.../features.json`, a
    file gone after the run; they concern the baselines the API does not show, so they are kept
    in `to_json()` (by what the file held) and not warned of."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        est = memtrace.estimate(nn.Linear(4, 2), torch.randn(2, 4))
    said = [str(w.message) for w in seen]
    assert not [s for s in said if "memtrace-estimate-" in s or "layer features" in s], said
    kept = json.loads(est.to_json())["warnings"]
    assert any(w.startswith("the model's layer features: ") for w in kept), kept
    assert not [w for w in kept if "memtrace-estimate-" in w], kept


def test_memsims_words_reach_the_caller_as_keywords(tmp_path: Path) -> None:
    """fits(), replay() and report() passed memsim's flags through (`trace it again with
    --profile h200`, `--capacity without --profile`, `--html PATH: the folder ... does not
    exist`)."""
    est = memtrace.estimate(nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 2)), torch.randn(2, 4))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        est.fits("h200")
        memtrace.replay(est.trace_path, capacity="1GiB")
    said = [str(w.message) for w in seen]
    assert any("estimate again with gpu='h200' to judge it" in s for s in said), said
    assert any(s.startswith("capacity without profile:") for s in said), said
    assert not [s for s in said if "--" in s], said
    # The baselines the API does not run say so in its words, on the page as in to_json().
    page = est.report(tmp_path / "r.html").read_text()
    why = json.loads(est.to_json())["unavailable"]
    assert "give --memtracker" not in page and "--ml-model" not in page
    assert why["memtracker"].startswith("not run by the Python API"), why
    missing = tmp_path / "nodir" / "x.html"
    with pytest.raises(
        EstimateError, match=f"report\\('{missing}'\\): the folder .* does not exist"
    ) as e:
        est.report(missing)
    assert "--html" not in str(e.value)
