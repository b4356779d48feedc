"""Request i's prefix segments (`llmcap.sim.workload` defines them), looked up once per admission by
the compiled core. The hashes stay in the trace's Arrow buffers (numpy views, one per chunk); the
offsets and prompt lengths come as plain int arrays, indexed without numpy scalars. `single_from(i)`:
where request i's singleton suffix starts (hashes no other request has; `workload.singleton_suffixes`).
"""

from __future__ import annotations

from array import array
from bisect import bisect_right
from typing import Any


class SegmentIndex:
    def __init__(
        self,
        firsts: list[int],
        offsets: list[array[int]],
        keys: list[Any],
        isl: array[int],
        trace_block: int,
        block_size: int,
        singles: array[int] | None = None,
    ) -> None:
        self.firsts = firsts  # first trace row of each chunk
        self.offsets = offsets  # per chunk: [rows + 1] into its keys (int32 or int64)
        self.keys = keys  # int64 chain hashes per chunk (numpy views)
        self.isl = isl
        self.trace_block = trace_block
        self.block_size = block_size
        self.singles = singles  # per request: its singleton suffix's first position (None: not computed)

    def single_from(self, i: int) -> int:
        """Where request i's singleton suffix starts (only when the index was built with them)."""
        assert self.singles is not None
        return self.singles[i]

    def of(self, i: int) -> tuple[list[int], list[int]]:
        """Request i's chain hashes and the engine-block end of each of their segments."""
        c = bisect_right(self.firsts, i) - 1 if len(self.firsts) > 1 else 0
        off = self.offsets[c]
        row = i - self.firsts[c]
        a, b = off[row], off[row + 1]
        keys: list[int] = self.keys[c][a:b].tolist()
        T, bs, m = self.trace_block, self.block_size, b - a
        cap = self.isl[i] // bs
        his: list[int] = []
        if T % bs == 0:  # multiples of T / bs, then the cap
            step = T // bs
            q = min(m, cap // step)
            for p in range(1, q + 1):
                his.append(p * step)
            for _ in range(m - q):
                his.append(cap)
        else:
            for p in range(1, m + 1):
                his.append(min(p * T // bs, cap))
        return keys, his
