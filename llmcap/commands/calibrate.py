"""`llmcap calibrate OPS.json --gpu G [--write]`: fit the roofline's efficiencies for one GPU to timed
operations (benchmarks/gpu/measure_ops.py, run on that GPU) and show how well they predict, in sample
and held out. `--write` stores the fit as the GPU's shipped calibration (and the timed operations beside
it), which every roofline of that GPU then uses."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Annotated

import numpy as np
import typer
import yaml
from rich.table import Table

from llmcap.catalog import get_gpu
from llmcap.commands._common import JsonFlagOpt, out_console, print_json, user_errors
from llmcap.errors import LlmcapError
from llmcap.perf import calibration as cal
from llmcap.perf.calibration_terms import calibration_doc, select_terms


@user_errors
def calibrate(
    ops: Annotated[
        Path,
        typer.Argument(exists=True, dir_okay=False, help="Timed operations (JSON) from benchmarks/gpu/measure_ops.py."),
    ],
    gpu: Annotated[str, typer.Option("--gpu", "-g", help="GPU name or alias the operations were timed on.")],
    write: Annotated[bool, typer.Option("--write", help="Store the fit as this GPU's shipped calibration.")] = False,
    json_out: JsonFlagOpt = False,
) -> None:
    """Fit the roofline's efficiencies for GPU to timed operations; print the cross-validation; --write ships them."""
    g = get_gpu(gpu)
    try:
        rows, env = cal.load_rows(ops)
    except (ValueError, KeyError) as e:
        raise LlmcapError(f"{ops}: not a measure_ops.py file ({e})") from e
    device = str(env.get("device", ""))
    if device and not any(a in device.lower() for a in (g.name.lower(), *g.aliases)):
        raise LlmcapError(f"{ops}: timed on {device!r}, which is not {g.name} (aliases: {', '.join(g.aliases)})")
    fitted, cv, base_cv, choices = select_terms(rows, g)
    target = cal.CALIBRATION_DIR / g.name
    if write:
        target.mkdir(parents=True, exist_ok=True)
        if ops.resolve() != (target / "ops.json").resolve():
            shutil.copyfile(ops, target / "ops.json")
        doc = calibration_doc(g, target / "ops.json", env, fitted, cv, base_cv, choices)
        (target / "roofline.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    else:
        doc = calibration_doc(g, ops, env, fitted, cv, base_cv, choices)
    if json_out:
        print_json(doc)
        return
    console = out_console()
    t = Table(
        title=f"{g.name}: roofline efficiencies fitted to {len(rows)} timed operations ({device or 'device not recorded'})"
    )
    for col in ("knob", "default", "fitted"):
        t.add_column(col, justify="right" if col != "knob" else "left")
    base = cal.RooflineFit.from_params(cal.RooflineParams())
    for d, (mm_max, mm_half) in fitted.matmul.items():  # the dtypes it timed GEMMs of; others take bf16's curve
        t.add_row(f"matmul {d} efficiency max", f"{base.matmul[d][0]:.3f}", f"{mm_max:.3f}")
        t.add_row(f"matmul {d} half tokens", f"{base.matmul[d][1]:.1f}", f"{mm_half:.1f}")
    t.add_row(
        "attention efficiency max", f"{base.attention_efficiency_max:.3f}", f"{fitted.attention_efficiency_max:.3f}"
    )
    t.add_row("attention half tokens", f"{base.attention_half_tokens:.1f}", f"{fitted.attention_half_tokens:.1f}")
    t.add_row("HBM efficiency", f"{base.hbm_efficiency:.3f}", f"{fitted.hbm_efficiency:.3f}")
    if fitted.comm is not None and base.comm is not None:
        t.add_row("all-reduce link efficiency", f"{base.comm[0]:.3f}", f"{fitted.comm[0]:.3f}")
        t.add_row("scale-up latency per step (µs)", f"{base.comm[1] * 1e6:.2f}", f"{fitted.comm[1] * 1e6:.2f}")
    if fitted.oneshot_latency_s is not None:
        t.add_row("one-shot all-reduce latency (µs)", "ring", f"{fitted.oneshot_latency_s * 1e6:.2f}")
    if fitted.fixed_s is not None:
        t.add_row(
            "fixed cost per GEMM / attention kernel (µs)",
            "0 / 0",
            f"{fitted.fixed_s[0] * 1e6:.2f} / {fitted.fixed_s[1] * 1e6:.2f}",
        )
    if fitted.kv_efficiency is not None:
        t.add_row("KV-read HBM efficiency (decode attention)", "= HBM", f"{fitted.kv_efficiency:.3f}")
    console.print(t)
    for c in choices:
        whole = "" if c.target == "all" else f", all {c.without[1]:.1%} -> {c.with_[1]:.1%}"
        console.print(
            f"term {c.term}: held-out {c.target} {c.without[0]:.1%} -> {c.with_[0]:.1%}{whole}: "
            f"{'kept' if c.kept else 'left out'}",
            highlight=False,
        )
    console.print(cross_validation_table(cv, base_cv))
    if write:
        console.print(f"wrote {target / 'roofline.yaml'}: every roofline of {g.name} uses it", highlight=False)


def cross_validation_table(cv: cal.CrossValidation, without_terms: cal.CrossValidation | None = None) -> Table:
    """Per op: defaults, calibrated, held out; with `without_terms`, first the held-out error of the efficiencies alone."""
    t = Table(
        title=f"median |predicted / measured - 1| (held out: each of {cv.groups} groups predicted by a fit without it)"
    )
    cols = ("op", "rows", "defaults", "calibrated", *(("held out, no terms",) if without_terms else ()), "held out")
    for col in cols:
        t.add_column(col, justify="right" if col != "op" else "left")
    before = {r["op"]: float(r["held_out"]) for r in without_terms.rows()} if without_terms else {}

    def pct(v: float) -> str:
        return "—" if np.isnan(v) else f"{v:.1%}"

    for r in cv.rows():
        extra = (pct(before.get(str(r["op"]), float("nan"))),) if without_terms else ()
        t.add_row(
            str(r["op"]),
            f"{r['rows']}",
            f"{r['uncalibrated']:.1%}",
            f"{r['calibrated']:.1%}",
            *extra,
            pct(float(r["held_out"])),
        )
    t.caption = (
        f"in scope: operations with ≥ {cal.MIN_WORK_S * 1e6:g} µs of work at the datasheet peaks, and all-reduces; "
        f"'{cal.BELOW_SCOPE}': smaller ones, where a kernel's fixed cost is a large share (fitted at weight "
        f"{cal.BELOW_SCOPE_WEIGHT:g} only with the fixed cost per kernel; else not fitted, no held-out figure)"
    )
    return t
