"""`launch` sweep files and their manifest: the list of runs, one JSON line per index.

A sweep file holds synthetic configs (`family`, `count`, `seed`, `fields`, as `sample` reads
them), explicit `models`, or both; `run` gives per-run settings, each a fixed value, a list
(uniform choice) or `{min, max}`, drawn per config from the sweep's seed:

    family: mlp
    count: 20
    seed: 1
    fields: {input_size: {min: 4, max: 4096}, output_size: 10, depth: {min: 1, max: 12}}
    models:                        # specs, or mappings with model|entry and overrides
      - torchvision:resnet18
      - {entry: mypkg.train:make, batch_size: 8}
    batch_sizes: [8, 32]           # crossed with every `models` item that has no batch_size
                                   # (an entry without a `batch_size` parameter runs once)
    run: {batch_size: {min: 4, max: 64}, iterations: 20, optimizer: adam}
"""

from __future__ import annotations

import dataclasses
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memtrace_trainer.errors import UserError, is_integer, needs_batch_size, read_text
from memtrace_trainer.models.sampling import check_range, check_seed, draw, read_sweep, sample
from memtrace_trainer.notes import counted, warn
from memtrace_trainer.runs.config import NUMERIC, RunConfig, field_problem

SETTINGS = tuple(f.name for f in dataclasses.fields(RunConfig))


@dataclass(frozen=True)
class Item:
    """One manifest line: a run and whether to take its shim traces."""

    index: int
    config: RunConfig
    trace: bool = False

    def to_json(self) -> str:
        return json.dumps(
            {
                "index": self.index,
                "id": self.config.id,
                "trace": self.trace,
                "config": self.config.to_dict(),
            },
            sort_keys=True,
        )


def _settings(rng: random.Random, run: dict[str, Any], source: str) -> dict[str, Any]:
    drawn: dict[str, Any] = {}
    for name, spec in run.items():
        drawn[name] = draw(rng, spec, drawn, f"{source}: run.{name}")
    return drawn


def check_run(run: dict[str, Any], source: str) -> None:
    """Every value a `run` setting may take, each choice and each range end, checked before any
    draw: a bad choice that happened not to be drawn was accepted, and a seed that drew it
    failed."""
    unknown = sorted(set(run) - set(SETTINGS), key=str)
    if unknown:
        raise UserError(f"{source}: run: unknown settings {unknown}; expected some of "
                        f"{sorted(SETTINGS)}")  # fmt: skip
    for name, spec in run.items():
        where = f"{source}: run.{name}"
        if isinstance(spec, list):
            if not spec:
                raise UserError(f"{where}: empty choice list")
            values = [(f", choice {i}", v) for i, v in enumerate(spec, 1)]
        elif isinstance(spec, dict):
            check_range(spec, where)
            kind = NUMERIC.get(name)
            if kind is None:
                raise UserError(f"{where}: a range draws numbers, and {name} is not a number "
                                "setting: give a value or a list of choices")  # fmt: skip
            for key in ("min", "max", "step"):
                if kind is int and key in spec and not is_integer(spec[key]):
                    raise UserError(f"{where}: {key} {spec[key]!r}: expected an integer "
                                    f"({name} takes integers)")  # fmt: skip
            values = [(f" ({end})", spec[end]) for end in ("min", "max") if end in spec]
        else:
            values = [("", spec)]
        for suffix, value in values:
            if (problem := field_problem(name, value)) is not None:
                raise UserError(f"{where}{suffix}: {problem}")


def _check_models(models: list[Any], source: str) -> None:
    for n, m in enumerate(models, 1):
        where = f"{source}: models[{n}]"
        if isinstance(m, str):
            m = {"model": m}
        if not isinstance(m, dict):
            raise UserError(f"{where} is {m!r}: expected a spec or a mapping")
        unknown = sorted(set(m) - set(SETTINGS), key=str)
        if unknown:
            raise UserError(f"{where}: unknown fields {unknown}; expected model or entry and "
                            f"some of {sorted(SETTINGS)}")  # fmt: skip
        # Null is no value: `{model: x, entry: null}` is how config.json writes a model run.
        if (m.get("model") is not None) == (m.get("entry") is not None):
            raise UserError(f"{where}: expected exactly one of model or entry, got {m!r}")
        for name, value in m.items():
            if (problem := field_problem(name, value)) is not None:
                raise UserError(f"{where}: {problem}")


def _check_profiles(run: dict[str, Any], models: list[Any], source: str) -> None:
    """Every profile named, checked as `run --profile` checks it: it is recorded with each run
    and read back by `dataset`."""
    from memtrace_trainer.profile import load_profile

    given = run.get("profile")
    names = list(given) if isinstance(given, list) else [given]
    names += [m.get("profile") for m in models if isinstance(m, dict)]
    for name in dict.fromkeys(n for n in names if n is not None):
        try:
            load_profile(name)
        except UserError as e:
            raise UserError(f"{source}: profile {name!r}: {e}") from None


def _own_batch(m: Any) -> bool:
    """A `models` item whose entry function takes no `batch_size` and builds its own batch
    (`errors.needs_batch_size`), given no batch_size of its own: the sweep's batch sizes
    (batch_sizes, run.batch_size) do not size it, so it runs once, at its own batch."""
    if not isinstance(m, dict) or "batch_size" in m or not isinstance(m.get("entry"), str):
        return False
    try:
        return not needs_batch_size(m["entry"])
    except UserError:
        return False  # an entry that does not import: the preflight names it, with its run


def _say_overridden(data: dict[str, Any], models: list[Any], fixed: set[int], source: str) -> None:
    """The batch sizes that a more specific one overrides, said: run.batch_size under
    batch_sizes, batch_sizes under a models item's own batch_size; and both beside an entry
    that builds its own batch (`fixed`: the numbers of those items)."""
    given = ["batch_sizes"] * ("batch_sizes" in data)
    given += ["run.batch_size"] * ("batch_size" in data.get("run", {}))
    for n in sorted(fixed) if given else []:
        warn(f"{source}: {' and '.join(given)} "
             + ("has" if len(given) == 1 else "have")
             + f" no effect on models[{n}] ({models[n - 1]['entry']}): the function takes no "
             "`batch_size` parameter and builds its own batch, so it runs once, at that "
             "batch")  # fmt: skip
    if "batch_sizes" not in data:
        return
    own = [(n, m) for n, m in enumerate(models, 1) if isinstance(m, dict) and "batch_size" in m]
    sized = len(models) - len(own) - len(fixed)
    if not models:
        warn(f"{source}: batch_sizes has no effect: it sizes the runs of `models`, and there "
             "are none (run.batch_size sizes the synthetic configs)")  # fmt: skip
    for n, m in own:
        warn(f"{source}: batch_sizes has no effect on models[{n}] "
             f"({m.get('model') or m.get('entry')}), which gives its own batch_size "
             f"{m['batch_size']}")  # fmt: skip
    if "batch_size" in data.get("run", {}) and sized:
        rest = " (it sizes the synthetic configs alone)" if "family" in data else ""
        what = ("the `models` item without a batch_size of its own" if sized == 1 else
                f"the {sized} `models` items without a batch_size of their own")  # fmt: skip
        warn(f"{source}: run.batch_size has no effect on {what}: batch_sizes gives their "
             f"batch sizes{rest}")  # fmt: skip


def items_of(data: dict[str, Any], source: str) -> list[Item]:
    known = {"family", "count", "seed", "fields", "models", "batch_sizes", "run", "trace"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise UserError(f"{source}: unknown top-level fields {unknown}; expected {sorted(known)}")
    run = data.get("run", {})
    if not isinstance(run, dict):
        raise UserError(f"{source}: field 'run' must be a mapping of setting -> value or range")
    trace = data.get("trace", False)
    if not isinstance(trace, bool):
        raise UserError(f"{source}: field 'trace' is {trace!r}: expected true or false")
    check_seed(data, source)
    check_run(run, source)
    orphans = sorted({"count", "fields"} & set(data)) if "family" not in data else []
    if orphans:
        raise UserError(f"{source}: {orphans} draw synthetic configs of a family: give "
                        "family (mlp, cnn or transformer) too")  # fmt: skip
    models = data.get("models", [])
    batch_sizes = data.get("batch_sizes", [None])
    if not isinstance(models, list) or not isinstance(batch_sizes, list) or not batch_sizes:
        raise UserError(f"{source}: 'models' and 'batch_sizes' must be lists")
    _check_models(models, source)
    for i, b in enumerate(batch_sizes, 1):
        if b is not None and (problem := field_problem("batch_size", b)) is not None:
            raise UserError(f"{source}: batch_sizes, item {i}: {problem}")
    _check_profiles(run, models, source)
    fixed = {n for n, m in enumerate(models, 1) if _own_batch(m)}
    _say_overridden(data, models, fixed, source)
    rng = random.Random(f"run-settings-{data.get('seed', 0)}")
    raw: list[dict[str, Any]] = []
    if "family" in data:
        for cfg in sample(data, source):
            raw.append({"model": "synthetic:" + cfg.to_json(), **_settings(rng, run, source)})
    for n, m in enumerate(models, 1):
        if isinstance(m, str):
            m = {"model": m}
        if not isinstance(m, dict):
            raise UserError(f"{source}: models[{n}] is {m!r}: expected a spec or a mapping")
        for b in batch_sizes if "batch_size" not in m and n not in fixed else [None]:
            settings = _settings(rng, run, source)
            if n in fixed:
                settings.pop("batch_size", None)  # drawn, as before, and said not to apply
            extra = {"batch_size": b} if b is not None else {}
            raw.append(settings | m | extra)
    if not raw:
        raise UserError(f"{source}: no runs: give family/count/fields, models, or both")
    both = [r for r in raw if r.get("seconds") is not None and r.get("iterations") is not None]
    if both:
        warn(f"{source}: iterations has no effect in {counted(len(both), 'run')} that also "
             + ("gives" if len(both) == 1 else "give")
             + " seconds, "
             "which decides how long a run trains")  # fmt: skip
    # A run left without one, as `run` refuses it (it trained at batch 1, the dataclass default
    # that was); an entry function without a `batch_size` parameter runs at its own batch.
    unsized = [(i, r) for i, r in enumerate(raw) if _unsized(r)]
    if unsized:
        i, r = unsized[0]
        raise UserError(f"{source}: {counted(len(unsized), 'run')} "
                        + ("has" if len(unsized) == 1 else "have")
                        + f" no batch_size (run {i}: "
                        f"{r.get('model') or r.get('entry')}); give batch_size in run, in "
                        "batch_sizes, or in the "
                        "models item")  # fmt: skip
    return [Item(i, RunConfig.from_dict(r, f"{source}: run {i}"), trace) for i, r in enumerate(raw)]


def _unsized(run: dict[str, Any]) -> bool:
    """A run without the batch size its job needs (`errors.needs_batch_size`)."""
    entry = run.get("entry")
    if run.get("batch_size") is not None or not isinstance(entry, str | None):
        return False  # a batch size, or an entry that is no MOD:FN: `RunConfig` names it
    try:
        return needs_batch_size(entry)
    except UserError:
        return False  # an entry that does not import: the preflight names it, with its run


def load_sweep(path: Path) -> list[Item]:
    items = items_of(read_sweep(path), str(path))
    ids = [it.config.id for it in items]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise UserError(f"sweep file {path}: the same run appears twice: {dupes[:3]}")
    return items


def write_manifest(path: Path, items: list[Item]) -> None:
    from memtrace_trainer.atomic import write_text

    write_text(path, "".join(it.to_json() + "\n" for it in items))


def read_manifest(path: Path) -> list[Item]:
    if not Path(path).is_file():
        raise UserError(f"manifest {path}: no such file (written by `launch`)")
    items = []
    text = read_text(path, f"manifest {path}", "JSON lines written by `launch`")
    for n, line in enumerate(text.splitlines(), 1):
        try:
            data = json.loads(line)
            cfg = RunConfig.from_dict(data["config"], f"{path}:{n}: field config")
            items.append(Item(int(data["index"]), cfg, bool(data.get("trace", False))))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
            raise UserError(
                f"{path}:{n}: expected {{index, id, trace, config}} JSON ({e})"
            ) from None
    return items
