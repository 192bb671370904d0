"""`estimate`: every estimator's answer for one job, through `memest estimate`.

The trainer makes what the Rust side cannot (the symbolic trace, a plain-meta trace for the
FakeTensor baseline, the features) and memest turns them into answers; see estimators/README.md
for its contract.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from memtrace_trainer import notes
from memtrace_trainer.binaries import error_line, run_tool, tool_source
from memtrace_trainer.errors import UserError, nothing_on_the_gpu
from memtrace_trainer.features import extract
from memtrace_trainer.notes import warn
from memtrace_trainer.profile import Profile, load_profile
from memtrace_trainer.symtrace.step import StepConfig
from memtrace_trainer.symtrace.tracer import (
    Summary,
    trace_script,
    trace_step,
    trace_to_file,
    write_trace,
)
from memtrace_trainer.units import MIB
from memtrace_trainer.workload import Workload

SCHEMA = 3


# How a warning of memest's about the model's layer features (which feed the analytic and ML
# baselines) names them: the file it read is a temporary one.
FEATURES_WORDS = "the model's layer features"


def _answer(name: str, value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, dict) or not isinstance(value.get("device_mib"), int | float):
        raise UserError(
            f"memest estimate: field estimates.{name}.device_mib missing or not a number "
            "(expected the contract in estimators/README.md)"
        )


def parse_memest(text: str, with_features: bool = True) -> dict[str, Any]:
    """Checks memest's JSON against the schema-3 contract and returns all of it. Without
    features (a step function) the feature baselines may be null."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(f"memest estimate: output is not JSON ({e})") from None
    estimates = data.get("estimates") if isinstance(data, dict) else None
    if not isinstance(estimates, dict):
        raise UserError("memest estimate: output has no `estimates` object")
    if data.get("schema") != SCHEMA:
        raise UserError(
            f"memest estimate: field schema is {data.get('schema')!r}: expected {SCHEMA} "
            "(rebuild memest: cargo build --release)"
        )
    for name in ("symbolic", "horus") if with_features else ("symbolic",):
        if estimates.get(name) is None:
            why = data.get("unavailable", {}).get(name, "no reason given")
            raise UserError(f"memest estimate: estimates.{name} is missing ({why})")
    verdict = data.get("verdict")
    # A need no device holds has no number (memest writes null with the reason): the callers
    # here act on numbers, so they are told why there is none rather than given a null.
    if isinstance(verdict, dict) and verdict.get("need_unbounded") is not None:
        why = verdict["need_unbounded"]
        headline = (data.get("text") or {}).get("headline", "")
        raise UserError(
            f"memest estimate: no device holds this job (verdict.need_unbounded: {why}); {headline}"
        )
    for name, value in estimates.items():
        _answer(name, value)
    if not isinstance(verdict, dict) or not isinstance(verdict.get("fits"), bool):
        raise UserError("memest estimate: field verdict.fits missing (expected schema 3)")
    _text(data.get("text"))
    return data


def _iterations_default(job: Any, why: str) -> dict[str, Any]:
    """`iterations` among an answer's `defaults`, unless the caller chose the count
    (`job.steps_given`: a count the user gave is theirs, not a default)."""
    if getattr(job, "steps_given", False):
        return {}
    steps = job.step.iterations if isinstance(job, ModelJob) else job.steps
    return {"iterations": {"value": steps, "why": why}}


class ModelJob:
    """A model spec or `--entry`, run by the tracer's own loop (`StepConfig`)."""

    # Whether the caller chose the step count (`--steps`, `steps=`): set by whoever knows.
    steps_given = False

    def __init__(
        self, workload_for: Any, step: StepConfig, shape: dict[str, Any] | None = None
    ) -> None:
        """`shape`: the input-shape flags as given (`seq_len`, `input_shape`, `num_classes`);
        those given go into the answer's inputs (the ones left out show under `defaults`)."""
        self.workload_for, self.step = workload_for, step
        self.shape = {k: v for k, v in (shape or {}).items() if v is not None}
        self.first: Workload = workload_for()
        self.spec, self.batch_size = self.first.spec, self.first.batch_size
        # How the symbolic trace sharded the job, once it has run (`Summary.distributed`).
        self.sharded: dict[str, Any] | None = None

    def features(self) -> dict[str, Any]:
        with torch.device("meta"):
            feats = extract(self.first, self.first.family)
        # memest reads the layers in execution order from `sequence`.
        return {"model": self.spec, **feats.to_json()}

    def trace(self, prof: Profile, out: Path, emulate: bool, all_steps: bool = False) -> Summary:
        """The symbolic trace (`emulate`), or the plain one: one step unless `all_steps`."""
        s = self.step
        steps = s.iterations if emulate or all_steps else 1
        cfg = dataclasses.replace(s, iterations=steps, cuda_emulation=emulate)
        summary = trace_to_file(self.workload_for(), cfg, prof, out)
        if emulate:
            self.sharded = summary.distributed
        return summary

    def inputs(self) -> dict[str, Any]:
        s = self.step
        return {
            "batch_size": self.batch_size,
            **self.shape,
            **step_inputs(s),
            "iterations": s.iterations,
            "fine_tuning": self.first.details.get("fine_tuning"),
            "model_details": self.first.details,
            "distributed": _distributed(s, self.sharded),
            "defaults": {
                **self.first.defaults,
                **_iterations_default(self, "traced training iterations"),
            },
        }


def step_inputs(s: StepConfig) -> dict[str, Any]:
    """The tracer's loop as an answer's `inputs` name it (`estimate`, `max-batch`, `max-seq`)."""
    return {
        "optimizer": s.optimizer,
        "amp": s.amp or "fp32",
        "checkpointing": s.checkpointing,
        "grad_accum": s.grad_accum,
        "world_size": s.world_size,
        "strategy": s.strategy,
        "fsdp_mp": s.fsdp_mp,
    }


class StepJob:
    """A user's step function (`--step MOD:FN`): their loop, as written; no layer list, so the
    feature baselines are unavailable."""

    steps_given = False

    def __init__(
        self, spec: Any, steps: int, world_size: int | None = None, batch_size: int | None = None
    ) -> None:
        # `spec` is `package.module:function`, or the function itself (the Python API);
        # `batch_size` the second argument of `FN(device, batch_size)`.
        from memtrace_trainer.symtrace.userstep import step_label, step_name

        self.spec, self.steps, self.batch_size = f"step:{step_name(spec)}", steps, batch_size
        self.fn, self.world_size = spec, world_size
        # Messages name the step function as the tracer's do (`--step NAME`), not by `spec`.
        self.label = step_label(spec)

    def features(self) -> None:
        return None

    def trace(self, prof: Profile, out: Path, emulate: bool, all_steps: bool = False) -> Summary:
        steps = self.steps if emulate or all_steps else 1
        traced = trace_step(self.fn, steps, prof, emulate, self.batch_size, self.world_size)
        return write_trace(out, *traced)

    def inputs(self) -> dict[str, Any]:
        return {
            "step": self.spec.removeprefix("step:"),
            **({"batch_size": self.batch_size} if self.batch_size is not None else {}),
            "iterations": self.steps,
            "defaults": _iterations_default(self, "traced steps"),
        }


class ScriptJob:
    """An unmodified training script (`--script train.py -- ARGS`), run as written."""

    steps_given = False

    def __init__(
        self, path: Path, argv: list[str], steps: int, world_size: int | None = None
    ) -> None:
        self.path, self.argv, self.steps, self.batch_size = Path(path), argv, steps, None
        self.world_size = world_size
        self.spec = f"script:{path}" + "".join(f" {a}" for a in argv)

    def features(self) -> None:
        return None

    def trace(self, prof: Profile, out: Path, emulate: bool, all_steps: bool = False) -> Summary:
        steps = self.steps if emulate or all_steps else 1
        rec, meta = trace_script(self.path, self.argv, steps, prof, emulate, self.world_size)
        if steps == self.steps:
            self.ran = int(meta["iterations"])
        return write_trace(out, rec, meta)

    # The iterations the script ran, once traced: fewer than asked where it ended first.
    ran: int | None = None

    def inputs(self) -> dict[str, Any]:
        defaults = _iterations_default(self, "traced iterations")
        if self.ran is not None and self.ran < self.steps:
            # The count asked for did not shape the trace: the script's own end did (warned).
            defaults = {}
        return {
            "script": str(self.path),
            "args": self.argv,
            "iterations": self.ran if self.ran is not None else self.steps,
            **({"iterations_asked": self.steps} if (self.ran or self.steps) < self.steps else {}),
            "defaults": defaults,
        }


def estimate(
    workload_for: Any,
    step: StepConfig,
    profile: str,
    ml_model: Path | None,
    log: Any = None,
    capacity: str | None = None,
    point: bool = False,
) -> dict[str, Any]:
    """`workload_for()` builds a fresh meta workload (each trace consumes one)."""
    return estimate_job(ModelJob(workload_for, step), profile, ml_model, log, capacity, point)


def estimate_job(
    job: ModelJob | StepJob | ScriptJob,
    profile: str,
    ml_model: Path | None,
    log: Any = None,
    capacity: str | None = None,
    point: bool = False,
    with_memtracker: bool = False,
    report: Path | None = None,
    keep: Path | None = None,
    with_fake_tensor: bool = True,
) -> dict[str, Any]:
    """memest's schema-3 object for one job, whole, plus the job's inputs and warnings
    (and PyTorch's MemTracker beside the baselines when `with_memtracker`; the FakeTensor
    baseline, which runs the job a second time, unless not `with_fake_tensor`); with `report`, the
    HTML page of `memsim report` for the symbolic trace, with this estimate beside it; with
    `keep`, the symbolic trace is copied there."""
    memest = tool_source("memest")
    if log:
        log(f"memest: {memest.describe()}")
    prof = load_profile(profile, capacity)
    seconds: dict[str, float] = {}
    from_env = ml_model is None and bool(os.environ.get("MEMTRACE_ML_MODEL"))
    ml_model = ml_model or (Path(os.environ["MEMTRACE_ML_MODEL"]) if from_env else None)
    with tempfile.TemporaryDirectory(prefix="memtrace-estimate-") as tmp:
        d = Path(tmp)
        t = time.perf_counter()
        features = job.features()
        if features is not None:
            (d / "features.json").write_text(json.dumps(features))
        seconds["features"] = time.perf_counter() - t
        t = time.perf_counter()
        if job.trace(prof, d / "symbolic.jsonl", True).allocs == 0:
            raise nothing_on_the_gpu(getattr(job, "label", job.spec))
        seconds["trace_symbolic"] = time.perf_counter() - t
        t = time.perf_counter()
        # The baseline runs the job again (a step builder is called a second time).
        fake_why = (
            _plain_trace(job, prof, d / "plain.jsonl")
            if with_fake_tensor
            else "not run (--no-fake-tensor)"
        )
        seconds["trace_fake_tensor"] = time.perf_counter() - t
        cmd = ["estimate", "--trace", str(d / "symbolic.jsonl")]
        if features is not None:
            cmd += ["--features", str(d / "features.json")]
        if fake_why is None:
            cmd += ["--fake-trace", str(d / "plain.jsonl")]
        cmd += ["--profile", str(prof.path), "--json"]
        if capacity is not None:
            cmd.append(f"--capacity={capacity}")
        if point:
            cmd.append("--point")
        if ml_model is not None:
            cmd += ["--ml-model", str(ml_model)]
        t = time.perf_counter()
        done = run_tool("memest", cmd)
        seconds["memest"] = time.perf_counter() - t
        tracker, tracker_why = (
            None,
            (
                "not run: give --memtracker (PyTorch's MemTracker over the same steps costs 10-25x "
                "the symbolic trace)"
            ),
        )
        fsdp, fsdp_why = None, _fsdp_tracker_why(job, with_memtracker)
        if with_memtracker:
            t = time.perf_counter()
            tracker, tracker_why = _memtracker(job, prof, d / "memtracker.jsonl")
            seconds["memtracker"] = time.perf_counter() - t
            if fsdp_why == "":
                t = time.perf_counter()
                fsdp, fsdp_why = _memtracker(job, prof, d / "fsdp_memtracker.jsonl", fsdp=True)
                seconds["fsdp_memtracker"] = time.perf_counter() - t
        # memest exits 1 for "does not fit": an answer, not a failure.
        if done.returncode not in (0, 1):
            msg = error_line(done.stderr)
            if from_env:  # memest names its flag: the user set the variable, not --ml-model
                msg = msg.replace(f"--ml-model {ml_model}", f"$MEMTRACE_ML_MODEL={ml_model}")
            raise UserError(f"memest estimate failed ({done.returncode}): {msg}")
        result = parse_memest(done.stdout, features is not None)
        if fake_why is not None:
            result.setdefault("unavailable", {})["fake_tensor"] = fake_why
        result["estimates"]["memtracker"] = tracker
        if tracker is None:
            result.setdefault("unavailable", {})["memtracker"] = tracker_why
        if fsdp is not None:
            result["estimates"]["fsdp_memtracker"] = fsdp
        elif fsdp_why:
            result.setdefault("unavailable", {})["fsdp_memtracker"] = fsdp_why
        # Worded again now that the baselines above are in: memest words every estimate.
        result["text"] = words(result, d / "estimate.json")
        # memest names the files it read, which are this run's temporary ones, gone after it:
        # said by what they hold.
        held = {d / "features.json": FEATURES_WORDS, d / "symbolic.jsonl": "the symbolic trace",
                d / "plain.jsonl": "the FakeTensor baseline's trace"}  # fmt: skip
        for path, what in held.items():
            result["warnings"] = [w.replace(str(path), what) for w in result.get("warnings", [])]
        for w in result.get("warnings", []):
            warn(w)
        result["seconds"] = {
            **seconds,
            **{f"memest.{k}": v for k, v in result.get("seconds", {}).items()},
        }
        result["binary"] = {"memest": str(memest.path), "source": memest.source}
        result["profile_path"] = result.get("profile")
        result["profile"] = profile
        result["model"] = job.spec
        result["batch_size"] = job.batch_size
        result["inputs"] = job.inputs()
        if keep is not None:
            shutil.copyfile(d / "symbolic.jsonl", keep)
        if report is not None:
            t = time.perf_counter()
            result["report"] = str(write_report(d / "symbolic.jsonl", result, prof.path, report))
            result["seconds"]["report"] = time.perf_counter() - t
    result["warnings"] = notes.collected()
    return result


def _plain_trace(job: Any, prof: Profile, out: Path) -> str | None:
    """The FakeTensor-style baseline's trace (the job on the meta device as it is, no CUDA
    emulation); `None` when it ran, else why not. The estimate stands without it: code that
    runs on a GPU (a fused optimizer, whose kernels have no meta implementation) may fail
    there, after the tracer's own trace succeeded."""
    if isinstance(job, ScriptJob):
        # A script's side effects (its files, logs, outputs) would happen again.
        return ("not run for a script: it would run the script a second time; a step function "
                "(--step) gets it")  # fmt: skip
    try:
        job.trace(prof, out, False)
    except UserError as e:
        first = str(e).splitlines()[0]
        return (
            f"the job fails on the plain meta device, as PyTorch's FakeTensor mode runs it: {first}"
        )
    return None


def write_report(trace: Path, result: dict[str, Any], profile: Path, out: Path) -> Path:
    """`memsim report` of the symbolic trace, with the estimate beside it, as one HTML page
    (`estimate --report`, `memtrace.Estimate.report`)."""
    est = trace.parent / "estimate.json"
    est.write_text(json.dumps(result))
    # `--flag=value` and `--` before the trace: a name that begins with `-` is a name.
    cmd = ["report", f"--html={out}", f"--estimate={est}", f"--profile={profile}",
           f"--title={result.get('model')}"]  # fmt: skip
    if judged_on_point(result):
        cmd.append("--point")  # the page's verdicts judge what the estimate judged
    verdict = result.get("verdict", {})
    if verdict.get("capacity_source") == "flag":
        # The table judges the device the headline judged (MiB of whole bytes are exact).
        cmd.append(f"--capacity={round(verdict['capacity_mib'] * MIB)}B")
    cmd += ["--", str(trace)]
    done = run_tool("memsim", cmd)
    if done.returncode != 0:
        raise UserError(f"--report {out}: memsim report failed ({done.returncode}): "
                        f"{error_line(done.stderr)}")  # fmt: skip
    return out


def _distributed(s: StepConfig, sharded: dict[str, Any] | None) -> dict[str, Any] | None:
    """What the output says of a sharded job: the rank traced and how the strategy runs, as
    the trace ran it (`sharded`, which says more: DeepSpeed's 16-bit mode) when it has run."""
    if s.strategy is None:
        return None
    from memtrace_trainer.symtrace.distributed import describe

    said = describe(s.strategy)
    told = {k: (sharded or said).get(k, v) for k, v in said.items()}
    # What the trace stored otherwise than the job asked (QLoRA's 4-bit weights as bf16).
    # ... and DeepSpeed's reduce buffer as the trace allocated it (ZeRO strategies).
    for key in ("quant_storage", "reduce_bucket"):
        if sharded and key in sharded:
            told[key] = sharded[key]
    return {"rank": 0, **told}


def _fsdp_tracker_why(job: Any, asked: bool) -> str | None:
    """Why FSDPMemTracker does not run beside a job ("" when it does, None when the job is not
    FSDP-sharded and the baseline does not apply): it is FSDP2's own baseline, so it runs for
    the FSDP2 family, on the tracer's loop, which hands it the root module and the
    optimizer."""
    strategy = getattr(getattr(job, "step", None), "strategy", None)
    if strategy is None:
        return None
    from memtrace_trainer.symtrace.distributed import runs_as

    if runs_as(strategy)[0] != "fsdp2":
        return None
    if not asked:
        return "not run: give --memtracker (FSDPMemTracker runs beside MemTracker)"
    if not isinstance(job, ModelJob):
        return ("not run: FSDPMemTracker needs the root module and optimizer, which a --step "
                "or --script makes itself")  # fmt: skip
    return ""


def _memtracker(
    job: Any, prof: Profile, out: Path, fsdp: bool = False
) -> tuple[dict[str, Any] | None, str]:
    """PyTorch's MemTracker (or, with `fsdp`, its FSDPMemTracker) over the job's plain trace,
    all its steps; when the tracker itself fails, the baseline is unavailable with its error
    (the estimate goes on)."""
    from memtrace_trainer.baselines import fsdp_memtracker, memtracker

    name = "FSDPMemTracker" if fsdp else "MemTracker"
    track = fsdp_memtracker if fsdp else memtracker
    try:
        return track(lambda: job.trace(prof, out, False, all_steps=True)), ""
    except UserError:
        raise
    except Exception as e:  # the tracker's own limits, e.g. a module it cannot hook
        return None, f"PyTorch's {name} raised {type(e).__name__}: {e}"


def words(result: dict[str, Any], scratch: Path) -> dict[str, Any]:
    """memest's words for an estimate (`memest render --json`): its headline, verdict, detail and
    baseline lines, which every view of the estimate joins (`render`, `memtrace.Estimate`, the
    HTML report)."""
    scratch.write_text(json.dumps(result))
    done = run_tool("memest", ["render", str(scratch), "--json"])
    if done.returncode != 0:
        # The JSON is this program's own, not the user's input: a fault here is an internal one
        # (`serve` answers 500, the CLI says "internal error").
        raise RuntimeError(f"memest render failed ({done.returncode}): {error_line(done.stderr)}")
    return _text(json.loads(done.stdout))


def _text(t: Any) -> dict[str, Any]:
    ok = (
        isinstance(t, dict)
        and all(isinstance(t.get(k), str) for k in ("headline", "verdict"))
        and all(isinstance(t.get(k), list) for k in ("details", "baselines"))
    )
    if not ok:
        raise UserError("memest: field text: expected {headline, verdict, details, baselines} "
                        "(rebuild memest: cargo build --release)")  # fmt: skip
    return t


def judged_on_point(result: dict[str, Any]) -> bool:
    """Whether the estimate's verdict judged the point estimate (`--point`), not the safe
    number: its `verdict.basis` says."""
    return bool(result["verdict"]["basis"].endswith(".device_mib"))


def sentence(text: dict[str, Any]) -> str:
    """The first line of an estimate: memest's headline and its verdict."""
    return f"{text['headline']}: {text['verdict']}"


def capacity_beside(verdict: dict[str, Any]) -> str:
    """What `memtrace.Estimate` prints beside its first line: the capacity judged when it is not
    the GPU's total memory (`capacity=`), since a verdict of DOES NOT FIT beside a need far below
    the GPU's memory reads as a contradiction. The CLI's text has it on its next line already
    (memest's words), so its first line stays memest's headline."""
    if verdict.get("capacity_source") != "flag":
        return ""
    _, capacity = need_and_capacity_mib(verdict["need_mib"], verdict["capacity_mib"])
    return f" (capacity {capacity})"


def need_and_capacity_mib(need_mib: float, capacity_mib: float) -> tuple[str, str]:
    """A need and a capacity as the headline prints them (MiB, one decimal), or both in bytes
    when those would print alike but differ: memsim's `units::need_and_capacity_mib`, so the
    capacity beside the verdict never reads as the need the verdict refused."""

    def as_mib(m: float) -> str:
        return f"{m:.1f} MiB"

    need, cap = round(need_mib * MIB), round(capacity_mib * MIB)
    if as_mib(need / MIB) == as_mib(cap / MIB) and need != cap:
        return f"{need} B", f"{cap} B"
    return as_mib(need / MIB), as_mib(cap / MIB)


def render(result: dict[str, Any]) -> str:
    """memest's words for the estimate (the verdict on the headline number first, then the
    baselines, each with what it ignores), with the job's own lines between."""
    t = result["text"]
    batch = result.get("batch_size")
    at_batch = f" at batch {batch}" if batch is not None else ""
    lines = [
        sentence(t),
        *t["details"],
        f"  job: {result['model']}{at_batch}",
        *_model_lines(result.get("inputs", {}).get("model_details")),
        *_rank_lines(result.get("inputs", {})),
        f"  (memest: {result['binary']['memest']}, from {result['binary']['source']})",
        *t["baselines"],
    ]
    return "\n".join(lines)


def _model_lines(details: dict[str, Any] | None) -> list[str]:
    if not details or "parameters" not in details:
        return []
    task = f", task {details['task']}, attention {details['attn']}" if "task" in details else ""
    return [
        f"  model: {details['parameters']:,} parameters ({details['parameter_bytes'] / MIB:.1f} "
        f"MiB), {details['trainable_parameters']:,} trainable{task}"
    ]


def _rank_lines(inputs: dict[str, Any]) -> list[str]:
    d = inputs.get("distributed")
    if not d:
        return []
    lines = [f"  per GPU: rank 0 of {inputs['world_size']} ({inputs['strategy']}); {d['ranks']}"]
    if d.get("equivalence"):
        lines.append(f"  emulated: {d['equivalence']}")
    return lines
