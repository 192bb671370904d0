"""The request schema of `serve`: a JSON object whose fields are the options of `estimate`.

The fields are read off the `estimate` command's own argparse parser, and a request is turned back
into that command's argv and parsed by it, so every option means and checks in a request what it
means and checks on the command line; nothing here restates a default or a choice. What is added
is what a server needs on top: JSON types checked per field, the code a request may run limited to
what the server was started with (`--allow-step`, `--allow-entry`, `--allow-script`), and options
that would write files on the server refused."""

from __future__ import annotations

import argparse
import difflib
import json
import math
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MAX_BODY = 1 << 20

# Options a request may not use, and why (the server never writes files a request names).
REFUSED = {
    "report": "it writes an HTML file on the server; run `memtrace_trainer estimate --report` "
    "or `memsim report` where the file should be",
}
# Options that name code the server would import and run, with the start-up flag allowing each.
CODE = {"step": "--allow-step", "entry": "--allow-entry", "script": "--allow-script"}


class RequestError(Exception):
    """A request the server answers with `status` and `{"error": message, "field": field}`."""

    def __init__(
        self, status: int, message: str, field: str | None = None, headers: Any = None
    ) -> None:
        super().__init__(message)
        self.status, self.field = status, field
        self.headers: dict[str, str] = dict(headers or {})

    def body(self) -> dict[str, Any]:
        return {"error": str(self), "field": self.field}


@dataclass(frozen=True)
class Field:
    """One request field: an option of `estimate`, named by its first long flag in snake case."""

    name: str
    flag: str
    kind: str  # boolean, integer, number, string, string-or-true, string-or-integer, array
    help: str
    default: Any = None
    choices: tuple[str, ...] | None = None
    aliases: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.kind, "flag": self.flag, "help": self.help}
        if self.default is not None and self.default is not False:
            out["default"] = str(self.default) if isinstance(self.default, Path) else self.default
        if self.choices:
            out["choices"] = list(self.choices)
        if self.aliases:
            out["aliases"] = list(self.aliases)
        if self.name in REFUSED:
            out["refused"] = REFUSED[self.name]
        if self.name in CODE:
            out["allowed_by"] = CODE[self.name]
        return out


@dataclass(frozen=True)
class Policy:
    """The code requests may name: `package.module:function` specs and script paths."""

    steps: tuple[str, ...] = ()
    entries: tuple[str, ...] = ()
    scripts: tuple[Path, ...] = field(default=())  # resolved at start-up
    # Each allowed script as spelled at start-up, made absolute without following links, and
    # the file it resolved to then: a request spelling it so runs that file even after a link
    # on the way was re-pointed (a `current -> release-N` deployment).
    script_names: tuple[tuple[str, Path], ...] = ()

    @classmethod
    def allowing(
        cls, steps: Iterable[str], entries: Iterable[str], scripts: Iterable[Path]
    ) -> Policy:
        """The policy of the `--allow-*` flags, scripts as given on the command line."""
        given = [Path(p).expanduser() for p in scripts]
        resolved = tuple(p.resolve() for p in given)
        names = tuple((os.path.abspath(p), r) for p, r in zip(given, resolved, strict=True))
        return cls(tuple(steps), tuple(entries), resolved, names)

    def allowed(self) -> dict[str, list[str]]:
        return {"step": list(self.steps), "entry": list(self.entries),
                "script": [str(p) for p in self.scripts]}  # fmt: skip

    def check(self, name: str, value: str) -> str:
        """What runs for `value` of `name` (step, entry, script): a script's path as allowed at
        start-up (resolved then), not as the request spells it, so a link re-pointed after the
        check runs nothing else; a 403 naming the field unless it is allowed."""
        if name == "script":
            target = self._script(value)
            ok = target is not None
            runs = str(target)
            listed = self.allowed()["script"]
        else:
            listed = list(self.steps if name == "step" else self.entries)
            ok = value in listed
            runs = value
        if not ok:
            given = ", ".join(listed) if listed else "none"
            raise RequestError(
                403,
                f"{name} {value!r} is not allowed by this server: it runs only the code it was "
                f"started with ({CODE[name]}; allowed: {given})",
                name,
            )
        return runs

    def _script(self, value: str) -> Path | None:
        """The allowed script `value` names (the path stored at start-up), or None. Another
        path to an allowed file is resolved once, and what runs is the stored path, never the
        path just resolved: resolving twice let a link re-pointed between the two run a file
        never allowed."""
        try:
            spelled = Path(value).expanduser()
            target = dict(self.script_names).get(os.path.abspath(spelled))
            if target is not None:
                return target
            now = spelled.resolve()
        # A NUL byte (ValueError), a link loop (RuntimeError before Python 3.13, OSError
        # after), an unknown `~user`: a path to nothing allowed, so a 403, not a 500.
        except (OSError, RuntimeError, ValueError):
            return None
        return next((p for p in self.scripts if p == now), None)


def _snake(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


def _kind(action: argparse.Action) -> str:
    if action.nargs == 0:
        return "boolean"
    if action.nargs in ("*", "+"):
        return "array"
    if action.nargs == "?":
        return "string-or-true"
    if action.dest == "lora":
        return "string-or-integer"  # `--lora R[:ALPHA]`: a rank alone is a number, as lora=8 is
    if getattr(action.type, "schema_kind", None):
        return action.type.schema_kind  # a parser of its own taking a JSON number
    if action.type is int:
        return "integer"
    if action.type is float:
        return "number"
    return "string"


class Schema:
    """The request fields of the `estimate` parser and the parser itself, made to raise instead
    of exiting (one instance is shared by the server's threads: parsing does not change it)."""

    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.parser = parser
        self.fields: dict[str, Field] = {}
        self.by_flag: dict[str, str] = {}
        self.by_key: dict[str, str] = {}
        for action in parser._actions:
            if action.dest == "help":
                continue
            longs = [s for s in action.option_strings if s.startswith("--")]
            names = [_snake(s) for s in longs] or [action.dest]
            # A flag's field is the flag: absent, a store_false flag (`--no-kbit-prepare`) is
            # off, though its destination (`kbit_prepare`) defaults to True.
            default = False if isinstance(action, argparse._StoreFalseAction) else action.default
            f = Field(names[0], longs[0] if longs else "-- ARGS", _kind(action),
                      action.help or "", default,
                      tuple(str(c) for c in action.choices) if action.choices else None,
                      tuple(names[1:]))  # fmt: skip
            self.fields[f.name] = f
            for name in names:
                self.by_key[name] = f.name
            for flag in longs:
                self.by_flag[flag] = f.name

        def fail(message: str) -> None:
            raise RequestError(400, message, self.field_in(message))

        parser.error = fail  # type: ignore[method-assign]

    def field_in(self, message: str, argv: list[str] | None = None) -> str | None:
        """The request field a command-line message is about: the script arguments it quotes,
        else the first flag it names outside quotes (a quoted value may look like a flag), else
        the option whose value it quotes (`unknown model spec 'x'`)."""
        words = argv or []
        cut = words.index("--") if "--" in words else len(words)
        rest, options = words[cut + 1 :], words[:cut]
        # The arguments as a message quotes them: one search, whatever their number (a search
        # per argument was quadratic, and missed 'a b', the quote of two).
        if rest and repr(" ".join(rest)) in message and "script_args" in self.fields:
            return "script_args"
        # A script's own arguments, as the `script:PATH ARGS` spec quotes them, are not flags
        # of the command (`--json` among them was taken for the field `json`). Only that span
        # goes, once: replacing the arguments' text everywhere cut it out of flag names too
        # (arguments `e` made `--seq-len` read `--sq-ln`).
        if rest:
            args = "".join(f" {a}" for a in rest)
            path = next((w.partition("=")[2] for w in words if w.startswith("--script=")), None)
            if path is not None and f"script:{path}{args}" in message:
                message = message.replace(f"script:{path}{args}", f"script:{path}", 1)
            else:
                message = _cut_word_span(message, args.lstrip())
        unquoted = re.sub(r"'[^']*'|\"[^\"]*\"", "", message)
        for flag in re.findall(r"--[a-z][a-z0-9-]*", unquoted):
            if flag in self.by_flag:
                return self.by_flag[flag]
        for word in options:  # the script's arguments are no option's value
            flag, sep, value = word.partition("=")
            if sep and flag in self.by_flag and _quotes(message, value):
                return self.by_flag[flag]
        return None

    def to_json(self) -> dict[str, Any]:
        return {name: f.to_json() for name, f in self.fields.items()}

    def argv(self, text: bytes, policy: Policy) -> list[str]:
        """The `estimate` argv of a request body (`--json` included), checked by the command's
        parser; a RequestError naming the field otherwise."""
        return self.request(text, policy)[0]

    def request(self, text: bytes, policy: Policy) -> tuple[list[str], dict[str, str]]:
        """`argv`, and the key the request spelled each field with (an alias, say), so that an
        error found later (in the worker) names what the client wrote."""
        body = parse_body(text)
        argv, positional, seen = [], [], {}
        for key, value in body.items():
            name = self.by_key.get(key)
            if name is None:
                raise RequestError(400, _unknown(key, list(self.by_key)), key)
            if name in seen:
                raise RequestError(400, f"fields {seen[name]!r} and {key!r} are the same option "
                                   f"({self.fields[name].flag}): give one", key)  # fmt: skip
            seen[name] = key
            if value is None:  # null is the field left out
                continue
            f = self.fields[name]
            if name in REFUSED:
                raise RequestError(400, f"field {key!r} is not accepted by serve: "
                                   f"{REFUSED[name]}", key)  # fmt: skip
            if name == "json":
                if value is not True:
                    raise RequestError(400, "field 'json': the server answers JSON only; "
                                       "leave it out or give true", key)  # fmt: skip
                continue
            _refuse_huge(f, key, value)
            if name in CODE:
                # What runs is the server's own start-up value: a NUL or a surrogate in the
                # request's spelling matches nothing allowed, a 403 like any other.
                _words(f, key, value)
                words = _words(f, key, policy.check(name, str(value)))
            else:
                words = _words(f, key, value)  # its type first: a string's fault is said of one
                _refuse_unwritable(f, key, value)
            if f.flag == "-- ARGS":
                positional = words
            else:
                argv += words
        argv.append("--json")
        if positional:
            argv += ["--", *positional]
        try:
            self.parser.parse_args(argv)  # raises a RequestError on what the command rejects
        except RequestError as e:
            e.field = seen.get(e.field or "", e.field)  # the key the client wrote (an alias)
            raise
        return argv, seen


def as_spelled(status: int, text: str, keys: dict[str, str]) -> str:
    """An error answer naming the field as the request spelled it (`iterations`, not `steps`):
    the worker's errors name the option."""
    if status < 400:
        return text
    try:
        body = json.loads(text)
    except ValueError:
        return text
    field = body.get("field") if isinstance(body, dict) else None
    spelled = keys.get(field) if isinstance(field, str) else None
    if spelled is None or spelled == field:
        return text
    body["field"] = spelled
    return json.dumps(body)


def _words(f: Field, key: str, value: Any) -> list[str]:
    """The command-line words of one field's JSON value, its type checked. `--flag=value` keeps
    a value that starts with `-` from being read as a flag."""

    def wrong(expected: str) -> RequestError:
        return RequestError(400, f"field {key!r} ({f.flag}) must be {expected}, not "
                            f"{_json_type(value)} {json.dumps(value)[:80]}", key)  # fmt: skip

    if f.kind == "boolean":
        if not isinstance(value, bool):
            raise wrong("true or false")
        return [f.flag] if value else []
    if f.kind == "string-or-true":
        if value is True:
            return [f.flag]
        if value is False:
            return []
        if not isinstance(value, str):
            raise wrong("a string or true")
        return [f"{f.flag}={value}"]
    if f.kind == "string-or-integer":
        if isinstance(value, bool) or not isinstance(value, int | str):
            raise wrong('an integer or a string (16, or "16:32" for the alpha)')
        return [f"{f.flag}={value}"]
    if f.kind == "array":
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise wrong("an array of strings")
        return list(value)
    if f.kind == "integer":
        if isinstance(value, bool) or not isinstance(value, int):
            raise wrong("an integer")
    elif f.kind == "number":
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise wrong("a number")
    elif isinstance(value, int | float) and not isinstance(value, bool):
        # `"capacity": 40`: the value the command line takes is the number's text, which the
        # command's own parser checks (`--capacity 40GiB`); said, not guessed.
        raise wrong(f"a string, as on the command line ({json.dumps(str(value))})")
    elif not isinstance(value, str):
        raise wrong("a string")
    return [f"{f.flag}={value}"]


class Huge:
    """A JSON integer longer than Python reads (`sys.get_int_max_str_digits()`, 4,300 digits by
    default), or a number too large to be finite (`1e999`, read as infinity): valid JSON, kept
    with what is wrong with it so that the field holding it is named."""

    def __init__(self, text: str, integer: bool = True) -> None:
        short = text if len(text) <= 24 else f"{text[:12]}...{text[-6:]}"
        digits = len(text.lstrip("-"))
        if integer:
            self.said = f"the integer {short} ({digits} digits) is out of range"
        else:
            self.said = f"the number {short} is out of range (too large to be finite)"


def _int(text: str) -> int | Huge:
    try:
        return int(text)
    except ValueError:  # JSON's syntax is int's: only the digit limit is left
        return Huge(text)


def _float(text: str) -> float | Huge:
    value = float(text)
    return value if math.isfinite(value) else Huge(text, integer=False)


def _refuse_huge(f: Field, key: str, value: Any) -> None:
    """A 400 naming the field for a number too large to read, anywhere in its value (walked
    without recursion: a value may nest as deep as the JSON parser allows)."""
    todo = [value]
    while todo:
        item = todo.pop()
        if isinstance(item, Huge):
            raise RequestError(400, f"field {key!r} ({f.flag}): {item.said}", key)
        if isinstance(item, list):
            todo += item
        elif isinstance(item, dict):
            todo += item.values()


# What no command-line word can hold: a NUL ends a C string, and a lone UTF-16 surrogate has no
# UTF-8 encoding. Both reached subprocess and os calls as internal errors (500).
_UNWRITABLE = re.compile(r"[\x00\ud800-\udfff]")


def _refuse_unwritable(f: Field, key: str, value: Any) -> None:
    """A 400 naming the field for a string (or an array's string) no command line can carry;
    other types are left to the type check."""
    texts = value if isinstance(value, list) else [value]
    for i, text in enumerate(texts):
        if not isinstance(text, str) or (m := _UNWRITABLE.search(text)) is None:
            continue
        bad = "a NUL byte" if m.group() == "\0" else f"a lone surrogate \\u{ord(m.group()):04x}"
        where = f"its element {i} has" if isinstance(value, list) else "it has"
        raise RequestError(400, f"field {key!r} ({f.flag}) must be text a command line can "
                           f"carry (no NUL byte, no lone UTF-16 surrogate): {where} {bad} at "
                           f"character {m.start()}", key)  # fmt: skip


def _cut_word_span(message: str, span: str) -> str:
    """`message` less the first `span` standing as whole words (whitespace or an end on each
    side), in one linear search: a regular expression with look-arounds retried the span at
    every place it began, quadratic for a long run of script arguments."""
    flat = re.sub(r"\s", " ", f" {message} ")  # the same length: positions carry over
    start = flat.find(re.sub(r"\s", " ", f" {span} "))
    return message if start < 0 else message[:start] + message[start + len(span) :]


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float | Huge):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return "null"


def _unknown(key: str, known: list[str]) -> str:
    near = difflib.get_close_matches(key.replace("-", "_"), known, n=3, cutoff=0.6)
    hint = f"; did you mean {', '.join(repr(n) for n in near)}?" if near else ""
    return (f"unknown field {key!r}{hint} (fields are the `estimate` options in snake case; "
            "GET /v1/schema lists them)")  # fmt: skip


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise RequestError(400, f"field {key!r} is given twice", key)
        out[key] = value
    return out


def parse_body(text: bytes) -> dict[str, Any]:
    """The request body as a JSON object: UTF-8, no NaN or Infinity, no key given twice."""
    try:
        body = json.loads(text.decode("utf-8"), object_pairs_hook=_unique,
                          parse_constant=_no_constant, parse_int=_int,
                          parse_float=_float)  # fmt: skip
    except UnicodeDecodeError as e:
        raise RequestError(400, f"request body is not UTF-8 ({e})") from None
    except ValueError as e:  # JSONDecodeError is one
        raise RequestError(400, f"request body is not JSON: {e}") from None
    except RecursionError:  # `[[[...` within the size limit: the parser's depth, not ours
        raise RequestError(400, "request body nests arrays or objects deeper than the JSON "
                           "parser allows") from None  # fmt: skip
    if not isinstance(body, dict):
        raise RequestError(400, f"request body must be a JSON object of `estimate` options, "
                           f"not {_json_type(body)}")  # fmt: skip
    return body


def estimate_parser() -> argparse.ArgumentParser:
    """The `estimate` subcommand's parser, as the CLI builds it."""
    from memtrace_trainer.cli import parser

    top, _ = parser()
    for action in top._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices["estimate"]  # type: ignore[no-any-return]
    raise AssertionError("the CLI has no estimate command")


def _quotes(message: str, value: str) -> bool:
    """Whether `message` quotes `value`: in Python's or Rust's quotes, or bare as a whole word
    when it is a name or path (a bare number could be any count in the message)."""
    if repr(value) in message or f'"{value}"' in message:
        return True
    if len(value) < 2 or value.replace(".", "").isdigit():
        return False
    return re.search(rf"(?<![\w/.-]){re.escape(value)}(?![\w/-]|\.\w)", message) is not None
