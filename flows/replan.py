"""Prefect flow `replan`: run the DVC pipeline (unchanged stages are skipped) and say where results are.

    python -m flows.replan [--force]      (what `make plan` and `llmcap plan` run)

The flow opens a parent MLflow run tagged with the git commit; stage runs nest under it. DVC decides
what to re-run from dvc.lock, so killing a run and running again resumes after the last finished
stage and gives the same outputs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from stages.env import ROOT, apply_defaults

apply_defaults()  # before Prefect/MLflow read their settings

from prefect import flow, get_run_logger, task  # noqa: E402
from prefect.artifacts import create_markdown_artifact  # noqa: E402

from ops import decision, store  # noqa: E402
from stages import tracking  # noqa: E402

OUTPUTS = {
    "canonical trace": "data/interim/trace.parquet",
    "quarantine": "data/interim/quarantine.parquet",
    "clean report": "data/reports/clean/clean_report.json",
    "workload summary": "data/processed/workload.json",
    "workload report": "data/reports/workload/workload.md",
    "candidates": "data/processed/candidates.parquet",
    "candidates summary": "data/reports/enumerate/summary.json",
    "candidates checks": "data/reports/enumerate/validation.json",
    "step model": "data/processed/step_model.json",
    "capacity table": "data/processed/capacity.parquet",
    "capacity summary": "data/reports/capacity/summary.json",
    "capacity report": "data/reports/capacity/capacity.html",
}


@task(name="dvc-repro")
def reproduce(root: str, force: bool) -> list[str]:
    """Run `dvc repro`; return the stages that actually ran (the rest were up to date)."""
    import logging

    from dvc.repo import Repo

    logging.getLogger("dvc").propagate = False  # DVC prints its own progress; do not log it twice

    # Stage commands call `python`: make it this interpreter's, whatever PATH the caller had.
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    # run_cache=False: DVC's run-cache key drops every mapping key named `size` at any depth (dict_sha256's
    # exclude of the output meta field), so our `size:` params section is not in it and a changed size.* param
    # would restore the previous run's outputs instead of running the stage (tests/pipeline/test_decisions.py).
    with Repo(root) as repo:
        waiting = _waiting(repo)
        if waiting:
            get_run_logger().warning(f"not run (their inputs are not there yet and no stage makes them): {', '.join(sorted(waiting))}")
            targets = [s.addressing for s in repo.index.stages if s.addressing not in waiting]
            stages = repo.reproduce(targets=targets, force=force, run_cache=False)
        else:
            stages = repo.reproduce(force=force, run_cache=False)
    return [s.addressing for s in stages]


def _waiting(repo) -> set[str]:
    """Stages with an input that is absent and no stage produces (e.g. reconcile before any replay records
    exist), and the stages downstream of them: `dvc repro` of everything would fail on them."""
    outs = {str(o.fs_path): s.addressing for s in repo.index.stages for o in s.outs}
    waiting: set[str] = set()
    changed = True
    while changed:
        changed = False
        for s in repo.index.stages:
            if s.addressing in waiting:
                continue
            for d in s.deps:
                path = str(d.fs_path)
                if (path not in outs and not os.path.exists(path)) or outs.get(path) in waiting:
                    waiting.add(s.addressing)
                    changed = True
                    break
    return waiting


@task(name="collect-results")
def collect(root: str) -> dict:
    base = Path(root)
    missing = [p for p in OUTPUTS.values() if not (base / p).exists()]
    if missing:
        raise FileNotFoundError(f"pipeline finished but outputs are missing: {missing}")
    return {
        "clean": json.loads((base / OUTPUTS["clean report"]).read_text()),
        "workload": json.loads((base / OUTPUTS["workload summary"]).read_text()),
        "candidates": json.loads((base / OUTPUTS["candidates summary"]).read_text()),
        "capacity": json.loads((base / OUTPUTS["capacity summary"]).read_text()),
    }


@task(name="dvc-push")
def push(root: str) -> dict:
    """Store the decision: every cached output of dvc.lock goes to the default DVC remote (ops.store)."""
    return store.push(Path(root))


@flow(name="replan", log_prints=True)
def replan(root: str = str(ROOT), force: bool = False) -> dict:
    """The planning loop, every step built so far: clean → characterise → enumerate → profile → size."""
    import mlflow

    logger = get_run_logger()
    mlflow.set_experiment(tracking.EXPERIMENT)
    tags = {**tracking.git_state(Path(root)), "llmcap.kind": "replan"}
    with mlflow.start_run(run_name="replan", tags=tags) as run:
        os.environ[tracking.PARENT_ENV] = run.info.run_id
        try:
            ran = reproduce(root, force)
        finally:
            os.environ.pop(tracking.PARENT_ENV, None)
        results = collect(root)
        skipped = sorted(set(_all_stages(root)) - set(ran))
        mlflow.set_tags({"dvc.stages_ran": ",".join(ran) or "none", "dvc.stages_skipped": ",".join(skipped) or "none"})
        mlflow.log_artifact(str(Path(root) / "dvc.lock"))
        w, c = results["workload"], results["clean"]
        e = results["candidates"]
        mlflow.log_metrics({"rows_kept": c["rows_kept"], "rows_quarantined": c["rows_quarantined"], "mean_rps": w["mean_rps"]})
        mlflow.log_metrics({"candidates": e["rows"], "candidates_feasible": e["feasible"]})
        k = results["capacity"]
        mlflow.log_metrics({"plan.gpus": k["gpus"], "plan.usd_per_hour": k["usd_per_hour"], "plan.target_rps": k["target_rps"]})
        mlflow.set_tags({"plan.chosen": k["chosen"], "plan.mode": k["mode"]})
        tags, artifacts = decision.record(Path(root))
        mlflow.set_tags(tags)
        for name, content in artifacts.items():
            mlflow.log_dict(content, f"decision/{name}")
        pushed = push(root)
        mlflow.set_tags({"dvc.remote": pushed["name"], "dvc.remote.url": pushed["url"]})
        mlflow.log_metric("dvc.pushed_files", pushed["pushed"])
        results["stored"] = pushed
        logger.info("stages run: %s; up to date: %s", ran or "none", skipped or "none")
        create_markdown_artifact(key="replan-summary", markdown=_markdown(results, ran, run.info.run_id), description="llmcap replan")
        return {"run_id": run.info.run_id, "experiment_id": run.info.experiment_id, "ran": ran, "skipped": skipped, **results}


def _all_stages(root: str) -> list[str]:
    import yaml

    return list(yaml.safe_load((Path(root) / "dvc.yaml").read_text())["stages"])


def _markdown(results: dict, ran: list[str], run_id: str) -> str:
    c, w, e, k = results["clean"], results["workload"], results["candidates"], results["capacity"]
    return (
        f"**{c['source_file']}** ({c['source_format']}): {c['rows_in']:,} rows in = {c['rows_kept']:,} kept + "
        f"{c['rows_quarantined']:,} quarantined; {w['rows']:,} requests at {w['mean_rps']:.3f} req/s mean, "
        f"ISL p99 {w['isl']['p99']:,.0f}, OSL p99 {w['osl']['p99']:,.0f}.\n\n"
        f"**{e['model']}**: {e['rows']:,} deployment candidates, {e['feasible']:,} feasible "
        f"(max context {e['max_context_len']:,} tokens).\n\n"
        f"**Plan**: {k['chosen']} ({k['mode']}) — {k['gpus']} GPUs ({k['base_instances']} base + "
        f"{k['instances'] - k['base_instances']} headroom instances) for {k['target_rps']:.3g} req/s, ${k['usd_per_hour']:,.0f}/h.\n\n"
        f"Stages run: {', '.join(ran) or 'none (all up to date)'}. MLflow run `{run_id}`."
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="flows.replan", description="Run the llmcap planning loop.")
    ap.add_argument("--force", action="store_true", help="re-run every stage")
    args = ap.parse_args(argv)
    result = replan(force=args.force)
    print()
    print(f"stages run: {', '.join(result['ran']) or 'none (all up to date)'}")
    for name, rel in OUTPUTS.items():
        print(f"  {name:<18} {ROOT / rel}")
    print(f"  plots              {ROOT / 'data/reports/workload'}/*.png")
    e = result["candidates"]
    print(f"  candidates: {e['model']}, {e['rows']:,} rows, {e['feasible']:,} feasible; by reason {e['infeasible_by_reason']}")
    print(f"  MLflow run         {result['run_id']} (experiment '{tracking.EXPERIMENT}', {os.environ['MLFLOW_TRACKING_URI']})")
    print(f"                     browse: mlflow ui --backend-store-uri {os.environ['MLFLOW_TRACKING_URI']}")
    k = result["capacity"]
    print(f"plan: {k['chosen']} ({k['mode']}{', P:D ' + k['pd_ratio'] if k['pd_ratio'] else ''}): {k['gpus']} GPUs, "
          f"${k['usd_per_hour']:,.0f}/h for {k['target_rps']:.3g} req/s (step times: {k['step_model_source']})")
    print(f"report: {ROOT / OUTPUTS['capacity report']}")
    stored = result["stored"]
    print(f"stored: DVC remote '{stored['name']}' ({stored['url']}), {stored['pushed']} new file(s) pushed; "
          "commit dvc.lock to record this decision (`llmcap history`, `llmcap reproduce REV`, `dvc pull` at REV)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
