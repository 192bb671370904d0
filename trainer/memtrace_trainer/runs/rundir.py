"""A run directory: config.json, features.json, labels.json and, with `--trace`, the shim's
traces. It is written under a temporary name and renamed when complete, so a directory with
that name is always a finished run (which is what makes `launch` resumable)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from memtrace_trainer import __version__
from memtrace_trainer.atomic import write_text
from memtrace_trainer.binaries import find_shim
from memtrace_trainer.errors import UserError
from memtrace_trainer.features import extract, gpumemnet_row
from memtrace_trainer.runs.config import RunConfig
from memtrace_trainer.runs.stop import own_partial
from memtrace_trainer.runs.train import Log, build, stderr_log, train

FILES = ("config.json", "features.json", "labels.json")

# The two traced runs of `--trace`: caching on gives the device-level truth (what the driver
# sees); caching off makes every tensor its own cudaMalloc, the allocator-level input of memsim.
TRACE_LEVELS: dict[str, dict[str, str]] = {
    "device": {},
    "allocator": {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"},
}


class RunFailed(UserError):
    """A run that crashed (not an OOM: those are labels); the message carries its error."""


def is_complete(path: Path) -> bool:
    return all((path / f).is_file() for f in FILES)


def write_json(path: Path, data: Any) -> None:
    write_text(path, json.dumps(data, indent=1, sort_keys=True) + "\n")


def features_of(cfg: RunConfig) -> dict[str, Any]:
    """Features of the run's model on meta, plus its GPUMemNet-style row for MLPs and CNNs."""
    meta = torch.device("meta")
    workload = build(cfg, meta)
    family = workload.family
    with meta:
        feats = extract(workload, family)
    data = {"model": workload.spec, "family": family, **feats.to_json()}
    if workload.defaults:
        # The sizes chosen for the run (a Hugging Face model's sequence length): config.json
        # holds what was asked for, null for these.
        data["defaults"] = workload.defaults
    if family in ("mlp", "cnn"):
        spec = cfg.model or ""
        filename = spec.partition(":")[2] if spec.startswith("gpumemnet:") else spec
        data["gpumemnet_row"] = gpumemnet_row(feats, filename, family)
    return data


def _traced(config_path: Path, tmp: Path, final: Path, log: Log) -> dict[str, Any]:
    shim = find_shim()
    log(f"--trace: shim {shim.describe()}")
    traces = tmp / "traces"
    traces.mkdir()
    labels: dict[str, Any] = {}
    for level, extra in TRACE_LEVELS.items():
        out = traces / f"{level}.labels.json"
        env = {
            **os.environ,
            **extra,
            "LD_PRELOAD": str(shim.path),
            "MEMTRACE_OUT": str(traces / f"{level}.mtrace"),
        }
        cmd = [
            sys.executable,
            "-m",
            "memtrace_trainer",
            "run",
            "--from-config",
            str(config_path),
            "--labels-out",
            str(out),
        ]
        log(f"--trace: {level}-level run" + (f" ({extra})" if extra else ""))
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        # The shim names the trace where it wrote it, under the temporary directory that is
        # renamed to `final` once the run is complete: the path it said was gone.
        sys.stderr.write(done.stderr.replace(str(tmp), str(final)))
        if done.returncode != 0:
            tail = "\n".join(done.stderr.strip().splitlines()[-5:])
            raise RunFailed(f"the {level}-level traced run failed ({done.returncode}): {tail}")
        if not (traces / f"{level}.mtrace").is_file():
            raise RunFailed(
                f"the {level}-level run under {shim.path} wrote no trace at "
                f"{traces / f'{level}.mtrace'}"
            )
        labels[level] = json.loads(out.read_text())
    main = dict(labels["device"])
    if main.get("cpu_fallback"):
        from memtrace_trainer.notes import warn

        warn(f"--trace has no effect on a CPU fallback: the shim records CUDA allocations, and "
             f"this run made none, so {final / 'traces'}/*.mtrace hold no allocation")  # fmt: skip
    main["traces"] = {
        level: {"trace": f"traces/{level}.mtrace", "labels": f"traces/{level}.labels.json"}
        for level in TRACE_LEVELS
    }
    return main


def execute(cfg: RunConfig, out: Path, trace: bool = False, log: Log = stderr_log) -> dict:
    """Runs `cfg` and writes its run directory `out`; returns the labels."""
    cfg.validate()
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out}: exists and is not a directory (expected a new run "
                        "directory)")  # fmt: skip
    if out.exists() and any(out.iterdir()):
        raise UserError(f"--out {out}: exists and is not empty (a finished run is never rerun)")
    created = make_parents(out)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.partial-"))
    owner = own_partial(tmp)  # a later launch leaves it alone while this process lives
    try:
        config = {"id": cfg.id, "trainer": __version__, **cfg.to_dict()}
        write_json(tmp / "config.json", config)
        features = features_of(cfg)
        for name, chosen in features.get("defaults", {}).items():
            log(f"note: {name} = {chosen['value']} ({chosen['why']}; recorded in features.json "
                "under defaults)")  # fmt: skip
        write_json(tmp / "features.json", features)
        labels = _traced(tmp / "config.json", tmp, out, log) if trace else train(cfg, log)
        write_json(tmp / "labels.json", labels)
        tmp.chmod(0o755)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        # A failed run leaves nothing behind, the folders made for it included.
        for folder in reversed(created):
            try:
                folder.rmdir()
            except OSError:
                break  # something else was put there meanwhile: not ours to remove
        raise
    finally:
        os.close(owner)
    return labels


def make_parents(out: Path) -> list[Path]:
    """Creates the missing folders above the run folder `out`, as `mkdir -p` would (`--out
    runs/r50` in a checkout without `runs/`); returns them, outermost first."""
    missing, above = [], out.parent
    while not above.exists():
        missing.append(above)
        above = above.parent
    if not above.is_dir():
        raise UserError(f"--out {out}: {above} is not a directory")
    missing.reverse()
    for i, folder in enumerate(missing):
        try:
            folder.mkdir()
        except OSError as e:
            for made in reversed(missing[:i]):
                made.rmdir()
            raise UserError(
                f"--out {out}: cannot create directory {folder}: {e.strerror}"
            ) from None
    return missing
