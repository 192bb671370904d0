"""A synthetic allocator-level trace for the end-to-end replay benchmark
(`scripts/bench-replay-e2e.sh`).

Usage: python3 make_trace.py ALLOCS OUT.jsonl [SEED]

Writes a JSON Lines trace in the shape `memsim convert` makes of a PyTorch memory snapshot:
`alloc` requests and frees as `requested` + `completed` pairs (a snapshot's `free_requested`
and `free_completed`), on device 0, stream 0, with categories and an `iter:<n>` marker every
10,000 records. 300,000 allocations make about 900,000 records. The size mix is the replay
benchmark's (45% small log-uniform below 1 MiB, 30% 1-10 MiB, 15% recurring parameter-shaped
sizes, 10% 10-100 MiB) with 200-600 live blocks; every allocation is freed, most soon, the
last few hundred at the end.
"""

import json
import random
import sys

MIB = 1 << 20
CATEGORIES = [
    "parameter", "gradient", "optimizer_state", "activation", "workspace", "input", "other",
]  # fmt: skip
REQUEST = {
    "device": 0, "stream": 0, "mem": "device", "api": "allocator", "result": 0, "origin": "request",
}  # fmt: skip


def size(rng, params):
    r = rng.random()
    if r < 0.45:
        return int(2 ** rng.uniform(9, 20))
    if r < 0.75:
        return rng.randrange(MIB, 10 * MIB)
    if r < 0.90:
        return rng.choice(params)
    return rng.randrange(10 * MIB, 100 * MIB)


def main():
    allocs, out = int(sys.argv[1]), sys.argv[2]
    rng = random.Random(int(sys.argv[3]) if len(sys.argv) > 3 else 0x5EED)
    params = [rng.randrange(4096, 64 * MIB) // 512 * 512 for _ in range(64)]
    header = {
        "kind": "header",
        "format_version": 1,
        "producer": {"name": "make_trace.py", "version": "1"},
        "level": "allocator",
        "caching_disabled": False,
        "synthetic_addresses": True,
        "metadata": {},
    }
    live = []
    next_addr = 1 << 40
    ts = 0
    n = 0
    with open(out, "w") as f:
        w = f.write
        w(json.dumps(header, separators=(",", ":")) + "\n")

        def rec(r):
            nonlocal ts, n
            ts += 1000
            n += 1
            if n % 10_000 == 0:
                marker = {"kind": "marker", "ts_ns": ts, "text": f"iter:{n // 10_000}"}
                w(json.dumps(marker, separators=(",", ":")) + "\n")
            r["ts_ns"] = ts
            w(json.dumps(r, separators=(",", ":")) + "\n")

        def free(i):
            live[i], live[-1] = live[-1], live[i]
            addr, s = live.pop()
            for stage in ("requested", "completed"):
                rec({"kind": "free", "addr": addr, "size": s, **REQUEST, "stage": stage})

        target = rng.randrange(200, 600)
        for k in range(allocs):
            if k % 5000 == 0:
                target = rng.randrange(200, 600)
            while len(live) > target or (live and rng.random() < 0.3):
                free(rng.randrange(len(live)))
            s = size(rng, params)
            addr = next_addr
            next_addr += (s + 511) // 512 * 512
            live.append((addr, s))
            cat = rng.choice(CATEGORIES)
            rec({"kind": "alloc", "addr": addr, "size": s, **REQUEST, "category": cat})
        while live:
            free(len(live) - 1)
        w(json.dumps({"kind": "process_exit", "lost_events": 0}, separators=(",", ":")) + "\n")
    print(f"{out}: {allocs} allocations, {n} records")


if __name__ == "__main__":
    main()
