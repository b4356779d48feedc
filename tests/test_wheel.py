"""The built wheel, installed into a clean venv without the pipeline extra, runs `perf`, `memory`,
`simulate` and `size` on a shipped trace from outside the checkout: the catalog is package data and
the library needs none of prefect, dvc, mlflow, great_expectations or dask."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.slow

AZURE = ROOT / "data" / "raw" / "azure2023" / "AzureLLMInferenceTrace_conv.csv"
PIPELINE_ONLY = ("prefect", "dvc", "mlflow", "great_expectations", "dask")


def _uv() -> str:
    found = os.environ.get("UV") or shutil.which("uv") or str(ROOT / ".tools" / "bin" / "uv")
    assert Path(found).exists(), "uv is needed to build the wheel (make setup installs it into .tools/)"
    return found


def _run(cmd: list[str], cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "LLMCAP_CATALOG_DIR")}
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{cmd}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("wheel")
    uv = _uv()
    _run([uv, "build", "--wheel", "--out-dir", str(tmp / "dist"), str(ROOT)], tmp)
    (wheel,) = (tmp / "dist").glob("llmcap-*.whl")
    _run([uv, "venv", "--python", "3.11", str(tmp / "venv")], tmp)
    _run([uv, "pip", "install", "--python", str(tmp / "venv" / "bin" / "python"), str(wheel)], tmp)
    # a shipped trace, cut to 1,500 requests so the pure-Python simulator (a wheel has no compiled core) is quick
    lines = AZURE.read_text(encoding="utf-8").splitlines(keepends=True)
    (tmp / "azure_excerpt.csv").write_text("".join(lines[:1501]), encoding="utf-8")
    return tmp, tmp / "venv" / "bin"


def test_the_wheel_holds_the_catalog_and_not_the_pipeline_stack(installed: tuple[Path, Path]) -> None:
    tmp, bin_dir = installed
    probe = "import importlib.util as u, json; print(json.dumps({m: u.find_spec(m) is not None for m in %r}))" % (PIPELINE_ONLY,)
    found = json.loads(_run([str(bin_dir / "python"), "-c", probe], tmp).stdout)
    assert not any(found.values()), found
    assert _run([str(bin_dir / "llmcap"), "--version"], tmp).stdout.strip() == "llmcap 0.1.0"


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
    size = run("size", "-t", trace, "-m", "Llama-3.1-8B", "--slo-ttft-p99", "2000", "--slo-itl-p99", "100",
               "--gpu", "h100", "--tp", "1", "--weight-quant", "fp8", "--no-pd", "--shortlist", "1", "--excerpt", "300")  # fmt: skip
    assert size["gpus"] >= 1 and size["input_accounting"]["rows_kept"] == 1_500
