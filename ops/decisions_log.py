"""The committed decisions log, `decisions/log.jsonl`: one JSON line per decision on a re-plan, in git.

The flow `promote` appends a line for every decision it carries out and commits it, so another clone sees it
in `git log` and `llmcap history`:
- `approved`: in the commit that promotes the plan (params.yaml, dvc.lock), authored by the approver;
- `rejected` (by a person or by the gates) and `timed_out`: a commit of the log alone, the plan in force kept;
- `recorded_without_approval`: an unchanged decision recorded with its new environment.

Each line: when (`at`), what, who (`by`, `email`, `os_user`; the flow itself for timeouts and gates), why
(`comment`, `reason`), `base_commit`, `dvc_lock_sha256` (of the re-plan's lock), `flow_run_id`, `mlflow_run_id`,
`fingerprint` (ops.watch.changes_key of the upgrade; null for a scheduled re-plan), `triggered_by` and `plan`
(chosen configuration, GPUs, $/h, target rate). The watch reads it: a rejected upgrade is not raised again,
a timed-out one is, with a reminder. `.gitattributes` merges the file by union: two clones' lines both stay.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ops.common import git, show

LOG = "decisions/log.jsonl"
WHAT = {
    "approved": "approved",
    "rejected": "rejected",
    "timed out": "timed_out",
    "recorded": "recorded_without_approval",
}
LABEL = {
    "approved": "{by}",
    "rejected": "rejected by {by}",
    "timed_out": "timed out",
    "recorded_without_approval": "not needed: decision unchanged",
}


def entry(record: dict[str, Any], capacity: dict[str, Any]) -> dict[str, Any]:
    """The log line of a decision record of flows.promote and the capacity summary of its re-plan."""
    plan = {k: capacity.get(k) for k in ("chosen", "mode", "gpus", "usd_per_hour", "target_rps")}
    keys = (
        "at",
        "by",
        "email",
        "os_user",
        "comment",
        "reason",
        "base_commit",
        "dvc_lock_sha256",
        "flow_run_id",
        "mlflow_run_id",
        "fingerprint",
        "triggered_by",
    )
    return {"what": WHAT[record["decision"]], **{k: record.get(k) for k in keys}, "plan": plan}


def append(root: Path, line: dict[str, Any]) -> None:
    path = root / LOG
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(line, sort_keys=True) + "\n")


def commit(root: Path, paths: tuple[str, ...], message: str, author: str | None = None) -> str:
    """Commit `paths` (the log among them) with `message`, authored by `author` (`Name <email>`; None: this
    process's git identity); the new commit id."""
    git(root, "add", "--", *paths)
    git(root, "commit", "-q", "-m", message, *(["--author", author] if author else []), "--", *paths)
    return git(root, "rev-parse", "HEAD")


def read(root: Path, rev: str | None = None) -> list[dict[str, Any]]:
    """The log's lines, oldest first: the working tree's file, or the one committed at `rev`."""
    if rev is None:
        path = root / LOG
        text = path.read_text(encoding="utf-8") if path.is_file() else ""
    else:
        text = (show(root, rev, LOG) or b"").decode()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def last_for(lines: list[dict[str, Any]], fingerprint: str) -> dict[str, Any] | None:
    """The latest decision on the upgrade `fingerprint`, or None when none was made."""
    return next((line for line in reversed(lines) if line.get("fingerprint") == fingerprint), None)


def label(line: dict[str, Any]) -> str:
    """What `llmcap history` shows in its "approved by" column."""
    return LABEL[line["what"]].format(by=line.get("by"))


def reminder(line: dict[str, Any]) -> str:
    """The line a watch prints when it raises an upgrade that timed out before."""
    return (
        f"reminder: this was raised before and timed out undecided at {line['at']} (flow run {line['flow_run_id']}); "
        "the plan in force is still the old one"
    )
