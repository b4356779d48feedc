"""Inputs the stage tests share: a small canonical trace, and one enumerated Llama-3.1-8B candidate on an H100
(one decode step ~7 ms: runs take seconds), made by the real enumerate stage."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from llmcap.trace.schema import CANONICAL_SCHEMA
from stages import enumerate as enumerate_stage
from tests.conftest import ROOT

MODEL = "Llama-3.1-8B"
WORKLOAD = {
    "rows": 200,
    "isl": {"mean": 700.0, "p50": 600.0, "p90": 1500.0, "p99": 1900.0, "min": 50.0, "max": 2000.0},
    "osl": {"mean": 40.0, "p50": 40.0, "p90": 60.0, "p99": 64.0, "min": 8.0, "max": 64.0},
}
ENUMERATE = {
    "model": MODEL,
    "gpus": ["h100"],
    "weight_quants": ["bf16"],
    "kv_dtypes": ["bf16"],
    "parallel": {"tp": [1]},
    "modes": ["aggregated"],
    "max_context_len": 4096,
    "aggregated": {"max_num_seqs": [64], "max_num_batched_tokens": [2048]},
}


def canonical_trace(n: int, mean_gap_s: float, seed: int = 3) -> pa.Table:
    """`n` Poisson arrivals `mean_gap_s` apart, ISL 50–2000, OSL 8–64, every other canonical column null."""
    rng = np.random.default_rng(seed)
    cols = {
        "request_id": np.arange(n, dtype=np.int64),
        "arrival_s": np.cumsum(rng.exponential(mean_gap_s, n)),
        "isl": rng.integers(50, 2000, n),
        "osl": rng.integers(8, 64, n),
        "source_row": np.arange(n, dtype=np.int64),
    }
    return pa.table(
        {f.name: cols[f.name] if f.name in cols else pa.nulls(n, f.type) for f in CANONICAL_SCHEMA},
        schema=CANONICAL_SCHEMA,
    )


def first_candidate(tmp: Path, params: dict) -> dict:
    """Write `params` (with `ENUMERATE` as its enumerate section) to tmp/params.yaml, run the enumerate stage on
    `WORKLOAD` into tmp/candidates.parquet and return its first row."""
    (tmp / "params.yaml").write_text(
        yaml.safe_dump({"trace": {"file": "unused.jsonl"}, "enumerate": ENUMERATE} | params)
    )
    (tmp / "workload.json").write_text(json.dumps(WORKLOAD))
    assert (
        enumerate_stage.main(
            [
                "--params",
                str(tmp / "params.yaml"),
                "--catalog-dir",
                str(ROOT / "llmcap/catalog/data"),
                "--workload",
                str(tmp / "workload.json"),
                "--candidates",
                str(tmp / "candidates.parquet"),
                "--report-dir",
                str(tmp / "enumerate"),
            ]
        )
        == 0
    )
    return pq.read_table(tmp / "candidates.parquet").to_pandas().iloc[0].to_dict()
