"""`llmcap perf`: JSON for machines, tables for people, one error line on bad input (through the real CLI)."""

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from llmcap.catalog import get_gpu, load_model
from llmcap.cli import app
from llmcap.memory import MemoryParams, plan_memory
from llmcap.parallelism import Parallelism
from llmcap.perf import StepBatch, build_step_model, decode_step_time, prefill_time

runner = CliRunner()


def _run(*args: str):
    return runner.invoke(app, ["perf", *args])


def test_json_keys_and_numbers_for_llama_8b():
    r = _run("--model", "Llama-3.1-8B", "--gpu", "h100", "--isl", "2048", "--osl", "1024", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    for key in ("prefill_time_s", "decode", "max_batch_kv", "throughput", "breakdown", "params"):
        assert key in out, key
    m = build_step_model("Llama-3.1-8B", "h100")
    assert out["prefill_time_s"] == prefill_time(m, 2048)[0]
    # KV-limited batch for 2048 + 1024 tokens, from the memory plan; the engine cap (256) does not bind here
    kv_max = int(plan_memory(load_model("Llama-3.1-8B"), get_gpu("h100")).max_concurrent_sequences([3072])[0])
    assert out["max_batch_kv"] == kv_max and kv_max < 256
    b = out["throughput"]["batch"]
    assert b == kv_max
    assert [d["batch"] for d in out["decode"]] == [1, 2, 4, 8, 16, 32, 64, 128, b]
    # decode rows at the steady-state mean context ISL + OSL/2 = 2560
    assert out["decode"][0]["step_time_s"] == decode_step_time(m, 1, 2560)[0]
    # throughput = B·OSL / ((OSL − n_p/2)·t_decode(B, 2560) + T_prefill): B prompts of 2048 packed four to a step of
    # 8192 tokens, n_p = ⌈B·2048 / 8192⌉ steps (fewer than OSL here), along which the prompts done decode
    full, rest = divmod(b * 2048, 8192)
    steps = m.step_time(
        StepBatch.build(np.array([8192.0, rest]), np.array([8192.0, rest]) * 2049 / 2, np.array([8192.0, rest]) / 2048)
    )
    n_p = full + (1 if rest else 0)
    assert n_p < 1024
    expected = (
        b * 1024 / ((1024 - n_p / 2) * decode_step_time(m, b, 2560)[0] + full * steps[0] + (steps[1] if rest else 0.0))
    )
    assert out["throughput"]["output_tokens_per_s"] == pytest.approx(expected, rel=1e-12)
    dec1 = {o["op"]: o for o in out["breakdown"]["decode_batch_1"]}
    assert dec1["mlp"]["bound"] == "memory"
    assert {o["op"]: o for o in out["breakdown"]["prefill"]}["mlp"]["bound"] == "compute"
    assert sum(o["time_s"] for o in dec1.values()) == pytest.approx(out["decode"][0]["step_time_s"], rel=1e-12)


def test_max_num_seqs_caps_the_batch_and_tp_options():
    r = _run(
        "-m",
        "Llama-3.1-70B",
        "-g",
        "h200",
        "--tp",
        "4",
        "--isl",
        "256",
        "--osl",
        "256",
        "--max-num-seqs",
        "100",
        "--weight-quant",
        "fp8",
        "--kv-dtype",
        "fp8",
        "--json",
    )
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    # the logits buffer is sized by max_num_seqs, so the KV budget is planned with the same cap
    plan = plan_memory(
        load_model("Llama-3.1-70B"),
        get_gpu("h200"),
        Parallelism(tp=4),
        "fp8",
        "fp8",
        params=MemoryParams(max_num_seqs=100),
    )
    assert out["max_batch_kv"] == int(plan.max_concurrent_sequences([512])[0]) > 100
    assert out["throughput"]["batch"] == 100 and out["decode"][-1]["batch"] == 100
    assert out["compute_dtype"] == "fp8" and out["parallelism"] == {"tp": 4, "pp": 1, "ep": 1}
    ops = {o["op"] for o in out["breakdown"]["decode_max_batch"]}
    assert "tp_allreduce" in ops


def test_table_output():
    r = _run("--model", "Qwen3-30B-A3B", "--gpu", "h100", "--tp", "2", "--ep", "2", "--isl", "2048", "--osl", "128")
    assert r.exit_code == 0, r.output
    for text in ("max batch by KV", "decode step vs batch", "moe_experts", "ep_all_to_all", "communication"):
        assert text in r.stdout, text


def _one_error_line(r) -> str:
    assert r.exit_code == 2, r.output
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    return lines[0]


def test_unknown_gpu_is_one_error_line():
    line = _one_error_line(_run("--model", "Llama-3.1-8B", "--gpu", "v100", "--isl", "10", "--osl", "10", "--json"))
    assert "unknown GPU 'v100'" in line


def test_bad_parallelism_and_no_room_are_one_error_line():
    line = _one_error_line(_run("-m", "Llama-3.1-70B", "-g", "h100", "--tp", "3", "--isl", "10", "--osl", "10"))
    assert "not divisible by TP=3" in line
    # 70B in bf16 (141 GB) on one 80 GB H100
    line = _one_error_line(_run("-m", "Llama-3.1-70B", "-g", "h100", "--isl", "10", "--osl", "10"))
    assert "no room for the KV cache" in line
