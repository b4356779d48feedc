"""Stage `enumerate` (step 2): model + GPU catalog + workload summary → candidates table + summary.

    python -m stages.enumerate --catalog-dir data/catalog --workload data/processed/workload.json
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

from stages.env import ROOT, apply_defaults


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="stages.enumerate", description=__doc__)
    ap.add_argument("--params", type=Path, default=Path("params.yaml"))
    ap.add_argument("--catalog-dir", type=Path, required=True, help="holds gpus.yaml and models/")
    ap.add_argument("--workload", type=Path, required=True, help="the characterise stage's summary JSON")
    ap.add_argument("--candidates", type=Path, required=True)
    ap.add_argument("--report-dir", type=Path, required=True)
    args = ap.parse_args(argv)
    apply_defaults()

    import pyarrow as pa

    from llmcap.candidates import enumerate_candidates, workload_context_lengths
    from llmcap.catalog import load_gpu_catalog, load_model
    from llmcap.config import load_params
    from llmcap.errors import InputFileError, LlmcapError
    from llmcap.trace import write_table
    from stages import tracking, validation

    try:
        params = load_params(args.params).enumerate
        try:
            workload = json.loads(args.workload.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise InputFileError(args.workload, f"not a readable workload summary ({exc})") from None
        model = load_model(params.model, models_dir=args.catalog_dir / "models")
        contexts = workload_context_lengths(workload)
        result = enumerate_candidates(
            model, params.grid(workload), contexts, gpu_catalog=load_gpu_catalog(args.catalog_dir / "gpus.yaml")
        )
        table, summary = result.table, result.summary

        arrow = pa.Table.from_pandas(table, preserve_index=False)
        arrow = arrow.replace_schema_metadata({**arrow.schema.metadata, b"llmcap.model": model.name.encode()})
        write_table(arrow, args.candidates)
        args.report_dir.mkdir(parents=True, exist_ok=True)
        summary_path = args.report_dir / "summary.json"
        summary_path.write_text(json.dumps(summary, indent=2, allow_nan=False) + "\n", encoding="utf-8")
        check = validation.validate(table, "candidates", validation.candidates_suite)
        validation_path = check.write(args.report_dir / "validation.json")

        inputs = {"workload": args.workload, "model_config": Path(model.source), "gpu_catalog": args.catalog_dir / "gpus.yaml"}
        with tracking.stage_run(ROOT, "enumerate", {"enumerate": params.model_dump(mode="json")}, inputs) as mlflow:
            metrics = {"candidates": summary["rows"], "feasible": summary["feasible"], "infeasible": summary["infeasible"]}
            metrics |= {f"infeasible.{code}": n for code, n in summary["infeasible_by_reason"].items()}
            metrics |= {f"most_kv_tokens.{role}": b["kv_tokens_per_instance"] for role, b in summary["most_kv_per_role"].items()}
            metrics |= {f"context_len.{k}": v for k, v in summary["context_lengths"].items()}
            mlflow.log_metrics({k.replace("/", "."): float(v) for k, v in metrics.items()})
            mlflow.set_tags({"model": model.name, "validation.success": str(check.success).lower()})
            for path in (summary_path, validation_path, args.candidates):
                mlflow.log_artifact(str(path), artifact_path="enumerate")
        validation.require(check)
    except LlmcapError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(
        f"[enumerate] {model.name}: {summary['rows']:,} candidates, {summary['feasible']:,} feasible "
        f"(max context {summary['max_context_len']:,} tokens) → {args.candidates}, {summary_path}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
