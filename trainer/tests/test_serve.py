"""`serve`: a real server in a child process, real HTTP over its Unix socket and over 127.0.0.1.

Most tests use stand-in memsim/memest (scripts that answer `memsim profile` and hash the traces and
features memest is given into the answer), so they check the server and not the Rust tools: the
same hash from the server and from the CLI means the same traces and features. One test repeats
the comparison with the release binaries."""

from __future__ import annotations

import http.client
import json
import multiprocessing
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, cli

from memtrace_trainer import serve_worker
from memtrace_trainer.profile import _read

TESTS = Path(__file__).resolve().parent
MLP = 'synthetic:{"family":"mlp","input_size":256,"output_size":10,"depth":3}'
RELEASE = REPO / "target" / "release"
TIMEOUT = 8  # the servers' --timeout: well above an MLP estimate, short for the slow step

MEMSIM = """
import json, sys
if sys.argv[1:2] != ["profile"]:
    sys.exit("memsim: error: this stand-in answers only `memsim profile`")
print(json.dumps({"name": "a100-40gb", "path": PROFILE,
    "gpu": {"name": "NVIDIA A100-SXM4-40GB", "total_memory": 42505273344,
            "compute_capability": [8, 0], "sm_count": 108},
    "derived": {"cublas_workspace_bytes": 8519680, "cublaslt_workspace_bytes": 1048576,
                "cudnn_workspace_factor": 2.0},
    "outside_allocator": {"context_mib": 400.0, "cublas_mib": 1029.0, "cudnn_mib": 312.0},
    "provenance": {"unmeasured": []}}))
"""
# Schema 2 with every input hashed into `digest`; does not fit when given --capacity.
MEMEST = """
import hashlib, json, sys
args, h = sys.argv[1:], hashlib.sha256()
WORDS = {"headline": "needs 2.0 MiB on GPU (point 2.0)", "verdict": "FITS", "details": [],
         "baselines": []}
if args[:1] == ["render"]:
    print(json.dumps(WORDS))
    sys.exit(0)
for flag in ("--trace", "--features", "--fake-trace"):
    if flag in args:
        h.update(open(args[args.index(flag) + 1], "rb").read())
fits = not any(a.startswith("--capacity") for a in args)
print(json.dumps({"schema": 3, "headline": "symbolic", "digest": h.hexdigest(),
    "verdict": {"basis": "estimates.symbolic.safe_mib", "point_mib": 2.0, "need_mib": 2.0,
                "capacity_mib": 40536.0 if fits else 1.0, "capacity_source": "profile",
                "fits": fits},
    "estimates": {"symbolic": {"device_mib": 2.0, "reserved_mib": 1.0},
                  "horus": {"device_mib": 1.5}},
    "warnings": [], "text": WORDS}))
sys.exit(0 if fits else 1)
"""
# Steps that misbehave: one never ends (it says where it runs and makes a temporary file
# first), one raises, one kills its own process, one exits (sys.exit).
SLOW_STEP = """
import os, signal, subprocess, tempfile, time
from pathlib import Path

def make(device):
    fd, path = tempfile.mkstemp()
    child = subprocess.Popen(["sleep", "600"])  # as a DataLoader's worker would be
    Path(os.environ["SLOW_STEP_MARK"]).write_text(f"{os.getpid()} {path} {child.pid}")
    time.sleep(600)

def fail(device):
    raise ValueError("boom")

def die(device):
    os.kill(os.getpid(), signal.SIGKILL)

def quit(device):
    raise SystemExit(3)

def exit3(device):
    os._exit(3)

def linger(device):  # a step that leaves a thread running: its process does not exit
    import threading
    from step_examples import custom_optimizer
    threading.Thread(target=time.sleep, args=(60,)).start()
    return custom_optimizer(device)
"""


class UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: Path) -> None:
        super().__init__("localhost", timeout=120)
        self.path = str(path)

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.path)


class Server:
    """`python -m memtrace_trainer serve ARGS` in a child process, its stderr collected."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.args, self.env, self.lines = args, env, []
        self.proc = subprocess.Popen([sys.executable, "-m", "memtrace_trainer", "serve", *args],
                                     env=env, cwd=REPO, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True)  # fmt: skip
        threading.Thread(target=self._read, daemon=True).start()
        self.socket = Path(args[args.index("--socket") + 1]) if "--socket" in args else None
        self.port = 0
        end = time.monotonic() + 180
        while not any("listening on" in line for line in self.lines):
            if self.proc.poll() is not None or time.monotonic() > end:
                self.proc.kill()
                pytest.fail("serve did not start:\n" + self.log())
            time.sleep(0.1)
        if self.socket is None:
            line = next(line for line in self.lines if "listening on" in line)
            self.port = int(line.split("http://127.0.0.1:")[1].split()[0])

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))

    def log(self) -> str:
        return "\n".join(self.lines)

    def request(self, method: str, path: str, body: Any = None,
                headers: dict[str, str] | None = None) -> tuple[int, Any, dict[str, str]]:  # fmt: skip
        conn: http.client.HTTPConnection = (
            UnixConnection(self.socket) if self.socket
            else http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        )  # fmt: skip
        data = body if isinstance(body, bytes | None) else json.dumps(body).encode()
        conn.request(method, path, body=data, headers=headers or {})
        resp = conn.getresponse()
        text = resp.read().decode()
        conn.close()
        assert resp.getheader("Content-Type") == "application/json", text
        return resp.status, json.loads(text), dict(resp.getheaders())

    def estimate(self, body: Any) -> tuple[int, Any]:
        status, answer, _ = self.request("POST", "/v1/estimate", body)
        return status, answer

    def raw(self, data: bytes) -> bytes:
        """Bytes sent as they are, half-closed, and all that comes back."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(60)
            s.connect(str(self.socket))
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
            out = b""
            while chunk := s.recv(65536):
                out += chunk
        return out

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            pytest.fail("serve did not stop within 30 s:\n" + self.log())


def stand_ins(d: Path) -> Path:
    bin_dir = d / "bin"
    bin_dir.mkdir()
    profile = str(REPO / "profiles" / "a100-40gb.toml")
    for name, text in (("memsim", MEMSIM.replace("PROFILE", repr(profile))), ("memest", MEMEST)):
        path = bin_dir / name
        path.write_text(f"#!{sys.executable}\n{text}")
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return bin_dir


def server_env(d: Path, bin_dir: Path) -> dict[str, str]:
    (d / "slow_step.py").write_text(SLOW_STEP)
    env = {k: v for k, v in os.environ.items() if k != "MEMTRACE_ML_MODEL"}
    return env | {"MEMTRACE_BIN_DIR": str(bin_dir), "SLOW_STEP_MARK": str(d / "mark"),
                  "PYTHONPATH": os.pathsep.join([str(d), str(TESTS)])}  # fmt: skip


@pytest.fixture(scope="module")
def tools(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return stand_ins(tmp_path_factory.mktemp("tools"))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, tools: Path) -> Iterator[Server]:
    d = tmp_path_factory.mktemp("unix")
    srv = Server(["--socket", str(d / "serve.sock"), "--max-concurrency", "1", "--timeout",
                  str(TIMEOUT), "--allow-step", "slow_step:make", "--allow-step",
                  "step_examples:custom_optimizer", "--allow-step", "slow_step:fail",
                  "--allow-step", "slow_step:die", "--allow-step", "slow_step:quit",
                  "--allow-step", "slow_step:exit3", "--allow-step", "slow_step:linger"],
                 server_env(d, tools))  # fmt: skip
    yield srv
    srv.stop()


def cli_json(monkeypatch: pytest.MonkeyPatch, bin_dir: Path, *args: str) -> dict[str, Any]:
    """`estimate ARGS --json` in this process, with the server's tools and no cached profile."""
    monkeypatch.setenv("MEMTRACE_BIN_DIR", str(bin_dir))
    monkeypatch.delenv("MEMTRACE_ML_MODEL", raising=False)
    _read.cache_clear()
    try:
        done = cli("estimate", *args, "--json", check=False)
    finally:
        _read.cache_clear()
    assert done.returncode in (0, 1), done.stderr
    return json.loads(done.stdout)


def gone(pid: int) -> bool:
    """The process has exited (a zombie not yet reaped by its parent counts)."""
    try:
        return "zombie" in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True


def same_answer(served: dict[str, Any], local: dict[str, Any]) -> None:
    """Everything but the timings."""
    assert served.keys() == local.keys()
    for key in served.keys() - {"seconds"}:
        assert served[key] == local[key], key
    assert served["seconds"].keys() == local["seconds"].keys()


def test_answers_what_the_cli_prints(
    server: Server, tools: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    status, served = server.estimate({"model": MLP, "batch_size": 32, "optimizer": "adamw",
                                      "profile": "a100-40gb", "json": True})  # fmt: skip
    assert status == 200, served
    local = cli_json(monkeypatch, tools, "--model", MLP, "--batch-size", "32", "--optimizer",
                     "adamw", "--profile", "a100-40gb")  # fmt: skip
    same_answer(served, local)
    assert served["inputs"]["optimizer"] == "adamw" and len(served["digest"]) == 64
    # "Does not fit" is an answer (the CLI's exit status 1), not an error.
    status, served = server.estimate({"model": MLP, "batch_size": 8, "capacity": "1GiB"})
    assert status == 200 and served["verdict"]["fits"] is False
    same_answer(served, cli_json(monkeypatch, tools, "--model", MLP, "--batch-size", "8",
                                 "--capacity", "1GiB"))  # fmt: skip
    # An allowed step function runs, with the same answer as the CLI's --step.
    spec = "step_examples:custom_optimizer"
    status, served = server.estimate({"step": spec, "steps": 2})
    assert status == 200, served
    same_answer(served, cli_json(monkeypatch, tools, "--step", spec, "--steps", "2"))


def test_health_and_schema(server: Server) -> None:
    status, health, _ = server.request("GET", "/v1/health")
    assert status == 200 and health["status"] == "ok" and health["max_concurrency"] == 1
    assert health["allowed"]["step"][:2] == ["slow_step:make", "step_examples:custom_optimizer"]
    assert health["allowed"]["entry"] == [] and health["timeout_seconds"] == TIMEOUT
    status, schema, _ = server.request("GET", "/v1/schema")
    fields = schema["fields"]
    assert status == 200 and fields["batch_size"]["type"] == "integer"
    assert fields["steps"]["aliases"] == ["iterations"] and fields["point"]["type"] == "boolean"
    assert fields["amp"]["choices"] == ["bf16", "fp16"] and "refused" in fields["report"]
    assert fields["script_args"]["type"] == "array"
    # A flag's default is the flag's: --no-kbit-prepare is off unless given (a flag that is off
    # has no default listed, as `point`); before, it said its destination's True.
    assert "default" not in fields["no_kbit_prepare"] and "default" not in fields["point"]


@pytest.mark.parametrize(
    ("body", "status", "field", "says"),
    [
        (b"{not json", 400, None, "not JSON"),
        (b"\xff\xfe", 400, None, "not UTF-8"),
        (b"[1, 2]", 400, None, "JSON object"),
        (b'{"model": "x", "model": "y"}', 400, "model", "given twice"),
        (b'{"model": "x", "lora_dropout": NaN}', 400, None, "not JSON"),
        ({"model": MLP, "batch": 32}, 400, "batch", "did you mean 'batch_size'"),
        ({"model": MLP, "batch_size": "32"}, 400, "batch_size", "must be an integer"),
        ({"model": MLP, "batch_size": True}, 400, "batch_size", "must be an integer"),
        ({"model": MLP, "batch_size": 4, "point": "yes"}, 400, "point", "true or false"),
        ({"model": MLP, "batch_size": 4, "capacity": 40}, 400, "capacity", 'command line ("40")'),
        ({"model": MLP, "batch_size": 4, "lora": 1.5}, 400, "lora", "an integer or a string"),
        ({"model": MLP, "batch_size": 4, "amp": "fp8"}, 400, "amp", "invalid choice"),
        ({"model": MLP, "step": "slow_step:make"}, 400, "step", "not allowed with"),
        ({"model": MLP, "steps": 2, "iterations": 3}, 400, "iterations", "same option"),
        # The key the request used, not the option's name (it said `steps`).
        ({"model": MLP, "batch_size": 4, "iterations": 99999999999}, 400, "iterations", "most"),
        ({"model": MLP}, 400, "batch_size", "--batch-size is required"),
        ({"batch_size": 4}, 400, "model", "one of the arguments"),
        ({"model": "nosuch:thing", "batch_size": 4}, 400, "model", ""),
        ({"model": MLP, "batch_size": 4, "report": "/tmp/r.html"}, 400, "report", "writes"),
        ({"model": MLP, "batch_size": 4, "json": False}, 400, "json", "JSON only"),
        ({"model": MLP, "batch_size": 4, "qlora": True}, 400, "qlora", "--qlora: synthetic"),
        ({"model": "synthetic:{}", "batch_size": 2}, 400, "model", "config field 'family'"),
        ({"model": "dlrm:bad", "batch_size": 2}, 400, "model", "unknown DLRM size 'bad'"),
        ({"model": MLP, "batch_size": 4, "optimizer": ""}, 400, "optimizer", "--optimizer ''"),
        ({"model": MLP, "batch_size": 4, "profile": ""}, 400, "profile", "--profile ''"),
        # Read by memsim as its own flags: a list answered (field json), a clap error (null).
        ({"model": MLP, "batch_size": 4, "profile": "--list"}, 400, "profile", "not a flag"),
        ({"model": MLP, "batch_size": 4, "profile": "--step=x"}, 400, "profile", "not a flag"),
        # The overflow's message quotes PyTorch; the field is the size past 2**31.
        (
            {
                "model": "torchvision:resnet18",
                "batch_size": 1,
                "input_shape": "3,99999999999,99999999999",
            },
            400,
            "input_shape",
            "overflows",
        ),
        # No command line carries a NUL or a lone surrogate: each was a 500 (subprocess's argv,
        # os.stat), with no field.
        ({"model": MLP, "batch_size": 4, "profile": "a\0b"}, 400, "profile", "a NUL byte"),
        ({"model": MLP, "batch_size": 4, "profile": "\ud800"}, 400, "profile", "\\ud800"),
        ({"model": MLP, "batch_size": 4, "capacity": "1\0"}, 400, "capacity", "a NUL byte"),
        ({"model": MLP, "batch_size": 4, "capacity": "\udfff"}, 400, "capacity", "surrogate"),
        ({"model": "hf-config:/tmp/a\0b", "batch_size": 4}, 400, "model", "NUL"),
        ({"model": "hf-config:/tmp/\ud800", "batch_size": 4}, 400, "model", "surrogate"),
        ({"model": MLP, "script_args": ["a", "b\0"]}, 400, "script_args", "element 1"),
        # Arguments without --script: two were quoted together and the error named `script`.
        ({"model": MLP, "script_args": ["a", "b"]}, 400, "script_args", "arguments 'a b'"),
        # Valid JSON, past the digits Python reads: the field, not "not JSON".
        (b'{"model": "x", "batch_size": 1' + b"0" * 4400 + b"}", 400, "batch_size", "(4401 "),
        (b'{"script_args": [-1' + b"0" * 5000 + b"]}", 400, "script_args", "out of range"),
        # Too large to be finite: read as -inf, it went on as --lora-dropout=-inf.
        (
            b'{"model": "x", "batch_size": 2, "lora_dropout": -1e999}',
            400,
            "lora_dropout",
            "the number -1e999 is out of range",
        ),
        # The type first: a string is not the array script_args takes, whatever it holds.
        ({"model": MLP, "script_args": "a\0"}, 400, "script_args", "must be an array"),
        # Past the JSON parser's depth: a RecursionError, once answered 500 as an internal error.
        (b"[" * 100_000 + b"]" * 100_000, 400, None, "deeper than the JSON parser allows"),
        ({"step": "os:getcwd"}, 403, "step", "not allowed by this server"),
        ({"entry": "entry_example:build", "batch_size": 2}, 403, "entry", "allowed: none"),
        ({"script": str(TESTS / "scripts" / "x.py")}, 403, "script", "--allow-script"),
    ],
)
def test_bad_requests_name_the_field(
    server: Server, body: Any, status: int, field: str | None, says: str
) -> None:
    got, answer = server.estimate(body)
    assert (got, answer.get("field")) == (status, field), answer
    assert says in answer["error"]


@pytest.mark.parametrize(
    ("message", "argv", "field"),
    [
        ("invalid profile /etc/passwd: TOML parse error", ["--profile=/etc/passwd"], "profile"),
        ('profile "h100" not found: looked for ...', ["--profile=h100"], "profile"),
        ("unknown model spec 'x:y': expected ...", ["--model=x:y"], "model"),
        ("--qlora: not a Hugging Face model", ["--model=m", "--qlora"], "qlora"),
        # A bare number could be any count in the message: never taken for the field.
        ("expected at most 8 ranks", ["--batch-size=8"], None),
        ("/etc/passwd.bak is not readable", ["--profile=/etc/passwd"], None),
        # A quoted value that looks like a flag, and script arguments without a --script.
        ("unknown model spec '--step=x:y': expected ...", ["--model=--step=x:y"], "model"),
        (
            "unexpected arguments 'a': only --script takes arguments (after `--`)",
            ["--model=m", "--json", "--", "a"],
            "script_args",
        ),
        (
            "unexpected arguments 'a --model=b': only --script takes arguments (after `--`)",
            ["--model=m", "--json", "--", "a", "--model=b"],
            "script_args",
        ),
    ],
)
def test_an_error_names_the_field_whose_value_it_quotes(
    message: str, argv: list[str], field: str | None
) -> None:
    """The stand-in tools of the server above accept any profile, so the profile error of the
    real memsim is checked here, on its message."""
    from memtrace_trainer.serve_schema import Schema, estimate_parser

    assert Schema(estimate_parser()).field_in(message, argv) == field


def test_an_allowed_script_runs_as_allowed_not_as_spelled(tmp_path: Path) -> None:
    """The request's path was checked resolved but run as spelled: a link the requester controls
    could be re-pointed between the check and the run. What runs is the path allowed."""
    from memtrace_trainer.serve_schema import Policy, RequestError, Schema, estimate_parser

    script = tmp_path / "train.py"
    script.write_text("pass\n")
    link = tmp_path / "link.py"
    link.symlink_to(script)
    policy = Policy(scripts=(script.resolve(),))
    argv = Schema(estimate_parser()).argv(json.dumps({"script": str(link)}).encode(), policy)
    assert f"--script={script.resolve()}" in argv and str(link) not in " ".join(argv), argv
    link.unlink()
    link.symlink_to(tmp_path / "other.py")
    with pytest.raises(RequestError) as e:
        Schema(estimate_parser()).argv(json.dumps({"script": str(link)}).encode(), policy)
    assert e.value.status == 403


def test_a_failing_step_is_an_answer_not_a_crash(server: Server) -> None:
    status, answer = server.estimate({"step": "slow_step:fail"})
    assert (status, answer["field"]) == (400, "step"), answer
    assert "raised ValueError: boom" in answer["error"]
    assert "slow_step.py" in answer["error"]  # the user's frames, as the CLI prints them
    # sys.exit in the user's code is theirs too, not an internal error.
    status, answer = server.estimate({"step": "slow_step:quit"})
    assert (status, answer["field"]) == (400, "step"), answer
    assert "SystemExit: 3" in answer["error"] and "slow_step.py" in answer["error"]
    # A step that ends its own process is the request's too (it was a 500 with no field).
    for step, died in (("die", "killed by signal 9"), ("exit3", "exit status 3")):
        status, answer = server.estimate({"step": f"slow_step:{step}"})
        assert (status, answer["field"]) == (400, "step"), answer
        assert f"died without an answer ({died})" in answer["error"]
    assert server.estimate({"model": MLP, "batch_size": 4})[0] == 200


def test_a_failing_render_is_an_internal_error(
    tmp_path: Path, tools: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """memest words the server's own JSON: when that fails it is the server's fault (500), not
    the request's (400)."""
    from memtrace_trainer.serve_worker import answer

    bin_dir = tmp_path / "bin"
    shutil.copytree(tools, bin_dir)
    broken = (
        (bin_dir / "memest")
        .read_text()
        .replace(
            'if args[:1] == ["render"]:',
            'if args[:1] == ["render"]:\n    sys.exit("memest: error: x")',
        )
    )
    (bin_dir / "memest").write_text(broken)
    monkeypatch.setenv("MEMTRACE_BIN_DIR", str(bin_dir))
    status, body = answer(["--model", MLP, "--batch-size", "2", "--steps", "1"])
    assert status == 500 and "memest render failed" in json.loads(body)["error"], body


def test_bad_http_is_answered_in_json(server: Server) -> None:
    status, answer, headers = server.request("GET", "/v1/estimate")
    assert status == 405 and headers["Allow"] == "POST" and "takes POST" in answer["error"]
    status, answer, _ = server.request("GET", "/v2/nothing")
    assert status == 404 and "/v1/estimate" in answer["error"]
    status, answer, _ = server.request("GET", "/v1/health?verbose=1")
    assert status == 400 and "query" in answer["error"]
    no_length = b"POST /v1/estimate HTTP/1.1\r\nHost: x\r\n\r\n"
    assert b" 411 " in server.raw(no_length).split(b"\r\n")[0]
    short = b'POST /v1/estimate HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"model"'
    reply = server.raw(short)
    assert b" 400 " in reply.split(b"\r\n")[0] and b"ended after 8 of the 100 bytes" in reply
    bad_length = b"POST /v1/estimate HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n"
    reply = server.raw(bad_length)
    assert b" 400 " in reply.split(b"\r\n")[0] and b"not one byte count" in reply
    garbage = server.raw(b"HELLO\r\n\r\n")
    assert b" 400 " in garbage.split(b"\r\n")[0] and b'"error"' in garbage
    # No version on the request line: HTTP/0.9, answered with a bare body before.
    head, _, body = server.raw(b"GET /v1/health\r\n\r\n").partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 505 ") and b"Content-Type: application/json" in head, head
    assert "HTTP/0.9" in json.loads(body)["error"]
    # Still serving, and every request logged on one line: method, path, status, seconds.
    assert server.request("GET", "/v1/health")[0] == 200
    assert any(line.startswith("serve: GET /v2/nothing 404 ") for line in server.lines)


def test_time_limit_and_concurrency_bound(server: Server, tools: Path) -> None:
    mark = Path(server.env["SLOW_STEP_MARK"])
    mark.unlink(missing_ok=True)
    slow: dict[str, Any] = {}
    thread = threading.Thread(
        target=lambda: slow.update(zip(("status", "answer"),
                                       server.estimate({"step": "slow_step:make"}), strict=True))
    )  # fmt: skip
    start = time.monotonic()
    thread.start()
    while server.request("GET", "/v1/health")[1]["in_flight"] == 0:
        time.sleep(0.05)
    # Over --max-concurrency 1: refused at once.
    status, answer, headers = server.request("POST", "/v1/estimate",
                                             {"model": MLP, "batch_size": 4})  # fmt: skip
    assert status == 503 and "busy" in answer["error"] and headers["Retry-After"] == "1"
    thread.join(60)
    assert slow["status"] == 504 and f"time limit of {TIMEOUT} s" in slow["answer"]["error"], slow
    assert TIMEOUT <= time.monotonic() - start < TIMEOUT + 30
    # The worker is gone, and with it its temporary directory and what it started.
    pid, tmp, child = mark.read_text().split()
    assert gone(int(pid)) and not Path(tmp).exists() and not Path(tmp).parent.exists()
    deadline = time.monotonic() + 5  # SIGKILL is delivered, not waited for
    while not gone(int(child)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gone(int(child)), "the worker's own child outlived its request"
    # The server goes on.
    status, answer = server.estimate({"model": MLP, "batch_size": 4})
    assert status == 200 and answer["verdict"]["fits"] is True


def test_sigterm_aborts_in_flight_estimates_and_removes_the_socket(
    tmp_path: Path, tools: Path
) -> None:
    srv = Server(["--socket", str(tmp_path / "s.sock"), "--allow-step", "slow_step:make"],
                 server_env(tmp_path, tools))  # fmt: skip
    slow: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: slow.update(
        answer=srv.estimate({"step": "slow_step:make"})))  # fmt: skip
    thread.start()
    while srv.request("GET", "/v1/health")[1]["in_flight"] == 0:
        time.sleep(0.05)
    assert srv.stop(signal.SIGTERM) == 0, srv.log()
    thread.join(30)
    assert slow["answer"][0] == 503 and "shutting down" in slow["answer"][1]["error"]
    assert not (tmp_path / "s.sock").exists()
    assert srv.lines[-1] == "serve: stopped", srv.log()


def test_a_worker_whose_server_stopped_waiting_exits_quietly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    # `work` points the temporary directory at the request's own: put it back afterwards.
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    recv, send = multiprocessing.Pipe(duplex=False)
    recv.close()  # the server stopped waiting
    serve_worker.work(["--no-such-flag"], str(tmp_path), send)
    assert send.closed
    assert "Traceback" not in capfd.readouterr().err


def test_tcp_on_loopback_and_sigint(tmp_path: Path, tools: Path) -> None:
    srv = Server(["--port", "0", "--timeout", str(TIMEOUT)], server_env(tmp_path, tools))
    try:
        status, health, _ = srv.request("GET", "/v1/health")
        assert status == 200 and health["listen"] == f"http://127.0.0.1:{srv.port}"
        status, answer = srv.estimate({"model": MLP, "batch_size": 4, "seq_len": 16})
        assert status == 200 and "--seq-len 16 has no effect" in " ".join(answer["warnings"])
        assert srv.estimate({"step": "slow_step:make"})[0] == 403
    finally:
        assert srv.stop(signal.SIGINT) == 0, srv.log()


@pytest.mark.parametrize("host", ["0.0.0.0", "10.1.2.3", "example.com"])
def test_refuses_to_listen_beyond_this_machine(host: str) -> None:
    done = subprocess.run([sys.executable, "-m", "memtrace_trainer", "serve", "--port", "0",
                           "--host", host], capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 2 and "loopback" in done.stderr, done.stderr


def test_start_up_errors(tmp_path: Path) -> None:
    def check(args: list[str], says: str) -> None:
        done = subprocess.run([sys.executable, "-m", "memtrace_trainer", "serve", *args],
                              capture_output=True, text=True, timeout=60)  # fmt: skip
        assert done.returncode == 2 and says in done.stderr, done.stderr

    plain = tmp_path / "not-a-socket"
    plain.write_text("keep me")
    check(["--socket", str(plain)], "is not a socket")
    assert plain.read_text() == "keep me"
    check(["--socket", str(tmp_path / "s"), "--allow-step", "nomodule_xyz:make"], "no module")
    check(["--socket", str(tmp_path / "s"), "--allow-entry", "justaname"], "package.module:")
    check(["--socket", str(tmp_path / "s"), "--allow-script", "nofile.py"], "no such file")
    check(["--socket", str(tmp_path / "s"), "--max-concurrency", "0"], "--max-concurrency")
    check(["--socket", str(tmp_path / "s"), "--timeout", "0"], "--timeout")
    # Past Connection.poll's limit every estimate was a 500, and /v1/health said `Infinity`.
    for past in ("inf", "nan", "3e9"):
        check(["--socket", str(tmp_path / "s"), "--timeout", past], "at most 2000000")


def test_same_numbers_with_the_release_binaries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("memsim", "memest"):
        if not (RELEASE / name).is_file():
            pytest.fail(f"{RELEASE / name} missing: run `cargo build --release` in {REPO} first")
    srv = Server(["--socket", str(tmp_path / "s.sock")], server_env(tmp_path, RELEASE))
    try:
        status, served = srv.estimate({"model": MLP, "batch_size": 32})
        assert status == 200, served
    finally:
        assert srv.stop() == 0
    local = cli_json(monkeypatch, RELEASE, "--model", MLP, "--batch-size", "32")
    same_answer(served, local)
    assert served["estimates"]["symbolic"]["device_mib"] > 0
