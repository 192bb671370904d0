"""YAML sweep files: ranges per field and a count; uniform, seeded sampling.

family: mlp            # mlp | cnn | transformer
count: 100
seed: 99
fields:
  input_size: {min: 4, max: 4096}        # integers, both ends included
  base_filters: {min: 8, max: 64, step: 8}   # every step-th value from min: 8, 16, ..., 64
  dropout: {min: 0.1, max: 0.5}          # floats when either end is a float
  architecture: [pyramid, uniform]       # a list: uniform choice
  output_size: {min: 1, max_ratio: 0.25, of: input_size}   # up to ratio x another field
  batchnorm: true                        # anything else: fixed
"""

from __future__ import annotations

import dataclasses
import math
import random
import typing
from pathlib import Path
from typing import Any

import yaml

from memtrace_trainer.errors import UserError, is_integer, is_number, read_text
from memtrace_trainer.models.config import (
    InvalidConfig,
    ModelConfig,
    accepts,
    domain_of,
    families,
    from_dict,
    missing_fields,
    type_words,
)
from memtrace_trainer.notes import warn

MAX_REJECTIONS = 100
RANGE_KEYS = ("min", "max", "step", "max_ratio", "of")
RANGE_FORMS = "{min, max[, step]} or {min, max_ratio, of[, step]}"


def check_range(spec: dict[str, Any], where: str) -> None:
    """A range's own shape, whatever field it is for; a mapping is always a range (a fixed
    mapping was handed on as a value and failed far from the sweep file)."""
    unknown = sorted(set(spec) - set(RANGE_KEYS), key=str)
    if unknown:
        raise UserError(f"{where}: unknown range keys {unknown}: expected {RANGE_FORMS}")
    if "min" not in spec or ("max" in spec) == ("max_ratio" in spec):
        raise UserError(f"{where}: {spec} is not a range: expected {RANGE_FORMS}")
    if ("of" in spec) != ("max_ratio" in spec):
        raise UserError(f"{where}: max_ratio and of go together: expected {RANGE_FORMS}")
    ends = [spec["min"], spec.get("max", spec.get("max_ratio"))]
    if not all(is_number(v) for v in ends):
        raise UserError(f"{where}: expected numbers for min and max (or max_ratio), got {spec}")
    if "max" in spec and spec["max"] < spec["min"]:
        raise UserError(f"{where}: expected min <= max, got {spec}")
    if "max_ratio" in spec and spec["max_ratio"] <= 0:
        raise UserError(f"{where}: max_ratio {spec['max_ratio']!r}: expected a positive number")
    step = spec.get("step")
    if step is not None and not (is_number(step) and step > 0):
        raise UserError(f"{where}: step {step!r}: expected a positive number")


def draw(rng: random.Random, spec: Any, drawn: dict[str, Any], where: str) -> Any:
    if isinstance(spec, list):
        if not spec:
            raise UserError(f"{where}: empty choice list")
        return spec[rng.randrange(len(spec))]
    if not isinstance(spec, dict):
        return spec
    check_range(spec, where)
    lo, step = spec["min"], spec.get("step")
    if "max_ratio" in spec:
        ref = spec["of"]
        if ref not in drawn:
            raise UserError(f"{where}: 'of' must name a field listed before it")
        if not is_number(drawn[ref]):
            raise UserError(f"{where}: 'of' names {ref!r}, whose value {drawn[ref]!r} is not "
                            "a number")  # fmt: skip
        hi: Any = max(lo, int(drawn[ref] * spec["max_ratio"]))
    else:
        hi = spec["max"]
    floats = any(isinstance(v, float) for v in (lo, hi, step))
    if step is not None:
        # Both ends included when max is a whole number of steps from min.
        return lo + step * rng.randint(0, math.floor((hi - lo) / step + 1e-9))
    return rng.uniform(lo, hi) if floats else rng.randint(lo, hi)


def _check_value(value: Any, hint: Any, choices: tuple[Any, ...] | None, where: str) -> None:
    # A fixed value or a choice is checked for its type and names here; a number outside its
    # domain (`depth: 0`) is an infeasible draw, whose reason the config gives.
    if not accepts(hint, value):
        raise UserError(f"{where}: {value!r} is not {type_words(hint)}")
    if choices is not None and value not in choices:
        raise UserError(f"{where}: {value!r} is not one of {list(choices)}")


def check_fields(family: Any, fields: dict[str, Any], source: str) -> None:
    """Every field of a sweep against its family's config: names, the required ones, and each
    value, choice or range end of the type the field takes. Draws are then infeasible only for
    the reasons a config gives (`depth 0 < 1`), never for a field the family does not have."""
    classes = families()
    if family not in classes:
        raise UserError(f"{source}: field 'family' is {family!r}: expected one of "
                        f"{sorted(classes)}")  # fmt: skip
    cls: type[ModelConfig] = classes[family]
    hints = typing.get_type_hints(cls)
    known = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(fields) - set(known), key=str)
    if unknown:
        raise UserError(f"{source}: fields {unknown} are not {family} config fields: expected "
                        f"some of {sorted(known)}")  # fmt: skip
    missing = missing_fields(cls, fields)
    if missing:
        raise UserError(f"{source}: fields: a {family} config needs {missing} (no default)")
    choices = {name: domain_of(f).choices for name, f in known.items()}
    before: list[str] = []
    for name, spec in fields.items():
        where, hint = f"{source}: field {name!r}", hints[name]
        if isinstance(spec, list):
            if not spec:
                raise UserError(f"{where}: empty choice list")
            for i, v in enumerate(spec):
                _check_value(v, hint, choices.get(name), f"{where}, choice {i + 1}")
        elif isinstance(spec, dict):
            check_range(spec, where)
            ints = not accepts(hint, 0.5)
            if not accepts(hint, 1):
                raise UserError(f"{where}: a range draws numbers; the field takes "
                                f"{type_words(hint)}")  # fmt: skip
            for key in ("min", "max", "step"):
                if ints and key in spec and not is_integer(spec[key]):
                    raise UserError(f"{where}: {key} {spec[key]!r}: expected an integer "
                                    "(the field takes integers)")  # fmt: skip
            if "of" in spec and (spec["of"] not in before or not accepts(hints[spec["of"]], 1)):
                raise UserError(f"{where}: 'of' is {spec['of']!r}: expected a numeric field "
                                f"listed before it ({before})")  # fmt: skip
        else:
            _check_value(spec, hint, choices.get(name), where)
        before.append(name)


def sample(sweep: dict[str, Any], source: str, seed: int | None = None) -> list[ModelConfig]:
    """`count` valid configs; infeasible draws are rejected (and redrawn) with their reason
    kept for the error if too many in a row fail."""
    for key in ("family", "count", "fields"):
        if key not in sweep:
            raise UserError(f"{source}: missing field {key!r}")
    count = sweep["count"]
    if not is_integer(count) or count < 0:
        raise UserError(f"{source}: field 'count' is {count!r}: expected an integer >= 0")
    check_seed(sweep, source)
    if seed is not None and seed < 0:
        raise UserError(f"--seed {seed}: expected an integer >= 0 (a negative seed drew what "
                        "its absolute value draws)")  # fmt: skip
    if count == 0:
        warn(f"{source}: field 'count' is 0: no {sweep['family']} configs are drawn")
    fields = sweep["fields"]
    if not isinstance(fields, dict):
        raise UserError(f"{source}: field 'fields' must be a mapping of field -> range")
    check_fields(sweep["family"], fields, source)
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


def check_seed(sweep: dict[str, Any], source: str) -> None:
    seed = sweep.get("seed", 0)
    # `random.Random` seeds with abs() of an int: -7 drew what 7 draws.
    if not is_integer(seed) or seed < 0:
        raise UserError(f"{source}: field 'seed' is {seed!r}: expected an integer >= 0")


class _UniqueKeys(yaml.SafeLoader):
    """safe_load, except that a key given twice in one mapping is refused: YAML keeps the last
    one, so `count: 2` then `count: 5` drew 5 configs without a word."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, int] = {}
        # Before `flatten_mapping` (in the super call) puts the merged keys in: a key given
        # beside a merge (`<<: *base` then `iterations: 7`) overrides the merged one, as in
        # safe_load, and is no duplicate. The merge keys themselves (`<<`, even twice) are left
        # to it: they have no constructor of their own.
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                first = seen.get(key)
                seen.setdefault(key, line)
            except TypeError:
                continue  # an unhashable key: construct_mapping below names it
            if first is not None:
                raise _DuplicateKey(f"line {line}: key {key!r} is given twice (first on line "
                                    f"{first}); give it once")  # fmt: skip
        return super().construct_mapping(node, deep)


class _DuplicateKey(yaml.YAMLError):
    pass


# YAML aliases (`*name`) put one value in many places, and nested ones multiply: a file of 500
# bytes stood for 387 million values, which the sweep's checks walked until memory ran out.
MAX_EXPANDED = 100_000


def _expands_past(data: Any, limit: int) -> bool:
    """Whether `data`, each alias walked as the value it stands for, holds more than `limit`
    values (stopping there: the walk is what a bomb makes too long)."""
    stack, seen = [data], 0
    while stack:
        seen += 1
        if seen > limit:
            return True
        v = stack.pop()
        if isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list | tuple):
            stack.extend(v)
    return False


def read_sweep(path: Path) -> dict[str, Any]:
    """The top-level mapping of a YAML sweep file (`sample`'s and `launch`'s)."""
    text = read_text(path, f"sweep file {path}", "a YAML sweep file (UTF-8 text)")
    try:
        data = yaml.load(text, Loader=_UniqueKeys)
    except _DuplicateKey as e:
        raise UserError(f"sweep file {path}: {e}") from None
    except yaml.YAMLError as e:
        raise UserError(f"sweep file {path}: not valid YAML ({e})") from None
    if not isinstance(data, dict):
        raise UserError(f"sweep file {path}: expected a mapping at the top level")
    if _expands_past(data, MAX_EXPANDED):
        raise UserError(
            f"sweep file {path}: its values, with each alias (*name) taken as the value it "
            f"stands for, number more than {MAX_EXPANDED:,}; a sweep file lists its choices "
            "(write them out, or split the sweep)"
        )
    return data


def sample_file(path: Path, seed: int | None = None) -> list[ModelConfig]:
    data = read_sweep(path)
    launch_only = sorted(set(data) & {"models", "batch_sizes", "run", "trace"})
    unknown = sorted(set(data) - {"family", "count", "seed", "fields", *launch_only})
    if unknown:
        raise UserError(f"{path}: unknown top-level fields {unknown}; expected family, count, "
                        "seed and fields")  # fmt: skip
    if launch_only:
        verb = "has" if len(launch_only) == 1 else "have"
        warn(f"{path}: {', '.join(launch_only)} {verb} no effect on sample, which draws generator "
             "configs only (launch reads them)")  # fmt: skip
    return sample(data, str(path), seed)
