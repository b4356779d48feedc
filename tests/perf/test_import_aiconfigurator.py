"""benchmarks/gpu/import_aiconfigurator.py: the public per-operation timings of aiconfigurator-core turned
into calibration sets, each row with the FLOPs and bytes the roofline counts and a named source."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from benchmarks.gpu import import_aiconfigurator as imp
from llmcap.perf import calibration as cal

DEVICE = "NVIDIA H100 80GB HBM3"


def _write(root: Path, rel: str, rows: list[dict]) -> None:
    path = root / "aiconfigurator_core/systems/data/h100_sxm" / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame([{"framework": "VLLM", "device": DEVICE, **r} for r in rows]).to_parquet(path)


def _attention(**kw) -> dict:
    return {
        "kernel_source": "vllm_flash_attn_fa3",
        "num_heads": 32,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "beam_width": 1,
        "attn_dtype": "bfloat16",
        "kv_cache_dtype": "bfloat16",
        "window_size": 0,
        **kw,
    }


@pytest.fixture
def wheel(tmp_path: Path) -> imp.Wheel:
    (tmp_path / "aiconfigurator_core-9.1.dist-info").mkdir()
    (tmp_path / "aiconfigurator_core-9.1.dist-info/METADATA").write_text("Name: aiconfigurator-core\nVersion: 9.1\n")
    gemm = {"kernel_source": "torch.nn.functional.linear", "gemm_dtype": "bfloat16", "n": 4096, "k": 1024}
    _write(tmp_path, "gemm/vllm/0.9.0/gemm_perf.parquet", [{**gemm, "m": 8, "latency": 1.0}])
    _write(
        tmp_path,
        "gemm/vllm/0.24.0/gemm_perf.parquet",
        [
            {**gemm, "m": 8, "latency": 0.02},
            {**gemm, "m": 3, "latency": 0.02},  # not a power of two: left out
            {**gemm, "gemm_dtype": "fp8", "kernel_source": "CutlassFP8ScaledMMLinearKernel", "m": 16, "latency": 0.01},
            {
                **gemm,
                "gemm_dtype": "fp8_block",
                "kernel_source": "DeepGemmFp8BlockScaledMMKernel",
                "m": 16,
                "latency": 0.01,
            },
        ],
    )
    _write(
        tmp_path,
        "attention/vllm/0.24.0/context_attention_perf.parquet",
        [
            _attention(batch_size=2, isl=1024, step=0, latency=0.05),
            _attention(batch_size=2, isl=1024, step=0, latency=0.05, window_size=128),  # sliding window: left out
            _attention(
                batch_size=2, isl=1024, step=0, latency=0.05, kernel_source="vllm_flash_attn_fa4"
            ),  # not vLLM's pick
        ],
    )
    _write(
        tmp_path,
        "attention/vllm/0.24.0/generation_attention_perf.parquet",
        [_attention(batch_size=4, isl=1, step=511, latency=0.03)],
    )
    _write(
        tmp_path,
        "comm/vllm/0.24.0/custom_allreduce_perf.parquet",
        [
            {
                "kernel_source": "vLLM_custom_graph",
                "backend": "vllm_graph",
                "allreduce_dtype": "bfloat16",
                "num_gpus": 4,
                "message_size": 1 << 20,
                "latency": 0.02,
            },
            {
                "kernel_source": "vLLM_custom_eager",
                "backend": "vllm_eager",
                "allreduce_dtype": "bfloat16",
                "num_gpus": 4,
                "message_size": 1 << 20,
                "latency": 0.05,
            },
        ],
    )
    return imp.Wheel(tmp_path)


def test_rows_carry_the_rooflines_flops_and_bytes_and_name_their_source(wheel, tmp_path):
    doc = imp.calibration_set(wheel, "h100_sxm")
    rows = {(r["op"], r["dtype"]): r for r in doc["rows"]}
    assert sorted(rows) == [
        ("allreduce", "bf16"),
        ("attn_decode", "bf16"),
        ("attn_prefill", "bf16"),
        ("gemm", "bf16"),
        ("gemm", "fp8"),
    ]
    bf16 = rows["gemm", "bf16"]  # the newest engine version's file; milliseconds become seconds
    assert (bf16["m"], bf16["time_s"], bf16["flops"]) == (8, 2e-5, 2.0 * 8 * 4096 * 1024)
    assert bf16["bytes"] == 4096 * 1024 * 2 + 8 * 1024 * 2 + 8 * 4096 * 2
    assert rows["gemm", "fp8"]["bytes"] == 4096 * 1024 + 16 * 1024 + 16 * 4096 * 2
    pre = rows["attn_prefill", "bf16"]
    assert (pre["tokens"], pre["pairs"]) == (2048, 2 * 1024 * 1025 / 2) and pre["flops"] == 4.0 * pre[
        "pairs"
    ] * 32 * 128
    assert pre["bytes"] == 2048 * (2 * 4 * 128 * 2 + 2 * 32 * 128 * 2)  # KV written, query read, output written
    dec = rows["attn_decode", "bf16"]
    assert dec["context"] == 512 and dec["bytes"] == 4 * 512 * (2 * 4 * 128 * 2) + 4 * (
        2 * 4 * 128 * 2 + 2 * 32 * 128 * 2
    )
    ar = rows["allreduce", "bf16"]
    assert (ar["ranks"], ar["bytes"], ar["time_s"]) == (
        4,
        2.0 * (1 << 20),
        2e-5,
    )  # the CUDA-graph backend; elements of bf16
    for r in doc["rows"]:
        src = doc["sources"][r["source"]]
        assert src["licence"] == "Apache-2.0" and src["url"] == "https://pypi.org/project/aiconfigurator-core/9.1/"
        assert src["device"] == DEVICE and src["file"].startswith("aiconfigurator_core/systems/data/h100_sxm/")
    assert doc["sources"]["h100_sxm/gemm"]["engine"] == "vllm 0.24.0"
    imp.write(doc, tmp_path / "ops.json")
    assert json.loads((tmp_path / "ops.json").read_text()) == doc
    loaded, env = cal.load_rows(tmp_path / "ops.json")
    assert len(loaded) == 5 and env["device"] == DEVICE and loaded.ranks.tolist().count(4.0) == 1
