"""`make bench`: ingestion throughput per format and characterisation time; then the command line's
start and whole-process simulate (`benchmarks.cli`), the simulator (`benchmarks.sim`), the sizing search (`benchmarks.size`), the load generator (`benchmarks.loadgen`), the roofline's
calibrations, cross-validated (`benchmarks.calibration`), the simulator against published engine measurements
(`benchmarks.published`), the installed wheels against the checkout (`benchmarks.wheel`) and `make plan`'s flow per
stage, fresh and up to date (`benchmarks.plan`).

Inputs are generated once (seeded) under .work/bench/ at sizes big enough to time the bulk paths:
each row count is printed with the figures. Each figure is the best of 3 runs (`benchmarks._timing.best_of`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from benchmarks._timing import best_of
from llmcap.config import CharacteriseParams, CleanParams
from llmcap.trace import characterise, clean_trace, read_trace

OUT = Path(__file__).resolve().parent.parent / ".work" / "bench"
ROWS = {"mooncake": 200_000, "azure": 1_000_000, "burstgpt": 1_000_000, "lengths": 1_000_000, "parquet": 1_000_000}


def _lengths(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    return rng.lognormal(7, 1, n).astype(np.int64) + 1, rng.lognormal(5, 1, n).astype(np.int64) + 1


def make_inputs() -> dict[str, Path]:
    OUT.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    files = {}
    n = ROWS["azure"]
    path = files["azure"] = OUT / "azure.csv"
    if not path.exists():
        isl, osl = _lengths(rng, n)
        ns = np.datetime64("2023-11-16T18:00:00", "ns") + np.cumsum(rng.exponential(2e8, n)).astype("timedelta64[ns]")
        stamps = np.datetime_as_string(ns, unit="ns")
        stamps = np.char.replace(stamps, "T", " ")
        text = "\r\n".join(
            f"{s[:-2]},{i},{o}" for s, i, o in zip(stamps.tolist(), isl.tolist(), osl.tolist(), strict=True)
        )
        path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\r\n" + text)
    n = ROWS["burstgpt"]
    path = files["burstgpt"] = OUT / "burstgpt.csv"
    if not path.exists():
        isl, osl = _lengths(rng, n)
        pacsv.write_csv(
            pa.table(
                {
                    "Timestamp": np.cumsum(rng.exponential(0.2, n)).round(3),
                    "Model": np.where(rng.random(n) < 0.8, "ChatGPT", "GPT-4"),
                    "Request tokens": isl,
                    "Response tokens": osl,
                    "Total tokens": isl + osl,
                    "Log Type": np.where(rng.random(n) < 0.5, "Conversation log", "API log"),
                }
            ),
            path,
        )
    n = ROWS["lengths"]
    path = files["lengths"] = OUT / "lengths.csv"
    if not path.exists():
        isl, osl = _lengths(rng, n)
        pacsv.write_csv(pa.table({"num_prefill_tokens": isl, "num_decode_tokens": osl}), path)
    n = ROWS["parquet"]
    path = files["parquet"] = OUT / "generic.parquet"
    if not path.exists():
        isl, osl = _lengths(rng, n)
        pq.write_table(pa.table({"arrival_s": np.cumsum(rng.exponential(0.2, n)), "isl": isl, "osl": osl}), path)
    n = ROWS["mooncake"]
    path = files["mooncake"] = OUT / "mooncake.jsonl"
    if not path.exists():
        isl, osl = _lengths(rng, n)
        ts = np.cumsum(rng.exponential(200, n)).astype(np.int64)
        next_id, lines = 0, []
        for t, i, o in zip(ts.tolist(), isl.tolist(), osl.tolist(), strict=True):
            blocks = -(-i // 512)
            ids = [0] + list(range(next_id + 1, next_id + blocks))
            next_id += blocks
            lines.append(f'{{"timestamp": {t}, "input_length": {i}, "output_length": {o}, "hash_ids": {ids}}}')
        path.write_text("\n".join(lines) + "\n")
    return files


def main() -> None:
    files = make_inputs()
    print(f"{'format':<10} {'rows':>10} {'MB':>8} {'read s':>8} {'clean s':>8} {'rows/s (read+clean)':>20}")
    for fmt, path in files.items():
        read_s, raw = best_of(lambda p=path: read_trace(p))
        clean_s, result = best_of(lambda r=raw: clean_trace(r, CleanParams()))
        rows = raw.rows
        print(
            f"{fmt:<10} {rows:>10,} {path.stat().st_size / 1e6:>8.1f} {read_s:>8.3f} {clean_s:>8.3f} {rows / (read_s + clean_s):>20,.0f}"
        )
    from llmcap.trace import ingest

    conv = Path(__file__).resolve().parent.parent / "data/raw/mooncake/conversation_trace.jsonl"
    table = ingest(conv).trace
    t, _ = best_of(lambda: characterise(table, CharacteriseParams(lru_cache_blocks=[])))
    t_lru, _ = best_of(lambda: characterise(table, CharacteriseParams()))
    print(
        f"characterise Mooncake conversation ({table.num_rows:,} rows): {t:.3f} s without LRU, {t_lru:.3f} s with 3 LRU sizes"
    )
    from benchmarks import calibration, cli, loadgen, plan, published, sim, size, wheel

    cli.main()
    sim.main()
    size.main()
    loadgen.main()
    calibration.main()
    published.main()
    wheel.main()
    plan.main()


if __name__ == "__main__":
    main()
