"""Stage `size` (step 4): trace + candidates + SLOs → capacity table, report and the chosen deployment.

    python -m stages.size --trace data/interim/trace.parquet --candidates data/processed/candidates.parquet
        --step-model data/processed/step_model.json --capacity OUT.parquet --report-dir DIR
        --metrics METRICS.json --plot-data CANDIDATES.csv

Searches each shortlisted candidate's max feasible rate by simulation (llmcap.sizing.plan), sizes the
deployments for the target rate with headroom by risk, validates the capacity table (Great
Expectations) and logs the table and report to MLflow with the chosen configuration as tags.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from stages._runner import path, stage_main
from stages.env import ROOT

ARGUMENTS = [
    ("--trace", path(help="the clean stage's canonical trace")),
    ("--candidates", path(help="the enumerate stage's candidates table")),
    ("--step-model", path(help="the profile stage's step_model.json (which step-time source applies)")),
    ("--capacity", path(help="output: the capacity table (parquet)")),
    ("--report-dir", path()),
    (
        "--metrics",
        path(help="output: the plan's numbers for `dvc metrics diff` (GPUs and instances per pool, cost, rates)"),
    ),
    ("--plot-data", path(help="output: per-candidate rates for `dvc plots diff` (CSV)")),
]


DECISION_METRICS = (
    "target_rps",
    "gpus",
    "instances",
    "base_instances",
    "usd_per_hour",
    "max_rps_per_unit",
    "candidates_simulated",
)


def capacity_suite(gxe) -> list:
    """The capacity table: one row per (candidate, mode); rates, attainment and counts in range."""
    from typing import get_args

    from great_expectations.expectations.row_conditions import Column

    from llmcap.sizing.search import Status

    sized = {"row_condition": Column("gpus").is_not_null()}
    return [
        gxe.ExpectTableRowCountToBeBetween(min_value=1),
        gxe.ExpectCompoundColumnsToBeUnique(column_list=["workload_id", "candidate", "mode"]),
        gxe.ExpectColumnValuesToBeInSet(column="mode", value_set=["aggregated", "prefill", "decode", "disaggregated"]),
        gxe.ExpectColumnValuesToBeInSet(column="search_status", value_set=list(get_args(Status))),
        gxe.ExpectColumnValuesToBeBetween(column="max_rps", min_value=0),
        gxe.ExpectColumnValuesToBeBetween(column="attainment", min_value=0, max_value=1),
        gxe.ExpectColumnValuesToBeBetween(column="gpus_per_unit", min_value=1),
        gxe.ExpectColumnValuesToBeBetween(column="gpus", min_value=1, **sized),
        gxe.ExpectColumnValuesToBeBetween(column="instances", min_value=1, **sized),
        gxe.ExpectColumnValuesToBeBetween(column="usd_per_hour", min_value=0, strict_min=True, **sized),
    ]


def run(args: argparse.Namespace) -> str:
    import pyarrow.parquet as pq

    from llmcap.catalog import load_model
    from llmcap.config import load_params
    from llmcap.planning import StepTimes, plan_capacity
    from llmcap.report.capacity import write_report
    from llmcap.report.plan_metrics import write_plan_metrics
    from llmcap.sizing.executor import make_executor
    from llmcap.sizing.table import write_parquet
    from llmcap.trace import load_trace
    from stages import tracking, validation

    params = load_params(args.params)
    size = params.sizing()  # with enumerate.engine: that engine's admission policy unless size names one
    trace = load_trace(args.trace)
    candidates = pq.read_table(args.candidates).to_pandas()
    step_times = StepTimes.read(args.step_model)
    model = load_model(params.enumerate.model)
    say = lambda m: print(f"[size] {m}", file=sys.stderr)  # noqa: E731
    with make_executor(size.compute) as executor:
        out = plan_capacity(
            trace,
            candidates,
            model,
            size,
            step_times,
            executor,
            workload_id=params.trace.file,
            progress=say,
            engine_presets=params.enumerate.presets(),
        )
    write_parquet(out.table, args.capacity)
    report = dataclasses.replace(out.report, provenance=_provenance(args, params))
    paths = write_report(report, args.report_dir)
    summary_path = args.report_dir / "summary.json"
    summary_path.write_text(json.dumps(out.summary, indent=2, allow_nan=False) + "\n", encoding="utf-8")
    write_plan_metrics(out.summary, out.table, args.metrics, args.plot_data)
    check = validation.validate(out.table.to_pandas(), "capacity", capacity_suite)
    validation_path = check.write(args.report_dir / "validation.json")

    s = out.summary
    inputs = {"trace": args.trace, "candidates": args.candidates, "step_model": args.step_model}
    with tracking.stage_run(ROOT, "size", {"size": size.model_dump(mode="json")}, inputs) as mlflow:
        mlflow.set_tag("mlflow.runName", f"size: {tracking.decision_name(s)}")
        mlflow.log_metrics({k: s[k] for k in DECISION_METRICS})
        mlflow.log_metrics(
            {
                f"headroom.{pool}.{risk}": h["instances"]
                for pool, q in s["pool_plans"].items()
                for risk, h in q["headroom"].items()
            }
        )
        mlflow.log_metrics({f"instances.{pool}": q["instances"] for pool, q in s["pool_plans"].items()})
        mlflow.set_tags(
            {
                "chosen.candidate": s["chosen"],
                "chosen.mode": s["mode"],
                "chosen.pd_ratio": str(s["pd_ratio"]),
                "verdict": s["verdict"],
                "chosen.gpus": str(s["gpus"]),
                "step_model.source": step_times.source,
                "validation.success": str(check.success).lower(),
            }
        )
        for artifact in (args.capacity, summary_path, validation_path, args.metrics, args.plot_data, *paths.values()):
            mlflow.log_artifact(str(artifact), artifact_path="size")
    validation.require(check)
    # the evidence is written and logged; no decision is recorded and nothing downstream runs on it
    if s["verdict"] == "fails":
        from llmcap.errors import LlmcapError

        raise LlmcapError(
            f"NO PLAN PASSES every scenario within its cost limit; the closest miss is in {paths['html']}: "
            + next((f["line"] for f in s["finalists"] or [] if f["candidate"] == s["chosen"]), s["chosen"])
        )
    pools = " + ".join(
        f"{name} {q['instances']} × {q['gpus_per_instance']} GPU (base {q['base_instances']})"
        for name, q in s["pool_plans"].items()
    )
    return f"{s['chosen']} ({s['mode']}): {s['gpus']} GPUs = {pools} for {s['target_rps']:.3g} req/s, ${s['usd_per_hour']:,.0f}/h → {paths['html']}"


def _provenance(args: argparse.Namespace, params):
    """The report header's inputs: model, trace and its hash, the sizing code's commit (what timed the steps
    and priced the GPUs is the report's own `sources`, decided in llmcap.planning for the CLI alike)."""
    from llmcap.report.capacity import Provenance
    from stages import provenance

    commit = provenance.code_commit(ROOT, "size")
    return Provenance(
        model=params.enumerate.model,
        trace=params.trace.file,
        trace_sha256=provenance.file_sha256(args.trace),
        commit=None if commit is None else commit[0],
        commit_date=None if commit is None else commit[1],
    )


def main(argv: list[str] | None = None) -> int:
    return stage_main("size", __doc__, ARGUMENTS, run, argv)


if __name__ == "__main__":
    sys.exit(main())
