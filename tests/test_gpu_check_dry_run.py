"""The prepared GPU check (scripts/gpu-check.sh) run here against the shim tests' stub CUDA
libraries (--dry-run), so that the script a GPU session runs cannot rot unnoticed. Every check
of the real run is judged on the stub workload; the profile measurement needs a GPU and is not
run."""

from __future__ import annotations

import subprocess
import sys

from e2e_support import REPO, binary


def test_gpu_check_dry_run_passes_every_check(tmp_path):
    shim = binary("libmemtrace.so")
    out = tmp_path / "out"
    r = subprocess.run(
        [
            "bash",
            "scripts/gpu-check.sh",
            "--dry-run",
            "--shim",
            str(shim),
            "--memsim",
            str(binary("memsim")),
            "--out",
            str(out),
        ],
        cwd=REPO,
        env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable, "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, f"stdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    rows = {line.split()[0]: line for line in r.stdout.splitlines() if line.split()[:1]}
    for mode in ("default", "expandable", "nocache"):
        assert mode in rows and " OK " in rows[mode], f"{mode}: {r.stdout}"
    # The default run traces with CUPTI: kernel executions, and MEMORY2 device allocations
    # cross-checked against interposition (CUPTI starts before the first call is forwarded, so it
    # sees every driver allocation).
    assert "3 CUPTI executions" in rows["default"], rows["default"]
    assert "CUPTI memory: 3 device allocations, 3 at a traced alloc" in rows["default"], rows[
        "default"
    ]
    assert "profile constants not measured (dry run: no GPU)" in r.stdout
