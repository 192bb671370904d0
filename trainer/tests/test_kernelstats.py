"""Kernel statistics estimated from a symbolic training step: hand-derived counts, FLOPs, grids."""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import cli
from torch import nn

from memtrace_trainer import kernelstats as ks
from memtrace_trainer.models.zoo import build_workload
from memtrace_trainer.symtrace.step import StepConfig
from memtrace_trainer.workload import Workload

BATCH, IN, OUT = 300, 200, 50


def linear_workload() -> Workload:
    with torch.device("meta"):
        model = nn.Linear(IN, OUT)

    def make() -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(BATCH, IN, device="meta"), torch.randint(0, OUT, (BATCH,), device="meta")

    return Workload("linear", model, make, lambda out, t: F.cross_entropy(out, t), BATCH)


def test_linear_sgd_step_has_the_hand_counted_kernels() -> None:
    kernels = ks.step_kernels(linear_workload(), StepConfig(optimizer="sgd", iterations=2))
    # data: randn, randint | forward: addmm (bias in the epilogue) | loss: log_softmax, nll_loss
    # backward: ones_like (seed), nll_loss_backward, log_softmax_backward, mm (weight grad; the
    # input needs none), sum (bias grad) | optimizer: one foreach launch over weight and bias.
    assert [k.op for k in kernels] == [
        "randn", "randint", "addmm", "_log_softmax", "nll_loss_forward", "ones_like",
        "nll_loss_backward", "_log_softmax_backward_data", "mm", "sum", "_foreach_add_",
    ]  # fmt: skip
    assert ks.count_by_kind(kernels) == {
        "gemm": 2, "conv": 0, "elementwise": 5, "reduction": 4, "other": 0,
    }  # fmt: skip
    addmm, mm = (k for k in kernels if k.kind == "gemm")
    assert addmm.flops == 2 * BATCH * IN * OUT + BATCH * OUT
    assert mm.flops == 2 * OUT * BATCH * IN
    assert addmm.blocks == math.ceil(BATCH / 128) * math.ceil(OUT / 128) == 3
    assert mm.blocks == math.ceil(OUT / 128) * math.ceil(IN / 128) == 2
    # bytes: x, weight, bias in; out out (fp32).
    assert addmm.bytes == 4 * (BATCH * IN + OUT * IN + OUT + BATCH * OUT)
    assert kernels[0].blocks == math.ceil(BATCH * IN / 512)
    stats = ks.summarize(kernels)
    assert stats["k_kernels_per_step"] == 11
    assert stats["k_gemm_conv_kernels"] == 2
    assert stats["k_gflop_per_step"] == pytest.approx(sum(k.flops for k in kernels) / 1e9)


def test_adam_adds_its_foreach_launches_and_only_the_steady_state_counts() -> None:
    kernels = ks.step_kernels(linear_workload(), StepConfig(optimizer="adam", iterations=2))
    optimizer = [k.op for k in kernels if k.op.startswith("_foreach_")]
    # _multi_tensor_adam: the step counters are CPU tensors (no kernel); the first iteration's
    # zeros_like state init is not in the second.
    assert optimizer == [
        "_foreach_lerp_", "_foreach_mul_", "_foreach_addcmul_", "_foreach_sqrt", "_foreach_div_",
        "_foreach_add_", "_foreach_addcdiv_",
    ]  # fmt: skip
    assert len(kernels) == 10 + len(optimizer)
    assert not any("zeros" in k.op for k in kernels)


def test_elementwise_grid_is_ceil_numel_over_512() -> None:
    for numel, blocks in [(1, 1), (512, 1), (513, 2), (1 << 20, 2048)]:
        assert ks.elementwise_blocks(numel) == blocks
    x = torch.empty(1000, device="meta")
    (relu,) = ks.kernels_of(torch.ops.aten.relu.default, (x,), {}, torch.empty_like(x))
    assert (relu.kind, relu.flops, relu.bytes, relu.blocks) == ("elementwise", 1000, 8000, 2)


def test_views_and_metadata_ops_launch_nothing() -> None:
    x = torch.empty(8, 16, device="meta")
    rec = ks.KernelRecorder(last=-1)  # records from the start: no iteration marker comes
    with rec:
        x.view(16, 8)
        x.t()
        x.reshape(128)
        x.expand(2, 8, 16)
        x.detach()
        x.as_strided((4,), (1,))
        x[1:3]
        x.unsqueeze(0)
        torch.empty(4, device="meta")
        torch.empty_like(x)
        assert rec.kernels == []
        x.t().contiguous()  # a real copy
        x.add_(1.0)
        torch.ones(3, device="cpu").add_(1.0)  # host-side: no GPU kernel
    assert [k.op for k in rec.kernels] == ["clone", "add_"]


def test_foreach_launches_follow_multi_tensor_apply() -> None:
    chunk = ks.FOREACH_CHUNK
    assert ks.foreach_launches([chunk * 320], depth=1) == [320]
    assert ks.foreach_launches([chunk * 400], depth=1) == [320, 80]
    assert ks.foreach_launches([1] * 111, depth=1) == [110, 1]
    assert ks.foreach_launches([1] * 37, depth=4) == [36, 1]
    assert ks.foreach_launches([10, chunk * 330], depth=2) == [320, 11]
    assert ks.foreach_launches([0, 5], depth=2) == [1]


def test_gemm_grid_splits_k_when_it_dominates() -> None:
    assert ks.gemm_blocks(300, 50) == 3
    assert ks.gemm_blocks(32, 288, k=933_712) == 3 * 16  # capped split
    assert ks.gemm_blocks(32, 288, k=8192) == 3 * 2
    assert ks.gemm_blocks(4096, 4096, k=1024) == 32 * 32


def test_summary_on_hand_built_kernels() -> None:
    dev = ks.Device("toy", 10, 1e12, 1e12, 1e12, 1e12, 5.0)
    big = ks.Kernel("a", "elementwise", 0.0, 10_000_000, 10)  # 10 us, whole GPU
    small = ks.Kernel("b", "gemm", 0.0, 1_000_000, 5)  # 2 us on half the SMs
    assert ks.duration_us(big, dev) == pytest.approx(10.0)
    assert ks.duration_us(small, dev) == pytest.approx(2.0)
    s = ks.summarize([big, small], dev)
    assert s["k_est_gpu_time_us"] == pytest.approx(12.0)
    assert s["k_est_step_time_us"] == pytest.approx(10.0 + 5.0)  # the small one is launch-bound
    assert s["k_est_smact"] == pytest.approx((10 * 1.0 + 2 * 0.5) / 15)
    assert s["k_est_busy_fraction"] == pytest.approx(12 / 15)
    assert s["k_est_launch_bound_ratio"] == pytest.approx(5 * 2 / 12)
    assert s["k_gemm_conv_time_share"] == pytest.approx(2 / 12)
    assert s["k_mean_blocks_per_sm"] == pytest.approx((1.0 + 0.5) / 2)
    assert set(s) == set(ks.COLUMNS)


def test_fp32_gemm_uses_fp32_peak_and_fp32_conv_tf32() -> None:
    a = ks.profile_device("a100-40gb")
    assert (a.name, a.sm_count) == ("NVIDIA A100-SXM4-40GB", 108), "from the profile"
    assert ks.peak_flops(ks.Kernel("mm", "gemm", 1, 1, 1), a) == 19.5e12
    assert ks.peak_flops(ks.Kernel("convolution", "conv", 1, 1, 1), a) == 156e12
    assert ks.peak_flops(ks.Kernel("mm", "gemm", 1, 1, 1, half=True), a) == 312e12


def cnn_with(act: str) -> str:
    return (
        'synthetic:{"family":"cnn","input_channels":3,"num_classes":10,"depth":2,'
        f'"architecture":"uniform","base_filters":8,"input_size":16,"activation":"{act}"}}'
    )


def test_conv_step_counts_cudnn_calls_and_the_fused_mish_backward() -> None:
    relu = ks.step_kernels(build_workload(cnn_with("relu"), 4))
    mish = ks.step_kernels(build_workload(cnn_with("mish"), 4))
    # One kernel per activation backward either way: threshold_backward / fused mish_backward.
    assert len(mish) == len(relu)
    assert sum(k.op == "mish_backward" for k in mish) == 2
    convs = [k.op for k in relu if k.kind == "conv"]
    # Two conv layers: forward each; backward data for the second only (the input needs no grad).
    assert sorted(convs) == sorted(
        ["convolution"] * 2 + ["convolution_backward:weight"] * 2 + ["convolution_backward:data"]
    )


def test_kernel_stats_cli_writes_every_row_with_a_status_and_resumes(tmp_path: Path) -> None:
    dataset = tmp_path / "rows.csv"
    names = [
        "input:64_output:10_depth:2_arch:pyramid_batch:8.out",
        "input:32_output:4_depth:1_arch:uniform_batch:16_act:gelu_dropout:0.2_dropout:True_batchnorm:True.out",
        "input_channels:3_num_classes:10_depth:4_arch:dense_base_filters:8_batch:2_input_size:16.out",
        "not a gpumemnet name",
    ]
    dataset.write_text("Filename,Batch Size\n" + "".join(f'"{n}",1\n' for n in names))
    out = tmp_path / "k.csv"
    done = cli("kernel-stats", "--gpumemnet", str(dataset), "--out", str(out), "--limit", "3")
    assert "3 to do" in done.stderr and "rows/s" in done.stderr
    rest = cli("kernel-stats", "--gpumemnet", str(dataset), "--out", str(out), "--jobs", "2")
    assert rest.returncode == 0 and "1 of the 1 rows computed failed" in rest.stderr
    rows = list(csv.DictReader(out.open()))
    assert [r["Filename"] for r in rows] == names, "resumed: earlier rows kept, the rest appended"
    assert [r["status"] for r in rows] == ["ok", "ok", "error", "error"]
    assert "dense_interval" in rows[2]["error"] and rows[2]["k_est_smact"] == ""
    assert float(rows[0]["k_kernels_per_step"]) > 0
    assert 0 < float(rows[1]["k_est_smact"]) <= 1
    again = cli("kernel-stats", "--gpumemnet", str(dataset), "--out", str(out))
    assert "0 to do" in again.stderr
    assert "2 of its rows have status error and are not computed again" in again.stderr
    assert len(list(csv.DictReader(out.open()))) == 4
    assert {(r["optimizer"], r["amp"], r["device"]) for r in rows} == {
        ("adam", "fp32", ks.profile_device().name)
    }


def test_kernel_stats_refuses_to_resume_a_file_of_other_settings(tmp_path: Path) -> None:
    dataset = tmp_path / "rows.csv"
    names = [
        "input:64_output:10_depth:2_arch:pyramid_batch:8.out",
        "input:32_output:4_depth:1_arch:uniform_batch:16.out",
    ]
    dataset.write_text("Filename\n" + "".join(f'"{n}"\n' for n in names))
    out = tmp_path / "k.csv"
    cli("kernel-stats", "--gpumemnet", str(dataset), "--out", str(out), "--limit", "1")
    before = out.read_text()
    # (--device too is checked, but only one profile has datasheet rates today.)
    for flags, said in ((["--optimizer", "sgd"], "optimizer 'adam'"),
                        (["--amp", "bf16"], "amp 'fp32'")):  # fmt: skip
        mixed = cli("kernel-stats", "--gpumemnet", str(dataset), "--out", str(out), *flags,
                    check=False)  # fmt: skip
        assert mixed.returncode == 2, mixed.stderr
        assert f"line 2 was computed with {said}" in mixed.stderr and str(out) in mixed.stderr
        assert out.read_text() == before, "nothing appended to a file of other settings"


def test_kernel_stats_cli_errors(tmp_path: Path) -> None:
    bad = cli("kernel-stats", "--gpumemnet", str(tmp_path / "none.csv"), "--out", "x", check=False)
    assert bad.returncode == 2 and "no such file" in bad.stderr
    other = tmp_path / "other.csv"
    other.write_text("Filename,k_x\na,1\n")
    data = tmp_path / "d.csv"
    data.write_text("Filename\na\n")
    clash = cli("kernel-stats", "--gpumemnet", str(data), "--out", str(other), check=False)
    assert clash.returncode == 2 and "other columns" in clash.stderr
    # Under a file: said before any row is computed. (A missing folder is refused too: see
    # test_kernel_stats_out_refuses_a_missing_folder.)
    nowhere = cli("kernel-stats", "--gpumemnet", str(data), "--out", str(other / "k.csv"),
                  check=False)  # fmt: skip
    assert (
        nowhere.returncode == 2
        and f"{other} is not a directory" in nowhere.stderr
        and "rows/s" not in nowhere.stderr
    ), nowhere.stderr
    opt = cli(
        "kernel-stats", "--model", "dlrm", "--batch-size", "2", "--optimizer", "x", check=False
    )
    assert opt.returncode == 2 and "--optimizer" in opt.stderr
    # A CSV of a header alone wrote an --out of a header alone, and exited 0.
    data.write_text("Filename\n")
    out = tmp_path / "k.csv"
    empty = cli("kernel-stats", "--gpumemnet", str(data), "--out", str(out), check=False)
    assert empty.returncode == 2 and f"--gpumemnet {data}: no rows" in empty.stderr, empty.stderr
    assert not out.exists()


def test_flags_of_the_other_source_are_said_to_have_no_effect(tmp_path: Path) -> None:
    mlp = 'synthetic:{"family":"mlp","input_size":32,"output_size":4,"depth":2}'
    done = cli("kernel-stats", "--model", mlp, "--batch-size", "2", "--out",
               str(tmp_path / "k.csv"), "--limit", "3")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "--out" in done.stderr and "has no effect with --model" in done.stderr
    assert "--limit 3 has no effect with --model" in done.stderr
    assert not (tmp_path / "k.csv").exists()


KS_NAMES = [
    "input:64_output:10_depth:2_arch:pyramid_batch:8.out",
    "input:32_output:4_depth:1_arch:uniform_batch:16.out",
    "input:16_output:2_depth:1_arch:uniform_batch:4.out",
]


@pytest.mark.parametrize("cut", [3, 40, "header"])
def test_kernel_stats_repairs_a_row_cut_by_an_interruption(tmp_path: Path, cut: object) -> None:
    """A resume appended its first row onto the cut one (a 33-field row). The cut row is
    removed, said, and computed again, whether the cut left the row short of fields or inside
    its last cell (all fields there, a wrong number)."""
    dataset = tmp_path / "rows.csv"
    dataset.write_text("Filename\n" + "".join(f'"{n}"\n' for n in KS_NAMES))
    out = tmp_path / "k.csv"
    cli("kernel-stats", "--gpumemnet", str(dataset), "--out", str(out), "--limit", "2")
    full = out.read_text()
    header_end = full.index("\n") + 1
    out.write_text(full[: header_end - 5] if cut == "header" else full[: -1 - int(cut)])
    done = cli("kernel-stats", "--gpumemnet", str(dataset), "--out", str(out))
    assert "last row was cut short" in done.stderr, done.stderr
    with out.open(newline="") as f:
        rows = list(csv.reader(f))
    assert all(len(r) == len(rows[0]) for r in rows), [len(r) for r in rows]
    assert [r[0] for r in rows[1:]] == KS_NAMES
    # Recomputed, not kept as cut: the same cells as the uninterrupted run wrote.
    first = {r[0]: r for r in csv.reader(io.StringIO(full))}
    assert rows[1:3] == [first[n] for n in KS_NAMES[:2]]


def test_kernel_stats_refuses_a_damaged_row_before_the_last(tmp_path: Path) -> None:
    """A finished file whose second line was cut to 100 characters (8 of the fields) was resumed
    as if that row were not there: a second row of its Filename was appended, exit 0, and `memest
    util cv --kernel-features` refused the file. Only the last row can be cut by an interruption;
    cut that short, after its line end, it is repaired as one cut inside its line."""
    dataset = tmp_path / "rows.csv"
    dataset.write_text("Filename\n" + "".join(f'"{n}"\n' for n in KS_NAMES[:2]))
    out = tmp_path / "k.csv"
    cli("kernel-stats", "--gpumemnet", str(dataset), "--out", str(out))
    full = out.read_text()
    for line in (1, 2):
        lines = full.splitlines(keepends=True)
        lines[line] = lines[line][:100] + "\n"
        out.write_text("".join(lines))
        done = cli("kernel-stats", "--gpumemnet", str(dataset), "--out", str(out), check=False)
        if line == 1:
            assert done.returncode == 2, done.stderr
            assert f"--out {out}: line 2 has " in done.stderr, done.stderr
            assert out.read_text() == "".join(lines), "a refused file is left as it was"
            continue
        assert done.returncode == 0 and "last row was cut short" in done.stderr, done.stderr
        with out.open(newline="") as f:
            rows = list(csv.reader(f))
        assert [r[0] for r in rows[1:]] == KS_NAMES[:2]
        assert all(len(r) == len(rows[0]) for r in rows), [len(r) for r in rows]


def test_kernel_stats_counts_repeated_filenames_as_what_they_are(tmp_path: Path) -> None:
    """A fresh file said '4 rows ..., 1 already in' when a Filename was repeated: it is one row
    of the output, computed once."""
    dataset = tmp_path / "rows.csv"
    names = [KS_NAMES[0], KS_NAMES[1], KS_NAMES[0], KS_NAMES[0]]
    dataset.write_text("Filename\n" + "".join(f'"{n}"\n' for n in names))
    out = tmp_path / "k.csv"
    done = cli("kernel-stats", "--gpumemnet", str(dataset), "--out", str(out))
    assert f"4 rows in {dataset} (2 distinct Filenames), 0 already in {out}, 2 to do" in (
        done.stderr
    ), done.stderr
    assert "2 rows repeat a Filename of an earlier row" in done.stderr
    assert [r["Filename"] for r in csv.DictReader(out.open())] == KS_NAMES[:2]
    again = cli("kernel-stats", "--gpumemnet", str(dataset), "--out", str(out))
    assert "2 already in" in again.stderr and "0 to do" in again.stderr


def test_kernel_stats_out_refuses_a_missing_folder(tmp_path: Path) -> None:
    """The folders above --out were made (`mkdir -p`), where every other command's --out FILE
    refuses a missing folder: said before any row is computed, and nothing is made."""
    dataset = tmp_path / "rows.csv"
    dataset.write_text("Filename\n" + f'"{KS_NAMES[2]}"\n')
    out = tmp_path / "target" / "kstats" / "k.csv"
    done = cli("kernel-stats", "--gpumemnet", str(dataset), "--out", str(out), check=False)
    assert done.returncode == 2, done.stderr
    assert f"--out {out}: directory {out.parent} does not exist" in done.stderr, done.stderr
    assert "rows/s" not in done.stderr and not (tmp_path / "target").exists()
    out.parent.mkdir(parents=True)
    cli("kernel-stats", "--gpumemnet", str(dataset), "--out", str(out))
    assert [r["status"] for r in csv.DictReader(out.open())] == ["ok"]


def test_kernel_stats_says_failed_rows_and_exits_2_when_all_failed(tmp_path: Path) -> None:
    dataset = tmp_path / "rows.csv"
    dataset.write_text('Filename\n"not a gpumemnet name"\n"' + KS_NAMES[0] + '"\n')
    out = tmp_path / "k.csv"
    one = cli("kernel-stats", "--gpumemnet", str(dataset), "--out", str(out), "--limit", "1",
              check=False)  # fmt: skip
    assert one.returncode == 2, one.stderr
    assert f"every row of {out} failed (1 computed now" in one.stderr
    assert "the first: not a gpumemnet name: " in one.stderr, one.stderr
    assert [r["status"] for r in csv.DictReader(out.open())] == ["error"], "the row is kept"
    both = cli("kernel-stats", "--gpumemnet", str(dataset), "--out", str(out))
    assert both.returncode == 0, both.stderr
    assert "1 of its rows have status error" in both.stderr
    assert "1 new rows (0 with status error)" in both.stderr, "the new row computed"


def test_a_rerun_over_a_file_of_error_rows_still_fails(tmp_path: Path) -> None:
    """The second run over a file whose rows all failed had nothing to do and exited 0 ("0 new
    rows"); a model spec in Filename (a `dataset` CSV of runs) is said to be one."""
    dataset = tmp_path / "rows.csv"
    spec = 'synthetic:{"family":"mlp","input_size":8,"output_size":2,"depth":1}'
    dataset.write_text('Filename\n"' + spec.replace('"', '""') + '"\n"not a gpumemnet name"\n')
    out = tmp_path / "k.csv"
    for _ in range(2):
        done = cli("kernel-stats", "--gpumemnet", str(dataset), "--out", str(out), check=False)
        assert done.returncode == 2 and f"every row of {out} failed" in done.stderr, done.stderr
        assert "is a model spec, not a GPUMemNet file name" in done.stderr, done.stderr
    rows = list(csv.DictReader(out.open()))
    assert [r["status"] for r in rows] == ["error", "error"]


def test_a_dataset_written_with_a_byte_order_mark_is_read(tmp_path: Path) -> None:
    """A spreadsheet's "CSV UTF-8" starts with a byte-order mark: its first column was read as
    `\\ufeffFilename`, and the file refused as having no 'Filename' column (memest reads it)."""
    dataset = tmp_path / "rows.csv"
    name = "input:64_output:10_depth:2_arch:pyramid_batch:8.out"
    dataset.write_bytes(b"\xef\xbb\xbf" + f'Filename,Batch Size\n"{name}",1\n'.encode())
    out = tmp_path / "k.csv"
    cli("kernel-stats", "--gpumemnet", str(dataset), "--out", str(out))
    rows = list(csv.DictReader(out.open()))
    assert [(r["Filename"], r["status"]) for r in rows] == [(name, "ok")]
