"""Synthetic paired request records (measured vs predicted) for the reconciliation rule's tests."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from llmcap.sim.records import REQUEST_SCHEMA


def records(
    isl: np.ndarray, ttft: np.ndarray, tpot: np.ndarray, status: list[str] | None = None, run: str = "1.0x"
) -> pa.Table:
    n = isl.size
    rows = {f.name: [None] * n for f in REQUEST_SCHEMA}
    rows.update(
        request_id=list(range(n)),
        arrival_s=np.arange(n, dtype=float).tolist(),
        isl=isl.tolist(),
        osl=[64] * n,
        cached_tokens=[0] * n,
        host_cached_tokens=[0] * n,
        preemptions=[0] * n,
        ttft_s=ttft.tolist(),
        tpot_s=tpot.tolist(),
        status=status or ["ok"] * n,
    )
    table = pa.Table.from_pydict(rows, schema=REQUEST_SCHEMA)
    return table.append_column("run", pa.array([run] * n)).append_column("excerpt_seed", pa.array([0] * n, pa.int64()))


def pair_of(measured_scale, n: int = 300, seed: int = 0, itl_scale=None) -> tuple[pa.Table, pa.Table]:
    """Predicted times from the prompt length; measured = predicted x scale(isl) x 3% noise."""
    rng = np.random.default_rng(seed)
    isl = rng.choice([300, 3000, 12000], size=n)
    ttft = 0.02 + isl * 5e-5
    tpot = np.full(n, 0.03) + rng.uniform(0, 0.005, n)
    noise = lambda: rng.lognormal(0.0, 0.03, n)
    m_ttft = ttft * measured_scale(isl) * noise()
    m_tpot = tpot * (itl_scale or measured_scale)(isl) * noise()
    return records(isl, m_ttft, m_tpot), records(isl, ttft, tpot)
