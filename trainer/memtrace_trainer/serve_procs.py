"""The processes of `serve` (serve.py): a worker's process group killed with it, a worker the
server cannot name found by its pipe, and the workers' zygote (multiprocessing's forkserver)
killed with everything under it at shutdown. Light: no torch, as the server."""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.forkserver
import os
import signal
import time
from pathlib import Path


def kill_group(proc: multiprocessing.process.BaseProcess) -> None:
    """The worker and every process in its group (it leads one: `serve_worker.work`), so what
    the user's code started does not outlive its request; the worker alone where it has not
    made its group yet."""
    if proc.pid is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(Exception):
        proc.kill()


def alive(pid: int) -> bool:
    """Whether a child process runs, without reaping it (multiprocessing reaps its forkserver
    and would fail on one reaped here): a zombie has exited."""
    try:
        stat_line = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat_line.rpartition(")")[2].split()[:1] != ["Z"]


def kill_holders(fd: int) -> None:
    """Kill every other process holding the pipe `fd` is an end of. A zygote that dies after
    forking a worker but before sending its pid leaves a worker the server cannot name; it holds
    its request's answer pipe, and is found by it."""
    try:
        target = f"pipe:[{os.fstat(fd).st_ino}]"
    except OSError:
        return
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            held = any(os.readlink(f) == target for f in (entry / "fd").iterdir())
        except OSError:  # exited, or not ours
            continue
        if held:
            pid = int(entry.name)
            # Its group if it made one (`serve_worker.work`), so what it started goes too.
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def zygote_pid() -> int | None:
    fs = getattr(multiprocessing.forkserver, "_forkserver", None)
    return getattr(fs, "_forkserver_pid", None)


def _tree(root: int) -> set[int]:
    """`root` and every process under it, by the parent each names in /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rpartition(")")[2].split()[1])
            except (OSError, IndexError, ValueError):  # exited meanwhile
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo += children.get(pid, [])
    return found


def kill_tree(pid: int) -> None:
    """Kill `pid` and every process under it. Each is stopped (SIGSTOP) before the next
    listing, so none forks a child unseen, then all are killed."""
    stopped: set[int] = set()
    while new := _tree(pid) - stopped:
        for each in new:
            with contextlib.suppress(OSError):
                os.kill(each, signal.SIGSTOP)
        stopped |= new
    for each in stopped:
        with contextlib.suppress(OSError):
            os.kill(each, signal.SIGKILL)


def stop_zygote() -> None:
    """Kill the workers' zygote and every process under it (the warm-up's tools, workers, what
    they started), reap it, and let none start after: the zygote of a server stopped during its
    warm-up ran the warm-up on for seconds after the server had exited (`kill_tree`). The
    forkserver's lock is taken and kept: a start still going (the warm-up's first
    worker, a restart) cannot spawn a new zygote behind this."""
    fs = getattr(multiprocessing.forkserver, "_forkserver", None)
    lock = getattr(fs, "_lock", None)
    if lock is not None:
        lock.acquire(timeout=5)  # held while it spawns a zygote (milliseconds); never released
    pid = zygote_pid()
    if pid is None:
        return
    kill_tree(pid)
    # multiprocessing reaps it only when it starts the next worker; there is none.
    end = time.monotonic() + 5
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(pid, os.WNOHANG) == (0, 0) and time.monotonic() < end:
            time.sleep(0.02)
    fs._forkserver_pid = None  # type: ignore[union-attr]  # no later kill names a reused pid
    _stop_resource_tracker()


def _stop_resource_tracker() -> None:
    """The tracker multiprocessing started with the zygote ends when its last writer closes;
    with the zygote's tree gone that is this process: closed, and the tracker reaped (within a
    bound: a process that escaped the workers' groups may still hold it)."""
    from multiprocessing import resource_tracker

    tracker = getattr(resource_tracker, "_resource_tracker", None)
    lock = getattr(tracker, "_lock", None)
    if lock is None or not lock.acquire(timeout=1):
        return
    try:
        fd, pid = tracker._fd, tracker._pid  # type: ignore[union-attr]
        if fd is None or pid is None:
            return
        os.close(fd)
        tracker._fd = tracker._pid = None  # type: ignore[union-attr]
    finally:
        lock.release()
    end = time.monotonic() + 2
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(pid, os.WNOHANG) == (0, 0) and time.monotonic() < end:
            time.sleep(0.02)
