"""Approvals with identity (ops.approvals) and the committed decisions log (ops.decisions_log), in a real git
repository: who the approver is, what the flow `promote` refuses (unsigned, forged, replayed on another run,
unlisted, the trigger approving its own re-plan), that a decision's commit is authored by the approver, and
what the watch makes of a logged rejection (not asked again) and a timeout (asked again, with a reminder).
The same refusals through a real Prefect server: tests/pipeline/test_watch_approvals.py."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from ops import approvals, decisions_log
from ops.common import OpsError
from ops.history import with_log

RUN = "7b1c9e0a-0000-4000-8000-000000000001"
ALICE = approvals.Identity("alice", "alice@example.com", "alice")
CAPACITY = {
    "chosen": "P H100 TP2 fp8 + D H200 TP4 fp8",
    "mode": "disaggregated",
    "gpus": 32,
    "usd_per_hour": 88.0,
    "target_rps": 12.5,
}


def _git(root: Path, *args: str, env: dict | None = None) -> str:
    return subprocess.run(["git", *args], cwd=root, env=env, capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A git repository with one commit (params.yaml, dvc.lock), run as the flow's identity `llmcap`."""
    for var in ("GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL"):
        monkeypatch.setenv(var, "llmcap" if "NAME" in var else "llmcap@localhost")
    root = tmp_path / "project"
    root.mkdir()
    (root / "params.yaml").write_text("seed: 0\n")
    (root / "dvc.lock").write_text("schema: '2.0'\n")
    _git(root, "init", "-q")
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", "plan A")
    return root


def _policy_refusal(
    given: dict,
    key: bytes,
    approvers: tuple[str, ...] = (),
    distinct: bool = False,
    triggered_by: str | None = "llmcap <llmcap@localhost>",
) -> str | None:
    return approvals.refusal(given, RUN, key, list(approvers), distinct, triggered_by)


def test_the_approver_is_the_process_git_identity(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GIT_AUTHOR_NAME", "Alice Liddell")
    monkeypatch.setenv("GIT_AUTHOR_EMAIL", "alice@example.com")
    who = approvals.current_identity(repo)
    assert (who.name, who.email, who.ident) == (
        "Alice Liddell",
        "alice@example.com",
        "Alice Liddell <alice@example.com>",
    )
    import pwd

    assert who.os_user == pwd.getpwuid(os.getuid()).pw_name


def test_the_key_is_made_owner_only_and_refused_when_others_may_read_it(repo: Path) -> None:
    with pytest.raises(OpsError, match="no approval key"):
        approvals.approval_key(repo)
    key = approvals.approval_key(repo, create=True)
    path = repo / approvals.KEY_FILE
    assert path.stat().st_mode & 0o777 == 0o600 and len(key) == 64  # 32 random bytes, hex
    assert approvals.approval_key(repo, create=True) == key  # made once
    path.chmod(0o640)
    with pytest.raises(OpsError, match="mode 0640"):
        approvals.approval_key(repo)


def test_only_a_signed_listed_approval_is_accepted(repo: Path) -> None:
    key = approvals.approval_key(repo, create=True)
    signed = approvals.signed_input(key, RUN, ALICE, "approve", "soaked")
    assert _policy_refusal(signed, key) is None  # anyone who can sign, with no allow-list
    assert _policy_refusal(signed, key, approvers=["Alice@Example.com"]) is None  # emails compare without case
    # a raw API call: what the Prefect UI's form sends
    assert "unsigned" in str(_policy_refusal({"approver": "alice", "decision": "approve", "comment": ""}, key))
    # the same signature, another decision / approver / run, or another project's key
    assert "bad signature" in str(_policy_refusal({**signed, "decision": "reject"}, key))
    assert "bad signature" in str(_policy_refusal({**signed, "email": "bob@example.com"}, key))
    assert "bad signature" in str(approvals.refusal(signed, RUN.replace("1", "2"), key, [], False, None))
    assert "bad signature" in str(_policy_refusal(signed, b"0" * 64))
    # signed, but not on the list
    mallory = approvals.signed_input(key, RUN, approvals.Identity("mallory", "mallory@example.com", "m"), "approve", "")
    assert _policy_refusal(mallory, key, approvers=["alice@example.com"]) == (
        "mallory <mallory@example.com> is not an approver (params approvals.approvers)"
    )
    # whoever triggered the re-plan may not approve it when distinct_from_trigger says so
    own = _policy_refusal(
        signed, key, approvers=["alice@example.com"], distinct=True, triggered_by="Alice L <ALICE@example.com>"
    )
    assert own is not None and "triggered this re-plan" in own
    assert _policy_refusal(signed, key, approvers=["alice@example.com"], distinct=True) is None


def test_approve_checks_identity_and_list_before_sending(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from flows.approve import _signed
    from stages.env import ROOT

    (repo / "params.yaml").write_text(
        (ROOT / "params.yaml").read_text().replace("approvers: []", 'approvers: ["alice@example.com"]')
    )
    decisions_log.commit(repo, ("params.yaml",), "only alice approves")
    approvals.approval_key(repo, create=True)
    monkeypatch.setenv("GIT_AUTHOR_NAME", "alice")
    monkeypatch.setenv("GIT_AUTHOR_EMAIL", "alice@example.com")
    who, run_input = _signed(repo, RUN, "promote", "alice", "approve", "ok")
    assert (
        who.email == "alice@example.com"
        and _policy_refusal(run_input, approvals.approval_key(repo), ["alice@example.com"]) is None
    )
    with pytest.raises(OpsError, match="--by 'bob', but this process's git identity is alice <alice@example.com>"):
        _signed(repo, RUN, "promote", "bob", "approve", "")
    monkeypatch.setenv("GIT_AUTHOR_EMAIL", "mallory@example.com")
    with pytest.raises(OpsError, match="is not an approver"):
        _signed(repo, RUN, "promote", None, "approve", "")
    # a rollout step is signed and checked the same way (flows.rollout.StepApproval)
    monkeypatch.setenv("GIT_AUTHOR_EMAIL", "alice@example.com")
    step = _signed(repo, RUN, "rollout", None, "reject", "why")[1]
    assert (
        step["decision"] == "reject"
        and _policy_refusal(step, approvals.approval_key(repo), ["alice@example.com"]) is None
    )


def _record(decision: str, by: str | None = None, email: str | None = None, fingerprint: str | None = "f00d") -> dict:
    return {
        "reason": "upgrade: engine_version '0.11.0' -> '0.12.0'",
        "base_commit": "c0ffee",
        "dvc_lock_sha256": "ab" * 32,
        "mlflow_run_id": f"run-{decision}",
        "flow_run_id": RUN,
        "decision": decision,
        "by": by,
        "email": email,
        "os_user": by,
        "comment": None,
        "at": f"2026-12-06T05:0{len(decision) % 10}:00+00:00",
        "fingerprint": fingerprint,
        "triggered_by": "llmcap <llmcap@localhost>",
    }


def test_decisions_are_committed_by_their_decider_and_read_back(repo: Path) -> None:
    base = _git(repo, "rev-parse", "HEAD")
    line = decisions_log.entry(_record("rejected", "bob", "bob@example.com"), CAPACITY)
    assert line["what"] == "rejected" and line["plan"] == CAPACITY and line["fingerprint"] == "f00d"
    decisions_log.append(repo, line)
    rejected = decisions_log.commit(repo, (decisions_log.LOG,), "decision: rejected", "bob <bob@example.com>")
    timed_out = decisions_log.entry(_record("timed out", fingerprint="beef"), CAPACITY)
    decisions_log.append(repo, timed_out)
    decisions_log.commit(repo, (decisions_log.LOG,), "decision: timed out")
    # in git: who wrote each decision, and what each commit holds
    assert _git(repo, "log", "--format=%an <%ae>|%H", f"{base}..HEAD").splitlines() == [
        f"llmcap <llmcap@localhost>|{_git(repo, 'rev-parse', 'HEAD')}",
        f"bob <bob@example.com>|{rejected}",
    ]
    assert _git(repo, "show", "--format=", "--name-only", rejected) == decisions_log.LOG
    assert decisions_log.read(repo, rejected) == [line]  # as committed then
    assert decisions_log.read(repo, "HEAD") == decisions_log.read(repo) == [line, timed_out]
    assert decisions_log.read(repo, base) == []
    assert [decisions_log.label(x) for x in (line, timed_out)] == ["rejected by bob", "timed out"]
    assert (repo / decisions_log.LOG).read_text().count("\n") == 2  # one JSON line per decision
    json.loads((repo / decisions_log.LOG).read_text().splitlines()[1])


def test_a_rejection_is_final_and_a_timeout_is_asked_again(repo: Path) -> None:
    """What flows.watch reads from the log for an upgrade's fingerprint (`last_for`), and the reminder it prints."""
    log = [decisions_log.entry(_record("timed out"), CAPACITY)]
    last = decisions_log.last_for(log, "f00d")
    assert last is not None and last["what"] == "timed_out"
    assert decisions_log.reminder(last) == (
        f"reminder: this was raised before and timed out undecided at {last['at']} (flow run {RUN}); the plan in force is still the old one"
    )
    log.append(decisions_log.entry(_record("rejected", "bob", "bob@example.com"), CAPACITY))
    assert decisions_log.last_for(log, "f00d")["what"] == "rejected"  # the latest decision on it wins
    assert decisions_log.last_for(log, "other") is None  # another upgrade: never decided


def test_history_shows_logged_decisions_even_without_their_mlflow_run() -> None:
    approved = decisions_log.entry(_record("approved", "alice", "alice@example.com"), CAPACITY)
    timed_out = decisions_log.entry(_record("timed out"), CAPACITY)  # 2026-12-06T05:09: newer than approved's 05:08
    local = {"date": "2026-12-06T05:00:00+00:00", "run_id": "run-approved", "approved_by": "none", "gpus": 32}
    rows = with_log([local], [approved, timed_out], {"ab" * 32: "c0mmit"})
    assert [(r["run_id"], r["approved_by"]) for r in rows] == [
        ("run-timed out", "timed out"),
        ("run-approved", "alice"),
    ]
    other_clone = rows[0]  # its MLflow run is in another clone's store: the row comes from git alone
    assert (other_clone["gpus"], other_clone["usd_per_hour"], other_clone["recorded_in"]) == (32, 88.0, "c0mmit")
    assert other_clone["decision"] == {"what": "timed_out", "by": None, "email": None, "at": timed_out["at"]}


def test_the_allow_list_is_the_base_commits(repo: Path) -> None:
    """flows.promote reads approvals.approvers at the re-plan's base commit: a working copy edited to admit
    anyone (an empty list) does not."""
    from stages.env import ROOT

    shipped = (ROOT / "params.yaml").read_text()
    (repo / "params.yaml").write_text(shipped.replace("approvers: []", 'approvers: ["alice@example.com"]'))
    base = decisions_log.commit(repo, ("params.yaml",), "only alice approves")
    (repo / "params.yaml").write_text(shipped.replace("distinct_from_trigger: false", "distinct_from_trigger: true"))
    policy = approvals.policy_at(repo, base)
    assert (policy.approvers, policy.distinct_from_trigger) == (["alice@example.com"], False)
    assert approvals.policy_at(repo, _git(repo, "rev-parse", "HEAD~1")).approvers == []  # plan A's params: no section
