"""A small capacity report built from synthetic searches (shared by the report and executor tests)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pyarrow as pa
from synthetic import Knee

from llmcap.report.capacity import CapacityReport
from llmcap.sizing.executor import Executor
from llmcap.sizing.headroom import PoolInput, plan_headroom
from llmcap.sizing.params import HeadroomParams, SearchParams, SloParams
from llmcap.sizing.search import SearchResult, SearchTask, search_candidates
from llmcap.sizing.table import capacity_row, capacity_table

SLO = SloParams(ttft_ms=500, itl_ms=50)
CANDIDATES = {  # key -> (threshold req/s, config)
    "H100 TP1": (3.0, {"gpu": "H100-SXM-80GB", "tp": 1, "pp": 1, "ep": 1, "dp": 1, "gpus_per_instance": 1}),
    "H100 TP2": (7.0, {"gpu": "H100-SXM-80GB", "tp": 2, "pp": 1, "ep": 1, "dp": 1, "gpus_per_instance": 2}),
    "H100 TP4": (9.0, {"gpu": "H100-SXM-80GB", "tp": 4, "pp": 1, "ep": 1, "dp": 1, "gpus_per_instance": 4}),
}


def searches(executor: Executor | None = None) -> dict[str, SearchResult]:
    tasks = [
        SearchTask(k, Knee(t, jitter=0.05), SLO.attainment_target, SearchParams(), 1.0)
        for k, (t, _) in CANDIDATES.items()
    ]
    return search_candidates(tasks, executor)


def table_from(results: Mapping[str, SearchResult]) -> pa.Table:
    rows = []
    for key, (_, cfg) in CANDIDATES.items():
        res = results[key]
        plan = plan_headroom(
            20.0,
            [PoolInput("instances", res.max_rate, cfg["gpus_per_instance"], 8, 2.5)],
            HeadroomParams(ramp_rps_per_s=0.005),
        )
        rows.append(capacity_row("wl", key, "aggregated", cfg, res, cfg["gpus_per_instance"], plan))
    return capacity_table(rows)


def report(records: pa.Table, results: Mapping[str, SearchResult] | None = None) -> CapacityReport:
    results = results or searches()
    table = table_from(results)
    chosen = table.column("candidate")[0].as_py()
    res = results[chosen]
    pool = PoolInput("instances", res.max_rate, CANDIDATES[chosen][1]["gpus_per_instance"], 8, 2.5)
    plan = plan_headroom(20.0, [pool], HeadroomParams(traffic_method="forecast_error", ramp_rps_per_s=0.005))
    t = np.arange(0, 10.0, 0.5)
    kv = {"replica 0": (t, 0.5 + 0.4 * np.sin(t) ** 2), "replica 1": (t, 0.3 + 0.2 * np.cos(t) ** 2)}
    return CapacityReport(table, SLO, results, chosen, plan, records, kv, title="Test plan")
