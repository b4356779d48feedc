"""End-to-end check against published engine measurements (llmcap.published):
TensorRT-LLM 1.0's max-throughput table replayed under the trtllm preset, the (engine, GPU) speed factor fitted
on the fit cells and judged on the held-out ones."""

from __future__ import annotations

import re
from collections import Counter

import numpy as np
import pytest

from llmcap.engine_presets import ENGINES
from llmcap.perf.calibration import shipped_calibration
from llmcap.perf.scaled import ScaledStepModel
from llmcap.published import CellResult, burst, deployment, evaluate, load_cells, split_rule, summarise
from llmcap.sim import simulate

CELLS = load_cells()
ACCEPT_MEDIAN, ACCEPT_WORST = 0.05, 0.15  # issue 36's acceptance for the held-out cells


H200 = "H200-SXM-141GB"


@pytest.fixture(scope="module")
def results() -> list[CellResult]:
    return evaluate(CELLS)


@pytest.fixture(scope="module")
def h200_public() -> list[CellResult]:
    return evaluate([c for c in CELLS if c.gpu == H200], public=True)


def _held(results: list[CellResult], gpu: str | None = None) -> list[CellResult]:
    return [r for r in results if r.cell.split == "held_out" and gpu in (None, r.cell.gpu)]


def test_every_cell_is_cited_and_split_by_the_fixed_rule():
    assert len(CELLS) == 40  # 4 table columns (8B on H200 and H100, 70B on H200 TP1 and H100 TP2) x 10 rows
    for c in CELLS:
        # a URL pinned to a commit, the engine's version, a licence; the engine one the presets know
        assert re.fullmatch(r"https://github\.com/.+/blob/[0-9a-f]{40}/.+", c.source_url), c.label
        assert c.engine in ENGINES and c.engine_version and c.licence == "Apache-2.0"
        assert c.split == split_rule(c.row)
    per_table = Counter((c.table, c.gpu, c.tp, c.split) for c in CELLS)
    assert set(per_table.values()) == {5}  # 10 rows a column: 5 fit, 5 held out


def test_a_burst_scales_with_the_speed_factor_exactly():
    # the closed-form fit rests on it: every request arrives at 0, so step times x a stretch the whole timeline by a
    cell = next(c for c in CELLS if (c.isl, c.osl) == (1000, 1000) and c.gpu == "H100-SXM-80GB")
    config, model = deployment(cell)
    trace = burst(300, cell.isl, cell.osl)
    plain = simulate(trace, model, config).records.column("finish_s").to_numpy().max()
    scaled = simulate(trace, ScaledStepModel(model, 1.25), config).records.column("finish_s").to_numpy().max()
    assert scaled == pytest.approx(1.25 * plain, rel=1e-9)


def test_the_factor_is_the_median_ratio_of_the_fit_cells(results):
    for r in results:
        same = [x for x in results if (x.cell.engine, x.cell.gpu) == (r.cell.engine, r.cell.gpu)]
        ratios = [x.predicted / x.cell.value for x in same if x.cell.split == "fit"]
        assert r.factor == pytest.approx(float(np.median(ratios)), rel=1e-12)
        # held-out cells never enter it: the fit cells' median fitted error is 0 by construction
        assert np.median([x.fitted_error for x in same if x.cell.split == "fit"]) == pytest.approx(0.0, abs=1e-12)


def test_h100_meets_the_acceptance_with_and_without_the_factor(results):
    # the H100 runs every knob of the public vLLM-kernel calibration: the engine preset alone reproduces TensorRT-LLM
    held = _held(results, "H100-SXM-80GB")
    for fitted in (False, True):
        s = summarise(held, fitted=fitted)
        assert s.cells == 10 and s.median_abs <= ACCEPT_MEDIAN and s.worst_abs <= ACCEPT_WORST, s


def test_held_out_median_meets_the_acceptance_and_the_worst_cell_is_no_worse_than_the_fitted_ones(results):
    s = summarise(_held(results))
    assert s.cells == 20 and s.median_abs <= ACCEPT_MEDIAN, s
    assert summarise(_held(results), fitted=False).median_abs > s.median_abs  # the factor helps overall
    # Not reached: worst <= 15%. The H200 keeps the documented GEMM and HBM efficiencies, not the public fit's
    # (its own PyTorch timings judged those groups: catalog/data/calibration/README.md), so its compute-bound
    # cells are predicted 14-38% too fast while its long-context ones are within 2%; one factor per GPU lands
    # between them. What is asserted instead: a held-out cell is no worse than the worst fit cell of its
    # (engine, GPU), the cells its factor was fitted to (the two halves sample the same lengths, interleaved).
    for gpu in {r.cell.gpu for r in results}:
        fit = [r for r in results if r.cell.gpu == gpu and r.cell.split == "fit"]
        held = summarise(_held(results, gpu))
        assert held.worst_abs <= summarise(fit).worst_abs, (gpu, held)
    cal = shipped_calibration(H200)
    assert cal is not None and {"gemm:fp8", "hbm"} <= set(cal.not_applied)  # the cause stated above
    assert H200 in s.worst and s.worst_abs > ACCEPT_WORST  # where the gap is: the acceptance not met


def test_the_h200_gap_closes_on_its_public_calibration(results, h200_public):
    # The cause, checked: with every knob group of the H200's public (vLLM-kernel) fit, not the defaults its own
    # PyTorch timings chose, the H200's held-out cells come within the acceptance's worst with no factor at all.
    # (Not the default: the sizing's H200 keeps the independent check's choice; llmcap/published/README.md.)
    default, public = summarise(_held(results, H200), fitted=False), summarise(_held(h200_public), fitted=False)
    assert public.cells == 10 and public.worst_abs <= ACCEPT_WORST < default.worst_abs, (public, default)
    assert public.median_abs < default.median_abs
