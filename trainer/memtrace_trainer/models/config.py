"""What every synthetic model config shares: JSON form, stable id, validation."""

from __future__ import annotations

import abc
import dataclasses
import hashlib
import json
from typing import Any, ClassVar

from torch import nn

from memtrace_trainer.errors import UserError

# GPUMemNet's spellings (its filenames use these keys) mapped to the module classes it used.
ACTIVATIONS: dict[str, type[nn.Module]] = {
    "relu": nn.ReLU,
    "leaky_relu": nn.LeakyReLU,
    "prelu": nn.PReLU,
    "elu": nn.ELU,
    "selu": nn.SELU,
    "gelu": nn.GELU,
    "tanh": nn.Tanh,
    "swish": nn.SiLU,
    "softplus": nn.Softplus,
    "mish": nn.Mish,
    "identity": nn.Identity,
    "sigmoid": nn.Sigmoid,
}


class InvalidConfig(UserError):
    """A config that cannot be built; the message gives the reason."""


@dataclasses.dataclass(frozen=True)
class ModelConfig(abc.ABC):
    """Base of the synthetic families: subclasses set `family`, implement the abstract methods."""

    family: ClassVar[str] = ""

    def to_dict(self) -> dict[str, Any]:
        return {"family": self.family, **dataclasses.asdict(self)}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @property
    def id(self) -> str:
        """Stable across processes and versions of Python: a hash of the canonical JSON."""
        return f"{self.family}-{hashlib.sha256(self.to_json().encode()).hexdigest()[:12]}"

    @abc.abstractmethod
    def problems(self) -> list[str]:
        """Reasons this config is infeasible; empty when it is valid."""

    def validate(self) -> None:
        problems = self.problems()
        if problems:
            raise InvalidConfig(
                f"invalid {self.family} config {self.to_json()}: " + "; ".join(problems)
            )

    @abc.abstractmethod
    def build(self) -> nn.Module:
        """The model, on the current default device."""

    @abc.abstractmethod
    def default_input_shape(self) -> tuple[int, ...]:
        """Per-sample input shape."""

    @abc.abstractmethod
    def classes(self) -> int:
        """Number of output classes (targets are drawn from this range)."""


def layer_problems(
    architecture: str, architectures: tuple[str, ...], act: str, dropout: float
) -> list[str]:
    """The checks GPUMemNet's MLP and CNN generators share, in the order their configs report
    them."""
    p = []
    if architecture not in architectures:
        p.append(f"architecture {architecture!r} not in {architectures}")
    if act not in ACTIVATIONS:
        p.append(f"activation {act!r} not in {sorted(ACTIVATIONS)}")
    if not 0.0 <= dropout < 1.0:
        p.append(f"dropout {dropout} outside [0, 1)")
    return p


def activation(name: str) -> nn.Module:
    if name not in ACTIVATIONS:
        raise InvalidConfig(f"unknown activation {name!r}: expected one of {sorted(ACTIVATIONS)}")
    return ACTIVATIONS[name]()


def families() -> dict[str, type[ModelConfig]]:
    """The config class of each synthetic family, by its name."""
    from memtrace_trainer.models.cnn import CNNConfig
    from memtrace_trainer.models.mlp import MLPConfig
    from memtrace_trainer.models.transformer import TransformerConfig

    return {c.family: c for c in (MLPConfig, CNNConfig, TransformerConfig)}


def missing_fields(cls: type, given: Any) -> list[str]:
    """The fields of the config class `cls` that have no default and are not in `given`: what
    `sample` and a `synthetic:` spec both say a config needs."""
    unset = dataclasses.MISSING
    return [f.name for f in dataclasses.fields(cls)
            if f.name not in given and unset is f.default is f.default_factory]  # fmt: skip


def from_dict(data: dict[str, Any]) -> ModelConfig:
    """Inverse of `ModelConfig.to_dict`, with the family choosing the class."""
    classes = families()
    data = dict(data)
    family = data.pop("family", None)
    if family not in classes:
        raise InvalidConfig(
            f"config field 'family' is {family!r}: expected one of {sorted(classes)}"
        )
    cls = classes[family]
    # `sample` prints each config with its id; taking that line back is the config itself.
    given_id = data.pop("id", None)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise InvalidConfig(
            f"{family} config has unknown fields {unknown}: expected {sorted(names)}"
        )
    missing = missing_fields(cls, data)
    if missing:
        # Python's words named its constructor (`MLPConfig.__init__() missing 1 required ...`).
        raise InvalidConfig(f"{family} config needs {missing} (no default)")
    try:
        config = cls(**data)
    except TypeError as e:
        raise InvalidConfig(f"{family} config: {e}") from None
    config.validate()
    if given_id is not None and given_id != config.id:
        from memtrace_trainer.notes import warn

        warn(f"{family} config field 'id' is {given_id!r}, not this config's id {config.id!r} "
             "(its fields were edited?): the id is ignored, the fields decide")  # fmt: skip
    return config
