"""The reconciliation rule at its edges, on hand-made bucket estimates (llmcap.reconcile.decide):
a metric is biased when |e| > tolerance AND its interval excludes 0; a bucket deviates from the others
when its ratio is beyond median × (1 ± tolerance) AND its ratio interval excludes the median. Each
clause is tested alone: just inside, just outside, and the interval deciding against |e|."""

from __future__ import annotations

import numpy as np
import pytest

from llmcap.reconcile.bias import Accounting, BucketBias, Estimate
from llmcap.reconcile.decide import decide
from llmcap.reconcile.drift import Drift
from llmcap.reconcile.params import ReconcileParams

TOL = 0.10
PARAMS = ReconcileParams(tolerance=TOL, percentiles=(50.0,), min_requests=20)
ACCOUNTING = Accounting(measured=0, predicted=0, paired_ok=0, only_measured=0, only_predicted=0, not_ok={})


def bucket(
    name: str,
    e: float,
    low: float,
    high: float,
    requests: int = 100,
    isl: tuple[int, int | None] = (0, 512),
    itl: tuple[float, float, float] = (0.0, -0.02, 0.02),
) -> BucketBias:
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
        (0.10, 0.05, 0.15, False),  # |e| exactly at the tolerance: not past it
        (0.30, 0.0, 0.60, False),  # the interval's lower end on 0: it does not exclude 0
        (-0.30, -0.60, 0.0, False),  # the upper end on 0, likewise
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
        (-0.30, -0.40, 0.0, False),  # interval [1/(1+0) = 1.0, 1.667]: its lower end on the median does not exclude it
        (0.30, 0.0, 0.50, False),  # interval [0.667, 1/(1+0) = 1.0]: its upper end on the median, likewise
    ],
)
def test_a_bucket_deviates_only_beyond_tolerance_with_its_interval_clear_of_the_median(
    e: float, low: float, high: float, deviates: bool
) -> None:
    out = decided(bucket("a", e, low, high), *_others())
    assert (out["a"][0] == "split") is deviates, out["a"]
    assert all(out[n][0] == "within_tolerance" for n in "bcd")


def test_the_reconciliation_document() -> None:
    # what `reconcile.json` and the MLflow run carry: every key other code and people read
    a, others = bucket("a", 0.20, 0.10, 0.30), _others()
    rec = decide(
        [a, *others],
        Accounting(
            measured=10, predicted=11, paired_ok=9, only_measured=1, only_predicted=2, not_ok={"measured:unfinished": 1}
        ),
        PARAMS,
        [],
    )
    doc = rec.to_dict()
    assert list(doc) == [
        "accounting",
        "deciding_percentile",
        "tolerance",
        "stale_fields",
        "drifts",
        "corrections",
        "buckets",
    ]
    assert doc["accounting"] == {
        "measured": 10,
        "predicted": 11,
        "paired_ok": 9,
        "only_measured": 1,
        "only_predicted": 2,
        "not_ok": {"measured:unfinished": 1},
    }
    assert (doc["deciding_percentile"], doc["tolerance"], doc["stale_fields"], doc["drifts"], doc["corrections"]) == (
        50.0,
        TOL,
        [],
        [],
        [],
    )
    first = doc["buckets"][0]
    assert list(first) == ["bucket", "requests", "decision", "ratios", "biased", "reasoning", "errors"]
    assert (first["bucket"], first["requests"], first["decision"], first["biased"]) == (
        {"isl": "a"},
        100,
        "split",
        ["ttft"],
    )
    assert first["ratios"] == pytest.approx({"ttft": 1 / 1.2, "itl": 1.0})
    est = first["errors"]["ttft"]["p50"]
    assert (est["e"], est["ci"], est["measured_s"], est["predicted_s"]) == (0.20, [0.10, 0.30], 1.0, 1.2)
    assert (
        "e_TTFT p50 +20.0% [+10.0%, +30.0%]" in first["reasoning"]
        and "deviate from the other buckets'" in first["reasoning"]
    )


def test_a_ratio_exactly_at_the_tolerance_from_the_median_does_not_deviate() -> None:
    # tolerance 0.5 (exact in binary): e = 1.0 is a ratio of 1/(1+1) = 0.5, and |0.5 / 1.0 - 1| = 0.5 is not past 0.5
    params = ReconcileParams(tolerance=0.5, percentiles=(50.0,), min_requests=20)
    at = decide([bucket("a", 1.0, 0.9, 1.1), *_others()], ACCOUNTING, params, [])
    (a, *rest) = at.decisions
    # a is biased (|1.0| > 0.5, interval clear of 0) but agrees with the others: 100 of 1000 requests, a minority
    assert (a.decision, a.biased) == ("within_tolerance", ("ttft",)) and at.corrections == []
    assert "biased, but in a minority of the agreeing buckets' requests" in a.reasoning
    # e = 1.01: ratio 1/2.01 = 0.4975, |0.4975 - 1| = 0.5025 > 0.5
    past = decide([bucket("a", 1.01, 0.9, 1.1), *_others()], ACCOUNTING, params, []).decisions[0]
    assert past.decision == "split"


def test_deviation_is_relative_to_the_median_not_to_one() -> None:
    # three buckets at ratio 2.0 (e = -0.5): the median is 2.0. A bucket at ratio 2.1 is 2.1 / 2.0 - 1 = 5% off it
    # (inside 10%, though its ratio interval [2.05, 2.15] excludes 2.0): it agrees; everyone is biased alike
    others = [bucket(n, -0.5, -0.52, -0.48, requests=300) for n in ("b", "c", "d")]
    close = bucket("a", 1 / 2.1 - 1, 1 / 2.05 - 1, 1 / 2.15 - 1)  # e's interval, from the ratio's [2.05, 2.15]
    rec = decide([close, *others], ACCOUNTING, PARAMS, [])
    assert [d.decision for d in rec.decisions] == ["correct"] * 4
    # TTFT only biased: the factor is the median per-request TTFT ratio, 2.0 for 900 of the 1000 requests
    assert [(c.min_context, c.factor) for c in rec.corrections] == [(0, pytest.approx(2.0))]
    # at ratio 2.3 it is 15% off the median: it deviates
    far = bucket("a", 1 / 2.3 - 1, 1 / 2.25 - 1, 1 / 2.35 - 1)
    assert decided(far, *others)["a"][0] == "split"


def _at(name: str, ratio: float, requests: int = 100, isl: tuple[int, int | None] = (0, 512)) -> BucketBias:
    """A bucket whose measured / predicted TTFT is `ratio`, e's interval ± 0.01 (tight: the interval never decides)."""
    e = 1 / ratio - 1
    return bucket(name, e, e - 0.01, e + 0.01, requests=requests, isl=isl)


def test_the_median_is_the_request_weighted_middle() -> None:
    # ratios 1.0, 1.3, 1.6 with 100 requests each: the middle is 1.3; 1.0 and 1.6 are 23% off it (1/1.3, 1.6/1.3)
    out = decided(_at("x", 1.0), _at("y", 1.3), _at("z", 1.6))
    assert out == {"x": ("split", ()), "y": ("correct", ("ttft",)), "z": ("split", ("ttft",))}
    # 300 requests at 1.0 outweigh the other 200: the median is 1.0, so 1.3 and 1.6 deviate from it
    out = decided(_at("x", 1.0, requests=300), _at("y", 1.3), _at("z", 1.6))
    assert out == {"x": ("within_tolerance", ()), "y": ("split", ("ttft",)), "z": ("split", ("ttft",))}


def test_too_few_requests_or_no_itl_is_not_judged() -> None:
    small, edge = bucket("small", 0.2, 0.1, 0.3, requests=19), bucket("edge", 0.2, 0.1, 0.3, requests=20)
    no_itl = BucketBias({"isl": "no_itl"}, 100, {"ttft": {50.0: Estimate(0.2, 0.1, 0.3, 1.0, 1.2)}}, (0, 512))
    nothing = BucketBias({"isl": "nothing"}, 0, {}, (0, 512))
    rec = decide([small, edge, no_itl, nothing], ACCOUNTING, PARAMS, [])
    d = {x.bias.key["isl"]: x for x in rec.decisions}
    # min_requests 20: 19 is too few, 20 is enough (judged alone: biased, a correction for everyone)
    assert {k: x.decision for k, x in d.items()} == {
        "small": "too_few",
        "edge": "correct",
        "no_itl": "too_few",
        "nothing": "too_few",
    }
    assert d["small"].reasoning == (
        "19 paired requests (< 20) or no ITL: not judged; e_TTFT p50 +20.0% [+10.0%, +30.0%]; "
        "e_ITL p50 +0.0% [-2.0%, +2.0%]"
    )
    assert (
        d["no_itl"].reasoning == "100 paired requests (< 20) or no ITL: not judged; e_TTFT p50 +20.0% [+10.0%, +30.0%]"
    )
    assert d["nothing"].reasoning == "0 paired requests (< 20) or no ITL: not judged; no estimate"
    assert (
        d["no_itl"].ratios["ttft"] == pytest.approx(1 / 1.2)
        and np.isnan(d["no_itl"].ratios["itl"])
        and d["no_itl"].biased == ("ttft",)
    )
    assert np.isnan(d["nothing"].ratios["ttft"]) and d["nothing"].biased == ()
    # nothing judged at all: no median to take, no correction
    alone = decide([small, nothing], ACCOUNTING, PARAMS, [])
    assert [x.decision for x in alone.decisions] == ["too_few", "too_few"] and alone.corrections == []


def test_a_global_correction_needs_more_than_half_of_the_agreeing_requests() -> None:
    # "b" biased (|0.105| > 0.10, interval clear of 0), "u" not (0.095); their ratios 1/1.105 and 1/1.095 agree within 1%
    def two(biased_requests: int):
        b = bucket("b", 0.105, 0.08, 0.13, requests=biased_requests)
        u = bucket("u", 0.095, 0.07, 0.12, requests=100)
        return decide([b, u], ACCOUNTING, PARAMS, [])

    half = two(100)  # 2 x 100 = 200 is not more than 200: no factor for everyone
    assert [(d.decision, d.biased) for d in half.decisions] == [
        ("within_tolerance", ("ttft",)),
        ("within_tolerance", ()),
    ]
    assert half.corrections == [] and "in a minority of the agreeing buckets' requests" in half.decisions[0].reasoning
    more = two(101)  # 2 x 101 = 202 > 201
    assert [d.decision for d in more.decisions] == ["correct", "within_tolerance"]
    (c,) = more.corrections
    # TTFT only biased: the median of 101 ratios 1/1.105 and 100 ratios 1/1.095 (the 101st value, in order) is 1/1.105
    assert (c.min_context, c.buckets) == (0, ("isl=b", "isl=u")) and c.factor == pytest.approx(1 / 1.105)
    assert c.reasoning.startswith(
        "1 of 2 agreeing buckets (101 of 201 requests) are biased alike: the engine ran 0.905x"
    )
    assert c.reasoning.endswith("(median measured/predicted TTFT per request over those buckets)")
    assert "the global correction 0.905x applies" in more.decisions[0].reasoning


def test_the_global_factor_is_fitted_on_itl_when_itl_is_biased() -> None:
    # TTFT ratio 1/(1-0.25) = 1.333 and ITL ratio 1/(1-1/6) = 1.2 in all three buckets: ITL decides the factor
    both = [bucket(n, -0.25, -0.3, -0.2, itl=(-1 / 6, -0.2, -0.13)) for n in "abc"]
    (c,) = decide(both, ACCOUNTING, PARAMS, []).corrections
    assert c.factor == pytest.approx(1.2) and "median measured/predicted ITL per request" in c.reasoning
    # ITL within tolerance: TTFT's 1.333
    ttft_only = [bucket(n, -0.25, -0.3, -0.2) for n in "abc"]
    (c,) = decide(ttft_only, ACCOUNTING, PARAMS, []).corrections
    assert c.factor == pytest.approx(4 / 3) and "median measured/predicted TTFT per request" in c.reasoning


def test_a_range_correction_only_for_ranges_that_deviate_as_a_whole() -> None:
    # the agreeing group: three buckets at ratio 1.2 in ISL [1024, 8192), 900 of the 1300 requests, so the median is 1.2
    # and the global factor 1.2. Deviating (> 10% off 1.2): "short" (0.6, alone in [0, 1024): a range from 0 is no
    # prefill correction), "mid" (2.4, shares its range with the agreeing group), "long" (1.8, alone in [8192, 32768))
    # and "huge" (2.4, alone in [32768, inf)). Range factors, relative to the global one: 1.8 / 1.2 = 1.5, 2.4 / 1.2 = 2.0
    main = [_at(n, 1.2, requests=300, isl=(1024, 8192)) for n in ("m1", "m2", "m3")]
    short, mid = _at("short", 0.6, isl=(0, 1024)), _at("mid", 2.4, isl=(1024, 8192))
    long, huge = _at("long", 1.8, isl=(8192, 32768)), _at("huge", 2.4, isl=(32768, None))
    rec = decide([short, *main, mid, long, huge], ACCOUNTING, PARAMS, [])
    assert [(c.min_context, c.factor, c.buckets) for c in rec.corrections] == [
        (0, pytest.approx(1.2), ("isl=m1", "isl=m2", "isl=m3")),
        (8192, pytest.approx(1.5), ("isl=long",)),
        (32768, pytest.approx(2.0), ("isl=huge",)),
    ]
    assert rec.corrections[1].reasoning == (
        "every judged bucket with ISL in [8192, 32768) deviates from the others: "
        "prefill steps reaching past 8192 tokens take 1.500x (on top of the global factor)"
    )
    assert rec.corrections[2].reasoning.startswith(
        "every judged bucket with ISL in [32768, inf) deviates from the others"
    )
    d = {x.bias.key["isl"]: x for x in rec.decisions}
    assert {k: x.decision for k, x in d.items()} == {
        "short": "split",
        "m1": "correct",
        "m2": "correct",
        "m3": "correct",
        "mid": "split",
        "long": "split",
        "huge": "split",
    }
    not_length = (
        "its bias is not one of prompt length: plan it as its own class and look for the cause (tenant, model, routing)"
    )
    assert d["short"].reasoning.endswith(not_length) and d["mid"].reasoning.endswith(not_length)
    assert d["long"].reasoning.endswith(
        "a correction of 1.500x for prefills past 8192 tokens applies to its class only"
    )
    assert d["huge"].reasoning.endswith(
        "a correction of 2.000x for prefills past 32768 tokens applies to its class only"
    )
    assert d["m1"].reasoning.endswith("biased like the other agreeing buckets: the global correction 1.200x applies")


def test_a_drift_exactly_at_the_tolerance_is_no_drift() -> None:
    # tolerance 0.25: a run whose ITL ratio went 1.0 -> 1.25 changed by exactly 25%, not more; 1.25 + 2^-20 is past it
    params = ReconcileParams(tolerance=0.25, percentiles=(50.0,), min_requests=20)
    biased = [bucket(n, -0.3, -0.35, -0.25) for n in "abc"]  # |e| 0.3 > 0.25, interval below 0
    steady = decide(biased, ACCOUNTING, params, [Drift("1.0x", 1.0, 1.25, 400)])
    assert [d.decision for d in steady.decisions] == ["correct"] * 3 and len(steady.corrections) == 1
    moved = decide(biased, ACCOUNTING, params, [Drift("1.0x", 1.0, 1.25 + 2**-20, 400)])
    assert [d.decision for d in moved.decisions] == ["reprofile"] * 3 and moved.corrections == []
    assert (
        "the engine's speed drifted within a run (run 1.0x: ITL ratio 1.000 -> 1.250, +25.0%)"
        in moved.decisions[0].reasoning
    )
    two = decide(
        biased,
        ACCOUNTING,
        params,
        [Drift("0.8x", 1.0, 0.5, 400), Drift("1.0x", 1.0, 1.25, 400), Drift("1.2x", 1.0, 1.5, 400)],
    )
    assert (
        "the engine's speed drifted within a run (run 0.8x: ITL ratio 1.000 -> 0.500, -50.0%; "
        "run 1.2x: ITL ratio 1.000 -> 1.500, +50.0%)"
    ) in two.decisions[0].reasoning
    doc = steady.to_dict()
    assert doc["drifts"] == [{"run": "1.0x", "first": 1.0, "second": 1.25, "change": 0.25, "requests": 400}]
    # the corrections as JSON: the buckets a list, as json.dumps writes them
    assert doc["corrections"][0]["buckets"] == ["isl=a", "isl=b", "isl=c"] and doc["corrections"][0]["min_context"] == 0


def test_a_stale_profile_names_every_field_that_differs() -> None:
    rec = decide(
        [bucket(n, 0.2, 0.1, 0.3) for n in "ab"], ACCOUNTING, PARAMS, [], stale_fields=("engine_version", "gpu")
    )
    assert [d.decision for d in rec.decisions] == ["reprofile"] * 2 and rec.corrections == []
    assert (
        "the profile is stale: its fingerprint differs from the measured engine in engine_version, gpu"
        in rec.decisions[0].reasoning
    )
