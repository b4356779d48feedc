"""`llmcap size --model LABEL=MODEL ...`: a trace of several models sized as a pool per model, the fleet's total,
and the single-model view beside it (`llmcap.sizing.fleet`)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pyarrow as pa
import typer

from llmcap.catalog import ModelSpec
from llmcap.commands._common import dumps, err_console, print_csv, print_json
from llmcap.errors import LlmcapError
from llmcap.planning import CapacityDecision, StepTimes
from llmcap.report.capacity import write_report
from llmcap.sizing.fleet import ClassPlan, Fleet, split_by_model
from llmcap.sizing.nearmiss import NoFeasiblePlan
from llmcap.sizing.params import SizeParams


@dataclass(frozen=True)
class PlannedModel:
    """One model's sizing as `llmcap size` prints it."""

    outcome: CapacityDecision
    candidates: pd.DataFrame
    context: int  # max_model_len
    over: int  # requests longer than it
    gpu_memory_utilization: float
    step_times: StepTimes


PlanOne = Callable[..., PlannedModel]  # (spec, table, params=...) → the plan


def model_classes(models: list[str]) -> dict[str | None, str]:
    """`--model` values: one model for the whole trace ({None: name}), or LABEL=MODEL for each model label."""
    if len(models) == 1 and "=" not in models[0]:
        return {None: models[0]}
    out: dict[str | None, str] = {}
    for given in models:
        label, sep, name = given.partition("=")
        if not sep or not label or not name:
            raise LlmcapError(f"--model {given!r}: with several models give LABEL=MODEL for each (LABEL: a value of the trace's `model` column)")
        if label in out:
            raise LlmcapError(f"--model: the label {label!r} is given twice")
        out[label] = name
    return out


def _class_plan(label: str, spec: ModelSpec, table: pa.Table, plan_one: PlanOne, params: SizeParams, out: Path | None) -> ClassPlan:
    try:
        one = plan_one(spec, table, params=params)
    except NoFeasiblePlan as none:
        return ClassPlan(label, spec.name, table.num_rows, None, None, None, None, f"no plan: {none.headline}")
    if out is not None:
        write_report(one.outcome.report, out)
        (out / "summary.json").write_text(dumps(dict(one.outcome.summary), indent=2) + "\n", encoding="utf-8")
    return ClassPlan.of(label, spec.name, table.num_rows, one.outcome.summary)


def size_fleet(trace: Path, table: pa.Table, specs: dict[str | None, ModelSpec], plan_one: PlanOne, params: SizeParams, output: str,
               out: Path | None) -> None:  # fmt: skip
    """Each model label's requests sized on their own, the whole trace as the most requested model's (the single-model
    view), the fleet printed; exit 1 unless every class has a passing plan."""
    labels = [label for label in specs if label is not None]
    parts = split_by_model(table, labels)
    say = (lambda text: err_console.print(text, highlight=False, markup=False)) if output == "table" else (lambda text: None)  # noqa: E731

    def class_params(rows: int) -> SizeParams:  # a stated total rate is shared as the trace shares its requests
        if params.target_rps is None:
            return params
        return params.model_copy(update={"target_rps": params.target_rps * rows / table.num_rows})

    classes = []
    for label in labels:
        say(f"sizing {label} ({specs[label].name}): {parts[label].num_rows:,} of {table.num_rows:,} requests")
        classes.append(_class_plan(label, specs[label], parts[label], plan_one, class_params(parts[label].num_rows),
                                   None if out is None else out / label))  # fmt: skip
    dominant = max(labels, key=lambda label: (parts[label].num_rows, label))
    say(f"sizing the single-model view: all {table.num_rows:,} requests as {specs[dominant].name}")
    single = _class_plan("(one total)", specs[dominant], table, plan_one, params, None)
    fleet = Fleet(tuple(classes), single)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "fleet.json").write_text(dumps(fleet.to_dict(), indent=2) + "\n", encoding="utf-8")
    if output == "json":
        print_json(fleet.to_dict())
    elif output == "csv":
        print_csv([vars(c) for c in (*classes, single)])
    else:
        print(f"{trace.name}: a pool per model")
        for c in classes:
            print(f"  {c.line()}")
        for line in fleet.lines():
            print(f"  {line}")
        if out is not None:
            print(f"  wrote {out / 'fleet.json'} and a report per model under {out}/<label>/", file=sys.stderr)
    if not fleet.passes:
        print("error: not every model has a plan that passes its scenarios", file=sys.stderr)
        raise typer.Exit(1)
