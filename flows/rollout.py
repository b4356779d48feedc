"""Prefect flow `rollout`: move traffic to a candidate in steps through the llmcap gateway, judge every
step against the simulator's predictions for its share, roll back by itself on a breach, and pause for a
person before the steps that need one.

    python -m flows.rollout --gateway URL --candidate-metrics URL --predictions FILE
        [--steps 0.01,0.05,0.25,0.5,1] [--hold-s 60] [--interval-s 5] [--approve-before 0.25,1]
        [--approval-timeout-s 3600] [--ttft-target-ms 2000] [--prometheus URL --gateway-job J --engine-job J]
        [--out DIR]

The gateway (`llmcap gateway`) and both deployments run already; FILE comes from `llmcap rollout
predict`. An approval is Prefect's `pause_flow_run(wait_for_input=StepApproval)`: give it with `llmcap
approve RUN [--reject] [--reason TEXT]`, signed as its caller's git identity and checked as flows.promote
checks a plan's (ops.approvals: an unsigned input, such as the Prefect UI's form, or an approver not in
params `approvals.approvers` at the project's HEAD is refused and the step waits again). It needs a Prefect server
(`python -m flows.server start`). A rejection or a timeout rolls back (candidate weight 0) and the run
cannot be resumed again. Who, when, why, and the evidence they saw go to the run's MLflow run (tags
`approval.<pct>.*`, artifacts `approvals/`), to `.work/decisions/approvals.jsonl` (append-only), and to
`outcome.json` in --out with every step's verdicts.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import sys
import time
from pathlib import Path
from typing import Any, Literal

from flows.server import adopt_server
from stages.env import ROOT, apply_defaults

apply_defaults()
adopt_server()  # approvals pause the run: that needs the project's Prefect server, not the ephemeral one

from prefect import flow, get_client, runtime  # noqa: E402
from prefect.artifacts import acreate_markdown_artifact  # noqa: E402
from prefect.exceptions import FlowPauseTimeout  # noqa: E402
from prefect.flow_runs import apause_flow_run  # noqa: E402
from prefect.input import RunInput  # noqa: E402
from prefect.states import Running  # noqa: E402
from pydantic import Field  # noqa: E402

from llmcap import exit_codes  # noqa: E402
from llmcap.rollout.driver import AdminWeights, RolloutPlan, run_rollout  # noqa: E402
from llmcap.rollout.gates import Tolerances  # noqa: E402
from llmcap.rollout.observe import ScrapeSource  # noqa: E402
from llmcap.rollout.predict import load_predictions  # noqa: E402
from llmcap.rollout.promql import PromQLSource  # noqa: E402
from ops import approvals  # noqa: E402

AUDIT_LOG = Path(".work") / "decisions" / "approvals.jsonl"  # shared with the flow `promote`


class StepApproval(RunInput):
    """What a person gives to let the rollout take its next step (the Prefect UI shows it as a form)."""

    approver: str = Field(min_length=1, description="who decides (git user.name of `llmcap approve`'s caller)")
    decision: Literal["approve", "reject"] = "approve"
    comment: str = Field("", description="why")
    email: str = ""
    os_user: str = ""
    signed_at: str = ""
    signature: str = Field(
        "", description="`llmcap approve`'s HMAC with the project's approval key: without it the input is refused"
    )


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def _audit(root: Path, record: dict[str, Any], mlflow_run_id: str) -> None:
    import mlflow

    log = root / AUDIT_LOG
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a", encoding="utf-8") as f:
        f.write(json.dumps(record, sort_keys=True) + "\n")
    pct = f"{round(record['weight'] * 100)}pct"
    client = mlflow.MlflowClient()
    for key in ("decision", "by", "comment", "at"):
        client.set_tag(mlflow_run_id, f"approval.{pct}.{key}", str(record.get(key))[:5000])
    client.log_dict(mlflow_run_id, record, f"approvals/{pct}.json")


async def _unpause(run_id: str) -> None:
    """After a timeout the server still shows the run paused: move it on, so nobody can resume it any more."""
    async with get_client() as client:
        await client.set_flow_run_state(run_id, Running(message="approval timed out: rolling back"), force=True)


async def _valid_decision(
    root: Path, run_id: str, key: str, timeout_s: int, poll_interval_s: int
) -> StepApproval | None:
    """Pause until a signed decision by an allowed approver (ops.approvals.refusal), or None after `timeout_s`.
    A refused input is printed and the step pauses again (a new pause key) for what is left of the timeout."""
    secret = approvals.approval_key(root, create=True)
    policy = approvals.policy_at(root, "HEAD")  # not a git checkout: no allow-list, the key alone
    deadline = time.monotonic() + timeout_s
    attempt = 0
    while (left := math.ceil(deadline - time.monotonic())) > 0:
        try:
            given = await apause_flow_run(
                wait_for_input=StepApproval,
                timeout=left,
                poll_interval=poll_interval_s,
                key=key if attempt == 0 else f"{key}-{attempt}",
            )
        except FlowPauseTimeout:
            return None
        why = approvals.refusal(given.model_dump(), run_id, secret, policy.approvers, False, None)
        if why is None:
            return given
        print(f"refused {given.decision} from {given.approver!r}: {why}; waiting for a valid decision")
        attempt += 1
    return None


@flow(name="rollout", log_prints=True)
async def rollout(
    gateway_url: str,
    candidate_metrics_url: str,
    predictions: str,
    steps: list[float] = [0.01, 0.05, 0.25, 0.5, 1.0],
    hold_s: float = 60.0,
    interval_s: float = 5.0,
    approve_before: list[float] = [],
    approval_timeout_s: int = 3600,
    ttft_target_ms: float = 2000.0,
    tolerances: dict | None = None,
    prometheus_url: str | None = None,
    gateway_job: str = "gateway",
    engine_job: str = "candidate",
    out: str | None = None,
    root: str = str(ROOT),
    poll_interval_s: int = 2,
) -> dict:
    """Gradual traffic with automatic rollback and approvals; returns the outcome (also in OUT/outcome.json)."""
    import mlflow

    base = Path(root)
    run_id = str(runtime.flow_run.id)
    plan = RolloutPlan(tuple(steps), hold_s, interval_s, tuple(approve_before), ttft_target_ms / 1000.0)
    tol = Tolerances.model_validate(tolerances or {})
    preds = load_predictions(Path(predictions))
    source = (
        PromQLSource(prometheus_url, gateway_job, engine_job)
        if prometheus_url
        else ScrapeSource(gateway_url, candidate_metrics_url)
    )
    mlflow.set_experiment("rollout")
    with mlflow.start_run(run_name=f"rollout {run_id[:8]}") as active:
        mlflow_run_id = active.info.run_id
        mlflow.log_params(
            {
                "steps": ",".join(f"{w:g}" for w in steps),
                "hold_s": hold_s,
                "interval_s": interval_s,
                "approve_before": ",".join(f"{w:g}" for w in approve_before),
                "approval_timeout_s": approval_timeout_s,
                "ttft_target_ms": ttft_target_ms,
                "gateway": gateway_url,
                "metrics": "promql" if prometheus_url else "scrape",
            }
        )
        mlflow.set_tags({"rollout.flow_run_id": run_id, "rollout.predictions": predictions})
        mlflow.log_artifact(predictions, "predictions")

        async def approve(weight: float, evidence: dict[str, Any]) -> dict[str, Any]:
            shown = "\n".join(f"- {g}" for g in evidence.get("gates") or ["(no step judged yet)"])
            await acreate_markdown_artifact(
                key=f"approval-{round(weight * 100)}pct",
                markdown=(
                    f"**Rollout {run_id}** waits for approval before **{weight:.0%}** of traffic.\n\n"
                    f"Evidence (step {evidence.get('previous_step')}):\n{shown}"
                ),
            )
            print(
                f"rollout awaits approval before {weight:.0%}: llmcap approve {run_id} [--reject] "
                f"[--reason TEXT] (as an approver's git identity) within {approval_timeout_s} s"
            )
            record: dict[str, Any] = {
                "kind": "rollout-step",
                "flow_run_id": run_id,
                "mlflow_run_id": mlflow_run_id,
                "weight": weight,
                "evidence": evidence,
                "requested_at": _now(),
            }
            given = await _valid_decision(
                base, run_id, f"approve-{round(weight * 100)}pct", approval_timeout_s, poll_interval_s
            )
            if given is not None:
                record.update(
                    decision="approved" if given.decision == "approve" else "rejected",
                    by=given.approver,
                    email=given.email,
                    comment=given.comment,
                    at=_now(),
                )
            else:
                await _unpause(run_id)
                record.update(
                    decision="timed out", by=None, comment=f"no decision within {approval_timeout_s} s", at=_now()
                )
            _audit(base, record, mlflow_run_id)
            decision = {"approved": "approve", "rejected": "reject"}.get(record["decision"], "timeout")
            return {"decision": decision, "by": record["by"], "reason": record["comment"]}

        try:
            outcome = await run_rollout(plan, AdminWeights(gateway_url), source, preds, tol, approve, on_event=print)
        finally:
            await source.aclose()
        doc = outcome.to_json()
        mlflow.set_tags({"rollout.status": outcome.status, "rollout.reason": outcome.reason[:5000]})
        mlflow.log_dict(doc, "outcome.json")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "outcome.json").write_text(json.dumps(doc, indent=1, default=str) + "\n", encoding="utf-8")
    print(f"rollout {outcome.status}: {outcome.reason}")
    return doc


def _weights(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="flows.rollout", description=__doc__.splitlines()[0])
    ap.add_argument("--gateway", required=True, help="the llmcap gateway's URL (its admin API answers loopback only)")
    ap.add_argument("--candidate-metrics", required=True, help="the candidate engine's base URL (its /metrics)")
    ap.add_argument("--predictions", required=True, help="`llmcap rollout predict`'s file")
    ap.add_argument("--steps", type=_weights, default=[0.01, 0.05, 0.25, 0.5, 1.0])
    ap.add_argument("--hold-s", type=float, default=60.0)
    ap.add_argument("--interval-s", type=float, default=5.0)
    ap.add_argument("--approve-before", type=_weights, default=[])
    ap.add_argument("--approval-timeout-s", type=int, default=3600)
    ap.add_argument("--ttft-target-ms", type=float, default=2000.0)
    ap.add_argument("--tolerances", type=json.loads, default=None, help='JSON, e.g. {"min_requests": 10}')
    ap.add_argument("--prometheus", default=None, help="read the gates from this Prometheus server instead of scraping")
    ap.add_argument("--gateway-job", default="gateway")
    ap.add_argument("--engine-job", default="candidate")
    ap.add_argument("--out", default=None)
    ap.add_argument("--project", type=Path, default=ROOT)
    a = ap.parse_args(argv)
    import asyncio

    import httpx

    try:
        doc = asyncio.run(
            rollout(
                a.gateway,
                a.candidate_metrics,
                str(Path(a.predictions).resolve()),
                a.steps,
                a.hold_s,
                a.interval_s,
                a.approve_before,
                a.approval_timeout_s,
                a.ttft_target_ms,
                a.tolerances,
                a.prometheus,
                a.gateway_job,
                a.engine_job,
                str(Path(a.out).resolve()) if a.out else None,
                str(a.project.resolve()),
            )
        )
    except httpx.TransportError as exc:  # the gateway's admin API or a metrics endpoint does not answer
        where = getattr(getattr(exc, "request", None), "url", "an endpoint")
        print(f"error: {where}: no answer ({type(exc).__name__}: {exc or 'no response'}): is it up?", file=sys.stderr)
        return exit_codes.UNREACHABLE
    return int(doc["exit_code"])


if __name__ == "__main__":
    sys.exit(main())
