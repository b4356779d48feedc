"""Who approves a re-plan, and proof that the approval came through `llmcap approve`.

Prefect OSS has no users: anyone who reaches its API can resume a paused run with any input, and the UI's
form is such a call. So the flow `promote` trusts only what it can verify itself:

- the approver is the git identity (`git var GIT_AUTHOR_IDENT`: user.name / user.email, or GIT_AUTHOR_NAME /
  GIT_AUTHOR_EMAIL) and the OS user of the process that runs `llmcap approve`, never a typed name;
- `llmcap approve` signs the decision (HMAC-SHA256 over the flow run id, approver, decision, comment and time)
  with the project's approval key, `.work/approval.key`: 32 random bytes the flow creates on its first pause,
  git-ignored, mode 0600, so only the OS account that runs the flows (and root) can sign. An unsigned or
  wrongly signed resume (a raw API call, the UI form) is refused and the run pauses again;
- the signed approver must be in params `approvals.approvers` as committed at the re-plan's base (git emails;
  an empty list admits anyone who can sign) and, with `approvals.distinct_from_trigger`, must not be whoever triggered the re-plan.

What it does not prove: who typed the command. Anyone who can read the key (the service account, root) can
sign under any git identity; the key's file mode is what keeps everyone else out.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import json
import os
import pwd
import re
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from llmcap.config import ApprovalsParams
from ops.common import OpsError, git, show

KEY_FILE = Path(".work") / "approval.key"
SIGNED = ("flow_run_id", "approver", "email", "os_user", "decision", "comment", "signed_at")  # what the HMAC covers


@dataclass(frozen=True)
class Identity:
    """A git identity and the OS user of the process that holds it."""

    name: str
    email: str
    os_user: str

    @property
    def ident(self) -> str:
        """`Name <email>`: git's author format."""
        return f"{self.name} <{self.email}>"


def current_identity(root: Path) -> Identity:
    """The git author identity of this process in `root` (config or GIT_AUTHOR_* environment) and its OS user."""
    raw = git(root, "var", "GIT_AUTHOR_IDENT", check=False)
    m = re.match(r"^(.*?) <([^>]*)> \d+ [+-]\d{4}$", raw)
    if not m or not m.group(1).strip() or not m.group(2).strip():
        raise OpsError(
            "no git identity: set `git config user.name` and `git config user.email` (the approver is who runs the command)"
        )
    return Identity(m.group(1).strip(), m.group(2).strip(), pwd.getpwuid(os.getuid()).pw_name)


def approval_key(root: Path, create: bool = False) -> bytes:
    """The project's approval key; `create`: make it (0600) when missing. A key others may read is refused:
    it would let them sign as anybody."""
    path = root / KEY_FILE
    if not path.is_file():
        if not create:
            raise OpsError(
                f"{path}: no approval key (the flow `promote` creates it when it first pauses; "
                "approve as the OS user that runs the flows)"
            )
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:  # another process made it meanwhile: use theirs
            pass
        else:
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32) + "\n")
    try:
        mode = path.stat().st_mode & 0o777
        key = path.read_bytes().strip()
    except PermissionError:
        raise OpsError(
            f"{path}: not readable by {pwd.getpwuid(os.getuid()).pw_name}: only the OS user that runs the flows can approve"
        ) from None
    if mode & 0o077:
        raise OpsError(f"{path} has mode {mode:04o}: others could sign approvals; `chmod 600 {path}`")
    if len(key) < 32:
        raise OpsError(f"{path}: too short to be an approval key")
    return key


def _payload(fields: dict[str, Any]) -> bytes:
    return json.dumps({k: fields.get(k) for k in SIGNED}, sort_keys=True, separators=(",", ":")).encode()


def signature(key: bytes, fields: dict[str, Any]) -> str:
    return hmac.new(key, _payload(fields), hashlib.sha256).hexdigest()


def signed_input(key: bytes, flow_run_id: str, who: Identity, decision: str, comment: str) -> dict[str, str]:
    """The resume input `llmcap approve` sends (flows.promote.Approval's fields)."""
    fields = {
        "flow_run_id": flow_run_id,
        "approver": who.name,
        "email": who.email,
        "os_user": who.os_user,
        "decision": decision,
        "comment": comment,
        "signed_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }
    return {**{k: v for k, v in fields.items() if k != "flow_run_id"}, "signature": signature(key, fields)}


def policy_at(root: Path, commit: str) -> ApprovalsParams:
    """params.yaml `approvals` as committed at `commit` (the re-plan's base): a re-plan run with an edited
    working copy cannot loosen who may approve it."""
    raw = yaml.safe_load(show(root, commit, "params.yaml") or b"") or {}
    return ApprovalsParams.model_validate(raw.get("approvals") or {})


def allowed(email: str, approvers: list[str]) -> bool:
    return not approvers or email.casefold() in {a.casefold() for a in approvers}


def refusal(
    given: dict[str, Any],
    flow_run_id: str,
    key: bytes,
    approvers: list[str],
    distinct_from_trigger: bool,
    triggered_by: str | None,
) -> str | None:
    """Why the flow refuses a resume input, or None when it is a valid decision. `given`: the input's fields;
    `triggered_by`: the `Name <email>` of whoever triggered the re-plan."""
    if not given.get("signature"):
        return "unsigned: not given with `llmcap approve` (a raw Prefect API call or the UI form cannot approve)"
    expected = signature(key, {**given, "flow_run_id": flow_run_id})
    if not hmac.compare_digest(expected, str(given["signature"])):
        return "bad signature: not signed with this project's approval key for this flow run"
    email = str(given.get("email") or "")
    if not allowed(email, approvers):
        return f"{given.get('approver')} <{email}> is not an approver (params approvals.approvers)"
    if distinct_from_trigger and triggered_by and triggered_by.casefold().endswith(f"<{email.casefold()}>"):
        return f"{given.get('approver')} <{email}> triggered this re-plan and may not decide on it (approvals.distinct_from_trigger)"
    return None
