"""A new step model is one class in one file: it works through `step_time` alone, and it gets the
simulator's fast path by declaring a `timing_form` — with the same results, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from llmcap.perf.model import StepBatch
from llmcap.sim import simulate
from llmcap.sim.steptime import StepTimer
from tests.sim._workloads import random_config, random_trace


class ToyStepModel:
    """Not linear in the batch: a decode cost that grows with the square of the batch size (as on a
    CPU engine whose step stops fitting in cache). Only `step_time`: the timer's generic path."""

    fixed_s, per_token_s, per_pair_s, per_seq_squared_s, per_context_s = 0.008, 6e-5, 2e-8, 3e-5, 4e-7

    def step_time(self, batch: StepBatch) -> np.ndarray:
        b = batch
        return (
            ((self.fixed_s + self.per_token_s * b.prefill_tokens) + self.per_pair_s * b.prefill_pairs)
            + self.per_seq_squared_s * (b.decode_seqs * b.decode_seqs)
        ) + self.per_context_s * b.decode_context


class InlineToyStepModel(ToyStepModel):
    """The same model, declaring its plain-float form: the same operations in the same order."""

    def timing_form(self) -> InlineToyStepModel:
        return self

    def step_time_scalar(
        self, p_tok: float, p_pairs: float, p_seqs: float, d_seqs: float, d_ctx: float, d_max: float = 0.0
    ) -> float:
        return (
            ((self.fixed_s + self.per_token_s * p_tok) + self.per_pair_s * p_pairs)
            + self.per_seq_squared_s * (d_seqs * d_seqs)
        ) + self.per_context_s * d_ctx

    def decode_times(self, decode_seqs: float, decode_context: np.ndarray) -> np.ndarray:
        return self.decode_times_batch(np.full(decode_context.size, decode_seqs), decode_context)

    def decode_times_batch(self, decode_seqs: np.ndarray, decode_context: np.ndarray) -> np.ndarray:
        s = np.asarray(decode_seqs, dtype=np.float64)
        return (
            ((self.fixed_s + self.per_token_s * 0.0) + self.per_pair_s * 0.0) + self.per_seq_squared_s * (s * s)
        ) + self.per_context_s * decode_context


def test_the_timer_takes_the_path_the_model_declares() -> None:
    generic, inline = StepTimer(ToyStepModel()), StepTimer(InlineToyStepModel())
    assert generic.fast is None and not generic.linear
    assert inline.fast is inline.model and inline.linear and not inline.is_linear
    args = (100.0, 5000.0, 2.0, 7.0, 9000.0, 0.0)
    assert generic.one(*args) == inline.one(*args)
    d_generic, ends_generic = generic.decode_run(1.5, 7, 9000, 1300, 40)
    d_inline, ends_inline = inline.decode_run(1.5, 7, 9000, 1300, 40)
    assert d_generic.tobytes() == d_inline.tobytes() and ends_generic == ends_inline


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("reference", [False, True])
def test_the_fast_path_gives_the_generic_paths_results(seed: int, reference: bool) -> None:
    runs = []
    for model in (ToyStepModel(), InlineToyStepModel()):
        rng = np.random.default_rng(seed)
        trace = random_trace(rng, int(rng.integers(5, 60)))
        runs.append(simulate(trace, model, random_config(rng, seed, reference), rng=np.random.default_rng(seed)))
    generic, inline = runs
    assert generic.records_parquet() == inline.records_parquet()
    assert generic.itl_values.tobytes() == inline.itl_values.tobytes()
    assert generic.summary["completed"] > 0


class GenericOnly:
    """A step model with its fast form hidden: the timer's generic path over the same step times."""

    def __init__(self, model) -> None:
        self.model = model

    def step_time(self, batch: StepBatch) -> np.ndarray:
        return self.model.step_time(batch)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("min_context", [0, 64])
def test_a_scaled_roofline_keeps_the_fast_path_with_the_generic_paths_results(seed: int, min_context: int) -> None:
    from llmcap.perf import build_step_model
    from llmcap.perf.scaled import ScaledInline, ScaledStepModel

    scaled = ScaledStepModel(build_step_model("llama-3.1-8b", "h100").compile(), 1.3, min_context)
    timer = StepTimer(scaled)
    assert isinstance(timer.fast, ScaledInline)
    assert (timer.scalar is not None) == (
        min_context == 0
    )  # scaled everywhere: the roofline's native scalar path, scaled
    runs = []
    for model in (GenericOnly(scaled), scaled):
        rng = np.random.default_rng(seed)
        trace = random_trace(rng, int(rng.integers(5, 60)))
        runs.append(simulate(trace, model, random_config(rng, seed), rng=np.random.default_rng(seed)))
    generic, inline = runs
    assert generic.records_parquet() == inline.records_parquet()
    assert generic.itl_values.tobytes() == inline.itl_values.tobytes()
    assert generic.summary["completed"] > 0
