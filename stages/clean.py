"""Stage `clean` (step 1a): raw trace → canonical trace + quarantine, validated and logged.

python -m stages.clean --raw-dir data/raw --trace OUT --quarantine OUT --report-dir DIR
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys

from stages._runner import path, stage_main
from stages.env import ROOT

ARGUMENTS = [
    ("--raw-dir", path()),
    ("--trace", path()),
    ("--quarantine", path()),
    ("--report-dir", path()),
]


def run(args: argparse.Namespace) -> str:
    from llmcap.config import load_params
    from llmcap.errors import LlmcapError
    from llmcap.trace import REASONS, ingest, write_table
    from stages import tracking, validation

    params = load_params(args.params)
    source = args.raw_dir / params.trace.file
    result = ingest(source, params.trace, params.clean)
    write_table(result.trace, args.trace)
    write_table(result.quarantine, args.quarantine)
    args.report_dir.mkdir(parents=True, exist_ok=True)
    report_path = args.report_dir / "clean_report.json"
    # the raw file's hash: the watcher re-plans when the trace under that name changes (ops.watch.trace_changes)
    report = result.report.as_dict() | {"source_sha256": hashlib.sha256(source.read_bytes()).hexdigest()}
    report_path.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    result.require_rows()

    max_ctx = params.clean.max_context_tokens
    frame = result.trace.drop_columns(["hash_ids"]).to_pandas()
    trace_check = validation.validate(
        frame, "canonical_trace", lambda gxe: validation.canonical_trace_suite(gxe, max_ctx)
    )
    quarantine_check = validation.validate(
        result.quarantine.drop_columns(["raw"]).to_pandas(),
        "quarantine",
        lambda gxe: validation.quarantine_suite(gxe, REASONS),
    )
    trace_check.write(args.report_dir / "validation_trace.json")
    quarantine_check.write(args.report_dir / "validation_quarantine.json")

    stage_params = {"trace": params.trace.model_dump(), "clean": params.clean.model_dump()}
    with tracking.stage_run(ROOT, "clean", stage_params, {"trace": source}) as mlflow:
        r = result.report
        mlflow.log_metrics({"rows_in": r.rows_in, "rows_kept": r.rows_kept, "rows_quarantined": r.rows_quarantined})
        mlflow.log_metrics({f"quarantined.{k}": v for k, v in r.by_reason.items()})
        mlflow.set_tags(
            {
                "trace.format": r.source_format,
                "trace.start": r.start,
                "validation.success": str(trace_check.success and quarantine_check.success).lower(),
            }
        )
        for artifact in (
            report_path,
            args.report_dir / "validation_trace.json",
            args.report_dir / "validation_quarantine.json",
        ):
            mlflow.log_artifact(str(artifact), artifact_path="clean")
    validation.require(trace_check)
    validation.require(quarantine_check)
    if not r.accounting_ok:
        raise LlmcapError(
            f"row accounting broken: {r.rows_in} in != {r.rows_kept} kept + {r.rows_quarantined} quarantined"
        )
    return (
        f"{r.source_file}: {r.rows_in:,} rows in = {r.rows_kept:,} kept + {r.rows_quarantined:,} quarantined "
        f"({', '.join(f'{k}={v}' for k, v in r.by_reason.items()) or 'none'})"
    )


def main(argv: list[str] | None = None) -> int:
    return stage_main("clean", __doc__, ARGUMENTS, run, argv)


if __name__ == "__main__":
    sys.exit(main())
