"""Prefect flow `promote`: re-plan, show what changed, and promote the plan only when a person approves.

    re-plan (the flow `replan`) -> decision diff against HEAD's plan -> gates -> pause for approval
      approved:          params.yaml + dvc.lock + decisions/approval.json committed (git), authored by the approver;
                         outputs already in the DVC remote
      rejected/timed out: params.yaml and dvc.lock restored from HEAD and its outputs checked out: the old plan stays in force
      nothing measured and the decision unchanged (an upgrade with no endpoint to re-profile): params.yaml and dvc.lock
                         committed without asking, saying it could not re-measure (`unmeasured_and_unchanged`)

The pause is Prefect's `pause_flow_run(wait_for_input=Approval)`: resume it with `llmcap approve RUN [--reject]
[--comment TEXT]`, which signs the decision as its caller's git identity (ops.approvals). An unsigned or badly
signed input (the Prefect UI's form, a raw API call), an approver not in params `approvals.approvers`, or the
trigger approving its own re-plan when `approvals.distinct_from_trigger` says not to, is refused and the run
pauses again for the rest of its timeout. It needs a Prefect server (`make server`), as does the deployment
`promote/replan` that runs it on a schedule (`make serve`). Every decision is a line of the committed
decisions log `decisions/log.jsonl` (ops.decisions_log), and goes to the plan's MLflow run (tags
`approval*`, artifact `decision/approval.json`) and to `.work/decisions/approvals.jsonl`.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from stages.env import ROOT, apply_defaults

apply_defaults()

from prefect import flow, get_run_logger, runtime  # noqa: E402
from prefect.artifacts import create_markdown_artifact  # noqa: E402
from prefect.exceptions import FlowPauseTimeout  # noqa: E402
from prefect.flow_runs import pause_flow_run  # noqa: E402
from prefect.input import RunInput  # noqa: E402
from pydantic import Field  # noqa: E402

from flows.replan import replan  # noqa: E402
from llmcap.config import ApprovalsParams  # noqa: E402
from ops import approvals, decisions_log  # noqa: E402
from ops.common import OpsError, git, sha256, show  # noqa: E402

APPROVAL_FILE = "decisions/approval.json"  # committed with the plan it approves
PROMOTED_PATHS = ("params.yaml", "dvc.lock", APPROVAL_FILE, decisions_log.LOG)


class Approval(RunInput):
    """What the person approving a plan gives (the Prefect UI shows it as a form)."""

    approver: str = Field(min_length=1, description="who decides (git user.name of `llmcap approve`'s caller)")
    decision: Literal["approve", "reject"] = "approve"
    comment: str = ""
    email: str = Field("", description="the approver's git email (params approvals.approvers)")
    os_user: str = ""
    signed_at: str = ""
    signature: str = Field(
        "", description="`llmcap approve`'s HMAC with the project's approval key: without it the input is refused"
    )


def pending(root: Path) -> str | None:
    """Why no new plan may start: an earlier one still awaits approval (uncommitted params.yaml or dvc.lock)."""
    dirty = git(root, "status", "--porcelain", "--untracked-files=no", "--", "params.yaml", "dvc.lock", check=False)
    return f"uncommitted changes await a decision: {dirty.replace(chr(10), '; ')}" if dirty else None


def gates(capacity: dict) -> list[str]:
    """Cheap checks before a person is asked: what would make approving pointless."""
    failed = []
    if not capacity.get("scenarios_pass", False):
        failed.append(
            "a headroom scenario failed: "
            + "; ".join(s for s in capacity.get("scenarios", []) if "pass" not in s.split("→")[-1])
        )
    if not capacity.get("gpus"):
        failed.append("the plan has no GPUs")
    return failed


def write_diff(root: Path, base_commit: str, run_id: str) -> dict:
    """`llmcap diff HEAD <workspace>`: the decision diff a person approves, under .work/decisions/<run>/ and in MLflow."""
    import mlflow

    from ops.diff import diff, load_side, markdown

    result = diff(load_side(root, base_commit), load_side(root, str(root)))
    out = root / ".work" / "decisions" / run_id
    out.mkdir(parents=True, exist_ok=True)
    text = markdown(result)
    (out / "diff.md").write_text(text, encoding="utf-8")
    (out / "diff.json").write_text(json.dumps(result, indent=1, default=str) + "\n", encoding="utf-8")
    client = mlflow.MlflowClient()
    client.log_artifact(run_id, str(out / "diff.md"), "decision")
    client.log_artifact(run_id, str(out / "diff.json"), "decision")
    return {
        "markdown": text,
        "explanation": result["explanation"],
        "path": str(out / "diff.md"),
        "decision_changed": "note" in result["decision"] or bool(result["decision"]["changed"]),
    }


def unmeasured_and_unchanged(decision_changed: bool, capacity: dict, endpoint: str | None) -> str | None:
    """Why a re-plan needs no approval, or None when it does: the decision (configuration, counts, cost, headroom)
    is HEAD's and nothing was measured (the profile stage fell back to the roofline, so every pool's step times
    are the roofline's): only the recorded environment (an upgrade's new versions) changed. Says why it could
    not re-measure."""
    pools = (capacity.get("pool_provenance") or {}).values()
    measured = str(capacity.get("step_model_source", "")).startswith("profile") or any(
        p.get("step_model") == "profile-measured" for p in pools
    )
    if decision_changed or measured or not pools:
        return None
    from llmcap.credentials import redact_url

    why = (
        "no profile.endpoint to re-profile"
        if endpoint is None
        else f"profiling {redact_url(endpoint)} gave no profile: the roofline stands in"
    )
    return (
        f"could not re-measure ({why}): every pool's step times are the roofline's and the decision is unchanged; "
        "the new environment is recorded without asking for approval"
    )


def conclude(root: Path, record: dict, capacity: dict) -> dict:
    """Carry out the decision and record it everywhere: a line of the committed decisions log (in the plan's
    commit when approved, authored by the approver; a commit of its own otherwise), MLflow run tags, the local
    audit log."""
    import mlflow

    line = decisions_log.entry(record, capacity)
    label = decisions_log.label(line)
    decisions_log.append(root, line)
    if record["decision"] == "recorded":  # an unchanged decision: the refreshed params.yaml and dvc.lock, no approval
        record["commit"] = decisions_log.commit(
            root,
            ("params.yaml", "dvc.lock", decisions_log.LOG),
            f"plan: {record['reason']} (decision unchanged, recorded without approval)",
        )
    elif record["decision"] == "approved":
        path = root / APPROVAL_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
        record["commit"] = decisions_log.commit(
            root, PROMOTED_PATHS, f"plan: {record['reason']} (approved by {record['by']})", _author(record)
        )
    else:  # the old plan stays in force; the decision still reaches git
        restore(root, record["base_commit"])
        record["commit"] = decisions_log.commit(
            root, (decisions_log.LOG,), f"decision: {record['reason']} ({label}; plan in force kept)", _author(record)
        )
    tags = {"approval": label, **{f"approval.{k}": str(v) for k, v in record.items() if v is not None}}
    client = mlflow.MlflowClient()
    for key, value in tags.items():
        client.set_tag(record["mlflow_run_id"], key, value[:5000])
    out = root / ".work" / "decisions"
    out.mkdir(parents=True, exist_ok=True)
    with (out / "approvals.jsonl").open("a", encoding="utf-8") as log:
        log.write(json.dumps(record, sort_keys=True) + "\n")
    (out / record["mlflow_run_id"]).mkdir(exist_ok=True)
    (out / record["mlflow_run_id"] / "approval.json").write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    client.log_artifact(record["mlflow_run_id"], str(out / record["mlflow_run_id"] / "approval.json"), "decision")
    return record


def _author(record: dict) -> str | None:
    """The git author of a person's decision (`Name <email>`); None (the flow's own identity) for the gates'."""
    return f"{record['by']} <{record['email']}>" if record.get("email") else None


def restore(root: Path, commit: str) -> None:
    """Put the plan of `commit` back in force: its params.yaml and dvc.lock, and the outputs that lock names."""
    from dvc.repo import Repo

    git(root, "checkout", commit, "--", "params.yaml", "dvc.lock")
    with Repo(str(root)) as repo:
        repo.checkout(force=True)  # the outputs were produced here, so the local cache holds them


@flow(name="promote", log_prints=True)
def promote(
    root: str = str(ROOT),
    reason: str = "scheduled re-plan",
    approval_timeout_s: int | None = None,
    poll_interval_s: int = 5,
    fingerprint: str | None = None,
    reminder: str | None = None,
    triggered_by: str | None = None,
) -> dict:
    """Re-plan and promote the result only through an approval; returns the decision record. `fingerprint`: the
    upgrade's id (flows.watch) for the decisions log; `reminder`: shown with the approval hint (an upgrade that
    timed out before); `triggered_by`: `Name <email>` of who asked (default: this process's git identity)."""
    from llmcap.config import load_params

    logger = get_run_logger()
    base = Path(root)
    base_commit = git(base, "rev-parse", "HEAD")
    if show(base, base_commit, "dvc.lock") is None:
        raise RuntimeError(f"{base_commit[:10]} has no dvc.lock: commit a first plan before promoting re-plans")
    if (base / "dvc.lock").read_bytes() != show(base, base_commit, "dvc.lock"):
        raise RuntimeError(f"dvc.lock differs from HEAD's ({pending(base)}); commit or restore it first")
    params = load_params(base / "params.yaml")
    timeout = approval_timeout_s or params.watch.approval_timeout_s
    triggered_by = triggered_by or _identity(base)
    planned = replan(root)
    lock = (base / "dvc.lock").read_bytes()
    record = {
        "reason": reason,
        "base_commit": base_commit,
        "dvc_lock_sha256": sha256(lock),
        "mlflow_run_id": planned["run_id"],
        "flow_run_id": str(runtime.flow_run.id),
        "decision": None,
        "by": None,
        "email": None,
        "os_user": None,
        "comment": None,
        "at": None,
        "fingerprint": fingerprint,
        "triggered_by": triggered_by,
    }
    if lock == show(base, base_commit, "dvc.lock") and not pending(base):
        logger.info("the re-plan reproduced HEAD's plan (%s): nothing to promote", base_commit[:10])
        return {**record, "decision": "unchanged"}
    changes = write_diff(base, base_commit, planned["run_id"])
    failed = gates(planned["capacity"])
    k = planned["capacity"]
    summary = (
        f"**Re-plan**: {reason}\n\n**Plan**: {k['chosen']} ({k['mode']}), {k['gpus']} GPUs, ${k['usd_per_hour']:,.0f}/h "
        f"for {k['target_rps']:.3g} req/s. MLflow run `{planned['run_id']}`.\n\n{changes['markdown']}"
    )
    unchanged = (
        None
        if failed
        else unmeasured_and_unchanged(
            changes["decision_changed"], k, load_params(base / "params.yaml").profile.endpoint
        )
    )
    if unchanged is not None:
        logger.info("%s", unchanged)
        create_markdown_artifact(key="promotion", markdown=f"{summary}\n\n**Recorded without approval**: {unchanged}.")
        return conclude(base, {**record, "decision": "recorded", "by": "llmcap", "comment": unchanged, "at": _now()}, k)
    if failed:
        create_markdown_artifact(key="promotion", markdown=summary + "\n\n**Gates failed**: " + "; ".join(failed))
        return conclude(
            base, {**record, "decision": "rejected", "by": "gates", "comment": "; ".join(failed), "at": _now()}, k
        )
    hint = (
        f"plan awaits approval: llmcap approve {record['flow_run_id']} [--reject] [--comment TEXT] "
        f"(as an approver's git identity) within {timeout} s; diff: {changes['path']}"
    )
    if reminder:
        summary += f"\n\n**Reminder**: {reminder}."
        print(reminder)
    create_markdown_artifact(key="promotion", markdown=f"{summary}\n\nGates passed. **Waiting for approval**: `{hint}`")
    print(hint)
    given = await_decision(
        base,
        record,
        timeout,
        poll_interval_s,
        approvals.policy_at(base, base_commit),
        lambda why: create_markdown_artifact(
            key="promotion", markdown=f"{summary}\n\n**Refused**: {why}.\n\nStill **waiting for approval**: `{hint}`"
        ),
    )
    if given is None:
        comment = f"no approval within {timeout} s"
        running_again(f"approval timed out ({comment}): the plan in force is kept")
        create_markdown_artifact(
            key="promotion", markdown=f"{summary}\n\n**Timed out**: {comment}; the plan in force is kept."
        )
        return conclude(base, {**record, "decision": "timed out", "comment": comment, "at": _now()}, k)
    decision = "approved" if given.decision == "approve" else "rejected"
    return conclude(
        base,
        {
            **record,
            "decision": decision,
            "by": given.approver,
            "email": given.email,
            "os_user": given.os_user,
            "comment": given.comment,
            "at": _now(),
        },
        k,
    )


def await_decision(
    root: Path,
    record: dict,
    timeout: int,
    poll_interval_s: int,
    policy: ApprovalsParams,
    refused: Callable[[str], object],
) -> Approval | None:
    """Pause until a valid decision (ops.approvals.refusal finds nothing wrong) or the timeout (None). A refused
    input is logged, shown (`refused(why)`) and the run pauses again for what is left of the timeout."""
    logger = get_run_logger()
    key = approvals.approval_key(root, create=True)
    deadline = time.monotonic() + timeout
    while (left := math.ceil(deadline - time.monotonic())) > 0:
        try:
            given = pause_flow_run(wait_for_input=Approval, timeout=left, poll_interval=poll_interval_s)
        except FlowPauseTimeout:
            return None
        why = approvals.refusal(
            given.model_dump(),
            record["flow_run_id"],
            key,
            policy.approvers,
            policy.distinct_from_trigger,
            record["triggered_by"],
        )
        if why is None:
            return given
        logger.warning("refused %s from %r: %s; waiting for a valid decision", given.decision, given.approver, why)
        refused(why)
    return None


def _identity(root: Path) -> str | None:
    try:
        return approvals.current_identity(root).ident
    except OpsError:
        return None


def running_again(message: str) -> None:
    """Back to Running after a pause nobody answered: the server marks an expired pause Failed ("paused and never
    resumed"), but a timeout is a decision this flow carries out (the old plan stays), not a failure."""
    from prefect.client.orchestration import get_client
    from prefect.states import Running

    with get_client(sync_client=True) as client:
        client.set_flow_run_state(runtime.flow_run.id, Running(message=message), force=True)


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
