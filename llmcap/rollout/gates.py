"""The rollout's gates: what the candidate did over a window against what the simulator predicted
for the traffic share it had, each with a tolerance. A gate that lacks evidence (too few requests,
an absent metric) is reported as not judged, never as passed."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from llmcap.rollout.histogram import Buckets, of_values
from llmcap.rollout.observe import Observation
from llmcap.twin.metrics import ITL_BUCKETS, TTFT_BUCKETS

TTFT_BOUNDS = np.array([*TTFT_BUCKETS, np.inf])
ITL_BOUNDS = np.array([*ITL_BUCKETS, np.inf])


class Tolerances(BaseModel):
    """How far the observed may stray from the predicted before a step rolls back."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ttft_p99_rel: float = Field(0.5, ge=0, description="observed TTFT p99 <= predicted x (1 + this) + ttft_p99_abs_s")
    ttft_p99_abs_s: float = Field(0.05, ge=0)
    itl_p99_rel: float = Field(0.5, ge=0)
    itl_p99_abs_s: float = Field(0.02, ge=0)
    attainment_drop: float = Field(0.05, ge=0, le=1, description="observed TTFT attainment >= predicted - this")
    max_error_rate: float = Field(0.02, ge=0, le=1)
    kv_usage_abs: float = Field(0.2, ge=0, description="observed max KV usage <= predicted max + this")
    waiting_abs: float = Field(8.0, ge=0, description="observed max waiting <= predicted max + this")
    preemptions_per_request: float = Field(0.05, ge=0, description="above the predicted rate")
    min_requests: int = Field(20, ge=1, description="latency gates judge a window with at least this many requests")
    min_requests_errors: int = Field(5, ge=1, description="the error gate judges from this many")


@dataclass(frozen=True)
class Prediction:
    """The simulator's forecast for the candidate at one traffic share."""

    share: float
    requests: int
    ttft: Buckets  # through the gateway's bucket bounds, so both sides carry the same quantisation
    itl: Buckets
    kv_usage_max: float
    waiting_max: float
    preemptions_per_request: float

    @classmethod
    def from_values(
        cls,
        share: float,
        ttft_s: np.ndarray,
        itl_s: np.ndarray,
        itl_weights: np.ndarray,
        kv_usage_max: float,
        waiting_max: float,
        preemptions: int,
    ) -> Prediction:
        order = np.argsort(itl_s)
        cum = np.concatenate([[0.0], np.cumsum(np.asarray(itl_weights)[order])])  # float counts: the 0.0 makes them so
        itl = Buckets(ITL_BOUNDS, cum[np.searchsorted(np.asarray(itl_s)[order], ITL_BOUNDS, side="right")])
        n = int(np.asarray(ttft_s).size)
        return cls(
            share,
            n,
            of_values(ttft_s, TTFT_BOUNDS),
            itl,
            float(kv_usage_max),
            float(waiting_max),
            preemptions / n if n else 0.0,
        )

    def to_json(self) -> dict:
        """Finite bounds only (the +Inf bucket is implied: its count is the total)."""
        return {
            "share": self.share,
            "requests": self.requests,
            "kv_usage_max": self.kv_usage_max,
            "waiting_max": self.waiting_max,
            "preemptions_per_request": self.preemptions_per_request,
            "ttft": {"le": self.ttft.bounds[:-1].tolist(), "count": self.ttft.counts.tolist()},
            "itl": {"le": self.itl.bounds[:-1].tolist(), "count": self.itl.counts.tolist()},
        }

    @classmethod
    def from_json(cls, doc: dict) -> Prediction:
        def buckets(h: dict) -> Buckets:
            return Buckets(np.array([*h["le"], np.inf]), np.asarray(h["count"], dtype=np.float64))

        return cls(
            float(doc["share"]),
            int(doc["requests"]),
            buckets(doc["ttft"]),
            buckets(doc["itl"]),
            float(doc["kv_usage_max"]),
            float(doc["waiting_max"]),
            float(doc["preemptions_per_request"]),
        )


@dataclass(frozen=True)
class GateResult:
    gate: str
    observed: float | None
    limit: float
    passed: bool
    judged: bool
    predicted: float | None = None

    @property
    def excess(self) -> float | None:
        """How far past its limit the observation is (positive: a breach)."""
        if self.observed is None:
            return None
        return self.limit - self.observed if self.gate == "attainment" else self.observed - self.limit

    def describe(self) -> str:
        if not self.judged:
            return f"{self.gate}: not judged (too little evidence)"
        bound = ">=" if self.gate == "attainment" else "<="
        pred = "" if self.predicted is None else f", predicted {self.predicted:.4g}"
        if self.passed:
            return f"{self.gate}: observed {self.observed:.4g} within the limit {bound} {self.limit:.4g}{pred}: pass"
        return f"{self.gate}: observed {self.observed:.4g} breaks the limit {bound} {self.limit:.4g}{pred}: BREACH by {self.excess:.4g}"


def limits(pred: Prediction, tol: Tolerances, ttft_target_s: float) -> dict[str, tuple[str, float]]:
    """Gate -> (comparison, limit) for a step predicted as `pred`: the one definition the local gates
    (`evaluate`) and the exported AnalysisTemplates (`llmcap.rollout.export`) both use."""
    ttft, itl, att = pred.ttft.quantile(0.99), pred.itl.quantile(0.99), pred.ttft.fraction_at_most(ttft_target_s)
    return {
        "error_rate": ("<=", tol.max_error_rate),
        "ttft_p99": ("<=", (ttft or 0.0) * (1 + tol.ttft_p99_rel) + tol.ttft_p99_abs_s),
        "itl_p99": ("<=", (itl or 0.0) * (1 + tol.itl_p99_rel) + tol.itl_p99_abs_s),
        "attainment": (">=", (att if att is not None else 1.0) - tol.attainment_drop),
        "kv_usage": ("<=", pred.kv_usage_max + tol.kv_usage_abs),
        "waiting": ("<=", pred.waiting_max + tol.waiting_abs),
        "preemptions": ("<=", pred.preemptions_per_request + tol.preemptions_per_request),
    }


def evaluate(obs: Observation, pred: Prediction, tol: Tolerances, ttft_target_s: float) -> list[GateResult]:
    """Every gate's verdict on one window: judged only with enough requests (errors: `min_requests_errors`;
    the rest: `min_requests`) and an observation and prediction to compare."""
    limit = limits(pred, tol, ttft_target_s)
    enough = obs.requests >= tol.min_requests
    rate = None if obs.preemptions is None or obs.requests <= 0 else obs.preemptions / obs.requests
    seen: dict[str, tuple[float | None, float | None, bool]] = {  # gate -> (observed, predicted, enough evidence)
        "error_rate": (obs.error_rate, 0.0, obs.requests >= tol.min_requests_errors),
        "ttft_p99": (None if obs.ttft is None else obs.ttft.quantile(0.99), pred.ttft.quantile(0.99), enough),
        "itl_p99": (None if obs.itl is None else obs.itl.quantile(0.99), pred.itl.quantile(0.99), enough),
        "attainment": (
            None if obs.ttft is None else obs.ttft.fraction_at_most(ttft_target_s),
            pred.ttft.fraction_at_most(ttft_target_s),
            enough,
        ),
        "kv_usage": (obs.kv_usage_max, pred.kv_usage_max, enough),
        "waiting": (obs.waiting_max, pred.waiting_max, enough),
        "preemptions": (rate, pred.preemptions_per_request, enough),
    }
    out = []
    for gate, (observed, predicted, evidence) in seen.items():
        op, bound = limit[gate]
        judged = evidence and observed is not None and predicted is not None
        held = observed is None or (observed >= bound if op == ">=" else observed <= bound)
        out.append(GateResult(gate, observed, bound, not judged or held, judged, predicted))
    return out
