"""`estimate` (through memest) and `max-batch` (through memsim): the contract with a scripted
memest, then the real binaries, checked against independent computations."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, cli

MLP = 'synthetic:{"family":"mlp","input_size":256,"output_size":10,"depth":3}'
MIB = 1 << 20
RELEASE = REPO / "target" / "release"

# The documented `memest estimate --json` output (estimators/README.md, `memest estimate -h`).
CANNED = {
    "schema": 3,
    "headline": "symbolic",
    "verdict": {
        "basis": "estimates.symbolic.safe_mib",
        "point_mib": 1000.5,
        "need_mib": 1000.5,
        "capacity_mib": 40536.0,
        "capacity_source": "profile",
        "fits": True,
    },
    "outside_allocator": {
        "context_mib": 400.0,
        "cublas_mib": 1.5,
        "cudnn_mib": 0.0,
        "total_mib": 401.5,
        "unmeasured": [],
        "libraries": {"gemm": True, "conv": False, "source": "trace"},
    },
    "warnings": [],
    "margin": {"fraction": 0.0, "note": "no margin"},
    "future_key": {"kept": True},
    "estimates": {
        "symbolic": {
            "device_mib": 1000.5,
            "reserved_mib": 600.0,
            "allocated_mib": 500.0,
            "level": "device",
            "role": "headline",
            "ignores": "little",
        },
        "analytic": {"device_mib": 900.0, "reserved_mib": 500.0, "level": "device"},
        "horus": {"device_mib": 12.25, "reserved_mib": None, "level": "device"},
        "live_peak": {"device_mib": 20.0, "reserved_mib": None, "level": "live"},
        "fake_tensor": {"device_mib": 10.0, "reserved_mib": None, "level": "live"},
        "ml": None,
    },
    "seconds": {"symbolic": 0.01, "horus": 0.0},
    "unavailable": {"ml": "no ML model given (--ml-model or $MEMTRACE_ML_MODEL)"},
    "profile": "profiles/a100-40gb.toml",
    "gpu_total_mib": 40536.0,
    "family": "MLP",
    "oom_predicted": False,
    "text": {
        "headline": "needs 1000.5 MiB on GPU (point)",
        "verdict": "FITS",
        "details": ["  memest's detail line"],
        "baselines": ["baselines (for comparison, not for decisions):", "  memest's baseline line"],
    },
}
# What the scripted `memest render` answers: words that are not the estimate's own, so a test
# sees which of the two the trainer printed.
RENDERED = {
    "headline": "needs 1000.5 MiB on GPU (point 1000.5)",
    "verdict": "FITS",
    "details": ["  rendered detail"],
    "baselines": ["baselines (for comparison, not for decisions):", "  rendered baseline"],
}


def scripted_memest(tmp_path: Path, output: Any, rc: int = 0) -> Path:
    """A memest that records its arguments and inputs, and prints `output`."""
    text = output if isinstance(output, str) else json.dumps(output)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "memest"
    script.write_text(
        f"#!{sys.executable}\n"
        "import json, sys\n"
        "args = sys.argv[1:]\n"
        "if args[0] == 'render':\n"
        f"    json.dump(json.load(open(args[1])), open({str(tmp_path / 'rendered.json')!r}, 'w'))\n"
        f"    sys.stdout.write({json.dumps(RENDERED)!r})\n"
        "    sys.exit(0)\n"
        "seen = {'args': args, 'features': json.load(open(args[args.index('--features') + 1])),\n"
        "        'trace': open(args[args.index('--trace') + 1]).readline(),\n"
        "        'fake': open(args[args.index('--fake-trace') + 1]).readline()}\n"
        f"json.dump(seen, open({str(tmp_path / 'seen.json')!r}, 'w'))\n"
        f"sys.stdout.write({text!r})\n"
        f"sys.stderr.write('boom' if {rc} else '')\n"
        f"sys.exit({rc})\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return bin_dir


def test_estimate_follows_the_memest_contract(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MEMTRACE_BIN_DIR", str(scripted_memest(tmp_path, CANNED)))
    monkeypatch.delenv("MEMTRACE_ML_MODEL", raising=False)
    out = json.loads(cli("estimate", "--model", MLP, "--batch-size", "32", "--optimizer",
                         "adamw", "--profile", "a100-40gb", "--json").stdout)  # fmt: skip
    assert out["estimates"]["symbolic"] == CANNED["estimates"]["symbolic"]
    # Every key memest emits passes through, including ones this trainer does not know.
    for key in ("schema", "verdict", "outside_allocator", "headline", "future_key"):
        assert out[key] == CANNED[key], key
    assert out["inputs"]["optimizer"] == "adamw" and out["inputs"]["iterations"] == 2
    assert set(out["estimates"]) >= {"symbolic", "fake_tensor", "horus", "analytic", "ml"}
    assert out["estimates"]["ml"] is None and "no ML model" in out["unavailable"]["ml"]
    assert out["binary"] == {"memest": str(tmp_path / "bin" / "memest"),
                             "source": "$MEMTRACE_BIN_DIR"}  # fmt: skip
    assert {"features", "trace_symbolic", "trace_fake_tensor", "memest",
            "memest.symbolic"} <= set(out["seconds"])  # fmt: skip
    seen = json.loads((tmp_path / "seen.json").read_text())
    args = seen["args"]
    assert args[0] == "estimate" and "--json" in args
    assert args[args.index("--profile") + 1] == str(REPO / "profiles" / "a100-40gb.toml")
    assert seen["features"]["batch_size"] == 32 and seen["features"]["total_parameters"] > 0
    # memest reads the layers in execution order from `sequence`.
    # The default pyramid halves the width: Linear(256, 128) comes first.
    assert seen["features"]["sequence"][0] == ["Linear", 128, 256 * 128 + 128]
    sym, plain = json.loads(seen["trace"]), json.loads(seen["fake"])
    assert sym["metadata"]["cuda_emulation"] == "true" and sym["metadata"]["optimizer"] == "adamw"
    assert plain["metadata"]["cuda_emulation"] == "false" and plain["metadata"]["iterations"] == "1"

    model = tmp_path / "m.json"
    model.write_text("{}")
    monkeypatch.setenv("MEMTRACE_ML_MODEL", str(model))
    text = cli("estimate", "--model", MLP, "--batch-size", "32").stdout
    assert "from $MEMTRACE_BIN_DIR" in text
    # memest words the estimate after the trainer's own baselines are in: `memest render` got
    # the composed JSON (MemTracker's reason included), and its words are what is printed,
    # with the job's lines between the details and the baselines.
    composed = json.loads((tmp_path / "rendered.json").read_text())
    assert "--memtracker" in composed["unavailable"]["memtracker"]
    lines = text.splitlines()
    assert lines[0] == "needs 1000.5 MiB on GPU (point 1000.5): FITS", text
    assert lines[1] == "  rendered detail" and lines[-2:] == RENDERED["baselines"], text
    assert f"  job: {MLP} at batch 32" in lines and "memest's detail line" not in text
    args = json.loads((tmp_path / "seen.json").read_text())["args"]
    assert args[args.index("--ml-model") + 1] == str(model)


@pytest.mark.parametrize(
    ("output", "rc", "msg"),
    [
        (CANNED, 3, "memest estimate failed (3): boom"),
        ("not json", 0, "output is not JSON"),
        ("[1, 2]", 0, "output has no `estimates` object"),
        ({"estimates": {"horus": {"device_mib": 1}}}, 0, "field schema is None: expected 3"),
        ({"schema": 3, "estimates": {"horus": {"device_mib": 1}}}, 0,
         "estimates.symbolic is missing"),
        ({"schema": 3,
          "estimates": {k: {"device_mib": "x"} for k in ("symbolic", "horus", "analytic")}}, 0,
         "estimates.symbolic.device_mib missing or not a number"),
        ({**CANNED, "verdict": {}}, 0, "field verdict.fits missing"),
        ({**CANNED, "text": {"headline": "needs"}}, 0, "field text: expected {headline,"),
    ],
)  # fmt: skip
def test_estimate_rejects_bad_memest_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, output: Any, rc: int, msg: str
) -> None:
    monkeypatch.setenv("MEMTRACE_BIN_DIR", str(scripted_memest(tmp_path, output, rc)))
    done = cli("estimate", "--model", MLP, "--batch-size", "4", check=False)
    assert done.returncode == 2 and msg in done.stderr, done.stderr


def test_missing_binary_says_how_to_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMTRACE_BIN_DIR", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr("memtrace_trainer.binaries.REPO_ROOT", tmp_path)
    done = cli("estimate", "--model", MLP, "--batch-size", "4", check=False)
    assert done.returncode == 2 and "no memest binary found" in done.stderr
    assert "cargo build --release" in done.stderr


def require(name: str) -> Path:
    path = RELEASE / name
    if not path.is_file():
        pytest.fail(f"{path} missing: run `cargo build --release` in {REPO} first")
    return path


def replay(trace: Path, capacity: str | None = None) -> dict[str, Any]:
    cmd = [str(require("memsim")), "replay", str(trace), "--json", "--profile", "a100-40gb"]
    cmd += ["--capacity", capacity] if capacity else []
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert done.returncode in (0, 1), done.stderr
    return json.loads(done.stdout)


def symtrace(tmp_path: Path, batch: int, *extra: str) -> Path:
    out = tmp_path / f"b{batch}{'-'.join(extra)}.jsonl"
    cli("symtrace", "--model", MLP, "--batch-size", str(batch), "--profile", "a100-40gb",
        *extra, "--out", str(out))  # fmt: skip
    return out


def test_estimate_with_the_real_memest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    require("memest")
    monkeypatch.delenv("MEMTRACE_BIN_DIR", raising=False)
    monkeypatch.delenv("MEMTRACE_ML_MODEL", raising=False)
    monkeypatch.setenv("PATH", os.defpath)
    out = json.loads(cli("estimate", "--model", MLP, "--batch-size", "32", "--json").stdout)
    assert out["binary"]["source"] == "target/release"
    est = out["estimates"]
    # symbolic reserved = memsim's replay of the same trace (traces are deterministic).
    assert est["symbolic"]["reserved_mib"] == pytest.approx(
        replay(symtrace(tmp_path, 32))["peak_reserved_bytes"] / MIB
    )
    assert est["symbolic"]["device_mib"] > est["symbolic"]["reserved_mib"]
    # horus = 4 (A B + P + B P) from the features.
    feats = json.loads(cli("features", "--model", MLP, "--batch-size", "32").stdout)
    a, p, b = feats["total_activations"], feats["total_parameters"], 32
    assert est["horus"]["device_mib"] == pytest.approx(4 * (a * b + p + b * p) / MIB)
    # fake_tensor = the FakeTensorMode measurement of the same step.
    ft = json.loads(cli("fake-tensor", "--model", MLP, "--batch-size", "32", "--json").stdout)
    assert est["fake_tensor"]["device_mib"] == pytest.approx(ft["peak_bytes"] / MIB)
    assert est["ml"] is None


def test_max_batch_is_the_boundary(tmp_path: Path) -> None:
    # The capacity is the device's total memory: the profile's memory outside the allocator
    # (context + cuBLAS for this MLP) comes off inside.
    capacity = "1500MiB"
    out = json.loads(cli("max-batch", "--model", MLP, "--profile", "a100-40gb", "--capacity",
                         capacity, "--json").stdout)  # fmt: skip
    best = out["max_batch"]
    assert best > 1 and out["capacity_bytes"] == 1500 * MIB
    assert out["capacity_source"] == "flag"
    fits = replay(symtrace(tmp_path, best), capacity)
    assert fits["verdict"]["fits"] is True
    assert fits["peak_reserved_bytes"] == out["peak_reserved_bytes"]
    # The verdict rests on the safe number (the point plus the profile's MLP margin).
    assert fits["peak_device_safe_bytes"] == out["need_bytes"] <= 1500 * MIB
    assert fits["peak_device_bytes"] == out["point_bytes"] < out["need_bytes"]
    assert replay(symtrace(tmp_path, best + 1), capacity)["verdict"]["fits"] is False
    probes = out["probes"]
    assert all(p["fits"] == (p["batch"] <= best) for p in probes)
    # Not even batch 1 fits: max_batch 0 and exit 1.
    none = cli("max-batch", "--model", MLP, "--profile", "a100-40gb", "--capacity", "1GiB",
               "--json", check=False)  # fmt: skip
    assert none.returncode == 1
    data = json.loads(none.stdout)
    assert data["max_batch"] == 0 and data["need_at_batch"] == 1
    # One byte below that need, need and capacity read alike in MiB: the line says them in bytes
    # ("needs 2149.0 MiB" beside "does not fit even at batch 1 on 2149.0 MiB").
    tight = [
        "max-batch",
        "--model",
        MLP,
        "--profile",
        "a100-40gb",
        "--capacity",
        f"{data['need_bytes'] - 1}B",
    ]
    answer = json.loads(cli(*tight, "--json", check=False).stdout)
    need, cap = answer["need_bytes"], answer["capacity_bytes"]
    assert answer["max_batch"] == 0 and 0 < need - cap < MIB / 20, answer
    text = cli(*tight, check=False)
    assert (
        text.returncode == 1 and f"needs {need} B" in text.stdout and f"on {cap} B" in text.stdout
    ), text.stdout
    assert f"needs {need} B of {cap} B: does not fit" in text.stderr, text.stderr
    bad = cli("max-batch", "--model", MLP, "--profile", "a100-40gb", "--capacity", "0.05",
              "--json", check=False)  # fmt: skip
    assert bad.returncode == 2 and "0.05" in bad.stderr


def test_estimate_report_into_a_missing_directory_is_a_clear_error(tmp_path: Path) -> None:
    require("memsim")
    out = tmp_path / "no" / "such" / "dir" / "r.html"
    done = cli("estimate", "--model", MLP, "--batch-size", "8", "--report", str(out), check=False)
    assert done.returncode == 2, done.stderr
    # Said before the trace: no tracing progress precedes it.
    assert f"--report {out}: the folder {out.parent} does not exist" in done.stderr
    assert "tracing" not in done.stderr.lower()
    assert not out.exists()
    # A folder, or a name that is not .html: said before the trace too (a folder failed after it).
    for bad, said in ((tmp_path, "a folder; expected a file name ending in .html"),
                      (tmp_path / "r.txt", "expected a file name ending in .html")):  # fmt: skip
        done = cli("estimate", "--model", MLP, "--batch-size", "8", "--report", str(bad),
                   check=False)  # fmt: skip
        assert done.returncode == 2 and f"--report {bad}: {said}" in done.stderr, done.stderr
        assert "tracing" not in done.stderr.lower()


def test_the_default_profile_is_one_name() -> None:
    # Rust's simulator::profile::DEFAULT_PROFILE (memest's default) and Python's must agree.
    from memtrace_trainer.profile import DEFAULT_PROFILE

    done = subprocess.run([str(require("memest")), "estimate", "--help"], capture_output=True,
                          text=True, check=True)  # fmt: skip
    assert f"[default: {DEFAULT_PROFILE}]" in done.stdout, done.stdout


def test_capacity_source_words_are_memsims(tmp_path: Path) -> None:
    # The Python renderers say where a capacity came from in memsim's words.
    from memtrace_trainer.profile import capacity_source_text

    trace = symtrace(tmp_path, 4)
    for flags, source in [([], "profile"), (["--capacity", "40GiB"], "flag")]:
        done = subprocess.run([str(require("memsim")), "replay", str(trace), "--profile",
                               "a100-40gb", *flags], capture_output=True, text=True, check=True)  # fmt: skip
        assert f"({capacity_source_text(source)};" in done.stdout, done.stdout


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        # Checked by memsim's size parser before any tracing (before, "-1GiB" reached memest as
        # two arguments after the whole trace, and its error named '-1').
        (["--capacity=-1GiB"], 'invalid size "-1GiB"'),
        (["--capacity", "0"], 'invalid capacity "0"'),
        (["--grad-accum", "0"], "--grad-accum 0: expected at least 1"),
        (["--strategy", "ddp"], "--world-size is required with --strategy"),
        # An empty name was the default, silently; a world past 2**31 an internal error.
        (["--optimizer="], "--optimizer '': expected one of adam"),
        (["--profile="], "--profile '': expected a GPU profile NAME"),
        # Passed to `memsim profile` as its own flags: a list answered, a clap error.
        (["--profile=--list"], "--profile '--list': expected a GPU profile NAME"),
        (["--profile=--step=os:system"], "--profile '--step=os:system': expected a GPU profile"),
        (["--strategy", "ddp", "--world-size", "1000000000000"], "expected at most 65536"),
    ],
)
def test_bad_flags_are_refused_with_their_names(flags: list[str], said: str) -> None:
    require("memsim")
    done = cli("estimate", "--model", MLP, "--batch-size", "8", *flags, check=False)
    assert done.returncode == 2, done.stderr
    assert said in done.stderr, done.stderr
    assert "internal error" not in done.stderr


def test_a_classifier_needs_a_class() -> None:
    done = cli("symtrace", "--model", "torchvision:resnet18", "--batch-size", "2",
               "--num-classes", "0", "--out", "/dev/null", check=False)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "--num-classes 0: expected a positive integer" in done.stderr


def test_the_batch_search_looks_past_a_need_that_is_not_monotone() -> None:
    # The allocator's packing moves with the shapes: batch 6 does not fit, 7 does again. Past
    # the first batch that does not fit, batches are probed while their floor (allocated peak in
    # place of the reserved) is within the capacity.
    from memtrace_trainer import maxbatch

    fits = {b: b < 6 or b in (7, 11) for b in range(1, 40)}
    asked: list[int] = []

    def search(floor_per_batch: int, limit: int = 100) -> tuple[int, int | None]:
        probes = {
            b: {"fits": fits[b], "need_floor_bytes": floor_per_batch * b, "capacity": 85}
            for b in range(1, 7)
        }
        asked.clear()

        def probe(b: int) -> bool:
            asked.append(b)
            probes[b] = {"fits": fits[b], "need_floor_bytes": floor_per_batch * b, "capacity": 85}
            return fits[b]

        return maxbatch._beyond_the_boundary(probe, probes, 6, limit, 5)

    assert search(10) == (7, None)
    assert asked == [7, 8, 9]  # 9's floor (90) passes 85: 11 cannot fit, and is not probed
    assert search(10, limit=6) == (5, None) and asked == []
    # When the probes run out first, the first batch left unprobed is returned, to be warned of.
    best, unprobed = search(1)
    assert len(asked) == maxbatch.SCAN_BEYOND and best == 11
    assert unprobed == 6 + maxbatch.SCAN_BEYOND + 1


def test_the_answer_names_the_shape_flags_it_was_given() -> None:
    require("memest")
    done = cli("estimate", "--model", "torchvision:resnet18", "--batch-size", "2",
               "--input-shape", "3,32,32", "--num-classes", "10", "--json")  # fmt: skip
    inputs = json.loads(done.stdout)["inputs"]
    assert (inputs["input_shape"], inputs["num_classes"]) == ("3,32,32", 10), inputs
    assert "seq_len" not in inputs  # not given, and an image model has none


@pytest.mark.parametrize(
    ("stderr", "line"),
    [
        # A TOML error goes on under its source excerpt: its reason is kept, the excerpt left out.
        (
            "memsim: warning: w\nmemsim: error: invalid profile p.toml: TOML parse error at line "
            '21, column 16\n   |\n21 | total_memory = "40GiB"\n   |                ^^^^^^^\n'
            'invalid type: string "40GiB", expected u64\n',
            'invalid profile p.toml: TOML parse error at line 21, column 16; invalid type: string "40GiB", expected u64',
        ),
        # clap's usage advice is not the error.
        (
            "error: invalid value '0' for '--capacity <SIZE>': bad\n\nFor more information, try "
            "'--help'.\n",
            "invalid value '0' for '--capacity <SIZE>': bad",
        ),
        ("memest: error: x.jsonl: no such file\n", "x.jsonl: no such file"),
        ("something else\nlast words\n", "last words"),
        # Rust's allocation failure (an abort) is the line before the backtrace it skips.
        (
            "memory allocation of 3584 bytes failed\nskipping backtrace printing to avoid "
            "potential recursion\n",
            "memory allocation of 3584 bytes failed",
        ),
    ],
)
def test_a_tools_error_is_one_line_with_its_reason(stderr: str, line: str) -> None:
    from memtrace_trainer.binaries import error_line

    assert error_line(stderr) == line


def test_a_batch_whose_tensors_overflow_is_the_requests_error() -> None:
    done = cli("estimate", "--model", "torchvision:resnet18", "--batch-size",
               "1000000000000000", check=False)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "overflows PyTorch's 64-bit element count" in done.stderr
    assert "internal error" not in done.stderr


def test_no_fake_tensor_builds_a_step_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The FakeTensor baseline runs the job a second time, so a step builder with side effects
    ran twice with no way to avoid it; `--no-fake-tensor` leaves the baseline out, said."""
    require("memest")
    builds = tmp_path / "builds.txt"
    monkeypatch.setenv("MEMTRACE_TEST_BUILDS", str(builds))
    for flags, count in (([], 2), (["--no-fake-tensor"], 1)):
        builds.write_text("")
        done = cli("estimate", "--step", "step_examples:counted_builds", *flags, "--json")
        assert builds.read_text().count("build") == count, flags
        data = json.loads(done.stdout)
        if flags:
            assert data["unavailable"]["fake_tensor"] == "not run (--no-fake-tensor)"
            assert data["estimates"].get("fake_tensor") is None
        else:
            assert data["estimates"]["fake_tensor"]["device_mib"] > 0
    # With --script the baseline never reruns the job: the flag does nothing, and says so.
    script = Path(__file__).parent / "scripts" / "train_mlp.py"
    done = cli("estimate", "--script", str(script), "--no-fake-tensor")
    assert "--no-fake-tensor has no effect with --script" in done.stderr, done.stderr


def test_a_zoo_model_pytorch_refuses_at_its_batch_is_the_jobs_error() -> None:
    """BatchNorm in training over one value per channel raises in PyTorch itself, on a GPU as on
    meta: it was called an internal error of the tool's."""
    spec = 'synthetic:{"family":"mlp","input_size":8,"depth":2,"output_size":2,"batchnorm":true}'
    done = cli("estimate", "--model", spec, "--batch-size", "1", check=False)
    assert done.returncode == 2, done.stderr
    assert "PyTorch refused to train it at batch 1: ValueError: Expected more than 1 value" in (
        done.stderr
    )
    assert "internal error" not in done.stderr
    # The same for the features pass (a ViT at another image size), before any trace runs.
    for command in ("features", "estimate"):
        done = cli(command, "--model", "torchvision:vit_b_16", "--input-shape", "3,100,100",
                   "--batch-size", "1", check=False)  # fmt: skip
        assert done.returncode == 2, done.stderr
        assert "PyTorch refused its forward pass at batch 1: AssertionError: Wrong image" in (
            done.stderr
        ), done.stderr
        assert "internal error" not in done.stderr


# (command, flags, key of the answer, the smallest probe's key, how the text names it)
SEARCHES = [
    ("max-batch", ["--model", MLP], "max_batch", "need_at_batch", "batch 1"),
    ("max-seq", ["--entry", "entry_failures:sized", "--multiple-of", "16"], "max_seq_len",
     "need_at_seq_len", "16 tokens"),
]  # fmt: skip


@pytest.mark.parametrize(("command", "flags", "key", "at", "words"), SEARCHES)
def test_a_search_that_finds_nothing_says_what_the_smallest_probe_needs(
    command: str, flags: list[str], key: str, at: str, words: str
) -> None:
    """Nothing fitting hid the need the first probe had measured (null in JSON, none in text)."""
    require("memsim")
    args = [command, *flags, "--capacity", "64MiB"]
    data = json.loads(cli(*args, "--json", check=False).stdout)
    first = data["probes"][0]
    assert data[key] == 0 and data[at] == first.get("seq_len", first.get("batch"))
    for field in ("need_bytes", "point_bytes", "peak_reserved_bytes", "peak_allocated_bytes"):
        assert data[field] == first[field] > 0, field
    assert data["need_bytes"] > data["capacity_bytes"]
    text = cli(*args, check=False)
    assert text.returncode == 1
    assert f"needs {data['need_bytes'] / MIB:.1f} MiB even at {words} (" in text.stdout, text.stdout
    assert len(data["probes"]) == 1 and "; 1 probe in " in text.stdout, (
        text.stdout
    )  # not "1 probes"
    # An entry's position limit is its own: its answer is memory's limit alone, and says so.
    said = "the longest sequence its model accepts (a learned position table"
    assert (said in text.stderr) == ("--entry" in flags), text.stderr


def test_min_world_size_that_finds_nothing_says_the_need_at_the_largest_size() -> None:
    require("memsim")
    # fsdp2: a replicating strategy (ddp) probes only the smallest size.
    args = ["min-world-size", "--model", MLP, "--batch-size", "2", "--strategy", "fsdp2",
            "--world-sizes", "1,2", "--capacity", "64MiB"]  # fmt: skip
    data = json.loads(cli(*args, "--json", check=False).stdout)
    assert data["min_world_size"] is None and data["need_at_world_size"] == 2
    assert data["need_bytes"] == data["probes"][-1]["need_bytes"] > data["capacity_bytes"]
    text = cli(*args, check=False).stdout
    assert f"rank 0 needs {data['need_bytes'] / MIB:.1f} MiB even at 2 ranks" in text, text


@pytest.mark.parametrize(
    ("command", "flags", "defaulted"),
    [
        ("estimate", ["--model", MLP, "--batch-size", "2"], 2),
        ("estimate", ["--step", "step_examples:sized", "--batch-size", "2"], 3),
        ("estimate", ["--script", str(Path(__file__).parent / "scripts" / "train_mlp.py")], 3),
        ("max-batch", ["--model", MLP, "--capacity", "64MiB"], 2),
        ("max-seq", ["--entry", "entry_failures:sized", "--capacity", "64MiB"], 2),
        ("symtrace", ["--model", MLP, "--batch-size", "2"], 2),
    ],
)
def test_only_a_defaulted_step_count_is_called_a_default(
    command: str, flags: list[str], defaulted: int, tmp_path: Path
) -> None:
    """An explicit --steps was listed under `defaults` and noted as a default (estimate), and
    a defaulted one was not listed at all (max-batch, symtrace)."""
    require("memest")
    if command == "symtrace":
        flags = [*flags, "--out", str(tmp_path / "t.jsonl")]

    def run(*more: str) -> tuple[dict[str, Any], str]:
        text = cli(command, *flags, *more, check=False).stderr
        data = json.loads(cli(command, *flags, *more, "--json", check=False).stdout)
        return (data["inputs"] if command == "estimate" else data)["defaults"], text

    defaults, text = run()
    assert defaults["iterations"]["value"] == defaulted, defaults
    note = next(line for line in text.splitlines() if line.startswith("note: iterations = "))
    assert note.startswith(f"note: iterations = {defaulted} (") and "give --steps" in note, note
    defaults, text = run("--steps", "3")
    assert "iterations" not in defaults, defaults
    assert "iterations =" not in text, text


@pytest.mark.parametrize(
    ("flags", "said", "not_said"),
    [
        # The cap is gpt2's 1024 positions: the error named a --limit nobody gave.
        (["--model", "hf:gpt2", "--multiple-of", "2000"],
         "--multiple-of 2000: expected at most 1024 tokens, the model's max_position_embeddings",
         "--limit"),
        (["--entry", "entry_failures:sized", "--limit", "10", "--multiple-of", "16"],
         "--limit 10: expected at least --multiple-of (16) tokens", "max_position_embeddings"),
    ],
)  # fmt: skip
def test_max_seq_errors_name_where_the_cap_came_from(
    flags: list[str], said: str, not_said: str
) -> None:
    done = cli("max-seq", *flags, check=False)
    assert done.returncode == 2 and said in done.stderr and not_said not in done.stderr, done.stderr


@pytest.mark.parametrize(
    ("limit", "cap", "multiple", "why"),
    [
        (1024, "max_position_embeddings", 1000, "the largest multiple of --multiple-of 1000 within "
         "the model's max_position_embeddings, 1024; a real run takes no longer sequence"),
        (1024, "n_positions", 64, "the model's n_positions, 1024; a real run takes no longer "
         "sequence"),
        (1000, None, 64, "the largest multiple of --multiple-of 64 within --limit 1000; longer "
         "may fit"),
        (1024, None, 64, "--limit 1024; longer may fit"),
    ],
)  # fmt: skip
def test_the_sequence_cap_is_worded_with_its_value_and_source(
    limit: int, cap: str | None, multiple: int, why: str
) -> None:
    from memtrace_trainer.cli.estimate import _seq_limit_why

    assert _seq_limit_why(limit, cap, multiple) == why


def test_max_seq_at_the_models_cap_says_the_cap_and_the_multiple() -> None:
    """`--multiple-of 1000` on gpt2 answered "1000 tokens (the model's max_position_embeddings)",
    where that is 1024."""
    require("memsim")
    done = cli("max-seq", "--model", "hf:gpt2", "--multiple-of", "1000", "--steps", "1")
    assert (": 1000 tokens (the largest multiple of --multiple-of 1000 within the model's "
            "max_position_embeddings, 1024;") in done.stdout, done.stdout  # fmt: skip


def test_a_need_no_device_holds_is_said_not_read_as_a_null_number() -> None:
    """memest writes a need no device holds (a memory fraction of 0) as null with its reason
    (`verdict.need_unbounded`): the trainer says so, rather than failing on a null MiB."""
    from memtrace_trainer.errors import UserError
    from memtrace_trainer.estimate import parse_memest

    answer = {"device_mib": None, "reserved_mib": 20.0, "level": "device"}
    data = {
        "schema": 3,
        "estimates": {"symbolic": answer},
        "verdict": {"need_mib": None, "need_unbounded": "memory_fraction", "fits": False},
        "text": {"headline": "needs more than any device holds on GPU", "verdict": "DOES NOT FIT"},
    }
    with pytest.raises(UserError, match=r"no device holds this job .*memory_fraction.*any device"):
        parse_memest(json.dumps(data), with_features=False)


@pytest.mark.parametrize(
    ("entry", "warned"), [("entry_failures:long_features", True), ("entry_failures:sized", False)]
)
def test_an_entrys_integer_features_are_warned_of_and_its_token_ids_are_not(
    entry: str, warned: bool
) -> None:
    """The meta device checks no dtypes: a long batch to a Linear traced in silence where a GPU
    fails at that layer. Token ids reaching an Embedding are what it takes."""
    require("memsim")
    done = cli("estimate", "--entry", entry, "--batch-size", "2", "--json", check=False)
    assert done.returncode in (0, 1), done.stderr
    said = "is given torch.int64 input and its parameters are torch.float32"
    assert (said in done.stderr) == warned, done.stderr
    if warned:
        assert f"cast integer inputs of --entry {entry} that are features" in done.stderr
        assert "the model's Linear '0'" in done.stderr and done.stderr.count(said) == 1
