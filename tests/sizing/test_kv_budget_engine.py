"""KV budget from the engine (`llmcap.sizing.kvbudget`): the KV capacity a profile's engine stated (or an engine
log's "KV cache size" line) replaces the memory plan's for the configuration it ran, changes the count where
KV binds, and the report shows both numbers."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from llmcap.cli import app
from llmcap.commands._size_sources import from_log
from llmcap.errors import LlmcapError
from llmcap.perf import CalibratedFit, EnvironmentFingerprint, LinearStepModel
from llmcap.planning import StepTimes
from llmcap.sizing.kvbudget import EngineKV, apply_engine_kv, kv_budget_summary
from tests._size_cli import size_args
from tests.conftest import TRACES
from tests.perf.test_profile_table import _profile

runner = CliRunner()
H100 = {"device_sku": "h100", "tp": 1, "pp": 1, "ep": 1, "quantization": "bf16", "kv_dtype": "bf16"}
ROW = {"gpu": "H100-SXM-80GB", "tp": 1, "pp": 1, "ep": 1, "weight_quant": "bf16", "kv_dtype": "bf16"}


def _rows(*variants: dict) -> pd.DataFrame:
    base = ROW | {
        "dp": 1,
        "block_size": 16,
        "kv_tokens_per_instance": 100_000,
        "kv_tokens_per_rank": 100_000,
        "max_context_len": 8192,
        "feasible": True,
        "reason_codes": "",
        "reasons": "",
    }
    return pd.DataFrame([base | v for v in variants]).astype(
        {"kv_tokens_per_instance": "Int64", "kv_tokens_per_rank": "Int64"}
    )


def test_the_engines_number_replaces_the_plans_where_its_configuration_matches() -> None:
    rows = _rows({}, {"tp": 2}, {"dp": 2}, {"max_context_len": 50_000})
    stated = EngineKV(40_003, "engine log x", dict(ROW))
    used, notes = apply_engine_kv(rows, [stated], "engine")
    # whole blocks of 16: 40,003 // 16 × 16 = 40,000 per engine core; DP 2 holds two cores' worth (80,000)
    assert used["kv_tokens_measured"].tolist() == [40_000, pd.NA, 80_000, 40_000]
    assert used["kv_tokens_planned"].tolist() == [100_000] * 4
    assert used["kv_tokens_per_instance"].tolist() == [40_000, 100_000, 80_000, 40_000]
    assert used["kv_tokens_per_rank"].tolist() == [40_000, 100_000, 40_000, 40_000]
    # 40,000 tokens per rank no longer hold one 50,000-token request: that row drops out, saying why
    assert used["feasible"].tolist() == [True, True, True, False]
    assert (
        used["reasons"].iloc[3] == "the engine's KV holds 40,000 tokens/rank < one max-context request (50,000 tokens)"
    )
    assert notes[0] == (
        "KV budget of H100-SXM-80GB TP1 PP1 EP1, weights bf16, KV bf16: memory plan 100,000 KV tokens per instance, "
        "engine 40,000 (-60%) from engine log x; sizing uses the engine's"
    )
    assert kv_budget_summary(used)[0] == {
        "configuration": "H100-SXM-80GB TP1 PP1 EP1, weights bf16, KV bf16",
        "planned": [100_000],
        "measured": 40_000,
        "used": 40_000,
    }
    # size.kv_budget: plan keeps the memory plan's numbers and still shows the engine's beside them
    kept, notes = apply_engine_kv(rows, [stated], "plan")
    assert kept["kv_tokens_per_instance"].tolist() == [100_000] * 4 and kept["kv_tokens_measured"].iloc[0] == 40_000
    assert kept["feasible"].all() and notes[0].endswith("sizing uses the memory plan's (size.kv_budget: plan)")
    # a number of another configuration changes nothing, and says so
    other, notes = apply_engine_kv(rows, [EngineKV(1, "profile p", ROW | {"gpu": "H200-SXM-141GB"})], "engine")
    assert (
        other["kv_tokens_per_instance"].tolist() == rows["kv_tokens_per_instance"].tolist()
        and "matches no candidate" in notes[0]
    )


def test_an_engine_log_states_the_capacity_of_the_one_configuration_searched(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    log.write_text(
        "INFO [kv_cache_utils.py:1087] GPU KV cache size: 123,456 tokens, Maximum concurrency for 8,192 tokens per request: 15.07x\n"
    )
    kv = from_log(log, _rows({}, {"max_num_batched_tokens": 2048}))
    assert kv.tokens == 123_456 and kv.match == ROW and "GPU KV cache size: 123,456 tokens" in kv.source
    with pytest.raises(LlmcapError, match=r"considers several \(--tp 1, 2\): narrow them"):
        from_log(log, _rows({}, {"tp": 2}))
    assert from_log(log, _rows({}, {"tp": 2}), {"tp": 2}).match == {"tp": 2}  # --profile says which
    (tmp_path / "empty.log").write_text("INFO starting\n")
    with pytest.raises(LlmcapError, match='no "KV cache size: N tokens" line'):
        from_log(tmp_path / "empty.log", _rows({}))


def test_the_pipeline_reads_the_profiles_capacity_from_step_model_json(tmp_path: Path) -> None:
    info = {
        "source": "profile",
        "model": "Llama-3.1-8B",
        "fingerprint": H100 | {"engine": "vllm"},
        "fingerprint_hash": "ab" * 32,
        "stored_profile": "data/profiles/target",
        "kv_capacity_tokens": 40_000,
        "corrections": [],
        "step_model": CalibratedFit(LinearStepModel(overhead_s=0.01), 0.0, ("overhead_s",), 3, 0.0, 0.0).to_dict(),
    }
    path = tmp_path / "step_model.json"
    path.write_text(json.dumps(info))
    (kv,) = StepTimes.read(path).engine_kv
    assert (kv.tokens, dict(kv.match)) == (
        40_000,
        ROW,
    ) and kv.source == f"profile data/profiles/target (fingerprint {'ab' * 6})"
    path.write_text(
        json.dumps(info | {"source": "roofline-fallback"})
    )  # a stale profile states nothing for this target
    assert StepTimes.read(path).engine_kv == ()


# fast steps: what limits one instance is the KV its decodes hold, once the engine states a small cache
FAST = LinearStepModel(overhead_s=0.01, per_prefill_token_s=2e-5, per_decode_seq_s=1e-4)
ENGINE_KV = 16_000


def _write_profile(tmp_path: Path, name: str, kv_capacity_tokens: int | None) -> Path:
    fit = CalibratedFit(FAST, 0.0, ("overhead_s", "per_prefill_token_s", "per_decode_seq_s"), 10, 0.01, 0.02)
    prof = replace(
        _profile(),
        fingerprint=EnvironmentFingerprint(engine="vllm", engine_version="0.32.0", model_id="m", **H100),
        fit=fit,
        manifest={"source": "test", "kv_capacity_tokens": kv_capacity_tokens},
    )
    return prof.write(tmp_path / name)


def test_a_smaller_engine_kv_raises_the_count_and_the_report_shows_both(tmp_path: Path) -> None:
    trace = tmp_path / "azure_head.csv"
    trace.write_text("\n".join(TRACES["azure_conv"].read_text().splitlines()[:1201]) + "\n")
    base = size_args(
        "--target-rps",
        "20",
        trace=trace,
        quant="bf16",
        excerpt=200,
        slos=("--goodput", "ttft:2000", "--goodput", "itl:100", "--attainment", "0.95"),
    )
    planned = runner.invoke(app, [*base, "--profile", str(_write_profile(tmp_path, "plan", None))])
    assert planned.exit_code == 0, planned.output
    out = tmp_path / "out"
    r = runner.invoke(app, [*base, "--profile", str(_write_profile(tmp_path, "engine", ENGINE_KV)), "--out", str(out)])
    assert r.exit_code == 0, r.output
    p, s = json.loads(planned.stdout), json.loads(r.stdout)
    table = pq.read_table(out / "capacity.parquet").to_pylist()
    plan_kv = next(t["kv_tokens_planned"] for t in table if t["candidate"] == s["chosen"])
    (budget,) = s["kv_budget"]
    # 16,000 is whole blocks of 16; the memory plan gives this H100 far more (Llama-3.1-8B bf16: 128 KiB per token in ~50 GiB,
    # a little less the larger a candidate's chunk: its activations), one number per chunk size searched
    assert p["kv_budget"] == [] and budget["configuration"] == "H100-SXM-80GB TP1 PP1 EP1, weights bf16, KV bf16"
    assert (budget["measured"], budget["used"]) == (ENGINE_KV, ENGINE_KV) and plan_kv in budget["planned"]
    assert (
        budget["planned"] == sorted({t["kv_tokens_planned"] for t in table}) and min(budget["planned"]) > 10 * ENGINE_KV
    )
    # KV-bound: a decode batch of ~12 requests of ~1.3k tokens instead of 256 carries a fraction of the rate, so more instances
    assert s["max_rps_per_unit"] < 0.5 * p["max_rps_per_unit"] and s["instances"] > p["instances"]
    assert {(t["kv_tokens_measured"], t["kv_tokens_used"]) for t in table} == {(ENGINE_KV, ENGINE_KV)}
    md = (out / "capacity.md").read_text()
    assert (
        f"KV tokens per instance planned {plan_kv:,}, measured {ENGINE_KV:,} → sized with the engine's {ENGINE_KV:,}"
        in md
    )
    low, high = budget["planned"][0], budget["planned"][-1]
    assert (
        f"memory plan {low:,}–{high:,} KV tokens per instance, engine {ENGINE_KV:,} from profile {tmp_path / 'engine'}"
        in md
    )  # the note
    # the engine's own startup line gives the same plan as the profile's recorded number
    log = tmp_path / "engine.log"
    log.write_text(
        f"(EngineCore pid=1) INFO [kv_cache_utils.py:2327] GPU KV cache size: {ENGINE_KV:,} tokens, Maximum concurrency ...\n"
    )
    logged = runner.invoke(
        app, [*base, "--profile", str(_write_profile(tmp_path, "plan2", None)), "--kv-from-log", str(log)]
    )
    assert logged.exit_code == 0, logged.output
    assert json.loads(logged.stdout)["instances"] == s["instances"]
    # the console says it too
    console = runner.invoke(app, [arg for arg in base if arg != "--json"] + ["--profile", str(tmp_path / "engine")])
    assert (
        console.exit_code == 0
        and f"engine {ENGINE_KV:,}, sized with {ENGINE_KV:,} tokens per instance" in console.stdout
    )
