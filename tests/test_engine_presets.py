"""Engine presets: each engine's own defaults on each GPU (as the engines decide them from the GPU's memory), used
by `size --engine` and `simulate --engine`, with an explicit option still winning."""

from __future__ import annotations

import dataclasses
import json

import pytest
from typer.testing import CliRunner

from llmcap.catalog import get_gpu
from llmcap.cli import app
from llmcap.engine_presets import ENGINE_ADMISSIONS, ENGINES, GIB, engine_preset
from llmcap.policy_names import admission_option
from tests.conftest import TRACES

# (engine, GPU) → (chunk, max batch, KV block), from the cited sources' rules. The GPUs' driver-reported memory:
# H100 81,559 MiB = 79.6 GiB, A100 81,920 MiB (but an A100), L40S 46,068 MiB = 45.0 GiB, B200 183,359 MiB ≥ 160 GiB
EXPECTED = {
    ("vllm", "h100"): (8192, 1024, 16),  # ≥ 70 GiB, not an A100
    ("vllm", "a100"): (2048, 256, 16),  # ≥ 70 GiB but an A100: vLLM keeps the small budget there
    ("vllm", "l40s"): (2048, 256, 16),  # under 70 GiB
    ("vllm", "b200"): (8192, 1024, 16),
    ("sglang", "l40s"): (8192, 4096, 1),  # 35 ≤ 45 GiB < 160 GiB
    ("sglang", "h100"): (8192, 4096, 1),
    ("sglang", "b200"): (16384, 4096, 1),  # ≥ 160 GiB
    ("trtllm", "h100"): (8192, 2048, 32),
    ("trtllm", "l40s"): (8192, 2048, 32),  # TensorRT-LLM's defaults do not depend on the GPU
}


@pytest.mark.parametrize(("engine", "gpu"), sorted(EXPECTED))
def test_each_engines_defaults_on_each_gpu(engine: str, gpu: str) -> None:
    p = engine_preset(engine, get_gpu(gpu))
    assert (p.max_num_batched_tokens, p.max_num_seqs, p.block_size) == EXPECTED[engine, gpu]
    admission_option(p.admission_policy)  # a policy the simulator has
    assert p.sources and p.version and p.engine in p.line()


def test_sglang_keeps_a_small_chunk_below_35_gib() -> None:
    small = dataclasses.replace(get_gpu("l40s"), hbm_bytes=24 * GIB)
    assert engine_preset("sglang", small).max_num_batched_tokens == 2048


def test_the_admission_each_engine_uses() -> None:
    assert {e: engine_preset(e, get_gpu("h100")).admission_policy for e in ENGINES} == {
        "vllm": "vllm",
        "sglang": "sglang",
        "trtllm": "trtllm-guaranteed-no-evict",
    }
    assert {e: offered[0] for e, offered in ENGINE_ADMISSIONS.items()} == {
        e: engine_preset(e, get_gpu("a100")).admission_policy for e in ENGINES
    }


@pytest.fixture
def trace(tmp_path, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    path = tmp_path / "azure_head.csv"
    path.write_text("\n".join(TRACES["azure_conv"].read_text().splitlines()[:301]) + "\n")
    return path


SIZE = [
    "size",
    "--model",
    "Llama-3.1-8B",
    "--tp",
    "1",
    "--weight-quant",
    "fp8",
    "--kv-dtype",
    "fp8",
    "--no-pd",
    "--slo-ttft-p99",
    "2000",
    "--shortlist",
    "2",
    "--excerpt",
    "100",
    "--json",
]


def test_size_for_an_engine_sizes_each_gpu_with_its_own_defaults(trace) -> None:
    r = CliRunner().invoke(app, [*SIZE, "--trace", str(trace), "--gpu", "h100,a100", "--engine", "vllm"])
    assert r.exit_code == 0, r.output
    s = json.loads(r.stdout)
    assert s["admission_policy"] == "vllm" and set(s["engine_preset"]) == {"H100-SXM-80GB", "A100-SXM-80GB"}
    keys = {row["candidate"] for row in s["finalists"] or []} | {s["chosen"]}
    assert any("seqs1024/mbt8192/blk16" in k for k in keys if k.startswith("H100")), keys
    trt = json.loads(
        CliRunner().invoke(app, [*SIZE, "--trace", str(trace), "--gpu", "h100", "--engine", "trtllm"]).stdout
    )
    assert trt["admission_policy"] == "trtllm-guaranteed-no-evict" and trt["chosen"].endswith("seqs2048/mbt8192/blk32")
    explicit = json.loads(
        CliRunner()
        .invoke(
            app, [*SIZE, "--trace", str(trace), "--gpu", "h100", "--engine", "trtllm", "--admission-policy", "vllm"]
        )
        .stdout
    )
    assert explicit["admission_policy"] == "vllm" and explicit["chosen"].endswith("blk32")


def test_simulate_for_an_engine_keeps_what_was_given(trace) -> None:
    args = [
        "simulate",
        "--trace",
        str(trace),
        "--model",
        "Llama-3.1-8B",
        "--gpu",
        "a100",
        "--engine",
        "sglang",
        "--json",
    ]
    preset = json.loads(CliRunner().invoke(app, args).stdout)["engine_preset"]
    assert (preset["max_num_batched_tokens"], preset["block_size"], preset["overridden"]) == (8192, 1, [])
    given = json.loads(CliRunner().invoke(app, [*args, "--max-num-seqs", "64"]).stdout)["engine_preset"]
    assert given["overridden"] == ["max_num_seqs"]


@pytest.mark.parametrize("args", [["--engine", "tgi"], ["--engine", "vllm", "--candidates", "c.parquet"]])
def test_an_unknown_engine_or_fixed_candidates_are_refused(trace, args) -> None:
    r = CliRunner().invoke(app, [*SIZE, "--trace", str(trace), *args])
    assert r.exit_code == 2 and "--engine" in r.stderr
