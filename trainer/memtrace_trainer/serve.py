"""`memtrace_trainer serve`: warm estimates over local HTTP (docs/serve.md).

The server process stays light (no torch): it parses and checks requests, bounds concurrency and
time, and logs. Each estimate runs in its own worker process, forked by multiprocessing's
forkserver from a zygote that imported torch and the model zoo and warmed the tracer once
(`serve_zygote`): the fork is cheap, a worker past the time limit is killed without harm to the
server, and no request sees another's state. The zygote forks from a single thread, which a
process serving HTTP on threads could not do safely."""

from __future__ import annotations

import contextlib
import ipaddress
import math
import multiprocessing
import multiprocessing.connection
import os
import select
import shutil
import signal
import socket
import socketserver
import stat
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memtrace_trainer import __version__, serve_worker
from memtrace_trainer.errors import UserError
from memtrace_trainer.serve_http import (
    CLIENT_GONE,
    POLL_SECONDS,
    RETRY,
    ROUTES,
    SPARE_CONNECTIONS,
    STOPPING,
    Bounded,
    ClientWatch,
    Handler,
    log,
)
from memtrace_trainer.serve_procs import (
    alive,
    kill_group,
    kill_holders,
    kill_tree,
    stop_zygote,
    zygote_pid,
)
from memtrace_trainer.serve_schema import (
    CODE,
    Policy,
    RequestError,
    Schema,
    as_spelled,
    estimate_parser,
)

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
    # Bytes a worker may allocate past the zygote's (serve_worker.limit_memory); None: unbounded.
    worker_memory: int | None = None


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
        self.exiting = 0  # of them, workers that answered and are exiting
        self.waiting = 0  # requests waiting for an exiting worker's slot (`_take_slot`)
        self.rewarming = 0  # workers waiting for a zygote started again
        self.stopping = threading.Event()
        self.tmp_root = Path(tempfile.mkdtemp(prefix="memtrace-serve-"))

    def health(self) -> dict[str, Any]:
        c = self.config
        return {
            "status": "stopping"
            if self.stopping.is_set()
            else "warming"
            if self.rewarming
            else "ok",
            "version": __version__,
            "pid": os.getpid(),
            "listen": self.where,
            "max_concurrency": c.max_concurrency,
            "in_flight": self.busy,
            "timeout_seconds": c.timeout,
            "worker_memory_bytes": c.worker_memory,
            "allowed": c.policy.allowed(),
            "endpoints": [f"{m} {p}" for p, m in ROUTES.items()],
        }

    def schema_json(self) -> dict[str, Any]:
        return {
            "request": "a JSON object of `estimate` options; each field is an option's long "
            "flag in snake case (batch-size: batch_size); null leaves a field out",
            "fields": self.schema.to_json(),
            "response": "200: exactly what `memtrace_trainer estimate --json` prints for the "
            "same options (schema 3, estimators/README.md); verdict.fits says whether it fits",
            "errors": '{"error": MESSAGE, "field": FIELD or null}',
        }

    def estimate(self, body: bytes, client: socket.socket | None = None) -> tuple[int, str]:
        """The answer to an estimate request; `client` is its connection, watched so that a
        client that leaves stops its estimate."""
        argv, keys = self.schema.request(body, self.config.policy)
        if self.stopping.is_set():
            raise RequestError(503, STOPPING, headers=RETRY)
        if not self._take_slot():
            n = self.config.max_concurrency
            raise RequestError(503, f"busy: {n} estimate(s) already running, this server's "
                               f"limit (--max-concurrency {n}); retry shortly",
                               headers=RETRY)  # fmt: skip
        exiting = None
        try:
            status, text, exiting = self._run(argv, client)
        finally:
            if exiting is None:
                self._free_slot()
            else:
                # The answer is sent now, while the worker exits: one whose code left a thread
                # running took up to EXIT_SECONDS, and its answer waited for it.
                try:
                    threading.Thread(target=self._reap, args=(exiting,), name="worker-exit",
                                     daemon=True).start()  # fmt: skip
                except RuntimeError:  # no thread to be had: waited for here, slot not lost
                    self._reap(exiting)
        return status, as_spelled(status, text, keys)

    def _take_slot(self) -> bool:
        """A slot for one estimate, at once; or, when all are taken and some by workers that
        have answered and are exiting, one of them (within EXIT_SECONDS): a client's next
        request, sent as soon as it read the answer, is not refused for that exit. Only as
        many requests wait as workers are exiting, and only while they are: every other one
        is refused at once (503), as the bound promises."""
        got = self.slots.acquire(blocking=False)
        if not got:
            with self.lock:
                waits = self.waiting < self.exiting
                self.waiting += waits
            if not waits:
                # A reap may have freed a slot since the first try, and counted it out.
                got = self.slots.acquire(blocking=False)
            else:
                try:
                    got = self._wait_for_exit()
                finally:
                    with self.lock:
                        self.waiting -= 1
        if got:
            with self.lock:
                self.busy += 1
        return got

    def _wait_for_exit(self) -> bool:
        """A slot freed by an exiting worker, polled; none once no worker is exiting, at
        shutdown, or after EXIT_SECONDS and a second for its kill (its EXIT_SECONDS began
        before this request came)."""
        end = time.monotonic() + EXIT_SECONDS + 1
        while not self.stopping.is_set() and time.monotonic() < end:
            if self.slots.acquire(timeout=POLL_SECONDS):
                return True
            with self.lock:
                if self.exiting == 0:
                    break
        return self.slots.acquire(blocking=False)

    def _free_slot(self) -> None:
        with self.lock:
            self.busy -= 1
        self.slots.release()

    def _reap(self, exiting: Callable[[], None]) -> None:
        try:
            exiting()
        finally:
            # The slot first: a request finding none free while this still counts as exiting
            # waits for it (`_take_slot`), where the other order could refuse it.
            self._free_slot()
            with self.lock:
                self.exiting -= 1

    def _run(
        self, argv: list[str], client: socket.socket | None
    ) -> tuple[int, str, Callable[[], None] | None]:
        """One worker: its answer, or 504 past the time limit (the worker killed), 503 when
        shutdown stopped it, 500 when it died without one (400 naming the field when it ran the
        request's own code), CLIENT_GONE (not sent) when the client left first. Its temporary
        directory goes with it. With an answer comes what waits for the worker's exit (and
        kills it past EXIT_SECONDS), for the caller to run once the answer is on its way."""
        # The limit counts from here: a zygote started again below is part of the wait.
        deadline = time.monotonic() + self.config.timeout
        tmp = tempfile.mkdtemp(prefix="request-", dir=self.tmp_root)
        recv, send = self.ctx.Pipe(duplex=False)
        proc = self.ctx.Process(
            target=serve_worker.work, args=(argv, tmp, send, self.config.worker_memory), daemon=True
        )

        def release() -> None:
            recv.close()
            send.close()
            shutil.rmtree(tmp, ignore_errors=True)

        started = handed_off = False
        try:
            if self.stopping.is_set():
                raise RequestError(503, STOPPING, headers=RETRY)
            if not self._launch(proc, send, deadline, release):
                handed_off = True  # the start's thread releases the pipe and tmp when it ends
                if self.stopping.is_set():
                    raise RequestError(503, f"aborted: {STOPPING}", headers=RETRY)
                raise RequestError(504, f"the estimate ran past this server's time limit of "
                                   f"{self.config.timeout:g} s (--timeout) while its worker was "
                                   "started (the workers' zygote, started again, was not warm); "
                                   "the zygote was stopped, and the next request starts it "
                                   "afresh")  # fmt: skip
            started = True
            with self.lock:
                self.workers.add(proc)
                stopped = self.stopping.is_set()
            if stopped:  # stop_workers ran before this worker was listed
                kill_group(proc)
            send.close()  # the worker's copy is the only one left: its exit is our EOF
            self._wait(proc, recv, client, deadline)
            try:
                status, body = recv.recv()
            except EOFError:
                proc.join(5)
                if self.stopping.is_set():
                    raise RequestError(503, f"aborted: {STOPPING}", headers=RETRY) from None
                raise self._died(argv, serve_worker.describe_exit(proc.exitcode)) from None
            handed_off = True  # to `exited`, run by the caller

            def exited() -> None:
                # A worker that answered but does not exit (a thread the user's code left
                # running) is not waited for past a few seconds.
                proc.join(EXIT_SECONDS)
                self._end(proc)
                release()

            answer = int(status), str(body)
            with self.lock:  # last: nothing after it can raise and leave the count too high
                self.exiting += 1
            return *answer, exited
        finally:
            if started and not handed_off:
                self._end(proc)
            if not handed_off:
                release()

    def _end(self, proc: Any) -> None:
        """A started worker killed (whether or not it exited: what it started goes with it),
        reaped, and off the list shutdown kills."""
        kill_group(proc)
        proc.join()
        with self.lock:
            self.workers.discard(proc)

    def _died(self, argv: list[str], died: str) -> RequestError:
        """The error of a worker that exited without an answer: the request's when it ran the
        request's code (a step calling os._exit, a crash in an extension it loads), a 400
        naming that field; the server's own (500) when it ran only the zoo."""
        options = argv[: argv.index("--")] if "--" in argv else argv
        for name in CODE:
            flag = self.schema.fields[name].flag
            if any(word.startswith(f"{flag}=") for word in options):
                return RequestError(400, f"the estimate's worker process died without an answer "
                                    f"({died}) while it ran the {flag} code: that code ended "
                                    "its process (os._exit, a signal, a crash), or something "
                                    "killed it (the OOM killer, say)", name)  # fmt: skip
        return RequestError(500, f"the estimate's worker process died without an answer ({died})")

    def stop_workers(self) -> None:
        """No new estimates; every worker in flight killed (its request answers 503)."""
        with self.lock:
            self.stopping.set()
            for proc in self.workers:
                with contextlib.suppress(Exception):
                    kill_group(proc)

    def _launch(self, proc: Any, send: Any, deadline: float, release: Callable[[], None]) -> bool:
        """`_start(proc)` within the request's deadline: True once started. A start may restart
        a dead zygote (torch imported again, a warm-up), which can hang; it runs on a thread of
        its own, and past the deadline (or at shutdown) it is abandoned: False, the zygote
        killed so that the start fails and the next request starts a fresh one. The abandoned
        thread then owns the pipe and the temporary directory (the start hands the pipe's
        descriptor to the worker: closed under it, the number could name another file), calls
        `release` when the start returns, and kills a worker started too late."""
        lock = threading.Lock()
        finished, abandoned = threading.Event(), threading.Event()
        errors: list[BaseException] = []

        def run() -> None:
            try:
                self._start(proc, send, abandoned)
            except BaseException as e:
                errors.append(e)
            with lock:
                finished.set()
            if abandoned.is_set():
                if proc.pid is not None:  # started after all, for a request already answered
                    kill_group(proc)
                    proc.join()
                release()

        threading.Thread(target=run, name="worker-start", daemon=True).start()
        # A normal start is milliseconds: `wait` returns as soon as it is done.
        while not finished.wait(max(0.0, min(deadline - time.monotonic(), POLL_SECONDS))):
            if time.monotonic() < deadline and not self.stopping.is_set():
                continue
            with lock:
                if not finished.is_set():
                    abandoned.set()
            if abandoned.is_set():
                pid = zygote_pid()
                log(f"the workers' zygote (pid {pid}) did not start the worker within the "
                    "request's time limit; stopping it")  # fmt: skip
                if pid is not None:  # with what its warm-up started (memsim, memest)
                    kill_tree(pid)
                return False
        if errors:
            raise errors[0]
        return True

    def _start(self, proc: Any, send: Any, abandoned: threading.Event) -> None:
        """`proc.start()`, said in the log and in health when the zygote had died (the OOM
        killer's likely pick: it is the largest process) and is started and warmed again.
        Returns without a start once `abandoned` is set."""
        pid = zygote_pid()
        if pid is None or alive(pid):
            try:
                self._start_once(proc, send)
                return
            except (EOFError, ConnectionError):
                if pid is None or abandoned.is_set():
                    raise
                # It died just before: multiprocessing starts a new one once it is reaped.
                end = time.monotonic() + 5
                while alive(pid) and time.monotonic() < end:
                    time.sleep(0.05)
        if abandoned.is_set():
            return
        log(f"the workers' zygote (pid {pid}) has exited; starting it again (importing torch, "
            "one warm-up estimate)")  # fmt: skip
        start = time.perf_counter()
        with self.lock:
            self.rewarming += 1
        try:
            self._start_once(proc, send)
        finally:
            with self.lock:
                self.rewarming -= 1
        log(f"the workers' zygote is warm again ({time.perf_counter() - start:.1f} s)")

    @staticmethod
    def _start_once(proc: Any, send: Any) -> None:
        try:
            proc.start()
        except (EOFError, ConnectionError):
            # The zygote died during the start, maybe after forking the worker but before
            # sending its pid: that worker would run on outside the group killed at the
            # request's end (and answer on this pipe), so it is found by the pipe and killed.
            kill_holders(send.fileno())
            raise

    def _wait(self, proc: Any, recv: Any, client: socket.socket | None, deadline: float) -> None:
        """Until the worker answers (or exits). Past the deadline, or when the client leaves
        (`ClientWatch`), the worker is killed and the request answered 504, or not at all."""
        poller = select.poll()
        poller.register(recv.fileno(), select.POLLIN)
        watch = None if client is None else ClientWatch(client)
        if watch is not None:
            poller.register(watch.sock.fileno(), watch.events())
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                kill_group(proc)
                raise RequestError(504, f"the estimate ran past this server's time limit of "
                                   f"{self.config.timeout:g} s (--timeout); its worker was "
                                   "stopped")  # fmt: skip
            ready = dict(poller.poll(math.ceil(left * 1000)))
            if recv.fileno() in ready:  # an answer, or the worker's exit
                return
            if watch is not None and watch.sock.fileno() in ready:
                if watch.gone(ready[watch.sock.fileno()]):
                    kill_group(proc)
                    raise RequestError(CLIENT_GONE, "the client closed its connection before "
                                       "the answer; its estimate was stopped")  # fmt: skip
                poller.modify(watch.sock.fileno(), watch.events())

    def drain(self, seconds: float, server: Bounded) -> bool:
        """Wait until no connection is open; False if some still are after `seconds`."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            with server.open_lock:
                if server.open == 0:
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
        # The zygote died before its first worker answered, or was killed at a SIGTERM (its
        # socket then refuses the connection): a reason, not a thread's traceback in the log.
        except (EOFError, OSError):
            if proc.pid is None:
                return "the workers' zygote could not start a worker; see the lines above"
            proc.join(5)
            died = serve_worker.describe_exit(proc.exitcode)
            return f"the workers' zygote could not start ({died}); see the lines above"
        finally:
            recv.close()
            send.close()


# Connections wait in the listen queue during the warm-up and at bursts: more than the default 5.
BACKLOG = 64


class _TCPServer(Bounded):
    request_queue_size = BACKLOG


class _TCP6Server(_TCPServer):
    address_family = socket.AF_INET6


class _UnixServer(Bounded):
    address_family = socket.AF_UNIX
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


def _bind(config: Config) -> tuple[Bounded, str]:
    """The listening server, before any request is read, and where it listens."""
    handler = type("BoundHandler", (Handler,), {})
    try:
        if config.socket is not None:
            path = config.socket
            _free_socket_path(path)
            old = os.umask(0o177)  # the socket file is the owner's only (mode 0600)
            try:
                srv: Bounded = _UnixServer(str(path), handler)
            finally:
                os.umask(old)
            srv.max_connections = config.max_concurrency + SPARE_CONNECTIONS
            return srv, f"unix:{path}"
        ip = _loopback(config.host)
        cls = _TCP6Server if ip.version == 6 else _TCPServer
        srv = cls((str(ip), config.port or 0), handler)
        srv.max_connections = config.max_concurrency + SPARE_CONNECTIONS
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
            thread = threading.Thread(target=srv.serve_forever, args=(0.1,), name="serve",
                                      daemon=True)  # fmt: skip
            thread.start()
            log(f"listening on {where} (pid {os.getpid()}, max concurrency "
                f"{config.max_concurrency}, timeout {config.timeout:g} s; warm in "
                f"{time.perf_counter() - start:.1f} s)")  # fmt: skip
        while not stop.wait(0.5):
            pass
        log(f"{caught[0] if caught else 'stop'}: stopping; in-flight estimates are aborted (503)")
    finally:
        # Requests still being received are answered 503, estimates arriving are refused 503.
        svc.stopping.set()
        # No new connection from here: the socket's name goes first, then the listener.
        if config.socket is not None:
            with contextlib.suppress(OSError):
                if os.stat(config.socket).st_ino == inode:  # ours, not a successor's
                    config.socket.unlink()
        if thread is not None:
            srv.shutdown()
        srv.server_close()
        svc.stop_workers()
        if not svc.drain(DRAIN_SECONDS, srv):
            log(f"{srv.open} connection(s) still open after {DRAIN_SECONDS:g} s; closing anyway")
        stop_zygote()  # after the answers: a worker still starting then fails, answered 503
        shutil.rmtree(svc.tmp_root, ignore_errors=True)
    log("stopped")
    return 0
