"""`python -m memtrace preload`: the path of libmemtrace.so, for
`LD_PRELOAD=$(python -m memtrace preload) python train.py`; `python -m memtrace profiles`: the
known GPU profiles."""

from __future__ import annotations

import sys

USAGE = "usage: python -m memtrace preload|profiles"


def main(argv: list[str]) -> int:
    from memtrace import EstimateError, preload_path, profiles

    if argv == ["preload"]:
        try:
            print(preload_path())
        except EstimateError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        return 0
    if argv == ["profiles"]:
        print("\n".join(profiles()))
        return 0
    print(USAGE, file=sys.stderr)
    return 0 if argv in (["-h"], ["--help"]) else 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
