"""Prometheus histograms read the way PromQL reads them: bucket deltas over a window, and
`histogram_quantile`'s interpolation within the bucket that holds the rank. A gate that reads an
engine's /metrics directly and one that asks a Prometheus server therefore compute the same number."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from prometheus_client.parser import text_string_to_metric_families


@dataclass(frozen=True)
class Buckets:
    """Cumulative counts per upper bound (the last bound is +Inf)."""

    bounds: np.ndarray
    counts: np.ndarray

    @property
    def total(self) -> float:
        return float(self.counts[-1]) if self.counts.size else 0.0

    def minus(self, earlier: Buckets | None) -> Buckets:
        """What was observed between `earlier` and this (a counter reset counts from zero, as in PromQL)."""
        if earlier is None or not np.array_equal(earlier.bounds, self.bounds) or (self.counts < earlier.counts).any():
            return self
        return Buckets(self.bounds, self.counts - earlier.counts)

    def quantile(self, q: float) -> float | None:
        """PromQL's `histogram_quantile(q, ...)`; None without observations. A rank in the +Inf bucket
        reads as the largest finite bound, as Prometheus does."""
        total = self.total
        if total <= 0:
            return None
        rank = q * total
        i = int(np.searchsorted(self.counts, rank, side="left"))
        if i >= self.bounds.size - 1:
            return float(self.bounds[-2])
        upper = float(self.bounds[i])
        lower, below = (0.0, 0.0) if i == 0 else (float(self.bounds[i - 1]), float(self.counts[i - 1]))
        inside = float(self.counts[i]) - below
        return upper if inside <= 0 else lower + (upper - lower) * (rank - below) / inside

    def fraction_at_most(self, x: float) -> float | None:
        """Share of observations <= x, interpolated linearly within x's bucket (None without any)."""
        total = self.total
        if total <= 0:
            return None
        i = int(np.searchsorted(self.bounds, x, side="left"))
        if i >= self.bounds.size - 1:
            return float(self.counts[-2]) / total if x < math.inf else 1.0
        lower, below = (0.0, 0.0) if i == 0 else (float(self.bounds[i - 1]), float(self.counts[i - 1]))
        upper = float(self.bounds[i])
        share = 1.0 if upper <= lower else (x - lower) / (upper - lower)
        return (below + share * (float(self.counts[i]) - below)) / total


def histogram(text: str, name: str, labels: dict[str, str] | None = None) -> Buckets | None:
    """The histogram `name` in a /metrics text, summed over the series whose labels include `labels`."""
    by_bound: dict[float, float] = {}
    want = labels or {}
    for family in text_string_to_metric_families(text):
        if family.name != name:
            continue
        for s in family.samples:
            if s.name == f"{name}_bucket" and all(s.labels.get(k) == v for k, v in want.items()):
                le = float(s.labels["le"])
                by_bound[le] = by_bound.get(le, 0.0) + float(s.value)
    if not by_bound:
        return None
    bounds = np.array(sorted(by_bound), dtype=np.float64)
    return Buckets(bounds, np.array([by_bound[b] for b in bounds], dtype=np.float64))


def of_values(values: np.ndarray, bounds: np.ndarray) -> Buckets:
    """The histogram a Prometheus client would hold after observing `values` (le: value <= bound)."""
    v = np.sort(np.asarray(values, dtype=np.float64))
    return Buckets(bounds, np.searchsorted(v, bounds, side="right").astype(np.float64))
