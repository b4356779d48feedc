"""Fit a `LinearStepModel` to measured step observations by non-negative least squares.

An observation is a measured duration and the batch terms it covered, summed over the engine steps
it spans (the `overhead` term counts those steps). Two kinds come out of an endpoint profile:

- prefill: one request alone, TTFT ≈ client/HTTP overhead + the prefill steps of its ISL (split
  into chunks of max_num_batched_tokens when the engine chunks) — the `client` column carries the
  per-request overhead, fitted alongside the step terms;
- decode: with c sequences all decoding, each inter-token gap ≈ one decode step of c sequences at
  their current contexts (the observation is the mean gap, its terms those of the mean step).

Residuals are relative (each row divided by its measured time): a 5 ms decode step and a 500 ms
prefill count alike. A term whose column adds no rank (e.g. `prefill_seqs` when every prefill is
one sequence, which the client column already spans) is left at 0 rather than split arbitrarily.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import numpy as np
from numpy.typing import ArrayLike

from llmcap.perf.model import F64, LinearStepModel, StepBatch, decode_step_time, prefill_time

TERMS = (*LinearStepModel.TERMS, "client")
PREFILL_TERMS = (
    "prefill_tokens",
    "prefill_pairs",
    "prefill_seqs",
)  # design columns: step terms, then per-request overhead
FIT_ORDER = ("overhead", "client", "prefill_tokens", "decode_seqs", "decode_context", "prefill_pairs", "prefill_seqs")


@dataclass(frozen=True)
class StepObservations:
    """n measured durations with the summed batch terms each covers (float64 arrays of length n)."""

    steps: F64  # engine steps the duration spans (coefficient: overhead_s)
    prefill_tokens: F64
    prefill_pairs: F64
    prefill_seqs: F64
    decode_seqs: F64
    decode_context: F64
    client: F64  # 1 where the duration includes one request's client/HTTP overhead (a TTFT)
    seconds: F64  # measured

    def __post_init__(self) -> None:
        n = None
        for f in fields(self):
            a = np.atleast_1d(np.asarray(getattr(self, f.name), dtype=np.float64))
            object.__setattr__(self, f.name, a)
            if n is not None and a.size != n:
                raise ValueError(f"StepObservations.{f.name} has {a.size} entries, expected {n}")
            n = a.size

    def __len__(self) -> int:
        return int(self.seconds.size)

    def design(self) -> F64:
        """n × 7 matrix in `TERMS` order."""
        return np.column_stack([getattr(self, f.name) for f in fields(self) if f.name != "seconds"])

    @classmethod
    def concat(cls, parts: list[StepObservations]) -> StepObservations:
        return cls(*(np.concatenate([getattr(p, f.name) for p in parts]) for f in fields(cls)))

    @classmethod
    def from_design(cls, design: ArrayLike, seconds: ArrayLike) -> StepObservations:
        d = np.asarray(design, dtype=np.float64).reshape(-1, len(TERMS))
        return cls(*(d[:, i] for i in range(len(TERMS))), seconds=np.asarray(seconds, dtype=np.float64))  # type: ignore[misc]  # mypy cannot count the generator: it fills the fields before seconds


class _Column:
    """A StepTimeModel whose 'step time' is one design column: sums that column over chunked steps."""

    def __init__(self, k: int) -> None:
        self.k = k

    def step_time(self, batch: StepBatch) -> F64:
        return LinearStepModel.design(batch)[:, self.k]


def prefill_observations(
    isl: ArrayLike, seconds: ArrayLike, chunk: int | None = None, cached: ArrayLike = 0.0
) -> StepObservations:
    """Single-request TTFTs: the prefill steps of each prompt (chunked like the engine) + client overhead."""
    cols = [prefill_time(_Column(k), isl, cached, chunk=chunk) for k in range(len(LinearStepModel.TERMS))]
    design = np.column_stack([*cols, np.ones_like(cols[0])])
    return StepObservations.from_design(design, seconds)


def decode_observations(batch_size: ArrayLike, mean_context: ArrayLike, seconds: ArrayLike) -> StepObservations:
    """Mean inter-token gaps of pure-decode batches of `batch_size` sequences at `mean_context`."""
    b, ctx, s = np.broadcast_arrays(
        *(np.atleast_1d(np.asarray(x, dtype=np.float64)) for x in (batch_size, mean_context, seconds))
    )
    batch = StepBatch.build(decode_seqs=b, decode_context=b * ctx, decode_max_context=ctx)
    design = np.column_stack([LinearStepModel.design(batch), np.zeros(b.size)])
    return StepObservations.from_design(design, s)


@dataclass(frozen=True)
class CalibratedFit:
    """A fitted step model plus the per-request client overhead seen in TTFTs."""

    model: LinearStepModel
    client_overhead_s: float
    terms_fitted: tuple[str, ...]  # columns the fit used; the rest are 0 (no information or collinear)
    n_observations: int
    median_abs_rel_error: float  # on the fitting rows
    max_abs_rel_error: float
    extra: dict = field(default_factory=dict)

    def step_time(self, batch: StepBatch) -> F64:
        return self.model.step_time(batch)

    def timing_form(self) -> LinearStepModel:
        return self.model

    def ttft(self, isl: ArrayLike, chunk: int | None = None, cached: ArrayLike = 0.0) -> F64:
        """TTFT of a request alone on the engine: client overhead + its prefill steps."""
        return self.client_overhead_s + prefill_time(self.model, isl, cached, chunk=chunk)

    def mean_itl(self, batch_size: ArrayLike, isl: ArrayLike, osl: ArrayLike) -> F64:
        """Mean gap of `batch_size` sequences decoding together from `isl` to `isl + osl` tokens
        (a linear model's mean over those steps is its value at the mean context isl + osl / 2)."""
        isl_a, osl_a = np.asarray(isl, dtype=np.float64), np.asarray(osl, dtype=np.float64)
        return decode_step_time(self.model, batch_size, isl_a + osl_a / 2.0)

    def scaled(self, factor: float) -> CalibratedFit:
        """The same fit with every step time × `factor` (client overhead unchanged): what an in-situ
        speed calibration (llmcap.sim.makespan_fit) applies. The error fields still describe the fit."""
        return self.scaled_by_phase(factor, factor)

    def scaled_by_phase(self, prefill: float, decode: float) -> CalibratedFit:
        """The prefill terms × `prefill`, the per-step overhead and decode terms × `decode`: an in-situ speed
        probe that times a prompt alone and a decode step separately. The two need not move together (on a
        shared CPU a prefill is compute that contention stretches; a small decode step is mostly fixed cost)."""
        for name, f in (("prefill", prefill), ("decode", decode)):
            if not (np.isfinite(f) and f > 0):
                raise ValueError(f"{name} speed factor must be finite and > 0, got {f}")
        factors = np.array([prefill if t in PREFILL_TERMS else decode for t in LinearStepModel.TERMS])
        old = self.extra.get("speed_factors", {"prefill": 1.0, "decode": 1.0})
        return CalibratedFit(
            model=LinearStepModel.from_coefficients(self.model.coefficients * factors),
            client_overhead_s=self.client_overhead_s,
            terms_fitted=self.terms_fitted,
            n_observations=self.n_observations,
            median_abs_rel_error=self.median_abs_rel_error,
            max_abs_rel_error=self.max_abs_rel_error,
            extra={
                **self.extra,
                "speed_factors": {"prefill": float(prefill) * old["prefill"], "decode": float(decode) * old["decode"]},
            },
        )

    def predict(self, obs: StepObservations) -> F64:
        return obs.design() @ np.append(self.model.coefficients, self.client_overhead_s)

    def to_dict(self) -> dict:
        return {
            "kind": "linear",
            "terms": list(TERMS),
            "coefficients": {
                **dict(zip(LinearStepModel.TERMS, self.model.coefficients.tolist(), strict=True)),
                "client": self.client_overhead_s,
            },
            "terms_fitted": list(self.terms_fitted),
            "n_observations": self.n_observations,
            "median_abs_rel_error": self.median_abs_rel_error,
            "max_abs_rel_error": self.max_abs_rel_error,
            **({"extra": self.extra} if self.extra else {}),
        }

    @classmethod
    def from_dict(cls, d: dict) -> CalibratedFit:
        c = d["coefficients"]
        return cls(
            model=LinearStepModel.from_coefficients([c[t] for t in LinearStepModel.TERMS]),
            client_overhead_s=float(c["client"]),
            terms_fitted=tuple(d["terms_fitted"]),
            n_observations=int(d["n_observations"]),
            median_abs_rel_error=float(d["median_abs_rel_error"]),
            max_abs_rel_error=float(d["max_abs_rel_error"]),
            extra=dict(d.get("extra") or {}),
        )


def _independent_columns(a: F64) -> list[int]:
    """Columns of `a` in FIT_ORDER that each add rank (scaled to unit norm first)."""
    norms = np.linalg.norm(a, axis=0)
    scaled = np.divide(a, norms, out=np.zeros_like(a), where=norms > 0)
    keep: list[int] = []
    for name in FIT_ORDER:
        k = TERMS.index(name)
        if norms[k] == 0:
            continue
        if np.linalg.matrix_rank(scaled[:, [*keep, k]], tol=1e-9) == len(keep) + 1:
            keep.append(k)
    return keep


def fit_step_model(obs: StepObservations, relative: bool = True) -> CalibratedFit:
    """Non-negative least squares of measured seconds on the observation terms."""
    if len(obs) == 0:
        raise ValueError("no observations to fit")
    if np.any(~np.isfinite(obs.seconds)) or np.any(obs.seconds <= 0):
        raise ValueError("measured seconds must be finite and > 0")
    a, y = obs.design(), obs.seconds
    cols = _independent_columns(a)
    scale = 1.0 / y if relative else np.ones_like(y)
    sub = a[:, cols] * scale[:, None]
    from scipy.optimize import nnls  # here, not at the top: scipy is slow to import and most commands never fit

    # nnls is better conditioned with unit-norm columns; undo the scaling on the solution
    norms = np.linalg.norm(sub, axis=0)
    x_scaled, _ = nnls(sub / norms, y * scale)
    coef = np.zeros(len(TERMS))
    coef[cols] = x_scaled / norms
    rel = (a @ coef - y) / y
    return CalibratedFit(
        model=LinearStepModel.from_coefficients(coef[: len(LinearStepModel.TERMS)]),
        client_overhead_s=float(coef[-1]),
        terms_fitted=tuple(TERMS[k] for k in sorted(cols)),
        n_observations=len(obs),
        median_abs_rel_error=float(np.median(np.abs(rel))),
        max_abs_rel_error=float(np.max(np.abs(rel))),
    )
