"""`python -m memtrace_trainer.runs.worker MANIFEST INDEX`: one `run_one` in its own process.

Exit status 0: the run finished (an OOM included); 1: it failed and `failed/<id>.json` says why;
130: it was interrupted (SIGINT, SIGTERM) and is left pending.
"""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

from memtrace_trainer.errors import UserError
from memtrace_trainer.runs.stop import die_with_parent

# Exit status of a worker stopped by SIGINT or SIGTERM: the run is neither finished nor failed,
# and stays pending.
INTERRUPTED = 130


def _interrupt(signum: int, frame: object) -> None:
    # Once: a second signal (launch sends SIGTERM to the worker's group, and its parent's death
    # one more) would break off the removal of the run's `.partial-*` directory.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise KeyboardInterrupt


def main(argv: list[str]) -> int:
    if len(argv) != 2 or not argv[1].isdigit():
        print("usage: python -m memtrace_trainer.runs.worker MANIFEST INDEX", file=sys.stderr)
        return 2
    # Before the imports (torch takes seconds): a worker stopped while importing exits as one
    # stopped later does.
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        die_with_parent()  # a launch killed outright leaves no worker writing into OUT
        from memtrace_trainer.runs.launch import run_one

        result = run_one(int(argv[1]), Path(argv[0]))
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("worker: interrupted; the run is left for the next launch", file=sys.stderr)
        return INTERRUPTED
    print(json.dumps(result), flush=True)
    return 1 if result["status"] == "failed" else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
