"""LRU stack distances of prefix blocks in one pass (Mattson et al., 1970), for every cache size at once.

A request looks all its blocks up first, then touches them in order (most recent last). A block found
at its lookup had `distance` other distinct blocks touched since its own last touch; an LRU cache of C
blocks holds it exactly when distance < C. So one pass gives the hits of every capacity.

A Fenwick tree over access positions marks each block's latest touch; the distance of a block last
touched at p is the number of marks after p. Compiled with mypyc (`llmcap._native`): this is a loop over
every block of the trace.
"""

from __future__ import annotations


def stack_distances(values: list[int], offsets: list[int]) -> list[int]:
    """For access i (block values[i] of request r, whose blocks are values[offsets[r]:offsets[r+1]]): the
    distinct blocks touched since the block's last touch before request r, or -1 if it had none."""
    n = len(values)
    marks = [0] * (n + 1)  # Fenwick tree, 1-based: 1 at each block's latest touch
    last: dict[int, int] = {}
    out = [-1] * n
    distinct = 0
    for r in range(len(offsets) - 1):
        lo, hi = offsets[r], offsets[r + 1]
        for i in range(lo, hi):  # lookups: the cache as the previous request left it
            p = last.get(values[i], -1)
            if p >= 0:
                before = 0
                j = p + 1
                while j > 0:
                    before += marks[j]
                    j -= j & -j
                out[i] = distinct - before
        for i in range(lo, hi):  # touches, in order
            block = values[i]
            p = last.get(block, -1)
            if p >= 0:
                j = p + 1
                while j <= n:
                    marks[j] -= 1
                    j += j & -j
            else:
                distinct += 1
            j = i + 1
            while j <= n:
                marks[j] += 1
                j += j & -j
            last[block] = i
    return out
