"""The TP all-reduce as vLLM runs it: its one-shot custom kernel for small messages, a ring above.

vLLM's custom all-reduce (csrc/custom_all_reduce.cuh, `allreduce`) runs `cross_device_reduce_1stage` on
2 GPUs, and on a fully connected NVLink group below 512 KiB (up to 4 GPUs) or 256 KiB (up to 8); it runs
`cross_device_reduce_2stage` (reduce-scatter then all-gather) above, and the custom kernel takes messages
up to 8 MiB (`CustomAllreduce.max_size`), NCCL beyond. The one-shot kernel is one barrier, then each rank
reads the whole message of every peer: latency + (n-1) x bytes at the link's achieved bandwidth, a latency
that barely depends on n. The two-stage kernel has two such phases, each behind a barrier: twice the
latency, and 2(n-1)/n of the bytes as a ring moves them. Past 8 MiB NCCL's ring moves the same bytes,
which then take 40 us or more: its few microseconds of latency are within the fit's error there, and the
two-stage form stands for it (so the time never drops as a message grows; on H100 the form predicts vLLM's
timings from 2 to 8 GPUs and 256 B to 64 MiB within ~10% below 8 MiB, from one fitted latency). Over PCIe vLLM keeps its custom kernel for 2 GPUs only
(`CustomAllreduce.__init__`: "not supported on more than two PCIe-only GPUs"), and groups across nodes use
NCCL: there the ring.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from llmcap.perf.comm import Link, ring_allreduce_time
from llmcap.perf.model import F64

CUSTOM_MAX_BYTES = 8 * 1024 * 1024  # vLLM CustomAllreduce.max_size


def oneshot_max_bytes(ranks: int) -> float:
    """Messages below this many bytes take vLLM's one-shot kernel over a full NVLink group of `ranks` GPUs."""
    if ranks == 2:
        return float(CUSTOM_MAX_BYTES)
    if ranks <= 4:
        return 512.0 * 1024
    if ranks <= 8:
        return 256.0 * 1024
    return 0.0


def allreduce_time(message_bytes: ArrayLike, ranks: int, link: Link, oneshot_latency_s: float | None) -> F64:
    """All-reduce of `message_bytes` per rank as vLLM runs it where `oneshot_latency_s` is set (NVLink, or PCIe
    between 2 GPUs): one-shot below its threshold, two-stage above; else the ring."""
    ring = ring_allreduce_time(message_bytes, ranks, link)
    if oneshot_latency_s is None or ranks <= 1 or link.name == "nic" or (link.name == "pcie" and ranks > 2):
        return ring
    b = np.asarray(message_bytes, dtype=np.float64)
    oneshot = oneshot_latency_s + (ranks - 1) * b / link.bytes_s
    if link.name == "pcie":  # 2 GPUs: the custom kernel below its largest message, NCCL's ring above
        return np.where((b > 0) & (b < CUSTOM_MAX_BYTES), oneshot, ring)
    twostage = 2 * oneshot_latency_s + 2 * (ranks - 1) / ranks * b / link.bytes_s
    return np.where(b > 0, np.where(b < oneshot_max_bytes(ranks), oneshot, twostage), 0.0)
