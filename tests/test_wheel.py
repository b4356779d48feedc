"""The built wheels, each installed into a clean venv without the pipeline extra (as `make dist` builds them):
the pure-Python one runs `perf`, `memory`, `simulate` and `size` on a shipped trace from outside the checkout
(the catalog is package data; the library needs none of prefect, dvc, mlflow, great_expectations or dask);
the compiled one (manylinux, this CPython) loads its compiled core and simulates the Mooncake trace to the
same bytes as the checkout. How fast each runs is `make bench`'s (benchmarks/wheel.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ops.dist import build_wheel, install
from tests.conftest import ROOT

pytestmark = pytest.mark.slow

AZURE = ROOT / "data" / "raw" / "azure2023" / "AzureLLMInferenceTrace_conv.csv"
MOONCAKE = ROOT / "data" / "raw" / "mooncake" / "conversation_trace.jsonl"
SIMULATE = ["simulate", "--trace", str(MOONCAKE), "--model", "Llama-3.1-70B", "--gpu", "h200", "--tp", "4"]
CORE = "import llmcap.sim, llmcap._native as n; print(n.mode())"  # which simulator an installed package runs
PIPELINE_ONLY = ("prefect", "dvc", "mlflow", "great_expectations", "dask")


def _run(cmd: list[str], cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "LLMCAP_CATALOG_DIR")}
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{cmd}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("wheel")
    bin_dir = install(build_wheel(tmp / "dist", compiled=False), tmp / "venv")
    # a shipped trace, cut to 1,500 requests so the pure-Python simulator is quick
    lines = AZURE.read_text(encoding="utf-8").splitlines(keepends=True)
    (tmp / "azure_excerpt.csv").write_text("".join(lines[:1501]), encoding="utf-8")
    return tmp, bin_dir


def test_the_wheel_holds_the_catalog_and_not_the_pipeline_stack(installed: tuple[Path, Path]) -> None:
    tmp, bin_dir = installed
    probe = f"import importlib.util as u, json; print(json.dumps({{m: u.find_spec(m) is not None for m in {PIPELINE_ONLY!r}}}))"
    found = json.loads(_run([str(bin_dir / "python"), "-c", probe], tmp).stdout)
    assert not any(found.values()), found
    for script in ("llmcap", "llmcap-planner"):  # the second: a name no other PyPI package's script has
        assert _run([str(bin_dir / script), "--version"], tmp).stdout.strip() == "llmcap-planner 0.1.0"
    assert (
        _run([str(bin_dir / "python"), "-c", CORE], tmp).stdout.strip() == "source"
    )  # no compiled core: the sources run


def test_the_installed_cli_plans_from_a_shipped_trace(installed: tuple[Path, Path]) -> None:
    tmp, bin_dir = installed
    llmcap = str(bin_dir / "llmcap")

    def run(*args: str) -> dict:
        return json.loads(_run([llmcap, *args, "--json"], tmp).stdout)

    memory = run("memory", "--model", "Llama-3.1-8B", "--gpu", "h100")
    assert memory["kv_blocks_per_rank"] > 0
    perf = run("perf", "--model", "Llama-3.1-8B", "--gpu", "h100", "--tp", "1", "--isl", "1024", "--osl", "128")
    assert perf["throughput"]["output_tokens_per_s"] > 0 and perf["prefill_time_s"] > 0
    trace = str(tmp / "azure_excerpt.csv")
    sim = run("simulate", "-t", trace, "-m", "Llama-3.1-8B", "-g", "h100")
    assert sim["requests"] == 1_500 and sim["completed"] == 1_500
    size = run(
        "size",
        "-t",
        trace,
        "-m",
        "Llama-3.1-8B",
        "--slo-ttft-p99",
        "2000",
        "--slo-itl-p99",
        "100",
        "--gpu",
        "h100",
        "--tp",
        "1",
        "--weight-quant",
        "fp8",
        "--no-pd",
        "--shortlist",
        "1",
        "--excerpt",
        "300",
    )
    assert size["gpus"] >= 1 and size["input_accounting"]["rows_kept"] == 1_500


def test_the_compiled_wheel_runs_its_core_and_simulates_to_the_checkouts_bytes(tmp_path: Path) -> None:
    from llmcap import _native

    assert _native.mode() == "native", "make setup builds the compiled core the wheel packs"
    bin_dir = install(
        build_wheel(tmp_path / "dist", compiled=True), tmp_path / "venv", locked=True
    )  # the checkout's versions
    assert _run([str(bin_dir / "python"), "-c", CORE], tmp_path).stdout.strip() == "native"
    mine, theirs = tmp_path / "checkout.parquet", tmp_path / "wheel.parquet"
    _run([sys.executable, "-m", "llmcap", *SIMULATE, "--out", str(mine), "--json"], ROOT)
    _run([str(bin_dir / "llmcap-planner"), *SIMULATE, "--out", str(theirs), "--json"], tmp_path)
    assert theirs.read_bytes() == mine.read_bytes()
