"""The chosen plan as `vllm serve` command lines (llmcap.vllm_serve): the engine knobs the plan was sized with."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from llmcap.errors import LlmcapError
from llmcap.sizing.units import candidate_key
from llmcap.vllm_serve import serve_commands as _serve_commands


def serve_commands(summary: dict, rows: list[dict], model: str, util: float):
    return _serve_commands(summary, pd.DataFrame(rows), model, util)


def row(role: str, gpu: str, quant: str, kv: str, tp: int, seqs: int, mbt: int, ep: int = 1) -> dict:
    return {
        "role": role,
        "gpu": gpu,
        "weight_quant": quant,
        "kv_dtype": kv,
        "tp": tp,
        "pp": 1,
        "ep": ep,
        "dp": 1,
        "max_num_seqs": seqs,
        "max_num_batched_tokens": mbt,
        "block_size": 16,
        "max_context_len": 32768,
        "feasible": True,
    }


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_aggregated_plan_is_one_command_with_its_knobs() -> None:
    r = row("both", "H100-SXM-80GB", "bf16", "fp8", 4, 256, 2048)
    summary = {
        "mode": "aggregated",
        "pool_plans": {"instances": {"configuration": candidate_key(r), "instances": 3, "gpus_per_instance": 4}},
    }
    (cmd,) = serve_commands(
        summary, [r, row("both", "H100-SXM-80GB", "bf16", "fp8", 8, 256, 2048)], "meta-llama/Llama-3.1-70B", 0.9
    )
    assert (cmd.pool, cmd.instances, cmd.gpus_per_instance, cmd.notes) == ("instances", 3, 4, [])
    assert cmd.argv[:3] == ["vllm", "serve", "meta-llama/Llama-3.1-70B"]
    assert [
        flag(cmd.argv, f)
        for f in (
            "--tensor-parallel-size",
            "--dtype",
            "--kv-cache-dtype",
            "--max-num-seqs",
            "--max-num-batched-tokens",
            "--block-size",
            "--max-model-len",
            "--gpu-memory-utilization",
        )
    ] == ["4", "bfloat16", "fp8", "256", "2048", "16", "32768", "0.9"]
    assert "--kv-transfer-config" not in cmd.argv and "--quantization" not in cmd.argv
    assert cmd.shell.startswith("vllm serve meta-llama/Llama-3.1-70B --tensor-parallel-size 4")


def test_pd_plan_is_a_prefill_and_a_decode_command_with_the_connector() -> None:
    p = row("prefill", "H100-SXM-80GB", "fp8", "fp8", 2, 32, 16384)
    d = row("decode", "H200-SXM-141GB", "fp8", "fp8", 4, 256, 2048)
    summary = {
        "mode": "disaggregated",
        "pool_plans": {
            "prefill": {"configuration": candidate_key(p), "instances": 12, "gpus_per_instance": 2},
            "decode": {"configuration": candidate_key(d), "instances": 2, "gpus_per_instance": 4},
        },
    }
    prefill, decode = serve_commands(summary, [p, d], "m", 0.9)
    assert (prefill.pool, prefill.instances, decode.pool, decode.instances) == ("prefill", 12, "decode", 2)
    assert (
        flag(prefill.argv, "--max-num-batched-tokens") == "16384" and flag(decode.argv, "--tensor-parallel-size") == "4"
    )
    assert flag(prefill.argv, "--quantization") == "fp8"
    for cmd in (prefill, decode):
        assert json.loads(flag(cmd.argv, "--kv-transfer-config")) == {
            "kv_connector": "NixlConnector",
            "kv_role": "kv_both",
        }
        assert any("proxy" in n for n in cmd.notes)
    assert (
        "'--kv-transfer-config' '{" not in prefill.shell and '--kv-transfer-config \'{"kv_connector"' in prefill.shell
    )


def test_a_format_vllm_does_not_quantize_online_and_moe_expert_parallel_are_said() -> None:
    r = row("both", "H200-SXM-141GB", "int4-awq", "bf16", 8, 128, 8192, ep=8)
    summary = {
        "mode": "aggregated",
        "pool_plans": {"instances": {"configuration": candidate_key(r), "instances": 1, "gpus_per_instance": 8}},
    }
    (cmd,) = serve_commands(summary, [r], "m", 0.85)
    assert "--quantization" not in cmd.argv and "--dtype" not in cmd.argv and "--enable-expert-parallel" in cmd.argv
    assert cmd.notes == [
        "weights int4-awq: serve a checkpoint quantized as int4-awq (vLLM reads the method from its config)"
    ]
    assert flag(cmd.argv, "--kv-cache-dtype") == "auto" and flag(cmd.argv, "--gpu-memory-utilization") == "0.85"


def test_a_pool_whose_configuration_is_not_a_feasible_candidate_is_an_error() -> None:
    r = row("both", "H100-SXM-80GB", "bf16", "bf16", 1, 8, 512) | {"feasible": False}
    summary = {
        "mode": "aggregated",
        "pool_plans": {"instances": {"configuration": candidate_key(r), "instances": 1, "gpus_per_instance": 1}},
    }
    with pytest.raises(LlmcapError, match="not a feasible row of the candidates table"):
        serve_commands(summary, [r], "m", 0.9)
