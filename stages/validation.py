"""Great Expectations (1.x) suites for stage outputs, and a deterministic record of the result.

A failed expectation fails the stage with a readable one-line-per-failure summary. The saved result
keeps only what is a function of the data (expectation, arguments, success, counts), not GX's run ids
and timestamps, so the same data validates to the same bytes.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from llmcap.errors import LlmcapError
from stages import timing


class ValidationFailed(LlmcapError):
    """Stage output broke its expectation suite."""


@dataclass(frozen=True)
class ValidationRecord:
    suite: str
    success: bool
    results: list[dict]

    def failures(self) -> list[dict]:
        return [r for r in self.results if not r["success"]]

    def summary(self) -> str:
        lines = [f"suite '{self.suite}': {len(self.failures())} of {len(self.results)} expectations failed"]
        for r in self.failures():
            args = ", ".join(f"{k}={v}" for k, v in r["kwargs"].items())
            if "exception" in r:
                lines.append(f"  ✗ {r['expectation']}({args}): raised {r['exception']}")
            else:
                lines.append(
                    f"  ✗ {r['expectation']}({args}): {r.get('unexpected_count', '?')} unexpected, e.g. {r.get('examples', [])}"
                )
        return "\n".join(lines)

    def to_json(self) -> str:
        return (
            json.dumps({"suite": self.suite, "success": self.success, "results": self.results}, indent=2, default=str)
            + "\n"
        )

    def write(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.to_json(), encoding="utf-8")
        return path


def _gx():
    # GX costs seconds to import: only stages that validate pay for it.
    logging.getLogger("great_expectations").setLevel(logging.ERROR)
    import great_expectations as gx
    import great_expectations.expectations as gxe
    from great_expectations.data_context.types.base import ProgressBarsConfig

    return gx, gxe, ProgressBarsConfig


def canonical_trace_suite(gxe, max_context: int) -> list:
    """Expectations every canonical trace must meet (the contract later steps rely on)."""
    not_null = [
        gxe.ExpectColumnValuesToNotBeNull(column=c) for c in ("request_id", "arrival_s", "isl", "osl", "source_row")
    ]
    return [
        gxe.ExpectTableRowCountToBeBetween(min_value=1),
        *not_null,
        gxe.ExpectColumnValuesToBeUnique(column="request_id"),
        gxe.ExpectColumnValuesToBeUnique(column="source_row"),
        gxe.ExpectColumnValuesToBeBetween(column="arrival_s", min_value=0),
        gxe.ExpectColumnValuesToBeIncreasing(column="arrival_s"),
        gxe.ExpectColumnValuesToBeBetween(column="isl", min_value=1, max_value=max_context),
        gxe.ExpectColumnValuesToBeBetween(column="osl", min_value=1, max_value=max_context),
        gxe.ExpectColumnPairValuesAToBeGreaterThanB(
            column_A="isl", column_B="prefix_hit_tokens", or_equal=True, ignore_row_if="either_value_is_missing"
        ),
    ]


def quarantine_suite(gxe, reasons: tuple[str, ...]) -> list:
    return [
        gxe.ExpectColumnValuesToNotBeNull(column="reason"),
        gxe.ExpectColumnValuesToBeInSet(column="reason", value_set=list(reasons)),
        gxe.ExpectColumnValuesToBeUnique(column="source_row"),
    ]


def candidates_suite(gxe) -> list:
    """The candidates table: every row feasible or not; infeasible rows say why, feasible rows hold KV."""
    from great_expectations.expectations.row_conditions import Column

    infeasible = {"row_condition": Column("feasible") == False}  # noqa: E712 (a GX condition, not a comparison)
    feasible = {"row_condition": Column("feasible") == True}  # noqa: E712
    keys = ("row", "mode", "role", "gpu", "weight_quant", "kv_dtype", "feasible", "reasons", "reason_codes")
    positive = ("tp", "pp", "ep", "dp", "gpus_per_instance", "max_num_seqs", "max_num_batched_tokens", "block_size")
    return [
        gxe.ExpectTableRowCountToBeBetween(min_value=1),
        gxe.ExpectColumnValuesToBeUnique(column="row"),
        *[gxe.ExpectColumnValuesToNotBeNull(column=c) for c in keys],
        gxe.ExpectColumnValuesToBeOfType(column="feasible", type_="bool"),
        gxe.ExpectColumnValuesToBeInSet(column="role", value_set=["both", "prefill", "decode"]),
        *[gxe.ExpectColumnValuesToBeBetween(column=c, min_value=1) for c in positive],
        gxe.ExpectColumnValueLengthsToBeBetween(column="reasons", min_value=1, **infeasible),
        gxe.ExpectColumnValuesToMatchRegex(column="reason_codes", regex=r"^[a-z_]+(?:,[a-z_]+)*$", **infeasible),
        gxe.ExpectColumnValuesToBeInSet(column="reasons", value_set=[""], **feasible),
        gxe.ExpectColumnValuesToNotBeNull(column="kv_tokens_per_rank", **feasible),
        gxe.ExpectColumnValuesToBeBetween(column="kv_tokens_per_rank", min_value=1, **feasible),
        gxe.ExpectColumnValuesToBeBetween(column="max_seqs_at_max_context", min_value=1, **feasible),
    ]


def _condition_text(cond: dict) -> str:
    """A GX row condition as it reads: `feasible == False`."""
    if cond.get("type") == "comparison":
        return f"{cond['column']['name']} {cond['operator']} {cond['parameter']!r}"
    return json.dumps(cond, sort_keys=True, default=str)


def validate(frame: pd.DataFrame, suite_name: str, build) -> ValidationRecord:
    """Run the expectations `build(gxe)` returns on `frame` in an ephemeral GX context (its time, the import
    included, is the stage's validation time: stages.timing)."""
    began = timing.now()
    try:
        return _validate(frame, suite_name, build)
    finally:
        timing.add_since("validation", began)


def _validate(frame: pd.DataFrame, suite_name: str, build) -> ValidationRecord:
    gx, gxe, progress = _gx()
    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = progress(globally=False)
    batch_def = (
        context.data_sources.add_pandas(suite_name)
        .add_dataframe_asset(suite_name)
        .add_batch_definition_whole_dataframe("all")
    )
    suite = gx.ExpectationSuite(name=suite_name)
    for expectation in build(gxe):
        suite.add_expectation(expectation)
    result = batch_def.get_batch(batch_parameters={"dataframe": frame}).validate(suite)
    records = []
    for r in result.results:
        kwargs = {k: v for k, v in r.expectation_config.kwargs.items() if k != "batch_id"}
        if isinstance(kwargs.get("row_condition"), dict):
            kwargs["row_condition"] = _condition_text(kwargs["row_condition"])
        entry = {"expectation": r.expectation_config.type, "kwargs": kwargs, "success": bool(r.success)}
        detail = r.result or {}
        if "unexpected_count" in detail:
            entry["unexpected_count"] = int(detail["unexpected_count"])
            entry["examples"] = [str(v) for v in (detail.get("partial_unexpected_list") or [])[:5]]
        if "observed_value" in detail:
            entry["observed_value"] = detail["observed_value"]
        if r.exception_info and r.exception_info.get("raised_exception"):
            entry["exception"] = r.exception_info.get("exception_message")
        records.append(entry)
    return ValidationRecord(suite=suite_name, success=bool(result.success), results=records)


def require(record: ValidationRecord) -> None:
    if not record.success:
        raise ValidationFailed(record.summary())
