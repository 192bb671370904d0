"""Recorded vs predicted peaks for the cs336 snapshots (docs/validation.md).

    python tests/cs336/compare.py TRACE_DIR [SNAPSHOT_DIR]

TRACE_DIR holds `NAME.jsonl` from `symtrace --step cs336.steps:NAME --steps 1`; SNAPSHOT_DIR
defaults to ../shared/data/snapshots. Recorded: `memsim replay` of the snapshot (the window, with
the start state rebuilt from the final segments) and `memsim stats` (start_state_allocated_bytes).
Predicted: `memsim replay --torch V` of the trace, iteration 0 (the recorded window; everything
FN built is live or cached when it starts). Requested: bytes asked for (no allocator rounding;
layout-independent); allocated: block bytes (rounding depends on the layout); reserved: where
the window opens with an empty_cache burst, the recorded peak after it. Growth: peak minus what is
live when the window starts, in requested bytes on both sides (pre-window blocks freed in the
window count their recorded size). Prints a markdown table.
"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MEMSIM = REPO / "target" / "release" / "memsim"

# snapshot file (without the .pickle), step function, allocator rules of the snapshot's torch
ROWS = [
    ("kkaitlyn111--cs336-a2-systems--memory_ctx128_fullstep", "kk_fullstep_ctx128", "2.5"),
    (
        "kkaitlyn111--cs336-a2-systems--memory_files_memory_ctx128_fullstep_",
        "kk_fullstep_ctx128",
        "2.5",
    ),
    (
        "Wedsonlin--assignment2-systems--results_medium_128_inference_memory_snapshot",
        "wl_medium128_inference",
        "2.9",
    ),
    (
        "Wedsonlin--assignment2-systems--results_medium_512_training_memory_snapshot",
        "wl_medium512_training",
        "2.9",
    ),
    ("MAGMA27--assignment2-systems--memory_snapshot", "magma27_small_fwd_bwd", "2.9"),
    ("bcrafton--assignment2-systems--memory_snapshot", "bcrafton_small_train", "2.9"),
    ("kkaitlyn111--cs336-a2-systems--memory_small_forward", "kk_small_forward", "2.5"),
    ("kkaitlyn111--cs336-a2-systems--memory_2.7b_forward", "kk_27b_forward", "2.5"),
    ("kkaitlyn111--cs336-a2-systems--memory_ctx256_forward", "kk_ctx256_forward", "2.5"),
]


def memsim(*args: str) -> dict:
    out = subprocess.run([str(MEMSIM), *args, "--json"], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def snapshot_window(path: Path) -> tuple[int, int | None]:
    """(peak over the window of the live requested bytes relative to its start; the peak
    reserved after an `empty_cache` burst that opens the window, when every segment release of
    the window is in that burst: then reserved only grows afterwards and its peak is the final
    segments' total)."""
    snap = pickle.loads(path.read_bytes())
    trace = snap["device_traces"][0]
    live = peak = 0
    for e in trace:
        if e["action"] == "alloc":
            live += e["size"]
        elif e["action"] == "free_completed":
            live -= e["size"]
        peak = max(peak, live)
    releases = [i for i, e in enumerate(trace) if e["action"] in ("segment_free", "segment_unmap")]
    first_alloc = next((i for i, e in enumerate(trace) if e["action"] == "alloc"), len(trace))
    after = None
    if releases and releases[-1] < first_alloc:
        after = sum(s["total_size"] for s in snap["segments"])
    return peak, after


def trace_window(path: Path) -> tuple[int, int]:
    """(peak live requested bytes over iter:0, its growth over the live bytes when it starts)."""
    live = start = peak = 0
    started = False
    for line in path.open():
        e = json.loads(line)
        if e.get("kind") == "marker" and e.get("text") == "iter:0":
            started, start = True, live
        if e.get("kind") == "alloc":
            live += e["size"]
        elif e.get("kind") == "free":
            live -= e["size"]
        if started:
            peak = max(peak, live)
    return peak, peak - start


def pct(pred: float, rec: float) -> str:
    return f"{100 * (pred - rec) / rec:+.2f}%"


def mib(b: float) -> str:
    return f"{b / 2**20:,.1f}"


def main() -> None:
    traces = Path(sys.argv[1])
    snaps = (
        Path(sys.argv[2]) if len(sys.argv) > 2 else REPO.parent / "shared" / "data" / "snapshots"
    )
    print(
        "| snapshot | step | rec. start alloc | peak requested rec. / pred. | err"
        " | peak allocated rec. / pred. | err | peak reserved rec. / pred. | err"
        " | growth rec. / pred. | err |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for snap, step, torch_rules in ROWS:
        pickle_path = snaps / f"{snap}.pickle"
        trace_path = traces / f"{step}.jsonl"
        if not trace_path.exists():
            continue
        rec = memsim("replay", str(pickle_path))
        stats = memsim("stats", str(pickle_path))
        pred = memsim("replay", "--torch", torch_rules, str(trace_path))["iterations"][0]
        rec_growth, reserved_after = snapshot_window(pickle_path)
        pred_req, pred_growth = trace_window(trace_path)
        rq, ra, rr = (
            rec["peak_requested_bytes"],
            rec["peak_allocated_bytes"],
            rec["peak_reserved_bytes"],
        )
        pa, pr = pred["peak_allocated_bytes"], pred["peak_reserved_bytes"]
        rr_note = ""
        if reserved_after is not None:  # the window opens with empty_cache: compare what follows it
            rr_note = f" ({mib(rr)} before its empty_cache)"
            rr = reserved_after
        owner, name = snap.split("--")[0], snap.split("--")[-1]
        start = mib(stats["start_state_allocated_bytes"])
        print(
            f"| {owner} `{name}` | {step} | {start}"
            f" | {mib(rq)} / {mib(pred_req)} | {pct(pred_req, rq)}"
            f" | {mib(ra)} / {mib(pa)} | {pct(pa, ra)}"
            f" | {mib(rr)}{rr_note} / {mib(pr)} | {pct(pr, rr)}"
            f" | {mib(rec_growth)} / {mib(pred_growth)} | {pct(pred_growth, rec_growth)} |"
        )


if __name__ == "__main__":
    main()
