"""Shared timing helper of the benchmarks."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

REPEATS = 3


def best_of(fn: Callable[[], Any], repeats: int = REPEATS) -> tuple[float, Any]:
    """The fastest of `repeats` runs (seconds) and the last run's result: the least noisy figure on a shared box."""
    best, result = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result
