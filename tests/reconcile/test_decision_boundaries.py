"""The reconciliation rule at its edges, on hand-made bucket estimates (llmcap.reconcile.decide):
a metric is biased when |e| > tolerance AND its interval excludes 0; a bucket deviates from the others
when its ratio is beyond median × (1 ± tolerance) AND its ratio interval excludes the median. Each
clause is tested alone: just inside, just outside, and the interval deciding against |e|."""

from __future__ import annotations

import numpy as np
import pytest

from llmcap.reconcile.bias import Accounting, BucketBias, Estimate
from llmcap.reconcile.decide import decide
from llmcap.reconcile.params import ReconcileParams

TOL = 0.10
PARAMS = ReconcileParams(tolerance=TOL, percentiles=(50.0,), min_requests=20)
ACCOUNTING = Accounting(measured=0, predicted=0, paired_ok=0, only_measured=0, only_predicted=0, not_ok={})


def bucket(name: str, e: float, low: float, high: float, requests: int = 100, isl: tuple[int, int | None] = (0, 512),
           itl: tuple[float, float, float] = (0.0, -0.02, 0.02)) -> BucketBias:  # fmt: skip
    """A bucket whose TTFT error at p50 is e with interval [low, high] (ITL unbiased unless given)."""
    est = {"ttft": Estimate(e, low, high, 1.0, 1.0 + e), "itl": Estimate(*itl, 0.02, 0.02 * (1 + itl[0]))}
    ratios = {"ttft": np.full(requests, 1.0 / (1.0 + e)), "itl": np.full(requests, 1.0 / (1.0 + itl[0]))}
    return BucketBias({"isl": name}, requests, {m: {50.0: v} for m, v in est.items()}, isl, ratios)


def decided(*buckets: BucketBias) -> dict[str, tuple[str, tuple[str, ...]]]:
    rec = decide(list(buckets), ACCOUNTING, PARAMS, [])
    return {d.bias.key["isl"]: (d.decision, d.biased) for d in rec.decisions}


@pytest.mark.parametrize(
    ("e", "low", "high", "biased"),
    [
        (0.101, 0.05, 0.15, True),  # |e| just past 0.10, interval clear of 0
        (0.099, 0.05, 0.15, False),  # |e| just inside 0.10: within tolerance however sure
        (0.30, -0.001, 0.60, False),  # far past tolerance but the interval touches below 0: not significant
        (0.30, 0.001, 0.60, True),  # the same, the interval just clear of 0
        (-0.101, -0.15, -0.05, True),  # too fast: the upper end below 0 decides
        (-0.30, -0.60, 0.001, False),  # too fast, the interval just reaching past 0
    ],
)
def test_biased_needs_both_the_size_and_the_interval(e: float, low: float, high: float, biased: bool) -> None:
    # one bucket alone is its own median, so it never deviates: only the bias clause decides
    decision, metrics = decided(bucket("a", e, low, high))["a"]
    assert (metrics == ("ttft",)) is biased
    assert decision == ("correct" if biased else "within_tolerance")


def _others() -> list[BucketBias]:
    """Three agreeing, unbiased buckets of 300 requests: the weighted median ratio is 1.0."""
    return [bucket(n, 0.0, -0.02, 0.02, requests=300) for n in ("b", "c", "d")]


@pytest.mark.parametrize(
    ("e", "low", "high", "deviates"),
    [
        # ratio = 1/(1+e); its interval is [1/(1+high), 1/(1+low)]
        (-0.095, -0.12, -0.07, True),  # ratio 1.105 > 1.10, interval [1.075, 1.136] excludes 1.0
        (-0.085, -0.12, -0.07, False),  # ratio 1.093: inside 1 ± 0.10 even with a tight interval
        (-0.30, -0.40, 0.001, False),  # ratio 1.43 but interval [0.999, 1.667] holds the median: not confined
        (-0.30, -0.40, -0.001, True),  # interval [1.001, 1.667]: just clear of the median
        (0.20, 0.10, 0.30, True),  # slower than predicted the other way: ratio 0.833, interval [0.769, 0.909]
    ],
)
def test_a_bucket_deviates_only_beyond_tolerance_with_its_interval_clear_of_the_median(e: float, low: float, high: float, deviates: bool) -> None:
    out = decided(bucket("a", e, low, high), *_others())
    assert (out["a"][0] == "split") is deviates, out["a"]
    assert all(out[n][0] == "within_tolerance" for n in "bcd")


def test_the_reconciliation_document() -> None:
    # what `reconcile.json` and the MLflow run carry: every key other code and people read
    a, others = bucket("a", 0.20, 0.10, 0.30), _others()
    rec = decide([a, *others], Accounting(measured=10, predicted=11, paired_ok=9, only_measured=1, only_predicted=2,
                                          not_ok={"measured:unfinished": 1}), PARAMS, [])  # fmt: skip
    doc = rec.to_dict()
    assert list(doc) == ["accounting", "deciding_percentile", "tolerance", "stale_fields", "drifts", "corrections", "buckets"]
    assert doc["accounting"] == {"measured": 10, "predicted": 11, "paired_ok": 9, "only_measured": 1, "only_predicted": 2,
                                 "not_ok": {"measured:unfinished": 1}}  # fmt: skip
    assert (doc["deciding_percentile"], doc["tolerance"], doc["stale_fields"], doc["drifts"], doc["corrections"]) == (50.0, TOL, [], [], [])
    first = doc["buckets"][0]
    assert list(first) == ["bucket", "requests", "decision", "ratios", "biased", "reasoning", "errors"]
    assert (first["bucket"], first["requests"], first["decision"], first["biased"]) == ({"isl": "a"}, 100, "split", ["ttft"])
    assert first["ratios"] == pytest.approx({"ttft": 1 / 1.2, "itl": 1.0})
    est = first["errors"]["ttft"]["p50"]
    assert (est["e"], est["ci"], est["measured_s"], est["predicted_s"]) == (0.20, [0.10, 0.30], 1.0, 1.2)
    assert "e_TTFT p50 +20.0% [+10.0%, +30.0%]" in first["reasoning"] and "deviate from the other buckets'" in first["reasoning"]
