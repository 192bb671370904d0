"""Rebuild the model of a GPUMemNet dataset row from its `Filename` column."""

from __future__ import annotations

import re
from typing import Any

from memtrace_trainer.models.cnn import CNNConfig
from memtrace_trainer.models.config import InvalidConfig, ModelConfig
from memtrace_trainer.models.mlp import MLPConfig

# Keys contain underscores and so do values (`leaky_relu`), so split on the known keys only.
_KEY = re.compile(
    r"(?:^|_)(input_channels|num_classes|base_filters|input_size|batchnorm|dropout|output|input"
    r"|depth|batch|arch|act):"
)


def parse_filename(name: str) -> list[tuple[str, str]]:
    """The (key, value) pairs of a row's Filename, in order (`dropout` appears twice)."""
    stem = name.strip()
    if stem.endswith(".out"):
        stem = stem[: -len(".out")]
    matches = list(_KEY.finditer(stem))
    if not matches or matches[0].start() != 0:
        raise InvalidConfig(
            f"GPUMemNet Filename {name!r}: expected `key:value` pairs joined by `_`, "
            "e.g. input:2346_output:197_depth:2_arch:pyramid_batch:996.out"
        )
    pairs = []
    for m, nxt in zip(matches, [*matches[1:], None], strict=True):
        end = nxt.start() if nxt else len(stem)
        pairs.append((m.group(1), stem[m.end() : end]))
    return pairs


# `--model gpumemnet:FILENAME` is the model alone (trainer/README.md): the batch in the Filename
# is a row's, which `--gpumemnet-row` (features, fake-tensor) takes and a model spec does not.
ROW_BATCH_UNUSED = ("a model spec is the model alone, built at the command's batch "
                    "(--batch-size, or a search's); `features --gpumemnet-row` and `fake-tensor "
                    "--gpumemnet-row` take a row's batch")  # fmt: skip


def row_batch(name: str, batch: int, given: int | None) -> int:
    """The batch a `--gpumemnet-row` runs at: `--batch-size` where given (checked as the flag),
    else the row's own field, refused by that name: `batch:0` was said as a `--batch-size 0`
    the user never gave."""
    if given is not None:
        return given
    if batch < 1:
        raise InvalidConfig(f"--gpumemnet-row {name}: its batch field is {batch}, expected a "
                            "positive integer (or give --batch-size N)")  # fmt: skip
    return batch


def filename_batch(spec: str | None) -> int | None:
    """The `batch:N` in the Filename of a `gpumemnet:FILENAME` model spec, which the spec does
    not use (`ROW_BATCH_UNUSED`); None for any other spec, or one whose batch is no integer (its
    build says why)."""
    source, _, name = (spec or "").partition(":")
    if source != "gpumemnet":
        return None
    try:
        return int(dict(parse_filename(name))["batch"])
    except (InvalidConfig, KeyError, ValueError):
        return None


def _int(name: str, fields: dict[str, str], key: str) -> int:
    if key not in fields:
        raise InvalidConfig(f"GPUMemNet Filename {name!r}: field {key!r} is missing")
    try:
        return int(fields[key])
    except ValueError:
        raise InvalidConfig(
            f"GPUMemNet Filename {name!r}: field {key!r} is {fields[key]!r}, expected an integer"
        ) from None


def _bool(name: str, value: str, key: str) -> bool:
    if value not in ("True", "False"):
        raise InvalidConfig(
            f"GPUMemNet Filename {name!r}: field {key!r} is {value!r}, expected True or False"
        )
    return value == "True"


def _extras(name: str, pairs: list[tuple[str, str]]) -> tuple[str, float, bool]:
    """Activation, dropout rate (0 when dropout is off) and batch norm of a second-sweep row."""
    fields = dict(pairs)
    act = fields.get("act", "relu")
    drops = [v for k, v in pairs if k == "dropout"]
    if not drops:
        return act, 0.0, False
    if len(drops) != 2:
        raise InvalidConfig(
            f"GPUMemNet Filename {name!r}: expected dropout:<rate>_dropout:<True|False>"
        )
    try:
        rate = float(drops[0])
    except ValueError:
        raise InvalidConfig(
            f"GPUMemNet Filename {name!r}: dropout rate {drops[0]!r} is not a number"
        ) from None
    used = _bool(name, drops[1], "dropout")
    bn = _bool(name, fields.get("batchnorm", "False"), "batchnorm")
    return act, rate if used else 0.0, bn


def from_gpumemnet_filename(
    name: str, dense_interval: int | None = None
) -> tuple[ModelConfig, int]:
    """The model config and batch size of a GPUMemNet row.

    Dense CNNs need `dense_interval`: the generator drew it at random and did not record it.
    """
    pairs = parse_filename(name)
    fields = dict(pairs)
    act, rate, bn = _extras(name, pairs)
    batch = _int(name, fields, "batch")

    def every_row() -> dict[str, Any]:
        """The fields an MLP row and a CNN row both carry, as both configs name them (read in
        each config's field order: a row missing several fields is told of the first)."""
        return {"depth": _int(name, fields, "depth"), "architecture": fields.get("arch", ""),
                "activation": act, "dropout": rate, "batchnorm": bn}  # fmt: skip

    config: ModelConfig
    if "input_channels" in fields:
        config = CNNConfig(
            input_channels=_int(name, fields, "input_channels"),
            num_classes=_int(name, fields, "num_classes"),
            **every_row(),
            base_filters=_int(name, fields, "base_filters"),
            input_size=_int(name, fields, "input_size"),
            dense_interval=dense_interval,
        )
    elif "input" in fields:
        config = MLPConfig(
            input_size=_int(name, fields, "input"),
            output_size=_int(name, fields, "output"),
            **every_row(),
            # The first sweep (no `act` field) ended in the bare Linear.
            head="act" in fields,
        )
    else:
        raise InvalidConfig(
            f"GPUMemNet Filename {name!r}: neither an MLP (input:) nor a CNN (input_channels:) row"
        )
    config.validate()
    return config, batch
