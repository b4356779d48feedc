"""The loop closes through written-back corrections, end to end in a throw-away copy of the repository:
the replay's twin runs 1.3x slower than the plan's step model (a fault) → reconciliation decides one
global correction → `llmcap correct` writes a version per configuration (a committed file and an MLflow
registered-model version, alias `champion`) → the re-plan applies it: the profile stage records the
version, the size stage's max rate per instance drops, the replay's predictions now match the slowed twin,
and the registry version and the plan's run name each other."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from tests.pipeline._project import make_project, sh

pytestmark = pytest.mark.slow

LLMCAP = [sys.executable, "-m", "llmcap"]
SLOWDOWN = 1.3


def _plan(root: Path, env: dict, message: str) -> None:
    sh([sys.executable, "-m", "flows.replan"], root, env, timeout=900)
    sh(["git", "add", "-A"], root, env)
    sh(["git", "commit", "-qm", message], root, env)


def _read(root: Path, rel: str) -> dict:
    return json.loads((root / rel).read_text())


def test_a_slower_twin_is_corrected_written_back_and_used_by_the_replan(tmp_path: Path) -> None:
    import mlflow

    root, env = make_project(tmp_path / "llmcap", native=True)
    params = yaml.safe_load((root / "params.yaml").read_text())
    # replays far below the knee, at about 1% of the load where the unit stops holding its share (a correction is
    # learned where queueing does not amplify it), played 20x faster than real time, and one ISL range: each
    # run's ~20 requests make one bucket, judged (the within-run drift check needs 2 x min_requests, so it sits
    # this out: the twin's speed is fixed by construction)
    params["replay"].update(twin_slowdown=SLOWDOWN, excerpt_requests=20, rate_scales=[0.01, 0.014], twin_dilation=0.05)
    params["reconcile"].update(isl_edges=[0], min_requests=12)
    # one configuration (GPU, TP, weights, KV dtype) in the candidate space: corrections are per configuration,
    # so the re-plan cannot escape the corrected one for an uncorrected roofline
    params["enumerate"].update(gpus=["H200-SXM-141GB"], weight_quants=["fp8"], kv_dtypes=["fp8"], modes=["aggregated"])
    params["enumerate"]["parallel"]["tp"] = [8]
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    sh(["git", "commit", "-qam", "replay against a twin 1.3x slower than the step model"], root, env)

    _plan(root, env, "plan A")
    before = _read(root, "data/reports/capacity/summary.json")
    rec = _read(root, "data/processed/reconcile.json")["reconciliation"]
    (found,) = rec["corrections"]
    assert found["min_context"] == 0 and found["factor"] == pytest.approx(SLOWDOWN, rel=0.05)
    assert {b["decision"] for b in rec["buckets"]} <= {"correct", "within_tolerance"}

    out = sh([*LLMCAP, "correct"], root, env).stdout
    files = sorted((root / "data/profiles/corrections").glob("*.json"))
    assert len(files) == len(before["pool_plans"]) and "v1" in out
    history = json.loads(files[0].read_text())
    assert (
        history["aliases"] == {"champion": 1} and history["versions"][0]["corrections"][0]["factor"] == found["factor"]
    )
    assert history["versions"][0]["measured_on"] == "digital twin"

    _plan(root, env, "plan B: corrected")
    step = _read(root, "data/processed/step_model.json")
    (applied, *_) = step["corrections"]
    assert applied["version"] == 1 and applied["alias"] == "champion"
    after = _read(root, "data/reports/capacity/summary.json")
    assert after["step_model_corrections"] == step["corrections"]
    # the same configuration (GPU, weights, KV dtype, parallelism): the one the correction was written for; the
    # engine knobs after it (max_num_seqs, max_num_batched_tokens, block size) may be re-tuned for slower steps
    assert after["chosen"].split("/")[:4] == before["chosen"].split("/")[:4], (before["chosen"], after["chosen"])
    (pool,) = after["pool_plans"]  # every step 1.3x longer: each instance holds less
    assert after["pool_plans"][pool]["per_instance_rps"] < before["pool_plans"][pool]["per_instance_rps"]
    # never fewer GPUs; as many where the whole instances planned before already had the room (40 on H200 TP8)
    assert after["gpus"] >= before["gpus"]
    rec_b = _read(root, "data/processed/reconcile.json")["reconciliation"]
    for bucket in rec_b["buckets"]:  # the corrected predictions match the slowed twin's decode steps
        assert abs(bucket["errors"]["itl"]["p50"]["e"]) < 0.05, bucket["reasoning"]

    client = mlflow.MlflowClient(tracking_uri=env["MLFLOW_TRACKING_URI"])
    version = client.get_model_version_by_alias(history["registered_model"], "champion")
    assert str(version.version) == history["versions"][0]["mlflow_version"]
    assert json.loads(version.tags["corrections"])[0]["factor"] == found["factor"]
    assert version.tags["configuration.gpu"] == history["configuration"]["gpu"]
    (plan_b,) = client.search_runs(
        [client.get_experiment_by_name("llmcap").experiment_id],
        filter_string="tags.`llmcap.kind` = 'replan' and tags.`step_model.corrections` != 'none'",
    )
    assert version.tags[f"plan.{plan_b.info.run_id}"] == plan_b.info.run_name
    assert f"{history['registered_model']}@champion=v1" in plan_b.data.tags["step_model.corrections"]

    diff = json.loads(sh([*LLMCAP, "diff", "HEAD~1", "HEAD", "--json"], root, env).stdout)
    said = "\n".join(diff["explanation"])  # the decision diff names the correction as the input that changed
    assert f"step-time corrections written back: none → {history['registered_model']}@champion=v1" in said
    assert "data `data/profiles` changed" in said and any(
        c["field"].endswith("per_instance_rps") for c in diff["decision"]["changed"]
    )
