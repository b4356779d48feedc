"""Offload tiers of the prefix cache (host, SSD, remote): a prompt whose prefix HBM evicted loads it back from the
nearest tier holding it, at that tier's bandwidth, after asking each tier it looks in (its lookup latency); the
summary gives each tier's hits, load and lookup seconds and its net gain (saved prefill − lookup − load)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from llmcap.cli import app
from llmcap.sim import EngineConfig, SimConfig, TierConfig, simulate
from llmcap.trace import write_table
from tests.sim._workloads import MODEL, table

PROMPTS, ROUNDS, ISL, BLOCK = 12, 6, 1024, 16


def _reuse_trace():
    """12 distinct 1,024-token prompts asked in turn, 6 rounds, one every 0.3 s: each prompt's prefix comes
    back after 11 others, more than an HBM of 200 blocks (3 prompts) keeps."""
    n = PROMPTS * ROUNDS
    hashes = [[p * 100 + j for j in range(ISL // 64)] for p in (np.arange(n) % PROMPTS)]
    rows = {"isl": [ISL] * n, "osl": [4] * n, "arrival_s": np.arange(n) * 0.3, "hash_ids": hashes}
    return table(rows, trace_block=64)


def _run(*tiers: TierConfig):
    engine = EngineConfig(
        num_blocks=200,
        block_size=BLOCK,
        max_num_seqs=4,
        max_num_batched_tokens=2048,
        kv_bytes_per_token=1000.0,
        tiers=tiers,
    )
    return simulate(_reuse_trace(), MODEL, SimConfig(engine=engine)).summary


def test_an_ssd_tier_turns_evicted_prefixes_into_loads_and_cuts_ttft() -> None:
    none = _run()
    ssd = TierConfig(name="ssd", blocks=2000, bandwidth_bytes_s=5e9, lookup_s=0.0002)
    s = _run(ssd)
    assert "prefix_tiers" not in none and none["prefix_hit_ratio"] == 0.0  # every prefix evicted before it comes back
    (t,) = s["prefix_tiers"]
    # every round after the first loads each prompt but its last 64-token segment (a segment is hit whole, and
    # the prompt's last token is always computed)
    expected_hits = PROMPTS * (ROUNDS - 1) * (ISL - 64)
    assert t["hit_tokens"] == expected_hits and t["hit_ratio"] == pytest.approx(
        expected_hits / (PROMPTS * ROUNDS * ISL)
    )
    assert t["load_s"] == pytest.approx(expected_hits * 1000.0 / 5e9)  # bytes / bandwidth
    assert t["lookups"] == PROMPTS * ROUNDS and t["lookup_s"] == pytest.approx(
        PROMPTS * ROUNDS * 0.0002
    )  # a miss is asked too
    # the linear stand-in's full 2,048-token chunk: 0.01 + 1e-4·2048 + 1e-7·2048·2049/2 + 1e-3 seconds
    per_token = (0.01 + 1e-4 * 2048 + 1e-7 * 2048 * 2049 / 2 + 1e-3) / 2048
    assert t["saved_prefill_s"] == pytest.approx(expected_hits * per_token)
    assert t["net_gain_s"] == pytest.approx(t["saved_prefill_s"] - t["load_s"] - t["lookup_s"]) and t["net_gain_s"] > 0
    assert s["ttft_ms"]["p50"] < none["ttft_ms"]["p50"] / 2


def test_a_slow_lookup_costs_ttft_and_shows_a_negative_net_gain() -> None:
    fast = _run(TierConfig(name="remote", blocks=2000, bandwidth_bytes_s=5e9, lookup_s=0.0))
    slow = _run(TierConfig(name="remote", blocks=2000, bandwidth_bytes_s=5e9, lookup_s=0.5))
    assert slow["prefix_tiers"][0]["hit_tokens"] == fast["prefix_tiers"][0]["hit_tokens"]
    assert slow["prefix_tiers"][0]["net_gain_s"] < 0 < fast["prefix_tiers"][0]["net_gain_s"]
    assert slow["ttft_ms"]["p50"] > fast["ttft_ms"]["p50"] + 400  # each admission waits half a second on the lookup


def test_a_small_near_tier_passes_what_it_evicts_to_the_next() -> None:
    host = TierConfig(name="host", blocks=300, bandwidth_bytes_s=2e10)  # 4 prompts of 64 blocks
    s = _run(host, TierConfig(name="ssd", blocks=2000, bandwidth_bytes_s=5e9))
    by_name = {t["tier"]: t for t in s["prefix_tiers"]}
    assert list(by_name) == ["host", "ssd"]
    # a prompt comes back after 11 others: the host holds the last 4 evicted, so every load is from the SSD
    assert by_name["host"]["hit_tokens"] == 0 and by_name["ssd"]["hit_tokens"] == PROMPTS * (ROUNDS - 1) * (ISL - 64)


def test_the_command_line_takes_tiers_in_gigabytes_and_prints_each(tmp_path) -> None:
    trace = tmp_path / "t.parquet"
    write_table(_reuse_trace(), trace)
    args = ["simulate", "--trace", str(trace), "--model", "Llama-3.1-8B", "--gpu", "h100", "--num-blocks", "200"]
    r = CliRunner().invoke(app, [*args, "--tier", "ssd:2:5:0.2", "--json"])
    assert r.exit_code == 0, r.output
    (t,) = json.loads(r.stdout)["prefix_tiers"]
    assert t["tier"] == "ssd" and t["hit_tokens"] > 0 and t["lookups"] == PROMPTS * ROUNDS
    table_out = CliRunner().invoke(app, [*args, "--tier", "ssd:2:5:0.2"])
    # an H100 prefills an 8B prompt about as fast as 5 GB/s loads its 128 KiB a token: the line shows the sign
    assert (
        f"tier ssd: {PROMPTS * (ROUNDS - 1) * (ISL - 64):,} prompt tokens loaded" in table_out.stdout
        and f"net {t['net_gain_s']:+,.2f} s" in table_out.stdout
    )
    bad = CliRunner().invoke(app, [*args, "--tier", "ssd:two:5"])
    assert bad.exit_code != 0 and "--tier must be NAME:GB:GBps[:lookup_ms]" in bad.output
