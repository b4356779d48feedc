"""`llmcap memory`: rich tables by default, one JSON object with --json, one clear error on bad input.

Driven through the real CLI (`llmcap.cli.app`), so the registration and the error handling are tested too.
"""

import json

import pytest
from typer.testing import CliRunner

from llmcap.cli import app

MIB = 2**20
runner = CliRunner()


def _run(*args: str):
    return runner.invoke(app, ["memory", *args])


def test_help_names_the_options():
    r = _run("--help")
    assert r.exit_code == 0, r.output
    for opt in (
        "--model",
        "--gpu",
        "--tp",
        "--pp",
        "--ep",
        "--weight-quant",
        "--kv-dtype",
        "--json",
        "--output-format",
    ):
        assert opt in r.output, opt


def test_json_for_llama_8b_on_h100():
    r = _run("--model", "Llama-3.1-8B", "--gpu", "h100", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    weights = 2 * 8_030_261_248
    runtime = 8192 * 2 * (4 * 4096 + 3 * 14336) + 2 * 256 * 128256 * 4 + 512 * MIB + 512 * MIB + 256 * MIB
    budget = int(81559 * MIB * 0.9) - weights - runtime - 256 * MIB
    assert out["params_total"] == out["params_active"] == 8_030_261_248
    assert out["kv_bytes_per_token"] == 131_072
    assert out["weights_bytes_per_rank"] == weights
    assert out["kv_budget_bytes_per_rank"] == budget
    assert out["kv_tokens_per_rank"] == budget // (16 * 131_072) * 16
    assert out["breakdown"][-1] == {"label": "KV cache (bf16, 2 B/elem)", "bytes": budget, "kind": "kv"}


def test_json_has_the_issue_contract_keys():
    r = _run("-m", "Llama-3.1-70B", "-g", "H100-SXM-80GB", "--tp", "4", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    for key in (
        "params_total",
        "params_active",
        "kv_bytes_per_token",
        "weights_bytes_per_rank",
        "kv_budget_bytes_per_rank",
        "kv_tokens_per_rank",
    ):
        assert isinstance(out[key], int), key
    assert out["kv_bytes_per_token"] == 327_680
    norms = 80 * 2 * 8192 + 8192  # replicated on every rank; everything else splits 4 ways
    assert out["weights_bytes_per_rank"] == 2 * (70_553_706_496 - norms) // 4 + 2 * norms


def test_json_for_moe_with_options():
    r = _run(
        "--model",
        "Mixtral-8x7B",
        "--gpu",
        "H100-SXM",
        "--tp",
        "2",
        "--ep",
        "2",
        "--kv-dtype",
        "fp8",
        "--context-len",
        "4096",
        "--json",
    )
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["params_active"] == 12_879_925_248
    assert out["kv_bytes_per_token_per_rank"] == 32 * 2 * 4 * 128 * 1
    assert out["max_concurrent_sequences"] == out["kv_tokens_per_rank"] // 4096


def test_model_from_a_config_path(tmp_path):
    cfg = tmp_path / "tiny" / "config.json"
    cfg.parent.mkdir()
    cfg.write_text(
        json.dumps(
            {
                "model_type": "llama",
                "hidden_size": 256,
                "num_hidden_layers": 4,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "intermediate_size": 512,
                "vocab_size": 1000,
            }
        )
    )
    for model in (str(cfg), str(cfg.parent)):
        r = _run("--model", model, "--gpu", "l40s", "--json")
        assert r.exit_code == 0, r.output
        assert json.loads(r.stdout)["kv_bytes_per_token"] == 2 * 4 * 2 * 64 * 2


def test_table_output():
    r = _run("--model", "Qwen3-8B", "--gpu", "h200", "--tp", "2")
    assert r.exit_code == 0, r.output
    assert "KV tokens / rank" in r.stdout and "weights: dense_mlp" in r.stdout


def _one_error_line(r) -> str:
    assert r.exit_code == 2, r.output
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert "Traceback" not in r.output
    return lines[0]


def test_unknown_gpu_is_one_error_line():
    line = _one_error_line(_run("--model", "Llama-3.1-8B", "--gpu", "v100", "--json"))
    assert "unknown GPU 'v100'" in line and "H100-SXM-80GB" in line


def test_impossible_tp_is_one_error_line():
    line = _one_error_line(_run("--model", "Llama-3.1-70B", "--gpu", "h100", "--tp", "3"))
    assert "64 attention heads are not divisible by TP=3" in line


def test_unknown_model_is_one_error_line():
    line = _one_error_line(_run("--model", "Llama-9-1T", "--gpu", "h100"))
    assert "unknown model 'Llama-9-1T'" in line


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"model_type": "llama", "hidden_size": ', ":1: not valid JSON"),
        ('{"model_type": "llama", "num_hidden_layers": 2}', "field 'hidden_size'"),
        ("[1, 2]", "config.json"),
    ],
)
def test_malformed_config_is_one_error_line(tmp_path, text, message):
    cfg = tmp_path / "config.json"
    cfg.write_text(text)
    line = _one_error_line(_run("--model", str(cfg), "--gpu", "h100"))
    assert str(cfg) in line and message in line


def test_out_of_range_option_is_a_usage_error():
    r = _run("--model", "Llama-3.1-8B", "--gpu", "h100", "--tp", "0")
    assert r.exit_code == 2 and "Invalid value for '--tp'" in r.output
    assert "Traceback" not in r.output


@pytest.mark.parametrize("fmt", ["table", "json", "csv"])
def test_a_model_that_does_not_fit_exits_2_with_the_missing_gib(fmt):
    # 70B in bf16 on one H100: 131.42 GiB of weights alone; no negative "KV cache" row in a table that exits 0
    line = _one_error_line(_run("--model", "Llama-3.1-70B", "--gpu", "h100", "--tp", "1", "--output-format", fmt))
    assert "Llama-3.1-70B on H100-SXM-80GB (TP1 PP1 EP1 DP1, bf16 weights, bf16 KV) does not fit" in line
    assert "needs 63.29 GiB more than the 71.68 GiB usable per rank" in line and "weights (131.42 GiB)" in line
    assert "-63.29" not in line


def test_a_budget_under_one_kv_block_does_not_fit_either():
    # 70B in fp8 on one H100 leaves 0.46 GiB of KV at 0.9; lower the utilisation until half a block is left
    args = ["--model", "Llama-3.1-70B", "--gpu", "h100", "--weight-quant", "fp8"]
    fits = json.loads(_run(*args, "--json").stdout)
    block = 16 * fits["kv_bytes_per_token_per_rank"]
    hbm = fits["breakdown"][0]["bytes"]
    util = 0.9 - (fits["kv_budget_bytes_per_rank"] - block / 2) / hbm
    line = _one_error_line(_run(*args, "--gpu-memory-utilization", repr(util)))
    assert (
        f"does not fit: needs {block / 2 / MIB:.2f} MiB more" in line
        and f"less than one 16-token KV block ({block / MIB:.2f} MiB)" in line
    )
