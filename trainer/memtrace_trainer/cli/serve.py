"""Command group of the warm estimate server: `serve` (memtrace_trainer/serve.py)."""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import math
import os
from collections.abc import Callable
from pathlib import Path

from memtrace_trainer import notes, serve_worker
from memtrace_trainer.errors import UserError, check_input_file

# The longest --timeout: Connection.poll takes at most 2**31 - 1 milliseconds.
MAX_TIMEOUT = 2_000_000

Handler = Callable[[argparse.Namespace], int | None]

DESCRIPTION = """\
Answer `estimate` requests over local HTTP with torch and the model zoo already imported: a warm
estimate costs the trace, not the interpreter's start (docs/serve.md).

endpoints:
  POST /v1/estimate  body: a JSON object of `estimate` options, each named by its long flag in
                     snake case, e.g. {"model": "torchvision:resnet50", "batch_size": 32,
                     "profile": "a100-40gb"}; answer: exactly what `estimate --json` prints for
                     the same options (200, whether or not the job fits)
  GET  /v1/health    status, version, limits, in-flight estimates, the allowed step/entry/script
  GET  /v1/schema    every request field: type, flag, help, choices, default

errors: {"error": MESSAGE, "field": FIELD or null}; 400 bad request (malformed JSON, unknown
field, wrong type, a value `estimate` rejects), 403 code not allowed, 404 unknown path, 405 wrong
method, 411/413 body length, 503 busy (over --max-concurrency; Retry-After: 1) or shutting down,
504 past --timeout, 500 internal error. The server never crashes on a request.

code: a request runs only the --step/--entry functions and --script files listed at start-up
with --allow-step/--allow-entry/--allow-script (403 otherwise). `report` is refused (it writes a
file on the server). Options naming files the estimate reads (--profile PATH, --ml-model,
hf-config:PATH) read them as the server's user.

Each estimate runs in a worker process forked from a warm zygote; a worker past --timeout is
killed (504) and the server goes on, and one that allocates past --worker-memory fails (400)
instead of taking the host's memory. Requests over --max-concurrency are refused at once with 503
(no queue: the caller decides when to retry). One log line per request on stderr: method, path,
status, seconds. SIGTERM or SIGINT: stop accepting, abort in-flight estimates (503), remove the
socket, exit 0.
"""


def register(sub: argparse._SubParsersAction) -> dict[str, Handler]:
    s = sub.add_parser(
        "serve",
        help="answer estimate requests over local HTTP, warm (Unix socket or 127.0.0.1)",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    where = s.add_mutually_exclusive_group(required=True)
    where.add_argument(
        "--socket",
        type=Path,
        metavar="PATH",
        help="listen on this Unix socket (created mode 0600; a stale one is replaced, removed on "
        "exit)",
    )
    where.add_argument(
        "--port",
        type=int,
        metavar="N",
        help="listen on --host:N over TCP (0: a free port, printed in the `listening on` line)",
    )
    s.add_argument(
        "--host",
        default="127.0.0.1",
        help="loopback address for --port (default 127.0.0.1; ::1 or localhost also work); any "
        "other address is refused",
    )
    s.add_argument(
        "--max-concurrency",
        type=int,
        default=2,
        metavar="N",
        help="estimates run at once (default 2); more are answered 503 at once",
    )
    s.add_argument(
        "--timeout",
        type=float,
        default=120.0,
        metavar="SECONDS",
        help="time limit of one estimate (default 120); past it the worker is killed and the "
        "request answered 504",
    )
    s.add_argument(
        "--worker-memory",
        metavar="GIB",
        help="memory one estimate's worker process may allocate, in GiB, beyond what the warm "
        "zygote holds (RLIMIT_DATA, thread stacks included; past it the estimate is answered "
        "400; a process the estimate starts has a bound of its own); default: the host's "
        "memory (or the container's cgroup limit, when lower) divided by --max-concurrency; "
        "`none`: no bound",
    )
    s.add_argument(
        "--allow-step",
        action="append",
        default=[],
        metavar="MOD:FN",
        help="a --step function requests may name (repeatable; default none)",
    )
    s.add_argument(
        "--allow-entry",
        action="append",
        default=[],
        metavar="MOD:FN",
        help="an --entry function requests may name (repeatable; default none)",
    )
    s.add_argument(
        "--allow-script",
        action="append",
        default=[],
        type=Path,
        metavar="TRAIN.py",
        help="a --script file requests may name, by this path, its absolute form, or any path "
        "to the same file at the time of the request; what runs is this path as resolved at "
        "start-up (repeatable; default none)",
    )
    return {"serve": _serve}


def _function_spec(flag: str, spec: str) -> str:
    """A `package.module:function` the server may run, checked to be on the Python path (finding
    `pkg.mod` imports the allowed package `pkg`; the module itself is imported by each worker)."""
    module, sep, fn = spec.partition(":")
    if not sep or not module or not fn:
        raise UserError(f"serve {flag} {spec!r}: expected package.module:function")
    try:
        found = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        found = None
    if found is None:
        raise UserError(f"serve {flag} {spec!r}: no module {module!r} on the Python path (the "
                        "working directory and PYTHONPATH)")  # fmt: skip
    return spec


# Where a container's memory limit is read: cgroup v2, then v1 (the mounts a container sees).
CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")


def host_memory() -> int:
    """The memory this process may use: the machine's, or its container's cgroup limit when
    lower (a server in a pod must not share out the node's memory)."""
    total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    for path in CGROUP_LIMITS:
        with contextlib.suppress(OSError, ValueError):
            total = min(total, int(Path(path).read_text().strip()))  # "max": no limit
    return total


def _worker_memory(text: str | None, workers: int) -> int | None:
    """--worker-memory in bytes: GiB as given, `none` for no bound, or by default an equal share
    of the memory this process may use per concurrent estimate; None (said) where /proc cannot
    tell a worker what it holds."""
    memory = _memory_given(text, workers)
    if memory is not None and serve_worker.data_held() is None:
        notes.warn("--worker-memory has no effect: /proc/self/status gives no VmData here "
                   "(not Linux, or /proc not mounted): the workers run unbounded")  # fmt: skip
        return None
    return memory


def _memory_given(text: str | None, workers: int) -> int | None:
    if text is None:
        return host_memory() // workers
    if text.strip().lower() == "none":
        return None
    try:
        gib = float(text)
    except ValueError:
        gib = math.nan
    if not (math.isfinite(gib) and gib > 0) or gib * (1 << 30) >= 1 << 62:
        raise UserError(f"serve --worker-memory {text!r}: expected GiB above 0 (e.g. 8 or 0.5), "
                        "or none")  # fmt: skip
    return max(1, int(gib * (1 << 30)))


def _serve(args: argparse.Namespace) -> int:
    from memtrace_trainer.serve import Config, serve
    from memtrace_trainer.serve_schema import Policy

    if args.max_concurrency < 1:
        raise UserError(f"serve --max-concurrency {args.max_concurrency}: expected 1 or more")
    # The worker is waited for with Connection.poll, whose limit is 2**31 milliseconds.
    if not 0 < args.timeout <= MAX_TIMEOUT:
        raise UserError(f"serve --timeout {args.timeout}: expected seconds above 0 and at most "
                        f"{MAX_TIMEOUT} (24 days)")  # fmt: skip
    if args.port is not None and not 0 <= args.port <= 65535:
        raise UserError(f"serve --port {args.port}: expected 0-65535")
    if args.socket is not None and args.host != "127.0.0.1":
        notes.warn(f"--host {args.host} has no effect with --socket")
    for path in args.allow_script:
        if not path.exists():
            raise UserError(f"serve --allow-script {path}: no such file")
        check_input_file(path, f"serve --allow-script {path}", "a Python training script")
    # The spelling is kept beside the file it names now: a link re-pointed later still runs
    # what was allowed at start-up (docs/serve.md).
    policy = Policy.allowing(
        [_function_spec("--allow-step", s) for s in args.allow_step],
        [_function_spec("--allow-entry", s) for s in args.allow_entry],
        args.allow_script,
    )
    memory = _worker_memory(args.worker_memory, args.max_concurrency)
    config = Config(
        args.socket, args.host, args.port, args.max_concurrency, args.timeout, policy, memory
    )
    return serve(config)
