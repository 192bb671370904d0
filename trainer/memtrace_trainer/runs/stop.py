"""Stopping `launch` and its workers, and what stopped ones leave behind.

A launch holds `OUT/.launch.lock` for as long as any worker of its may write into OUT: told to
stop (Ctrl-C, SIGTERM), it stops its workers and waits for them before it lets go; killed, its
workers die with it (`die_with_parent`). A run's `.ID.partial-*` directory is locked by the
worker writing it (`own_partial`), so a later launch removes only those no live worker owns.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# How long workers told to stop get to clean up (their `.partial-*` directory) before SIGKILL.
STOP_GRACE_S = 10.0
# The launch a worker belongs to (its pid), so that a worker whose launch died before it could
# ask to die with it notices.
LAUNCH_PID = "MEMTRACE_LAUNCH_PID"
_PR_SET_PDEATHSIG = 1


@dataclass
class Workers:
    """The worker processes in flight, so that a stopped launch stops them before it lets go of
    OUT: left running, they finished their runs and took new ones beside a second launch."""

    stop: threading.Event = field(default_factory=threading.Event)
    procs: set[subprocess.Popen] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self, cmd: list[str], env: dict[str, str], **kwargs: Any) -> subprocess.Popen | None:
        with self.lock:  # no worker starts once stop is set, even one its thread was starting
            if self.stop.is_set():
                return None
            # A session (and process group) of its own: a terminal's Ctrl-C reaches launch alone,
            # which stops the workers in order, and `kill_group` reaches what a worker started
            # (the traced runs of `--trace`).
            proc = subprocess.Popen(cmd, env={**env, LAUNCH_PID: str(os.getpid())},
                                    start_new_session=True, **kwargs)  # fmt: skip
            self.procs.add(proc)
            return proc

    def ended(self, proc: subprocess.Popen) -> None:
        with self.lock:
            self.procs.discard(proc)

    def signal_all(self, sig: int) -> None:
        with self.lock:
            for proc in self.procs:
                kill_group(proc, sig)


def kill_group(proc: subprocess.Popen, sig: int) -> None:
    """`sig` to the worker's process group, unless the worker was reaped (its pid may be
    another process's by now)."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)


class Interrupts:
    """SIGINT and SIGTERM counted, not raised, while launch waits for its worker threads (main
    thread only: signal handlers are set there). A KeyboardInterrupt raised inside
    `Thread.join` marked the still-running thread as ended (Python 3.11), so launch let go of
    OUT with its worker still running; and SIGTERM killed launch and left its workers on."""

    def __init__(self) -> None:
        self.count = 0
        self._previous: dict[int, Any] = {}

    def _count(self, signum: int, frame: object) -> None:
        # Only a counter: the waiting loop acts on it. Taking a lock here could deadlock with
        # the main thread holding it when the signal came.
        self.count += 1

    def __enter__(self) -> Interrupts:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                # An ignored signal (`nohup`, a background job of a script) stays ignored.
                if signal.getsignal(sig) is not signal.SIG_IGN:
                    self._previous[sig] = signal.signal(sig, self._count)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)


def wait_for(running: Workers, threads: list[threading.Thread], interrupts: Interrupts) -> bool:
    """Waits for the worker threads; once interrupted, takes no new run and stops the workers
    in flight (SIGTERM, then SIGKILL after `STOP_GRACE_S`, or at once on a second signal).
    Returns whether it was interrupted. The caller holds OUT's lock until it returns."""
    deadline: float | None = None
    while alive := [t for t in threads if t.is_alive()]:
        if interrupts.count and deadline is None:
            running.stop.set()
            print(f"launch: interrupted; stopping {len(running.procs)} run(s) in flight",
                  file=sys.stderr)  # fmt: skip
            running.signal_all(signal.SIGTERM)
            deadline = time.monotonic() + STOP_GRACE_S
        if deadline is not None and (interrupts.count > 1 or time.monotonic() > deadline):
            running.signal_all(signal.SIGKILL)
        alive[0].join(timeout=0.1)
    return deadline is not None


def die_with_parent() -> None:
    """In a worker: SIGTERM when its launch dies (killed with SIGKILL, it could stop nothing),
    so that no worker goes on writing into an OUT whose lock is gone. Linux only (prctl)."""
    parent = os.environ.get(LAUNCH_PID)
    if not parent or not sys.platform.startswith("linux"):
        return
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if str(os.getppid()) != parent:  # launch died before the prctl: no signal will come
        os.kill(os.getpid(), signal.SIGTERM)


def own_partial(path: Path) -> int:
    """Locks the `.partial-*` directory `path` for the process writing it (until the returned
    descriptor is closed), so that a later launch does not remove it while it is written."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


@contextlib.contextmanager
def _unowned(path: Path) -> Iterator[bool]:
    """Whether no live process owns the `.partial-*` directory `path` (held while true)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        yield False  # gone meanwhile, or not a directory: not ours to remove
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def remove_leftovers(out: Path, ids: set[str]) -> None:
    """Removes the `.ID.partial-*` directories of the runs `ids` about to run here that no live
    worker writes: what a killed earlier launch left of them (it would stay for good, beside
    the finished run)."""
    runs = out / "runs"
    left = [p for p in runs.glob(".*.partial-*") if p.name[1:].partition(".partial-")[0] in ids]
    removed = busy = 0
    for p in left:
        with _unowned(p) as free:
            if free:
                shutil.rmtree(p, ignore_errors=True)
                removed += 1
            else:
                busy += 1
    if removed:
        print(f"launch: removed {removed} unfinished run director"
              f"{'y' if removed == 1 else 'ies'} left by an interrupted launch "
              f"({runs}/.*.partial-*); their runs run again", file=sys.stderr)  # fmt: skip
    if busy:
        print(f"launch: left {busy} unfinished run director{'y' if busy == 1 else 'ies'} "
              f"({runs}/.*.partial-*) that a running process still writes",
              file=sys.stderr)  # fmt: skip
