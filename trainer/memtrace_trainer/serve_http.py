"""The HTTP side of `serve` (docs/serve.md): reading a request under one deadline, routing it,
answering in JSON whatever happens, one log line each, and a bound on open connections.

A request thread blocks only on its own socket; what it shares with the others is the `Service`
(serve.py), whose lock is never held across blocking work, so health is answered whatever the
load."""

from __future__ import annotations

import contextlib
import http.server
import io
import json
import re
import select
import socket
import sys
import threading
import time
import traceback
import urllib.parse
from typing import TYPE_CHECKING, Any

from memtrace_trainer import __version__
from memtrace_trainer.serve_schema import MAX_BODY, RequestError

if TYPE_CHECKING:
    from memtrace_trainer.serve import Service

ROUTES = {"/v1/estimate": "POST", "/v1/health": "GET", "/v1/schema": "GET"}
STOPPING = "the server is shutting down"
RETRY = {"Retry-After": "1"}
# How long a client may take to send its whole request (line, headers and body), so a slow or
# silent one does not hold a thread; it is answered 408.
READ_SECONDS = 30.0
# How often a thread waiting for a request's bytes looks at the deadline and the shutdown flag.
POLL_SECONDS = 0.2
# How long an answer may take to be taken by its client.
WRITE_SECONDS = 30.0
# A body the server does not read (over the limit, or sent to an endpoint that takes none) is
# read and dropped up to this much, so that the client, still sending, sees the answer instead
# of a reset connection.
DISCARD_BYTES = 16 << 20
DISCARD_SECONDS = 5.0
# What the accepting thread reads and drops of a connection it turns away: what is already there
# (it never waits), and no more than this, so a client streaming bytes cannot hold it.
TURN_AWAY_BYTES = 1 << 20
# Connections open at once beyond --max-concurrency (health checks, requests being read); past
# it a new connection is answered 503 at once, so idle connections cannot pile up threads.
SPARE_CONNECTIONS = 64
# What is read and dropped of bytes a client sends after its request while its estimate runs (a
# pipelined request, a stray CRLF), so they do not hide its close; past it only a close is seen.
EXTRA_BYTES = 64 << 10
# Not an HTTP answer: the status logged for a request whose client left before its answer
# (nginx's convention), its estimate stopped.
CLIENT_GONE = 499

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def log(line: str) -> None:
    # Request lines and headers are the client's bytes: control characters (an ESC sequence, a
    # NUL) are escaped so they cannot rewrite the terminal or the log.
    line = _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", line)
    sys.stderr.write(f"serve: {line}\n")
    sys.stderr.flush()


class Stopping(Exception):
    """The server began to shut down while this request was still being received."""


class _Reader(io.RawIOBase):
    """A connection's bytes under one deadline for the whole request: http.server's socket
    timeout applies to each recv, so a client sending a byte now and then was never cut off."""

    def __init__(self, sock: socket.socket, deadline: float, stopping: threading.Event) -> None:
        self.sock, self.deadline, self.stopping = sock, deadline, stopping

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while True:
            if self.stopping.is_set():
                raise Stopping
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            self.sock.settimeout(min(left, POLL_SECONDS))
            try:
                return self.sock.recv_into(buffer)
            except TimeoutError:
                continue


class ClientWatch:
    """Whether the client of an estimate in flight has left, from the poll(2) events of its
    connection. On a Unix socket a close (POLLHUP) differs from a half-close (POLLRDHUP alone):
    `nc -N` and socat shut down their sending side after the request and wait for the answer.
    Over TCP both are the peer's FIN, so there a half-close counts as leaving (as nginx takes
    it)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.unix = sock, sock.family == socket.AF_UNIX
        self.extra = EXTRA_BYTES  # what may still be read and dropped
        self.eof = False  # a Unix client half-closed: readable for ever, nothing more to read

    def events(self) -> int:
        """What to poll for; POLLHUP and POLLERR are reported whatever is asked."""
        mask = 0 if self.unix else select.POLLRDHUP
        if self.extra > 0 and not self.eof:
            mask |= select.POLLIN
        return mask

    def gone(self, revents: int) -> bool:
        if revents & (select.POLLHUP | select.POLLERR | select.POLLNVAL):
            return True
        if revents & select.POLLRDHUP and not self.unix:
            return True
        if revents & select.POLLIN:
            try:
                chunk = self.sock.recv(min(self.extra, 1 << 16), socket.MSG_DONTWAIT)
            except BlockingIOError:
                return False
            except OSError:  # reset
                return True
            if not chunk:
                if not self.unix:
                    return True
                self.eof = True
            self.extra -= len(chunk)
        return False


class Handler(http.server.BaseHTTPRequestHandler):
    """One request: routed, answered with JSON whatever happens, and logged on one line."""

    server_version = f"memtrace-serve/{__version__}"
    service: Service  # set on the subclass the server makes

    def setup(self) -> None:
        super().setup()
        self.rfile = io.BufferedReader(
            _Reader(self.connection, time.monotonic() + READ_SECONDS, self.service.stopping)
        )
        self.command = self.path = ""  # what `_log` says of a request line never received
        self.started = time.perf_counter()
        self.unread = 0  # body bytes announced and not read

    def handle(self) -> None:
        """One request per connection (HTTP/1.0 answers), whatever its method: http.server's
        answers an unknown method 501 itself, where a known path's is a 405."""
        self.close_connection = True
        try:
            self.raw_requestline = self.rfile.readline(65537)
            if not self.raw_requestline:
                return  # connected and closed, or half-closed, without a byte: no request
            if len(self.raw_requestline) > 65536:
                self.send_error(414, "request line longer than 65536 bytes")
            elif self.parse_request():
                self._dispatch()
        except TimeoutError:
            self._refuse(408, f"the request was not complete within {READ_SECONDS:g} s "
                         "(request line, headers and body)")  # fmt: skip
        except Stopping:
            self._refuse(503, STOPPING, RETRY)
        except OSError as e:  # the client left while sending: nobody to answer
            why = f"the client's connection was lost while it sent its request ({e})"
            self._log(CLIENT_GONE, time.perf_counter() - self.started, "", why)

    def _refuse(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        """An answer to a request that was never fully received."""
        self.request_version = "HTTP/1.0"
        body = json.dumps({"error": message, "field": None})
        with contextlib.suppress(OSError):
            self._send(status, body, headers or {})
        self._log(status, time.perf_counter() - self.started, body)

    def _dispatch(self) -> None:
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
            if status != CLIENT_GONE:
                self._send(status, body, headers)
                if self.unread:
                    self._discard(self.unread)
        except OSError as e:  # the client left; its answer has nowhere to go
            log(f"{self.command} {self.path}: could not send the answer ({e})")
        self._log(status, time.perf_counter() - self.started, body)

    def _route(self) -> tuple[int, str]:
        url = urllib.parse.urlsplit(self.path)
        method = ROUTES.get(url.path)
        if method is None:
            self.unread = self._announced()
            raise RequestError(404, f"no endpoint {url.path!r}; endpoints: "
                               + ", ".join(f"{m} {p}" for p, m in ROUTES.items()))  # fmt: skip
        # HEAD is GET without the body, as everywhere GET is served.
        methods = (method, "HEAD") if method == "GET" else (method,)
        if self.command not in methods:
            self.unread = self._announced()
            raise RequestError(405, f"{url.path} takes {method}, not {self.command}",
                               headers={"Allow": ", ".join(methods)})  # fmt: skip
        if url.query:
            self.unread = self._announced()
            raise RequestError(400, f"{url.path} takes no query string ({url.query!r}): "
                               "options go in the JSON body")  # fmt: skip
        if url.path in ("/v1/health", "/v1/schema"):
            # A body sent with it is not read: dropped after the answer, not left to reset it.
            self.unread = self._announced()
            if url.path == "/v1/health":
                return 200, json.dumps(self.service.health())
            return 200, json.dumps(self.service.schema_json())
        body = self._body()
        # The logged time is the server's: from the whole request received, not the upload.
        self.started = time.perf_counter()
        return self.service.estimate(body, self.connection)

    def _announced(self) -> int:
        """What to read and drop of a body the server does not read: its Content-Length; as
        much as the discard limits allow when its length is unknown (chunked, or a length that
        is not one byte count: the client sends a body all the same); 0 when none was
        announced."""
        if self.headers.get("Transfer-Encoding"):
            return DISCARD_BYTES
        lengths = self.headers.get_all("Content-Length") or []
        text = lengths[0].strip() if lengths else ""
        if len(lengths) == 1 and text.isascii() and text.isdigit():
            return int(text)
        return DISCARD_BYTES if lengths else 0

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding"):
            self.unread = self._announced()
            raise RequestError(411, "send the body with a Content-Length header, not "
                               f"Transfer-Encoding {self.headers['Transfer-Encoding']}",
                               "Content-Length")  # fmt: skip
        lengths = self.headers.get_all("Content-Length") or []
        if not lengths:
            raise RequestError(411, "POST /v1/estimate needs a Content-Length header",
                               "Content-Length")  # fmt: skip
        text = lengths[0].strip()
        if len(lengths) > 1 or not text.isascii() or not text.isdigit():
            self.unread = self._announced()
            raise RequestError(400, f"Content-Length {', '.join(lengths)!a} is not one byte "
                               "count", "Content-Length")  # fmt: skip
        n = int(text)
        if n > MAX_BODY:
            self.unread = n
            raise RequestError(413, f"request body of {n} bytes is over the limit of "
                               f"{MAX_BODY} bytes", "Content-Length")  # fmt: skip
        try:
            data = self.rfile.read(n)
        except TimeoutError:
            why = f"the request was not complete within {READ_SECONDS:g} s: Content-Length said {n}"
            raise RequestError(408, f"{why} bytes", "Content-Length") from None
        except Stopping:
            raise RequestError(503, STOPPING, headers=RETRY) from None
        except OSError as e:  # reset while sending: logged as a client that left, not a 500
            raise RequestError(CLIENT_GONE, f"the client's connection was lost while it sent "
                               f"its request body ({e})") from None  # fmt: skip
        if len(data) < n:
            raise RequestError(400, f"request body ended after {len(data)} of the {n} bytes its "
                               "Content-Length announced", "Content-Length")  # fmt: skip
        return data

    def _discard(self, n: int) -> None:
        """Read and drop what the client still sends of a body the server did not read (up to
        DISCARD_BYTES and DISCARD_SECONDS): a connection closed with unread bytes is reset, and
        a client still sending its body then gets a broken pipe instead of the answer."""
        sock, left = self.connection, min(n, DISCARD_BYTES)
        end = time.monotonic() + DISCARD_SECONDS
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_WR)  # the answer is complete: the client may read it
            while left > 0 and (wait := end - time.monotonic()) > 0:
                sock.settimeout(wait)
                chunk = sock.recv(min(left, 1 << 16))
                if not chunk:
                    break
                left -= len(chunk)

    def _send(self, status: int, body: str, headers: dict[str, str]) -> None:
        data = body.encode() if body.endswith("\n") else (body + "\n").encode()
        self.connection.settimeout(WRITE_SECONDS)
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Connection", "close")
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _log(self, status: int, seconds: float, body: str, why: str = "") -> None:
        if status >= 400 and not why:
            with contextlib.suppress(ValueError, TypeError, KeyError):
                why = json.loads(body)["error"][:160]
        # A request line http.server could not parse leaves no method or path behind.
        path = urllib.parse.urlsplit(self.path or "").path or "-"
        log(f"{self.command or '-'} {path} {status} {seconds:.3f} s" + (f" ({why})" if why else ""))

    def parse_request(self) -> bool:
        """http.server's, less HTTP/0.9: a request line without a version (`GET /v1/health`)
        was served as HTTP/0.9, a bare body with no status line or Content-Type. Refused before
        its headers are read, as a 505 in JSON (`send_error` answers as HTTP/1.0)."""
        words = str(self.raw_requestline, "iso-8859-1").split()
        if not words:  # http.server leaves a blank request line without an answer
            self.send_error(400, "empty request line")
            return False
        if len(words) != 2:
            return super().parse_request()
        self.command, self.path = words
        self.send_error(505, "a request line without an HTTP version (HTTP/0.9) is not served: "
                        "send HTTP/1.0 or HTTP/1.1")  # fmt: skip
        return False

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """What http.server answers itself (a malformed request line, headers too long): JSON
        too."""
        self.close_connection = True
        # A request line too broken to name its version is answered as HTTP/1.0, with a status
        # line and headers, not as the bare body of HTTP/0.9.
        self.request_version = "HTTP/1.0"
        text = message or self.responses.get(code, ("error",))[0]
        body = json.dumps({"error": text, "field": None})
        with contextlib.suppress(OSError):
            self._send(code, body, {})
        self._log(code, time.perf_counter() - self.started, body)

    def log_request(self, code: Any = "-", size: Any = "-") -> None:
        pass  # `_log` writes one line per request, with its time

    def log_message(self, format: str, *args: Any) -> None:
        log(format % args)


class Bounded(http.server.ThreadingHTTPServer):
    """A thread per connection, at most `max_connections` at once: one more is answered 503 by
    the accepting thread, without reading its request."""

    daemon_threads = True
    max_connections = SPARE_CONNECTIONS

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.open = 0
        self.open_lock = threading.Lock()
        super().__init__(*args, **kwargs)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self.open_lock:
            full = self.open >= self.max_connections
            if not full:
                self.open += 1
        if full:
            self._turn_away(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            with self.open_lock:
                self.open -= 1
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self.open_lock:
                self.open -= 1

    def _turn_away(self, request: socket.socket) -> None:
        why = (f"busy: {self.max_connections} connections already open, this server's limit; "
               "retry shortly")  # fmt: skip
        body = (json.dumps({"error": why, "field": None}) + "\n").encode()
        head = ("HTTP/1.0 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\nRetry-After: 1\r\n"
                "Connection: close\r\n\r\n")  # fmt: skip
        # Never blocks the accepting thread: the answer fits an empty socket buffer, and what
        # the client already sent is read so that closing does not reset the connection.
        request.setblocking(False)
        with contextlib.suppress(OSError):
            request.sendall(head.encode() + body)
        left = TURN_AWAY_BYTES
        with contextlib.suppress(OSError):
            while left > 0 and (chunk := request.recv(min(left, 1 << 16))):
                left -= len(chunk)
        log(f"- - 503 0.000 s ({why})")
        self.shutdown_request(request)
