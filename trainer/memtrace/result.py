"""`Estimate`: what `memtrace.estimate` answers, with the trace kept so that the answer can be
asked again (another GPU, a plot, memory_viz, an HTML report)."""

from __future__ import annotations

import copy
import html
import json
import os
import re
import shutil
import tempfile
import warnings
import weakref
import zlib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from memtrace_trainer.binaries import error_line, run_tool
from memtrace_trainer.errors import UserError
from memtrace_trainer.units import MIB

# The breakdown's part names for trace categories (memsim's `categories`, in its order); a
# category without a name here is its own part, so the parts always sum to `device_mib`.
PART_NAMES = {
    "parameter": "parameters",
    "gradient": "gradients",
    "activation": "activations",
    "workspace": "workspaces",
    "input": "inputs",
}


class Kept:
    """The folder an estimate keeps its trace in, removed when the last estimate holding it is
    collected (a copy of an estimate shares it), or at `Estimate.close()`; without the
    ResourceWarning a collected `TemporaryDirectory` gives."""

    def __init__(self) -> None:
        self.name = tempfile.mkdtemp(prefix="memtrace-")
        self._remove = weakref.finalize(self, shutil.rmtree, self.name, ignore_errors=True)

    def cleanup(self) -> None:
        self._remove()

    @property
    def closed(self) -> bool:
        return not self._remove.alive


class EstimateError(Exception):
    """The job could not be estimated: bad arguments (the message says what was expected), or
    the model failed on the tracer's device (the message names the op and your source line)."""


def memsim(
    *args: str, codes: tuple[int, ...] = (0,), keywords: dict[str, str] | None = None
) -> str:
    """`memsim ARGS`'s stdout; its error line as an `EstimateError` otherwise, with memsim's
    flags said as the caller's `keywords` (default: `estimate`'s)."""
    from memtrace.checks import KEYWORDS, as_keywords

    done = run_tool("memsim", list(args))
    if done.returncode not in codes:
        # The caller gave keyword arguments (capacity=, gpu=), which memsim knows as flags.
        said = as_keywords(error_line(done.stderr), keywords or KEYWORDS)
        raise EstimateError(f"memsim {args[0]}: {said}")
    return done.stdout


# The parts of memsim's page that say what to do, in its flags' words.
_WORDED = [re.compile(r'(<p id="headline"[^>]*>)(.*?)(</p>)', re.S),
           re.compile(r'(<p class="muted" id="details">)(.*?)(</p>)', re.S),
           re.compile(r'(<h2 id="warnings">Warnings</h2><ul>)(.*?)(</ul>)', re.S)]  # fmt: skip


def _in_keywords(page: str) -> str:
    """memsim's page with its flags said as the API's keywords where it says what to do."""
    from memtrace.api import as_keywords

    for part in _WORDED:
        page = part.sub(lambda m: m[1] + as_keywords(m[2]) + m[3], page)
    return page


def unavailable_in_api_words(raw: dict[str, Any]) -> None:
    """Why a baseline did not run, said as the API's caller can act on it (the report page and
    `to_json()` show it): the API has no `--memtracker` or `--ml-model`."""
    why = raw.get("unavailable", {})
    if "memtracker" in why:
        why["memtracker"] = (
            "not run by the Python API (`python -m memtrace_trainer estimate --memtracker` runs "
            "PyTorch's MemTracker over the same steps)"
        )
    if "ml" in why:
        why["ml"] = why["ml"].replace("--ml-model or ", "")


@dataclass
class Estimate:
    """The GPU memory one rank of a training job needs, from a symbolic trace replayed through
    the caching-allocator model.

    `device_mib` is the point estimate (peak reserved plus memory outside the allocator),
    `safe_mib` the calibrated upper bound verdicts use, `reserved_mib` and `allocated_mib` the
    allocator's peaks. `breakdown` splits `device_mib` by what the memory holds."""

    device_mib: float
    safe_mib: float
    reserved_mib: float
    allocated_mib: float
    gpu: str
    profile: str
    verdict: dict[str, Any]
    breakdown: dict[str, float]
    per_rank: list[dict[str, Any]]
    warnings: list[str]
    raw: dict[str, Any] = field(repr=False)
    _report: dict[str, Any] = field(repr=False)
    _dir: Kept = field(repr=False)
    # The capacity the verdict was judged at (`estimate`'s capacity=), so asking again keeps it.
    _capacity: str | None = field(default=None, repr=False)

    def close(self) -> None:
        """Remove the kept trace now (else when the estimate is collected); asking again
        (`fits` of another GPU or capacity, `report`, `to_memory_viz`) needs it, so those raise
        `EstimateError` after it. Copies share the trace: closing one closes them all."""
        self._dir.cleanup()

    def _trace(self) -> Path:
        """The kept trace, for asking again; an `EstimateError` once closed."""
        if self._dir.closed or not self.trace_path.is_file():
            raise EstimateError(
                "this estimate was closed (close(), or the end of its `with` block, on it or on a "
                "copy, which shares its trace): estimate again to ask it more"
            )
        return self.trace_path

    def __enter__(self) -> Estimate:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __copy__(self) -> Estimate:
        # Not through __getstate__, which carries the trace's text for a pickle: a copy in this
        # process shares the trace.
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        return new

    def __deepcopy__(self, memo: dict[int, Any]) -> Estimate:
        # The trace is shared, not copied: a copy asks again of the same trace, which stays
        # while any copy does.
        new = self.__copy__()
        memo[id(self)] = new
        for f in fields(self):
            if f.name != "_dir":
                setattr(new, f.name, copy.deepcopy(getattr(self, f.name), memo))
        return new

    def __getstate__(self) -> dict[str, Any]:
        # The trace lives in a temporary folder of this process, removed with the estimate: a
        # pickle carries the trace itself (compressed), so that the estimate loaded elsewhere or
        # later can still be asked again; a closed one stays closed.
        state = {k: v for k, v in self.__dict__.items() if k != "_dir"}
        closed = self._dir.closed or not self.trace_path.is_file()
        state["_trace_zlib"] = None if closed else _packed(self.trace_path)
        # Asking again names the profile by its path, which another environment may not have
        # (a custom profile's file, the checkout it was shipped in): its text goes along.
        try:
            state["_profile_toml"] = Path(self.profile).read_text()
        except OSError:
            state["_profile_toml"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state = dict(state)
        packed = state.pop("_trace_zlib", None)
        toml = state.pop("_profile_toml", None)
        self.__dict__.update(state)
        self._dir = Kept()
        if packed is None:
            self._dir.cleanup()
            return
        _unpacked(packed, self.trace_path)
        if toml is not None and not Path(self.profile).is_file():
            # The same name: memsim and the report name a profile by its file.
            here = Path(self._dir.name) / Path(self.profile).name
            here.write_text(toml)
            self.profile = str(here)

    @property
    def trace_path(self) -> Path:
        """The symbolic trace (a memtrace JSONL trace; `memsim` reads it)."""
        return Path(self._dir.name) / "symbolic.jsonl"

    def fits(
        self,
        gpu: str | os.PathLike[str] | None = None,
        *,
        capacity: str | None = None,
        point: bool | None = None,
    ) -> bool:
        """Whether the job fits `gpu` (a profile name or path; default: the one estimated for),
        on the safe number, or on the point estimate with `point=True` (default: what the
        estimate judged, so `fits()` is always the estimate's own verdict).

        The memory judged is `capacity` (e.g. "20GiB") when given; else, with no `gpu`, the
        estimate's own `capacity` when it was given one; else the GPU's total memory. A `gpu`
        named with no `capacity` is judged on its total memory, even when it is the estimated
        GPU: a warning says so when the estimate had a capacity of its own."""
        from memtrace.api import MemtraceWarning
        from memtrace.checks import flag as _flag
        from memtrace.checks import size
        from memtrace.checks import text as _text
        from memtrace_trainer.estimate import judged_on_point

        if gpu is not None:
            gpu = _text("gpu", gpu)
        capacity = size("capacity", capacity)
        if point is not None:
            point = _flag("point", point)
        if point is None:
            point = judged_on_point(self.raw)
        if gpu is None and capacity is None and point == judged_on_point(self.raw):
            return bool(self.verdict["fits"])
        # A closed estimate says so before anything of the question (it warned, then raised).
        trace = self._trace()
        if gpu is not None and capacity is None and self._capacity is not None:
            warnings.warn(
                f"fits({gpu!r}) judges that GPU's total memory, not the capacity "
                f"{self._capacity} this estimate was given; pass capacity= to judge a share of "
                "it, or call fits() for the estimate's own",
                MemtraceWarning,
                stacklevel=2,
            )
        args = ["replay", f"--profile={gpu or self.profile}", "--json"]
        judged_at = capacity if capacity is not None else None if gpu else self._capacity
        if judged_at is not None:
            args.append(f"--capacity={judged_at}")
        args += ["--point"] if point else []
        data = json.loads(memsim(*args, "--", str(trace), codes=(0, 1)))
        # What memsim says of the question (a trace emulated for another GPU, unmeasured
        # constants) reaches the caller as it does from `estimate`, in its keywords' words.
        from memtrace.checks import as_keywords

        for said in data.get("warnings", []):
            warnings.warn(as_keywords(said), MemtraceWarning, stacklevel=2)
        return bool(data["verdict"]["fits"])

    def timeline(self) -> Any:
        """Memory over the traced steps: one row per sampled point (`at`, the record index;
        `allocated_mib`, `reserved_mib`, and MiB per category), as a pandas DataFrame when
        pandas is installed, else a list of dicts."""
        names = self._report["categories"]
        rows = [
            {
                "at": s["at"],
                "allocated_mib": s["allocated"] / MIB,
                "reserved_mib": s["reserved"] / MIB,
                **{f"{n}_mib": v / MIB for n, v in zip(names, s["by_category"], strict=True)},
            }
            for s in self._report["samples"]
        ]
        try:
            import pandas as pd
        except ImportError:
            return rows
        return pd.DataFrame(rows)

    def plot(self, ax: Any = None) -> Any:
        """Memory over the steps, stacked by category, with the reserved line (matplotlib,
        imported here), on `ax` (a matplotlib Axes; default: a new figure). Returns the axes."""
        try:
            import matplotlib.pyplot as plt
        except ImportError as e:
            raise EstimateError(
                "plot() draws with matplotlib, which is not installed: "
                "pip install matplotlib (timeline() has the same numbers)"
            ) from e
        if ax is not None and not all(hasattr(ax, a) for a in ("stackplot", "step", "legend")):
            raise EstimateError(f"plot(ax={ax!r}): expected a matplotlib Axes (or None for a "
                                "new figure)")  # fmt: skip
        names = self._report["categories"]
        samples = self._report["samples"]
        if ax is None:
            _, ax = plt.subplots(figsize=(9, 4))
        xs = [s["at"] for s in samples]
        layers = [[s["by_category"][i] / MIB for s in samples] for i in range(len(names))]
        ax.stackplot(xs, layers, labels=names, step="post", alpha=0.85)
        ax.step(xs, [s["reserved"] / MIB for s in samples], where="post", color="k",
                label="reserved")  # fmt: skip
        ax.set_xlabel("trace records (logical time)")
        ax.set_ylabel("MiB")
        ax.legend(loc="upper left", fontsize=8)
        return ax

    def to_memory_viz(self, path: str | Path) -> Path:
        """The trace as a PyTorch memory snapshot pickle (`path` ends in .pickle or .pkl), for
        https://pytorch.org/memory_viz."""
        out = _path("to_memory_viz", path, ".pickle or .pkl")
        if out.suffix not in (".pickle", ".pkl"):
            # memsim convert writes what the name says (.json is a Perfetto trace, .mtrace ours):
            # a snapshot was asked for.
            raise EstimateError(
                f"to_memory_viz({str(path)!r}): expected a path ending in .pickle or .pkl (a "
                "PyTorch memory snapshot); `memsim convert` writes the other formats"
            )
        trace = self._trace()
        said = f"to_memory_viz({str(path)!r})"
        _writable(said, out, "a file name ending in .pickle or .pkl")
        try:
            # `--` first: a name that begins with `-` is a name, not a flag.
            memsim("convert", "--", str(trace), str(out))
        except EstimateError as e:
            # memsim names the trace it read, this estimate's temporary file.
            why = str(e).removeprefix("memsim convert: ")
            why = why.replace(f"writing {out} from {trace}: ", "")
            why = why.replace(str(trace), "this estimate's trace")
            raise EstimateError(f"{said}: {why}") from None
        return out

    def report(self, path: str | Path) -> Path:
        """One self-contained HTML page: memory over the steps, what is alive at the peak, the
        segment map, the estimators side by side and the verdict."""
        from memtrace.api import as_keywords
        from memtrace_trainer.atomic import write_text
        from memtrace_trainer.estimate import write_report

        out = _path("report", path, ".html")
        # As memsim report takes it (`.htm` too, any case), refused here in the API's words.
        if out.suffix.lower() not in (".html", ".htm"):
            raise EstimateError(
                f"report({str(path)!r}): expected a path ending in .html or .htm (the page is HTML)"
            )
        trace = self._trace()  # a closed estimate says so first
        _writable(f"report({str(path)!r})", out, "a file name ending in .html")
        try:
            page = write_report(trace, self.raw, Path(self.profile), out)
            # memsim words the page from the estimate's numbers, in the CLI's words
            # (`--capacity`): said in the API's (`capacity`), as `str` says them, in those words
            # only (the headline, its details, the warnings), not in the title or the paths.
            write_text(page, _in_keywords(page.read_text(encoding="utf-8")))
        except UserError as e:
            from memtrace.checks import KEYWORDS

            # memsim's `--html` is report()'s path.
            raise EstimateError(as_keywords(str(e), {**KEYWORDS, "html": "path"})) from e
        return page

    def to_json(self) -> str:
        """The estimate as `python -m memtrace_trainer estimate --json` prints it, plus the
        breakdown."""
        return json.dumps({**self.raw, "breakdown_mib": self.breakdown})

    def _repr_html_(self) -> str:
        # memest's words, with the capacity judged beside the verdict as `str` has it; only the
        # colour is the notebook's.
        from memtrace_trainer.estimate import capacity_beside

        text = self.raw["text"]
        beside = capacity_beside(self.verdict)
        color = "#1a7f37" if self.verdict["fits"] else "#c00"
        rows = "".join(
            f"<tr><td>{html.escape(k)}</td><td style='text-align:right'>{mib:,.1f}</td></tr>"
            for k, mib in self.breakdown.items()
        )
        return (
            f"<div><b>{html.escape(text['headline'])}: <span style='color:{color}'>"
            f"{html.escape(text['verdict'])}</span>{html.escape(beside)}</b>"
            f"<table><tr><th>part</th><th>MiB</th></tr>{rows}</table></div>"
        )

    def __str__(self) -> str:
        from memtrace.api import as_keywords
        from memtrace_trainer.estimate import capacity_beside, sentence

        return as_keywords(sentence(self.raw["text"]) + capacity_beside(self.verdict))


# Blocks of a trace pickled or loaded: a trace runs to gigabytes, and neither end holds it whole.
_BLOCK = 1 << 22


def _packed(trace: Path) -> bytes:
    """The trace's bytes compressed, read a block at a time."""
    z = zlib.compressobj(1)
    parts = []
    with trace.open("rb") as f:
        while block := f.read(_BLOCK):
            parts.append(z.compress(block))
    parts.append(z.flush())
    return b"".join(parts)


def _unpacked(packed: bytes, out: Path) -> None:
    """`_packed`'s bytes written out as the trace, a block at a time."""
    z = zlib.decompressobj()
    with out.open("wb") as f:
        for at in range(0, len(packed), _BLOCK):
            rest = packed[at : at + _BLOCK]
            while rest:
                f.write(z.decompress(rest, _BLOCK))
                rest = z.unconsumed_tail
        f.write(z.flush())


def _path(method: str, path: Any, ending: str) -> Path:
    """A file name a method writes to: a string or a path (`os.PathLike`)."""
    if not isinstance(path, str | os.PathLike) or not isinstance(os.fspath(path), str):
        raise EstimateError(f"{method}({path!r}): expected a path ending in {ending}")
    return Path(path)


def _writable(said: str, out: Path, expected: str) -> None:
    """Refuse, in the words of the call `said`, a file name that cannot be written: a folder in
    its place, or a folder above it that does not exist (never made for it)."""
    # `os.path`'s, which answer False where `stat` fails otherwise (a name too long): what
    # they do not refuse is the writer's to say.
    if os.path.isdir(out):
        raise EstimateError(f"{said}: {out} is a folder; expected {expected}")
    if not os.path.isdir(out.parent):
        what = "is not a folder" if os.path.exists(out.parent) else "does not exist"
        raise EstimateError(f"{said}: the folder {out.parent} {what}")


def breakdown(raw: dict[str, Any], report: dict[str, Any]) -> dict[str, float]:
    """`device_mib` split: block bytes by category at the allocated peak, what the allocator
    holds beyond them at its reserved peak (cached and fragmented), and memory outside the
    allocator (CUDA context, libraries, NCCL, and what a real run's trace held there itself).
    The reserved peak is the estimate's own (replayed
    at the allocator's budget, where a tight capacity makes the allocator free its cache and
    retry), the categories the report's unlimited replay's: at a capacity tight enough to retry,
    the two replays' allocated peaks can differ a little (a few MiB), and `allocator_cache`
    takes the difference, so the parts still sum to `device_mib`."""
    cats = report["categories_at_peak"]
    out = {PART_NAMES.get(c, c): cats.get(c, 0) / MIB for c in report["categories"]}
    reserved = float(raw["estimates"]["symbolic"]["reserved_mib"])
    out["allocator_cache"] = reserved - sum(cats.values()) / MIB
    out["outside_allocator"] = float(raw.get("outside_allocator", {}).get("total_mib", 0.0))
    return out
