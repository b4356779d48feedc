"""Issue 38's acceptance for mixed traffic, through the CLI: a trace of two models, two LoRA adapters of one of them and
two isolated tenants is planned as a pool per model, the adapters inside their base model's pool with their cost, no
prefix reuse across tenants, and a fragmentation line."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from llmcap.cli import app
from llmcap.sizing.fleet import ClassPlan, Fleet
from tests._size_cli import size_args

N = 240
BLOCK = 16
SHARED = [1, 2]  # every prompt opens with the same two blocks (one system prompt for every model, adapter and tenant)


def _row(i: int) -> dict:
    model = "code" if i % 3 == 0 else "chat"
    blocks = 3 + i % 5  # 3..7 blocks of 16 tokens: the shared two, then the request's own
    return {
        "arrival_s": i * 0.25,
        "isl": blocks * BLOCK,
        "osl": 20 + (i * 7) % 60,
        "model": model,
        "adapter": ("lora-a" if i % 4 < 2 else "lora-b") if model == "chat" else None,
        "tenant": "t1" if i % 2 == 0 else "t2",
        "hash_ids": [*SHARED, *(10_000 * (i + 1) + j for j in range(blocks - 2))],
    }


ROWS = [_row(i) for i in range(N)]


@pytest.fixture
def trace(tmp_path, monkeypatch) -> Path:
    monkeypatch.delenv("COLUMNS", raising=False)
    path = tmp_path / "mixed.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return path


def _scopes(rows: list[dict], labels: tuple[str, ...]) -> int:
    return len({tuple(r[k] for k in labels) for r in rows})


def _hit_ratio(rows: list[dict], labels: tuple[str, ...]) -> float:
    """Each scope's first request reuses nothing; every later one reuses the two shared blocks (32 tokens)."""
    return len(SHARED) * BLOCK * (len(rows) - _scopes(rows, labels)) / sum(r["isl"] for r in rows)


def _run(*args: str) -> tuple[int, dict]:
    r = CliRunner().invoke(app, list(args))
    assert r.exit_code in (0, 1), r.output
    return r.exit_code, json.loads(r.stdout)


def test_isolated_tenants_reuse_no_prefix_across_the_boundary(trace, tmp_path) -> None:
    """Ideal prefix hits: one scope for the whole trace (239 requests hit 32 tokens), model + adapter (3 scopes: chat/lora-a,
    chat/lora-b, code: 237 hit), model + adapter + tenant (6 scopes: 234 hit)."""
    ratios = {}
    for scope, labels in (
        ("none", ()),
        ("model,adapter", ("model", "adapter")),
        ("model,adapter,tenant", ("model", "adapter", "tenant")),
    ):
        _, summary = _run(
            "trace", "inspect", str(trace), "--hash-block-size", str(BLOCK), "--prefix-scope", scope, "--json"
        )
        ratios[scope] = summary["prefix"]["ideal_hit_ratio"]
        assert ratios[scope] == pytest.approx(_hit_ratio(ROWS, labels))
    assert (
        _scopes(ROWS, ()) == 1
        and _scopes(ROWS, ("model", "adapter")) == 3
        and _scopes(ROWS, ("model", "adapter", "tenant")) == 6
    )
    assert ratios["none"] > ratios["model,adapter"] > ratios["model,adapter,tenant"]
    out = tmp_path / "clean.parquet"
    r = CliRunner().invoke(
        app,
        [
            "trace",
            "clean",
            str(trace),
            "-o",
            str(out),
            "--hash-block-size",
            str(BLOCK),
            "--prefix-scope",
            "model,adapter,tenant",
        ],
    )
    assert r.exit_code == 0, r.output
    table = pq.read_table(out).to_pylist()
    blocks = {t: {b for row in table if row["tenant"] == t for b in row["hash_ids"]} for t in ("t1", "t2")}
    assert blocks["t1"] and blocks["t2"] and not blocks["t1"] & blocks["t2"]
    # the canonical trace's own column counts the scoped reuse too: the same 6 first requests hit nothing
    assert sum(row["prefix_hit_tokens"] for row in table) == len(SHARED) * BLOCK * (N - 6)


def test_a_pool_per_model_with_the_adapters_inside_and_their_cost(trace, tmp_path) -> None:
    code, fleet = _run(
        *size_args(
            *("--hash-block-size", str(BLOCK), "--prefix-scope", "model,adapter,tenant"),
            *("--max-loras", "2", "--max-lora-rank", "16", "--out", str(tmp_path / "plan")),
            trace=trace,
            models=("chat=Llama-3.1-8B", "code=Qwen2.5-7B"),
        )
    )
    assert code == 0
    chat, coder = fleet["classes"]
    assert (chat["label"], chat["model"], chat["requests"]) == ("chat", "Llama-3.1-8B", 160)  # i % 3 != 0: 2 of every 3
    assert (coder["label"], coder["model"], coder["requests"]) == ("code", "Qwen2.5-7B", 80)
    chat_rows = [r for r in ROWS if r["model"] == "chat"]
    assert chat["adapters"] == {
        "lora-a": sum(r["adapter"] == "lora-a" for r in chat_rows),
        "lora-b": sum(r["adapter"] == "lora-b" for r in chat_rows),
    }
    assert chat["adapters"] == {"lora-a": 80, "lora-b": 80}  # i % 4 < 2 splits the chat requests evenly
    assert coder["adapters"] == {} and coder["adapter_cost"] == ""
    # Llama-3.1-8B at TP1, rank 16, per layer: A (16 × in) and B (out × 16) on q, o (4096 → 4096), k, v (4096 → 1024),
    # gate, up (4096 → 14336), down (14336 → 4096) = 16 × 81,920 values; × 32 layers × 2 slots × 2 bytes = 167,772,160 B.
    # fp8 KV: 2 × 32 layers × 8 heads × 128 × 1 B = 65,536 B per token, so 2,560 tokens fewer on every rank.
    held = 16 * 81_920 * 32 * 2 * 2
    assert held == 167_772_160
    assert f"{held / 1e6:,.1f} MB per rank ({held // 65_536:,} KV tokens fewer)" in chat["adapter_cost"]
    assert (
        "2 LoRA slots of rank 16 on every rank" in chat["adapter_cost"]
        and "at most 2 adapters per batch (max_loras)" in chat["adapter_cost"]
    )
    # the slots are in the chat pool's memory plan: its summary's candidates carry max_loras 2; the code pool holds none
    assert "share Llama-3.1-8B's pools: 2 LoRA slots" in " ".join(
        json.loads((tmp_path / "plan" / "chat" / "summary.json").read_text())["notes"]
    )
    # prefix reuse inside each pool, tenants apart: chat has 4 scopes (2 adapters × 2 tenants), code 2
    for c, rows, scopes in ((chat, chat_rows, 4), (coder, [r for r in ROWS if r["model"] == "code"], 2)):
        assert c["prefix_hit_ratio"] == pytest.approx(
            len(SHARED) * BLOCK * (len(rows) - scopes) / sum(r["isl"] for r in rows)
        )
    single = fleet["single_model_view"]
    assert single["model"] == "Llama-3.1-8B" and single["requests"] == N and single["gpus"] is not None
    assert (
        fleet["gpus"] == chat["gpus"] + coder["gpus"] and fleet["fragmentation_gpus"] == fleet["gpus"] - single["gpus"]
    )
    # what the console prints for the same plan
    lines = Fleet(tuple(ClassPlan(**c) for c in fleet["classes"]), ClassPlan(**single)).lines()
    assert lines[1].startswith("fragmentation: the whole trace as one total of ")
    assert (
        ClassPlan(**chat)
        .details()[0]
        .startswith("2 adapters (lora-a 80, lora-b 80 requests) inside Llama-3.1-8B's pool: ")
    )
