"""`llmcap profile --cache-hit`: TTFT timed also with part of the prompt in the prefix cache (a request alone
whose leading blocks the one just before it left cached), against a real `llmcap twin serve` process, whose
prefix cache names blocks as vLLM's does. The points say the share, and the fit takes those prefill rows."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from llmcap.cli import app
from tests.twin._twin import twin_server

pytestmark = [pytest.mark.timeout(120)]


def test_ttft_at_a_cache_hit_is_timed_and_faster_than_cold(tmp_path: Path) -> None:
    args = ["--isl", "2048", "--concurrency", "1", "--repeats", "2", "--osl", "8", "--cache-hit", "0.75", "--json"]
    with twin_server("-m", "Llama-3.1-8B", "-g", "h100") as (_, url):
        r = CliRunner().invoke(app, ["profile", "--endpoint", url, "--out", str(tmp_path / "p"), *args])
    assert r.exit_code == 0, r.output
    points = pq.read_table(tmp_path / "p" / "points.parquet").to_pylist()
    cold = next(p for p in points if p["cache_hit"] == 0.0 and p["concurrency"] == 1)
    warm = next(p for p in points if p["cache_hit"] > 0)
    assert warm["cache_hit"] == 1536 / 2048 and warm["requests"] == 2 * 2  # 2 probes per repeat, 2 repeats
    # a quarter of the prompt to compute: far less than the whole, more than nothing (the step's fixed cost)
    assert 0 < warm["ttft_s"] < 0.6 * cold["ttft_s"]
    steps = pq.read_table(tmp_path / "p" / "steps.parquet").to_pylist()
    assert sum(s["kind"] == "prefill" for s in steps) == 2  # the cold TTFT and the cached one
    assert json.loads(r.stdout)["points"] == points


def test_a_share_outside_zero_to_one_is_refused(tmp_path: Path) -> None:
    r = CliRunner().invoke(
        app, ["profile", "--endpoint", "http://127.0.0.1:9", "--cache-hit", "0.5,1", "--out", str(tmp_path)]
    )
    assert r.exit_code == 2 and "--cache-hit shares lie strictly between 0 and 1" in r.output
