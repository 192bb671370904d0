"""Write a GPU profile TOML from scripts/gpu/profile_measure.py's JSON (run by
scripts/gpu-check.sh; the pure part, `render`, is tested on fake measurements in
tests/test_gpu_profile_writer.py).

Only keys the profile loader knows are written (profiles/README.md: unknown keys are errors);
every measured value carries a comment "measured by scripts/gpu-check.sh on <date>". The file is
written to a temporary name and renamed, so a failure never leaves a partial profile.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

# The repository's one atomic writer; the GPU machine runs this file without the package installed.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "trainer"))
from memtrace_trainer.atomic import write_text

# field -> (type, what it is); every one must be present in the measurement JSON.
FIELDS = {
    "date": (str, "ISO date of the measurement"),
    "gpu_name": (str, "device name as CUDA reports it"),
    "total_memory_bytes": (int, "cudaDeviceProp::totalGlobalMem"),
    "sm_count": (int, "number of SMs"),
    "compute_capability": (list, "[major, minor]"),
    "torch": (str, "torch.__version__"),
    "cuda": (str, "torch.version.cuda"),
    "cudnn": (str, "torch.backends.cudnn.version()"),
    "context_mib": (float, "CUDA context, MiB"),
    "context_source": (str, "nvml or mem_get_info"),
    "cublas_mib": (float, "memory outside the allocator after the first GEMM, MiB"),
    "cudnn_mib": (float, "memory outside the allocator after the first convolution, MiB"),
    "cublas_workspace_bytes": (int, "cuBLAS workspace the allocator handed out"),
}


class MeasurementError(ValueError):
    """A measurement file lacks a field or has the wrong type; the message names both."""


def validate(data: object, source: str) -> dict:
    if not isinstance(data, dict):
        raise MeasurementError(f"{source}: expected a JSON object of measurements")
    for field, (kind, what) in FIELDS.items():
        if field not in data:
            raise MeasurementError(f"{source}: field {field!r} missing (expected {what})")
        value = data[field]
        ok = (
            isinstance(value, (int, float)) and not isinstance(value, bool)
            if kind is float
            else isinstance(value, kind) and not isinstance(value, bool)
        )
        if not ok:
            raise MeasurementError(
                f"{source}: field {field!r}: expected {kind.__name__} ({what}), got {value!r}"
            )
    cc = data["compute_capability"]
    if len(cc) != 2 or not all(isinstance(v, int) for v in cc):
        raise MeasurementError(f"{source}: field 'compute_capability': expected [major, minor]")
    for field in ("total_memory_bytes", "sm_count", "context_mib", "cublas_mib", "cudnn_mib"):
        if data[field] < 0:
            raise MeasurementError(f"{source}: field {field!r}: expected >= 0, got {data[field]}")
    allocator_version(data["torch"], source)  # a version memsim models
    # As memsim checks them: digits and dots. cuDNN may be absent (torch without it): then
    # the profile leaves the optional key out.
    for field, optional in (("cuda", False), ("cudnn", True)):
        value = data[field]
        if not (optional and value == "") and not re.fullmatch(r"[0-9][0-9.]*", value):
            raise MeasurementError(
                f"{source}: field {field!r}: expected a version number such as "
                f'"12.4", got {value!r}'
            )
    return data


def _major_minor(version: str, source: str = "measurements") -> tuple[int, int]:
    parts = version.split("+")[0].split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        raise MeasurementError(
            f"{source}: field 'torch': expected a version like 2.9.0, got {version!r}"
        ) from None


def allocator_version(torch_version: str, source: str = "measurements") -> str:
    """The allocator behaviour the simulator models for this torch (profiles/README.md), as
    memsim maps a version (`TorchVersion::from_str`; tests/test_gpu_profile_writer.py checks
    they agree): a torch older than 2.4 is not modelled."""
    v = _major_minor(torch_version, source)
    if v < (2, 4):
        raise MeasurementError(
            f"{source}: field 'torch': PyTorch {torch_version} is older than 2.4, the oldest "
            "release family memsim models"
        )
    return "2.9" if v >= (2, 9) else "2.5" if v >= (2, 5) else "2.4"


def render(data: dict, source: str = "measurements") -> str:
    d = validate(data, source)
    by = f"measured by scripts/gpu-check.sh on {d['date']}"
    major, minor = _major_minor(d["torch"])
    ws = d["cublas_workspace_bytes"]
    ws_kib = ws // 1024
    # torch >= 2.5 shares one workspace between cuBLAS and cuBLASLt; 2.4 allocates Lt's per call.
    per_call = (major, minor) < (2, 5)
    if ws > 0:
        ws_lines = (
            f'cublas_workspace_config = ":{ws_kib}:1"   # {by} ({ws} B, first GEMM)\n'
            f"cublaslt_workspace_kib = {ws_kib}   # {by} (shared with cuBLAS)\n"
        )
    else:
        ws_lines = (
            "# No workspace was allocated through the caching allocator by the first GEMM "
            f"({by}); PyTorch's default for compute capability >= 9.0 is kept.\n"
            'cublas_workspace_config = ":32768:1"\ncublaslt_workspace_kib = 32768\n'
        )
    cc = d["compute_capability"]
    return (
        f"# GPU profile: {d['gpu_name']}. Format: see profiles/README.md.\n"
        f"#\n# Constants {by} (scripts/gpu/profile_measure.py), from one process: the CUDA\n"
        "# context from device used memory before and after CUDA init; cuBLAS and cuDNN as device\n"
        "# used memory minus max_memory_reserved after the first GEMM and the first convolution\n"
        "# (forward and backward). Not fitted on training runs: `memest calibrate` refines them.\n"
        "\n"
        "[gpu]\n"
        f'name = "{d["gpu_name"]}"   # {by}\n'
        f"total_memory = {d['total_memory_bytes']}   # {by}\n"
        f"compute_capability = [{cc[0]}, {cc[1]}]   # {by}\n"
        f"sm_count = {d['sm_count']}   # {by}\n\n"
        "[software]\n"
        f'torch = "{major}.{minor}"   # {by} ({d["torch"]})\n'
        f'cuda = "{d["cuda"]}"   # {by}\n'
        + (f'cudnn = "{d["cudnn"]}"   # {by}\n' if d["cudnn"] else "")
        + f'allocator = "{allocator_version(d["torch"])}"   # implied by torch {major}.{minor}\n\n'
        "[outside_allocator]\n"
        f"context_mib = {d['context_mib']:.1f}   # {by} ({d['context_source']})\n"
        f"cublas_mib = {d['cublas_mib']:.1f}   # {by}\n"
        f"cudnn_mib = {d['cudnn_mib']:.1f}   # {by}\n"
        "# NCCL, for jobs of more than one rank: placeholders until scripts/gpu/nccl_measure.py\n"
        "# measures them (NCCL_BUFFSIZE 4 MiB x 4 channels x 2 directions per peer).\n"
        "nccl_communicator_mib = 64.0\n"
        "nccl_per_peer_mib = 32.0\n\n"
        "[workspace]\n"
        f"{ws_lines}"
        f"cublaslt_per_call = {'true' if per_call else 'false'}   # torch {major}.{minor}\n"
        "# Not measured here: fitted on measured convolutional training runs (docs/results.md).\n"
        "cudnn_workspace_factor = 1.0\n\n"
        "[provenance]\n"
        'unmeasured = ["workspace.cudnn_workspace_factor", '
        '"outside_allocator.nccl_communicator_mib", "outside_allocator.nccl_per_peer_mib"]\n'
    )


def write(measurements: Path, profile: Path, expect_gpu: str | None) -> str:
    try:
        data = json.loads(measurements.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise MeasurementError(f"{measurements}: unreadable measurement file ({e})") from None
    text = render(data, str(measurements))
    if expect_gpu and expect_gpu not in data["gpu_name"]:
        raise MeasurementError(
            f"{measurements}: field 'gpu_name': expected a {expect_gpu}, got {data['gpu_name']!r}; "
            f"{profile} left unchanged"
        )
    write_text(profile, text)
    return text


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("measurements", type=Path)
    ap.add_argument("--profile", type=Path, required=True, help="TOML file to (over)write")
    ap.add_argument("--expect-gpu", help="refuse unless the GPU name contains this (e.g. H200)")
    args = ap.parse_args()
    try:
        write(args.measurements, args.profile, args.expect_gpu)
    except MeasurementError as e:
        print(f"profile_writer: error: {e}", file=sys.stderr)
        return 1
    print(f"profile_writer: wrote {args.profile}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
