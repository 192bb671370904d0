"""What every synthetic model config shares: JSON form, stable id, validation."""

from __future__ import annotations

import abc
import dataclasses
import hashlib
import json
import typing
from typing import Any, ClassVar

from torch import nn

from memtrace_trainer.errors import UserError, constructed, is_integer, is_number

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
class Domain:
    """What a config field takes beyond its type: a number's least and greatest value (`below`:
    an upper end left out, as dropout's 1), or the names a string field takes."""

    least: float | None = None
    most: float | None = None
    below: float | None = None
    choices: tuple[str, ...] | None = None

    def admits(self, v: Any) -> bool:
        if self.choices is not None:
            return v in self.choices
        if v is None or isinstance(v, bool | str):
            return True  # the type decides
        return ((self.least is None or v >= self.least) and (self.most is None or v <= self.most)
                and (self.below is None or v < self.below))  # fmt: skip

    def words(self) -> str:
        """The values, after the type's words (`an integer` + ` >= 1`)."""
        if self.choices is not None:
            return f"one of {list(self.choices)}"
        if self.least is not None and self.below is not None:
            return f"in [{self.least:g}, {self.below:g})"
        if self.least is not None and self.most is not None:
            return f"in [{self.least:g}, {self.most:g}]"
        return f">= {self.least:g}" if self.least is not None else ""


def field(default: Any = dataclasses.MISSING, **domain: Any) -> Any:
    """A config field with its `Domain`: the one table of what each field of a family takes
    (its type from the annotation), checked by `field_problems` and by `sample`'s sweeps."""
    return dataclasses.field(default=default, metadata={"domain": Domain(**domain)})


def domain_of(f: dataclasses.Field) -> Domain:
    return f.metadata.get("domain", Domain())


_WORDS = {int: "an integer", float: "a number", bool: "true or false", str: "a string",
          type(None): "null"}  # fmt: skip


def accepts(hint: Any, value: Any) -> bool:
    """Whether `value` is of the annotated type: a bool is no integer or number (JSON's and
    YAML's `true`), an integer is a number."""
    if typing.get_args(hint):  # `int | None`
        return any(accepts(h, value) for h in typing.get_args(hint))
    checks = {int: is_integer, float: is_number, bool: lambda v: isinstance(v, bool),
              str: lambda v: isinstance(v, str), type(None): lambda v: v is None}  # fmt: skip
    return checks.get(hint, lambda _: True)(value)


def type_words(hint: Any) -> str:
    return " or ".join(_WORDS.get(h, str(h)) for h in (typing.get_args(hint) or (hint,)))


def expected(hint: Any, domain: Domain) -> str:
    """What a field takes, in words: `an integer >= 1`, `a number in [0, 1)`, `true or false`,
    `one of [...]`, `an integer >= 1 or null`."""
    if domain.choices is not None:
        return domain.words()
    kinds = typing.get_args(hint) or (hint,)
    words = [f"{_WORDS.get(h, str(h))} {domain.words()}".rstrip() if h in (int, float)
             else _WORDS.get(h, str(h)) for h in kinds]  # fmt: skip
    return " or ".join(words)


def shown(value: Any) -> str:
    """A value as the user wrote it: JSON's spelling (`true`, `"3"`, `null`)."""
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)


def field_problems(config: ModelConfig) -> list[str]:
    """Every field of `config` of the wrong type or outside its domain, named with what it
    takes; checked before any value is compared or built with."""
    hints = typing.get_type_hints(type(config))
    problems = []
    for f in dataclasses.fields(config):
        value, domain = getattr(config, f.name), domain_of(f)
        if not accepts(hints[f.name], value) or not domain.admits(value):
            problems.append(f"field {f.name!r} is {shown(value)}: "
                            f"expected {expected(hints[f.name], domain)}")  # fmt: skip
    return problems


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

    def problems(self) -> list[str]:
        """Reasons this config is infeasible; empty when it is valid. Each field's type and
        domain first (`field_problems`), then, when they hold, what the fields must be
        together."""
        return field_problems(self) or self.constraints()

    @abc.abstractmethod
    def constraints(self) -> list[str]:
        """What the fields, each of its type and domain, must be together (`gradual` narrows,
        heads divide the width); empty when they are."""

    def validate(self) -> None:
        problems = self.problems()
        if problems:
            raise InvalidConfig(
                f"invalid {self.family} config {self.to_json()}: " + "; ".join(problems)
            )

    def build(self) -> nn.Module:
        """The model, on the current default device; a config that is not valid is refused
        (`validate`) before any layer is made."""
        self.validate()
        return self._build()

    @abc.abstractmethod
    def _build(self) -> nn.Module:
        """The model of this config, validated."""

    @abc.abstractmethod
    def default_input_shape(self) -> tuple[int, ...]:
        """Per-sample input shape."""

    @abc.abstractmethod
    def classes(self) -> int:
        """Number of output classes (targets are drawn from this range)."""


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
    config = constructed(cls, data, f"{family} config", InvalidConfig)
    config.validate()
    if given_id is not None and given_id != config.id:
        from memtrace_trainer.notes import warn

        warn(f"{family} config field 'id' is {given_id!r}, not this config's id {config.id!r} "
             "(its fields were edited?): the id is ignored, the fields decide")  # fmt: skip
    return config
