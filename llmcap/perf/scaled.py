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

from llmcap.perf.model import F64, StepBatch, StepTimeModel


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
