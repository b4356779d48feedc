"""Per-request outcome columns, filled in place while the simulation runs (NaN / -1 = not reached)."""

from __future__ import annotations

import numpy as np

OK, UNFINISHED, REJECTED = 0, 1, 2
STATUS_NAMES = ("ok", "unfinished", "rejected")


class Recorder:
    def __init__(self, n: int) -> None:
        nan = np.full(n, np.nan)
        self.admitted = nan.copy()
        self.first_token = nan.copy()
        self.prefill_done = nan.copy()
        self.decode_admitted = nan.copy()
        self.finish = nan.copy()
        self.transfer = nan.copy()
        self.post = nan.copy()  # P/D: prefill done -> its KV starts on the link
        self.itl_p50 = nan.copy()
        self.itl_p99 = nan.copy()
        self.itl_max = nan
        self.cached = np.zeros(n, dtype=np.int64)
        self.host_cached = np.zeros(n, dtype=np.int64)
        self.preemptions = np.zeros(n, dtype=np.int32)
        self.prefill_replica = np.full(n, -1, dtype=np.int32)
        self.decode_replica = np.full(n, -1, dtype=np.int32)
        self.status = np.full(n, UNFINISHED, dtype=np.int8)
        self.extra_gaps: list[float] = []  # token gaps not equal to a step's duration (resume, handoff)
