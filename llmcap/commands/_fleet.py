"""`llmcap size --model LABEL=MODEL ...`: a trace of several models sized as a pool per model, the fleet's total,
and the single-model view beside it (`llmcap.sizing.fleet`)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import typer

from llmcap.catalog import ModelSpec
from llmcap.commands._common import dumps, err_console, print_csv, print_json
from llmcap.errors import LlmcapError
from llmcap.lora import slot_cost
from llmcap.memory import MemoryParams
from llmcap.planning import CapacityDecision, StepTimes
from llmcap.report.capacity import write_report
from llmcap.sizing.fleet import ClassPlan, Fleet, class_traffic, split_by_model
from llmcap.sizing.nearmiss import NoFeasiblePlan
from llmcap.sizing.params import SizeParams
from llmcap.sizing.units import candidate_key


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


def with_cap_split(params: SizeParams, split_isl: int | None, split_cap: float | None) -> SizeParams:
    """`--pools-split-cap`: the requests whose max_tokens is far above the typical output compared as their own pool
    (`size.pools_split_cap`); one split at a time, so it replaces a params file's ISL split unless --pools-split-isl
    was given too (an error)."""
    if split_cap is None:
        return params
    if split_isl is not None:
        raise LlmcapError("--pools-split-isl and --pools-split-cap each split the requests in two: give one")
    return params.model_copy(update={"pools_split_isl": None, "pools_split_cap": split_cap})


def model_classes(models: list[str]) -> dict[str | None, str]:
    """`--model` values: one model for the whole trace ({None: name}), or LABEL=MODEL for each model label."""
    if len(models) == 1 and "=" not in models[0]:
        return {None: models[0]}
    out: dict[str | None, str] = {}
    for given in models:
        label, sep, name = given.partition("=")
        if not sep or not label or not name:
            raise LlmcapError(
                f"--model {given!r}: with several models give LABEL=MODEL for each (LABEL: a value of the trace's `model` column)"
            )
        if label in out:
            raise LlmcapError(f"--model: the label {label!r} is given twice")
        out[label] = name
    return out


def adapter_cost(spec: ModelSpec, adapters: dict[str, int], one: PlannedModel, lora: tuple[int, int]) -> str:
    """What a class's adapters cost its pools: each chosen configuration's LoRA slots (memory per rank, KV displaced) and
    the limit of max_loras adapters per batch (`llmcap.lora`, the simulator's admission); "" without adapters."""
    if not adapters:
        return ""
    slots, rank = lora
    served = f"{len(adapters)} adapters ({', '.join(f'{a} {n:,}' for a, n in adapters.items())} requests) inside {spec.name}'s pool"
    if slots == 0:
        return f"{served}: their cost is not planned (no --max-loras: no LoRA slot reserved, no per-batch limit)"
    rows = {candidate_key(r): r for r in one.candidates[one.candidates["feasible"]].to_dict("records")}
    costs = []
    for pool, plan in one.outcome.summary["pool_plans"].items():
        row = rows.get(str(plan["configuration"]))
        if row is not None:
            held, tokens = slot_cost(
                spec, int(row["tp"]), int(row["pp"]), slots, rank, float(row["kv_bytes_per_token_per_rank"])
            )
            costs.append(f"{pool}: {held / 1e6:,.1f} MB per rank ({tokens:,} KV tokens fewer)")
    wait = "; fewer slots than adapters: a request of another adapter waits for a slot" if slots < len(adapters) else ""
    return (
        f"{served}: {slots} LoRA slots of rank {rank} on every rank — {'; '.join(costs)}; at most {slots} adapters per batch "
        f"(max_loras){wait}"
    )


def _class_plan(
    label: str,
    spec: ModelSpec,
    table: pa.Table,
    plan_one: PlanOne,
    params: SizeParams,
    out: Path | None,
    lora: tuple[int, int],
) -> ClassPlan:
    traffic = class_traffic(table)
    if not traffic["adapters"]:
        lora = (0, lora[1])  # a model no adapter runs on reserves no slots
    try:
        one = plan_one(spec, table, params=params, memory=MemoryParams(lora_slots=lora[0], lora_rank=lora[1]))
    except NoFeasiblePlan as none:
        return ClassPlan(
            label, spec.name, table.num_rows, None, None, None, None, f"no plan: {none.headline}", **traffic
        )
    if out is not None:
        write_report(one.outcome.report, out)
        (out / "summary.json").write_text(dumps(dict(one.outcome.summary), indent=2) + "\n", encoding="utf-8")
    return ClassPlan.of(
        label,
        spec.name,
        table.num_rows,
        one.outcome.summary,
        adapter_cost=adapter_cost(spec, traffic["adapters"], one, lora),
        **traffic,
    )


CLASS_LABELS = ("tenant", "feature")  # what --class-by may split one model's traffic by


def by_label(
    table: pa.Table, specs: dict[str | None, ModelSpec], label: str
) -> tuple[pa.Table, dict[str | None, ModelSpec]]:
    """`--class-by LABEL`: one model's traffic as a class per value of the label (requests without one: "(none)"), most
    requested first."""
    if label not in CLASS_LABELS:
        raise LlmcapError(
            f"--class-by {label!r}: one of {', '.join(CLASS_LABELS)} (several models: --model LABEL=MODEL)"
        )
    if list(specs) != [None]:
        raise LlmcapError(
            "--class-by splits one model's traffic: give one --model (several models are classes already)"
        )
    column = table.column(label)
    if column.null_count == table.num_rows:
        raise LlmcapError(f"--class-by {label}: no request of the trace carries a {label} label")
    filled = table.set_column(table.schema.get_field_index(label), label, pc.fill_null(column, "(none)"))
    counts = sorted(pc.value_counts(filled.column(label)).to_pylist(), key=lambda vc: (-vc["counts"], vc["values"]))
    return filled, {vc["values"]: specs[None] for vc in counts}


def size_fleet(
    trace: Path,
    table: pa.Table,
    specs: dict[str | None, ModelSpec],
    plan_one: PlanOne,
    params: SizeParams,
    output: str,
    out: Path | None,
    lora: tuple[int, int] = (0, 16),
    by: str = "model",
) -> None:
    """Each class's requests (a model label's, or one model's tenant / feature with `by`) sized on their own, the whole
    trace as the most requested class's model (the single-model view), the fleet printed; exit 1 unless every class has
    a passing plan."""
    if by != "model" or None in specs:
        table, specs = by_label(table, specs, by)
    labels = [label for label in specs if label is not None]
    parts = split_by_model(table, labels, by)
    say = (
        (lambda text: err_console.print(text, highlight=False, markup=False))
        if output == "table"
        else (lambda text: None)
    )  # noqa: E731

    def class_params(rows: int) -> SizeParams:  # a stated total rate is shared as the trace shares its requests
        if params.target_rps is None:
            return params
        return params.model_copy(update={"target_rps": params.target_rps * rows / table.num_rows})

    classes = []
    for label in labels:
        say(f"sizing {label} ({specs[label].name}): {parts[label].num_rows:,} of {table.num_rows:,} requests")
        classes.append(
            _class_plan(
                label,
                specs[label],
                parts[label],
                plan_one,
                class_params(parts[label].num_rows),
                None if out is None else out / label,
                lora,
            )
        )
    dominant = max(labels, key=lambda label: (parts[label].num_rows, label))
    say(f"sizing the single-model view: all {table.num_rows:,} requests as {specs[dominant].name}")
    single = _class_plan("(one total)", specs[dominant], table, plan_one, params, None, lora)
    fleet = Fleet(tuple(classes), single, by)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "fleet.json").write_text(dumps(fleet.to_dict(), indent=2) + "\n", encoding="utf-8")
    if output == "json":
        print_json(fleet.to_dict())
    elif output == "csv":
        print_csv([vars(c) for c in (*classes, single)])
    else:
        print(f"{trace.name}: a pool per {by if by == 'model' else by + ' class'}")
        for c in classes:
            print(f"  {c.line()}")
            for line in c.details():
                print(f"    {line}")
        for line in fleet.lines():
            print(f"  {line}")
        if out is not None:
            print(f"  wrote {out / 'fleet.json'} and a report per model under {out}/<label>/", file=sys.stderr)
    if not fleet.passes:
        print("error: not every model has a plan that passes its scenarios", file=sys.stderr)
        raise typer.Exit(1)
