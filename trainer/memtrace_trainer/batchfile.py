"""Batch files (`--batch CONFIGS.jsonl`): one JSON object per line, so thousands of configs share
one torch import.

The whole file is read and checked before anything runs: a field's JSON type, choices and
syntax are read off the command's own parser (a field is an option's destination, `batch_size`
for `--batch-size`), so a line means and checks what the command line does. Every error names
the file, the line and the field, and nothing of the batch has run when one is raised."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memtrace_trainer import notes
from memtrace_trainer.errors import UserError, is_integer, is_number, json_object, read_text


@dataclass(frozen=True)
class Config:
    """One line of a batch file: its name (the `name` field, else `config-NNNNN` of its line
    number), its line number and its fields as the file gives them."""

    name: str
    line: int
    values: dict[str, Any]
    # The fields messages about this line name as fields (`batch_size`), not as flags: the
    # line's own, and those the command line does not give a default for.
    own: frozenset[str] = frozenset()


def command_parser(command: str) -> argparse.ArgumentParser:
    """The parser of one subcommand, as the CLI builds it."""
    from memtrace_trainer.cli import parser

    top, _ = parser()
    for action in top._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices[command]  # type: ignore[no-any-return]
    raise AssertionError(f"the CLI has no {command} command")


def _actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {a.dest: a for a in parser._actions if a.option_strings}


def _json_text(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_value(field: str, value: Any, action: argparse.Action | None) -> Any:
    """`value` of `field` checked as its option (`action`) takes it on the command line; the
    value to use. A UserError naming the field and what was expected otherwise."""

    def wrong(expected: str) -> UserError:
        return UserError(f"field {field!r}: expected {expected}, got {_json_text(value)}")

    if action is None:  # `name`: checked by read_configs
        return value
    if action.nargs == 0:  # a flag: store_true, store_false (`kbit_prepare`)
        if not isinstance(value, bool):
            raise wrong("true or false")
        return value
    if action.nargs == "?":  # `--checkpointing [full|selective]`: true is the bare flag
        if value is True:
            return action.const
        if value is False:
            return None
    if getattr(action.type, "schema_kind", None) == "number":  # `--reduce-bucket-size`: 5e8
        try:
            return action.type(str(value)) if is_number(value) else action.type(value)
        except (TypeError, argparse.ArgumentTypeError) as e:
            raise wrong(f"a number the command line takes ({e})") from None
    if action.type is int:
        if not is_integer(value) or value < 1:
            raise wrong("a positive integer")
        return value
    if action.type is float:
        if not is_number(value):
            raise wrong("a number")
        return value
    if not isinstance(value, str):
        # `"input_shape": [3, 32, 32]`, `"lora": 16`: the command line's text is what the
        # option's own parser reads, so the line gives that text.
        hint = ""
        if isinstance(value, list) and all(is_integer(v) for v in value):
            hint = f" like {json.dumps(','.join(map(str, value)))}"
        elif is_number(value):
            hint = f" like {json.dumps(str(value))}"
        raise wrong(f"a string{hint}, as on the command line")
    if action.choices is not None and value not in action.choices:
        raise wrong(f"one of {', '.join(map(str, action.choices))}")
    if action.type is not None and callable(action.type):
        try:
            action.type(value)
        except (TypeError, ValueError, argparse.ArgumentTypeError) as e:
            raise wrong(f"a value the command line takes ({e})") from None
    return value


def check_name(name: Any) -> str:
    """A config's `name`: the file name of its outputs (`NAME.jsonl` under --out-dir), so a
    plain one: a path, `..` or an empty name would write outside the folder or nowhere."""
    if not isinstance(name, str) or not name.strip():
        raise UserError(f"field 'name': expected a non-empty string, got {_json_text(name)}")
    bad = [c for c in ("/", "\\", "\0") if c in name]
    if bad or name in (".", "..") or name != name.strip():
        raise UserError(f"field 'name': {name!r}: expected a plain file name (no path "
                        "separator, not . or .., no leading or trailing space)")  # fmt: skip
    if len(os.fsencode(name)) > 240:
        raise UserError(f"field 'name': expected at most 240 bytes, got {len(name)} characters")
    return name


# The trace formats `symtrace --out` writes: a `--batch` name ending in one reads as that file.
TRACE_SUFFIXES = (".jsonl", ".mtrace")


def output_file(name: str, suffix: str) -> str:
    """The file of a config's output: `NAME` + `suffix`, or `NAME` when it already ends in it
    (`"name": "x.jsonl"` wrote `x.jsonl.jsonl`)."""
    return name if name.endswith(suffix) else name + suffix


def _check_output_name(name: str, suffix: str) -> None:
    if name == suffix:
        raise UserError(f"field 'name': {name!r}: expected a name before {suffix}")
    other = [s for s in TRACE_SUFFIXES if s != suffix and name.endswith(s)]
    if other:
        raise UserError(f"field 'name': {name!r}: each config is written as NAME{suffix}, not as "
                        f"{other[0]}; expected a name without {other[0]}")  # fmt: skip


def read_configs(
    path: Path,
    parser: argparse.ArgumentParser,
    allowed: set[str] | frozenset[str],
    check: Callable[[dict[str, Any]], None] | None = None,
    given: set[str] | frozenset[str] = frozenset(),
    suffix: str | None = None,
) -> list[Config]:
    """Every config of the file, each field checked as the command's option (`parser`) takes it
    and the line then checked whole by `check` (a UserError of its own). `given`: the fields the
    command line gives defaults for. `suffix`: of the file each config writes (`output_file`),
    where a command writes one: two names of one file are refused. An error names the file, the
    line and the field; an empty file is one."""
    if path.is_dir():
        raise UserError(f"--batch {path}: a folder; expected a file of JSON lines")
    if not path.is_file():
        raise UserError(f"--batch {path}: no such file")
    text = read_text(path, f"--batch {path}", "a file of JSON lines (UTF-8 text)")
    actions = _actions(parser)
    configs: list[Config] = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        config = json_object(line, where)
        unknown = sorted(set(config) - set(allowed))
        if unknown:
            raise UserError(f"{where}: unknown fields {unknown}; expected {sorted(allowed)}")
        values: dict[str, Any] = {}
        own = frozenset((set(allowed) - set(given)) | set(config))
        try:
            for key, value in config.items():
                if value is None:  # null is the field left out, as in a `serve` request
                    continue
                if key == "name":
                    values[key] = check_name(value)
                    if suffix is not None:
                        _check_output_name(value, suffix)
                else:
                    values[key] = check_value(key, value, actions.get(key))
            if check is not None:
                with quiet():
                    check(values)
        except UserError as e:
            raise UserError(f"{where}: {in_field_terms(str(e), parser, own)}") from None
        configs.append(Config(values.get("name", f"config-{n:05d}"), n, values, own))
    if not configs:
        raise UserError(f"--batch {path}: no configs (every line is blank); expected one JSON "
                        "object per line")  # fmt: skip
    _unique(path, configs, suffix)
    return configs


def _unique(path: Path, configs: list[Config], suffix: str | None) -> None:
    """Two configs of one name would write one file, the second trace over the first; an
    unnamed line's automatic name (`config-NNNNN`) counts, and so do `x` and `x.jsonl`."""
    first: dict[str, Config] = {}
    for c in configs:
        other = first.setdefault(c.name if suffix is None else output_file(c.name, suffix), c)
        if other is c:
            continue
        if other.name != c.name:
            raise UserError(f"{path}:{c.line}: field 'name': {c.name!r} writes "
                            f"{output_file(c.name, suffix or '')}, as {other.name!r} of line "
                            f"{other.line} does; expected names unique in the file")  # fmt: skip
        # The line to fix is the one whose `name` field says it, not an unnamed one.
        auto = next((x for x in (other, c) if "name" not in x.values), None)
        at = other if auto is c else c
        why = f" (the automatic name of the unnamed line {auto.line})" if auto else ""
        raise UserError(f"{path}:{at.line}: field 'name': {c.name!r} is the name of line "
                        f"{auto.line if auto else other.line} too{why}; expected names unique "
                        "in the file")  # fmt: skip


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Within: warnings kept from the terminal. The checks of the whole file run before any
    config; a config's warnings are said when it runs, under its name."""
    with notes.captured(lambda _m: None):
        yield


def in_field_terms(
    message: str, parser: argparse.ArgumentParser, fields: set[str] | frozenset[str]
) -> str:
    """`message` with each command-line flag of one of `fields` (`--batch-size`) named as the
    field (`batch_size`): the user wrote a line, not the flag. Flags of a value the command line
    gave stay as they are."""
    by_flag = {s: a.dest for a in parser._actions for s in a.option_strings if a.dest in fields}

    def field(m: re.Match[str]) -> str:
        dest = by_flag.get(m.group(0))
        return f"field {dest!r}" if dest else m.group(0)

    return re.sub(r"--[a-z][a-z0-9-]*", field, message)


@contextlib.contextmanager
def warnings_of(name: str, terms: Callable[[str], str] = str) -> Iterator[list[str]]:
    """Within: warnings said as `warning: NAME: ...` on stderr and collected, each in the
    line's `terms` (a batch's stderr interleaves many configs' warnings; each must say whose it
    is)."""
    said: list[str] = []

    def sink(message: str) -> None:
        message = terms(message)
        said.append(message)
        print(f"warning: {name}: {message}", file=sys.stderr)

    with notes.captured(sink):
        yield said


def failed_summary(results: list[dict[str, Any]]) -> int:
    """The exit status of a batch run: 0 when every config ran, 1 when some failed, 2 when all
    did; the failed ones are counted on stderr."""
    failed = [r["name"] for r in results if "error" in r]
    if not failed:
        return 0
    names = ", ".join(failed[:5]) + (", ..." if len(failed) > 5 else "")
    print(f"error: {len(failed)} of {len(results)} configs failed ({names}); each one's line "
          'has its "error"', file=sys.stderr)  # fmt: skip
    return 2 if len(failed) == len(results) else 1
