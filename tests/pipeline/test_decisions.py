"""Decisions stored, listed, reproduced and compared, end to end in a throw-away copy of the repository:
plan at commit A, change one param and plan at commit B; `llmcap history` lists both, `llmcap reproduce A`
gives A's outputs byte for byte (and finds a corrupted stored output), `llmcap diff A B` names the param,
and a fresh clone pulls A's capacity table from the DVC remote by commit."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ops.reproduce import MEASURED, out_flags
from tests.pipeline._project import make_project, sh

pytestmark = pytest.mark.slow

LLMCAP = [sys.executable, "-m", "llmcap"]


def _plan_and_commit(root: Path, env: dict, message: str) -> tuple[str, str]:
    out = sh([sys.executable, "-m", "flows.replan"], root, env).stdout
    assert f"stored: DVC remote 'local' ({root / '.work' / 'dvc-remote'})" in out
    sh(["git", "add", "dvc.lock"], root, env)
    sh(["git", "commit", "-qm", message], root, env)
    return sh(["git", "rev-parse", "HEAD"], root, env).stdout.strip(), out


def test_decisions_end_to_end(tmp_path: Path) -> None:
    root, env = make_project(tmp_path / "llmcap", native=True)
    raw = root / "data/raw/mooncake/conversation_trace.jsonl"

    a, _ = _plan_and_commit(root, env, "plan A")
    summary_a = json.loads((root / "data/reports/capacity/summary.json").read_text())
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["size"]["headroom"]["node_failures"] = 2
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    sh(["git", "commit", "-qam", "plan for two node failures"], root, env)
    b, out_b = _plan_and_commit(root, env, "plan B")
    assert "stages run: size" in out_b  # one param of the size stage: nothing upstream re-ran

    # 2. stored and retrievable: the MLflow runs carry the decision, `history` lists both, newest first
    rows = json.loads(sh([*LLMCAP, "history", "--json"], root, env).stdout)
    assert [r["recorded_in"] for r in rows] == [b, a]
    assert rows[1]["gpus"] == summary_a["gpus"] and rows[1]["chosen"] == summary_a["chosen"]
    assert rows[1]["target_rps"] == pytest.approx(summary_a["target_rps"])
    assert [r["approved_by"] for r in rows] == ["none", "none"]
    assert rows[0]["remote"] == str(root / ".work" / "dvc-remote")
    table = sh([*LLMCAP, "history"], root, env).stdout
    assert a[:10] in table and b[:10] in table and "approved by" in table
    _check_run_tags(root, env, rows[1]["run_id"], a, raw, summary_a)

    # 3. reproduce A: a clean worktree at A, the same locked environment, every output byte-identical
    rep = subprocess.run(
        [*LLMCAP, "reproduce", a, "--json"], cwd=root, env=env, capture_output=True, text=True, timeout=900
    )
    assert rep.returncode == 0, rep.stdout[-3000:] + rep.stderr[-3000:]
    result = json.loads(rep.stdout)
    lock_a = yaml.safe_load(
        subprocess.run(["git", "show", f"{a}:dvc.lock"], cwd=root, capture_output=True, text=True).stdout
    )
    n_outs = sum(len(s["outs"]) for s in lock_a["stages"].values())
    assert result["identical"] is True and result["mode"] == "recompute"
    _, measured = out_flags(yaml.safe_load((root / "dvc.yaml").read_text()))
    assert measured == {
        "data/processed/replay/measured.parquet",
        "data/reports/replay",
        "data/processed/reconcile.json",
        "data/reports/reconcile",
    }
    assert {r["path"]: r["status"] for r in result["outputs"]} == {
        r["path"]: MEASURED if r["path"] in measured else "identical" for r in result["outputs"]
    }
    assert len(result["outputs"]) == n_outs
    assert result["mlflow"]["run_id"] == rows[1]["run_id"] and result["mlflow"]["compared"] >= n_outs
    assert result["mlflow"]["differences"] == []
    assert "is the project's" in result["environment"]["python"]
    assert result["environment"]["simulator"].startswith("compiled core")
    assert result["inputs_changed"] == {"params": [], "deps": [], "cmds": []}
    worktrees = sh(["git", "worktree", "list", "--porcelain"], root, env).stdout
    assert worktrees.count("worktree ") == 1  # the temporary worktree is gone

    # --pull: A's stored outputs from the remote; a corrupted object in the remote is named with both md5s
    pulled = json.loads(sh([*LLMCAP, "reproduce", a, "--pull", "--json"], root, env).stdout)
    assert pulled["identical"] is True
    status = {r["path"]: r["status"] for r in pulled["outputs"]}
    assert status["data/processed/capacity.parquet"] == "identical" and status["data/reports/capacity"] == "identical"
    assert (
        status["data/reports/clean"] == "identical"
    )  # every report is cached: a past decision's report can be checked out
    outs_a = {o["path"]: o["md5"] for o in lock_a["stages"]["size"]["outs"]}
    md5 = outs_a["data/processed/capacity.parquet"]
    obj = root / ".work/dvc-remote/files/md5" / md5[:2] / md5[2:]
    obj.chmod(0o644)
    original = obj.read_bytes()
    obj.write_bytes(original + b"tampered")
    bad = subprocess.run(
        [*LLMCAP, "reproduce", a, "--pull", "--json"], cwd=root, env=env, capture_output=True, text=True, timeout=600
    )
    assert bad.returncode == 1, bad.stderr[-3000:]
    wrong = [
        r
        for r in json.loads(bad.stdout)["outputs"]
        if r["status"] != "identical" and not r["status"].startswith("not stored")
    ]
    tampered = hashlib.md5(obj.read_bytes()).hexdigest()
    # the report directory holds a copy of the table: the same remote object, so both outputs differ, file by file
    assert [(r["path"], r["expected"], r["status"]) for r in wrong] == [
        ("data/processed/capacity.parquet", md5, "differs"),
        ("data/reports/capacity", outs_a["data/reports/capacity"], "differs"),
    ]
    assert wrong[0]["got"] == tampered
    assert wrong[1]["files"] == [{"path": "data/reports/capacity/capacity.parquet", "expected": md5, "got": tampered}]
    human = subprocess.run(
        [*LLMCAP, "reproduce", a, "--pull"], cwd=root, env=env, capture_output=True, text=True, timeout=600
    )
    assert human.returncode == 1 and "DIFFERS" in human.stdout and "data/processed/capacity.parquet" in human.stdout
    obj.write_bytes(original)

    # 4. diff A B: the decision changed (failure headroom) and the one param explains it
    d = json.loads(sh([*LLMCAP, "diff", a, b, "--json"], root, env).stdout)
    # (the autoscale stage reads the size section too: its SLOs and router)
    assert d["inputs"]["params"] == [
        {"key": "size.headroom.node_failures", "a": 1, "b": 2, "stages": ["size", "autoscale"]}
    ]
    assert (
        d["inputs"]["code"] == []
        and d["inputs"]["data"] == []
        and d["inputs"]["environment"] == []
        and d["inputs"]["cmds"] == []
    )
    assert d["explanation"] == ["param `size.headroom.node_failures`: 1 → 2 (stages: size, autoscale)"]
    changed = {c["field"]: (c["a"], c["b"]) for c in d["decision"]["changed"]}
    failure = [v for k, v in changed.items() if k.startswith("pool.") and k.endswith(".headroom.failure.instances")]
    assert failure and all(after > before for before, after in failure), changed
    assert changed["gpus"][1] > changed["gpus"][0]
    assert d["decision"]["max_rps"] == []  # the same search: only the headroom moved
    md = sh([*LLMCAP, "diff", a, b], root, env).stdout
    assert "size.headroom.node_failures" in md and "| gpus |" in md
    # a plan directory (the workspace, at B) against A's MLflow run
    d2 = json.loads(sh([*LLMCAP, "diff", rows[1]["run_id"], str(root), "--json"], root, env).stdout)
    assert d2["a"]["kind"] == "run" and d2["b"]["kind"] == "directory"
    assert [p["key"] for p in d2["inputs"]["params"]] == ["size.headroom.node_failures"]

    # DVC's own comparison of the two plans: the metrics and plots the size stage declares in dvc.yaml
    metrics = json.loads(sh([sys.executable, "-m", "dvc", "metrics", "diff", a, b, "--json"], root, env).stdout)[
        "data/metrics/capacity.json"
    ]
    assert (metrics["gpus"]["old"], metrics["gpus"]["new"]) == changed["gpus"]
    assert metrics["gpus"]["diff"] == changed["gpus"][1] - changed["gpus"][0] > 0
    plots = json.loads(sh([sys.executable, "-m", "dvc", "plots", "diff", a, b, "--json"], root, env).stdout)["data"]
    assert {rev for spec in plots["data/metrics/candidates.csv"] for rev in spec["revisions"]} == {a, b}

    # a fresh clone pulls A's capacity table from the remote, by commit
    clone = tmp_path / "clone"
    sh(["git", "clone", "-q", str(root), str(clone)], tmp_path, env)
    sh(
        [
            sys.executable,
            "-m",
            "dvc",
            "remote",
            "modify",
            "--local",
            "local",
            "url",
            str(root / ".work" / "dvc-remote"),
        ],
        clone,
        env,
    )
    sh(["git", "checkout", "-q", a], clone, env)
    sh([sys.executable, "-m", "dvc", "pull", "data/processed/capacity.parquet"], clone, env)
    assert hashlib.md5((clone / "data/processed/capacity.parquet").read_bytes()).hexdigest() == md5


def _check_run_tags(root: Path, env: dict, run_id: str, commit: str, raw: Path, summary: dict) -> None:
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=env["MLFLOW_TRACKING_URI"])
    run = client.get_run(run_id)
    tags = run.data.tags
    lock = subprocess.run(["git", "show", f"{commit}:dvc.lock"], cwd=root, capture_output=True).stdout
    assert tags["dvc.lock.sha256"] == hashlib.sha256(lock).hexdigest()
    assert tags["trace.sha256"] == hashlib.sha256(raw.read_bytes()).hexdigest()
    assert tags["step_model.source"] == "roofline-fallback" and tags["step_model.fingerprint.tp"] == "4"
    assert len(tags["step_model.version"]) == 16 and tags["approval"] == "none"
    assert run.data.metrics["dvc.pushed_files"] >= 1
    stored = client.download_artifacts(run_id, "decision/summary.json", dst_path=str(root.parent))
    assert json.loads(Path(stored).read_text()) == summary
    # the parent run holds the plan: named by its decision, params.yaml as params, the trace as a dataset with its hash
    role = {"prefill": "P", "decode": "D"}
    pools = " + ".join(
        f"{q['instances']}x{role.get(n, '')} TP{q['configuration'].split('/tp')[1].split('pp')[0]} {q['configuration'][:4]}"
        for n, q in summary["pool_plans"].items()
    )
    assert run.info.run_name == f"{summary['gpus']} GPUs: {pools}"
    assert run.data.params["size.headroom.node_failures"] == "1" and run.data.params["trace.file"] == tags["trace.file"]
    datasets = {d.dataset.name: d for d in run.inputs.dataset_inputs}
    assert datasets[tags["trace.file"]].dataset.digest == tags["trace.sha256"][:32]
    assert {t.key: t.value for t in datasets[tags["trace.file"]].tags}["hash"] == tags["trace.sha256"]
    exp = client.get_experiment(run.info.experiment_id)
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"  # opens in the runs view
    assert exp.artifact_location == (root / ".work" / "mlartifacts").as_uri() and Path(stored).name == "summary.json"
    assert (root / ".work" / "mlartifacts").is_dir() and not (root / "mlruns").exists()
