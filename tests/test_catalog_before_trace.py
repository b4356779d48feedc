"""Every command that reads a trace for a model on a GPU checks both against the catalog first: a typo
fails in a second with the usual one-line error, not after the trace has been read (seconds on a real one).

The trace path given does not exist: had the command read it first, the error would name the file."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from llmcap.cli import app

runner = CliRunner()
MISSING = "no-such-trace.jsonl"

# each command as a user runs it, with {model} and {gpu} to fill in (every other option valid)
COMMANDS = {
    "size": ["size", "--trace", MISSING, "--model", "{model}", "--gpu", "{gpu}", "--goodput", "ttft:500"],
    "size, a GPU late in the list": [
        "size",
        "--trace",
        MISSING,
        "--model",
        "{model}",
        "--gpu",
        "h100",
        "--gpu",
        "h200,{gpu}",
        "--goodput",
        "ttft:500",
    ],
    "simulate": ["simulate", "--trace", MISSING, "--model", "{model}", "--gpu", "{gpu}"],
    "autoscale": ["autoscale", "--trace", MISSING, "--model", "{model}", "--gpu", "{gpu}", "--slo-ttft-p99", "2000"],
    "rollout predict": [
        "rollout",
        "predict",
        "--trace",
        MISSING,
        "--model",
        "{model}",
        "--gpu",
        "{gpu}",
        "-o",
        "pred.json",
    ],
}


def _error_line(args: list[str]) -> str:
    r = runner.invoke(app, args)
    assert r.exit_code == 2, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert MISSING not in lines[0] and "not found" not in lines[0]  # the trace was never opened
    return lines[0]


@pytest.mark.parametrize("command", COMMANDS)
def test_an_unknown_gpu_fails_before_the_trace_is_read(command: str) -> None:
    args = [a.format(model="Llama-3.1-8B", gpu="h900") for a in COMMANDS[command]]
    line = _error_line(args)
    assert "unknown GPU 'h900'" in line and "H100-SXM-80GB" in line  # the catalog's names, to pick from


@pytest.mark.parametrize("command", COMMANDS)
def test_an_unknown_model_fails_before_the_trace_is_read(command: str) -> None:
    args = [a.format(model="Llama-9-1T", gpu="h100") for a in COMMANDS[command]]
    assert "unknown model 'Llama-9-1T'" in _error_line(args)


def test_a_missing_trace_is_still_named_once_the_catalog_checks_pass() -> None:
    # the control: with a known model and GPU, the same commands do reach the trace and name it
    for command, template in COMMANDS.items():
        r = runner.invoke(app, [a.format(model="Llama-3.1-8B", gpu="h100") for a in template])
        assert r.exit_code == 2 and MISSING in r.stderr and "not found" in r.stderr, (command, r.output)


def test_size_checks_its_weight_formats_and_kv_dtypes_before_the_trace_too() -> None:
    base = ["size", "--trace", MISSING, "--model", "Llama-3.1-8B", "--gpu", "h100", "--goodput", "ttft:500"]
    assert "unknown weight format 'fp9'" in _error_line([*base, "--weight-quant", "bf16,fp9"])
    assert "unknown KV cache dtype 'fp9'" in _error_line([*base, "--kv-dtype", "fp9"])


def test_simulate_says_a_model_does_not_fit_before_the_trace_is_read() -> None:
    line = _error_line(["simulate", "--trace", MISSING, "--model", "Llama-3.1-70B", "--gpu", "h100", "--tp", "1"])
    assert "does not fit on H100-SXM-80GB" in line
