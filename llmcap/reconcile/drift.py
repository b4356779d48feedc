"""Did the engine's speed move during the measurement? Compares the first and second half of each run.

Per request, measured / predicted ITL (mean gap) says how much slower than the profile the engine
decoded it; a simulator that tracks batching and queueing keeps this ratio flat over a run when the
engine's speed is steady. A median that moves between the run's first and second half by more than
the tolerance is drift: a correction fitted over the run would be right at neither end.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa


@dataclass(frozen=True)
class Drift:
    run: str  # the replay's run label ("all" without a run column)
    first: float  # median measured / predicted ITL, first half of the run's requests by arrival
    second: float  # ... second half
    requests: int

    @property
    def change(self) -> float:
        return self.second / self.first - 1.0


def speed_drifts(measured: pa.Table, predicted: pa.Table, min_requests: int) -> list[Drift]:
    """Per run with at least 2 × min_requests ITL ratios (paired tables, as `bias.pair` returns them)."""
    runs = (
        [str(r) for r in measured.column("run").to_pylist()]
        if "run" in measured.column_names
        else ["all"] * measured.num_rows
    )
    ratio = measured.column("tpot_s").to_numpy(zero_copy_only=False).astype(np.float64) / predicted.column(
        "tpot_s"
    ).to_numpy(zero_copy_only=False).astype(np.float64)
    arrival = measured.column("arrival_s").to_numpy()
    labels = np.asarray(runs)
    out = []
    for run in sorted(set(runs)):
        sel = np.flatnonzero((labels == run) & np.isfinite(ratio))
        if sel.size < 2 * min_requests:
            continue
        r = ratio[sel[np.argsort(arrival[sel], kind="stable")]]
        half = r.size // 2
        out.append(Drift(run, float(np.median(r[:half])), float(np.median(r[half:])), int(r.size)))
    return out
