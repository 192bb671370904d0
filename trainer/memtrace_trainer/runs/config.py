"""One run's configuration: what `run` trains, what `launch` puts in its manifest."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
from typing import Any

from memtrace_trainer.dtypes import AMP
from memtrace_trainer.errors import UserError, constructed, is_integer, is_number
from memtrace_trainer.optim import EMULATED, OPTIMIZERS
from memtrace_trainer.symtrace.checkpointing import CHECKPOINTING

DEVICES = ("auto", "cuda", "cpu")


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """A training job on synthetic data. `seconds`, when set, replaces `iterations` as the
    stopping rule (at least two iterations run, so a steady-state step time exists)."""

    model: str | None = None
    entry: str | None = None
    # None: an entry function without a `batch_size` parameter, whose own batch is the job's
    # (`errors.require_batch_size`); a model has none of its own, and a run of one is refused.
    batch_size: int | None = None
    input_shape: str | None = None
    seq_len: int | None = None
    # None: the model's own (ImageNet's 1000 for image models, transformers' 2 for a Hugging
    # Face classifier), as `estimate` takes it; a number for a generator config was said to have
    # no effect on every run, given or not.
    num_classes: int | None = None
    optimizer: str = "adam"
    iterations: int = 10
    seconds: float | None = None
    amp: str | None = None
    checkpointing: bool = False
    grad_accum: int = 1
    device: str = "auto"
    profile: str | None = None
    nvml_hz: float = 20.0

    def problems(self) -> list[str]:
        out = []
        if (self.model is None) == (self.entry is None):
            out.append("exactly one of model or entry is required")
        elif self.model is not None and self.batch_size is None:
            out.append("batch_size null: expected an integer of at least 1 (a model has no "
                       "batch of its own)")  # fmt: skip
        for f in dataclasses.fields(self):
            problem = field_problem(f.name, getattr(self, f.name))
            if problem:
                out.append(problem)
        return out

    def validate(self, source: str = "run config") -> None:
        problems = self.problems()
        if problems:
            raise UserError(f"{source}: " + "; ".join(problems))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def id(self) -> str:
        """Stable: a readable slug of the model and batch, then a hash of the whole config."""
        fields = self.to_dict()
        if fields["num_classes"] is None:
            # Hashed as the count the model is built with, so that a null and that count are
            # one job with one id, and a Hugging Face classifier's null (2 classes) is not taken
            # for a run of 1000. Ids written when null hashed as 1000 stay what they were for
            # every other model (1000 is their default, or they read no count: a language model).
            from memtrace_trainer.models.zoo import default_num_classes

            fields["num_classes"] = default_num_classes(self.model or "")
        canon = json.dumps(fields, sort_keys=True, separators=(",", ":"))
        digest = hashlib.sha256(canon.encode()).hexdigest()[:12]
        what = self.model or self.entry or "run"
        source, _, name = what.partition(":")
        if source == "synthetic":
            fam = re.search(r'"family"\s*:\s*"(\w+)"', name)
            what = f"synthetic-{fam.group(1) if fam else 'model'}"
        slug = re.sub(r"[^A-Za-z0-9]+", "-", what).strip("-")[:40]
        batch = "" if self.batch_size is None else f"-b{self.batch_size}"  # an entry's own
        return f"{slug}{batch}-{digest}"

    @staticmethod
    def from_dict(data: dict[str, Any], source: str) -> RunConfig:
        names = {f.name for f in dataclasses.fields(RunConfig)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise UserError(f"{source}: unknown fields {unknown}; expected {sorted(names)}")
        cfg = constructed(RunConfig, data, source)
        cfg.validate(source)
        return cfg


# The settings drawn from numbers (a sweep's `{min, max}`), and whether they take integers.
NUMERIC = {"batch_size": int, "iterations": int, "grad_accum": int, "seq_len": int,
           "num_classes": int, "seconds": float, "nvml_hz": float}  # fmt: skip


def field_problem(name: str, value: Any) -> str | None:
    """What is wrong with `value` for the setting `name`, or None: one check per setting, so a
    sweep checks every choice of a setting up front, not only the values it happens to draw."""
    if name in ("model", "entry", "input_shape", "profile") and value is not None:
        if not isinstance(value, str) or not value:
            what = {
                "model": "a model spec",
                "entry": "package.module:function",
                "input_shape": "a shape C,H,W",
                "profile": "a GPU profile name",
            }[name]
            return f"{name} {value!r}: expected {what} (a string) or null"
    elif name in ("iterations", "grad_accum") or (
        name in ("batch_size", "seq_len", "num_classes") and value is not None
    ):
        if not is_integer(value):
            return f"{name} {value!r}: expected an integer of at least 1"
        if value < 1:
            return f"{name} {value!r}: expected at least 1"
    elif name == "optimizer":
        if not isinstance(value, str) or value not in OPTIMIZERS:
            return f"optimizer {value!r}: expected one of {OPTIMIZERS}"
        if value in EMULATED:
            return (f"optimizer {value!r}: its bitsandbytes kernels are emulated for estimates "
                    "only; real runs support the PyTorch and transformers ones")  # fmt: skip
    elif name == "seconds" and value is not None:
        # inf trained forever, and a sweep's run never finished.
        if not (is_number(value) and 0 < value < math.inf):
            return f"seconds {value!r}: expected a positive number (finite)"
    elif name == "amp" and value is not None:
        if not isinstance(value, str) or value not in AMP:
            return f"amp {value!r}: expected one of {sorted(AMP)} or null"
    elif name == "checkpointing":
        # `run --checkpointing` records true ("full"); a string mode reaches the same switch.
        if not isinstance(value, bool) and value not in CHECKPOINTING:
            return f"checkpointing {value!r}: expected true, false or one of {list(CHECKPOINTING)}"
    elif name == "device":
        if not isinstance(value, str) or value not in DEVICES:
            return f"device {value!r}: expected one of {DEVICES}"
    elif name == "nvml_hz":
        # inf sampled with no pause between reads, a core spinning beside the run.
        if not (is_number(value) and 10 <= value < math.inf):
            return f"nvml_hz {value!r}: expected at least 10 (samples per second, finite)"
    return None
