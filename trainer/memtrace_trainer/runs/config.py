"""One run's configuration: what `run` trains, what `launch` puts in its manifest."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from typing import Any

from memtrace_trainer.errors import UserError, is_integer, is_number
from memtrace_trainer.optim import EMULATED, OPTIMIZERS
from memtrace_trainer.symtrace.step import AMP

DEVICES = ("auto", "cuda", "cpu")


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """A training job on synthetic data. `seconds`, when set, replaces `iterations` as the
    stopping rule (at least two iterations run, so a steady-state step time exists)."""

    model: str | None = None
    entry: str | None = None
    batch_size: int = 1
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
        if not is_integer(self.batch_size) or self.batch_size < 1:
            out.append(f"batch_size {self.batch_size!r}: expected a positive integer")
        if self.optimizer not in OPTIMIZERS:
            out.append(f"optimizer {self.optimizer!r}: expected one of {OPTIMIZERS}")
        elif self.optimizer in EMULATED:
            out.append(
                f"optimizer {self.optimizer!r}: its bitsandbytes kernels are emulated for "
                "estimates only; real runs support the PyTorch and transformers ones"
            )
        if not is_integer(self.iterations) or self.iterations < 1:
            out.append(f"iterations {self.iterations!r}: expected at least 1")
        if self.seconds is not None and not (is_number(self.seconds) and self.seconds > 0):
            out.append(f"seconds {self.seconds!r}: expected a positive number")
        if self.amp is not None and self.amp not in AMP:
            out.append(f"amp {self.amp!r}: expected one of {sorted(AMP)}")
        if not is_integer(self.grad_accum) or self.grad_accum < 1:
            out.append(f"grad_accum {self.grad_accum!r}: expected at least 1")
        if self.device not in DEVICES:
            out.append(f"device {self.device!r}: expected one of {DEVICES}")
        if not (is_number(self.nvml_hz) and self.nvml_hz >= 10):
            out.append(f"nvml_hz {self.nvml_hz!r}: expected at least 10 (samples per second)")
        if self.num_classes is not None and (
            not is_integer(self.num_classes) or self.num_classes < 1
        ):
            out.append(f"num_classes {self.num_classes!r}: expected a positive integer")
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
        return f"{slug}-b{self.batch_size}-{digest}"

    @staticmethod
    def from_dict(data: dict[str, Any], source: str) -> RunConfig:
        names = {f.name for f in dataclasses.fields(RunConfig)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise UserError(f"{source}: unknown fields {unknown}; expected {sorted(names)}")
        try:
            cfg = RunConfig(**data)
        except TypeError as e:
            raise UserError(f"{source}: {e}") from None
        cfg.validate(source)
        return cfg
