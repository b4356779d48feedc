"""Stage `autoscale` (step 4, the control risk): the chosen plan on a synthesized diurnal day, static vs autoscaled.

    python -m stages.autoscale --trace data/interim/trace.parquet --candidates data/processed/candidates.parquet
        --step-model data/processed/step_model.json --capacity-summary data/reports/capacity/summary.json --report-dir DIR

The work is `llmcap.sizing.autoscale_plan`; this stage writes the report (Markdown, a plot, summary.json), checks
its table (Great Expectations) and logs it to MLflow. Every figure is simulated. `autoscale.enabled: false`
writes a report that says so.
"""

from __future__ import annotations

import argparse
import json
import sys

from stages._runner import path, stage_main
from stages.env import ROOT

ARGUMENTS = [
    ("--trace", path(help="the clean stage's canonical trace")),
    ("--candidates", path(help="the enumerate stage's candidates table")),
    ("--step-model", path(help="the profile stage's step_model.json")),
    ("--capacity-summary", path(help="the size stage's summary.json (the chosen deployment)")),
    ("--report-dir", path()),
]


def plans_suite(gxe) -> list:
    """One row per plan, the static one first; positive GPU-hours; attainments are shares."""
    return [
        gxe.ExpectTableRowCountToBeBetween(min_value=2),
        gxe.ExpectColumnValuesToBeUnique(column="plan"),
        gxe.ExpectColumnValuesToBeBetween(column="gpu_hours", min_value=0, strict_min=True),
        gxe.ExpectColumnValuesToBeBetween(column="attainment", min_value=0, max_value=1),
        gxe.ExpectColumnValuesToBeBetween(column="worst_window_attainment", min_value=0, max_value=1),
    ]


def run(args: argparse.Namespace) -> str:
    import pandas as pd
    import pyarrow.parquet as pq

    from llmcap.catalog import load_model
    from llmcap.config import load_params
    from llmcap.planning import StepTimes
    from llmcap.report.autoscale_whatif import markdown, plot_instances, summary
    from llmcap.sizing.autoscale_plan import plan_whatif
    from llmcap.trace import load_trace
    from stages import tracking, validation

    params = load_params(args.params)
    args.report_dir.mkdir(parents=True, exist_ok=True)
    report, out = args.report_dir / "autoscale.md", args.report_dir / "summary.json"
    if not params.autoscale.enabled:
        report.write_text(
            "# Autoscaling what-if\n\nNot run: `autoscale.enabled` is false in params.yaml.\n", encoding="utf-8"
        )
        out.write_text(json.dumps({"enabled": False}) + "\n", encoding="utf-8")
        return f"disabled (autoscale.enabled: false) → {report}"
    chosen = json.loads(args.capacity_summary.read_text(encoding="utf-8"))
    measured = StepTimes.read(args.step_model).measured
    say = lambda m: print(f"[autoscale] simulating the day: {m}", file=sys.stderr)  # noqa: E731
    w = plan_whatif(
        load_trace(args.trace),
        pq.read_table(args.candidates).to_pandas(),
        load_model(params.enumerate.model),
        params.size,
        chosen,
        params.autoscale,
        params.seed,
        measured,
        say,
    )
    plot = plot_instances(w, args.report_dir / "instances.png")
    report.write_text(markdown(w, plot.name), encoding="utf-8")
    s = {"enabled": True, "chosen": chosen["chosen"]} | summary(w)
    out.write_text(json.dumps(s, indent=2, allow_nan=False) + "\n", encoding="utf-8")
    check = validation.validate(pd.DataFrame(s["plans"]), "autoscale_plans", plans_suite)
    validation_path = check.write(args.report_dir / "validation.json")

    inputs = {"trace": args.trace, "candidates": args.candidates, "capacity_summary": args.capacity_summary}
    with tracking.stage_run(
        ROOT, "autoscale", {"autoscale": params.autoscale.model_dump(mode="json")}, inputs
    ) as mlflow:
        name = lambda p: "static" if p["floor_fraction"] is None else f"floor_{p['floor_fraction']:g}"  # noqa: E731
        mlflow.log_metrics(
            {f"gpu_hours.{name(p)}": p["gpu_hours"] for p in s["plans"]}
            | {f"attainment.{name(p)}": p["attainment"] for p in s["plans"]}
        )
        mlflow.set_tags(
            {
                "simulated": "true",
                "floor_that_keeps_attainment": str(s["floor_that_keeps_attainment"]),
                "validation.success": str(check.success).lower(),
            }
        )
        for artifact in (report, out, plot, validation_path):
            mlflow.log_artifact(str(artifact), artifact_path="autoscale")
    validation.require(check)
    best = w.floor
    verdict = (
        f"floor × {best.floor_fraction:g} keeps attainment with {best.gpu_hours:,.1f} GPU-h vs {w.static.gpu_hours:,.1f} static"
        if best is not None
        else "no autoscaled plan keeps attainment"
    )
    return f"simulated day (not a measurement): {verdict} → {report}"


def main(argv: list[str] | None = None) -> int:
    return stage_main("autoscale", __doc__, ARGUMENTS, run, argv)


if __name__ == "__main__":
    sys.exit(main())
