"""End to end, as `make plan` runs it: the Prefect flow `replan` drives the DVC pipeline in a fresh
copy of the repository; then DVC's skip/rerun behaviour, determinism and kill-and-resume."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from llmcap.perf.calibration import shipped_calibrations
from ops.reproduce import out_flags
from tests.pipeline._project import make_project, sh

pytestmark = pytest.mark.slow


def _ran(output: str) -> list[str]:
    return re.findall(r"Running stage '([^']+)'", output)


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """A fresh copy of the repository (tracked + new files, nothing ignored) with its own git history, and the
    compiled simulator core `make plan` builds first (the pure-Python path is compared with it in tests/sim)."""
    return make_project(tmp_path_factory.mktemp("clone") / "llmcap", native=True)


def _run_until_killed(
    cmd: list[str], root: Path, env: dict, marker: str, gone: Path | None = None, timeout_s: float = 300
) -> str:
    """Start `cmd`, read its output until `marker` appears (and then, given `gone`, wait until that file is
    removed), then SIGKILL its whole process group; the output read."""
    proc = subprocess.Popen(
        cmd, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    log = ""
    deadline = time.monotonic() + timeout_s
    while marker not in log and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        log += line
    while gone is not None and gone.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    return log


def _output_hashes(root: Path) -> dict[str, str]:
    """Every output file's hash, except those dvc.yaml marks measured (wall-clock timing: not byte-identical)."""
    _, measured = out_flags(yaml.safe_load((root / "dvc.yaml").read_text()))
    out = {}
    for base in ("data/interim", "data/processed", "data/reports"):
        for f in sorted((root / base).rglob("*")):
            rel = str(f.relative_to(root))
            if (
                f.is_file()
                and f.name != ".gitignore"
                and not any(rel == m or rel.startswith(m + "/") for m in measured)
            ):
                out[rel] = hashlib.sha256(f.read_bytes()).hexdigest()
    return out


def test_closed_loop_end_to_end(project: tuple[Path, dict]) -> None:
    root, env = project
    stages = list(yaml.safe_load((root / "dvc.yaml").read_text())["stages"])

    # 1. The flow, as `make plan` runs it: every stage runs on a fresh clone, outputs are listed.
    first = sh([sys.executable, "-m", "flows.replan"], root, env)
    assert f"stages run: {', '.join(stages)}" in first.stdout
    assert "MLflow run" in first.stdout
    for rel in (
        "data/interim/trace.parquet",
        "data/interim/quarantine.parquet",
        "data/processed/workload.json",
        "data/reports/workload/workload.md",
        "data/reports/workload/isl_osl_joint.png",
        "data/processed/step_model.json",
        "data/processed/capacity.parquet",
        "data/reports/capacity/capacity.html",
        "data/processed/replay/measured.parquet",
        "data/processed/replay/predicted.parquet",
        "data/reports/replay/replay.md",
    ):
        assert (root / rel).is_file(), rel
    hashes = _output_hashes(root)
    assert (
        "data/processed/replay/predicted.parquet" in hashes and "data/processed/replay/measured.parquet" not in hashes
    )
    assert "DIGITAL TWIN" in first.stdout and "DIGITAL TWIN" in (root / "data/reports/replay/replay.md").read_text()
    # the roofline's fitted efficiencies (llmcap/catalog/data/calibration) are named where the plan records its step times
    shipped = {c.gpu: c.describe() for c in shipped_calibrations()}
    assert {"H100-SXM-80GB", "H200-SXM-141GB"} <= set(shipped)
    assert json.loads((root / "data/processed/step_model.json").read_text())["roofline_calibrations"] == shipped
    summary = json.loads((root / "data/reports/capacity/summary.json").read_text())
    assert summary["roofline_calibrations"] == {
        g: shipped[g] for g in ("H100-SXM-80GB", "H200-SXM-141GB")
    }  # the params' GPUs
    assert (
        "efficiencies fitted to timed operations for: H100-SXM-80GB ("
        in (root / "data/reports/capacity/capacity.md").read_text()
    )
    _check_mlflow(root, env)

    # 2. Nothing changed: DVC runs nothing.
    again = sh([sys.executable, "-m", "dvc", "repro"], root, env)
    assert _ran(again.stdout + again.stderr) == []

    # 3. Kill a stage mid-run (forced, its inputs unchanged) and re-run as `make plan` runs DVC: the killed stage's
    #    outputs for these inputs are in DVC's cache (dvc.lock names them), so they are checked out, not recomputed,
    #    and every output is the first run's (that recomputing gives the same bytes: step 4).
    workload = root / "data/processed/workload.json"
    log = _run_until_killed(
        [sys.executable, "-m", "dvc", "repro", "--force", "--single-item", "--no-run-cache", "characterise"],
        root,
        env,
        "Running stage 'characterise'",
        gone=workload,
    )  # DVC removed its outputs: the stage is at work
    assert "Running stage 'characterise'" in log and not workload.exists(), log[-3000:]
    resumed = sh([sys.executable, "-m", "dvc", "repro", "--no-run-cache"], root, env)
    assert _ran(resumed.stdout + resumed.stderr) == [], resumed.stdout + resumed.stderr
    assert "Stage 'characterise' is cached - skipping run, checking out outputs" in resumed.stdout + resumed.stderr
    assert _output_hashes(root) == hashes

    # 4. Kill a run with work to do (a characterise param changed) once its first stage runs, and re-run: it
    #    resumes there, clean is not re-run, and the stages consuming its output follow. Then the param back, and
    #    the stages it drives recomputed (no run cache): byte-identical to the first run's outputs (determinism).
    original = (root / "params.yaml").read_text()
    params = yaml.safe_load(original)
    params["characterise"]["lru_cache_blocks"] = [1024]
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    log = _run_until_killed(
        [sys.executable, "-m", "dvc", "repro", "--no-run-cache"], root, env, "Running stage 'characterise'"
    )
    assert "Running stage 'characterise'" in log and "Running stage 'clean'" not in log, log[-3000:]
    resumed = sh([sys.executable, "-m", "dvc", "repro", "--no-run-cache"], root, env)
    ran = _ran(resumed.stdout + resumed.stderr)
    assert ran[:2] == ["characterise", "enumerate"] and "clean" not in ran, ran  # enumerate reads the workload summary
    assert '"1024"' in (root / "data/processed/workload.json").read_text()
    (root / "params.yaml").write_text(original)
    back = sh([sys.executable, "-m", "dvc", "repro", "--no-run-cache"], root, env)
    assert _ran(back.stdout + back.stderr)[0] == "characterise"
    assert _output_hashes(root) == hashes

    # 5. A changed param re-runs its stage (and what consumes its outputs: nothing, for the last stage), not the stages upstream.
    params = yaml.safe_load(original)
    params["reconcile"]["tolerance"] = 0.2
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    changed = sh([sys.executable, "-m", "dvc", "repro"], root, env)
    assert _ran(changed.stdout + changed.stderr) == ["reconcile"]
    assert json.loads((root / "data/processed/reconcile.json").read_text())["reconciliation"]["tolerance"] == 0.2


def _check_mlflow(root: Path, env: dict) -> None:
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=env["MLFLOW_TRACKING_URI"])
    experiment = client.get_experiment_by_name("llmcap")
    runs = client.search_runs([experiment.experiment_id])
    parent = [r for r in runs if r.data.tags.get("llmcap.kind") == "replan"]
    assert len(parent) == 1
    children = {
        r.data.tags["dvc.stage"]: r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent[0].info.run_id
    }
    assert {"clean", "characterise"} <= set(children)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True).stdout.strip()
    raw = root / "data/raw/mooncake/conversation_trace.jsonl"
    for stage, run in children.items():
        tags = run.data.tags
        assert tags["git.commit"] == head and tags["git.dirty"] == "false", stage
        assert re.fullmatch(r"[0-9a-f]{64}", tags["dvc.stage_hash"]), stage
    assert children["clean"].data.tags["input.trace.sha256"] == hashlib.sha256(raw.read_bytes()).hexdigest()
    # Mooncake has no request ids: its two equal rows are two requests (clean.duplicates: by_id)
    assert children["clean"].data.metrics["rows_kept"] == 12_031
    assert children["clean"].data.metrics["rows_quarantined"] == 0
    assert children["characterise"].data.metrics["prefix.ideal_hit_ratio"] == pytest.approx(0.3736, abs=1e-4)
    clean_artifacts = {a.path for a in client.list_artifacts(children["clean"].info.run_id, "clean")}
    assert {
        "clean/clean_report.json",
        "clean/validation_trace.json",
        "clean/validation_quarantine.json",
    } <= clean_artifacts
    plots = {a.path for a in client.list_artifacts(children["characterise"].info.run_id, "workload/plots")}
    assert "workload/plots/prefix_reuse_cdf.png" in plots
