"""The rollout for a real cluster: the same steps and gates as Kubernetes objects.

- an Argo Rollouts `Rollout` (canary strategy: setWeight, a pause per hold, an indefinite pause where a
  person approves, an inline analysis per step) routed by the Gateway API plugin;
- one `AnalysisTemplate` per step: each gate as a Prometheus metric whose success condition is that
  step's limit (the prediction for its share, plus the tolerance), failing at the first breach;
- the Gateway API `HTTPRoute` at each step's weights, for teams that move weights themselves (GitOps).

Objects are plain dicts; `yaml_documents` writes them as one multi-document YAML stream.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import yaml

from llmcap.rollout.driver import RolloutPlan
from llmcap.rollout.gates import Prediction, Tolerances, limits
from llmcap.rollout.promql import queries

ROLLOUTS_API = "argoproj.io/v1alpha1"
GATEWAY_API = "gateway.networking.k8s.io/v1"


@dataclass(frozen=True)
class ClusterNames:
    app: str  # the Rollout's name and the pods' app label
    namespace: str = "default"
    stable_service: str = ""  # default: APP-stable
    canary_service: str = ""  # default: APP-canary
    http_route: str = ""  # default: APP
    gateway: str = "inference-gateway"  # the Gateway the route attaches to
    port: int = 8000
    prometheus: str = "http://prometheus.monitoring:9090"
    image: str = "vllm/vllm-openai:latest"

    def service(self, side: str) -> str:
        return (self.stable_service if side == "stable" else self.canary_service) or f"{self.app}-{side}"


def _pct(w: float) -> int:
    return int(round(w * 100))


def analysis_template(
    names: ClusterNames,
    weight: float,
    pred: Prediction,
    tol: Tolerances,
    ttft_target_s: float,
    interval_s: float,
    hold_s: float,
) -> dict:
    window = f"{max(1, int(round(hold_s)))}s"
    qs = queries(f'job="{names.service("canary")}"', window, ttft_target_s)
    metrics = []
    for gate, (op, limit) in limits(pred, tol, ttft_target_s).items():
        if gate not in qs:
            continue  # errors are the gateway's to count: no engine metric to export a query for
        metrics.append(
            {
                "name": gate.replace("_", "-"),
                "interval": f"{max(1, int(round(interval_s)))}s",
                "count": max(1, int(hold_s // interval_s)),
                # no data yet (NaN: no requests in the window) is not a breach, as the local gates say "not judged"
                "successCondition": f"isNaN(result[0]) || result[0] {op} {limit:.6g}",
                "failureLimit": 0,
                "provider": {"prometheus": {"address": names.prometheus, "query": qs[gate]}},
            }
        )
    return {
        "apiVersion": ROLLOUTS_API,
        "kind": "AnalysisTemplate",
        "metadata": {
            "name": f"{names.app}-gates-{_pct(weight)}pct",
            "namespace": names.namespace,
            "labels": {"app.kubernetes.io/managed-by": "llmcap"},
        },
        "spec": {"metrics": metrics},
    }


def rollout(names: ClusterNames, plan: RolloutPlan, replicas: int) -> dict:
    steps: list[dict] = []
    for w in plan.steps:
        if w in plan.approve_before:
            steps.append({"pause": {}})  # indefinite: `kubectl argo rollouts promote` is the approval
        steps.append({"setWeight": _pct(w)})
        steps.append({"analysis": {"templates": [{"templateName": f"{names.app}-gates-{_pct(w)}pct"}]}})
    labels = {"app": names.app}
    return {
        "apiVersion": ROLLOUTS_API,
        "kind": "Rollout",
        "metadata": {
            "name": names.app,
            "namespace": names.namespace,
            "labels": {"app.kubernetes.io/managed-by": "llmcap"},
        },
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": dict(labels)},  # copies: a shared dict would come out as a YAML anchor
            "template": {
                "metadata": {"labels": dict(labels)},
                "spec": {
                    "containers": [
                        {
                            "name": "engine",
                            "image": names.image,
                            "ports": [{"name": "http", "containerPort": names.port}],
                        }
                    ]
                },
            },
            "strategy": {
                "canary": {
                    "stableService": names.service("stable"),
                    "canaryService": names.service("canary"),
                    "trafficRouting": {
                        "plugins": {
                            "argoproj-labs/gatewayAPI": {
                                "httpRoute": names.http_route or names.app,
                                "namespace": names.namespace,
                            }
                        }
                    },
                    "steps": steps,
                }
            },
        },
    }


def http_route(names: ClusterNames, weight: float) -> dict:
    return {
        "apiVersion": GATEWAY_API,
        "kind": "HTTPRoute",
        "metadata": {
            "name": names.http_route or names.app,
            "namespace": names.namespace,
            "annotations": {"llmcap.io/candidate-weight": f"{weight:g}"},
        },
        "spec": {
            "parentRefs": [{"name": names.gateway}],
            "rules": [
                {
                    "backendRefs": [
                        {"name": names.service("stable"), "port": names.port, "weight": 100 - _pct(weight)},
                        {"name": names.service("canary"), "port": names.port, "weight": _pct(weight)},
                    ]
                }
            ],
        },
    }


def cluster_objects(
    names: ClusterNames, plan: RolloutPlan, predictions: Mapping[float, Prediction], tol: Tolerances, replicas: int
) -> dict[str, list[dict]]:
    """{"rollout.yaml": Rollout + AnalysisTemplates, "httproutes.yaml": an HTTPRoute per step}."""
    templates = [
        analysis_template(names, w, predictions[w], tol, plan.ttft_target_s, plan.interval_s, plan.hold_s)
        for w in plan.steps
    ]
    return {
        "rollout.yaml": [rollout(names, plan, replicas), *templates],
        "httproutes.yaml": [http_route(names, w) for w in (0.0, *plan.steps)],
    }


def yaml_documents(objects: list[dict]) -> str:
    return yaml.safe_dump_all(objects, sort_keys=False, default_flow_style=False)
