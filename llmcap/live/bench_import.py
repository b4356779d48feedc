"""Import the per-request JSON `vllm bench serve --save-result --save-detailed` writes, as a profile source.

The keys read (vLLM 0.32 `vllm/benchmarks/serve.py`; times in seconds):
- input_lens, output_lens: per request prompt and generated tokens (0 output for failed requests);
- ttfts: per request time to first token (0.0 for failed ones); itls: per request list of gaps;
- errors: per request "" or the error; start_times (newer versions): perf_counter at send;
- max_concurrency (null for a pure request-rate run), request_rate ("inf" or a number),
  duration, model_id, backend, date.
Without `--save-detailed` the per-request lists are absent and the file cannot be imported.

`points` groups successful requests by ISL bucket (powers of two) into POINTS_SCHEMA rows; the
concurrency of a row is the run's max_concurrency, or, without one, the mean number of requests in
flight (Little's law: Σ latency / duration), rounded. `batch_size` is the same number: the import
cannot see the engine's batches, only the client side.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from llmcap.errors import InputFileError
from llmcap.perf.profile import points_table

REQUIRED = ("input_lens", "output_lens", "ttfts", "itls")


@dataclass(frozen=True)
class BenchRun:
    """One `vllm bench serve` result file."""

    meta: dict  # everything but the per-request lists
    requests: pd.DataFrame  # request, isl, osl, ttft_s, itls (list), e2e_s, start_s, ok, error
    concurrency: int  # max_concurrency, or the mean in flight when the run was rate-driven
    source: str

    def points(self, tp: int = 1, pp: int = 1, ep: int = 1, dp: int = 1) -> pa.Table:
        ok = self.requests[self.requests["ok"]]
        rows = []
        bucket = 2 ** np.ceil(np.log2(ok["isl"].clip(lower=1))).astype(np.int64)
        for _, g in ok.groupby(bucket):
            gaps = np.concatenate([np.asarray(x, dtype=np.float64) for x in g["itls"]]) if len(g) else np.empty(0)
            tpot = [(float(np.sum(x)) / len(x)) for x in g["itls"] if len(x)]
            rows.append(
                {
                    "source": "vllm-bench-serve",
                    "isl": int(np.median(g["isl"])),
                    "osl": int(np.median(g["osl"])),
                    "concurrency": self.concurrency,
                    "batch_size": self.concurrency,
                    "kv_load": None,
                    "cache_hit": 0.0,
                    "tp": tp,
                    "pp": pp,
                    "ep": ep,
                    "dp": dp,
                    "repeats": 1,
                    "requests": len(g),
                    "ttft_s": float(np.median(g["ttft_s"])),
                    "ttft_p90_s": float(np.percentile(g["ttft_s"], 90)),
                    "itl_mean_s": float(gaps.mean()) if gaps.size else None,
                    "itl_p50_s": float(np.percentile(gaps, 50)) if gaps.size else None,
                    "itl_p90_s": float(np.percentile(gaps, 90)) if gaps.size else None,
                    "itl_p99_s": float(np.percentile(gaps, 99)) if gaps.size else None,
                    "itl_max_s": float(gaps.max()) if gaps.size else None,
                    "steady_gaps": int(gaps.size),
                    "decode_context_mean": float(np.mean(g["isl"] + g["osl"] / 2)),
                    "tpot_mean_s": float(np.mean(tpot)) if tpot else None,
                    "preemptions": None,
                }
            )
        return points_table(rows)


def read_vllm_bench(path: str | Path) -> BenchRun:
    path = Path(path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputFileError(path, f"cannot read ({exc})") from None
    except json.JSONDecodeError as exc:
        raise InputFileError(path, f"not JSON ({exc.msg})", line=exc.lineno) from None
    if not isinstance(doc, dict):
        raise InputFileError(path, "not a vllm bench serve result (expected a JSON object)")
    missing = [k for k in REQUIRED if k not in doc]
    if missing:
        raise InputFileError(
            path, f"no per-request {missing}: run `vllm bench serve` with --save-result --save-detailed"
        )
    n = len(doc["input_lens"])
    lengths = {k: len(doc[k]) for k in REQUIRED}
    if any(v != n for v in lengths.values()):
        raise InputFileError(path, f"per-request lists differ in length: {lengths}")
    errors = doc.get("errors") or [""] * n
    itls = [list(x or []) for x in doc["itls"]]
    ttft = np.asarray(doc["ttfts"], dtype=np.float64)
    osl = np.asarray(doc["output_lens"], dtype=np.int64)
    e2e = np.asarray(doc.get("latencies") or (ttft + np.array([sum(x) for x in itls])), dtype=np.float64)
    start = doc.get("start_times")
    requests = pd.DataFrame(
        {
            "request": np.arange(n),
            "isl": np.asarray(doc["input_lens"], dtype=np.int64),
            "osl": osl,
            "ttft_s": ttft,
            "itls": itls,
            "e2e_s": e2e,
            "start_s": np.asarray(start, dtype=np.float64) - min(start) if start else np.full(n, np.nan),
            "ok": [(not e) and o > 0 for e, o in zip(errors, osl, strict=True)],
            "error": [e or "" for e in errors],
        }
    )
    conc = doc.get("max_concurrency")
    if conc is None:
        ok = requests[requests["ok"]]
        duration = float(doc.get("duration") or 0.0)
        conc = max(1, round(float(ok["e2e_s"].sum()) / duration)) if duration > 0 else 1
    meta = {k: v for k, v in doc.items() if not isinstance(v, list)}
    return BenchRun(meta=meta, requests=requests, concurrency=int(conc), source=str(path))
