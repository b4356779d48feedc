"""`llmcap rollout predict` and `export` as a user runs them, and a predictions file that cannot be used."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import yaml

from tests.conftest import ROOT

LLMCAP = [sys.executable, "-m", "llmcap"]
TRACE = ROOT / "tests" / "fixtures" / "traces" / "mooncake" / "synthetic_trace.jsonl"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*LLMCAP, *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_predict_then_export(tmp_path):
    pred = tmp_path / "pred.json"
    r = run(
        "rollout",
        "predict",
        "--trace",
        str(TRACE),
        "--model",
        "Llama-3.1-8B",
        "--gpu",
        "H100-SXM-80GB",
        "--request-rate",
        "2",
        "--steps",
        "0.1,0.5,1",
        "-o",
        str(pred),
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads(pred.read_text())
    assert (
        doc["simulated"] is True
        and doc["request_rate"] == 2.0
        and [s["share"] for s in doc["steps"]] == [0.1, 0.5, 1.0]
    )
    requests = [s["requests"] for s in doc["steps"]]
    assert (
        requests[0] < requests[1] < requests[2] and 3900 < requests[2] <= 3993
    )  # thinned to each share; at 100% the whole (cleaned) trace
    assert "simulated" in r.stderr and "not measured" in r.stdout
    r = run(
        "rollout",
        "export",
        "--predictions",
        str(pred),
        "--app",
        "llama",
        "--approve-before",
        "1",
        "--replicas",
        "3",
        "-o",
        str(tmp_path / "k8s"),
    )
    assert r.returncode == 0, r.stderr
    docs = list(yaml.safe_load_all((tmp_path / "k8s" / "rollout.yaml").read_text()))
    assert [d["kind"] for d in docs] == ["Rollout"] + ["AnalysisTemplate"] * 3 and docs[0]["spec"]["replicas"] == 3
    assert "&id" not in (tmp_path / "k8s" / "rollout.yaml").read_text()  # plain YAML, no anchors
    assert len(list(yaml.safe_load_all((tmp_path / "k8s" / "httproutes.yaml").read_text()))) == 4


def test_the_http_paths_latency_moves_every_ttft_prediction(tmp_path):
    from llmcap.rollout.predict import load_predictions

    docs = {}
    for ms in (0, 200):
        out = tmp_path / f"pred{ms}.json"
        r = run(
            "rollout",
            "predict",
            "--trace",
            str(TRACE),
            "--model",
            "Llama-3.1-8B",
            "--gpu",
            "H100-SXM-80GB",
            "--request-rate",
            "0.3",
            "--steps",
            "1",
            "--client-latency-ms",
            str(ms),
            "-o",
            str(out),
        )
        assert r.returncode == 0, r.stderr
        docs[ms] = load_predictions(out)[1.0]
    assert json.loads((tmp_path / "pred200.json").read_text())["client_latency_s"] == 0.2
    low, high = docs[0].ttft, docs[200].ttft
    assert low.fraction_at_most(0.1) > 0.0 and high.fraction_at_most(0.1) == 0.0  # every TTFT moved past 100 ms
    assert high.quantile(0.5) > low.quantile(0.5) + 0.1
    assert np.array_equal(docs[0].itl.counts, docs[200].itl.counts)  # token gaps do not pay it


def test_a_bad_predictions_file_names_file_and_field(tmp_path):
    bad = tmp_path / "p.json"
    bad.write_text(json.dumps({"kind": "something else"}))
    r = run("rollout", "export", "--predictions", str(bad), "--app", "a", "-o", str(tmp_path / "o"))
    assert r.returncode == 2 and str(bad) in r.stderr and "'kind'" in r.stderr and "Traceback" not in r.stderr
    bad.write_text(json.dumps({"kind": "llmcap-rollout-predictions", "steps": [{"share": 0.5}]}))
    r = run("rollout", "export", "--predictions", str(bad), "--app", "a", "-o", str(tmp_path / "o"))
    assert r.returncode == 2 and "'steps.0'" in r.stderr
    r = run(
        "rollout",
        "start",
        "--gateway",
        "http://127.0.0.1:9",
        "--candidate-metrics",
        "http://127.0.0.1:9",
        "--predictions",
        str(bad),
        "--tolerances",
        '{"min_requests": 0}',
    )
    assert r.returncode == 2 and "min_requests" in r.stderr
