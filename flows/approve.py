"""`llmcap approve RUN [--reject] [--reason TEXT]`: decide on a plan waiting in the flow `promote`, or on the
next step of a gradual rollout waiting in the flow `rollout`.

    python -m flows.approve RUN [--reject] [--comment TEXT]   # resume the paused run with the decision
    python -m flows.approve --list                            # the runs waiting for a decision

RUN is the flow run id the flow printed (a unique prefix will do). The approver is whoever runs this: the
git identity (user.name / user.email, or GIT_AUTHOR_NAME / GIT_AUTHOR_EMAIL) and OS user of this process
(`--by`, if given, must name that identity). The decision is signed with the project's approval key
(ops.approvals), which the flow verifies, and checked here first against params `approvals`.
It resumes the run through the Prefect API with the input the flow waits for (flows.promote.Approval,
flows.rollout.StepApproval); `promote` then commits the plan (authored by the approver) or restores the old
one, `rollout` takes its next step or rolls back, and both record the decision. A run that is not paused
any more (decided, timed out) cannot be resumed: exit 2 saying so.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from flows.server import use_server
from ops import approvals
from ops.common import OpsError
from stages.env import ROOT, apply_defaults

FLOWS = ("promote", "rollout")  # the flows that pause for a person


def _paused_runs(client) -> list:
    from prefect.client.schemas.filters import (
        FlowFilter,
        FlowFilterName,
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType

    return client.read_flow_runs(
        flow_filter=FlowFilter(name=FlowFilterName(any_=list(FLOWS))),
        flow_run_filter=FlowRunFilter(state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.PAUSED]))),
    )


def _fail(message: str) -> SystemExit:
    print(f"error: {message}", file=sys.stderr)
    return SystemExit(2)


def _find(client, run: str):
    from uuid import UUID

    try:
        return client.read_flow_run(UUID(run))
    except ValueError:  # not a whole UUID: a prefix of a paused run's id
        matches = [r for r in _paused_runs(client) if str(r.id).startswith(run)]
        if len(matches) != 1:
            raise _fail(f"{run!r} matches {len(matches)} paused runs; give the whole flow run id") from None
        return matches[0]
    except Exception:  # noqa: BLE001 - the client raises its own not-found error
        raise _fail(f"no flow run {run} on {use_server()}") from None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="flows.approve", description=__doc__.splitlines()[0])
    ap.add_argument("run", nargs="?", help="the paused `promote` or `rollout` flow run id")
    ap.add_argument(
        "--by", help="who decides: must be this process's git user.name or user.email (the approver is who runs this)"
    )
    ap.add_argument("--reject", action="store_true", help="reject: the plan is not promoted")
    ap.add_argument("--comment", "--reason", dest="comment", default="", help="why (recorded)")
    ap.add_argument("--list", action="store_true", help="list the runs waiting for a decision")
    ap.add_argument("--project", type=Path, default=ROOT)
    args = ap.parse_args(argv)
    root = args.project.resolve()
    apply_defaults(root)
    url = use_server(root)
    from prefect import get_client

    with get_client(sync_client=True) as client:
        if args.list or not args.run:
            runs = _paused_runs(client)
            for r in runs:
                print(
                    f"{r.id}  {r.name}  paused since {r.state.timestamp:%Y-%m-%d %H:%M:%S} UTC  {r.parameters.get('reason', '')}"
                )
            print(f"{len(runs)} run(s) waiting for a decision on {url}")
            return 0
        run = _find(client, args.run)
        if run.state is None or not run.state.is_paused():
            raise _fail(
                f"flow run {run.id} is {run.state.name if run.state else 'unknown'}, not paused: "
                "it cannot be resumed (decided, timed out, or not a promotion or rollout)"
            )
        decision = "reject" if args.reject else "approve"
        flow_name = client.read_flow(run.flow_id).name
        try:
            who, run_input = _signed(root, str(run.id), flow_name, args.by, decision, args.comment)
        except OpsError as exc:
            raise _fail(str(exc)) from None
        result = client.resume_flow_run(run.id, run_input=run_input)
    if result.status.value != "ACCEPT":
        raise _fail(f"Prefect refused to resume {run.id}: {result.details}")
    what = {
        ("promote", "approve"): "commits the plan",
        ("promote", "reject"): "restores the old plan",
        ("rollout", "approve"): "takes its next step",
        ("rollout", "reject"): "rolls back",
    }
    print(f"{decision}d {run.id} ({run.name}) as {who.ident}; the run now {what.get((flow_name, decision), 'goes on')}")
    return 0


def _signed(
    root: Path, run_id: str, flow_name: str, by: str | None, decision: str, comment: str
) -> tuple[approvals.Identity, dict]:
    """(the approver, the resume input): the decision signed with the project's approval key, after the same
    checks the flow makes (it makes them again: this only saves a refused round trip)."""
    who = approvals.current_identity(root)
    if by is not None and by not in (who.name, who.email):
        raise OpsError(
            f"--by {by!r}, but this process's git identity is {who.ident}: the approver is who runs the command"
        )
    policy = approvals.policy_at(
        root, "HEAD"
    )  # what the flow reads (a promotion: at its base commit, HEAD until it commits)
    if not approvals.allowed(who.email, policy.approvers):
        raise OpsError(f"{who.ident} is not an approver (params approvals.approvers: {', '.join(policy.approvers)})")
    return who, approvals.signed_input(approvals.approval_key(root), run_id, who, decision, comment)


if __name__ == "__main__":
    sys.exit(main())
