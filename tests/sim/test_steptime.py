"""Step timing: the inline linear path agrees with the model; runs and single steps agree exactly."""

from __future__ import annotations

import numpy as np

from llmcap.perf.model import LinearStepModel, StepBatch
from llmcap.sim import EngineConfig, SimConfig, simulate, weighted_quantiles
from llmcap.sim.steptime import StepTimer
from tests.sim._workloads import MODEL, random_config, random_trace


class Wrapped:
    """A non-linear-looking StepTimeModel (goes through StepBatch), elementwise so n=1 and n=k agree."""

    def __init__(self, inner: LinearStepModel) -> None:
        self.inner = inner

    def step_time(self, batch: StepBatch) -> np.ndarray:
        c = self.inner
        return (c.overhead_s + c.per_prefill_token_s * batch.prefill_tokens + c.per_pair_s * batch.prefill_pairs
                + c.per_prefill_seq_s * batch.prefill_seqs + c.per_decode_seq_s * batch.decode_seqs
                + c.per_context_token_s * batch.decode_context)  # fmt: skip


def test_linear_inline_matches_the_model() -> None:
    timer = StepTimer(MODEL)
    got = timer.one(100.0, 5000.0, 2.0, 7.0, 9000.0, 2000.0)
    want = MODEL.step_time(StepBatch.build(100.0, 5000.0, 2.0, 7.0, 9000.0, 2000.0))[0]
    assert np.isclose(got, want, rtol=1e-15, atol=0)
    durs, ends = timer.decode_run(3.0, 7, 9000, 2000, 20)  # the numpy branch
    short, short_ends = timer.decode_run(3.0, 7, 9000, 2000, 5)  # the Python branch
    assert durs[:5] == short and ends[:5] == short_ends
    assert durs[4] == timer.one(0.0, 0.0, 0.0, 7.0, 9000.0 + 4 * 7, 0.0)
    t = 3.0
    for d, e in zip(durs, ends):
        t += d
        assert e == t  # ends are the sequential sum from the run's start


def test_generic_model_path_agrees_with_linear_fast_path() -> None:
    rng = np.random.default_rng(4)
    trace = random_trace(rng, 40)
    cfg = random_config(rng, 4)
    fast = simulate(trace, MODEL, cfg, rng=np.random.default_rng(0)).records
    slow = simulate(trace, Wrapped(MODEL), cfg, rng=np.random.default_rng(0)).records
    ref = simulate(trace, Wrapped(MODEL), cfg.model_copy(update={"reference": True}), rng=np.random.default_rng(0)).records
    assert slow.equals(ref)
    a, b = fast.column("finish_s").to_numpy(zero_copy_only=False), slow.column("finish_s").to_numpy(zero_copy_only=False)
    assert np.allclose(a, b, rtol=1e-12, equal_nan=True)


def test_unfinished_when_the_clock_stops() -> None:
    trace = random_trace(np.random.default_rng(2), 30)
    cfg = SimConfig(engine=EngineConfig(num_blocks=200), max_time_s=0.5)
    r = simulate(trace, MODEL, cfg)
    status = r.records.column("status").to_pylist()
    finish = r.records.column("finish_s").to_pylist()
    assert "unfinished" in status and all(f is None for f, s in zip(finish, status) if s == "unfinished")
    assert all(f <= 0.5 for f in finish if f is not None)


def test_histogram_mode_trims_the_log_and_keeps_per_request_stats(monkeypatch) -> None:
    import llmcap.sim.engine as engine

    monkeypatch.setattr(engine, "TRIM_STEPS", 64)  # trim all the time
    rng = np.random.default_rng(8)
    trace = random_trace(rng, 60)
    cfg = random_config(rng, 1).model_copy(update={"pd": None})
    exact = simulate(trace, MODEL, cfg.model_copy(update={"itl_exact": True}))
    hist = simulate(trace, MODEL, cfg.model_copy(update={"itl_exact": False}))
    assert exact.records.equals(hist.records)  # per-request ITL stats read only live steps
    assert hist.itl_weights.sum() == exact.itl_weights.sum()
    for q in (0.5, 0.9, 0.99):
        (e,) = weighted_quantiles(exact.itl_values, exact.itl_weights, [q])
        (h,) = weighted_quantiles(hist.itl_values, hist.itl_weights, [q])
        assert abs(h / e - 1) < 0.0025  # 1000 bins per decade: 0.23% wide
