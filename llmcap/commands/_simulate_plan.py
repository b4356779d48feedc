"""`llmcap simulate --plan`: a sized plan replayed as sized, its scenario or availability judged."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from llmcap.commands._common import (
    out_console,
    print_csv,
    print_json,
)
from llmcap.commands._trace_input import (
    account_json,
    check_outputs,
    read_trace_input,
)
from llmcap.deployment import (
    deployment_label,
)
from llmcap.errors import InputFileError, LlmcapError
from llmcap.exit_codes import SLO_MISSED
from llmcap.trace import write_table

if TYPE_CHECKING:
    from llmcap.sizing.planned import PlannedDeployment


def simulate_plan(
    path: Path, scenario: str | None, trace: Path, reading: tuple, seed: int | None, output: str, out: Path | None
) -> None:
    """The plan's deployment (or what `scenario` leaves of it) on the whole trace at its planning rate, judged by its SLO."""
    import json

    from llmcap.sizing.planned import PlannedDeployment

    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
        record = summary["deployment"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InputFileError(path, f"not a sized plan's summary.json ({type(exc).__name__}: {exc})") from None
    planned = PlannedDeployment.from_dict(record, str(path))
    if scenario == "availability":  # judged over time on several deployments: not one run's records
        _plan_availability(planned, summary, path, trace, reading, seed, output, out)
        return
    name = scenario or "traffic"
    counts = planned.scenario_counts(name) if scenario is not None else planned.counts
    if out is not None:
        check_outputs([trace], [out])
    cleaned = read_trace_input(trace, *reading, announce=output == "table")
    result = planned.replay(cleaned.trace, counts, seed)
    if out is not None:
        write_table(result.records, out)
    verdict = planned.judge(result, cleaned.trace)
    s = dict(result.summary) | {
        "plan": str(path),
        "chosen": summary.get("chosen"),
        "scenario": name,
        "counts": counts,
        "planning_rps": planned.planning_rps,
        "seed": planned.seed if seed is None else seed,
        "deployment": deployment_label(planned.config_at(counts)),
        "plan_check": {
            "attainment": verdict.attainment,
            "target": verdict.target,
            "run_miss": verdict.run_miss,
            "passes": verdict.passes,
        },
        "input_accounting": account_json(cleaned.report),
    }
    # the plan's availability target, judged with the plan itself (a scenario names one deployment only)
    check = planned.judge_availability(cleaned.trace, seed) if scenario is None and planned.availability else None
    if check is not None:
        s["availability_check"] = {
            "availability": check.share,
            "target": check.target,
            "states": check.detail,
            "passes": check.passes,
        }
    if output == "json":
        print_json(s)
    elif output == "csv":
        print_csv([s])
    else:
        out_console().print(
            f"plan {s['chosen']}, scenario {name!r} ({', '.join(f'{k} {v}' for k, v in counts.items())}) on "
            f"{s['requests']:,} requests at {planned.planning_rps:.4g} req/s: {verdict.line()}",
            highlight=False,
            soft_wrap=True,
        )
        if check is not None:
            out_console().print(
                f"plan {s['chosen']}, scenario 'availability': {check.line()}", highlight=False, soft_wrap=True
            )
    if not verdict.passes or (
        check is not None and not check.passes
    ):  # a check of the plan: a miss is the exit code every command gives it
        raise typer.Exit(SLO_MISSED)


def _plan_availability(
    planned: PlannedDeployment,
    summary: dict,
    path: Path,
    trace: Path,
    reading: tuple,
    seed: int | None,
    output: str,
    out: Path | None,
) -> None:
    """`--scenario availability`: the plan's availability target alone (each state's whole-trace run, weighted by its time)."""
    if out is not None:
        raise LlmcapError(
            "--scenario availability replays several deployments: --out (one run's records) does not apply"
        )
    cleaned = read_trace_input(trace, *reading, announce=output == "table")
    check = planned.judge_availability(cleaned.trace, seed)
    s = {
        "plan": str(path),
        "chosen": summary.get("chosen"),
        "scenario": "availability",
        "planning_rps": planned.planning_rps,
        "seed": planned.seed if seed is None else seed,
        "availability_check": {
            "availability": check.share,
            "target": check.target,
            "states": check.detail,
            "passes": check.passes,
        },
        "input_accounting": account_json(cleaned.report),
    }
    if output == "json":
        print_json(s)
    elif output == "csv":
        print_csv([s])
    else:
        out_console().print(
            f"plan {s['chosen']}, scenario 'availability' at {planned.planning_rps:.4g} req/s: {check.line()}",
            highlight=False,
            soft_wrap=True,
        )
    if not check.passes:
        raise typer.Exit(SLO_MISSED)
