"""scripts/gpu/profile_writer.py on fake measurements: the dry run of the H200 profile step of
scripts/gpu-check.sh (the measurement itself needs a GPU and is not run here)."""

from __future__ import annotations

import importlib.util
import json
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
WRITER = REPO / "scripts/gpu/profile_writer.py"
_spec = importlib.util.spec_from_file_location("profile_writer", WRITER)
writer = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(writer)

FAKE = {
    "date": "2030-01-02",
    "gpu_name": "NVIDIA H200",
    "total_memory_bytes": 150_754_820_096,
    "sm_count": 132,
    "compute_capability": [9, 0],
    "torch": "2.15.0+cu132",
    "cuda": "13.2",
    "cudnn": "91200",
    "context_mib": 517.25,
    "context_source": "nvml",
    "cublas_mib": 80.0,
    "cudnn_mib": 312.5,
    "cublas_workspace_bytes": 33_554_432,
}


def keys(profile: dict) -> set[str]:
    # [calibration] and [safety] are fitted on measured runs later, not measured by the writer;
    # [provenance] says what is not measured.
    fitted = ("calibration", "safety", "provenance")
    return {f"{t}.{k}" for t, v in profile.items() if t not in fitted for k in v}


def test_render_writes_every_measured_constant_with_its_provenance():
    text = writer.render(FAKE)
    p = tomllib.loads(text)
    assert p["gpu"] == {
        "name": "NVIDIA H200",
        "total_memory": 150_754_820_096,
        "compute_capability": [9, 0],
        "sm_count": 132,
    }
    assert p["software"] == {"torch": "2.15", "cuda": "13.2", "cudnn": "91200", "allocator": "2.9"}
    assert p["outside_allocator"] == {
        "context_mib": 517.2,
        "cublas_mib": 80.0,
        "cudnn_mib": 312.5,
        "nccl_communicator_mib": 64.0,
        "nccl_per_peer_mib": 32.0,
    }
    assert p["workspace"] == {
        "cublas_workspace_config": ":32768:1",
        "cublaslt_workspace_kib": 32768,
        "cublaslt_per_call": False,
        "cudnn_workspace_factor": 1.0,
    }
    assert p["provenance"] == {"unmeasured": ["workspace.cudnn_workspace_factor",
                                              "outside_allocator.nccl_communicator_mib",
                                              "outside_allocator.nccl_per_peer_mib"]}  # fmt: skip
    # Exactly the keys the shipped, loadable A100 profile has: unknown keys are loader errors.
    shipped = tomllib.loads((REPO / "profiles/a100-40gb.toml").read_text())
    assert keys(p) == keys(shipped)
    assert text.count("measured by scripts/gpu-check.sh on 2030-01-02") >= 10


@pytest.mark.parametrize(
    ("torch", "allocator", "per_call"),
    [
        ("2.4.1", "2.4", "true"),
        ("2.5.0", "2.5", "false"),
        ("2.8.0", "2.5", "false"),
        ("2.9.1", "2.9", "false"),
    ],
)
def test_allocator_version_follows_torch(torch, allocator, per_call):
    p = tomllib.loads(writer.render({**FAKE, "torch": torch}))
    assert p["software"]["allocator"] == allocator
    assert p["workspace"]["cublaslt_per_call"] is (per_call == "true")


def test_allocator_version_is_memsims(tmp_path):
    """The writer maps a torch version to allocator rules as `memsim --torch` does."""
    import subprocess

    memsim = REPO / "target" / "release" / "memsim"
    if not memsim.is_file():
        pytest.fail(f"{memsim} missing: run `cargo build --release` first")
    trace = REPO / "tests" / "fixtures" / "trace-v1" / "all-kinds.jsonl"
    for version in ("2.3.1", "2.4.1", "2.5.0", "2.8.0", "2.9.1", "2.10.0", "3.0.0"):
        done = subprocess.run([str(memsim), "replay", str(trace), "--torch", version, "--json"],
                              capture_output=True, text=True)  # fmt: skip
        try:
            ours = writer.allocator_version(version)
        except writer.MeasurementError:
            ours = None
        theirs = (
            json.loads(done.stdout)["torch_allocator_version"] if done.returncode == 0 else None
        )
        assert ours == theirs, (version, ours, theirs, done.stderr)


def test_no_workspace_through_the_allocator_keeps_the_default():
    text = writer.render({**FAKE, "cublas_workspace_bytes": 0})
    assert tomllib.loads(text)["workspace"]["cublas_workspace_config"] == ":32768:1"
    assert "No workspace was allocated" in text


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"sm_count": None}, "'sm_count': expected int"),
        ({"context_mib": "lots"}, "'context_mib': expected float"),
        ({"compute_capability": [9]}, "'compute_capability'"),
        ({"cudnn_mib": -1.0}, "'cudnn_mib': expected >= 0"),
        ({"torch": "nightly"}, "'torch'"),
        ({"cuda": ""}, "'cuda': expected a version number"),
        ({"cudnn": "9.x"}, "'cudnn': expected a version number"),
        ({"cuda": "\uff11\uff12.4"}, "'cuda': expected a version number"),
    ],
)
def test_bad_measurements_name_the_field(change, needle):
    with pytest.raises(writer.MeasurementError, match=r"m\.json") as e:
        writer.render({**FAKE, **change}, "m.json")
    assert needle in str(e.value)


def test_a_profile_without_cudnn_leaves_the_key_out_and_loads(tmp_path):
    """torch without cuDNN measures `""`: the optional key is left out, so memsim, which
    refuses an empty version, loads what the writer wrote (gpu-check.sh writes it over the
    shipped profile)."""
    import subprocess

    memsim = REPO / "target" / "release" / "memsim"
    if not memsim.is_file():
        pytest.fail(f"{memsim} missing: run `cargo build --release` first")
    for cudnn in ("", "91200"):
        path = tmp_path / f"p{cudnn}.toml"
        path.write_text(writer.render({**FAKE, "cudnn": cudnn}))
        assert ("cudnn" in tomllib.loads(path.read_text())["software"]) is bool(cudnn)
        done = subprocess.run(
            [str(memsim), "profile", str(path), "--json"], capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["software"].get("cudnn") == (cudnn or None)


def test_missing_field_is_named():
    data = dict(FAKE)
    del data["cublas_mib"]
    with pytest.raises(writer.MeasurementError, match="'cublas_mib' missing"):
        writer.render(data, "m.json")


def test_write_replaces_the_profile_or_leaves_it_untouched(tmp_path):
    m = tmp_path / "m.json"
    m.write_text(json.dumps(FAKE))
    prof = tmp_path / "h200.toml"
    prof.write_text("old\n")
    with pytest.raises(writer.MeasurementError, match="expected a B200"):
        writer.write(m, prof, "B200")
    assert prof.read_text() == "old\n"
    m.write_text(json.dumps({**FAKE, "sm_count": "x"}))
    with pytest.raises(writer.MeasurementError, match="sm_count"):
        writer.write(m, prof, "H200")
    assert prof.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["h200.toml", "m.json"]
    m.write_text(json.dumps(FAKE))
    text = writer.write(m, prof, "H200")
    assert prof.read_text() == text


def test_cli_prints_the_error_and_exits_1(tmp_path, monkeypatch, capsys):
    m = tmp_path / "m.json"
    m.write_text("{not json")
    prof = tmp_path / "h200.toml"
    monkeypatch.setattr("sys.argv", ["profile_writer", str(m), "--profile", str(prof)])
    assert writer.main() == 1
    err = capsys.readouterr().err
    assert err.startswith("profile_writer: error: ") and "m.json" in err
    assert not prof.exists()
