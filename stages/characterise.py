"""Stage `characterise` (step 1b): canonical trace → workload summary JSON, Markdown and plots.

python -m stages.characterise --trace IN --summary OUT.json --report-dir DIR
"""

from __future__ import annotations

import argparse
import json
import sys

from stages._runner import path, stage_main
from stages.env import ROOT

ARGUMENTS = [
    ("--trace", path()),
    ("--summary", path()),
    ("--report-dir", path()),
]


def run(args: argparse.Namespace) -> str:
    from llmcap.config import load_params
    from llmcap.report.workload import render_markdown
    from llmcap.trace import characterise, load_trace
    from llmcap.trace.plots import plot_workload
    from stages import tracking

    params = load_params(args.params).characterise
    table = load_trace(args.trace)
    summary = characterise(table, params)
    args.summary.parent.mkdir(parents=True, exist_ok=True)
    args.summary.write_text(json.dumps(summary, indent=2, allow_nan=False) + "\n", encoding="utf-8")
    plots = plot_workload(table, params.rps_windows_s, params.lru_cache_blocks, args.report_dir)
    markdown = args.report_dir / "workload.md"
    markdown.write_text(render_markdown(summary, [p.name for p in plots]), encoding="utf-8")

    with tracking.stage_run(
        ROOT, "characterise", {"characterise": params.model_dump()}, {"trace": args.trace}
    ) as mlflow:
        metrics = tracking.flatten("", {k: v for k, v in summary.items() if k not in ("joint", "mix")})
        mlflow.log_metrics(metrics)
        mlflow.log_artifact(str(args.summary), artifact_path="workload")
        mlflow.log_artifact(str(markdown), artifact_path="workload")
        for plot in plots:
            mlflow.log_artifact(str(plot), artifact_path="workload/plots")
    return f"{summary['rows']:,} requests, {summary['mean_rps']:.3f} req/s mean → {args.summary}, {markdown}"


def main(argv: list[str] | None = None) -> int:
    return stage_main("characterise", __doc__, ARGUMENTS, run, argv)


if __name__ == "__main__":
    sys.exit(main())
