"""Step timing: the inline linear path agrees with the model; runs and single steps agree exactly."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from llmcap.perf.model import LinearStepModel, StepBatch
from llmcap.sim import EngineConfig, SimConfig, simulate, weighted_quantiles
from llmcap.sim.steptime import StepTimer
from tests.sim._workloads import MODEL, random_config, random_trace


class Wrapped:
    """A non-linear-looking StepTimeModel (goes through StepBatch), elementwise so n=1 and n=k agree;
    around anything but a LinearStepModel it just hides the inner model from StepTimer's fast paths."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def step_time(self, batch: StepBatch) -> np.ndarray:
        if not isinstance(self.inner, LinearStepModel):
            return self.inner.step_time(batch)
        c = self.inner
        return (
            c.overhead_s
            + c.per_prefill_token_s * batch.prefill_tokens
            + c.per_pair_s * batch.prefill_pairs
            + c.per_prefill_seq_s * batch.prefill_seqs
            + c.per_decode_seq_s * batch.decode_seqs
            + c.per_context_token_s * batch.decode_context
        )


def test_linear_inline_matches_the_model() -> None:
    timer = StepTimer(MODEL)
    got = timer.one(100.0, 5000.0, 2.0, 7.0, 9000.0, 2000.0)
    want = MODEL.step_time(StepBatch.build(100.0, 5000.0, 2.0, 7.0, 9000.0, 2000.0))[0]
    assert np.isclose(got, want, rtol=1e-15, atol=0)
    with pytest.raises(ValueError, match="on demand"):
        timer.decode_run(3.0, 7, 9000, 2000, 20)


@pytest.mark.parametrize(
    "kind", ["linear", "Llama-3.1-8B", "Mistral-7B-v0.1"]
)  # roofline: full attention / sliding window
def test_runs_timed_on_demand_are_the_stored_runs_bit_for_bit(kind: str) -> None:
    """run_end / run_scan / decode_durations (no per-step storage) give the steps' own times and their sums."""
    from llmcap.perf import build_step_model

    timer = StepTimer(MODEL if kind == "linear" else build_step_model(kind, "h100"))
    b, ctx0, k = 7, 9000, 300
    assert timer.on_demand(b)
    durs, ends, t = [], [], 3.0  # the definition: each step timed alone by `one`, ends summed in order
    for j in range(k):
        durs.append(timer.one(0.0, 0.0, 0.0, float(b), float(ctx0 + j * b), 0.0))
        t += durs[-1]
        ends.append(t)
    assert [timer.run_end(3.0, b, ctx0, 0, j + 1) for j in (0, 1, 150, k - 1)] == [ends[j] for j in (0, 1, 150, k - 1)]
    assert timer.run_end(ends[99], b, ctx0, 100, k) == ends[-1]  # resumed from a step's start: the same sum
    for until in (3.0, ends[0], ends[0] + 1e-12, ends[150], (ends[200] + ends[201]) / 2, ends[-1] + 1.0):
        j, start = timer.run_scan(3.0, b, ctx0, 0, k, until)
        want = int(np.searchsorted(np.asarray(ends), until, side="left"))  # bisect_left: first end >= until
        assert j == want and start == (3.0 if j == 0 else ends[j - 1])
    steps = np.arange(k)
    bulk = timer.decode_durations(np.full(k, b, dtype=np.int64), (ctx0 + steps * b).astype(np.float64))
    assert bulk.tobytes() == np.array(durs).tobytes()


def test_generic_model_path_agrees_with_linear_fast_path() -> None:
    rng = np.random.default_rng(4)
    trace = random_trace(rng, 40)
    cfg = random_config(rng, 4)
    fast = simulate(trace, MODEL, cfg, rng=np.random.default_rng(0)).records
    slow = simulate(trace, Wrapped(MODEL), cfg, rng=np.random.default_rng(0)).records
    ref = simulate(
        trace, Wrapped(MODEL), cfg.model_copy(update={"reference": True}), rng=np.random.default_rng(0)
    ).records
    assert slow.equals(ref)
    a, b = (
        fast.column("finish_s").to_numpy(zero_copy_only=False),
        slow.column("finish_s").to_numpy(zero_copy_only=False),
    )
    assert np.allclose(a, b, rtol=1e-12, equal_nan=True)


def test_unfinished_when_the_clock_stops() -> None:
    trace = random_trace(np.random.default_rng(2), 30)
    cfg = SimConfig(engine=EngineConfig(num_blocks=200), max_time_s=0.5)
    r = simulate(trace, MODEL, cfg)
    status = r.records.column("status").to_pylist()
    finish = r.records.column("finish_s").to_pylist()
    assert "unfinished" in status and all(f is None for f, s in zip(finish, status, strict=True) if s == "unfinished")
    assert all(f <= 0.5 for f in finish if f is not None)


def test_histogram_mode_trims_the_log_and_keeps_per_request_stats(monkeypatch) -> None:
    import llmcap.sim.steplog as steplog

    monkeypatch.setattr(steplog, "TRIM_STEPS", 64)  # trim all the time
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


@pytest.mark.parametrize("seed", range(6))
def test_step_log_flushed_in_small_chunks_gives_the_same_results(monkeypatch, seed: int) -> None:
    """The step log is written in chunks at each flush; per-request ITL stats that span chunks, the exact
    ITL distribution and histogram-mode trimming of whole chunks do not depend on the chunk size."""
    import llmcap.sim.steplog as steplog

    rng = np.random.default_rng(50 + seed)
    trace = random_trace(rng, 80)
    cfg = random_config(rng, seed)
    whole = simulate(trace, MODEL, cfg, rng=np.random.default_rng(0))
    hist_whole = simulate(trace, MODEL, cfg.model_copy(update={"itl_exact": False}), rng=np.random.default_rng(0))
    monkeypatch.setattr(steplog, "FLUSH_STEPS", 5)
    monkeypatch.setattr(steplog, "TRIM_STEPS", 16)
    chunked = simulate(trace, MODEL, cfg, rng=np.random.default_rng(0))
    hist_chunked = simulate(trace, MODEL, cfg.model_copy(update={"itl_exact": False}), rng=np.random.default_rng(0))
    assert chunked.records.equals(whole.records) and hist_chunked.records.equals(whole.records)
    assert chunked.itl_values.tobytes() == whole.itl_values.tobytes()
    assert chunked.itl_weights.tobytes() == whole.itl_weights.tobytes()
    assert hist_chunked.itl_weights.tolist() == hist_whole.itl_weights.tolist()
    assert hist_chunked.itl_values.tobytes() == hist_whole.itl_values.tobytes()


def _roofline(**kw):
    from llmcap.perf import build_step_model

    return build_step_model(**kw)


def test_roofline_is_timed_inline_and_consistent_with_the_model() -> None:
    from llmcap.perf.roofline_compiled import CompiledRoofline

    exact = _roofline(model="Mixtral-8x7B", gpu="h100", tp=2, ep=2, pp=2, weight_quant="fp8")
    timer = StepTimer(exact)
    assert isinstance(timer.fast, CompiledRoofline) and timer.linear  # the engine may skip decode_max_context
    rng = np.random.default_rng(9)
    for _ in range(300):
        args = [float(rng.integers(0, 2048)), 0.0, float(rng.integers(0, 4)), float(rng.integers(0, 300)), 0.0, 0.0]
        args[1] = args[0] * float(rng.integers(0, 5000)) + args[0] * (args[0] + 1) / 2
        args[4] = args[3] * float(rng.integers(1, 20000))
        want = exact.step_time(StepBatch(*(np.array([a]) for a in args)))[0]
        assert np.isclose(timer.one(*args), want, rtol=1e-12, atol=0)
    for b, ctx0 in ((1, 500), (3, 9000), (64, 200_000)):  # pp = 2: one and two micro-batches
        durs, ends = timer.decode_run(3.0, b, ctx0, 0, 30)  # the numpy branch
        short, short_ends = timer.decode_run(3.0, b, ctx0, 0, 6)  # the Python branch
        assert durs[:6] == short and ends[:6] == short_ends
        assert all(durs[j] == timer.one(0.0, 0.0, 0.0, float(b), float(ctx0 + j * b), 0.0) for j in range(30))
        t = 3.0
        for d, e in zip(durs, ends, strict=True):
            t += d
            assert e == t


@pytest.mark.parametrize(
    "kw",
    [dict(model="Llama-3.1-8B", gpu="h100"), dict(model="Qwen3-30B-A3B", gpu="h100", tp=2, pp=2, ep=2)],
    ids=["dense", "moe-pp2"],
)
def test_roofline_simulation_reference_identity_and_exact_model_agreement(kw) -> None:
    exact = _roofline(**kw)
    for seed in (0, 1, 3, 7):  # with and without P/D disaggregation, several routers
        rng = np.random.default_rng(seed)
        trace = random_trace(rng, 40)
        cfg = random_config(rng, seed)
        fast = simulate(trace, exact, cfg, rng=np.random.default_rng(0))
        ref = simulate(trace, exact, cfg.model_copy(update={"reference": True}), rng=np.random.default_rng(0))
        assert fast.records_parquet() == ref.records_parquet()
        assert fast.itl_values.tobytes() == ref.itl_values.tobytes()
        slow = simulate(
            trace, Wrapped(exact), cfg, rng=np.random.default_rng(0)
        )  # the exact model, a numpy call per step
        a, b = (
            fast.records.column("finish_s").to_numpy(zero_copy_only=False),
            slow.records.column("finish_s").to_numpy(zero_copy_only=False),
        )
        assert np.allclose(a, b, rtol=1e-12, equal_nan=True) and np.isfinite(a).sum() > 0
