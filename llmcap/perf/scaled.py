"""A step model with its step times scaled: everywhere, or only where a prefill reaches long contexts.

Two users: a correction that reconciliation derived (measured step times were X times the profile's,
everywhere or for long prompts only) and the twin's fault knob that makes long prompts slower. A
step model sees per-step sums, not requests, so "a long prompt" is read from the step's prefill: the
position its chunk reaches, `pairs / tokens + (tokens / chunks - 1) / 2` (exact for a step with one
prefill chunk: a chunk of n tokens after c cached ones has n·c + n(n+1)/2 pairs and reaches c + n;
for several chunks it is the estimate of a chunk of mean size at the mean attended position). A
prompt split into chunks is thus scaled from the chunk that reaches past `min_context` on.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from llmcap.perf.model import F64, InlineStepModel, StepBatch, StepTimeModel


def reach_of(p_tok: float, p_pairs: float, p_seqs: float) -> float:
    """`prefill_reach` of one step, in plain floats (the same operations in the same order)."""
    if p_tok <= 0.0:
        return 0.0
    return p_pairs / p_tok + (p_tok / max(p_seqs, 1.0) - 1.0) / 2.0


def prefill_reach(batch: StepBatch) -> F64:
    """The context position each step's prefill reaches (0 for a step without prefill)."""
    tokens, chunks = batch.prefill_tokens, np.maximum(batch.prefill_seqs, 1.0)
    per_token = np.divide(batch.prefill_pairs, tokens, out=np.zeros(len(batch)), where=tokens > 0)
    return np.where(tokens > 0, per_token + (tokens / chunks - 1.0) / 2.0, 0.0)


@dataclass(frozen=True)
class ScaledStepModel:
    """`model`'s step times × `factor`; with `min_context` > 0 only for steps whose prefill reaches
    past that many tokens (decode-only steps and short prefills keep their time)."""

    model: StepTimeModel
    factor: float
    min_context: int = 0

    def __post_init__(self) -> None:
        if not (np.isfinite(self.factor) and self.factor > 0):
            raise ValueError(f"step-time factor must be finite and > 0, got {self.factor}")
        if self.min_context < 0:
            raise ValueError(f"min_context must be >= 0, got {self.min_context}")

    def step_time(self, batch: StepBatch) -> F64:
        base = self.model.step_time(batch)
        if self.min_context == 0:
            return base * self.factor
        return np.where(prefill_reach(batch) > self.min_context, base * self.factor, base)

    def timing_form(self) -> ScaledInline | None:
        """Fast where the scaled model is fast: over an inline form (a roofline's compiled tables); a linear
        or generic model keeps the generic path (its scaled sums would not round as `step_time` does)."""
        offer = getattr(self.model, "timing_form", None)
        inner = offer() if callable(offer) else None
        if inner is None or not callable(getattr(inner, "step_time_scalar", None)):
            return None
        return ScaledInline(inner, self.factor, float(self.min_context))


class ScaledInline:
    """`ScaledStepModel` over an `InlineStepModel`: the inner times × factor, bit for bit as `step_time`
    (a pure-decode step reaches no prefill context, so with min_context > 0 it keeps its time). Scaled
    everywhere over a compiled roofline at pp = 1 it also offers that roofline's scalar path, scaled
    (`scalar`, `pp`: what the simulator's step timer looks for), the same numbers natively."""

    def __init__(self, inner: InlineStepModel, factor: float, min_context: float) -> None:
        self.inner = inner
        self.factor = factor
        self.min_context = min_context
        self.pp = getattr(inner, "pp", 0)
        scaled = getattr(inner, "scaled_scalar", None)
        self.scalar = scaled(factor) if min_context == 0.0 and self.pp == 1 and callable(scaled) else None

    def step_time_scalar(
        self, p_tok: float, p_pairs: float, p_seqs: float, d_seqs: float, d_ctx: float, d_max: float = 0.0
    ) -> float:
        base = self.inner.step_time_scalar(p_tok, p_pairs, p_seqs, d_seqs, d_ctx, d_max)
        if self.min_context == 0.0 or reach_of(p_tok, p_pairs, p_seqs) > self.min_context:
            return base * self.factor
        return base

    def decode_times(self, decode_seqs: float, decode_context: F64) -> F64:
        base = self.inner.decode_times(decode_seqs, decode_context)
        return base * self.factor if self.min_context == 0.0 else base

    def decode_times_batch(self, decode_seqs: np.ndarray, decode_context: F64) -> F64:
        base = self.inner.decode_times_batch(decode_seqs, decode_context)
        return base * self.factor if self.min_context == 0.0 else base
