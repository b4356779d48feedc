"""Where a stage's wall time goes: the interpreter's start, the stage's own work (its lazy imports included),
opening and closing its MLflow run, and its Great Expectations validation.

`stage_main` writes one JSON line per stage run to the file `STAGE_TIMES_ENV` names (the flow `replan`
sets it and prints the table); nothing is written when it is unset, so a stage run by hand is unchanged.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

STAGE_TIMES_ENV = "LLMCAP_STAGE_TIMES"
PHASES = ("startup", "work", "mlflow", "validation")

_spent = {"mlflow": 0.0, "validation": 0.0}


def now() -> float:
    return time.perf_counter()


def add_since(name: str, began: float) -> None:
    """Count the wall time since `began` (a `now()`) against phase `name` ("mlflow" or "validation") of this stage run."""
    _spent[name] += time.perf_counter() - began


def process_age_s() -> float | None:
    """Seconds since this process started (Linux /proc: field 22 of /proc/self/stat, in clock ticks since boot);
    None where /proc is not there."""
    try:
        started = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return max(0.0, uptime - started)


def record(stage: str, startup_s: float | None, body_s: float) -> None:
    """Append this stage run's phases to the file `STAGE_TIMES_ENV` names, if set. `body_s`: the stage body's
    wall time, of which the MLflow and validation phases are taken out as their own."""
    target = os.environ.get(STAGE_TIMES_ENV)
    if not target:
        return
    line = {"stage": stage, "startup": startup_s, "work": body_s - _spent["mlflow"] - _spent["validation"], **_spent}
    with open(target, "a") as f:
        f.write(json.dumps(line) + "\n")


def read(path: Path) -> dict[str, dict[str, float | None]]:
    """The last recorded phases of each stage in `path` (stage → phase → seconds); empty when there is no file."""
    if not path.is_file():
        return {}
    out: dict[str, dict[str, float | None]] = {}
    for text in path.read_text().splitlines():
        line = json.loads(text)
        out[line.pop("stage")] = line
    return out
