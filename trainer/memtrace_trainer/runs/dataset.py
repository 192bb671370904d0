"""`dataset`: run directories collected into one table with the GPUMemNet columns, so the
estimators read our runs and GPUMemNet's CSVs alike.

Labels: `Max GPU Memory (MiB)` and `device_peak_mib` are the NVML peak (per process where NVML
reports it, else device-level used memory): nvidia-smi-style truth, the scope of GPUMemNet's
label. `max_memory_reserved_mib` is the caching allocator's peak: the truth for allocator
fidelity (what memsim predicts). `max_memory_allocated_mib` is live tensor bytes.
"""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path
from typing import Any

from memtrace_trainer.errors import UserError, is_integer, json_object, read_text
from memtrace_trainer.features import CNN_COLUMNS, MLP_COLUMNS, zoo_cells
from memtrace_trainer.runs.rundir import FILES
from memtrace_trainer.units import MIB

GPUMEMNET_COLUMNS = tuple(dict.fromkeys([*MLP_COLUMNS, *CNN_COLUMNS]))
COLUMNS = (
    *GPUMEMNET_COLUMNS,
    "Max GPU Memory (MiB)",
    "Status",
    "run_id",
    "spec",
    "family",
    "optimizer",
    "amp",
    "max_memory_reserved_mib",
    "max_memory_allocated_mib",
    "device_peak_mib",
    "device_peak_source",
    "oom",
    "step_time_s",
    "device",
    "gpu",
    "torch",
    "cuda",
    "profile",
    "job",
)
# The run's settings beyond the spec, batch, optimizer and amp columns that shape its memory:
# `memest compare` traces each row with them (`symtrace --batch` keys), or it would score
# another job (gpt2 at its default sequence, a ResNet at 224x224 for one run at 64x64).
JOB_KEYS = ("input_shape", "seq_len", "num_classes", "checkpointing", "grad_accum")
_JOB_DEFAULTS: dict[str, Any] = {"checkpointing": False, "grad_accum": 1}


def job_cell(config: dict[str, Any]) -> str:
    """The `job` column: a JSON object of the run's non-default `JOB_KEYS`, empty when none."""
    job = {k: config[k] for k in JOB_KEYS
           if config.get(k) is not None and config.get(k) != _JOB_DEFAULTS.get(k)}  # fmt: skip
    if job.get("checkpointing") is True:
        job["checkpointing"] = "full"  # what `run --checkpointing` trains with
    return json.dumps(job, sort_keys=True) if job else ""


def _load(path: Path, name: str) -> dict[str, Any]:
    where = str(path / name)
    text = read_text(path / name, where, "a run file of JSON (UTF-8 text)")
    return json_object(text, where, not_json="unreadable run file")


def _mib(value: Any) -> str:
    return "" if value is None else f"{value / MIB:.1f}"


def profile_for_gpu(gpu: str | None, known: list[str]) -> str:
    """The profile among `known` (`profile.known_profiles`) whose `[gpu] name` is this GPU, or
    empty."""
    if not gpu:
        return ""
    from memtrace_trainer.notes import warn
    from memtrace_trainer.profile import load_profile

    for name in known:
        try:
            profile = load_profile(name)
        except UserError as e:
            warn(f"dataset: skipped profile {name}: {e}")
            continue
        if profile.gpu == gpu:
            return profile.name
    return ""


# The cells of a features row that hold text; every other GPUMemNet cell is a count.
_TEXT_CELLS = ("Filename", "Activations-Params", "Activation Function")


def _features_cells(feats: dict[str, Any], path: Path) -> dict[str, str]:
    where = path / "features.json"
    for key, least in (("total_activations", 0), ("total_parameters", 0), ("batch_size", 1)):
        value = feats[key]
        if not is_integer(value) or value < least:
            raise UserError(f"{where}: field {key!r} is {value!r}: expected an integer of at "
                            f"least {least}")  # fmt: skip
    if "gpumemnet_row" not in feats:
        for key, want in (("layer_counts", dict), ("sequence", list)):
            if not isinstance(feats.get(key, want()), want):
                raise UserError(f"{where}: field {key!r} is {feats[key]!r}: expected a "
                                f"{'mapping' if want is dict else 'list'}")  # fmt: skip
        return zoo_cells(feats)
    row = feats["gpumemnet_row"]
    if not isinstance(row, dict):
        raise UserError(f"{where}: field 'gpumemnet_row' is {row!r}: expected a mapping of "
                        "GPUMemNet column -> cell")  # fmt: skip
    cells = {}
    for column, cell in row.items():
        field = f"gpumemnet_row.{column}"
        if column not in GPUMEMNET_COLUMNS:
            raise UserError(f"{where}: field {field!r}: not a GPUMemNet column (expected some "
                            f"of {list(GPUMEMNET_COLUMNS)})")  # fmt: skip
        if column in _TEXT_CELLS:
            ok = isinstance(cell, str)
            want = "a string"
        else:
            ok = (is_integer(cell) and cell >= 0) or (isinstance(cell, str) and cell.isdigit())
            want = "a count (an integer of at least 0)"
        if not ok:
            raise UserError(f"{where}: field {field!r} is {cell!r}: expected {want}")
        cells[column] = str(cell)
    cells.pop("Filename", None)
    return cells


def _text(data: dict[str, Any], key: str, where: Path, what: str, null: bool = True) -> str:
    """A text field of a run file, "" when null (and null is allowed); else the error naming
    the file and the field."""
    value = data.get(key)
    if (value is None and null) or (isinstance(value, str) and value):
        return value or ""
    raise UserError(f"{where}: field {key!r} is {value!r}: expected {what}"
                    + (" or null" if null else ""))  # fmt: skip


def row_of(path: Path, known: list[str], said: set[str] | None = None) -> dict[str, str]:
    """The table row of the run directory `path`; `said` collects the profiles that could not
    be loaded here and were warned about (once each)."""
    config, feats, labels = (_load(path, f) for f in FILES)
    for key in ("total_activations", "total_parameters", "batch_size"):
        if key not in feats:
            raise UserError(f"{path / 'features.json'}: missing field {key!r}")
    for key in ("oom", "device", "torch"):
        if key not in labels:
            raise UserError(f"{path / 'labels.json'}: missing field {key!r}")
    at = path / "config.json"
    spec = _text(config, "model", at, "a model spec") or _text(config, "entry", at, "MOD:FN")
    if not spec:
        raise UserError(f"{at}: fields 'model' and 'entry' are both missing or null: expected "
                        "the run's model spec or entry")  # fmt: skip
    run_id = _text(config, "id", at, "the run id (a string)") if "id" in config else path.name
    if not run_id:
        raise UserError(f"{at}: field 'id' is null: expected the run id (a string)")
    optimizer = _text(config, "optimizer", at, "an optimizer name")
    amp = _text(config, "amp", at, "an autocast dtype (bf16, fp16)")
    profile = _text(config, "profile", at, "a GPU profile name")
    if profile and profile not in known and (said is None or profile not in said):
        from memtrace_trainer.notes import warn
        from memtrace_trainer.profile import load_profile

        try:
            load_profile(profile)  # a .toml path, as `run --profile` takes one
        except UserError as e:
            # Said, not refused: the name was checked where the run ran (a path relative to
            # there, a profile only the cluster's $MEMTRACE_PROFILES holds), and the table
            # needs only the name.
            if said is not None:
                said.add(profile)
            warn(f"dataset: {at}: field 'profile' is {profile!r}, which cannot be loaded here "
                 f"({e}); the profile column keeps it as given"
                 + ("" if said is None else ", and runs naming it are not said again"))  # fmt: skip
    filename = spec.partition(":")[2] if spec.startswith("gpumemnet:") else spec
    where = path / "labels.json"
    torch = _text(labels, "torch", where, "the torch version (a string)", null=False)
    gpu = _text(labels, "gpu", where, "the GPU name (a string)")
    cuda = _text(labels, "cuda", where, "the CUDA version (a string)")
    source = _text(labels, "device_peak_source", where, "where the peak came from (a string)")

    def number(value: Any, field: str, positive: bool = False) -> float | None:
        # A hand-edited or damaged label was an internal error (`None.get`, `str / int`), or a
        # nan/inf/negative cell that made `memest compare` refuse the whole file.
        if value is None:
            return None
        want = "a positive number or null" if positive else "a number of at least 0 or null"
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
            or value < 0
            or (positive and value == 0)
        ):
            raise UserError(f"{where}: field {field!r} is {value!r}: expected {want}")
        return value

    # A measured device peak is never 0: NVML sees at least the CUDA context.
    peak = number(labels.get("device_peak_bytes"), "device_peak_bytes", positive=True)
    oom = labels["oom"]
    if not isinstance(oom, bool):  # `bool("false")` was an OOM
        raise UserError(f"{where}: field 'oom' is {oom!r}: expected true or false")
    device = labels["device"]
    if not isinstance(device, str) or not device:
        raise UserError(f"{where}: field 'device' is {device!r}: expected a device like cuda")
    # `cuda:0` is a GPU run: the column holds the kind, as `run` writes it (`device.type`).
    device = device.partition(":")[0]
    step_time = labels.get("step_time") or {}
    if not isinstance(step_time, dict):
        raise UserError(f"{where}: field 'step_time' is {step_time!r}: expected a mapping or null")
    step = number(step_time.get("median_s"), "step_time.median_s")
    reserved = number(labels.get("max_memory_reserved_bytes"), "max_memory_reserved_bytes")
    allocated = number(labels.get("max_memory_allocated_bytes"), "max_memory_allocated_bytes")
    return {
        "Filename": filename,
        **_features_cells(feats, path),
        "Max GPU Memory (MiB)": "" if oom else _mib(peak),
        "Status": "OOM_CRASH" if oom else "SUCCESSFUL",
        "run_id": run_id,
        "spec": spec,
        "family": str(feats.get("family", "")),
        "optimizer": optimizer,
        "amp": amp or "fp32",
        "max_memory_reserved_mib": _mib(reserved),
        "max_memory_allocated_mib": _mib(allocated),
        "device_peak_mib": _mib(peak),
        "device_peak_source": source,
        "oom": str(oom).lower(),
        "step_time_s": "" if step is None else f"{step:.6f}",
        "device": device,
        "gpu": gpu,
        "torch": torch,
        "cuda": cuda,
        "profile": profile or profile_for_gpu(gpu, known),
        "job": job_cell(config),
    }


def _where(row: dict[str, str]) -> str:
    return row["gpu"] or row["device"]


def _partial(name: str) -> bool:
    """A run directory still being written (`.NAME.partial-*`), or left by a killed run."""
    return name.startswith(".") and ".partial-" in name


def find_runs(root: Path) -> tuple[list[Path], list[str]]:
    """Finished run directories under `root`, and why each directory that looks like a run is
    not one: a `.NAME.partial-*` directory, or one holding some of the run files but not all
    (a `root` whose path says `partial-` is still read)."""
    if not root.is_dir():
        raise UserError(f"dataset: {root} is not a directory")
    found: set[Path] = set()
    partial: set[Path] = set()
    for p in root.rglob("*"):
        parts = p.relative_to(root).parts
        cut = next((i for i, part in enumerate(parts) if _partial(part)), None)
        if cut is not None:
            partial.add(root.joinpath(*parts[: cut + 1]))
        elif p.name in FILES and p.name != "config.json" and p.is_file():
            found.add(p.parent)  # a config.json alone is no run's: models ship one too
    runs, skipped = [], []
    for p in sorted(found):
        missing = [f for f in FILES if not (p / f).is_file()]
        if missing:
            skipped.append(f"{p}: not a complete run directory (no {', '.join(missing)})")
        else:
            runs.append(p)
    skipped += [
        f"{p}: an unfinished run directory (being written by a running launch, or left by a "
        "killed one, which a rerun of that launch removes and runs again)"
        for p in sorted(partial)
    ]
    return runs, skipped


def failed_runs(root: Path) -> list[tuple[Path, int]]:
    """Each launch folder under `root` (`root` included) with runs that failed and have not
    finished since: the folder and how many."""
    folders = {root / "failed"} | {
        p for p in root.rglob("failed")
        if p.is_dir() and not any(_partial(part) for part in p.relative_to(root).parts)
    }  # fmt: skip
    out = []
    for folder in sorted(f for f in folders if f.is_dir()):
        records = [
            r
            for r in folder.glob("*.json")
            if not all((folder.parent / "runs" / r.stem / f).is_file() for f in FILES)
        ]
        if records:
            out.append((folder.parent, len(records)))
    return out


def collect(root: Path, include_cpu: bool) -> tuple[str, dict]:
    """The CSV text and a summary (rows, skipped CPU-fallback runs, failed runs); what it does
    not use (incomplete or unfinished run directories, a second copy of a run) is warned
    about."""
    from memtrace_trainer.notes import warn
    from memtrace_trainer.profile import known_profiles

    rows, skipped = [], []
    runs, incomplete = find_runs(root)
    for line in incomplete:
        warn(f"dataset: skipped {line}")
    known = known_profiles() if runs else []
    said: set[str] = set()
    seen: dict[str, list[tuple[Path, dict[str, str]]]] = {}
    for path in runs:
        row = row_of(path, known, said)
        # The id hashes the config alone: the same sweep run on two GPUs into two OUT folders
        # gives the same ids to distinct measurements, all kept. Only a copy (every cell the
        # same) is left out: counted twice, it leaked across cross-validation folds.
        same = seen.setdefault(row["run_id"], [])
        copy = next((p for p, r in same if r == row), None)
        if copy is not None:
            warn(f"dataset: run {row['run_id']} is in both {copy} and {path} with the same "
                 f"labels: kept the first, left out {path}")  # fmt: skip
            continue
        if same:
            warn(f"dataset: run {row['run_id']} was measured more than once ({same[0][0]} on "
                 f"{_where(same[0][1])}, {path} on {_where(row)}): kept both rows; they share "
                 "its run_id")  # fmt: skip
        same.append((path, row))
        if row["device"] != "cuda" and not include_cpu:
            skipped.append(str(path))
            continue
        rows.append(row)
    failed = failed_runs(root)
    for folder, n in failed:
        warn(f"dataset: {n} run{'s' * (n != 1)} of {folder} failed ({folder / 'failed'}/): "
             "not in the table; rerun its launch to retry them")  # fmt: skip
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n", restval="")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue(), {"rows": len(rows), "skipped_cpu_runs": skipped,
                            "failed": sum(n for _, n in failed)}  # fmt: skip
