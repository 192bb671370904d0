"""YAML sweep files: ranges per field and a count; uniform, seeded sampling.

family: mlp            # mlp | cnn | transformer
count: 100
seed: 99
fields:
  input_size: {min: 4, max: 4096}        # integers, both ends included
  dropout: {min: 0.1, max: 0.5}          # floats when either end is a float
  architecture: [pyramid, uniform]       # a list: uniform choice
  output_size: {min: 1, max_ratio: 0.25, of: input_size}   # up to ratio x another field
  batchnorm: true                        # anything else: fixed
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import yaml

from memtrace_trainer.errors import UserError
from memtrace_trainer.models.config import InvalidConfig, ModelConfig, from_dict
from memtrace_trainer.notes import warn

MAX_REJECTIONS = 100


def draw(rng: random.Random, spec: Any, drawn: dict[str, Any], where: str) -> Any:
    if isinstance(spec, list):
        if not spec:
            raise UserError(f"{where}: empty choice list")
        return spec[rng.randrange(len(spec))]
    if isinstance(spec, dict) and "min" in spec:
        lo = spec["min"]
        if "max_ratio" in spec:
            ref = spec.get("of")
            if ref not in drawn:
                raise UserError(f"{where}: 'of' must name a field listed before it")
            hi: Any = max(lo, int(drawn[ref] * spec["max_ratio"]))
        else:
            hi = spec.get("max")
        if not isinstance(lo, int | float) or not isinstance(hi, int | float) or hi < lo:
            raise UserError(f"{where}: expected numbers with min <= max, got {spec}")
        if isinstance(lo, float) or isinstance(hi, float):
            return rng.uniform(lo, hi)
        return rng.randint(lo, hi)
    return spec


def sample(sweep: dict[str, Any], source: str, seed: int | None = None) -> list[ModelConfig]:
    """`count` valid configs; infeasible draws are rejected (and redrawn) with their reason
    kept for the error if too many in a row fail."""
    for key in ("family", "count", "fields"):
        if key not in sweep:
            raise UserError(f"{source}: missing field {key!r}")
    count = sweep["count"]
    if not isinstance(count, int) or count < 0:
        raise UserError(f"{source}: field 'count' is {count!r}: expected an integer >= 0")
    fields = sweep["fields"]
    if not isinstance(fields, dict):
        raise UserError(f"{source}: field 'fields' must be a mapping of field -> range")
    rng = random.Random(sweep.get("seed", 0) if seed is None else seed)
    configs: list[ModelConfig] = []
    rejected = 0
    while len(configs) < count:
        drawn: dict[str, Any] = {}
        for name, spec in fields.items():
            drawn[name] = draw(rng, spec, drawn, f"{source}: field {name!r}")
        try:
            configs.append(from_dict({"family": sweep["family"], **drawn}))
            rejected = 0
        except InvalidConfig as e:
            rejected += 1
            if rejected >= MAX_REJECTIONS:
                raise UserError(
                    f"{source}: {MAX_REJECTIONS} draws in a row were infeasible; last: {e}"
                ) from None
    return configs


def read_sweep(path: Path) -> dict[str, Any]:
    """The top-level mapping of a YAML sweep file (`sample`'s and `launch`'s)."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as e:
        raise UserError(f"sweep file {path}: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise UserError(f"sweep file {path}: not valid YAML ({e})") from None
    if not isinstance(data, dict):
        raise UserError(f"sweep file {path}: expected a mapping at the top level")
    return data


def sample_file(path: Path, seed: int | None = None) -> list[ModelConfig]:
    data = read_sweep(path)
    launch_only = sorted(set(data) & {"models", "batch_sizes", "run", "trace"})
    unknown = sorted(set(data) - {"family", "count", "seed", "fields", *launch_only})
    if unknown:
        raise UserError(f"{path}: unknown top-level fields {unknown}; expected family, count, "
                        "seed and fields")  # fmt: skip
    if launch_only:
        warn(f"{path}: {', '.join(launch_only)} have no effect on sample, which draws generator "
             "configs only (launch reads them)")  # fmt: skip
    return sample(data, str(path), seed)
