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
    run: {batch_size: {min: 4, max: 64}, iterations: 20, optimizer: adam}
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memtrace_trainer.errors import UserError
from memtrace_trainer.models.sampling import check_seed, draw, read_sweep, sample
from memtrace_trainer.notes import warn
from memtrace_trainer.runs.config import RunConfig


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
    orphans = sorted({"count", "fields"} & set(data)) if "family" not in data else []
    if orphans:
        raise UserError(f"{source}: {orphans} draw synthetic configs of a family: give "
                        "family (mlp, cnn or transformer) too")  # fmt: skip
    rng = random.Random(f"run-settings-{data.get('seed', 0)}")
    raw: list[dict[str, Any]] = []
    if "family" in data:
        for cfg in sample(data, source):
            raw.append({"model": "synthetic:" + cfg.to_json(), **_settings(rng, run, source)})
    models = data.get("models", [])
    batch_sizes = data.get("batch_sizes", [None])
    if not isinstance(models, list) or not isinstance(batch_sizes, list) or not batch_sizes:
        raise UserError(f"{source}: 'models' and 'batch_sizes' must be lists")
    for n, m in enumerate(models, 1):
        if isinstance(m, str):
            m = {"model": m}
        if not isinstance(m, dict):
            raise UserError(f"{source}: models[{n}] is {m!r}: expected a spec or a mapping")
        for b in batch_sizes if "batch_size" not in m else [None]:
            settings = _settings(rng, run, source)
            extra = {"batch_size": b} if b is not None else {}
            raw.append(settings | m | extra)
    if not raw:
        raise UserError(f"{source}: no runs: give family/count/fields, models, or both")
    both = [r for r in raw if r.get("seconds") is not None and r.get("iterations") is not None]
    if both:
        warn(f"{source}: iterations has no effect in {len(both)} runs that also give seconds, "
             "which decides how long a run trains")  # fmt: skip
    items = [
        Item(i, RunConfig.from_dict(r, f"{source}: run {i}"), trace) for i, r in enumerate(raw)
    ]
    # A model run left without one trained at batch 1, the dataclass default; `run` refuses it.
    unsized = [(i, r) for i, r in enumerate(raw) if "model" in r and r.get("batch_size") is None]
    if unsized:
        i, r = unsized[0]
        raise UserError(f"{source}: {len(unsized)} runs have no batch_size (run {i}: "
                        f"{r['model']}); give batch_size in run, in batch_sizes, or in the "
                        "models item")  # fmt: skip
    return items


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
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        try:
            data = json.loads(line)
            cfg = RunConfig.from_dict(data["config"], f"{path}:{n}: field config")
            items.append(Item(int(data["index"]), cfg, bool(data.get("trace", False))))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
            raise UserError(
                f"{path}:{n}: expected {{index, id, trace, config}} JSON ({e})"
            ) from None
    return items
