"""Stage `characterise` (step 1b): canonical trace → workload summary JSON, Markdown and plots.

    python -m stages.characterise --trace IN --summary OUT.json --report-dir DIR
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from stages.env import ROOT, apply_defaults


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="stages.characterise", description=__doc__)
    ap.add_argument("--params", type=Path, default=Path("params.yaml"))
    ap.add_argument("--trace", type=Path, required=True)
    ap.add_argument("--summary", type=Path, required=True)
    ap.add_argument("--report-dir", type=Path, required=True)
    args = ap.parse_args(argv)
    apply_defaults()

    from llmcap.config import load_params
    from llmcap.errors import LlmcapError
    from llmcap.report.workload import render_markdown
    from llmcap.trace import characterise, load_trace
    from llmcap.trace.plots import plot_workload
    from stages import tracking

    try:
        params = load_params(args.params).characterise
        table = load_trace(args.trace)
        summary = characterise(table, params)
        args.summary.parent.mkdir(parents=True, exist_ok=True)
        args.summary.write_text(json.dumps(summary, indent=2, allow_nan=False) + "\n", encoding="utf-8")
        plots = plot_workload(table, params.rps_windows_s, params.lru_cache_blocks, args.report_dir)
        markdown = args.report_dir / "workload.md"
        markdown.write_text(render_markdown(summary, [p.name for p in plots]), encoding="utf-8")

        with tracking.stage_run(ROOT, "characterise", {"characterise": params.model_dump()}, {"trace": args.trace}) as mlflow:
            metrics = tracking.flatten("", {k: v for k, v in summary.items() if k not in ("joint", "mix")})
            mlflow.log_metrics(metrics)
            mlflow.log_artifact(str(args.summary), artifact_path="workload")
            mlflow.log_artifact(str(markdown), artifact_path="workload")
            for plot in plots:
                mlflow.log_artifact(str(plot), artifact_path="workload/plots")
    except LlmcapError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"[characterise] {summary['rows']:,} requests, {summary['mean_rps']:.3f} req/s mean → {args.summary}, {markdown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
