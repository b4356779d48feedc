"""Stage `reconcile` (step 8): the replay's measured and predicted request records → e_TTFT / e_ITL per
bucket with bootstrap intervals, a decision per bucket and the step-time corrections.

    python -m stages.reconcile --measured data/processed/replay/measured.parquet
        --predicted data/processed/replay/predicted.parquet --out data/processed/reconcile.json --report-dir DIR

The work is `llmcap.reconcile`; this stage validates the bucket table (Great Expectations), writes the
decisions and corrections, and logs them to MLflow.
"""

from __future__ import annotations

import argparse
import json
import sys

from stages._runner import path, stage_main
from stages.env import ROOT

ARGUMENTS = [
    ("--measured", path(help="the replay stage's measured request records")),
    ("--predicted", path(help="the replay stage's predicted request records (the simulator on the same requests)")),
    ("--out", path(help="output: decisions and corrections (JSON)")),
    ("--report-dir", path()),
]


def buckets_suite(gxe) -> list:
    """One row per bucket: a known decision, at least one request, errors of positive times (e > -1)."""
    from llmcap.reconcile.decide import DECISIONS

    return [
        gxe.ExpectTableRowCountToBeBetween(min_value=1),
        gxe.ExpectColumnValuesToBeUnique(column="bucket"),
        gxe.ExpectColumnValuesToBeInSet(column="decision", value_set=list(DECISIONS)),
        gxe.ExpectColumnValuesToBeBetween(column="requests", min_value=1),
        gxe.ExpectColumnValuesToBeBetween(column="e_ttft", min_value=-1, strict_min=True, mostly=1.0),
        gxe.ExpectColumnValuesToBeBetween(column="e_itl", min_value=-1, strict_min=True, mostly=1.0),
    ]


def run(args: argparse.Namespace) -> str:
    import pandas as pd

    from llmcap.config import load_params
    from llmcap.reconcile.report import markdown, summary
    from llmcap.reconcile.run import read_records, reconcile
    from stages import tracking, validation

    params = load_params(args.params).reconcile
    rec = reconcile(read_records(args.measured), read_records(args.predicted), params)
    out = summary(rec, None)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2, allow_nan=False) + "\n", encoding="utf-8")
    args.report_dir.mkdir(parents=True, exist_ok=True)
    report = args.report_dir / "reconcile.md"
    report.write_text(markdown(rec, None, params.percentiles), encoding="utf-8")
    q = rec.percentile

    def e(d, metric: str) -> float | None:
        est = d.bias.errors.get(metric, {}).get(q)
        return None if est is None else est.e

    frame = pd.DataFrame(
        [
            {
                "bucket": d.bias.label,
                "requests": d.bias.requests,
                "decision": d.decision,
                "e_ttft": e(d, "ttft"),
                "e_itl": e(d, "itl"),
            }
            for d in rec.decisions
        ]
    )
    check = validation.validate(frame, "reconcile_buckets", buckets_suite)
    validation_path = check.write(args.report_dir / "validation.json")

    counts = {k: sum(d.decision == k for d in rec.decisions) for k in {d.decision for d in rec.decisions}}
    inputs = {"measured": args.measured, "predicted": args.predicted}
    with tracking.stage_run(ROOT, "reconcile", {"reconcile": params.model_dump(mode="json")}, inputs) as mlflow:
        mlflow.log_metrics(
            {f"buckets.{k}": v for k, v in counts.items()} | {"requests.paired": rec.accounting.paired_ok}
        )
        mlflow.log_metrics({f"correction.{c.min_context}": c.factor for c in rec.corrections})
        mlflow.set_tags({"validation.success": str(check.success).lower(), "corrections": str(len(rec.corrections))})
        for artifact in (args.out, report, validation_path):
            mlflow.log_artifact(str(artifact), artifact_path="reconcile")
    validation.require(check)
    fixes = (
        ", ".join(
            f"x{c.factor:.3g}" + (f" past {c.min_context} tokens" if c.min_context else " global")
            for c in rec.corrections
        )
        or "none"
    )
    return f"{len(rec.decisions)} buckets ({', '.join(f'{v} {k}' for k, v in sorted(counts.items()))}); corrections: {fixes} → {report}"


def main(argv: list[str] | None = None) -> int:
    return stage_main("reconcile", __doc__, ARGUMENTS, run, argv)


if __name__ == "__main__":
    sys.exit(main())
