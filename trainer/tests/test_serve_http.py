"""`serve`'s HTTP side in this process (no worker, no torch in the server): deadlines, the bound on
connections, methods, the log's escaping; and the request checks that need no server (which
script runs, which field an error names, which config files are read)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import cli

from memtrace_trainer import serve, serve_http, serve_procs
from memtrace_trainer.errors import UserError
from memtrace_trainer.models import hf
from memtrace_trainer.models.hf import MAX_CONFIG_BYTES, read_config
from memtrace_trainer.serve import Config, Service, _bind
from memtrace_trainer.serve_schema import Policy, RequestError, Schema, as_spelled, estimate_parser

READ = 1.5  # the request deadline these servers have


class Local:
    def __init__(self, path: Path | tuple[str, int]) -> None:
        self.path = path

    def connect(self) -> socket.socket:
        tcp = isinstance(self.path, tuple)
        s = socket.socket(socket.AF_INET if tcp else socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(20)
        s.connect(self.path if tcp else str(self.path))
        return s

    def exchange(self, data: bytes, pause: float = 0.0) -> tuple[bytes, bytes]:
        """Status line and headers, and body, of what comes back for `data`, sent byte by byte
        `pause` seconds apart when `pause` is given."""
        with self.connect() as s:
            for i in range(len(data) if pause else 1):
                try:
                    s.sendall(data[i : i + 1] if pause else data)
                except BrokenPipeError:  # answered (and closed) before the client finished
                    break
                time.sleep(pause)
            reply = b""
            while chunk := s.recv(65536):
                reply += chunk
        head, _, body = reply.partition(b"\r\n\r\n")
        return head, body


@contextlib.contextmanager
def running(config: Config) -> Iterator[Local]:
    """The server's HTTP side on `config`, without a zygote (no estimate runs)."""
    svc = Service(config)
    srv, svc.where = _bind(config)
    srv.RequestHandlerClass.service = svc  # type: ignore[attr-defined]
    srv.max_connections = 3
    thread = threading.Thread(target=srv.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield Local(config.socket or srv.server_address[:2])
    finally:
        svc.stopping.set()
        srv.shutdown()
        srv.server_close()
        shutil.rmtree(svc.tmp_root, ignore_errors=True)


@pytest.fixture
def local(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Local]:
    monkeypatch.setattr(serve_http, "READ_SECONDS", READ)
    with running(Config(tmp_path / "s.sock", "127.0.0.1", None, 1, 8.0, Policy())) as srv:
        yield srv


def test_a_slow_client_is_answered_408_at_the_deadline(
    local: Local, capsys: pytest.CaptureFixture[str]
) -> None:
    """The read timeout was per recv: a byte every few seconds kept a request open for ever."""
    start = time.monotonic()
    data = b"POST /v1/estimate HTTP/1.1\r\nHost: x\r\nContent-Length: 40\r\n\r\n" + b"{" * 40
    head, body = local.exchange(data, pause=0.05)
    assert b" 408 " in head.split(b"\r\n")[0], head
    assert "not complete within 1.5 s" in json.loads(body)["error"]
    assert time.monotonic() - start < READ + 3
    # A silent connection too, answered and logged in the one-line format.
    head, body = local.exchange(b"")
    assert b" 408 " in head.split(b"\r\n")[0] and json.loads(body)["field"] is None
    lines = capsys.readouterr().err.splitlines()
    assert any(line.startswith("serve: POST /v1/estimate 408 ") for line in lines), lines
    assert any(line.startswith("serve: - - 408 ") for line in lines), lines
    assert not any("Request timed out" in line for line in lines), lines


def test_connections_past_the_bound_are_refused_at_once(
    local: Local, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every idle connection held a thread of its own, without a bound."""
    # Long enough that the idle connections are still open however slow this machine is.
    monkeypatch.setattr(serve_http, "READ_SECONDS", 60.0)
    idle = [local.connect() for _ in range(3)]
    time.sleep(0.2)
    start = time.monotonic()
    head, body = local.exchange(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\n")
    assert b" 503 " in head.split(b"\r\n")[0] and b"Retry-After: 1" in head, head
    assert "3 connections already open" in json.loads(body)["error"]
    assert time.monotonic() - start < 5  # at once, not after the read deadline
    for s in idle:
        s.close()
    end = time.monotonic() + 10  # the closed connections' threads end in their own time
    while True:
        head, body = local.exchange(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\n")
        if b" 200 " in head.split(b"\r\n")[0] or time.monotonic() > end:
            break
        time.sleep(0.1)
    assert b" 200 " in head.split(b"\r\n")[0] and json.loads(body)["status"] == "ok"
    assert any(line.startswith("serve: - - 503 ") for line in capsys.readouterr().err.splitlines())


def test_methods_head_and_unknown(local: Local) -> None:
    head, body = local.exchange(b"HEAD /v1/health HTTP/1.1\r\nHost: x\r\n\r\n")
    assert b" 200 " in head.split(b"\r\n")[0] and body == b"", head
    assert b"Content-Type: application/json" in head
    # An unknown method on a known path is a 405 with Allow (http.server answered it 501).
    head, body = local.exchange(b"BREW /v1/health HTTP/1.1\r\nHost: x\r\n\r\n")
    assert b" 405 " in head.split(b"\r\n")[0] and b"Allow: GET, HEAD" in head, head
    assert json.loads(body)["field"] is None
    head, _ = local.exchange(b"BREW /v2/x HTTP/1.1\r\nHost: x\r\n\r\n")
    assert b" 404 " in head.split(b"\r\n")[0]
    # A blank request line was dropped without an answer or a log line.
    head, _ = local.exchange(b"   \r\n\r\n")
    assert b" 400 " in head.split(b"\r\n")[0]


def test_the_log_escapes_the_clients_control_bytes(
    local: Local, capsys: pytest.CaptureFixture[str]
) -> None:
    head, _ = local.exchange(b"\x00\x01\x1b[2J garbage\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 505 "), head  # two words: a request line without a version
    head, body = local.exchange("POST /v1/estimate HTTP/1.1\r\nContent-Length: \u0662\r\n\r\n"
                                .encode())  # fmt: skip
    assert b" 400 " in head.split(b"\r\n")[0] and "\\xd9\\xa2" in json.loads(body)["error"]
    err = capsys.readouterr().err
    assert "\x00" not in err and "\x1b" not in err and "\\x1b[2J" in err, err


def test_a_body_the_server_does_not_read_is_discarded_before_closing(local: Local) -> None:
    """A client still sending its body when the answer came got a reset, not the answer."""
    body = b"x" * (3 << 20)
    request = b"POST /v1/health HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body)
    with local.connect() as s:
        s.sendall(request + body)  # blocks until the server reads it
        reply = s.recv(65536)
    assert b" 405 " in reply.split(b"\r\n")[0], reply


def test_a_re_pointed_link_runs_what_it_was_allowed_as(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/serve.md: a request naming an allowed script by the same path, or its absolute form,
    runs the file resolved at start-up, whatever a link on the way points at since. It was a
    403 (the request's path was resolved at request time)."""
    (tmp_path / "release-1").mkdir()
    (tmp_path / "release-2").mkdir()
    first = tmp_path / "release-1" / "train.py"
    first.write_text("pass\n")
    (tmp_path / "release-2" / "train.py").write_text("pass\n")
    current = tmp_path / "current"
    current.symlink_to("release-1")
    monkeypatch.chdir(tmp_path)
    policy = Policy.allowing([], [], [Path("current/train.py")])
    current.unlink()
    current.symlink_to("release-2")
    schema = Schema(estimate_parser())
    for spelled in ("current/train.py", str(tmp_path / "current" / "train.py")):
        argv = schema.argv(json.dumps({"script": spelled}).encode(), policy)
        assert f"--script={first.resolve()}" in argv, argv
    # A path to the new target is not what was allowed.
    with pytest.raises(RequestError) as e:
        schema.argv(json.dumps({"script": "release-2/train.py"}).encode(), policy)
    assert (e.value.status, e.value.field) == (403, "script")


def test_a_failing_scripts_error_names_the_script_not_its_arguments() -> None:
    message = "script:/x/train.py --json -- x: nothing was allocated on the GPU"
    argv = ["--script=/x/train.py", "--json", "--", "--json", "--", "x"]
    assert Schema(estimate_parser()).field_in(message, argv) == "script"


def test_hf_config_reads_only_a_regular_file_of_config_size(tmp_path: Path) -> None:
    """A device was read until memory ran out, a FIFO waited for a writer for ever."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    caught: list[BaseException] = []

    def read() -> None:
        try:
            read_config(fifo)
        except BaseException as e:
            caught.append(e)

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    thread.join(10)
    if thread.is_alive():  # a writer that closes at once lets the blocked open return
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(10)
        pytest.fail("reading a FIFO blocked")
    assert isinstance(caught[0], UserError) and "not a regular file" in str(caught[0])
    with pytest.raises(UserError, match="not a regular file"):
        read_config(Path("/dev/null"))
    big = tmp_path / "config.json"
    with big.open("wb") as f:
        f.truncate(MAX_CONFIG_BYTES + 1)  # sparse: no disk used
    with pytest.raises(UserError, match=r"larger than 16 MiB: not a config\.json"):
        read_config(tmp_path)  # a directory holding a config.json
    done = cli("estimate", "--model", "hf-config:/dev/null", "--batch-size", "1", check=False)
    assert done.returncode == 2 and "not a regular file" in done.stderr, done.stderr


def test_a_script_path_is_resolved_once_and_the_stored_one_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The request's path was resolved twice, checked on the first and run as the second: a
    link re-pointed between the two ran a file never allowed (3,095 of 20,000 raced checks)."""
    good, evil = tmp_path / "good.py", tmp_path / "evil.py"
    good.write_text("pass\n")
    evil.write_text("pass\n")
    policy = Policy.allowing([], [], [good])
    answers = iter([good.resolve(), evil.resolve()])
    monkeypatch.setattr(Path, "resolve", lambda self, strict=False: next(answers))
    assert policy.check("script", str(tmp_path / "link-to-good.py")) == str(policy.scripts[0])


@pytest.mark.parametrize("spelled", ["loop/train.py", "loop", "good\0.py", "~nosuchuser\0/x.py"])
def test_a_script_path_that_resolves_to_nothing_is_a_403(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spelled: str
) -> None:
    """A link loop (RuntimeError) or a NUL byte (ValueError) was an internal error, a 500."""
    (tmp_path / "good.py").write_text("pass\n")
    (tmp_path / "loop").symlink_to("loop")
    monkeypatch.chdir(tmp_path)
    policy = Policy.allowing([], [], [Path("good.py")])
    with pytest.raises(RequestError) as e:
        Schema(estimate_parser()).argv(json.dumps({"script": spelled}).encode(), policy)
    assert (e.value.status, e.value.field) == (403, "script")


def test_script_arguments_are_taken_out_of_a_message_once_not_out_of_flags() -> None:
    """Arguments `e` were removed everywhere in the message: `--seq-len` read `--sq-ln`."""
    schema = Schema(estimate_parser())
    argv = ["--seq-len=x", "--script=/x/t.py", "--json", "--", "e"]
    assert schema.field_in("argument --seq-len: invalid int value: 'x'", argv) == "seq_len"
    message = "script:/x/t.py e: argument --seq-len: expected ... e"
    assert schema.field_in(message, argv) == "seq_len"
    # The `script:PATH ARGS` span still hides arguments that look like flags.
    argv = ["--script=/x/t.py", "--json", "--", "--json", "--batch-size"]
    assert schema.field_in("script:/x/t.py --json --batch-size: no GPU use", argv) == "script"


def _watch(client: socket.socket, server: socket.socket) -> serve_http.ClientWatch:
    server.setblocking(False)
    return serve_http.ClientWatch(server)


def _left(watch: serve_http.ClientWatch) -> bool | None:
    """True when the watch says its client left, False when it still waits, None when there
    was nothing to see."""
    import select

    poller = select.poll()
    poller.register(watch.sock.fileno(), watch.events())
    ready = poller.poll(200)
    return None if not ready else watch.gone(ready[0][1])


def test_a_unix_client_that_half_closes_still_waits(tmp_path: Path) -> None:
    """`nc -N` and socat shut down their sending side after the request: that was taken for a
    client that left, its estimate killed and the request never answered. Bytes after the
    request took the client off the watch for good: its close was never seen."""
    client, server = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with client, server:
        watch = _watch(client, server)
        client.sendall(b"\r\nGET /v1/health HTTP/1.0\r\n\r\n")  # a stray CRLF, a pipelined one
        assert _left(watch) is False
        assert _left(watch) is None
        client.shutdown(socket.SHUT_WR)
        assert _left(watch) is False and watch.eof
        assert _left(watch) is None  # no busy loop on a readable end of stream
        client.close()
        assert _left(watch) is True
    # Over TCP a half-close cannot be told from a close: it is one.
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname())
        server, _ = listener.accept()
        with client, server:
            watch = _watch(client, server)
            client.sendall(b"\r\n")
            assert _left(watch) is False
            client.sendall(b"x" * (serve_http.EXTRA_BYTES + 10))
            while _left(watch) is False:
                pass
            assert watch.extra <= 0 and not watch.events() & 1  # POLLIN no longer asked
            client.shutdown(socket.SHUT_WR)
            assert _left(watch) is True


def test_a_body_of_a_get_or_a_chunked_post_is_dropped_not_reset(local: Local) -> None:
    """The server closed with such a body unread: the client still sending got a broken pipe
    or a reset instead of the answer."""
    body = b"x" * (3 << 20)
    for request, status in (
        (b"GET /v1/health HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % len(body), b" 200 "),
        (b"GET /v1/schema HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % len(body), b" 200 "),
        (b"POST /v1/estimate HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", b" 411 "),
        # A body whose length the server cannot tell: it was not read, and the client still
        # sending it got a broken pipe.
        (b"GET /v1/health HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", b" 200 "),
        (b"GET /v2/x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", b" 404 "),
        (b"POST /v2/x HTTP/1.1\r\nContent-Length: 5, 5\r\n\r\n", b" 404 "),
        (
            b"POST /v1/estimate HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n",
            b" 400 ",
        ),
        (b"POST /v1/estimate HTTP/1.1\r\nContent-Length: x\r\n\r\n", b" 400 "),
    ):
        with local.connect() as s:
            s.sendall(request + body)  # blocks until the server reads it
            reply = b""
            while chunk := s.recv(65536):
                reply += chunk
        assert status in reply.split(b"\r\n")[0], reply[:200]
        json.loads(reply.partition(b"\r\n\r\n")[2])


def test_a_client_reset_while_sending_is_logged_as_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A reset in the body was an internal error (500, with a traceback); in the headers, a
    400 that was never sent."""
    monkeypatch.setattr(serve_http, "READ_SECONDS", 20.0)
    with running(Config(None, "127.0.0.1", 0, 1, 8.0, Policy())) as tcp:
        for data in (b"GET /v1/health HTTP/1.1\r\nHost: x\r\n",
                     b"POST /v1/estimate HTTP/1.1\r\nContent-Length: 99\r\n\r\n{"):  # fmt: skip
            s = tcp.connect()
            s.sendall(data)
            time.sleep(0.5)  # read by the server up to where the reset comes
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\0\0\0\0\0\0\0")
            s.close()  # linger 0: a reset
        end = time.monotonic() + 10
        lines: list[str] = []
        while sum(" 499 " in line for line in lines) < 2 and time.monotonic() < end:
            time.sleep(0.1)
            lines += capsys.readouterr().err.splitlines()
    assert any(line.startswith("serve: - - 499 ") or line.startswith("serve: GET /v1/health 499")
               for line in lines), lines  # fmt: skip
    assert any(line.startswith("serve: POST /v1/estimate 499 ") for line in lines), lines
    assert not any(" 500 " in line or " 400 " in line for line in lines), lines


def test_a_worker_start_is_bounded_by_the_time_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A zygote's restart (torch imported again) blocked `proc.start()` with no limit: a hung
    one held the request's slot for ever. Past the deadline the request is a 504 and the zygote
    is killed, so the next request starts a fresh one."""
    zygote = subprocess.Popen(["sleep", "60"])
    monkeypatch.setattr(serve, "zygote_pid", lambda: zygote.pid)
    let_go = threading.Event()
    monkeypatch.setattr(Service, "_start", lambda self, proc, send, abandoned: let_go.wait(30))
    svc = Service(Config(None, "127.0.0.1", 0, 1, 0.5, Policy()))
    try:
        start = time.monotonic()
        with pytest.raises(RequestError) as e:
            svc.estimate(json.dumps({"model": "torchvision:resnet18", "batch_size": 1}).encode())
        assert e.value.status == 504 and "zygote" in str(e.value), e.value
        assert time.monotonic() - start < 5 and svc.busy == 0
        assert zygote.wait(5) == -signal.SIGKILL
        # The pipe and the temporary directory stay with the start until it returns.
        assert len(list(svc.tmp_root.iterdir())) == 1
        let_go.set()
        end = time.monotonic() + 5
        while list(svc.tmp_root.iterdir()) and time.monotonic() < end:
            time.sleep(0.05)
        assert not list(svc.tmp_root.iterdir())
    finally:
        let_go.set()
        zygote.kill()
        shutil.rmtree(svc.tmp_root, ignore_errors=True)


def test_a_worker_forked_by_a_dying_zygote_is_killed() -> None:
    """A zygote that died after forking a worker but before sending its pid left that worker
    running outside any group the server kills; it is found by its request's pipe."""
    r, w = os.pipe()
    holder = subprocess.Popen(["sleep", "60"], pass_fds=[w])
    try:
        serve.kill_holders(r)
        assert holder.wait(5) == -signal.SIGKILL
    finally:
        holder.kill()
        os.close(r)
        os.close(w)


def test_hf_config_is_checked_before_it_is_opened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Opening a device can act on it (a tape rewinds): it was opened, then refused."""
    opened: list[str] = []
    real_open = os.open
    # `hf.os` is the os module: patched for the two calls only.
    with monkeypatch.context() as m:
        m.setattr(hf.os, "open", lambda p, *a: opened.append(str(p)) or real_open(p, *a))
        for path in (Path("/dev/null"), Path("/dev/zero")):
            with pytest.raises(UserError, match="not a regular file"):
                read_config(path)
    assert opened == []
    # A path replaced between the check and the open is refused, not read.
    config = tmp_path / "config.json"
    config.write_text('{"model_type": "gpt2"}')
    other = os.stat(tmp_path)
    with monkeypatch.context() as m, pytest.raises(UserError, match="replaced"):
        m.setattr(hf.os, "fstat", lambda fd: other)
        read_config(config)


def test_turning_a_connection_away_reads_a_bounded_amount() -> None:
    """The accepting thread read what a turned-away client sent until it stopped sending."""

    class Streaming:  # a client whose bytes are always there
        received = 0

        def __getattr__(self, name: str) -> Any:
            return lambda *args: None  # setblocking, sendall, shutdown, close

        def recv(self, n: int) -> bytes:
            self.received += n
            return b"x" * n

    srv = serve_http.Bounded.__new__(serve_http.Bounded)
    srv.max_connections = 0
    client = Streaming()
    done = threading.Event()
    threading.Thread(target=lambda: (srv._turn_away(client), done.set()), daemon=True).start()
    assert done.wait(10), "the accepting thread kept reading"
    assert client.received <= serve_http.TURN_AWAY_BYTES


@pytest.mark.parametrize(
    ("message", "argv", "field"),
    [
        ("unexpected arguments {quoted}: only --script takes arguments", [], "script_args"),
        ("script:/x/t.py {bare}: nothing was allocated on the GPU", ["--script=/x/t.py"], "script"),
        ("argument --seq-len: invalid int value: 'x' {bare}", ["--seq-len=x"], "seq_len"),
        ("argument --seq-len: invalid int value: 'x'", ["--seq-len=x"], "seq_len"),
    ],
)
def test_many_script_arguments_are_looked_up_in_linear_time(
    message: str, argv: list[str], field: str
) -> None:
    """A search per argument through a message quoting them all was quadratic: 100,000
    arguments took 15 s, and 200,000 ran past the time limit (504)."""
    schema = Schema(estimate_parser())
    for n in (1_000, 200_000):
        args = [f"--model=a{i}" for i in range(n)]
        text = message.format(quoted=repr(" ".join(args)), bare=" ".join(args))
        start = time.monotonic()
        assert schema.field_in(text, [*argv, "--json", "--", *args]) == field
        assert time.monotonic() - start < 2, n


@pytest.mark.parametrize(
    ("status", "answer", "field"),
    [
        (400, {"error": "--steps 5000: expected at most 1000", "field": "steps"}, "iterations"),
        (400, {"error": "x", "field": "batch_size"}, "batch_size"),
        (400, {"error": "x", "field": None}, None),
        (200, {"field": "steps"}, "steps"),  # an answer is never touched
    ],
)
def test_a_workers_error_names_the_key_the_request_used(
    status: int, answer: dict[str, Any], field: str | None
) -> None:
    keys = {"steps": "iterations", "batch_size": "batch_size"}
    assert json.loads(as_spelled(status, json.dumps(answer), keys))["field"] == field


@pytest.mark.parametrize(
    ("body", "status", "field", "says"),
    [
        # Integers past Python's 4,300 digits: "not JSON" (and a hint at set_int_max_str_digits).
        (b'{"steps": 9' + b"9" * 4300 + b"}", 400, "steps", "(4301 digits) is out of range"),
        (b'{"iterations": -9' + b"9" * 4300 + b"}", 400, "iterations", "-99999999999..."),
        (b'{"profile": 9' + b"9" * 4300 + b"}", 400, "profile", "out of range"),
        (b'{"script_args": ["a", 9' + b"9" * 4300 + b"]}", 400, "script_args", "out of range"),
        (b'{"model": {"x": [9' + b"9" * 4300 + b"]}}", 400, "model", "out of range"),
        (b"9" * 4400, 400, None, "not number"),
        (b'{"nosuch": 9' + b"9" * 4300 + b"}", 400, "nosuch", "unknown field"),
        # Code fields run only what the server was started with: whatever a request spells
        # there is a 403, a NUL or a surrogate too.
        (b'{"step": "os:getcwd\\u0000"}', 403, "step", "not allowed"),
        (b'{"entry": "a:b\\ud800"}', 403, "entry", "not allowed"),
    ],
)
def test_request_values_no_command_line_carries(
    body: bytes, status: int, field: str | None, says: str
) -> None:
    with pytest.raises(RequestError) as e:
        Schema(estimate_parser()).argv(body, Policy())
    assert (e.value.status, e.value.field) == (status, field), e.value
    assert says in str(e.value)


@pytest.mark.parametrize(
    ("argv", "status", "field"),
    [
        (["--step=m:f", "--json"], 400, "step"),
        (["--entry=m:f", "--batch-size=2", "--json"], 400, "entry"),
        (["--script=/x/t.py", "--json", "--", "--step=m:f"], 400, "script"),
        # Only the zoo ran: the worker's death is the server's fault, arguments or not.
        (["--model=m", "--batch-size=2", "--json"], 500, None),
        (["--model=m", "--json", "--", "--step=m:f"], 500, None),
    ],
)
def test_a_worker_that_died_is_the_requests_fault_when_it_ran_its_code(
    argv: list[str], status: int, field: str | None
) -> None:
    svc = Service(Config(None, "127.0.0.1", 0, 1, 8.0, Policy()))
    try:
        e = svc._died(argv, "exit status 3")
    finally:
        shutil.rmtree(svc.tmp_root, ignore_errors=True)
    assert (e.status, e.field) == (status, field)
    assert "died without an answer (exit status 3)" in str(e)


@pytest.mark.parametrize("name", ["a\0b", "\ud800.json", "dir/\udfff/config.json"])
def test_hf_config_a_name_no_file_can_have_is_a_user_error(tmp_path: Path, name: str) -> None:
    """os.stat raised ValueError (a NUL, a lone surrogate), past an `except OSError`."""
    with pytest.raises(UserError, match="not a file name"):
        read_config(tmp_path / name)


def test_stopping_the_zygote_kills_and_reaps_its_tree(monkeypatch: pytest.MonkeyPatch) -> None:
    """A SIGTERM during the warm-up left the zygote (and what it ran) warming up for seconds
    after the server had exited."""
    import multiprocessing.forkserver
    import multiprocessing.resource_tracker

    zygote = subprocess.Popen(["sh", "-c", "sleep 60 & echo $!; wait"], stdout=subprocess.PIPE)
    assert zygote.stdout is not None
    child = int(zygote.stdout.readline())
    fake = multiprocessing.forkserver.ForkServer()
    fake._forkserver_pid = zygote.pid
    monkeypatch.setattr(multiprocessing.forkserver, "_forkserver", fake)
    # This process's own tracker is left alone.
    tracker = multiprocessing.resource_tracker.ResourceTracker()
    monkeypatch.setattr(multiprocessing.resource_tracker, "_resource_tracker", tracker)
    try:
        serve_procs.stop_zygote()
        assert zygote.returncode is None  # reaped by stop_zygote, not by Popen
        with pytest.raises(ChildProcessError):
            os.waitpid(zygote.pid, os.WNOHANG)
        end = time.monotonic() + 5
        while Path(f"/proc/{child}").exists() and time.monotonic() < end:
            time.sleep(0.05)
        status = Path(f"/proc/{child}/status")
        assert not status.exists() or "zombie" in status.read_text(), "the zygote's child ran on"
        # No zygote starts after it: the forkserver's lock is kept.
        assert fake._forkserver_pid is None and not fake._lock.acquire(timeout=0.1)
    finally:
        zygote.kill()
