"""Prefect flow `replan`: run the DVC pipeline (unchanged stages are skipped) and say where results are.

    python -m flows.replan [--force]      (what `make plan` and `llmcap plan` run)

The flow opens a parent MLflow run (the plan's params, the trace as a dataset with its hash, the
decision's metrics, tags and report; named by what it decided, e.g. "36 GPUs: 7xP TP4 H100 + 2xD TP4
H200"); stage runs nest under it. Each DVC stage is one Prefect task (`dvc-stage`, its run named after the stage), run in DVC's
order and retried only on transient errors; DVC decides what to re-run from dvc.lock, so killing a run
and running again resumes after the last finished stage and gives the same outputs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import yaml

from stages.env import ROOT, apply_defaults

apply_defaults()  # before Prefect/MLflow read their settings

from dvc.lock import LockError  # noqa: E402
from prefect import flow, get_run_logger, task  # noqa: E402
from prefect.artifacts import create_markdown_artifact  # noqa: E402

from ops import decision, registry, store  # noqa: E402
from stages import provenance, timing, tracking  # noqa: E402

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
    "autoscale report": "data/reports/autoscale/autoscale.md",
    "autoscale summary": "data/reports/autoscale/summary.json",
    "replay measured": "data/processed/replay/measured.parquet",
    "replay predicted": "data/processed/replay/predicted.parquet",
    "replay summary": "data/reports/replay/summary.json",
    "replay report": "data/reports/replay/replay.html",
    "reconciliation": "data/processed/reconcile.json",
    "reconciliation report": "data/reports/reconcile/reconcile.md",
}


# Only what may pass on a second try: another process holding DVC's lock, a network or I/O timeout.
# A stage that fails (its command exits non-zero, bad input) fails the same way again: no retry.
TRANSIENT: tuple[type[BaseException], ...] = (LockError, ConnectionError, TimeoutError)


def _transient(task: object, task_run: object, state: object) -> bool:
    return isinstance(getattr(state, "data", None), TRANSIENT)


def stage_order(root: str) -> list[str]:
    """Every stage of dvc.yaml in the order `dvc repro` runs them (dependencies first)."""
    from dvc.repo import Repo
    from dvc.repo.reproduce import get_active_graph, plan_repro

    with Repo(root) as repo:
        return [s.addressing for s in plan_repro(get_active_graph(repo.index.graph))]


@task(name="dvc-stage", task_run_name="{stage}", retries=2, retry_delay_seconds=10, retry_condition_fn=_transient)
def reproduce_stage(root: str, stage: str, force: bool) -> bool:
    """`dvc repro --single-item STAGE`: DVC decides whether it is up to date; True when it ran."""
    import logging

    from dvc.repo import Repo

    logging.getLogger("dvc").propagate = False  # DVC prints its own progress; do not log it twice

    # Stage commands call `python`: make it this interpreter's, whatever PATH the caller had.
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    # run_cache=False: DVC's run-cache key drops every mapping key named `size` at any depth (dict_sha256's
    # exclude of the output meta field), so our `size:` params section is not in it and a changed size.* param
    # would restore the previous run's outputs instead of running the stage (tests/pipeline/test_decisions.py).
    with Repo(root) as repo:
        return bool(repo.reproduce(stage, single_item=True, force=force, run_cache=False))


def stage_times(
    walls: dict[str, float], phases: dict[str, dict[str, float | None]]
) -> dict[str, dict[str, float | None]]:
    """Each stage's wall time in the flow (`total`) and where it went: DVC's own checks and bookkeeping (`dvc`:
    the total less the stage process's time), the process's start, its work, MLflow and GX (stages.timing). A
    stage DVC found up to date has only `total` and `dvc`."""
    out: dict[str, dict[str, float | None]] = {}
    for stage, wall in walls.items():
        ph = phases.get(stage)
        if ph is None:
            out[stage] = {"total": wall, "dvc": wall}
            continue
        inside = sum(v for v in ph.values() if v is not None)
        out[stage] = {"total": wall, "dvc": max(0.0, wall - inside), **{k: ph.get(k) for k in timing.PHASES}}
    return out


def times_table(stage_times: dict[str, dict[str, float | None]], total_s: float) -> str:
    """The console table of `stage_times` and the flow's total, in seconds."""
    cols = ("total", "dvc", *timing.PHASES)
    heads = ("total", "DVC", "start", "work", "MLflow", "GX")
    lines = [f"time per stage (s)  {''.join(f'{h:>8}' for h in heads)}"]
    for stage, row in stage_times.items():
        cells = "".join(f"{'—' if row.get(c) is None else format(row[c], '.1f'):>8}" for c in cols)
        lines.append(f"  {stage:<17} {cells}")
    in_stages = sum(row["total"] or 0.0 for row in stage_times.values())
    lines.append(
        f"  the flow: {total_s:.1f} s, of which {total_s - in_stages:.1f} s outside the stages (Prefect's start, "
        "recording the decision, the DVC push)"
    )
    return "\n".join(lines)


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
        "replay": json.loads((base / OUTPUTS["replay summary"]).read_text()),
        "autoscale": json.loads((base / OUTPUTS["autoscale summary"]).read_text()),
    }


@task(name="dvc-push")
def push(root: str) -> dict:
    """Store the decision: every cached output of dvc.lock goes to the default DVC remote (ops.store)."""
    return store.push(Path(root))


@flow(name="replan", log_prints=True)
def replan(root: str = str(ROOT), force: bool = False) -> dict:
    """The planning loop, every step built so far: clean → characterise → enumerate → profile → size → replay."""
    import mlflow

    logger = get_run_logger()
    tracking.use_experiment()
    base = Path(root)
    tags = {**provenance.git_state(base), "llmcap.kind": "replan"}
    with mlflow.start_run(run_name="replan (running)", tags=tags) as run:
        params = yaml.safe_load((base / "params.yaml").read_text())
        mlflow.log_params(
            {k: json.dumps(v) if isinstance(v, (list, dict)) else v for k, v in tracking.flatten_params(params).items()}
        )
        stages = stage_order(root)
        os.environ[tracking.PARENT_ENV] = run.info.run_id
        ran, walls = [], {}
        with tempfile.TemporaryDirectory() as tmp:
            phases_file = os.environ[timing.STAGE_TIMES_ENV] = str(Path(tmp) / "stages.jsonl")
            try:  # one task per stage, in order: the flow run's page shows which stage runs, was skipped or failed
                for stage in stages:
                    began = time.perf_counter()
                    if reproduce_stage(root, stage, force):
                        ran.append(stage)
                    walls[stage] = time.perf_counter() - began
            finally:
                os.environ.pop(tracking.PARENT_ENV, None)
                os.environ.pop(timing.STAGE_TIMES_ENV, None)
            phases = timing.read(Path(phases_file))
        results = collect(root)
        results["stage_times"] = stage_times(walls, phases)
        mlflow.log_metrics(
            {
                f"time.{stage}.{k}_s": v
                for stage, row in results["stage_times"].items()
                for k, v in row.items()
                if v is not None
            }
        )
        skipped = [s for s in stages if s not in ran]
        mlflow.set_tags({"dvc.stages_ran": ",".join(ran) or "none", "dvc.stages_skipped": ",".join(skipped) or "none"})
        mlflow.log_artifact(str(base / "dvc.lock"))
        w, c = results["workload"], results["clean"]
        e = results["candidates"]
        mlflow.log_metrics(
            {"rows_kept": c["rows_kept"], "rows_quarantined": c["rows_quarantined"], "mean_rps": w["mean_rps"]}
        )
        mlflow.log_metrics({"candidates": e["rows"], "candidates_feasible": e["feasible"]})
        k = results["capacity"]
        mlflow.log_metrics(
            {"plan.gpus": k["gpus"], "plan.usd_per_hour": k["usd_per_hour"], "plan.target_rps": k["target_rps"]}
        )
        mlflow.log_metrics(
            {
                f"plan.{pool}.{m}": q[m]
                for pool, q in k["pool_plans"].items()
                for m in ("instances", "gpus", "per_instance_rps")
            }
        )
        mlflow.set_tags(
            {"plan.chosen": k["chosen"], "plan.mode": k["mode"], "mlflow.runName": tracking.decision_name(k)}
        )
        r = results["replay"]
        v = r["verdict"]["measured"]
        mlflow.set_tags(
            {
                "replay.source": r["source"],
                "replay.verdict": v["text"],
                "replay.valid": str(r["valid"]).lower(),
                "decision.confirmed": str(v["knee_in_band"]).lower(),
            }
        )
        tags, artifacts = decision.record(base)
        mlflow.set_tags(tags)
        applied = artifacts["step_model.json"].get("corrections") or []
        unlinked = registry.link_plan(applied, run.info.run_id, tracking.decision_name(k))
        if unlinked:
            logger.warning(
                "corrections %s are not in this MLflow registry (registered elsewhere): the plan's tags still name them",
                unlinked,
            )
        results["diff"] = _diff_from_recorded(base)
        if results["diff"] is not None:
            mlflow.log_text(results["diff"]["markdown"], "decision/diff.md")
        for name, content in artifacts.items():
            mlflow.log_dict(content, f"decision/{name}")
        for rel in (OUTPUTS["capacity report"], "data/reports/capacity/capacity.md", OUTPUTS["capacity summary"]):
            mlflow.log_artifact(str(base / rel), artifact_path="report")
        raw = base / "data" / "raw" / tags["trace.file"]
        if raw.is_file():
            tracking.log_dataset(mlflow, raw, tags["trace.sha256"], tags["trace.file"], "trace")
        canonical = base / OUTPUTS["canonical trace"]
        tracking.log_dataset(
            mlflow, canonical, provenance.file_sha256(canonical), f"{tags['trace.file']} (canonical)", "canonical trace"
        )
        pushed = push(root)
        mlflow.set_tags({"dvc.remote": pushed["name"], "dvc.remote.url": pushed["url"]})
        mlflow.log_metric("dvc.pushed_files", pushed["pushed"])
        results["stored"] = pushed
        logger.info("stages run: %s; up to date: %s", ran or "none", skipped or "none")
        create_markdown_artifact(
            key="replan-summary", markdown=_markdown(results, ran, run.info.run_id), description="llmcap replan"
        )
        return {
            "run_id": run.info.run_id,
            "experiment_id": run.info.experiment_id,
            "ran": ran,
            "skipped": skipped,
            **results,
        }


def _diff_from_recorded(base: Path) -> dict | None:
    """This plan against the decision recorded at HEAD (its committed dvc.lock), as `llmcap diff HEAD .`
    gives it; None when HEAD records none or records this very plan."""
    from ops.common import OpsError, show
    from ops.diff import diff, load_side, markdown

    committed = show(base, "HEAD", "dvc.lock")
    if committed is None or committed == (base / "dvc.lock").read_bytes():
        return None
    try:
        result = diff(load_side(base, "HEAD"), load_side(base, str(base)))
    except OpsError as exc:
        return {"changed": [], "explanation": [str(exc)], "markdown": f"not compared: {exc}\n"}
    return {
        "changed": result["decision"]["changed"],
        "explanation": result["explanation"],
        "markdown": markdown(result),
    }


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
        f"**Replay check** against {_replay_source(results['replay'])}: {results['replay']['verdict']['measured']['text']}.\n\n"
        f"Stages run: {', '.join(ran) or 'none (all up to date)'}. MLflow run `{run_id}`."
        + (
            f"\n\n**Against the decision recorded at HEAD** (`llmcap diff HEAD .`):\n\n{results['diff']['markdown']}"
            if results.get("diff")
            else ""
        )
    )


def _replay_source(r: dict) -> str:
    return (
        "the DIGITAL TWIN (simulated, not a measurement of a real engine)"
        if r["source"] == "digital-twin"
        else str(r["endpoint"])
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="flows.replan", description="Run the llmcap planning loop.")
    ap.add_argument("--force", action="store_true", help="re-run every stage")
    args = ap.parse_args(argv)
    began = time.perf_counter()
    result = replan(force=args.force)
    total_s = time.perf_counter() - began
    print()
    print(f"stages run: {', '.join(result['ran']) or 'none (all up to date)'}")
    for name, rel in OUTPUTS.items():
        print(f"  {name:<18} {ROOT / rel}")
    print(f"  plots              {ROOT / 'data/reports/workload'}/*.png")
    e = result["candidates"]
    print(
        f"  candidates: {e['model']}, {e['rows']:,} rows, {e['feasible']:,} feasible; by reason {e['infeasible_by_reason']}"
    )
    from llmcap.credentials import redact_text

    uri = redact_text(os.environ["MLFLOW_TRACKING_URI"])
    print(f"  MLflow run         {result['run_id']} (experiment '{tracking.EXPERIMENT}', {uri})")
    browse = uri if uri.startswith(("http://", "https://")) else f"mlflow ui --backend-store-uri {uri} --workers 1"
    print(f"                     browse: {browse}")
    k = result["capacity"]
    print(
        f"plan: {k['chosen']} ({k['mode']}{', P:D ' + k['pd_ratio'] if k['pd_ratio'] else ''}): {k['gpus']} GPUs, "
        f"${k['usd_per_hour']:,.0f}/h for {k['target_rps']:.3g} req/s (step times: {k['step_model_source']})"
    )
    print(f"report: {ROOT / OUTPUTS['capacity report']}")
    a = result["autoscale"]
    if a.get("enabled"):
        floor, saved = a["floor_that_keeps_attainment"], a["gpu_hours_saved"]
        verdict = (
            "no autoscaled plan keeps attainment"
            if floor is None
            else f"floor × {floor:g} keeps attainment, GPU-hours {-saved:+.1%} vs static"
        )
        print(f"autoscaling what-if (SIMULATED day): {verdict} → {ROOT / OUTPUTS['autoscale report']}")
    d = result.get("diff")
    if d is not None:
        changed = (
            ", ".join(
                f"{c['field']} {c['a']} → {c['b']}"
                for c in d["changed"]
                if c["field"] in ("gpus", "usd_per_hour", "chosen")
            )
            or "same GPUs, configuration and cost"
        )
        print(
            f"against the decision recorded at HEAD: {changed} (`llmcap diff HEAD .`; because: {'; '.join(d['explanation'][:3])})"
        )
    print(times_table(result["stage_times"], total_s))
    r = result["replay"]
    confirmed = "confirmed" if r["verdict"]["measured"]["knee_in_band"] else "UNCONFIRMED"
    print(
        f"replay check against {_replay_source(r)}: {r['verdict']['measured']['text']} → {ROOT / OUTPUTS['replay report']}"
    )
    stored = result["stored"]
    print(
        f"stored: DVC remote '{stored['name']}' ({stored['url']}), {stored['pushed']} new file(s) pushed; "
        "commit dvc.lock to record this decision (`llmcap history`, `llmcap reproduce REV`, `dvc pull` at REV)"
    )
    from llmcap.config import load_params  # validated: a misspelt `replay.require` is an error, not "none"

    require = load_params(ROOT / "params.yaml").replay.require
    missing = {"valid": not r["valid"], "confirmed": confirmed != "confirmed" or not r["valid"]}.get(require, False)
    print(
        f"decision: {confirmed} by the replay check (replay.require: {require})"
        + ("" if not missing else " — not met: exit 1")
    )
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
