"""Batch files (`--batch CONFIGS.jsonl`): one JSON object per line, checked against the fields a
command accepts, so thousands of configs share one torch import."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from memtrace_trainer.errors import UserError, json_object


def read_configs(
    path: Path, allowed: set[str] | frozenset[str]
) -> Iterator[tuple[str, dict[str, Any]]]:
    """(name, config) per non-blank line; the name is the config's `name`, else `config-NNNNN`.
    Errors name the file and line."""
    if not path.is_file():
        raise UserError(f"--batch {path}: no such file")
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        config = json_object(line, f"{path}:{n}")
        unknown = sorted(set(config) - set(allowed))
        if unknown:
            raise UserError(f"{path}:{n}: unknown fields {unknown}; expected {sorted(allowed)}")
        yield str(config.get("name", f"config-{n:05d}")), config
