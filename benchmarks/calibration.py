"""`make bench`: the roofline's shipped calibrations (llmcap.perf.calibration): for each GPU with one, the
median error of the documented default efficiencies, of the fit, and of each group of timed operations
predicted by a fit that left it out (leave-one-group-out cross-validation), per operation."""

from __future__ import annotations

from rich.console import Console

from llmcap.catalog import get_gpu
from llmcap.commands.calibrate import cross_validation_table
from llmcap.perf import calibration as cal


def main() -> None:
    console = Console()
    shipped = [c.path for c in cal.shipped_calibrations()]
    if not shipped:
        print("roofline calibration: none shipped")
    for path in shipped:
        gpu = get_gpu(path.parent.name)
        rows, env = cal.load_rows(path.parent / "ops.json")
        fitted = cal.read_calibration(path).fit
        console.print(f"roofline calibration of {gpu.name}: {len(rows)} operations timed on {env.get('device')} "
                      f"(torch {env.get('torch')}, CUDA {env.get('cuda')}, {env.get('measured_at')})", highlight=False)
        console.print(cross_validation_table(cal.cross_validate(rows, gpu, fitted)))


if __name__ == "__main__":
    main()
