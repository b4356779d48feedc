"""`llmcap pools`: the P/D starting count by hand, N_P = ⌈λ·H_P/G_P⌉ and N_D = ⌈λ·H_D/G_D⌉, with its arithmetic.

The formula is where sizing starts, not where it ends (the prefill queue, the handoff and the decode KV are
coupled): `llmcap size` takes G_P and G_D from simulation and settles the counts on the whole trace. With
`--plan summary.json` the formula runs on that plan's own rate and per-instance rates and is printed beside
the plan's simulated counts, with the H each pool's settled count amounts to.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from llmcap.commands._common import (
    JsonFlagOpt,
    OutputFormatOpt,
    out_console,
    output_format,
    print_csv,
    print_json,
    user_errors,
)
from llmcap.errors import InputFileError, LlmcapError
from llmcap.sizing.analytic import PoolCount, pd_initial_sizing


def _from_plan(path: Path) -> dict[str, Any]:
    """λ, and per pool G, GPUs per instance and the settled count, from a P/D plan's summary.json."""
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
        pools = summary["pool_plans"]
        plan: dict[str, Any] = {"rate": float(summary["planning_rps"])}
        for pool in ("prefill", "decode"):
            p = pools[pool]
            plan[pool] = {
                "rps": float(p["per_instance_rps"]),
                "gpus": int(p["gpus_per_instance"]),
                "instances": int(p["instances"]),
            }
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InputFileError(path, f"not a disaggregated plan's summary.json ({type(exc).__name__}: {exc})") from None
    return plan


RateOpt = Annotated[float | None, typer.Option("--rate", min=0, help="λ: the arrival rate to serve (req/s).")]
PrefillRpsOpt = Annotated[
    float | None, typer.Option(min=0, help="G_P: one prefill instance's capacity under the TTFT target (req/s).")
]
PrefillGpusOpt = Annotated[int | None, typer.Option(min=1, help="g_P: GPUs per prefill instance.")]
DecodeRpsOpt = Annotated[
    float | None, typer.Option(min=0, help="G_D: one decode instance's capacity under the ITL target (req/s).")
]
DecodeGpusOpt = Annotated[int | None, typer.Option(min=1, help="g_D: GPUs per decode instance.")]
HPrefillOpt = Annotated[float, typer.Option(min=1.0, help="H_P: the prefill pool's headroom factor (≥ 1).")]
HDecodeOpt = Annotated[float, typer.Option(min=1.0, help="H_D: the decode pool's headroom factor (≥ 1).")]
PlanOpt = Annotated[
    Path | None,
    typer.Option(
        help="Take λ, G and g from this P/D plan (summary.json of `llmcap size --out`) and show its simulated counts beside."
    ),
]


@user_errors
def pools(
    rate: RateOpt = None,
    prefill_rps: PrefillRpsOpt = None,
    prefill_gpus: PrefillGpusOpt = None,
    decode_rps: DecodeRpsOpt = None,
    decode_gpus: DecodeGpusOpt = None,
    h_prefill: HPrefillOpt = 1.0,
    h_decode: HDecodeOpt = 1.0,
    plan: PlanOpt = None,
    output_fmt: OutputFormatOpt = "table",
    json_out: JsonFlagOpt = False,
) -> None:
    """The P/D starting count by hand: N_P = ⌈λ·H_P/G_P⌉, N_D = ⌈λ·H_D/G_D⌉, GPUs = N_P·g_P + N_D·g_D."""
    output = output_format(output_fmt, json_out)
    planned = _from_plan(plan) if plan is not None else None
    given = {
        "--rate": rate,
        "--prefill-rps": prefill_rps,
        "--prefill-gpus": prefill_gpus,
        "--decode-rps": decode_rps,
        "--decode-gpus": decode_gpus,
    }
    if planned is not None:
        rate = planned["rate"] if rate is None else rate
        prefill_rps, prefill_gpus = prefill_rps or planned["prefill"]["rps"], prefill_gpus or planned["prefill"]["gpus"]
        decode_rps, decode_gpus = decode_rps or planned["decode"]["rps"], decode_gpus or planned["decode"]["gpus"]
    elif missing := [name for name, value in given.items() if value is None]:
        raise LlmcapError(f"give {', '.join(missing)} (or --plan summary.json)")
    assert rate is not None and prefill_rps and prefill_gpus and decode_rps and decode_gpus
    s = pd_initial_sizing(rate, prefill_rps, prefill_gpus, decode_rps, decode_gpus, h_prefill, h_decode)
    rows = [
        _pool_row(name, count, rate, g_rps, h, sym, planned)
        for name, count, g_rps, h, sym in (
            ("prefill", s.prefill, prefill_rps, h_prefill, "P"),
            ("decode", s.decode, decode_rps, h_decode, "D"),
        )
    ]
    total = f"GPUs = N_P·g_P + N_D·g_D = {s.prefill.instances}·{prefill_gpus} + {s.decode.instances}·{decode_gpus} = {s.gpus}"
    if output == "json":
        print_json({"pools": rows, "gpus": s.gpus, "formula": total})
    elif output == "csv":
        print_csv(rows)
    else:
        _print(rows, total, planned)


def _pool_row(
    name: str, count: PoolCount, rate: float, g_rps: float, h: float, sym: str, planned: dict[str, Any] | None
) -> dict[str, Any]:
    """One pool's count by the formula, with its arithmetic; beside a plan, the plan's count and the H it amounts to."""
    load = rate * h / g_rps
    row = {
        "pool": name,
        "rate_rps": rate,
        "per_instance_rps": g_rps,
        "headroom": h,
        "load": load,
        "instances": count.instances,
        "gpus_per_instance": count.gpus // count.instances if count.instances else 0,
        "gpus": count.gpus,
        "formula": f"N_{sym} = ⌈λ·H_{sym}/G_{sym}⌉ = ⌈{rate:.4g} × {h:g} / {g_rps:.4g}⌉ = ⌈{load:.4g}⌉ = {count.instances}",
    }
    if planned is not None:
        settled = planned[name]["instances"]
        row |= {
            "plan_instances": settled,
            "plan_headroom": settled * g_rps / rate,
        }  # the H the settled count amounts to
    return row


def _print(rows: list[dict[str, Any]], total: str, planned: dict[str, Any] | None) -> None:
    console = out_console()
    for row in rows:
        console.print(
            f"{row['formula']} instances × {row['gpus_per_instance']} GPUs = {row['gpus']} GPUs", highlight=False
        )
    console.print(total, highlight=False)
    if planned is not None:
        plan_gpus = sum(planned[p]["instances"] * planned[p]["gpus"] for p in ("prefill", "decode"))
        settled = ", ".join(f"{r['pool']} {r['plan_instances']} (H = {r['plan_headroom']:.3g})" for r in rows)
        console.print(
            f"the plan, simulated on the whole trace with headroom by risk: {settled} = {plan_gpus} GPUs "
            "(the formula is the starting point; the coupled pools are settled by simulation)",
            highlight=False,
        )
