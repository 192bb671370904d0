"""`python -m memtrace_trainer.runs.worker MANIFEST INDEX`: one `run_one` in its own process.

Exit status 0: the run finished (an OOM included); 1: it failed and `failed/<id>.json` says why.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from memtrace_trainer.errors import UserError
from memtrace_trainer.runs.launch import run_one


def main(argv: list[str]) -> int:
    if len(argv) != 2 or not argv[1].isdigit():
        print("usage: python -m memtrace_trainer.runs.worker MANIFEST INDEX", file=sys.stderr)
        return 2
    try:
        result = run_one(int(argv[1]), Path(argv[0]))
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(result), flush=True)
    return 1 if result["status"] == "failed" else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
