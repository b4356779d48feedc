"""Prefix hashes are scoped to what can share KV: equal blocks of different models or adapters never match, and
tenants' only where isolation is asked for; a trace with one scope keeps its ids."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from llmcap.cli import app
from llmcap.trace import ingest
from llmcap.trace.params import CleanParams, TraceParams

ROWS = [  # three requests starting with the same two blocks; the second on another model, the third for another tenant
    {"arrival_s": 0.0, "isl": 1024, "osl": 10, "model": "a", "tenant": "t1", "hash_ids": [1, 2]},
    {"arrival_s": 1.0, "isl": 1024, "osl": 10, "model": "b", "tenant": "t1", "hash_ids": [1, 2]},
    {"arrival_s": 2.0, "isl": 1024, "osl": 10, "model": "a", "tenant": "t2", "hash_ids": [1, 2]},
]


def _write(tmp_path, rows) -> str:
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _hashes(path: str, scope: list[str] | None = None) -> tuple[list, str]:
    clean = CleanParams() if scope is None else CleanParams(prefix_scope=scope)
    r = ingest(path, TraceParams(file=path, block_size=512), clean)
    return r.trace.column("hash_ids").to_pylist(), r.report.prefix_scope


def test_other_models_never_share_blocks_and_the_same_model_does(tmp_path) -> None:
    hashes, line = _hashes(_write(tmp_path, ROWS))
    a1, b, a2 = hashes
    assert a1 == a2 and not set(a1) & set(b)  # model a's two requests still share both blocks; model b shares none
    assert "scoped by model: 2 scopes" in line


def test_isolated_tenants_share_nothing(tmp_path) -> None:
    (a1, b, a2), line = _hashes(_write(tmp_path, ROWS), ["model", "tenant"])
    assert not (set(a1) & set(a2)) and not (set(a1) & set(b)) and "model + tenant: 3 scopes" in line


def test_unscoped_and_single_scope_traces_keep_their_ids(tmp_path) -> None:
    assert _hashes(_write(tmp_path, ROWS), [])[0] == [[1, 2], [1, 2], [1, 2]]
    one_model = [dict(r, model="a") for r in ROWS]
    assert _hashes(_write(tmp_path, one_model), ["model", "adapter"]) == ([[1, 2], [1, 2], [1, 2]], "")


def test_adapters_are_scoped_like_models(tmp_path) -> None:
    rows = [dict(r, model="a", adapter=f"lora{i % 2}") for i, r in enumerate(ROWS)]
    first, second, third = _hashes(_write(tmp_path, rows))[0]
    assert first == third and not set(first) & set(second)  # adapters 0, 1, 0


@pytest.mark.parametrize(("models", "hit"), [("aaa", "ideal token hit 66.7%"), ("aba", "ideal token hit 33.3%")])
def test_the_characterisation_counts_only_reuse_that_can_happen(tmp_path, monkeypatch, models, hit) -> None:
    """Three 1,024-token prompts of the same two 512-token blocks: on one model the 2nd and 3rd hit both blocks (4 of
    6 blocks); when the 2nd runs another model only the 3rd hits (2 of 6), and the account line says why."""
    monkeypatch.delenv("COLUMNS", raising=False)
    path = _write(tmp_path, [dict(r, model=m) for r, m in zip(ROWS, models, strict=True)])
    r = CliRunner().invoke(app, ["trace", "inspect", path, "--hash-block-size", "512"])
    assert r.exit_code == 0, r.output
    assert hit in r.output and ("prefix hashes scoped by model: 2 scopes" in r.output) == (models == "aba")
