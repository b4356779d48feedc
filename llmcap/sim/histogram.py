"""The ITL histogram of the simulator's histogram mode: token counts in log-spaced bins (a long run's step log
folded as it goes, see `llmcap.sim.steplog`)."""

from __future__ import annotations

import numpy as np

HIST_BINS_PER_DECADE = 1000  # bins 0.23% wide
HIST_MIN_S, HIST_DECADES = 1e-7, 12  # 0.1 µs .. 1e5 s


def itl_histogram(durations: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Token counts per log-spaced ITL bin (bin i covers [HIST_MIN_S·10^(i/B), HIST_MIN_S·10^((i+1)/B)))."""
    n = HIST_BINS_PER_DECADE * HIST_DECADES
    with np.errstate(divide="ignore"):
        idx = np.floor(np.log10(np.maximum(durations, HIST_MIN_S) / HIST_MIN_S) * HIST_BINS_PER_DECADE)
    idx = np.clip(idx, 0, n - 1).astype(np.int64)
    return np.bincount(idx, weights=weights.astype(np.float64), minlength=n).astype(np.int64)
