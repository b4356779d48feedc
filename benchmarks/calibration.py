"""`make bench`: the roofline's shipped calibrations (llmcap.perf.calibration): for each GPU with one, the
median error of the documented default efficiencies, of the fit, and of each group of timed operations
predicted by a fit that left it out (leave-one-group-out cross-validation), per operation, without the
step-time terms (the efficiencies alone) and with the terms the calibration keeps; then, where this
project timed a GPU itself (`measured_ops.json`), how the calibration fitted to public data predicts those
operations it never saw."""

from __future__ import annotations

import numpy as np
from rich.console import Console
from rich.table import Table

from llmcap.catalog import get_gpu
from llmcap.commands.calibrate import cross_validation_table
from llmcap.perf import calibration as cal


def transfer_table(gpu_name: str, c: cal.Calibration) -> Table | None:
    """The public fit, the defaults and what is applied (the fit where it holds on them) on this project's own
    timings of the same GPU (in scope), per operation."""
    path = cal.CALIBRATION_DIR / gpu_name / "measured_ops.json"
    if not path.is_file():
        return None
    gpu = get_gpu(gpu_name)
    rows, env = cal.load_rows(path)
    rows = rows.subset(cal.in_scope(rows, gpu))
    base = cal.relative_errors(rows, cal.RooflineFit.from_params(cal.RooflineParams()), gpu)
    ours = cal.relative_errors(rows, c.fitted or c.fit, gpu)
    applied = cal.relative_errors(rows, c.fit, gpu)
    t = Table(
        title=f"{gpu_name}: the public calibration on {len(rows)} operations this project timed itself "
        f"({env.get('device')}, torch {env.get('torch')}, {env.get('measured_at')}), median |predicted / measured - 1|"
    )
    t.caption = f"not applied (the defaults predict these better): {', '.join(c.not_applied) or 'none'}"
    for col in ("op", "rows", "defaults", "public calibration", "applied"):
        t.add_column(col, justify="right" if col != "op" else "left")
    for op in [*cal.OPS, "all"]:
        sel = np.ones(len(rows), bool) if op == "all" else rows.op == op
        if sel.any():
            t.add_row(op, f"{int(sel.sum())}", *(f"{np.median(np.abs(e[sel])):.1%}" for e in (base, ours, applied)))
    return t


def main() -> None:
    console = Console()
    shipped = cal.shipped_calibrations()
    if not shipped:
        print("roofline calibration: none shipped")
    for c in shipped:
        gpu = get_gpu(c.gpu)
        rows, env = cal.load_rows(c.path.parent / "ops.json")
        console.print(
            f"roofline calibration of {gpu.name}: {len(rows)} operations timed on {env.get('device')} "
            f"({env.get('source') or env.get('measured_at')})",
            highlight=False,
        )
        shipped = c.fitted or c.fit
        console.print(f"step-time terms kept: {', '.join(shipped.terms) or 'none'}", highlight=False)
        console.print(
            cross_validation_table(cal.cross_validate(rows, gpu, shipped), cal.cross_validate(rows, gpu, terms=()))
        )
        if (t := transfer_table(gpu.name, c)) is not None:
            console.print(t)


if __name__ == "__main__":
    main()
