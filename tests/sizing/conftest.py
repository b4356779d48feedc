"""Hand-made request records (REQUEST_SCHEMA) for the sizing tests."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest

from llmcap.sim.records import REQUEST_SCHEMA


def make_records(rows: list[dict[str, Any]]) -> pa.Table:
    """Records from partial rows: arrival_s and the latency fields given; a finished request by default.

    ttft_ms / itl_ms / tpot_ms / e2e_ms / queue_ms are shorthands in milliseconds.
    """
    full = []
    for i, r in enumerate(rows):
        status = r.get("status", "ok")
        done = status == "ok"
        ttft = r.get("ttft_ms", 100.0) / 1e3 if done else None
        itl = r.get("itl_ms", 20.0)
        itl_s = None if itl is None or not done else itl / 1e3
        a = float(r["arrival_s"])
        row = {name: None for name in REQUEST_SCHEMA.names}
        row.update(
            request_id=i,
            arrival_s=a,
            isl=r.get("isl", 100),
            osl=r.get("osl", 10),
            cached_tokens=0,
            host_cached_tokens=0,
            preemptions=0,
            status=status,
            queue_s=r.get("queue_ms", 5.0) / 1e3 if done else None,
            ttft_s=ttft,
            first_token_s=None if ttft is None else a + ttft,
            tpot_s=None if not done or r.get("tpot_ms", itl) is None else r.get("tpot_ms", itl) / 1e3,
            e2e_s=r.get("e2e_ms", 500.0) / 1e3 if done else None,
            finish_s=a + r.get("e2e_ms", 500.0) / 1e3 if done else None,
            itl_p50_s=itl_s,
            itl_p99_s=None if itl_s is None else r.get("itl_p99_ms", itl) / 1e3,
            itl_max_s=None if itl_s is None else r.get("itl_max_ms", itl) / 1e3,
        )
        full.append(row)
    return pa.Table.from_pylist(full, schema=REQUEST_SCHEMA)


@pytest.fixture
def records() -> Callable[[list[dict[str, Any]]], pa.Table]:
    return make_records
