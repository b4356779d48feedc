"""Engine metrics over time: scraped /metrics samples as one long table.

SERIES_SCHEMA, one row per sample: `time_s` (seconds on the recorder's clock), `name` (the sample
name, e.g. `vllm:num_requests_waiting`, `vllm:prefix_cache_hits_total`, `..._sum`), `engine` (the
sample's `engine` label, "" where it has none; other label sets of one name and engine are summed)
and `value`. Histogram buckets and `_created` samples are left out. `record` polls an endpoint while
something runs; `read_series` reads a parquet or CSV file with these columns.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from pathlib import Path

import httpx
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
from prometheus_client.parser import text_string_to_metric_families

from llmcap.errors import InputFileError

SERIES_SCHEMA = pa.schema(
    [
        pa.field("time_s", pa.float64(), nullable=False),
        pa.field("name", pa.string(), nullable=False),
        pa.field("engine", pa.string(), nullable=False),
        pa.field("value", pa.float64(), nullable=False),
    ]
)


def samples(text: str) -> dict[tuple[str, str], float]:
    """(sample name, engine) -> value of one /metrics text."""
    out: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.endswith("_bucket") or s.name.endswith("_created"):
                continue
            key = (s.name, s.labels.get("engine", ""))
            out[key] = out.get(key, 0.0) + float(s.value)
    return out


def to_table(scrapes: list[tuple[float, dict[tuple[str, str], float]]]) -> pa.Table:
    rows = [(t, name, engine, v) for t, snap in scrapes for (name, engine), v in sorted(snap.items())]
    cols: list[Sequence[object]] = list(zip(*rows, strict=True)) if rows else [[], [], [], []]
    return pa.Table.from_arrays(
        [pa.array(c, f.type) for c, f in zip(cols, SERIES_SCHEMA, strict=True)], schema=SERIES_SCHEMA
    )


async def record(base_url: str, stop: asyncio.Event, interval_s: float = 1.0, time_scale: float = 1.0) -> pa.Table:
    """Scrape `base_url`/metrics every `interval_s` until `stop` is set (and once more then). Times are
    seconds since the first scrape divided by `time_scale` (a twin's dilation: its seconds, not wall)."""
    scrapes = []
    t0 = time.perf_counter()
    async with httpx.AsyncClient() as client:
        while True:
            r = await client.get(f"{base_url}/metrics", timeout=30.0)
            r.raise_for_status()
            scrapes.append(((time.perf_counter() - t0) / time_scale, samples(r.text)))
            if stop.is_set():
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval_s)
    return to_table(scrapes)


def read_series(path: str | Path) -> pa.Table:
    """A metric series file (.parquet or .csv) with SERIES_SCHEMA's columns."""
    p = Path(path)
    try:
        table = pacsv.read_csv(p) if p.suffix == ".csv" else pq.read_table(p)
    except FileNotFoundError:
        raise InputFileError(p, "file not found") from None
    except (pa.ArrowInvalid, OSError) as exc:
        raise InputFileError(p, f"not a readable {'CSV' if p.suffix == '.csv' else 'parquet'} file ({exc})") from None
    missing = [f.name for f in SERIES_SCHEMA if f.name not in table.column_names]
    if missing:
        raise InputFileError(p, f"missing column(s) {', '.join(missing)} (expected time_s, name, engine, value)")
    table = table.select([f.name for f in SERIES_SCHEMA])
    if table.column("engine").null_count or table.column("time_s").null_count or table.column("value").null_count:
        raise InputFileError(p, 'null time_s, engine or value (engine is "" for a sample without that label)')
    try:
        return table.cast(SERIES_SCHEMA)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise InputFileError(p, f"columns of the wrong type ({exc})") from None
