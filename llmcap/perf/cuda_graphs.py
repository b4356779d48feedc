"""CUDA-graph padding: a step small enough to replay a captured graph runs at the next captured size.

vLLM captures graphs for 1, 2, 4, then multiples of 8 below 256, then multiples of 16 up to its largest
size, min(2 x max_num_seqs, 512) by default (vllm/config/vllm.py, `_set_cudagraph_sizes`), and pads a
step's token rows to the smallest captured size that holds them (`pad_for_cudagraph`), in full-graph
decode steps and piecewise mixed steps alike. The padded rows go through every layer's GEMMs, norms and
all-reduces; attention and the logits see only the real ones. Steps above the largest size run unpadded.
"""

from __future__ import annotations

from functools import cache

import numpy as np
from numpy.typing import ArrayLike

from llmcap.perf.model import F64


@cache
def capture_sizes(max_tokens: int) -> F64:
    """vLLM's default ladder of captured sizes up to `max_tokens` (empty for 0)."""
    ladder = [1, 2, 4, *range(8, 256, 8), *range(256, max_tokens + 1, 16)]
    return np.array([s for s in ladder if s <= max_tokens], dtype=np.float64)


def padded_rows(rows: ArrayLike, max_tokens: int) -> F64:
    """Token rows each step runs with: the next captured size at or above `rows`, when one exists; else `rows`."""
    r = np.asarray(rows, dtype=np.float64)
    sizes = capture_sizes(max_tokens)
    if sizes.size == 0:
        return r
    i = np.minimum(np.searchsorted(sizes, r, side="left"), sizes.size - 1)
    return np.where((r > 0) & (r <= sizes[-1]), sizes[i], r)
