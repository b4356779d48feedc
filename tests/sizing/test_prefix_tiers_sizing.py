"""`size --tier`: a prefix cache tier below HBM enters the sizing. On a trace whose repeated prompts outgrow one
instance's HBM (the engine states 20,000 KV tokens), a host tier holding them all turns recomputed prefills into
loads and the plan needs fewer GPUs; the same tier behind a 100 ms lookup costs more than it saves, every
admission pays it in TTFT, and the plan needs more. The plan's replay says what each tier did (`prefix_tiers`)."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest
from typer.testing import CliRunner

from llmcap.cli import app
from llmcap.trace import write_table
from llmcap.trace.schema import metadata

N, PROMPTS, ISL, RATE = 600, 60, 4096, 30.0


@pytest.fixture(scope="module")
def reuse(tmp_path_factory):
    """60 distinct 4,096-token prompts (8 hash blocks of 512), each asked about 10 times at random, 30 req/s: 245,760
    tokens of prefixes against an HBM of 20,000."""
    rng = np.random.default_rng(0)
    which = rng.integers(0, PROMPTS, N)
    table = pa.table(
        {
            "request_id": np.arange(N),
            "arrival_s": np.cumsum(rng.exponential(1 / RATE, N)),
            "isl": np.full(N, ISL),
            "osl": np.full(N, 16),
            "hash_ids": pa.array([[int(p) * 100 + j for j in range(ISL // 512)] for p in which], pa.list_(pa.int64())),
        }
    ).replace_schema_metadata(metadata(source_format="test", source_file="test", block_size=512, start="+0.000s"))
    d = tmp_path_factory.mktemp("tiers")
    trace = write_table(table, d / "reuse.parquet")
    log = d / "engine.log"
    log.write_text("INFO 12-06 09:00:00 [kv_cache_utils.py:1] GPU KV cache size: 20,000 tokens\n")
    return d, trace, log


EIGHT_B = ("Llama-3.1-8B", "1", "bf16", "1000")
SEVENTY_B = ("Llama-3.1-70B", "2", "fp8", "2000")


def _size(reuse, *tier: str, model: tuple[str, str, str, str] = EIGHT_B) -> dict:
    d, trace, log = reuse
    name, tp, fmt, ttft_ms = model
    out = d / ("-".join(["plan", name, *(t.replace(":", "_") for t in tier)]))
    args = [
        "size",
        "--trace",
        str(trace),
        "--model",
        name,
        "--gpu",
        "h100",
        "--tp",
        tp,
        "--weight-quant",
        fmt,
        "--kv-dtype",
        fmt,
        "--goodput",
        f"ttft:{ttft_ms}",
        "--kv-from-log",
        str(log),
        "--out",
        str(out),
        "--json",
    ]
    for t in tier:
        args += ["--tier", t]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout) | {"_summary": str(out / "summary.json")}


def _replay(reuse, plan: dict) -> dict:
    r = CliRunner().invoke(app, ["simulate", "--trace", str(reuse[1]), "--plan", plan["_summary"], "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_a_host_tier_lowers_the_gpus_and_a_slow_lookup_raises_them_and_the_ttft(reuse) -> None:
    none, host, slow = _size(reuse), _size(reuse, "host:200:50"), _size(reuse, "host:200:50:100")
    assert none["prefix_tiers"] is None
    (fast_tier,), (slow_tier,) = host["prefix_tiers"], slow["prefix_tiers"]
    assert fast_tier["tier"] == "host" and fast_tier["hit_tokens"] > 0 and fast_tier["net_gain_s"] > 0
    assert slow_tier["lookup_s"] == pytest.approx(slow_tier["lookups"] * 0.1) and slow_tier["net_gain_s"] < 0
    assert host["gpus"] < none["gpus"] < slow["gpus"]
    # the plans record their tiers: replaying them brings the tier back, and the lookup shows in TTFT
    fast_run, slow_run = _replay(reuse, host), _replay(reuse, slow)
    assert fast_run["prefix_tiers"][0]["hit_tokens"] == fast_tier["hit_tokens"]
    assert slow_run["ttft_ms"]["p50"] >= 100 > fast_run["ttft_ms"]["p50"]
    assert any(n.startswith("prefix tier host") for n in host["notes"])


def test_an_ssd_tier_lowers_the_gpus_where_loading_beats_computing(reuse) -> None:
    """Llama-3.1-70B's prompt tokens take longer to compute at TP2 than their fp8 KV (160 KB a token) takes to load
    from an SSD at 5 GB/s: there the SSD's hits save more than they cost, and the plan needs fewer GPUs."""
    none, ssd = _size(reuse, model=SEVENTY_B), _size(reuse, "ssd:1000:5:0.2", model=SEVENTY_B)
    (tier,) = ssd["prefix_tiers"]
    assert tier["tier"] == "ssd" and tier["hit_tokens"] > 0 and tier["net_gain_s"] > 0
    assert ssd["gpus"] < none["gpus"]
