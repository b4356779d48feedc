"""`weighted_quantiles` (binned selection) against the definition computed by one full sort."""

from __future__ import annotations

import numpy as np
import pytest

from llmcap.sim import weighted_quantiles

QS = [0.0, 1e-6, 0.5, 0.9, 0.99, 0.999999, 1.0]


def by_full_sort(values: np.ndarray, weights: np.ndarray, qs: list[float]) -> list[float]:
    """The smallest value whose cumulative weight (values ascending) reaches q·W."""
    order = np.argsort(values, kind="stable")
    v, cw = values[order], np.cumsum(weights[order])
    return [float(v[min(int(np.searchsorted(cw, q * cw[-1], side="left")), v.size - 1)]) for q in qs]


def _samples(rng: np.random.Generator):
    n = 200_000  # above the size where the binned path takes over
    yield "lognormal", rng.lognormal(-5, 1, n), rng.integers(0, 50, n)
    yield "few distinct values", rng.choice([0.001, 0.002, 0.0025, 0.1], n), rng.integers(0, 3, n)
    # almost everything in one bin (a tight decode band) and a far tail: the selected bin is huge
    tight = 0.005 + rng.random(n) * 1e-9
    tight[:10] = 50.0
    yield "one dense bin and a tail", tight, rng.integers(1, 4, n)
    w = rng.integers(0, 2, n)
    w[: n // 2] = 0  # zero-weight values count for nothing
    yield "half zero weights", rng.random(n), w
    yield "all equal", np.full(n, 0.003), rng.integers(1, 9, n)
    yield "small sample", rng.random(500), rng.integers(1, 9, 500)


@pytest.mark.parametrize("seed", range(3))
def test_binned_selection_equals_a_full_sort(seed: int) -> None:
    for name, v, w in _samples(np.random.default_rng(seed)):
        assert weighted_quantiles(v, w, QS) == by_full_sort(v, w, QS), name


def test_empty_or_weightless_sample_is_nan() -> None:
    assert all(np.isnan(weighted_quantiles(np.array([]), np.array([], dtype=np.int64), [0.5])))
    assert all(np.isnan(weighted_quantiles(np.array([1.0, 2.0]), np.zeros(2, dtype=np.int64), [0.5])))
