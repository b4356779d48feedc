"""Stage `enumerate` (step 2): model + GPU catalog + workload summary → candidates table + summary.

    python -m stages.enumerate --catalog-dir llmcap/catalog/data --workload data/processed/workload.json
        --candidates OUT.parquet --report-dir DIR

Every candidate (GPU x weight quant x KV dtype x TP/PP/EP/DP x serving mode x scheduler knobs) is a
row, feasible or not with its reasons; the workload's ISL + OSL statistics size the
`max_seqs_<label>` columns and, with `max_context_len: workload`, the longest request to admit.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from stages._runner import path, stage_main
from stages.env import ROOT

ARGUMENTS = [
    ("--catalog-dir", path(help="holds gpus.yaml and models/")),
    ("--workload", path(help="the characterise stage's summary JSON")),
    ("--candidates", path()),
    ("--report-dir", path()),
]


def run(args: argparse.Namespace) -> str:
    import pyarrow as pa

    from llmcap.candidates import enumerate_with_presets, workload_context_lengths
    from llmcap.catalog import load_gpu_catalog, load_model
    from llmcap.config import load_params
    from llmcap.errors import InputFileError
    from llmcap.trace import write_table
    from stages import tracking, validation

    params = load_params(args.params, catalog_dir=args.catalog_dir).enumerate
    try:
        workload = json.loads(args.workload.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise InputFileError(args.workload, f"not a readable workload summary ({exc})") from None
    model = load_model(params.model, models_dir=args.catalog_dir / "models")
    contexts = workload_context_lengths(workload)
    catalog = load_gpu_catalog(args.catalog_dir / "gpus.yaml")
    # with enumerate.engine, each GPU's candidates take that engine's own scheduler knobs instead of the grids
    result = enumerate_with_presets(model, params.grid(workload), contexts, params.presets(catalog), catalog)
    table, summary = result.table, result.summary

    arrow = pa.Table.from_pandas(table, preserve_index=False)
    arrow = arrow.replace_schema_metadata({**arrow.schema.metadata, b"llmcap.model": model.name.encode()})
    write_table(arrow, args.candidates)
    args.report_dir.mkdir(parents=True, exist_ok=True)
    summary_path = args.report_dir / "summary.json"
    summary_path.write_text(json.dumps(summary, indent=2, allow_nan=False) + "\n", encoding="utf-8")
    check = validation.validate(table, "candidates", validation.candidates_suite)
    validation_path = check.write(args.report_dir / "validation.json")

    inputs = {
        "workload": args.workload,
        "model_config": Path(model.source),
        "gpu_catalog": args.catalog_dir / "gpus.yaml",
    }
    with tracking.stage_run(ROOT, "enumerate", {"enumerate": params.model_dump(mode="json")}, inputs) as mlflow:
        metrics = {"candidates": summary["rows"], "feasible": summary["feasible"], "infeasible": summary["infeasible"]}
        metrics |= {f"infeasible.{code}": n for code, n in summary["infeasible_by_reason"].items()}
        metrics |= {
            f"most_kv_tokens.{role}": b["kv_tokens_per_instance"] for role, b in summary["most_kv_per_role"].items()
        }
        metrics |= {f"context_len.{k}": v for k, v in summary["context_lengths"].items()}
        mlflow.log_metrics({k.replace("/", "."): float(v) for k, v in metrics.items()})
        mlflow.set_tags({"model": model.name, "validation.success": str(check.success).lower()})
        for artifact in (summary_path, validation_path, args.candidates):
            mlflow.log_artifact(str(artifact), artifact_path="enumerate")
    validation.require(check)
    return (
        f"{model.name}: {summary['rows']:,} candidates, {summary['feasible']:,} feasible "
        f"(max context {summary['max_context_len']:,} tokens) → {args.candidates}, {summary_path}"
    )


def main(argv: list[str] | None = None) -> int:
    return stage_main("enumerate", __doc__, ARGUMENTS, run, argv)


if __name__ == "__main__":
    sys.exit(main())
