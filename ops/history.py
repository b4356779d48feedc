"""`llmcap history`: past planning decisions, newest first, from the MLflow runs of the flow `replan`.

    python -m ops.history [--project DIR] [--json] [--limit N]

One row per finished replan run of the project's MLflow store (params.yaml `stores:`, stages.env.stores):
when, the code commit it ran at, the commit whose dvc.lock records its outputs (commit dvc.lock after a
plan: that commit is the decision's id for `reproduce`, `diff` and `dvc pull`), target rate, chosen
configuration, GPUs, cost and who approved it. The committed decisions log (ops.decisions_log) says what
became of each re-plan (approved, rejected, timed out, recorded without approval; who, when): it overrides
the run's MLflow tag, and a decision the log has but this clone's MLflow store does not (made in another
clone) is a row of its own.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
from pathlib import Path

from ops import decisions_log
from ops.common import git, run_main, sha256, show

EXPERIMENT = "llmcap"  # stages.tracking.EXPERIMENT


def lock_commits(root: Path) -> dict[str, str]:
    """sha256 of dvc.lock -> the oldest commit (any branch) whose dvc.lock has exactly that content."""
    out: dict[str, str] = {}
    for commit in git(root, "log", "--all", "--format=%H", "--", "dvc.lock", check=False).split():
        text = show(root, commit, "dvc.lock")
        if text is not None:
            out[sha256(text)] = commit  # log is newest first: the last write wins = the oldest commit
    return out


def replan_runs(tracking_uri: str | None = None, run_id: str | None = None) -> list:
    """Finished replan runs, newest first (or the one run `run_id`)."""
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=tracking_uri)
    if run_id:
        return [client.get_run(run_id)]
    experiment = client.get_experiment_by_name(EXPERIMENT)
    if experiment is None:
        return []
    return client.search_runs(
        [experiment.experiment_id],
        filter_string="tags.`llmcap.kind` = 'replan' and attributes.status = 'FINISHED'",
        order_by=["attributes.start_time DESC"],
        max_results=10_000,
    )


def decisions(root: Path, tracking_uri: str | None = None) -> list[dict]:
    commits = lock_commits(root)
    rows = []
    for run in replan_runs(tracking_uri):
        tags, metrics = run.data.tags, run.data.metrics
        lock_sha = tags.get("dvc.lock.sha256")
        rows.append(
            {
                "date": dt.datetime.fromtimestamp(run.info.start_time / 1000, tz=dt.UTC).isoformat(timespec="seconds"),
                "run_id": run.info.run_id,
                "commit": tags.get("git.commit"),
                "dirty": tags.get("git.dirty") == "true",
                "recorded_in": commits.get(lock_sha) if lock_sha else None,
                "target_rps": metrics.get("plan.target_rps"),
                "chosen": tags.get("plan.chosen"),
                "mode": tags.get("plan.mode"),
                "gpus": None if metrics.get("plan.gpus") is None else int(metrics["plan.gpus"]),
                "usd_per_hour": metrics.get("plan.usd_per_hour"),
                "approved_by": tags.get("approval", "none"),
                "dvc_lock_sha256": lock_sha,
                "remote": tags.get("dvc.remote.url"),
            }
        )
    return with_log(rows, decisions_log.read(root), commits)


def with_log(rows: list[dict], log: list[dict], commits: dict[str, str]) -> list[dict]:
    """`rows` with each run's latest decision from the committed log (`decision`: what, by, at), plus a row for
    every logged decision whose run is not among them, newest first."""
    latest = {line["mlflow_run_id"]: line for line in log if line.get("mlflow_run_id")}  # the last line of a run wins
    known = {r["run_id"] for r in rows}
    for r in rows:
        line = latest.get(r["run_id"])
        r["decision"] = None if line is None else {k: line.get(k) for k in ("what", "by", "email", "at")}
        if line is not None:
            r["approved_by"] = decisions_log.label(line)
    for run_id, line in latest.items():
        if run_id in known:
            continue
        plan = line.get("plan") or {}
        sha = line.get("dvc_lock_sha256")
        rows.append(
            {
                "date": line["at"],
                "run_id": run_id,
                "commit": line.get("base_commit"),
                "dirty": False,
                "recorded_in": commits.get(sha) if sha else None,
                "target_rps": plan.get("target_rps"),
                "chosen": plan.get("chosen"),
                "mode": plan.get("mode"),
                "gpus": plan.get("gpus"),
                "usd_per_hour": plan.get("usd_per_hour"),
                "approved_by": decisions_log.label(line),
                "dvc_lock_sha256": sha,
                "remote": None,
                "decision": {k: line.get(k) for k in ("what", "by", "email", "at")},
            }
        )
    return sorted(rows, key=lambda r: r["date"], reverse=True)


def render(rows: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"llmcap decisions ({len(rows)}, newest first)")
    for col in ("date (UTC)", "run", "commit", "recorded in", "target req/s", "chosen", "GPUs", "$/h", "approved by"):
        table.add_column(col, justify="right" if col in ("target req/s", "GPUs", "$/h") else "left")
    for r in rows:
        table.add_row(
            r["date"].replace("+00:00", ""),
            r["run_id"][:8],
            (r["commit"] or "?")[:10] + ("+dirty" if r["dirty"] else ""),
            (r["recorded_in"] or "not committed")[:10],
            _num(r["target_rps"], "{:.3g}"),
            f"{r['chosen']} ({r['mode']})" if r["chosen"] else "?",
            _num(r["gpus"], "{}"),
            _num(r["usd_per_hour"], "{:,.0f}"),
            r["approved_by"],
        )
    Console(width=200).print(table)
    if any(r["recorded_in"] is None for r in rows):
        print(
            "'not committed': no commit's dvc.lock matches the run's; commit dvc.lock after a plan to record the decision."
        )


def _num(value, fmt: str) -> str:
    return "?" if value is None else fmt.format(value)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="ops.history", description=__doc__.splitlines()[0])
    ap.add_argument("--project", type=Path, default=Path("."))
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    ap.add_argument("--limit", type=int, default=0, help="newest N only (0: all)")
    args = ap.parse_args(argv)
    from stages.env import apply_defaults

    root = args.project.resolve()
    apply_defaults(root)  # the project's MLflow store: params.yaml `stores:` unless MLFLOW_TRACKING_URI says otherwise
    rows = decisions(root)
    rows = rows[: args.limit] if args.limit else rows
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        render(rows)
    return 0


if __name__ == "__main__":
    run_main(main)
