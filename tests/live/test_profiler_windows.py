"""The profiler's steady-window estimator on constructed streams (no engine; the live acceptance
test runs the same code on the real one): a stream the server held back and released in a burst
must neither fake near-zero steps nor move the window."""

from __future__ import annotations

import numpy as np
import pytest

from llmcap.live.cells import Run, aggregate
from llmcap.live.client import StreamResult

STEP = 0.002


def _stream(isl: int, first: float, n: int, held_until: float | None = None) -> StreamResult:
    made = first + STEP * np.arange(n)  # when the engine made each token
    seen = made if held_until is None else np.maximum(made, held_until)  # when the client got it
    chunks, counts = np.unique(seen, return_counts=True)  # tokens released together share a time
    return StreamResult(
        sent_s=0.0,
        isl=isl,
        max_tokens=n,
        chunk_s=chunks.tolist(),
        chunk_tokens=counts.tolist(),
        completion_tokens=n,
        prompt_tokens=isl,
        finish_reason="length",
    )


def test_steady_steps_and_contexts_of_clean_streams() -> None:
    run = Run(isl=100, concurrency=2, repeat=0, results=[_stream(100, 0.010, 50), _stream(100, 0.012, 50)])
    start, end = run.window()
    assert (start, end) == pytest.approx((0.012, 0.010 + 49 * STEP))
    est = run.steady()
    assert [s for s, _, _ in est] == pytest.approx([STEP, STEP])
    # the first request's steady gaps run from token 1 (t = 12 ms) to token 49: contexts isl + 2 ... isl + 49
    assert est[0][1] == pytest.approx(100 + np.mean(np.arange(1, 49)) + 1)
    assert est[0][2] == 48


def test_a_held_stream_neither_fakes_fast_steps_nor_delays_the_window() -> None:
    clean, held = _stream(100, 0.010, 60), _stream(100, 0.011, 60, held_until=0.050)
    run = Run(isl=100, concurrency=2, repeat=0, results=[clean, held])
    assert run.window()[0] == pytest.approx(0.010)  # the held stream's late first token does not count
    assert [s for s, _, _ in run.steady()] == pytest.approx([STEP, STEP])
    cell = aggregate([run], osl=60, ttft_probes=[])
    assert cell.itl_mean_s == pytest.approx(STEP)


def test_a_stream_held_to_the_end_is_dropped_not_averaged_in() -> None:
    whole = _stream(100, 0.010, 40, held_until=0.010 + 39 * STEP)  # everything at once, at the end
    run = Run(isl=100, concurrency=1, repeat=0, results=[whole])
    assert run.steady() == []
    assert aggregate([run], osl=40, ttft_probes=[]).itl_mean_s is None


def test_a_stall_in_the_middle_of_the_window_does_not_move_the_step_estimate() -> None:
    s = _stream(100, 0.010, 80)
    t = np.asarray(s.chunk_s)
    t[40:] += 0.030  # the engine process lost the CPU for 30 ms once
    s.chunk_s = t.tolist()
    run = Run(isl=100, concurrency=1, repeat=0, results=[s])
    assert run.steady()[0][0] == pytest.approx(STEP)
    # a plain mean over the window would have been pulled up by the stall
    assert (t[-1] - t[0]) / 79 > 1.15 * STEP


def test_when_every_stream_was_held_the_engines_own_itl_is_used_and_labelled() -> None:
    whole = _stream(100, 0.010, 40, held_until=0.010 + 39 * STEP)
    run = Run(isl=100, concurrency=1, repeat=0, results=[whole], server_itl_s=0.0025)
    cell = aggregate([run], osl=40, ttft_probes=[])
    assert (cell.itl_mean_s, cell.itl_source, cell.itl_server_mean_s) == (0.0025, "server", 0.0025)
    assert cell.decode_context_mean == 100 + 40 / 2
    clean = Run(isl=100, concurrency=1, repeat=0, results=[_stream(100, 0.010, 40)], server_itl_s=0.0031)
    cell = aggregate([clean], osl=40, ttft_probes=[])
    assert (cell.itl_source, cell.itl_server_mean_s) == ("client", 0.0031)
    assert cell.itl_mean_s == pytest.approx(STEP)


def test_run_order_permutes_the_cells_within_each_repeat() -> None:
    from llmcap.live.profiler import run_order

    cells = tuple((isl, c) for isl in (64, 256, 1024) for c in (1, 4, 16))
    order = run_order(cells, repeats=5, seed=7)
    assert [rep for rep, _, _ in order] == [r for r in range(5) for _ in cells]  # repeats stay the outer loop
    per_repeat = [[(i, c) for rep, i, c in order if rep == r] for r in range(5)]
    assert all(sorted(p) == sorted(cells) for p in per_repeat)  # each cell exactly once per repeat
    assert len({tuple(p) for p in per_repeat}) > 1 and any(p != list(cells) for p in per_repeat)
    last = {p[-1] for p in per_repeat}
    assert len(last) > 1  # no cell is always the last one measured
    assert run_order(cells, 5, 7) == order and run_order(cells, 5, 8) != order  # seeded
