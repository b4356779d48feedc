"""Stage `replay` (step 5): the chosen plan's unit replayed open loop on its share of the trace (as the plan's
router sends one instance) at 0.8x / 1.0x / 1.2x of the load where the simulator predicts it stops holding the
SLOs, beside the simulator's prediction of the same requests.

    python -m stages.replay --trace data/interim/trace.parquet --candidates data/processed/candidates.parquet
        --capacity-summary data/reports/capacity/summary.json --step-model data/processed/step_model.json
        --measured OUT.parquet --predicted OUT.parquet --report-dir DIR

The unit (one instance, or one prefill + one decode instance) comes from the size stage's summary and
candidate rows (llmcap.replaycheck). With `replay.endpoint` unset the stage serves the unit's DIGITAL TWIN
(`llmcap twin serve`, time-dilated) and says so loudly: on stderr, in summary.json (`source`, `warning`),
in the report and as MLflow tags. Measured records are wall-clock timing: a re-run does not give the same
bytes (dvc.yaml marks them `meta: {measured: true}`; `llmcap reproduce` reports them as measured).
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
    ("--capacity-summary", path(help="the size stage's summary.json (the chosen plan)")),
    ("--step-model", path(help="the profile stage's step_model.json (which step-time source the plan used)")),
    ("--measured", path(help="output: measured request records (parquet)")),
    ("--predicted", path(help="output: predicted request records (parquet)")),
    ("--report-dir", path()),
]


def records_suite(requests: int, runs: list[str]):
    """Request records of the replay: every request sent is one row, once, with a known status."""

    def build(gxe) -> list:
        from great_expectations.expectations.row_conditions import Column

        ok = {"row_condition": Column("status") == "ok"}
        return [
            gxe.ExpectTableRowCountToEqual(value=requests),
            *[
                gxe.ExpectColumnValuesToNotBeNull(column=c)
                for c in ("run", "excerpt_seed", "request_id", "arrival_s", "status")
            ],
            gxe.ExpectCompoundColumnsToBeUnique(column_list=["run", "excerpt_seed", "request_id"]),
            gxe.ExpectColumnValuesToBeInSet(column="status", value_set=["ok", "unfinished", "rejected"]),
            gxe.ExpectColumnValuesToBeInSet(column="run", value_set=runs),
            gxe.ExpectColumnValuesToNotBeNull(column="ttft_s", **ok),
            gxe.ExpectColumnValuesToBeBetween(column="ttft_s", min_value=0, **ok),
            gxe.ExpectColumnPairValuesAToBeGreaterThanB(
                column_A="e2e_s", column_B="ttft_s", or_equal=True, ignore_row_if="either_value_is_missing"
            ),
        ]

    return build


def _loud(message: str) -> None:
    bar = "!" * 78
    print(f"{bar}\n[replay] {message}\n{bar}", file=sys.stderr)


def run(args: argparse.Namespace) -> str:
    import pyarrow.parquet as pq

    from llmcap.config import load_params
    from llmcap.credentials import api_key_from_env, redact_url
    from llmcap.errors import InputFileError
    from llmcap.live.served import first_served_model
    from llmcap.perf.corrections import describe
    from llmcap.replaycheck import check_unit, unit_from_plan
    from llmcap.replaycheck.runs import run_label
    from llmcap.report.replay_check import write_replay_report
    from llmcap.sizing.measured import with_corrections
    from llmcap.trace import load_trace, write_table
    from llmcap.trace.schema import block_size_of
    from stages import tracking, validation

    params = load_params(args.params)
    rp, slo = params.replay, params.size.slo

    def read_json(p, key: str) -> dict:
        try:
            data = json.loads(p.read_text(encoding="utf-8"))
            data[key]  # noqa: B018 - the field this stage needs
            return data
        except (OSError, KeyError, TypeError, json.JSONDecodeError) as exc:
            raise InputFileError(p, f"not a readable {key!r}-bearing JSON file ({exc})") from None

    plan = read_json(args.capacity_summary, "chosen")
    step_info = read_json(args.step_model, "source")
    step_source, applied = step_info["source"], step_info.get("corrections") or []
    trace = load_trace(args.trace)
    unit = unit_from_plan(
        plan,
        pq.read_table(args.candidates).to_pandas(),
        params.enumerate.model,
        params.size.pd_link_latency_s,
        params.size.slo.ttft_includes_handoff,
    )
    if applied:  # the prediction is the plan's: its written-back corrections included (the twin serves the roofline)
        unit = dataclasses.replace(unit, corrected=with_corrections({}, applied, params.enumerate.model))
    say = lambda m: print(f"[replay] {m}", file=sys.stderr)  # noqa: E731
    if rp.endpoint is None:
        slowed = f" slowed x{rp.twin_slowdown:g} (replay.twin_slowdown, a fault)" if rp.twin_slowdown != 1.0 else ""
        _loud(
            f"no replay.endpoint -> replaying against the DIGITAL TWIN of {unit.describe()}{slowed}: the figures are the "
            "simulator's served over HTTP, NOT a measurement of a real engine. Set replay.endpoint to measure one."
        )
    api_key = api_key_from_env(rp.api_key_env)
    model = None
    if rp.endpoint is not None:
        model = rp.served_model or first_served_model(rp.endpoint.rstrip("/"), redact_url(rp.endpoint), api_key)
    check = check_unit(unit, trace, rp, slo, model=model, block_tokens=block_size_of(trace), api_key=api_key, say=say)
    s = check.summary | {
        "step_model_source": step_source,
        "step_model_corrections": describe(applied),
        "endpoint": None if rp.endpoint is None else redact_url(rp.endpoint),
    }
    if step_source != "roofline-fallback":
        s["step_model_note"] = (
            f"the plan's step model source is {step_source}; the prediction here uses the roofline model "
            "the twin serves (llmcap twin serve)"
        )
    write_table(check.measured, args.measured)
    write_table(check.predicted, args.predicted)
    args.report_dir.mkdir(parents=True, exist_ok=True)
    summary_path = args.report_dir / "summary.json"
    summary_path.write_text(json.dumps(s, indent=2, allow_nan=False) + "\n", encoding="utf-8")
    paths = write_replay_report(s, args.report_dir)
    runs = [run_label(x) for x in rp.rate_scales]
    checks = [
        validation.validate(t.to_pandas(), f"replay_{name}", records_suite(s["requests_sent"], runs))
        for name, t in (("measured", check.measured), ("predicted", check.predicted))
    ]
    validation_path = args.report_dir / "validation.json"
    validation_path.write_text("[" + ",\n".join(c.to_json().rstrip() for c in checks) + "]\n", encoding="utf-8")

    v = s["verdict"]["measured"]
    inputs = {"trace": args.trace, "candidates": args.candidates, "capacity_summary": args.capacity_summary}
    with tracking.stage_run(ROOT, "replay", {"replay": rp.model_dump(mode="json")}, inputs) as mlflow:
        for r in s["runs"]:
            for side in ("measured", "predicted"):
                if r[side]["attainment"] is not None:
                    mlflow.log_metric(f"attainment.{side}.{r['run']}.seed{r['excerpt_seed']}", r[side]["attainment"])
        mlflow.log_metrics(
            {
                "rate_rps": s["rate_rps"],
                "load": s["load"],
                "requests_sent": s["requests_sent"],
                "verdict.knee_in_band": float(v["knee_in_band"]),
            }
        )
        mlflow.set_tags(
            {
                "replay.source": s["source"],
                "replay.figures": "DIGITAL TWIN, not a measurement"
                if s["source"] == "digital-twin"
                else "measured endpoint",
                "replay.valid": str(s["valid"]).lower(),
                "replay.verdict": v["text"],
                "replay.outcome": v["outcome"],
                "validation.success": str(all(c.success for c in checks)).lower(),
            }
        )
        for artifact in (args.measured, args.predicted, summary_path, validation_path, *paths.values()):
            mlflow.log_artifact(str(artifact), artifact_path="replay")
    for c in checks:
        validation.require(c)
    what = "DIGITAL TWIN (not a measurement)" if s["source"] == "digital-twin" else s["endpoint"]
    return f"{s['requests_sent']} requests against {what} at {s['rate_rps']:.4g} req/s x {rp.rate_scales}: {v['text']} → {paths['html']}"


def main(argv: list[str] | None = None) -> int:
    return stage_main("replay", __doc__, ARGUMENTS, run, argv)


if __name__ == "__main__":
    sys.exit(main())
