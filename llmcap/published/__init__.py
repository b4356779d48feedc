"""End-to-end check of the simulator against engines' published measurements (`llmcap/published/`).

Each cell of a published table (engine, version, GPU, model, precision, TP, input/output lengths, how
many requests at what load, the metric and its value) is replayed through the simulator with the project's
step model and that engine's own preset (`llmcap.engine_presets`), the way the engine's benchmark ran it:
a max-throughput cell (`concurrency` inf) is a burst, every request queued at once (as `trtllm-bench
throughput` does), and its metric is the output tokens over the time to serve them all.

The cells come split, by a rule fixed in the data (alternate rows of each source table), into cells used
for fitting and cells held out. The one thing fitted is the end-to-end speed factor of each (engine, GPU)
(`llmcap.sim.makespan_fit`'s α): every step time x α. A burst's whole timeline scales with α, so its
throughput is the unscaled one / α and the factor has a closed form: the median over the fit cells of
predicted / published. It is applied here only: the step models the sizing uses are not changed.
"""

from __future__ import annotations

import csv
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np
import pyarrow as pa

from llmcap.catalog import get_gpu, load_model
from llmcap.deployment import EngineOptions, sim_config, with_preset
from llmcap.engine_presets import engine_preset
from llmcap.errors import LlmcapError
from llmcap.perf import build_step_model
from llmcap.perf.model import StepTimeModel
from llmcap.sim import SimConfig, simulate

PUBLISHED = Path(__file__).resolve().parent / "engine_throughput.csv"
METRICS = ("output_tokens_per_s",)
SPLITS = ("fit", "held_out")


@dataclass(frozen=True)
class Cell:
    """One published measurement and where it comes from."""

    table: str  # the source table (one model, GPU and TP column of it)
    row: int  # 1-based row in that table: the split rule reads it
    model: str  # catalog model
    checkpoint: str  # the checkpoint the engine ran
    gpu: str  # catalog GPU
    tp: int
    weight_quant: str
    kv_dtype: str
    isl: int
    osl: int
    num_requests: int
    concurrency: float  # requests in flight the client allows; inf: all at once
    metric: str
    value: float
    engine: str
    engine_version: str
    source_url: str
    licence: str
    split: str  # fit | held_out

    @property
    def label(self) -> str:
        return f"{self.engine} {self.gpu} {self.model} TP{self.tp} {self.isl}/{self.osl}"


def split_rule(row: int) -> str:
    """The split every cell follows, fixed before any error was computed: odd rows of a source table fit,
    even rows are held out (each table lists its lengths in the same order, so both halves span them)."""
    return "fit" if row % 2 == 1 else "held_out"


def load_cells(path: Path = PUBLISHED) -> list[Cell]:
    with path.open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    cells = []
    for r in rows:
        try:
            cell = Cell(
                table=r["table"],
                row=int(r["row"]),
                model=r["model"],
                checkpoint=r["checkpoint"],
                gpu=r["gpu"],
                tp=int(r["tp"]),
                weight_quant=r["weight_quant"],
                kv_dtype=r["kv_dtype"],
                isl=int(r["isl"]),
                osl=int(r["osl"]),
                num_requests=int(r["num_requests"]),
                concurrency=float(r["concurrency"]),
                metric=r["metric"],
                value=float(r["value"]),
                engine=r["engine"],
                engine_version=r["engine_version"],
                source_url=r["source_url"],
                licence=r["licence"],
                split=r["split"],
            )
        except (KeyError, ValueError) as e:
            raise LlmcapError(f"{path}: bad row {r} ({type(e).__name__}: {e})") from e
        if cell.metric not in METRICS or cell.split not in SPLITS or cell.concurrency != float("inf"):
            raise LlmcapError(f"{path}: {cell.label}: only max-throughput cells ({', '.join(METRICS)}) are replayed")
        cells.append(cell)
    return cells


def burst(n: int, isl: int, osl: int) -> pa.Table:
    """`n` requests of fixed lengths, all arriving at 0 (trtllm-bench's dataset: zero length deviation)."""
    return pa.table(
        {
            "request_id": np.arange(n, dtype=np.int64),
            "arrival_s": np.zeros(n),
            "isl": np.full(n, isl, dtype=np.int64),
            "osl": np.full(n, osl, dtype=np.int64),
        }
    )


@cache
def _deployment(
    engine: str, model: str, gpu: str, tp: int, quant: str, kv_dtype: str, public: bool = False
) -> tuple[SimConfig, StepTimeModel]:
    # cached: a configuration's cells share its memory plan and step model
    g = get_gpu(gpu)
    options = with_preset(EngineOptions(tp=tp, quant=quant, kv_dtype=kv_dtype), engine_preset(engine, g), set())
    steps = build_step_model(model, gpu, tp=tp, weight_quant=quant, kv_dtype=kv_dtype)
    if public and steps.calibration is not None and steps.calibration.fitted is not None:
        # every knob group of the public fit, also those the GPU's independent timings kept at the defaults
        params = steps.calibration.fitted.params(steps.compute_dtype)
        steps = build_step_model(model, gpu, tp=tp, weight_quant=quant, kv_dtype=kv_dtype, params=params)
    return sim_config(load_model(model), g, options), steps


def deployment(cell: Cell, public: bool = False) -> tuple[SimConfig, StepTimeModel]:
    """`cell`'s instance under its engine's preset, and the step model the sizing uses for it; `public`: with the
    GPU's public calibration in every knob group instead (a diagnostic)."""
    return _deployment(cell.engine, cell.model, cell.gpu, cell.tp, cell.weight_quant, cell.kv_dtype, public)


def predict(cell: Cell, public: bool = False) -> float:
    """The simulator's value of `cell`'s metric, unscaled (α = 1), on `deployment(cell, public)`."""
    config, model = deployment(cell, public)
    records = simulate(burst(cell.num_requests, cell.isl, cell.osl), model, config).records
    status = records.column("status").to_pylist()
    if any(s != "ok" for s in status):
        raise LlmcapError(f"{cell.label}: {sum(s != 'ok' for s in status)} requests did not finish")
    makespan = float(records.column("finish_s").to_numpy().max())
    return cell.num_requests * cell.osl / makespan


@dataclass(frozen=True)
class CellResult:
    cell: Cell
    predicted: float  # unscaled
    factor: float  # the (engine, GPU) speed factor fitted on the fit cells

    @property
    def error(self) -> float:
        """Relative error of the unscaled prediction."""
        return self.predicted / self.cell.value - 1.0

    @property
    def fitted_error(self) -> float:
        """Relative error with every step time x factor (a burst's throughput / factor)."""
        return self.predicted / self.factor / self.cell.value - 1.0


def fit_factors(results: Iterable[tuple[Cell, float]]) -> dict[tuple[str, str], float]:
    """Each (engine, GPU)'s speed factor: the median of predicted / published over its fit cells."""
    ratios: dict[tuple[str, str], list[float]] = {}
    for cell, predicted in results:
        if cell.split == "fit":
            ratios.setdefault((cell.engine, cell.gpu), []).append(predicted / cell.value)
    return {k: statistics.median(v) for k, v in ratios.items()}


def evaluate(cells: list[Cell], public: bool = False) -> list[CellResult]:
    predicted = [(c, predict(c, public)) for c in cells]
    factors = fit_factors(predicted)
    missing = {(c.engine, c.gpu) for c in cells} - factors.keys()
    if missing:
        raise LlmcapError(f"no fit cells for {sorted(missing)}: their speed factor cannot be fitted")
    return [CellResult(c, p, factors[(c.engine, c.gpu)]) for c, p in predicted]


@dataclass(frozen=True)
class Summary:
    cells: int
    median_abs: float
    worst_abs: float
    worst: str  # the worst cell's label


def summarise(results: Iterable[CellResult], fitted: bool = True) -> Summary:
    rs = list(results)
    errs = [abs(r.fitted_error if fitted else r.error) for r in rs]
    i = int(np.argmax(errs))
    return Summary(len(rs), float(np.median(errs)), errs[i], rs[i].cell.label)


def table_lines(results: list[CellResult]) -> list[str]:
    """The per-cell table and the held-out summaries per engine and (engine, GPU), as `make bench` prints them."""
    out = [
        f"{'engine':<7} {'GPU':<15} {'model':<23} {'TP':>2} {'ISL/OSL':>11} {'split':<8} {'published':>9} "
        f"{'predicted':>9} {'error':>7} {'x factor':>8}"
    ]
    for r in results:
        c = r.cell
        out.append(
            f"{c.engine:<7} {c.gpu:<15} {c.model:<23} {c.tp:>2} {f'{c.isl}/{c.osl}':>11} {c.split:<8} "
            f"{c.value:>9,.0f} {r.predicted:>9,.0f} {r.error:>+7.1%} {r.fitted_error:>+8.1%}"
        )
    groups: dict[tuple[str, ...], list[CellResult]] = {}
    for r in results:
        if r.cell.split == "held_out":
            groups.setdefault((r.cell.engine,), []).append(r)
            groups.setdefault((r.cell.engine, r.cell.gpu), []).append(r)
    for key, rs in sorted(groups.items()):
        factor = f" (factor {rs[0].factor:.3f})" if len(key) == 2 else ""
        s, u = summarise(rs), summarise(rs, fitted=False)
        out.append(
            f"held out, {' '.join(key)}{factor}: {s.cells} cells; median |error| {u.median_abs:.1%} unscaled, "
            f"{s.median_abs:.1%} with the factor; worst {u.worst_abs:.1%} ({u.worst}) unscaled, {s.worst_abs:.1%} "
            f"({s.worst}) with it"
        )
    return out
