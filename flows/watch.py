"""Prefect flow `watch`: re-plan when the serving environment was upgraded or the trace is new, through an approval.

Each run reads the environment of every watched endpoint (params `watch.endpoints`, default
`profile.endpoint`) and the operator's fingerprint file (`watch.fingerprint_file`), and compares it with
the fingerprint the current plan was made for (ops.watch), and the trace file params.yaml names with the
one the plan was cleaned from (`ops.watch.trace_changes`). Nothing changed: the run says so and ends.
A field changed: the observed values are written to params.yaml's `profile` section (the stored
profile is now stale: the `profile` stage re-profiles `profile.endpoint` if set, else falls back to the
roofline model) and the flow `promote` re-plans, diffs and waits for approval. The committed decisions log
(ops.decisions_log) says what became of the same upgrade before: rejected, it is not asked about again until
something else changes; timed out undecided, it is raised again with a reminder saying when.
Served on a schedule by `python -m flows.serve` (deployment `watch/watch`).
"""

from __future__ import annotations

from pathlib import Path

from stages.env import ROOT, apply_defaults

apply_defaults()

from prefect import flow, get_run_logger, task  # noqa: E402
from prefect.artifacts import create_markdown_artifact  # noqa: E402

from flows.promote import pending, promote, restore  # noqa: E402
from ops import decisions_log  # noqa: E402
from ops import watch as upgrade  # noqa: E402
from ops.common import git  # noqa: E402


@task(name="observe-environment")
def observe(root: str) -> dict[str, dict]:
    """{source: observed fields} for every watched endpoint and the fingerprint file."""
    from llmcap.config import load_params
    from llmcap.credentials import redact_url

    base = Path(root)
    params = load_params(base / "params.yaml")
    endpoints = params.watch.endpoints or ([params.profile.endpoint] if params.profile.endpoint else [])
    # named without credentials: the name goes into logs, the reason and the commit message
    out = {redact_url(url): upgrade.observe_endpoint(url) for url in endpoints}
    if params.watch.fingerprint_file:
        path = base / params.watch.fingerprint_file
        out[str(path)] = upgrade.read_fingerprint_file(path)
    return out


@flow(name="watch", log_prints=True)
def watch(root: str = str(ROOT), approval_timeout_s: int | None = None) -> dict:
    """One look at the environment; a re-plan (and an approval) only when it was upgraded."""
    logger = get_run_logger()
    base = Path(root)
    observations = observe(root)
    upgraded = upgrade.upgrade_changes(upgrade.planned_fingerprint(base), observations)
    changes = upgraded + upgrade.trace_changes(base)
    result = {"observed": observations, "changes": changes}
    if not changes:
        print(f"no upgrade and no new trace: {', '.join([*observations, 'the trace'])} match the plan's")
        return {**result, "action": "none"}
    why = upgrade.describe(changes)
    kind = "upgrade" if upgraded else "new trace"
    key = upgrade.changes_key(changes)
    before = decisions_log.last_for(decisions_log.read(base), key)
    if before is not None and before["what"] == "rejected":
        print(f"{kind} already decided ({decisions_log.label(before)} at {before['at']}): {why}; not asking again")
        return {**result, "action": "already rejected"}
    reminder = decisions_log.reminder(before) if before is not None and before["what"] == "timed_out" else None
    busy = pending(base)
    if busy:
        logger.warning("%s seen (%s) but %s; re-plan on a later run", kind, why, busy)
        return {**result, "action": "waiting", "pending": busy}
    print(f"{kind}: {why} -> re-plan" + (f" ({reminder})" if reminder else ""))
    create_markdown_artifact(
        key="upgrade",
        markdown=f"**{kind.capitalize()} seen**, re-planning:\n\n"
        + "\n".join(f"- `{c['field']}`: {c['planned']!r} → {c['observed']!r} ({c['source']})" for c in changes),
    )
    head = git(base, "rev-parse", "HEAD")
    if upgraded:  # a new trace needs no mark: its changed bytes make DVC re-run the pipeline from `clean`
        upgrade.mark_stale(base / "params.yaml", upgraded)
    try:
        record = promote(
            root, reason=f"{kind}: {why}", approval_timeout_s=approval_timeout_s, fingerprint=key, reminder=reminder
        )
    except BaseException:
        restore(base, head)  # a failed re-plan must not leave the next runs 'waiting' on its half-written state
        raise
    return {**result, "action": "re-planned", "decision": record}
