"""The HTML report in a real browser: `estimate --report` writes one page, and Debian's Chromium,
headless, loads it with no console errors, its DOM holds the headline number the estimate
printed, and it renders to a screenshot. Chromium is installed by scripts/setup.sh; without it
this test fails, saying so."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

from e2e_support import PYTHON, run

MLP = 'synthetic:{"family":"mlp","input_size":512,"output_size":10,"depth":4}'
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--hide-scrollbars",
]  # fmt: skip


def _chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    assert found, "chromium not found: scripts/setup.sh installs Debian's chromium (apt-get)"
    return found


def _browse(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [_chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={tmp / 'profile'}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)


def test_estimate_report_renders_in_chromium(tmp_path: Path, trainer_env: dict[str, str]) -> None:
    page = tmp_path / "report.html"
    cmd = [PYTHON, "-m", "memtrace_trainer", "estimate", "--model", MLP, "--batch-size", "64"]
    done = run([*cmd, "--profile", "a100-40gb", "--report", str(page), "--json"], trainer_env)
    est = json.loads(done.stdout)
    assert est["report"] == str(page) and page.exists()
    need = est["verdict"]["need_mib"]
    url = page.resolve().as_uri()

    dom = _browse(tmp_path, "--enable-logging=stderr", "--v=0", "--dump-dom", url)
    assert dom.returncode == 0, dom.stderr[-2000:]
    headline = re.search(r'<p id="headline" data-mib="([0-9.]+)">([^<]*)', dom.stdout)
    assert headline, dom.stdout[:2000]
    assert float(headline.group(1)) == round(need, 1)
    assert headline.group(2).startswith(f"needs {need:.1f} MiB on NVIDIA A100-SXM4-40GB")
    for section in ("Memory over the run", "What is alive at the peak", "Segments at the peak",
                    "The estimators side by side", "The verdict per GPU profile"):  # fmt: skip
        assert section in dom.stdout, section
    # The page's own console: Chromium logs console messages as CONSOLE lines on stderr.
    console = [line for line in dom.stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line]
    assert console == [], console

    shot = tmp_path / "report.png"
    done = _browse(tmp_path, "--window-size=1040,2400", f"--screenshot={shot}", url)
    assert done.returncode == 0, done.stderr[-2000:]
    assert shot.exists() and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert shot.stat().st_size > 20_000, "a blank page would be a few kilobytes"
