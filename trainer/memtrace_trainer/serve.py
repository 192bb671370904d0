"""`memtrace_trainer serve`: warm estimates over local HTTP (docs/serve.md).

The server process stays light (no torch): it parses and checks requests, bounds concurrency and
time, and logs. Each estimate runs in its own worker process, forked by multiprocessing's
forkserver from a zygote that imported torch and the model zoo and warmed the tracer once
(`serve_zygote`): the fork is cheap, a worker past the time limit is killed without harm to the
server, and no request sees another's state. The zygote forks from a single thread, which a
process serving HTTP on threads could not do safely."""

from __future__ import annotations

import contextlib
import http.server
import ipaddress
import json
import multiprocessing
import os
import shutil
import signal
import socket
import socketserver
import stat
import sys
import tempfile
import threading
import time
import traceback
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memtrace_trainer import __version__, serve_worker
from memtrace_trainer.errors import UserError
from memtrace_trainer.serve_schema import MAX_BODY, Policy, RequestError, Schema, estimate_parser

ROUTES = {"/v1/estimate": "POST", "/v1/health": "GET", "/v1/schema": "GET"}
STOPPING = "the server is shutting down"
# How long a connection may take to send its request, so a silent client does not hold a thread.
READ_SECONDS = 30.0
# How long shutdown waits for in-flight requests to send their answers once workers are stopped.
DRAIN_SECONDS = 10.0
# How long a worker that has answered may take to exit before it is killed.
EXIT_SECONDS = 5.0


@dataclass(frozen=True)
class Config:
    socket: Path | None
    host: str
    port: int | None
    max_concurrency: int
    timeout: float
    policy: Policy


def kill_group(proc: multiprocessing.process.BaseProcess) -> None:
    """The worker and every process in its group (it leads one: `serve_worker.work`), so what
    the user's code started does not outlive its request; the worker alone where it has not
    made its group yet."""
    if proc.pid is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(Exception):
        proc.kill()


def log(line: str) -> None:
    sys.stderr.write(f"serve: {line}\n")
    sys.stderr.flush()


class Service:
    """What the request threads share: the limits, the workers in flight, the shutdown flag."""

    def __init__(self, config: Config) -> None:
        self.config, self.where = config, ""
        self.schema = Schema(estimate_parser())
        self.ctx = multiprocessing.get_context("forkserver")
        self.ctx.set_forkserver_preload(["memtrace_trainer.serve_zygote"])
        self.slots = threading.BoundedSemaphore(config.max_concurrency)
        self.lock = threading.Lock()
        self.workers: set[Any] = set()
        self.busy = 0  # estimates holding a slot
        self.active = 0  # requests being handled, of any kind
        self.stopping = threading.Event()
        self.tmp_root = Path(tempfile.mkdtemp(prefix="memtrace-serve-"))

    def health(self) -> dict[str, Any]:
        c = self.config
        return {
            "status": "stopping" if self.stopping.is_set() else "ok",
            "version": __version__,
            "pid": os.getpid(),
            "listen": self.where,
            "max_concurrency": c.max_concurrency,
            "in_flight": self.busy,
            "timeout_seconds": c.timeout,
            "allowed": c.policy.allowed(),
            "endpoints": [f"{m} {p}" for p, m in ROUTES.items()],
        }

    def schema_json(self) -> dict[str, Any]:
        return {
            "request": "a JSON object of `estimate` options; each field is an option's long "
            "flag in snake case (batch-size: batch_size); null leaves a field out",
            "fields": self.schema.to_json(),
            "response": "200: exactly what `memtrace_trainer estimate --json` prints for the "
            "same options (schema 2, estimators/README.md); verdict.fits says whether it fits",
            "errors": '{"error": MESSAGE, "field": FIELD or null}',
        }

    def estimate(self, body: bytes) -> tuple[int, str]:
        argv = self.schema.argv(body, self.config.policy)
        if self.stopping.is_set():
            raise RequestError(503, STOPPING)
        if not self.slots.acquire(blocking=False):
            n = self.config.max_concurrency
            raise RequestError(503, f"busy: {n} estimate(s) already running, this server's "
                               f"limit (--max-concurrency {n}); retry shortly",
                               headers={"Retry-After": "1"})  # fmt: skip
        with self.lock:
            self.busy += 1
        try:
            return self._run(argv)
        finally:
            with self.lock:
                self.busy -= 1
            self.slots.release()

    def _run(self, argv: list[str]) -> tuple[int, str]:
        """One worker: its answer, or 504 past the time limit (the worker killed), 503 when
        shutdown stopped it, 500 when it died without one. Its temporary directory goes with it."""
        tmp = tempfile.mkdtemp(prefix="request-", dir=self.tmp_root)
        recv, send = self.ctx.Pipe(duplex=False)
        proc = self.ctx.Process(target=serve_worker.work, args=(argv, tmp, send), daemon=True)
        started = False
        try:
            with self.lock:
                if self.stopping.is_set():
                    raise RequestError(503, STOPPING)
                proc.start()
                started = True
                self.workers.add(proc)
            send.close()  # the worker's copy is the only one left: its exit is our EOF
            if not recv.poll(self.config.timeout):
                kill_group(proc)
                raise RequestError(504, f"the estimate ran past this server's time limit of "
                                   f"{self.config.timeout:g} s (--timeout); its worker was "
                                   "stopped")  # fmt: skip
            try:
                status, body = recv.recv()
            except EOFError:
                proc.join(5)
                if self.stopping.is_set():
                    raise RequestError(503, f"aborted: {STOPPING}") from None
                died = serve_worker.describe_exit(proc.exitcode)
                raise RequestError(
                    500, f"the estimate's worker process died without an answer ({died})"
                ) from None
            return int(status), str(body)
        finally:
            with self.lock:
                self.workers.discard(proc)
            if started:
                # A worker that answered but does not exit (a thread the user's code left
                # running) is not waited for past a few seconds.
                proc.join(EXIT_SECONDS)
                # Killed whether or not it exited: what it started goes with it.
                kill_group(proc)
                proc.join()
            recv.close()
            send.close()
            shutil.rmtree(tmp, ignore_errors=True)

    def stop_workers(self) -> None:
        """No new estimates; every worker in flight killed (its request answers 503)."""
        with self.lock:
            self.stopping.set()
            for proc in self.workers:
                with contextlib.suppress(Exception):
                    kill_group(proc)

    def drain(self, seconds: float) -> bool:
        """Wait until no request is being handled; False if some still are after `seconds`."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            with self.lock:
                if self.active == 0:
                    return True
            time.sleep(0.05)
        return False

    def warm(self, stop: threading.Event) -> bool:
        """Start the zygote and wait for its warm-up: True when warm, False when `stop` came
        first; a UserError with the reason if it failed."""
        # Starting the first worker blocks until the zygote is warm, so it runs on a thread and
        # a SIGTERM meanwhile is not kept waiting.
        result: list[str | None] = []
        thread = threading.Thread(target=lambda: result.append(self._probe()), daemon=True)
        thread.start()
        while thread.is_alive():
            if stop.wait(0.2):
                return False
        if not result:
            raise UserError("serve: the workers' zygote could not be started; see the lines above")
        if result[0]:
            raise UserError(f"serve: {result[0]}")
        return True

    def _probe(self) -> str | None:
        """The zygote's warm-up error (or None), from its first worker."""
        recv, send = self.ctx.Pipe(duplex=False)
        proc = self.ctx.Process(target=serve_worker.ready, args=(send,), daemon=True)
        try:
            proc.start()
            send.close()
            return recv.recv()  # type: ignore[no-any-return]
        except EOFError:
            proc.join(5)
            died = serve_worker.describe_exit(proc.exitcode)
            return f"the workers' zygote could not start ({died}); see the lines above"
        finally:
            recv.close()
            send.close()


class Handler(http.server.BaseHTTPRequestHandler):
    """One request: routed, answered with JSON whatever happens, and logged on one line."""

    server_version = f"memtrace-serve/{__version__}"
    timeout = READ_SECONDS
    service: Service  # set on the subclass the server makes

    def do_GET(self) -> None:
        self._dispatch()

    do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = do_GET

    def _dispatch(self) -> None:
        start = time.perf_counter()
        svc = self.service
        with svc.lock:
            svc.active += 1
        headers: dict[str, str] = {}
        try:
            status, body = self._route()
        except RequestError as e:
            status, body, headers = e.status, json.dumps(e.body()), e.headers
        except Exception as e:  # never let a request take the server down
            traceback.print_exc()
            status = 500
            body = json.dumps({"error": f"internal error: {type(e).__name__}: {e}", "field": None})
        try:
            self._send(status, body, headers)
        except OSError as e:  # the client left; its answer has nowhere to go
            log(f"{self.command} {self.path}: could not send the answer ({e})")
        finally:
            with svc.lock:
                svc.active -= 1
        self._log(status, time.perf_counter() - start, body)

    def _route(self) -> tuple[int, str]:
        url = urllib.parse.urlsplit(self.path)
        method = ROUTES.get(url.path)
        if method is None:
            raise RequestError(404, f"no endpoint {url.path!r}; endpoints: "
                               + ", ".join(f"{m} {p}" for p, m in ROUTES.items()))  # fmt: skip
        if self.command != method:
            raise RequestError(405, f"{url.path} takes {method}, not {self.command}",
                               headers={"Allow": method})  # fmt: skip
        if url.query:
            raise RequestError(400, f"{url.path} takes no query string ({url.query!r}): "
                               "options go in the JSON body")  # fmt: skip
        if url.path == "/v1/health":
            return 200, json.dumps(self.service.health())
        if url.path == "/v1/schema":
            return 200, json.dumps(self.service.schema_json())
        return self.service.estimate(self._body())

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding"):
            raise RequestError(411, "send the body with a Content-Length header, not "
                               f"Transfer-Encoding {self.headers['Transfer-Encoding']}",
                               "Content-Length")  # fmt: skip
        lengths = self.headers.get_all("Content-Length") or []
        if not lengths:
            raise RequestError(411, "POST /v1/estimate needs a Content-Length header",
                               "Content-Length")  # fmt: skip
        text = lengths[0].strip()
        if len(lengths) > 1 or not text.isascii() or not text.isdigit():
            raise RequestError(400, f"Content-Length {', '.join(lengths)!r} is not one byte "
                               "count", "Content-Length")  # fmt: skip
        n = int(text)
        if n > MAX_BODY:
            raise RequestError(413, f"request body of {n} bytes is over the limit of "
                               f"{MAX_BODY} bytes", "Content-Length")  # fmt: skip
        try:
            data = self.rfile.read(n)
        except TimeoutError:
            why = f"request body incomplete after {READ_SECONDS:g} s: Content-Length said {n} bytes"
            raise RequestError(400, why, "Content-Length") from None
        if len(data) < n:
            raise RequestError(400, f"request body ended after {len(data)} of the {n} bytes its "
                               "Content-Length announced", "Content-Length")  # fmt: skip
        return data

    def _send(self, status: int, body: str, headers: dict[str, str]) -> None:
        data = body.encode() if body.endswith("\n") else (body + "\n").encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Connection", "close")
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _log(self, status: int, seconds: float, body: str) -> None:
        why = ""
        if status >= 400:
            with contextlib.suppress(ValueError, TypeError, KeyError):
                why = f" ({json.loads(body)['error'][:160]})"
        # A request line http.server could not parse leaves no method or path behind.
        path = urllib.parse.urlsplit(getattr(self, "path", "") or "").path or "-"
        log(f"{self.command or '-'} {path} {status} {seconds:.3f} s{why}")

    def parse_request(self) -> bool:
        """http.server's, less HTTP/0.9: a request line without a version (`GET /v1/health`)
        was served as HTTP/0.9, a bare body with no status line or Content-Type. Refused before
        its headers are read, as a 505 in JSON (`send_error` answers as HTTP/1.0)."""
        words = str(self.raw_requestline, "iso-8859-1").split()
        if len(words) != 2:
            return super().parse_request()
        self.command, self.path = words
        self.send_error(505, "a request line without an HTTP version (HTTP/0.9) is not served: "
                        "send HTTP/1.0 or HTTP/1.1")  # fmt: skip
        return False

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """What http.server answers itself (a malformed request line, an unknown method): JSON
        too."""
        self.close_connection = True
        # A request line too broken to name its version is answered as HTTP/1.0, with a status
        # line and headers, not as the bare body of HTTP/0.9.
        self.request_version = "HTTP/1.0"
        text = message or self.responses.get(code, ("error",))[0]
        body = json.dumps({"error": text, "field": None})
        with contextlib.suppress(OSError):
            self._send(code, body, {})
        self._log(code, 0.0, body)

    def log_request(self, code: Any = "-", size: Any = "-") -> None:
        pass  # `_log` writes one line per request, with its time

    def log_message(self, format: str, *args: Any) -> None:
        log(format % args)


# Connections wait in the listen queue during the warm-up and at bursts: more than the default 5.
BACKLOG = 64


class _TCPServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = BACKLOG


class _TCP6Server(_TCPServer):
    address_family = socket.AF_INET6


class _UnixServer(http.server.ThreadingHTTPServer):
    address_family = socket.AF_UNIX
    daemon_threads = True
    request_queue_size = BACKLOG
    allow_reuse_address = False

    def server_bind(self) -> None:
        # HTTPServer.server_bind reads a host and port from the address; a socket path has none.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = "localhost", 0


def _loopback(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    if host == "localhost":
        return ipaddress.ip_address("127.0.0.1")
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        raise UserError(f"serve --host {host!r}: expected a loopback address (127.0.0.1, ::1 "
                        "or localhost)") from None  # fmt: skip
    if not ip.is_loopback:
        raise UserError(f"serve --host {host}: not a loopback address; serve listens on this "
                        "machine only (127.0.0.1, ::1, or --socket PATH), because a request "
                        "runs estimates with the server's user and files")  # fmt: skip
    return ip


def _free_socket_path(path: Path) -> None:
    """Remove a stale socket left by a server that died; refuse a live one or any other file."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise UserError(f"serve --socket {path}: the path exists and is not a socket; refusing to "
                        "replace it")  # fmt: skip
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
    except OSError:
        path.unlink()  # nobody listens: a stale socket
        return
    finally:
        probe.close()
    raise UserError(f"serve --socket {path}: a server is already listening there")


def _bind(config: Config) -> tuple[http.server.ThreadingHTTPServer, str]:
    """The listening server, before any request is read, and where it listens."""
    handler = type("BoundHandler", (Handler,), {})
    try:
        if config.socket is not None:
            path = config.socket
            _free_socket_path(path)
            old = os.umask(0o177)  # the socket file is the owner's only (mode 0600)
            try:
                srv: http.server.ThreadingHTTPServer = _UnixServer(str(path), handler)
            finally:
                os.umask(old)
            return srv, f"unix:{path}"
        ip = _loopback(config.host)
        cls = _TCP6Server if ip.version == 6 else _TCPServer
        srv = cls((str(ip), config.port or 0), handler)
        host = f"[{ip}]" if ip.version == 6 else str(ip)
        return srv, f"http://{host}:{srv.server_address[1]}"
    except OSError as e:
        where = f"--socket {config.socket}" if config.socket else f"--port {config.port}"
        raise UserError(f"serve {where}: cannot listen ({e.strerror or e})") from None


def serve(config: Config) -> int:
    """Listen, warm the zygote, answer requests until SIGTERM or SIGINT; 0 after a clean stop."""
    stop = threading.Event()
    caught: list[str] = []

    def on_signal(signum: int, _frame: Any) -> None:
        caught.append(signal.Signals(signum).name)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    svc = Service(config)
    try:
        srv, where = _bind(config)
    except BaseException:
        shutil.rmtree(svc.tmp_root, ignore_errors=True)
        raise
    inode = os.stat(config.socket).st_ino if config.socket else None
    svc.where = where
    srv.RequestHandlerClass.service = svc  # type: ignore[attr-defined]
    thread = None
    try:
        log(f"warming up on {where}: importing torch and the model zoo, one warm-up estimate "
            "(connections made meanwhile wait)")  # fmt: skip
        start = time.perf_counter()
        if svc.warm(stop):
            thread = threading.Thread(target=srv.serve_forever, name="serve", daemon=True)
            thread.start()
            log(f"listening on {where} (pid {os.getpid()}, max concurrency "
                f"{config.max_concurrency}, timeout {config.timeout:g} s; warm in "
                f"{time.perf_counter() - start:.1f} s)")  # fmt: skip
        while not stop.wait(0.5):
            pass
        log(f"{caught[0] if caught else 'stop'}: stopping; in-flight estimates are aborted (503)")
    finally:
        svc.stopping.set()  # estimates arriving from here on are answered 503
        if thread is not None:
            srv.shutdown()
        svc.stop_workers()
        if not svc.drain(DRAIN_SECONDS):
            log(f"{svc.active} request(s) still open after {DRAIN_SECONDS:g} s; closing anyway")
        srv.server_close()
        if config.socket is not None:
            with contextlib.suppress(OSError):
                if os.stat(config.socket).st_ino == inode:  # ours, not a successor's
                    config.socket.unlink()
        shutil.rmtree(svc.tmp_root, ignore_errors=True)
    log("stopped")
    return 0
