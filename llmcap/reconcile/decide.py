"""The decision per bucket, with its reasoning: within tolerance / apply a correction factor /
re-profile / split the bucket (or: too few requests to judge).

The rule, on e = predicted / measured - 1 at the first reported percentile (`params.percentiles[0]`):
- a metric is *biased* in a bucket when |e| > tolerance and its confidence interval excludes 0;
  its speed ratio is measured / predicted = 1 / (1 + e) (a step-time factor: > 1 the engine is slower);
- the *main group* is the buckets whose TTFT and ITL ratios do not deviate from the request-weighted
  median ratio over all judged buckets (deviate: beyond median × (1 ± tolerance), with a confidence
  interval that excludes the median); the others deviate from the rest;
- re-profile, for every biased bucket, when the profile is stale (its fingerprint differs from the
  engine measured) or the engine's speed drifted within a run: a factor fitted now would not hold;
- otherwise, when most of the main group's requests are in biased buckets, one global correction
  (the median per-request measured / predicted ITL over the group, TTFT when only TTFT is biased) and
  decision "correct" for its biased buckets; its other buckets are within tolerance;
- a deviating bucket is split: its bias is confined to it, so it gets its own class instead of a
  factor for everyone. Where every judged bucket of its ISL range deviates alike, the split comes
  with a step-time correction for prefills reaching past that range's lower edge (relative to the
  global one).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from llmcap.perf.corrections import StepCorrection
from llmcap.reconcile.bias import Accounting, BucketBias
from llmcap.reconcile.drift import Drift
from llmcap.reconcile.params import ReconcileParams

DECISIONS = ("within_tolerance", "correct", "reprofile", "split", "too_few")


Correction = StepCorrection  # what reconciliation writes back (`llmcap.perf.corrections`)


@dataclass(frozen=True)
class BucketDecision:
    bias: BucketBias
    decision: str  # one of DECISIONS
    ratios: dict[str, float]  # metric -> measured / predicted at the deciding percentile
    biased: tuple[str, ...]  # metrics whose bias is beyond tolerance and significant
    reasoning: str


@dataclass(frozen=True)
class Reconciliation:
    accounting: Accounting
    decisions: list[BucketDecision]
    corrections: list[Correction]
    drifts: list[Drift]
    stale_fields: tuple[str, ...]
    percentile: float  # the deciding one
    tolerance: float

    def to_dict(self) -> dict:
        a = self.accounting
        return {
            "accounting": {
                "measured": a.measured,
                "predicted": a.predicted,
                "paired_ok": a.paired_ok,
                "only_measured": a.only_measured,
                "only_predicted": a.only_predicted,
                "not_ok": a.not_ok,
            },
            "deciding_percentile": self.percentile,
            "tolerance": self.tolerance,
            "stale_fields": list(self.stale_fields),
            "drifts": [
                {"run": d.run, "first": d.first, "second": d.second, "change": d.change, "requests": d.requests}
                for d in self.drifts
            ],
            "corrections": [c.model_dump(mode="json") for c in self.corrections],
            "buckets": [_bucket_dict(d) for d in self.decisions],
        }


def _bucket_dict(d: BucketDecision) -> dict:
    errors = {
        m: {
            f"p{q:g}": {
                "e": est.e,
                "ci": [est.low, est.high],
                "measured_s": est.measured_s,
                "predicted_s": est.predicted_s,
            }
            for q, est in by_q.items()
        }
        for m, by_q in d.bias.errors.items()
    }
    return {
        "bucket": d.bias.key,
        "requests": d.bias.requests,
        "decision": d.decision,
        "ratios": d.ratios,
        "biased": list(d.biased),
        "reasoning": d.reasoning,
        "errors": errors,
    }


def _ratio(b: BucketBias, metric: str, q: float) -> float:
    est = b.errors.get(metric, {}).get(q)
    return math.nan if est is None else 1.0 / (1.0 + est.e)


def _is_biased(b: BucketBias, metric: str, q: float, tol: float) -> bool:
    est = b.errors.get(metric, {}).get(q)
    return est is not None and abs(est.e) > tol and (est.low > 0 or est.high < 0)


def _deviates(b: BucketBias, metric: str, q: float, median: float, tol: float) -> bool:
    """Whether the bucket's measured / predicted is beyond median × (1 ± tol) and its interval excludes the median."""
    est = b.errors[metric][q]
    low, high = 1.0 / (1.0 + est.high), 1.0 / (1.0 + est.low)  # e's interval, as a ratio (decreasing in e)
    return abs(_ratio(b, metric, q) / median - 1.0) > tol and (low > median or high < median)


def _weighted_median(values: np.ndarray, weights: np.ndarray) -> float:
    order = np.argsort(values)
    cum = np.cumsum(weights[order])
    return float(values[order][np.searchsorted(cum, cum[-1] / 2.0)])


def _fmt_e(b: BucketBias, metric: str, q: float) -> str:
    est = b.errors[metric][q]
    return f"e_{metric.upper()} p{q:g} {est.e:+.1%} [{est.low:+.1%}, {est.high:+.1%}]"


@dataclass(frozen=True)
class _Grounds:
    """What every bucket's decision is judged on, beyond the bucket's own estimates."""

    q: float  # the deciding percentile
    tol: float
    params: ReconcileParams
    judged: set[int]  # id() of the buckets with enough requests and both estimates
    main: set[int]  # id() of the judged buckets that agree with the request-weighted medians
    medians: dict[str, float]  # metric -> the judged buckets' request-weighted median ratio
    stale_reason: str  # why a factor fitted now would not hold ("" when it would)
    global_factor: float  # 1.0 without a global correction
    global_applies: bool  # the first correction is the global one (min_context 0)
    range_factor: dict[tuple, float]  # ISL range -> its prefill correction, relative to the global one


def decide(
    biases: list[BucketBias],
    accounting: Accounting,
    params: ReconcileParams,
    drifts: list[Drift],
    stale_fields: tuple[str, ...] = (),
) -> Reconciliation:
    q, tol = params.percentiles[0], params.tolerance
    metrics = ("ttft", "itl")
    judged = [b for b in biases if b.requests >= params.min_requests and all(q in b.errors.get(m, {}) for m in metrics)]
    ratios = {id(b): {m: _ratio(b, m, q) for m in metrics} for b in biases}
    biased = {id(b): tuple(m for m in metrics if _is_biased(b, m, q, tol)) for b in biases}
    weights = np.array([b.requests for b in judged])
    medians = {
        m: _weighted_median(np.array([ratios[id(b)][m] for b in judged]), weights) if judged else 1.0 for m in metrics
    }
    main = {id(b) for b in judged if not any(_deviates(b, m, q, medians[m], tol) for m in metrics)}
    stale_reason = _stale_reason(stale_fields, [d for d in drifts if abs(d.change) > tol])
    corrections: list[Correction] = []
    global_factor = 1.0
    range_factor: dict[tuple, float] = {}
    if not stale_reason:
        found = _global_correction([b for b in judged if id(b) in main], biased)
        if found is not None:
            global_correction, global_factor = found
            corrections.append(global_correction)
        ranged = _range_corrections(judged, main, global_factor)
        range_factor = {rng: c.factor for rng, c in ranged.items()}
        corrections += ranged.values()
    grounds = _Grounds(
        q,
        tol,
        params,
        {id(b) for b in judged},
        main,
        medians,
        stale_reason,
        global_factor,
        bool(corrections) and corrections[0].min_context == 0,
        range_factor,
    )
    out = []
    for b in biases:
        decision, why = _decision(b, biased[id(b)], ratios[id(b)], grounds)
        out.append(BucketDecision(b, decision, ratios[id(b)], biased[id(b)], why))
    return Reconciliation(accounting, out, corrections, drifts, tuple(stale_fields), q, tol)


def _stale_reason(stale_fields: tuple[str, ...], drifting: list[Drift]) -> str:
    """Why a factor fitted now would not hold: a stale profile, or an engine whose speed drifted within a run."""
    if stale_fields:
        return f"the profile is stale: its fingerprint differs from the measured engine in {', '.join(stale_fields)}"
    if drifting:
        return (
            "the engine's speed drifted within a run ("
            + "; ".join(f"run {d.run}: ITL ratio {d.first:.3f} -> {d.second:.3f}, {d.change:+.1%}" for d in drifting)
            + ")"
        )
    return ""


def _global_correction(
    members: list[BucketBias], biased: dict[int, tuple[str, ...]]
) -> tuple[Correction, float] | None:
    """The correction of every step, and its factor, when most of the agreeing buckets' (`members`) requests are
    in biased buckets."""
    main_biased = [b for b in members if biased[id(b)]]
    main_requests = sum(b.requests for b in members)
    if not main_biased or 2 * sum(b.requests for b in main_biased) <= main_requests:
        return None
    # ITL when it is biased: decode gaps scale with step time almost one to one, while TTFT also
    # carries queueing, which a slower engine grows more than in proportion
    metric = "itl" if any("itl" in biased[id(b)] for b in main_biased) else "ttft"
    factor = float(np.median(np.concatenate([b.request_ratios[metric] for b in members])))
    correction = Correction(
        factor=factor,
        buckets=tuple(b.label for b in members),
        reasoning=(
            f"{len(main_biased)} of {len(members)} agreeing buckets ({sum(b.requests for b in main_biased)} of {main_requests} "
            f"requests) are biased alike: the engine ran {factor:.3f}x the profile's step times "
            f"(median measured/predicted {metric.upper()} per request over those buckets)"
        ),
    )
    return correction, factor


def _range_corrections(judged: list[BucketBias], main: set[int], global_factor: float) -> dict[tuple, Correction]:
    """A prefill correction per ISL range (above the first) whose every judged bucket deviates from the others."""
    out: dict[tuple, Correction] = {}
    for rng in sorted({b.isl_range for b in judged}):  # one range per lower edge: they sort by it
        same = [b for b in judged if b.isl_range == rng]
        if rng[0] == 0 or any(id(b) in main for b in same):
            continue  # the range's bias is not confined to the range as a whole (or some of it agrees)
        # fitted on TTFT: a range correction scales prefill steps only
        factor = float(np.median(np.concatenate([b.request_ratios["ttft"] for b in same]))) / global_factor
        out[rng] = Correction(
            factor=factor,
            min_context=rng[0],
            buckets=tuple(b.label for b in same),
            reasoning=(
                f"every judged bucket with ISL in [{rng[0]}, {'inf' if rng[1] is None else rng[1]}) deviates from the others: "
                f"prefill steps reaching past {rng[0]} tokens take {factor:.3f}x (on top of the global factor)"
            ),
        )
    return out


def _decision(b: BucketBias, bm: tuple[str, ...], r: dict[str, float], g: _Grounds) -> tuple[str, str]:
    """The bucket's decision (one of DECISIONS) and why, from its biased metrics `bm` and ratios `r`."""
    q, tol, params = g.q, g.tol, g.params
    errs = "; ".join(_fmt_e(b, m, q) for m in ("ttft", "itl") if q in b.errors.get(m, {}))
    if id(b) not in g.judged:
        return (
            "too_few",
            f"{b.requests} paired requests (< {params.min_requests}) or no ITL: not judged; {errs or 'no estimate'}",
        )
    if g.stale_reason and bm:
        return "reprofile", f"{errs}; biased, and {g.stale_reason}: re-profile instead of fitting a factor"
    if id(b) not in g.main and not g.stale_reason:
        rf = g.range_factor.get(b.isl_range)
        fix = (
            f"a correction of {rf:.3f}x for prefills past {b.isl_range[0]} tokens applies to its class only"
            if rf is not None
            else "its bias is not one of prompt length: plan it as its own class and look for the cause (tenant, model, routing)"
        )
        return (
            "split",
            (
                f"{errs}; ratios TTFT {r['ttft']:.3f} / ITL {r['itl']:.3f} deviate from the other buckets' "
                f"{g.medians['ttft']:.3f} / {g.medians['itl']:.3f} by more than {tol:.0%}: the bias is confined to "
                f"this bucket, so split it instead of a global factor; {fix}"
            ),
        )
    if bm and g.global_applies:
        return (
            "correct",
            f"{errs}; biased like the other agreeing buckets: the global correction {g.global_factor:.3f}x applies",
        )
    if bm:
        return (
            "within_tolerance",
            f"{errs}; biased, but in a minority of the agreeing buckets' requests: no factor for everyone",
        )
    return "within_tolerance", f"{errs}; within {tol:.0%} (or not significant at {params.confidence:.0%})"
