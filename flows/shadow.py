"""Prefect flow `shadow`: mirror a share of a trace's traffic to a candidate that serves nobody, judge the
candidate against the simulator's prediction for that share, and check that production did not suffer.

    python -m flows.shadow --baseline URL --candidate URL --trace FILE --predictions FILE --share 0.25
        [--model NAME] [--request-rate R] [--max-requests N] [--ttft-target-ms 2000] [--tolerances JSON]
        [--impact-rel 0.1 --impact-abs-ms 10] [--max-in-flight 256] [--out DIR]

The trace is replayed open loop twice through an in-process `llmcap.gateway.Gateway` in front of the
baseline: without the mirror, then with it (`llmcap.rollout.shadow`). Writes to --out and to an MLflow
run (experiment `shadow`): shadow.md, summary.json, and the gateway's rows (production without/with, and
the shadow copies) as Parquet. Exit 0 when production is unharmed and the candidate is as predicted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from stages.env import apply_defaults

apply_defaults()

from prefect import flow, runtime  # noqa: E402
from prefect.artifacts import create_markdown_artifact  # noqa: E402

from llmcap.rollout.gates import Tolerances  # noqa: E402
from llmcap.rollout.predict import load_predictions  # noqa: E402
from llmcap.rollout.shadow import ImpactBound, run_shadow  # noqa: E402


@flow(name="shadow", log_prints=True)
def shadow(
    baseline: str,
    candidate: str,
    trace: str,
    predictions: str,
    share: float,
    model: str | None = None,
    request_rate: float | None = None,
    max_requests: int | None = None,
    ttft_target_ms: float = 2000.0,
    tolerances: dict | None = None,
    impact_rel: float = 0.10,
    impact_abs_ms: float = 10.0,
    max_in_flight: int = 256,
    out: str | None = None,
) -> dict:
    import mlflow
    import pyarrow.parquet as pq

    from llmcap.errors import LlmcapError
    from llmcap.trace import ingest
    from llmcap.trace.synth import scale_rate

    preds = load_predictions(Path(predictions))
    if share not in preds:
        raise LlmcapError(
            f"{predictions} has no prediction for share {share:g} (it has {sorted(preds)}): "
            f"`llmcap rollout predict --steps {share:g}`"
        )
    cleaned = ingest(
        Path(trace)
    )  # any format, the library's defaults (as `llmcap replay` reads it with no input options)
    cleaned.require_rows()
    for warning in cleaned.report.warnings:
        print(f"warning: {trace}: {warning}")
    table = cleaned.trace
    if max_requests:
        table = table.slice(0, max_requests)
    if request_rate:
        table = scale_rate(table, request_rate)
    served = model or _served_model(baseline)
    arrays = [table.column(c).to_numpy() for c in ("arrival_s", "isl", "osl")]
    print(
        f"shadow: {table.num_rows} requests, {share:.0%} mirrored to {candidate}; production on {baseline} (model {served})"
    )
    result = asyncio.run(
        run_shadow(
            baseline,
            candidate,
            served,
            *arrays,
            share,
            preds[share],
            Tolerances.model_validate(tolerances or {}),
            ttft_target_ms / 1000.0,
            ImpactBound(impact_rel, impact_abs_ms / 1000.0),
            max_in_flight,
        )
    )
    summary = {
        **result.summary(),
        "flow_run_id": str(runtime.flow_run.id),
        "trace": trace,
        "baseline": baseline,
        "candidate": candidate,
    }
    md = result.markdown()
    outdir = Path(out) if out else Path(".work") / "shadow" / str(runtime.flow_run.id)
    outdir.mkdir(parents=True, exist_ok=True)
    (outdir / "shadow.md").write_text(md, encoding="utf-8")
    (outdir / "summary.json").write_text(json.dumps(summary, indent=1, default=str) + "\n", encoding="utf-8")
    for name, rows in result.rows.items():
        pq.write_table(rows, outdir / f"{name}.parquet")
    mlflow.set_experiment("shadow")
    with mlflow.start_run(run_name=f"shadow {share:.0%}"):
        mlflow.log_params(
            {"share": share, "baseline": baseline, "candidate": candidate, "trace": trace, "requests": table.num_rows}
        )
        mlflow.log_metrics(
            {
                f"production_{phase}_{k}": v
                for phase, d in result.production.items()
                for k, v in d.items()
                if v is not None
            }
        )
        mlflow.set_tags(
            {
                "shadow.production_unharmed": str(result.production_unharmed),
                "shadow.as_predicted": str(result.as_predicted),
                "shadow.flow_run_id": str(runtime.flow_run.id),
            }
        )
        mlflow.log_artifacts(str(outdir), "shadow")
    create_markdown_artifact(key="shadow", markdown=md)
    print(
        f"production unharmed: {result.production_unharmed}; candidate as predicted (simulated prediction): {result.as_predicted} → {outdir}"
    )
    return summary


def _served_model(url: str) -> str:
    import httpx

    try:
        return httpx.get(f"{url.rstrip('/')}/v1/models", timeout=10).json()["data"][0]["id"]
    except (httpx.HTTPError, ValueError, KeyError, IndexError):
        from llmcap.errors import LlmcapError

        raise LlmcapError(f"{url}/v1/models names no model: give --model") from None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="flows.shadow", description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", required=True)
    ap.add_argument("--candidate", required=True)
    ap.add_argument("--trace", required=True)
    ap.add_argument("--predictions", required=True)
    ap.add_argument("--share", type=float, required=True)
    ap.add_argument("--model", default=None)
    ap.add_argument("--request-rate", type=float, default=None)
    ap.add_argument("--max-requests", type=int, default=None)
    ap.add_argument("--ttft-target-ms", type=float, default=2000.0)
    ap.add_argument("--tolerances", type=json.loads, default=None)
    ap.add_argument("--impact-rel", type=float, default=0.10)
    ap.add_argument("--impact-abs-ms", type=float, default=10.0)
    ap.add_argument("--max-in-flight", type=int, default=256)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    summary = shadow(
        a.baseline,
        a.candidate,
        str(Path(a.trace).resolve()),
        str(Path(a.predictions).resolve()),
        a.share,
        a.model,
        a.request_rate,
        a.max_requests,
        a.ttft_target_ms,
        a.tolerances,
        a.impact_rel,
        a.impact_abs_ms,
        a.max_in_flight,
        str(Path(a.out).resolve()) if a.out else None,
    )
    return 0 if summary["production_unharmed"] and summary["shadow_as_predicted"] else 1


if __name__ == "__main__":
    sys.exit(main())
