"""GPU profiles (`profiles/NAME.toml`): the GPU-dependent facts the tracer's emulation needs."""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memtrace_trainer.errors import UserError

REPO_ROOT = Path(__file__).resolve().parents[2]

# cuBLAS default `:4096:2:16:8` (2 x 4 MiB + 8 x 16 KiB); sm90 and later default to 32 MiB.
CUBLAS_WORKSPACE = 2 * 4096 * 1024 + 8 * 16 * 1024
CUBLAS_WORKSPACE_SM90 = 32 * 1024 * 1024
CUBLASLT_WORKSPACE = 1024 * 1024


@dataclass(frozen=True)
class Profile:
    """What the emulation needs to know about the GPU and its library versions."""

    name: str
    compute_capability: tuple[int, int]
    total_memory: int | None
    cublas_workspace_bytes: int
    cublaslt_workspace_bytes: int
    cudnn_workspace_factor: float

    @staticmethod
    def builtin() -> Profile:
        """The GPUMemNet machine: A100 40 GB with PyTorch 2.4 workspace defaults."""
        return Profile("builtin:a100-40gb", (8, 0), 40 * 1024**3, CUBLAS_WORKSPACE,
                       CUBLASLT_WORKSPACE, 1.0)  # fmt: skip


def _cc(path: Path, value: Any) -> tuple[int, int]:
    try:
        if isinstance(value, list | tuple) and len(value) == 2:
            return int(value[0]), int(value[1])
        if isinstance(value, str | float | int):
            major, _, minor = str(value).partition(".")
            return int(major), int(minor or 0)
    except ValueError:
        pass
    raise UserError(
        f'{path}: field gpu.compute_capability is {value!r}: expected "8.0", 8.0 or [8, 0]'
    )


def _cublas_config(path: Path, value: Any) -> int:
    """`:SIZE_KiB:COUNT` pairs, summed, as cuBLAS reads CUBLAS_WORKSPACE_CONFIG."""
    parts = str(value).split(":")
    try:
        if parts[0] != "" or len(parts) < 3 or len(parts) % 2 != 1:
            raise ValueError
        nums = [int(v) for v in parts[1:]]
    except ValueError:
        raise UserError(
            f"{path}: field workspace.cublas_workspace_config is {value!r}: "
            'expected :SIZE_KiB:COUNT pairs such as ":4096:2:16:8"'
        ) from None
    return sum(size * 1024 * count for size, count in zip(nums[::2], nums[1::2], strict=True))


def profile_path(name: str) -> Path:
    """A `.toml` path as given, or NAME in `$MEMTRACE_PROFILES` or the repository's `profiles/`."""
    path = Path(name)
    if path.suffix != ".toml":
        root = Path(os.environ.get("MEMTRACE_PROFILES", REPO_ROOT / "profiles"))
        path = root / f"{name}.toml"
    if not path.is_file():
        raise UserError(f"profile {name!r}: no file {path} (expected profiles/NAME.toml or a path)")
    return path


def load_profile(name: str | None) -> Profile:
    """`None` gives the built-in A100 profile; otherwise a `.toml` path or a profile NAME found
    in `$MEMTRACE_PROFILES` or the repository's `profiles/`."""
    if name is None:
        return Profile.builtin()
    path = profile_path(name)
    try:
        data = tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: not valid TOML ({e})") from None
    gpu = data.get("gpu")
    if not isinstance(gpu, dict) or "compute_capability" not in gpu:
        raise UserError(f"{path}: missing field gpu.compute_capability (a [gpu] table is required)")
    cc = _cc(path, gpu["compute_capability"])
    total = gpu.get("total_memory")
    if total is not None and (not isinstance(total, int) or total <= 0):
        raise UserError(
            f"{path}: field gpu.total_memory is {total!r}: expected bytes as an integer"
        )
    ws = data.get("workspace", {})
    if not isinstance(ws, dict):
        raise UserError(f"{path}: field workspace must be a table")
    cublas = CUBLAS_WORKSPACE_SM90 if cc >= (9, 0) else CUBLAS_WORKSPACE
    if "cublas_workspace_config" in ws:
        cublas = _cublas_config(path, ws["cublas_workspace_config"])
    lt_kib = ws.get("cublaslt_workspace_kib", CUBLASLT_WORKSPACE // 1024)
    if isinstance(lt_kib, bool) or not isinstance(lt_kib, int) or lt_kib < 0:
        raise UserError(
            f"{path}: field workspace.cublaslt_workspace_kib is {lt_kib!r}: expected KiB >= 0"
        )
    per_call = ws.get("cublaslt_per_call", True)
    if not isinstance(per_call, bool):
        raise UserError(
            f"{path}: field workspace.cublaslt_per_call is {per_call!r}: expected a bool"
        )
    return Profile(
        name=path.stem,
        compute_capability=cc,
        total_memory=total,
        cublas_workspace_bytes=cublas,
        cublaslt_workspace_bytes=lt_kib * 1024 if per_call else 0,
        cudnn_workspace_factor=1.0,
    )
