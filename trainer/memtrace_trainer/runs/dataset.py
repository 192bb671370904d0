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

from memtrace_trainer.errors import UserError
from memtrace_trainer.features import CNN_COLUMNS, MLP_COLUMNS, zoo_cells
from memtrace_trainer.runs.rundir import FILES

MIB = 1024 * 1024
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
    try:
        data = json.loads((path / name).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise UserError(f"{path / name}: unreadable run file ({e})") from None
    if not isinstance(data, dict):
        raise UserError(f"{path / name}: expected a JSON object")
    return data


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


def _features_cells(feats: dict[str, Any]) -> dict[str, str]:
    if "gpumemnet_row" in feats:
        row = dict(feats["gpumemnet_row"])
        row.pop("Filename", None)
        return row
    return zoo_cells(feats)


def row_of(path: Path, known: list[str]) -> dict[str, str]:
    config, feats, labels = (_load(path, f) for f in FILES)
    for key in ("total_activations", "total_parameters", "batch_size"):
        if key not in feats:
            raise UserError(f"{path / 'features.json'}: missing field {key!r}")
    for key in ("oom", "device", "torch"):
        if key not in labels:
            raise UserError(f"{path / 'labels.json'}: missing field {key!r}")
    spec = config.get("model") or config.get("entry") or ""
    filename = spec.partition(":")[2] if spec.startswith("gpumemnet:") else spec
    where = path / "labels.json"

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
        **_features_cells(feats),
        "Max GPU Memory (MiB)": "" if oom else _mib(peak),
        "Status": "OOM_CRASH" if oom else "SUCCESSFUL",
        "run_id": str(config.get("id", path.name)),
        "spec": spec,
        "family": str(feats.get("family", "")),
        "optimizer": str(config.get("optimizer", "")),
        "amp": str(config.get("amp") or "fp32"),
        "max_memory_reserved_mib": _mib(reserved),
        "max_memory_allocated_mib": _mib(allocated),
        "device_peak_mib": _mib(peak),
        "device_peak_source": labels.get("device_peak_source") or "",
        "oom": str(oom).lower(),
        "step_time_s": "" if step is None else f"{step:.6f}",
        "device": device,
        "gpu": labels.get("gpu") or "",
        "torch": str(labels["torch"]),
        "cuda": labels.get("cuda") or "",
        "profile": config.get("profile") or profile_for_gpu(labels.get("gpu"), known),
        "job": job_cell(config),
    }


def find_runs(root: Path) -> list[Path]:
    """Finished run directories under `root` (temporary `.NAME.partial-*` ones excluded, by
    their own name: a `root` whose path says `partial-` is still read)."""
    if not root.is_dir():
        raise UserError(f"dataset: {root} is not a directory")

    def unfinished(run: Path) -> bool:
        return any(".partial-" in part for part in run.relative_to(root).parts)

    found = {p.parent for p in root.rglob("labels.json") if not unfinished(p.parent)}
    return sorted(p for p in found if all((p / f).is_file() for f in FILES))


def collect(root: Path, include_cpu: bool) -> tuple[str, dict]:
    """The CSV text and a summary (rows, skipped CPU-fallback runs)."""
    from memtrace_trainer.profile import known_profiles

    rows, skipped = [], []
    runs = find_runs(root)
    known = known_profiles() if runs else []
    for path in runs:
        row = row_of(path, known)
        if row["device"] != "cuda" and not include_cpu:
            skipped.append(str(path))
            continue
        rows.append(row)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n", restval="")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue(), {"rows": len(rows), "skipped_cpu_runs": skipped}
