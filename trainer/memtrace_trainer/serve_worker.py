"""What runs in `serve`'s worker processes: one estimate per process, forked from the warm zygote
(`serve_zygote`), its answer sent back over a pipe.

Light to import: the server imports this module to name the worker's function, and must not
import torch itself (the zygote does)."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import sys
import tempfile
import traceback
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

# The job the zygote estimates once at start-up, through the same path as a request: it imports
# and warms what every estimate uses, and proves memsim, memest and the profile are there.
WARM_ARGV = ["--model", 'synthetic:{"family":"mlp","input_size":64,"output_size":10,"depth":2}',
             "--batch-size", "2", "--json"]  # fmt: skip


def _error(message: str, field: str | None = None) -> str:
    return json.dumps({"error": message, "field": field})


def data_held() -> int | None:
    """The bytes of data this process holds (`VmData`: its heap and private writable mappings,
    what `RLIMIT_DATA` bounds), or None where /proc does not say."""
    with contextlib.suppress(OSError, ValueError, TypeError):
        status = Path("/proc/self/status").read_text()
        return int(re.search(r"^VmData:\s+(\d+) kB", status, re.M)[1]) << 10  # type: ignore[index]
    return None


def limit_memory(budget: int) -> None:
    """Bound this worker's data (`RLIMIT_DATA`) at what it holds now, forked from the zygote and
    shared with it, plus `budget` bytes: an estimate that grows past it fails here with a
    MemoryError, where without a bound it could take the host's memory and be killed by the OOM
    killer with its neighbours. Unbounded where /proc does not say what it holds (a bound of the
    budget alone would refuse the first allocation); the server checked at start-up."""
    import resource

    held = data_held()
    if held is None:
        return
    _soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    limit = held + budget if hard == resource.RLIM_INFINITY else min(held + budget, hard)
    resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))


def _unbound() -> None:
    """The soft bound lifted to the hard one: the answer is built, and sent, with the memory the
    estimate left held (a step's module-level list, say)."""
    import resource

    with contextlib.suppress(OSError, ValueError):
        resource.setrlimit(resource.RLIMIT_DATA, (resource.getrlimit(resource.RLIMIT_DATA)[1],) * 2)


def _out_of_memory(e: BaseException) -> bool:
    """`e` (or what it was raised from) is an allocation refused: Python's MemoryError, PyTorch's
    CPU allocator's error, a thread whose stack could not be mapped, or memsim/memest aborted
    by Rust's allocation failure."""
    seen: set[int] = set()
    at: BaseException | None = e
    while at is not None and id(at) not in seen:
        seen.add(id(at))
        if isinstance(at, MemoryError) or any(s in str(at) for s in OUT_OF_MEMORY):
            return True
        at = at.__cause__ or at.__context__
    return False


# What an allocation refused under the bound says, where it is not a MemoryError.
OUT_OF_MEMORY = ("can't allocate memory", "can't start new thread", "memory allocation of ")


def _memory_answer(memory: int) -> str:
    gib = memory / (1 << 30)
    return _error(f"the estimate needed more memory than this server lets one worker allocate "
                  f"({gib:.3g} GiB beyond the warm zygote's, --worker-memory): run it with "
                  "`memtrace_trainer estimate` on a machine with the memory, or start the "
                  "server with a larger --worker-memory")  # fmt: skip


@functools.cache
def _schema() -> Any:
    from memtrace_trainer.serve_schema import Schema, estimate_parser

    return Schema(estimate_parser())


def _code_field(args: Any) -> str | None:
    """The request field naming the user's code the estimate ran (step, entry, script)."""
    return next((k for k in ("step", "entry", "script") if getattr(args, k, None)), None)


def _huge_size(args: Any) -> str | None:
    """The size field a tensor's overflow is about: the first with a number past 2**31 (the
    message quotes PyTorch, not the field, so `field_in` cannot tell), or None."""
    for key in ("batch_size", "seq_len", "input_shape"):
        value = getattr(args, key, None)
        # --input-shape is its text (`3,224,224`), parsed by the model zoo.
        sizes = [int(v) for v in re.findall(r"\d+", value)] if isinstance(value, str) else [value]
        if any(isinstance(v, int) and v >= 1 << 31 for v in sizes):
            return key
    return None


def answer(argv: list[str], memory: int | None = None) -> tuple[int, str]:
    """HTTP status and body of one estimate: 200 and exactly what `estimate ARGV` prints (a
    "does not fit" verdict is an answer too), 400 for what the command rejects or for a job
    past the worker's `memory` limit (`limit_memory`), 500 for an internal error."""
    from memtrace_trainer import notes
    from memtrace_trainer.cli import _internal
    from memtrace_trainer.cli.estimate import estimate_result
    from memtrace_trainer.errors import (
        SizeOverflowError,
        UserCodeError,
        UserError,
        size_overflow,
        user_frames,
    )
    from memtrace_trainer.serve_schema import RequestError

    schema, args = _schema(), None
    try:
        args = schema.parser.parse_args(argv)
        # Warnings are in the answer (`warnings`), so they are not printed; what the user's own
        # code prints goes to the server's log, never into the body.
        try:
            with notes.captured(lambda _m: None), contextlib.redirect_stdout(sys.stderr):
                result = estimate_result(args)
        finally:
            if memory is not None:
                _unbound()
    except RequestError as e:
        return e.status, json.dumps(e.body())
    except SizeOverflowError as e:  # raised on the model's behalf, said before the trace ends
        return 400, _error(str(e), _huge_size(args))
    except UserError as e:
        if memory is not None and _out_of_memory(e):
            return 400, _memory_answer(memory)
        return 400, _error(str(e), schema.field_in(str(e), argv))
    except SystemExit as e:  # the user's code (the server's own never exits by raising)
        return 400, _error(str(UserCodeError("your code called sys.exit:", e)), _code_field(args))
    except Exception as e:  # the user's code or an internal fault: a JSON answer either way
        if memory is not None and _out_of_memory(e):
            return 400, _memory_answer(memory)
        if (too_large := size_overflow(e)) is not None:
            return 400, _error(str(too_large), _huge_size(args))
        if user_frames(e):
            return 400, _error(str(UserCodeError("your code raised", e)), _code_field(args))
        if os.environ.get("MEMTRACE_TRACEBACK") == "1":
            traceback.print_exc()
        return 500, _error(_internal(e))
    return 200, json.dumps(result) + "\n"


def work(argv: list[str], tmpdir: str, conn: Connection, memory: int | None = None) -> None:
    """A worker's whole life: the estimate with every temporary file under `tmpdir` (the server
    removes it whatever happens here) and its data bounded by `memory` bytes beyond the zygote's
    (None: unbounded), its answer sent on `conn`."""
    # A process group of its own: what the user's code starts (a DataLoader's workers, a
    # subprocess) is stopped with the worker, not left running after its request.
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)
    os.environ["TMPDIR"] = tmpdir
    tempfile.tempdir = tmpdir
    try:
        if memory is not None:
            limit_memory(memory)
        from memtrace_trainer.symtrace import script

        # A script that catches every stop ends this process (os._exit): its error is this
        # request's answer, not a dead worker's 500.
        script.unstoppable_reply = lambda m: _reply(conn, (400, _error(m, "script")))
        status, body = answer(argv, memory)
    except BaseException as e:  # the server must always get an answer
        status, body = 500, _error(f"internal error: {type(e).__name__}: {e}")
    _reply(conn, (status, body))


def warm_up() -> str | None:
    """One estimate of a tiny model in the zygote, then the caches that must not outlive it
    cleared; the error that stops the server, or None."""
    from memtrace_trainer import notes
    from memtrace_trainer.profile import _read

    with tempfile.TemporaryDirectory(prefix="memtrace-serve-warm-") as tmp:
        old = tempfile.tempdir
        tempfile.tempdir = tmp
        try:
            status, body = answer(WARM_ARGV)
        finally:
            tempfile.tempdir = old
    # A profile edited while the server runs must be read again, as the CLI would.
    _read.cache_clear()
    notes.reset()
    if status != 200:
        return f"the warm-up estimate failed ({status}): {json.loads(body)['error']}"
    return None


def ready(conn: Connection) -> None:
    """Sent by the server's first worker: the zygote's warm-up error, or None when it is warm."""
    from memtrace_trainer import serve_zygote

    _reply(conn, serve_zygote.WARM_ERROR)


def _reply(conn: Connection, message: Any) -> None:
    """Send a worker's answer to the server. A server that was told to stop (SIGTERM during the
    warm-up, or with estimates in flight) has closed its end and waits for nothing: the answer
    is dropped, quietly, since a traceback here would land in the server's log after its last
    line."""
    with contextlib.suppress(ConnectionError), conn:
        conn.send(message)


def describe_exit(code: Any) -> str:
    if isinstance(code, int) and code < 0:
        return f"killed by signal {-code}"
    return f"exit status {code}"
