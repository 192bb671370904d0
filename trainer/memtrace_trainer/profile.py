"""GPU profiles, as the one parser reads them: `memsim profile NAME|PATH --json` (Rust,
`simulator::profile`). Python never parses the TOML itself, so the two sides cannot disagree on
defaults or required fields."""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memtrace_trainer.binaries import error_line, run_tool
from memtrace_trainer.errors import UserError
from memtrace_trainer.notes import warn
from memtrace_trainer.units import MIB

DEFAULT_PROFILE = "a100-40gb"

# The profile keys the tracer's CUDA emulation reads: a use of an unmeasured one is warned about.
EMULATION_KEYS = (
    "workspace.cublas_workspace_config",
    "workspace.cublaslt_workspace_kib",
    "workspace.cudnn_workspace_factor",
)


@dataclass(frozen=True)
class Profile:
    """What the emulation needs to know about the GPU and its library versions."""

    name: str
    path: Path
    gpu: str
    compute_capability: tuple[int, int]
    sm_count: int
    total_memory: int
    cublas_workspace_bytes: int
    cublaslt_workspace_bytes: int
    cudnn_workspace_factor: float
    unmeasured: tuple[str, ...] = ()
    # Memory the process holds outside the caching allocator ([outside_allocator]), by what
    # the job has loaded: the context always, cuBLAS and cuDNN once used.
    context_bytes: int = 0
    cublas_bytes: int = 0
    cudnn_bytes: int = 0

    def warn_unmeasured(self) -> None:
        """One warning per unmeasured constant the emulation uses."""
        for key in EMULATION_KEYS:
            if key in self.unmeasured:
                warn(f"profile {self.name}: {key} is marked unmeasured ([provenance]); the traced "
                     "workspaces rest on a placeholder")  # fmt: skip


def capacity_source_text(source: str | None) -> str:
    """Where a verdict's capacity came from (`capacity_source` in the JSON), in the words the
    Rust commands use (`simulator::fit::CapacitySource::describe`)."""
    return "--capacity" if source == "flag" else "the profile's total memory"


def known_profiles() -> list[str]:
    """The names of the known GPU profiles, as memsim finds them ($MEMTRACE_PROFILES, else the
    repository's or the wheel's `profiles/`): the one place that decides where they live."""
    done = run_tool("memsim", ["profile", "--list", "--json"])
    if done.returncode != 0:
        raise UserError(
            error_line(done.stderr) or f"memsim profile --list failed ({done.returncode})"
        )
    try:
        names = json.loads(done.stdout)
    except json.JSONDecodeError as e:
        raise UserError(f"memsim profile --list --json: not JSON ({e})") from None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise UserError("memsim profile --list --json: expected a list of names")
    return names


def _stamp(path: Any) -> tuple[str, int, int] | None:
    """Which file `path` is and which version of it: resolved, its mtime in ns and its size."""
    try:
        st = os.stat(path)
    except (OSError, TypeError, ValueError):
        return None
    return os.path.realpath(path), st.st_mtime_ns, st.st_size


class _Profiles:
    """memsim's reading of each profile, kept while its file is unchanged: a profile edited at
    the same path (a notebook tuning a TOML) was answered from the cache, its tracer constants
    stale beside memsim's own fresh reading of the file."""

    SIZE = 32

    def __init__(self) -> None:
        self.kept: dict[tuple[Any, ...], tuple[Any, dict[str, Any]]] = {}
        self.lock = threading.Lock()  # estimates from several threads check their profiles at once

    def __call__(self, name: str, capacity: str | None = None) -> dict[str, Any]:
        # A path is keyed by the file it names (the same relative path elsewhere is another);
        # a name by where memsim looks for it.
        given = _stamp(name) if os.path.isfile(name) else None
        key = (given[0] if given else name, capacity, os.environ.get("MEMTRACE_PROFILES"))
        hit = self.kept.get(key)
        if hit is not None and hit[0] is not None and _stamp(hit[1].get("path")) == hit[0]:
            return hit[1]
        # The file's version as it was before memsim read it: an edit meanwhile reads it again.
        # A name's file is known once memsim has found it: its first reading is kept unstamped
        # (a stamp taken after the read would vouch for an edit that landed during it), and
        # read again when next asked, stamped first.
        before = given or (_stamp(hit[1].get("path")) if hit is not None else None)
        data = _memsim_profile(name, capacity)
        if before is not None and not given and before != _stamp(data.get("path")):
            before = None  # the name found another file, or this one changed during the read
        with self.lock:
            self.kept[key] = (before, data)
            while len(self.kept) > self.SIZE:
                del self.kept[next(iter(self.kept))]
        return data

    def cache_clear(self) -> None:
        with self.lock:
            self.kept.clear()


def _memsim_profile(name: str, capacity: str | None) -> dict[str, Any]:
    cap = [] if capacity is None else [f"--capacity={capacity}"]
    done = run_tool("memsim", ["profile", name, *cap, "--json"])
    if done.returncode != 0:
        msg = error_line(done.stderr)
        raise UserError(msg or f"memsim profile {name} failed ({done.returncode})")
    try:
        data = json.loads(done.stdout)
    except json.JSONDecodeError as e:
        raise UserError(f"memsim profile {name} --json: not JSON ({e})") from None
    if not isinstance(data, dict):
        raise UserError(f"memsim profile {name} --json: expected an object")
    return data


_read = _Profiles()


def load_profile(name: str | None, capacity: str | None = None) -> Profile:
    """A profile NAME (profiles/NAME.toml or $MEMTRACE_PROFILES) or a .toml path; `None` is the
    default profile, a100-40gb. A `capacity` (`--capacity` as the user typed it) is checked by
    memsim's one size parser here, so a bad one fails before any tracing."""
    if name is not None and not name.strip():
        raise UserError(f"--profile {name!r}: expected a GPU profile NAME (profiles/NAME.toml) "
                        "or a .toml path")  # fmt: skip
    if name is not None and name.startswith("-"):
        # memsim would read it as its own flag (`--list` answered a list, `--step=x` a clap
        # error naming no --profile); no profile name starts with `-`, and a path can say `./`.
        raise UserError(
            f"--profile {name!r}: expected a GPU profile NAME (profiles/NAME.toml) or a .toml "
            f"path, not a flag (a file of that name: {'./' + name!r})"
        )
    data = _read(name or DEFAULT_PROFILE, capacity)
    try:
        cc = data["gpu"]["compute_capability"]
        derived = data["derived"]
        return Profile(
            name=str(data["name"]),
            path=Path(data["path"]),
            gpu=str(data["gpu"]["name"]),
            compute_capability=(int(cc[0]), int(cc[1])),
            sm_count=int(data["gpu"]["sm_count"]),
            total_memory=int(data["gpu"]["total_memory"]),
            cublas_workspace_bytes=int(derived["cublas_workspace_bytes"]),
            cublaslt_workspace_bytes=int(derived["cublaslt_workspace_bytes"]),
            cudnn_workspace_factor=float(derived.get("cudnn_workspace_factor", 1.0)),
            unmeasured=tuple(data.get("provenance", {}).get("unmeasured", [])),
            **{
                f"{lib}_bytes": int(float(data["outside_allocator"][f"{lib}_mib"]) * MIB)
                for lib in ("context", "cublas", "cudnn")
            },
        )
    except (KeyError, TypeError, ValueError, IndexError) as e:
        raise UserError(f"memsim profile {name} --json: unexpected output ({e!r})") from None
