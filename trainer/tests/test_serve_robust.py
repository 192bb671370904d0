"""`serve` against clients and processes that misbehave: a client that leaves, a zygote that dies,
an oversized body sent by an ordinary client, a SIGTERM with a request half sent or during the
warm-up, a config path that is not a file, a worker that does not exit or ends itself. A real
server in a child process, as in test_serve.py."""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_serve import MLP, Server, gone, server_env, stand_ins

from memtrace_trainer import notes, serve_worker

SLOW = {"step": "slow_step:make"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    d = tmp_path_factory.mktemp("robust")
    srv = Server(["--socket", str(d / "s.sock"), "--max-concurrency", "1", "--timeout", "90",
                  "--allow-step", "slow_step:make", "--allow-step", "slow_step:linger",
                  "--allow-step", "step_examples:custom_optimizer"],
                 server_env(d, stand_ins(tmp_path_factory.mktemp("tools"))))  # fmt: skip
    yield srv
    srv.stop()


def connect(srv: Server) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(30)
    s.connect(str(srv.socket))
    return s


def post(body: dict[str, Any]) -> bytes:
    data = json.dumps(body).encode()
    return b"POST /v1/estimate HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(data) + data


def in_flight(srv: Server) -> int:
    return int(srv.request("GET", "/v1/health")[1]["in_flight"])


# A stray CRLF after the request took the client off the watch: its close was never seen.
@pytest.mark.parametrize("extra", [b"", b"\r\n"])
def test_a_client_that_leaves_stops_its_estimate(server: Server, extra: bytes) -> None:
    """The estimate ran on to the time limit, holding the only slot, and every other request
    was refused 503 meanwhile."""
    mark = Path(server.env["SLOW_STEP_MARK"])
    mark.unlink(missing_ok=True)
    client = connect(server)
    client.sendall(post(SLOW) + extra)
    end = time.monotonic() + 60
    while not mark.exists() and time.monotonic() < end:
        time.sleep(0.1)
    assert mark.exists(), server.log()
    client.close()
    left = time.monotonic()
    while in_flight(server) and time.monotonic() - left < 10:
        time.sleep(0.1)
    assert in_flight(server) == 0, "the estimate of a client that left still holds its slot"
    pid, tmp, child = mark.read_text().split()
    deadline = time.monotonic() + 5
    while not (gone(int(pid)) and gone(int(child))) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gone(int(pid)) and gone(int(child)) and not Path(tmp).exists()
    assert server.estimate({"model": MLP, "batch_size": 4})[0] == 200
    assert any(line.startswith("serve: POST /v1/estimate 499 ") and "closed its connection"
               in line for line in server.lines), server.log()  # fmt: skip


def test_a_client_that_half_closes_gets_its_answer(server: Server) -> None:
    """`nc -N` and socat shut down their sending side after the request and wait for the
    answer: the server took that for a client that left, killed the estimate and sent
    nothing (499)."""
    with connect(server) as client:
        client.sendall(post({"model": MLP, "batch_size": 4}))
        client.shutdown(socket.SHUT_WR)
        reply = b""
        while chunk := client.recv(65536):
            reply += chunk
    head, _, body = reply.partition(b"\r\n\r\n")
    assert b" 200 " in head.split(b"\r\n")[0], (reply[:300], server.log())
    assert json.loads(body)["verdict"]["fits"] in (True, False)


def _zygote(server: Server) -> int:
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rpartition(")")[2].split()[1])
            cmdline = (entry / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == server.proc.pid and b"forkserver" in cmdline:
            return int(entry.name)
    raise AssertionError("no zygote (forkserver) among the server's children")


# Posted at once, the request can find the zygote killed but not yet exited: its worker's start
# failed (500, "unexpected EOF"). Posted once it has exited, health waited on the restart.
@pytest.mark.parametrize("settle", [False, True])
def test_health_answers_while_a_dead_zygote_is_started_again(server: Server, settle: bool) -> None:
    """Starting a worker restarts a dead zygote (torch imported again, a warm-up), and that ran
    under the lock every request takes: health waited seconds for it."""
    zygote = _zygote(server)
    os.kill(zygote, signal.SIGKILL)
    while settle and not gone(zygote):
        time.sleep(0.05)
    result: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: result.update(
        answer=server.estimate({"model": MLP, "batch_size": 4})))  # fmt: skip
    thread.start()
    statuses = []
    while thread.is_alive() and len(statuses) < 20:
        start = time.monotonic()
        status, health, _ = server.request("GET", "/v1/health")
        # Seconds on a loaded machine at worst; waiting on the restart is a torch import.
        assert status == 200 and time.monotonic() - start < 3.0, "health waited on the restart"
        statuses.append(health["status"])
        time.sleep(0.1)
    thread.join(120)
    assert result["answer"][0] == 200, result
    assert "warming" in statuses, statuses
    assert server.request("GET", "/v1/health")[1]["status"] == "ok"
    assert any("zygote" in line and "starting it again" in line for line in server.lines)


def test_an_oversized_body_is_a_413_an_ordinary_client_reads(server: Server) -> None:
    """http.client sends its whole body before it reads: the server closed the connection with
    the body unread, and the client got a broken pipe instead of the 413."""
    body = json.dumps({"model": MLP, "batch_size": 4, "x": "a" * (2 << 20)}).encode()
    status, answer, _ = server.request("POST", "/v1/estimate", body)
    assert (status, answer["field"]) == (413, "Content-Length"), answer
    assert "over the limit" in answer["error"]
    assert server.request("GET", "/v1/health")[0] == 200


def test_a_config_path_that_is_not_a_file_is_refused(server: Server, tmp_path: Path) -> None:
    """A FIFO held a worker (and the only slot) until the time limit; a device was read until
    the machine ran out of memory."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    start = time.monotonic()
    status, answer = server.estimate({"model": f"hf-config:{fifo}", "batch_size": 2})
    assert (status, answer["field"]) == (400, "model"), answer
    assert "not a regular file" in answer["error"] and time.monotonic() - start < 30


def test_sigterm_with_a_request_half_sent(tmp_path: Path) -> None:
    """Shutdown waited its whole 10 s drain for a client still sending, which then got nothing,
    and the socket accepted new connections meanwhile only to reset them."""
    srv = Server(["--socket", str(tmp_path / "s.sock")],
                 server_env(tmp_path, stand_ins(tmp_path)))  # fmt: skip
    half = connect(srv)
    half.sendall(b"POST /v1/estimate HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\n\r\n{")
    headers_only = connect(srv)
    headers_only.sendall(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n")
    time.sleep(0.5)
    start = time.monotonic()
    srv.proc.send_signal(signal.SIGTERM)
    end = time.monotonic() + 5
    while srv.socket is not None and srv.socket.exists() and time.monotonic() < end:
        time.sleep(0.05)
    with pytest.raises((FileNotFoundError, ConnectionRefusedError)):
        connect(srv)
    assert srv.stop() == 0 and time.monotonic() - start < 5, srv.log()
    for client in (half, headers_only):
        reply = client.recv(65536)
        head, _, body = reply.partition(b"\r\n\r\n")
        assert b" 503 " in head.split(b"\r\n")[0] and b"Retry-After: 1" in head, reply
        assert "shutting down" in json.loads(body)["error"]
        client.close()
    assert srv.lines[-1] == "serve: stopped", srv.log()


def test_a_hung_zygote_restart_is_bounded_by_the_time_limit(tmp_path: Path) -> None:
    """Starting a worker waited for a zygote's restart without a limit: a restart that hung
    held the request, and its slot, for ever. It is a 504 at the deadline, the hung zygote is
    killed, and the next request starts a fresh one."""
    srv = Server(["--socket", str(tmp_path / "s.sock"), "--max-concurrency", "1",
                  "--timeout", "15"], server_env(tmp_path, stand_ins(tmp_path)))  # fmt: skip
    try:
        first = _zygote(srv)
        os.kill(first, signal.SIGKILL)
        result: dict[str, Any] = {}
        thread = threading.Thread(target=lambda: result.update(
            answer=srv.estimate({"model": MLP, "batch_size": 4})))  # fmt: skip
        thread.start()
        hung, end = None, time.monotonic() + 10
        while hung is None and time.monotonic() < end:
            with contextlib.suppress(AssertionError):
                if (pid := _zygote(srv)) != first:
                    os.kill(pid, signal.SIGSTOP)  # its restart never ends
                    hung = pid
            time.sleep(0.02)
        assert hung is not None, srv.log()
        thread.join(60)
        status, answer = result["answer"]
        assert status == 504 and "zygote" in answer["error"], answer
        end = time.monotonic() + 5
        while not gone(hung) and time.monotonic() < end:
            time.sleep(0.05)
        assert gone(hung), "the hung zygote was left running"
        assert srv.estimate({"model": MLP, "batch_size": 4})[0] == 200, srv.log()
    finally:
        assert srv.stop() == 0, srv.log()


def test_an_answer_is_sent_before_its_worker_exits(server: Server) -> None:
    """A step that left a thread running kept its worker from exiting, and its answer waited
    for the worker's EXIT_SECONDS before it was sent."""
    from memtrace_trainer.serve import EXIT_SECONDS

    start = time.monotonic()
    assert server.estimate({"step": "step_examples:custom_optimizer"})[0] == 200
    plain = time.monotonic() - start
    start = time.monotonic()
    status, answer = server.estimate({"step": "slow_step:linger"})
    assert status == 200, answer
    assert time.monotonic() - start < plain + EXIT_SECONDS - 2
    # The worker still holds the only slot until it is killed: one next estimate waits for it
    # (at most EXIT_SECONDS), rather than being refused as busy; a second is refused at once
    # (every request waited, for any slot, up to 6 s: the bound's 503 came late, and waiting
    # requests filled the connections, health's too).
    assert server.request("GET", "/v1/health")[1]["in_flight"] == 1
    answers: list[tuple[int, float]] = []

    def ask() -> None:
        begun = time.monotonic()
        answers.append(
            (server.estimate({"model": MLP, "batch_size": 4})[0], time.monotonic() - begun)
        )

    asking = [threading.Thread(target=ask) for _ in range(2)]
    for t in asking:
        t.start()
    for t in asking:
        t.join(60)
    statuses = sorted(status for status, _ in answers)
    assert statuses == [200, 503], answers
    assert all(took < 1.5 for status, took in answers if status == 503), answers


# A SIGTERM at once, and one a second later, when the zygote is importing torch and the first
# worker waits on it: that worker's answer then finds the server gone, which once put a
# BrokenPipeError traceback after the log's last line (6 of 6 runs with delays of 0.3 to 3 s).
@pytest.mark.parametrize("delay", [0.0, 1.0])
def test_sigterm_during_the_warm_up(tmp_path: Path, delay: float) -> None:
    sock = tmp_path / "s.sock"
    env = server_env(tmp_path, stand_ins(tmp_path))
    proc = subprocess.Popen([sys.executable, "-m", "memtrace_trainer", "serve", "--socket",
                             str(sock)], env=env, stderr=subprocess.PIPE, text=True)  # fmt: skip
    assert proc.stderr is not None
    assert "warming up" in proc.stderr.readline()
    time.sleep(delay)
    if delay:  # the zygote is importing torch
        assert any(b"forkserver" in cmdline for cmdline in ours(tmp_path).values())
    start = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0 and time.monotonic() - start < 5
    # The zygote (and the resource tracker) ran the warm-up on for seconds after the exit.
    # Checked before stderr is read to its end: an orphaned zygote holds it open, and the read
    # waited for its warm-up to finish, after which nothing was left to find.
    end = time.monotonic() + 2  # a SIGKILL is delivered, not waited for
    while ours(tmp_path) and time.monotonic() < end:
        time.sleep(0.05)
    assert not ours(tmp_path), f"processes of the server outlived it: {ours(tmp_path)}"
    assert proc.stderr.read().splitlines()[-1] == "serve: stopped" and not sock.exists()


def ours(d: Path) -> dict[int, bytes]:
    """The command lines of the live processes with `server_env(d, ...)`'s environment: a
    server and every process it started, orphaned or not."""
    mark = f"SLOW_STEP_MARK={d / 'mark'}".encode()
    found = {}
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and mark in (entry / "environ").read_bytes().split(b"\0"):
                found[int(entry.name)] = (entry / "cmdline").read_bytes()
        except OSError:  # exited, or not ours
            continue
    return found


def test_a_script_that_catches_every_stop_is_answered_not_a_dead_worker(tmp_path: Path) -> None:
    """The tracer ends a script that catches every stop with os._exit: in a worker, the client
    got a 500 ("died without an answer") and the reason went to the server's log alone."""
    path = Path(__file__).parent / "scripts" / "catches_every_stop.py"
    (tmp_path / "tmp").mkdir()
    # A fresh process, as the server's zygote forks its workers from one: forked from this
    # test process (its torch threads and locks), the child could deadlock.
    ctx = multiprocessing.get_context("spawn")
    recv, send = ctx.Pipe(duplex=False)
    args = (["--script", str(path)], str(tmp_path / "tmp"), send)
    proc = ctx.Process(target=serve_worker.work, args=args, daemon=True)
    proc.start()
    send.close()
    try:
        assert recv.poll(120), "no answer from the worker"
        status, body = recv.recv()
    finally:
        proc.join(30)
        if proc.is_alive():
            proc.kill()
    assert proc.exitcode == 2
    answer = json.loads(body)
    assert (status, answer["field"]) == (400, "script"), answer
    assert "caught the stop after 3 iterations 100 times" in answer["error"]


HOG = """
import threading, time
HELD = []

def make(device):  # host memory, 64 MiB at a time, until refused
    blocks = []
    while True:
        blocks.append(bytearray(64 << 20))

def keep(device):  # a little at a time, held by the module: still held when the answer is built
    while True:
        HELD.append(bytearray(1000))

def threads(device):  # each thread's stack counts too
    while True:
        threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
"""


def test_a_worker_past_its_memory_bound_is_answered_400(tmp_path: Path) -> None:
    """A job that grows without end (a step's host tensors, a synthetic model of depth 10^8)
    took memory until the time limit, or until the OOM killer picked a process of the host."""
    (tmp_path / "hog.py").write_text(HOG)
    (tmp_path / "tools").mkdir()
    srv = Server(["--socket", str(tmp_path / "s.sock"), "--worker-memory", "0.25",
                  "--allow-step", "hog:make", "--allow-step", "hog:keep", "--allow-step",
                  "hog:threads"],
                 server_env(tmp_path, stand_ins(tmp_path / "tools")))  # fmt: skip
    try:
        assert srv.request("GET", "/v1/health")[1]["worker_memory_bytes"] == 1 << 28
        for step in ("hog:make", "hog:keep", "hog:threads"):
            status, answer = srv.estimate({"step": step})
            said = "(0.25 GiB beyond the warm zygote's, --worker-memory)"
            assert status == 400 and said in answer["error"], (step, answer)
        # The bound leaves an ordinary estimate alone, and the server goes on.
        status, answer = srv.estimate({"model": MLP, "batch_size": 32})
        assert status == 200, answer
    finally:
        assert srv.stop() == 0


def test_worker_memory_values(server: Server) -> None:
    from memtrace_trainer.cli import serve as cli_serve
    from memtrace_trainer.cli.serve import _worker_memory, host_memory
    from memtrace_trainer.errors import UserError

    host, phys = host_memory(), os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    # By default an equal share of the host's memory per concurrent estimate (this server: 1).
    assert server.request("GET", "/v1/health")[1]["worker_memory_bytes"] == host
    # A container's cgroup limit is the host's memory where it is lower ("max": no limit).
    limit_file = server.socket.parent / "memory.max"
    for limit, expect in (
        ("2147483648\n", min(phys, 1 << 31)),
        ("max\n", phys),
        (f"{1 << 62}", phys),
    ):
        limit_file.write_text(limit)
        with pytest.MonkeyPatch.context() as m:
            m.setattr(cli_serve, "CGROUP_LIMITS", (str(limit_file), "/nonexistent/limit"))
            assert host_memory() == expect, limit
    for text, workers, expect in ((None, 4, host // 4), ("none", 1, None), ("NONE", 2, None),
                                  ("8", 1, 8 << 30), ("0.5", 1, 1 << 29)):  # fmt: skip
        assert _worker_memory(text, workers) == expect, text
    for text in ("0", "-1", "abc", "nan", "inf", "1e30", ""):
        with pytest.raises(UserError, match="expected GiB above 0"):
            _worker_memory(text, 1)
    # Where /proc does not say what a worker holds, a bound of the budget alone would refuse
    # its first allocation: none, said.
    said: list[str] = []
    with pytest.MonkeyPatch.context() as m, notes.captured(said.append):
        m.setattr(serve_worker, "data_held", lambda: None)
        assert _worker_memory("8", 1) is None
    assert any("--worker-memory has no effect" in line for line in said), said
    done = subprocess.run([sys.executable, "-m", "memtrace_trainer", "serve", "--socket", "s",
                           "--worker-memory", "0"], capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 2 and "serve --worker-memory '0': expected GiB" in done.stderr, (
        done.stderr
    )
