"""`python -m memtrace_trainer`: see memtrace_trainer.cli."""

import sys

from memtrace_trainer.cli import main

if __name__ == "__main__":
    sys.exit(main())
