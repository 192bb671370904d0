"""Writes the recorder's events as a trace in JSON Lines (and `.mtrace` through memsim)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from memtrace_trainer import __version__
from memtrace_trainer.atomic import cannot_write, replacing, write_text
from memtrace_trainer.binaries import run_tool
from memtrace_trainer.errors import UserError

PRODUCER = "memtrace_trainer.symtrace"
_REQUEST = {"stream": 0, "mem": "device", "api": "allocator", "result": 0, "origin": "request"}


def lines(
    events: list[dict[str, Any]], metadata: dict[str, str], env: dict[str, str] | None = None
) -> list[str]:
    """`env`: the job's allocator settings (symtrace/allocconf.py), which memsim replays with."""
    header = {
        "kind": "header",
        "format_version": 1,
        "producer": {"name": PRODUCER, "version": __version__},
        "level": "allocator",
        "caching_disabled": False,
        "synthetic_addresses": True,
        "metadata": metadata,
    }
    if env:
        header["env"] = env
    out = [json.dumps(header, separators=(",", ":"))]
    for e in events:
        kind = e["kind"]
        rec: dict[str, Any] = {"kind": kind, "ts_ns": e["ts_ns"], "device": e["device"]}
        if kind == "marker":
            rec["text"] = e["text"]
        elif kind == "control":
            rec |= {k: v for k, v in e.items() if k not in ("kind", "ts_ns", "device")}
        elif kind == "alloc":
            rec |= {"addr": e["addr"], "size": e["size"], **_REQUEST, "category": e["category"]}
            rec["stream"] = e.get("stream", 0)
        else:
            rec |= {"addr": e["addr"], "size": e["size"], **_REQUEST, "stage": "immediate"}
            rec["stream"] = e.get("stream", 0)
        out.append(json.dumps(rec, separators=(",", ":")))
    out.append(json.dumps({"kind": "process_exit", "lost_events": 0}, separators=(",", ":")))
    return out


def write(path: Path, text_lines: list[str]) -> None:
    """Atomically writes `.jsonl`, or `.mtrace` by converting through `memsim convert`."""
    path = Path(path)
    if path.suffix not in (".jsonl", ".mtrace"):
        raise UserError(f"--out {path}: expected a .jsonl or .mtrace file name")
    if not path.parent.is_dir():
        raise UserError(f"--out {path}: directory {path.parent} does not exist")
    text = "\n".join(text_lines) + "\n"
    if path.suffix == ".jsonl":
        write_text(path, text)
        return
    try:
        scratch = tempfile.TemporaryDirectory(dir=path.parent, prefix=f".{path.name}.")
    except OSError as e:
        raise cannot_write(path, e) from e
    with scratch as d:
        src = Path(d) / "trace.jsonl"
        try:
            src.write_text(text)
        except OSError as e:
            raise cannot_write(path, e) from e
        with replacing(path, suffix=".mtrace") as out:
            done = run_tool("memsim", ["convert", "--", str(src), str(out)])
            if done.returncode != 0:
                raise UserError(f"memsim convert failed for {path}: {done.stderr.strip()}")
