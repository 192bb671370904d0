"""Straightforward Python port of the native caching-allocator rules (rounding, pools, best fit,
split, merge), the baseline for the replay benchmark: the published xMem simulator is Python.

Usage: python3 replay_baseline.py OPS_FILE
       python3 replay_baseline.py --trace TRACE.jsonl
OPS_FILE holds little-endian u64 ops written by `cargo bench --bench replay -- --dump-ops`:
high bit set = free live block (rest % len(live)), else allocate that many bytes on stream 0.
Prints events/s and the same address checksum as the Rust replay, so the two can be compared.

With --trace it is the end-to-end reference for `memsim replay`: it reads an allocator-level
JSON Lines trace (one stream, device memory), replays its requests and prints the wall time and
the peak reserved bytes, which must equal memsim's (`scripts/bench-replay-e2e.sh` checks).
"""

import bisect
import json
import sys
import time
from array import array

MIB = 1 << 20
BASE = 0x1000_0000_0000
FREE = 1 << 63
MASK = (1 << 64) - 1


class Block:
    __slots__ = ("addr", "allocated", "next", "prev", "size", "small")

    def __init__(self, addr, size, small):
        self.addr, self.size, self.small = addr, size, small
        self.prev = self.next = None
        self.allocated = False

    def absorb(self, right):
        """Takes in the free block after it: the one merge both neighbours of a freed block go
        through (the left one absorbs the freed block, the freed block its right one)."""
        self.size += right.size
        self.next = right.next
        if right.next is not None:
            right.next.prev = self


class Allocator:
    def __init__(self):
        # Free blocks per pool, a sorted list of (size, addr) plus a dict to the Block.
        self.pools = {True: [], False: []}
        self.free_by_key = {}
        self.live = {}
        self.next_addr = BASE
        self.reserved = 0
        self.peak_reserved = 0

    @staticmethod
    def round_size(size):
        return 512 if size < 512 else (size + 511) // 512 * 512

    @staticmethod
    def allocation_size(size):
        if size <= MIB:
            return 2 * MIB
        if size < 10 * MIB:
            return 20 * MIB
        return (size + 2 * MIB - 1) // (2 * MIB) * (2 * MIB)

    def _insert(self, b):
        key = (b.size, b.addr)
        bisect.insort(self.pools[b.small], key)
        self.free_by_key[key] = b

    def _remove(self, b):
        key = (b.size, b.addr)
        pool = self.pools[b.small]
        del pool[bisect.bisect_left(pool, key)]
        del self.free_by_key[key]

    def malloc(self, orig):
        size = self.round_size(orig)
        small = size <= MIB
        pool = self.pools[small]
        i = bisect.bisect_left(pool, (size, 0))
        if i < len(pool):
            b = self.free_by_key[pool[i]]
            self._remove(b)
        else:
            seg = self.allocation_size(size)
            addr = (self.next_addr + 2 * MIB - 1) // (2 * MIB) * (2 * MIB)
            self.next_addr = addr + seg
            b = Block(addr, seg, small)
            self.reserved += seg
            self.peak_reserved = max(self.peak_reserved, self.reserved)
        remaining = b.size - size
        if (remaining >= 512) if small else (remaining > MIB):
            rest = Block(b.addr + size, remaining, small)
            rest.prev, rest.next = b, b.next
            if b.next is not None:
                b.next.prev = rest
            b.next = rest
            b.size = size
            self._insert(rest)
        b.allocated = True
        self.live[b.addr] = b
        return b.addr

    def free(self, addr):
        b = self.live.pop(addr)
        b.allocated = False
        p = b.prev
        if p is not None and not p.allocated:
            self._remove(p)
            p.absorb(b)
            b = p
        n = b.next
        if n is not None and not n.allocated:
            self._remove(n)
            b.absorb(n)
        self._insert(b)


def replay_trace(path):
    t = time.perf_counter()
    a = Allocator()
    where = {}  # trace address -> model address
    records = 0
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            records += 1
            kind = r["kind"]
            if r.get("origin") != "request" or r.get("mem") != "device":
                continue
            if kind == "alloc":
                where[r["addr"]] = a.malloc(r["size"])
            elif kind == "free" and r.get("stage", "immediate") != "requested":
                # A requested free leaves the block allocated until its completion (one stream:
                # no other stream can still use it, so completion follows at once).
                a.free(where.pop(r["addr"]))
    secs = time.perf_counter() - t
    print(
        f"python-trace: {records} records in {secs:.3f} s wall; "
        f"peak reserved bytes {a.peak_reserved}; live at end {len(a.live)}"
    )


def main():
    if sys.argv[1] == "--trace":
        replay_trace(sys.argv[2])
        return
    ops = array("Q")
    with open(sys.argv[1], "rb") as f:
        ops.frombytes(f.read())
    if sys.byteorder != "little":
        ops.byteswap()
    a = Allocator()
    live = []
    checksum = 0
    t = time.thread_time()
    for op in ops:
        if op & FREE:
            i = (op & ~FREE) % len(live)
            live[i], live[-1] = live[-1], live[i]
            a.free(live.pop())
        else:
            addr = a.malloc(op)
            live.append(addr)
            checksum = (checksum * 31 + addr) & MASK
    secs = time.thread_time() - t
    print(
        f"python: {len(ops)} events in {secs:.3f} s CPU = {len(ops) / secs / 1e6:.3f} M events/s; "
        f"peak reserved {a.peak_reserved >> 20} MiB; checksum {checksum:#x}"
    )


if __name__ == "__main__":
    main()
