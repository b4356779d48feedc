"""The `StepTimeModel` seam: how long one engine iteration takes, given what is in the batch.

An iteration (one forward pass of a continuous-batching engine) runs some prefill chunks and some
decode sequences. Everything a step-time model may depend on is summarised per batch in a
`StepBatch`, as numpy arrays so that many batches are timed in one call — the simulator times whole
runs of decode steps at once, the profiler fits models on thousands of measured steps.

Prefill chunk i computes `new_i` uncached tokens after `ctx_i` tokens already in its KV cache (a
prefix-cache hit or an earlier chunk). Causal attention for the chunk covers
`new_i * ctx_i + new_i * (new_i + 1) / 2` query-key pairs; the batch carries the sums, which is
all a roofline or a linear model needs. Decode sequence j attends over `ctx_j` tokens (its prompt
plus what it generated so far); the batch carries the count, the sum and the max.

Implementations: `LinearStepModel` (fitted terms; also the analytic stand-in), the roofline model
and table-backed models in this package.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Protocol, cast, runtime_checkable

import numpy as np
from numpy.typing import ArrayLike, NDArray

F64 = NDArray[np.float64]


def _vec(x: ArrayLike, n: int | None = None) -> F64:
    a = np.asarray(x, dtype=np.float64)
    if a.ndim == 0:
        a = a.reshape(1) if n is None else np.full(n, float(a))
    if a.ndim != 1:
        raise ValueError(f"expected a scalar or a 1-d array, got shape {a.shape}")
    return a


def causal_pairs(new_tokens: ArrayLike, context_tokens: ArrayLike) -> F64:
    """Query-key pairs of causal attention for chunks of `new_tokens` after `context_tokens` cached ones."""
    new = np.asarray(new_tokens, dtype=np.float64)
    ctx = np.asarray(context_tokens, dtype=np.float64)
    return new * ctx + new * (new + 1.0) / 2.0


@dataclass(frozen=True)
class StepBatch:
    """Per-batch summaries of n engine iterations (every field a float64 array of length n)."""

    prefill_tokens: F64  # Σ new (uncached) prompt tokens computed this step, over prefill chunks
    prefill_pairs: F64  # Σ causal attention query-key pairs of those chunks (see `causal_pairs`)
    prefill_seqs: F64  # number of prefill chunks
    decode_seqs: F64  # number of decoding sequences (one new token each)
    decode_context: F64  # Σ context tokens the decoding sequences attend over
    decode_max_context: F64  # the longest of those contexts (0 when there are no decodes)

    def __post_init__(self) -> None:
        n = None
        for f in fields(self):
            a = _vec(getattr(self, f.name))
            object.__setattr__(self, f.name, a)
            if n is None:
                n = a.size
            elif a.size != n:
                raise ValueError(f"StepBatch.{f.name} has {a.size} entries, expected {n}")

    def __len__(self) -> int:
        return int(self.prefill_tokens.size)

    @property
    def tokens(self) -> F64:
        """Tokens through the model this step: prefill tokens + one per decode sequence."""
        return self.prefill_tokens + self.decode_seqs

    @classmethod
    def build(
        cls,
        prefill_tokens: ArrayLike = 0.0,
        prefill_pairs: ArrayLike | None = None,
        prefill_seqs: ArrayLike | None = None,
        decode_seqs: ArrayLike = 0.0,
        decode_context: ArrayLike = 0.0,
        decode_max_context: ArrayLike | None = None,
    ) -> StepBatch:
        """Broadcast scalars and fill the derived fields: with no `prefill_pairs` each step's prefill is
        one chunk from an empty cache; with no `decode_max_context` all decodes share the mean context."""
        arrays = [np.asarray(a, dtype=np.float64) for a in (prefill_tokens, decode_seqs, decode_context)]
        n = max((a.size for a in arrays if a.ndim), default=1)
        p_tok, d_seqs, d_ctx = (_vec(a, n) for a in arrays)
        pairs = causal_pairs(p_tok, 0.0) if prefill_pairs is None else _vec(prefill_pairs, n)
        p_seqs = (p_tok > 0).astype(np.float64) if prefill_seqs is None else _vec(prefill_seqs, n)
        if decode_max_context is None:
            d_max = np.divide(d_ctx, d_seqs, out=np.zeros(n), where=d_seqs > 0)
        else:
            d_max = _vec(decode_max_context, n)
        return cls(p_tok, pairs, p_seqs, d_seqs, d_ctx, d_max)


@runtime_checkable
class StepTimeModel(Protocol):
    """Seconds per engine iteration for each batch in `batch` (an array of len(batch)).

    That is all a model must offer. One that can also be timed without a numpy call per step says so
    with an optional method, `timing_form() -> LinearStepModel | InlineStepModel`: the simulator's step
    timer then times it through that form (which must give `step_time`'s numbers); a model without the
    method is timed through `step_time`, correct but slower."""

    def step_time(self, batch: StepBatch) -> F64: ...


class InlineStepModel(Protocol):
    """A step model's plain-float form for the simulator's step timer. `step_time_scalar` and
    `decode_times` give `step_time`'s numbers and agree with each other bit for bit (a step timed alone
    and inside a run of decode steps); decode_max_context does not change a step's time (the engine then
    skips computing it). `decode_times_batch` is `decode_times` over steps of different batch sizes."""

    def step_time_scalar(
        self, p_tok: float, p_pairs: float, p_seqs: float, d_seqs: float, d_ctx: float, d_max: float = 0.0
    ) -> float: ...

    def decode_times(self, decode_seqs: float, decode_context: F64) -> F64: ...

    def decode_times_batch(self, decode_seqs: np.ndarray, decode_context: F64) -> F64: ...


def prefill_time(model: StepTimeModel, isl: ArrayLike, cached: ArrayLike = 0.0, chunk: int | None = None) -> F64:
    """Time to prefill prompts of `isl` tokens of which `cached` hit the prefix cache, alone on the engine.

    With `chunk` (max_num_batched_tokens) a long prompt runs as ceil(new / chunk) steps, each chunk
    attending over everything before it; the result sums those steps.
    """
    isl_a, cached_a = np.broadcast_arrays(np.asarray(isl, dtype=np.float64), np.asarray(cached, dtype=np.float64))
    isl_a, cached_a = isl_a.ravel(), cached_a.ravel()
    if np.any(cached_a > isl_a) or np.any(cached_a < 0):
        raise ValueError("cached tokens must lie in [0, isl]")
    new = isl_a - cached_a
    if chunk is None:
        return model.step_time(StepBatch.build(new, causal_pairs(new, cached_a)))
    steps = np.maximum(np.ceil(new / chunk), 1).astype(np.int64)
    owner = np.repeat(np.arange(new.size), steps)
    k = np.arange(steps.sum()) - np.repeat(np.cumsum(steps) - steps, steps)  # chunk index within its prompt
    start = cached_a[owner] + k * chunk
    size = np.minimum(chunk, isl_a[owner] - start)
    times = model.step_time(StepBatch.build(size, causal_pairs(size, start)))
    return cast(
        F64, np.bincount(owner, weights=times, minlength=new.size)
    )  # float64 with weights; numpy's stubs say intp


def decode_step_time(model: StepTimeModel, batch_size: ArrayLike, mean_context: ArrayLike) -> F64:
    """Time of one pure-decode step of `batch_size` sequences with `mean_context` tokens each."""
    b, ctx = np.broadcast_arrays(np.asarray(batch_size, dtype=np.float64), np.asarray(mean_context, dtype=np.float64))
    b, ctx = b.ravel(), ctx.ravel()
    return model.step_time(
        StepBatch.build(decode_seqs=b, decode_context=b * ctx, decode_max_context=np.where(b > 0, ctx, 0.0))
    )


@dataclass(frozen=True)
class LinearStepModel:
    """Step time as a non-negative combination of batch terms — what a least-squares fit on measured
    steps produces, and a small analytic stand-in when nothing is measured:

        t = overhead_s + per_prefill_token_s·prefill_tokens + per_pair_s·prefill_pairs
            + per_prefill_seq_s·prefill_seqs + per_decode_seq_s·decode_seqs
            + per_context_token_s·decode_context

    (weights/MLP scale with tokens, attention with pairs or context read, fixed costs per sequence).
    """

    overhead_s: float = 0.0
    per_prefill_token_s: float = 0.0
    per_pair_s: float = 0.0
    per_prefill_seq_s: float = 0.0
    per_decode_seq_s: float = 0.0
    per_context_token_s: float = 0.0

    TERMS = ("overhead", "prefill_tokens", "prefill_pairs", "prefill_seqs", "decode_seqs", "decode_context")

    def __post_init__(self) -> None:
        for f in fields(self):
            if not np.isfinite(getattr(self, f.name)) or getattr(self, f.name) < 0:
                raise ValueError(f"LinearStepModel.{f.name} must be finite and >= 0, got {getattr(self, f.name)}")

    @property
    def coefficients(self) -> F64:
        return np.array([getattr(self, f.name) for f in fields(self)], dtype=np.float64)

    def timing_form(self) -> LinearStepModel:
        """Timed inline from its six coefficients (see `StepTimeModel`)."""
        return self

    @classmethod
    def from_coefficients(cls, coef: ArrayLike) -> LinearStepModel:
        return cls(*(float(c) for c in np.asarray(coef, dtype=np.float64)))

    @staticmethod
    def design(batch: StepBatch) -> F64:
        """The n × 6 term matrix, columns in `TERMS` order (for fitting)."""
        return np.column_stack(
            [
                np.ones(len(batch)),
                batch.prefill_tokens,
                batch.prefill_pairs,
                batch.prefill_seqs,
                batch.decode_seqs,
                batch.decode_context,
            ]
        )

    def step_time(self, batch: StepBatch) -> F64:
        return self.design(batch) @ self.coefficients
