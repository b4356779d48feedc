"""LoRA adapter slots (`llmcap.lora`): the bytes vLLM's buffers take on each rank, by hand for Llama-3.1-8B, the KV
they leave in the memory plan, and `llmcap size --max-loras` planning and serving with them."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from llmcap.catalog import get_gpu, load_model
from llmcap.cli import app
from llmcap.errors import LlmcapError
from llmcap.lora import lora_slot_bytes
from llmcap.memory import MemoryParams, plan_memory
from llmcap.parallelism import Parallelism
from llmcap.vllm_serve import serve_argv
from tests._size_cli import size_args

LLAMA_8B = load_model("Llama-3.1-8B")  # hidden 4096, 32 heads / 8 KV heads of 128, MLP 14336, 32 layers
# per layer and rank unit (A's in + B's out), TP 1: q 4096+4096, k and v 4096+1024, o 4096+4096, gate and up
# 4096+14336, down 14336+4096 = 81,920
PER_LAYER_TP1 = 8192 + 5120 + 5120 + 8192 + 3 * 18432
# TP 2: column-parallel B halves (q 2048, k/v 512, gate/up 7168), row-parallel A halves (o 2048, down 7168)
PER_LAYER_TP2 = (4096 + 2048) + 2 * (4096 + 512) + (2048 + 4096) + 2 * (4096 + 7168) + (7168 + 4096)


def test_slot_bytes_by_hand() -> None:
    assert PER_LAYER_TP1 == 81_920 and PER_LAYER_TP2 == 55_296
    # one rank-16 slot over 32 layers in bf16: 81,920 × 16 × 32 × 2 B = 83,886,080 B (≈ 84 MB, ~42M parameters)
    assert lora_slot_bytes(LLAMA_8B, 1, 32, 1, 16) == PER_LAYER_TP1 * 16 * 32 * 2 == 83_886_080
    assert lora_slot_bytes(LLAMA_8B, 2, 32, 4, 8) == PER_LAYER_TP2 * 8 * 32 * 2 * 4
    assert lora_slot_bytes(LLAMA_8B, 1, 16, 1, 16) == 83_886_080 // 2  # a PP stage of half the layers
    assert lora_slot_bytes(LLAMA_8B, 1, 32, 0, 16) == 0


def test_a_moe_model_is_refused() -> None:
    with pytest.raises(LlmcapError, match="LoRA slots of a MoE model's experts are not modelled"):
        lora_slot_bytes(load_model("Mixtral-8x7B"), 1, 32, 1, 16)


def test_slots_leave_less_kv_and_show_in_the_breakdown() -> None:
    gpu = get_gpu("h100")
    plain = plan_memory(LLAMA_8B, gpu, Parallelism(tp=1), "fp8", "fp8", 16, MemoryParams())
    lora = plan_memory(LLAMA_8B, gpu, Parallelism(tp=1), "fp8", "fp8", 16, MemoryParams(lora_slots=4))
    taken = 4 * 83_886_080
    assert plain.breakdown.kv_budget_bytes - lora.breakdown.kv_budget_bytes == taken
    assert [(r.label, r.bytes) for r in lora.breakdown.rows if r.kind == "runtime" and "LoRA" in r.label] == [
        ("LoRA slots (4 adapters × rank 16)", taken)
    ]
    # fp8 KV of this model: 32 layers × 8 heads × 128 × 2 (K and V) × 1 B = 65,536 B a token: 5,120 tokens fewer
    assert plain.kv_tokens_per_rank - lora.kv_tokens_per_rank == taken // 65_536 == 5_120


def test_serve_line_enables_the_slots() -> None:
    row = {
        "tp": 1,
        "pp": 1,
        "ep": 1,
        "weight_quant": "fp8",
        "kv_dtype": "fp8",
        "max_num_seqs": 256,
        "max_num_batched_tokens": 2048,
        "block_size": 16,
        "max_context_len": 8192,
    }
    argv, _ = serve_argv(row, "m", 0.9, lora=(4, 32))
    assert argv[argv.index("--enable-lora") :][:5] == ["--enable-lora", "--max-loras", "4", "--max-lora-rank", "32"]
    assert "--enable-lora" not in serve_argv(row, "m", 0.9)[0]


def test_size_with_max_loras_plans_the_smaller_kv_and_serves_with_it(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    trace = tmp_path / "t.csv"
    trace.write_text(
        "arrival_s,isl,osl,adapter\n"
        + "".join(f"{i * 0.5},{500 + i},{50 + i},{'a' if i % 2 else 'b'}\n" for i in range(60))
    )
    args = size_args(trace=trace, excerpt=40)
    plain, lora = (CliRunner().invoke(app, [*args, *extra]) for extra in ((), ("--max-loras", "4")))
    assert plain.exit_code == lora.exit_code == 0, lora.output
    p, q = json.loads(plain.stdout), json.loads(lora.stdout)
    kv = lambda s: s["pool_plans"]["instances"]["headroom"]["memory"]["reasoning"]  # noqa: E731
    assert kv(p) != kv(q)  # the memory item states the instance's KV capacity: smaller with the slots
    assert "--enable-lora" in q["vllm_serve"][0]["argv"] and "--enable-lora" not in p["vllm_serve"][0]["argv"]
    # the note says what was planned: without slots, that the adapters' cost was not; with them, the slots and the batching limit
    assert any("2 adapters" in n and "planned only with --max-loras" in n for n in p["notes"])
    assert any(
        "2 adapters" in n and "4 LoRA slots on every rank" in n and "at most 4 adapters per batch" in n
        for n in q["notes"]
    )
