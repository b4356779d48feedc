"""Stage `size` (step 4): trace + candidates + SLOs → capacity table, report and the chosen deployment.

    python -m stages.size --trace data/interim/trace.parquet --candidates data/processed/candidates.parquet
        --step-model data/processed/step_model.json --capacity OUT.parquet --report-dir DIR

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
]


def capacity_suite(gxe) -> list:
    """The capacity table: one row per (candidate, mode); rates, attainment and counts in range."""
    from great_expectations.expectations.row_conditions import Column

    sized = {"row_condition": Column("gpus").is_not_null()}
    return [
        gxe.ExpectTableRowCountToBeBetween(min_value=1),
        gxe.ExpectCompoundColumnsToBeUnique(column_list=["workload_id", "candidate", "mode"]),
        gxe.ExpectColumnValuesToBeInSet(column="mode", value_set=["aggregated", "prefill", "decode", "disaggregated"]),
        gxe.ExpectColumnValuesToBeInSet(column="search_status", value_set=["converged", "at_max_rate", "infeasible", "max_evaluations"]),
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
    from llmcap.errors import InputFileError, LlmcapError
    from llmcap.report.capacity import write_parquet, write_report
    from llmcap.sizing.executor import make_executor
    from llmcap.sizing.plan import class_pools, size_deployments
    from llmcap.trace import load_trace
    from stages import tracking, validation

    params = load_params(args.params)
    size = params.size
    trace = load_trace(args.trace)
    candidates = pq.read_table(args.candidates).to_pandas()
    try:
        step_info = json.loads(args.step_model.read_text(encoding="utf-8"))
        step_source = step_info["source"]
    except (OSError, KeyError, json.JSONDecodeError) as exc:
        raise InputFileError(args.step_model, f"not a readable step_model.json ({exc})") from None
    model = load_model(params.enumerate.model)
    measured = {}
    if step_source.startswith("profile") and step_info.get("step_model"):  # a measured, matching profile
        from llmcap.perf import CalibratedFit

        fp = step_info["fingerprint"]
        key = (fp["device_sku"], fp["tp"], fp["pp"], fp["ep"], fp["quantization"], fp["kv_dtype"])
        measured[key] = CalibratedFit.from_dict(step_info["step_model"]).model
    say = lambda m: print(f"[size] {m}", file=sys.stderr)  # noqa: E731
    with make_executor(size.compute) as executor:
        out = size_deployments(trace, candidates, model, size, executor, workload_id=params.trace.file, progress=say, measured=measured)
        pools, pools_failed = None, None
        if size.pools_split_isl is not None:
            say(f"request-class pools: sizing prompts ≤ {size.pools_split_isl:,} and longer ones separately")
            try:
                pools = class_pools(trace, candidates, model, size, out, size.pools_split_isl, executor, measured)
            except LlmcapError as exc:  # a class no candidate can serve alone: the shared pool wins by default
                pools_failed = f"request-class pools at ISL {size.pools_split_isl:,}: split not possible — {exc}"
    write_parquet(out.table, args.capacity)
    uses = "roofline per candidate" + "".join(f", the calibrated profile for {'/'.join(map(str, k))}" for k in measured)
    notes = (f"step times: {uses} (profile stage source: {step_source})",)
    if pools_failed is not None:
        notes += (pools_failed,)
        out.summary["pools"] = {"cheaper": "shared", "reason": pools_failed}
    if pools is not None:
        notes += (f"request-class pools: {pools.summary()}",)
        out.summary["pools"] = {
            "cheaper": pools.cheaper, "saving_usd_per_hour": pools.saving_usd_per_hour,
            "shared": [{"name": p.name, "rate_rps": p.rate_rps, "gpus": p.gpus, "usd_per_hour": p.usd_per_hour} for p in pools.shared],
            "split": [{"name": p.name, "rate_rps": p.rate_rps, "gpus": p.gpus, "usd_per_hour": p.usd_per_hour} for p in pools.split],
        }  # fmt: skip
    report = dataclasses.replace(out.report, notes=notes + out.report.notes)
    paths = write_report(report, args.report_dir)
    summary_path = args.report_dir / "summary.json"
    summary_path.write_text(json.dumps(out.summary | {"step_model_source": step_source}, indent=2, allow_nan=False) + "\n", encoding="utf-8")
    check = validation.validate(out.table.to_pandas(), "capacity", capacity_suite)
    validation_path = check.write(args.report_dir / "validation.json")

    s = out.summary
    inputs = {"trace": args.trace, "candidates": args.candidates, "step_model": args.step_model}
    with tracking.stage_run(ROOT, "size", {"size": size.model_dump(mode="json")}, inputs) as mlflow:
        mlflow.log_metrics({"target_rps": s["target_rps"], "gpus": s["gpus"], "instances": s["instances"], "base_instances": s["base_instances"],
                            "usd_per_hour": s["usd_per_hour"], "max_rps_per_unit": s["max_rps_per_unit"],
                            "candidates_simulated": s["candidates_simulated"]})  # fmt: skip
        mlflow.log_metrics({f"headroom.{pool}.{risk}": h["instances"] for pool, q in s["pool_plans"].items() for risk, h in q["headroom"].items()})
        mlflow.log_metrics({f"instances.{pool}": q["instances"] for pool, q in s["pool_plans"].items()})
        mlflow.set_tags({"chosen.candidate": s["chosen"], "chosen.mode": s["mode"], "chosen.pd_ratio": str(s["pd_ratio"]),
                         "chosen.gpus": str(s["gpus"]), "step_model.source": step_source, "validation.success": str(check.success).lower()})  # fmt: skip
        for artifact in (args.capacity, summary_path, validation_path, *paths.values()):
            mlflow.log_artifact(str(artifact), artifact_path="size")
    validation.require(check)
    pools = " + ".join(f"{name} {q['instances']} × {q['gpus_per_instance']} GPU (base {q['base_instances']})" for name, q in s["pool_plans"].items())
    return f"{s['chosen']} ({s['mode']}): {s['gpus']} GPUs = {pools} for {s['target_rps']:.3g} req/s, ${s['usd_per_hour']:,.0f}/h → {paths['html']}"


def main(argv: list[str] | None = None) -> int:
    return stage_main("size", __doc__, ARGUMENTS, run, argv)


if __name__ == "__main__":
    sys.exit(main())
