"""The rollout as Argo Rollouts and Gateway API objects: parsed back with a YAML library and checked
against the fields those APIs require; the analysis limits are the local gates' limits."""

from __future__ import annotations

import re

import numpy as np
import yaml

from llmcap.rollout.driver import RolloutPlan
from llmcap.rollout.export import ClusterNames, cluster_objects, yaml_documents
from llmcap.rollout.gates import Prediction, Tolerances, evaluate
from llmcap.rollout.observe import Observation
from llmcap.rollout.promql import attainment_bound

PLAN = RolloutPlan(
    steps=(0.01, 0.05, 0.25, 0.5, 1.0), hold_s=300, interval_s=30, approve_before=(0.25, 1.0), ttft_target_s=2.0
)
TOL = Tolerances()
NAMES = ClusterNames(app="llama-70b", namespace="serving")


def predictions():
    out = {}
    for w in PLAN.steps:
        n = int(1000 * w) + 1
        out[w] = Prediction.from_values(
            w, np.linspace(0.05, 0.4 + w, n), np.full(n, 0.03), np.ones(n), 0.2 + 0.5 * w, 3 * w, 0
        )
    return out


def parsed():
    objects = cluster_objects(NAMES, PLAN, predictions(), TOL, replicas=6)
    return {name: list(yaml.safe_load_all(yaml_documents(docs))) for name, docs in objects.items()}


def test_the_rollout_has_what_argo_requires_and_follows_the_plan():
    docs = parsed()["rollout.yaml"]
    ro = [d for d in docs if d["kind"] == "Rollout"]
    assert len(ro) == 1
    ro = ro[0]
    assert ro["apiVersion"] == "argoproj.io/v1alpha1" and ro["metadata"]["name"] == "llama-70b"
    spec = ro["spec"]
    assert spec["selector"]["matchLabels"] == spec["template"]["metadata"]["labels"]
    assert spec["template"]["spec"]["containers"][0]["image"]
    canary = spec["strategy"]["canary"]
    assert canary["stableService"] == "llama-70b-stable" and canary["canaryService"] == "llama-70b-canary"
    assert canary["trafficRouting"]["plugins"]["argoproj-labs/gatewayAPI"]["httpRoute"] == "llama-70b"
    allowed = {"setWeight", "pause", "analysis"}
    assert all(len(s) == 1 and set(s) <= allowed for s in canary["steps"])
    weights = [s["setWeight"] for s in canary["steps"] if "setWeight" in s]
    assert weights == [1, 5, 25, 50, 100]
    # an indefinite pause (a person's approval) right before 25% and 100%
    kinds = [next(iter(s)) for s in canary["steps"]]
    for pct in (25, 100):
        i = canary["steps"].index({"setWeight": pct})
        assert kinds[i - 1] == "pause" and canary["steps"][i - 1]["pause"] == {}
    referenced = {t["templateName"] for s in canary["steps"] if "analysis" in s for t in s["analysis"]["templates"]}
    templates = {d["metadata"]["name"]: d for d in docs if d["kind"] == "AnalysisTemplate"}
    assert referenced == set(templates) and len(templates) == 5


def test_each_analysis_template_holds_the_local_gates_limits_for_its_share():
    docs = parsed()["rollout.yaml"]
    preds = predictions()
    for w in PLAN.steps:
        t = next(
            d
            for d in docs
            if d["kind"] == "AnalysisTemplate" and d["metadata"]["name"] == f"llama-70b-gates-{round(w * 100)}pct"
        )
        metrics = {m["name"]: m for m in t["spec"]["metrics"]}
        assert set(metrics) == {"ttft-p99", "itl-p99", "attainment", "kv-usage", "waiting", "preemptions"}
        obs = Observation(0, 1, 100, 0, None, None, None, None, None)
        local = {g.gate: g.limit for g in evaluate(obs, preds[w], TOL, PLAN.ttft_target_s)}
        for name, m in metrics.items():
            assert m["failureLimit"] == 0 and m["provider"]["prometheus"]["address"].startswith("http")
            assert 'job="llama-70b-canary"' in m["provider"]["prometheus"]["query"]
            limit = float(re.search(r"result\[0\] [<>]= ([0-9.e+-]+)$", m["successCondition"]).group(1))
            assert limit == float(f"{local[name.replace('-', '_')]:.6g}")


def test_http_routes_give_each_steps_weights():
    routes = parsed()["httproutes.yaml"]
    assert [r["kind"] for r in routes] == ["HTTPRoute"] * 6
    for r, w in zip(routes, (0, 1, 5, 25, 50, 100), strict=True):
        assert r["apiVersion"] == "gateway.networking.k8s.io/v1" and r["spec"]["parentRefs"][0]["name"]
        refs = r["spec"]["rules"][0]["backendRefs"]
        assert [b["weight"] for b in refs] == [100 - w, w] and all(b["name"] and b["port"] == 8000 for b in refs)


def test_the_attainment_query_counts_whole_buckets_at_or_below_the_target():
    assert attainment_bound(2.0) == 1.0 and attainment_bound(2.5) == 2.5 and attainment_bound(0.0001) == 0.001
