"""Whole-process figures of the command line, as a user sees them (interpreter start and imports included):
`llmcap --help` and `llmcap simulate` of the Mooncake conversation trace (12k requests, its own rate), beside
the in-process simulation time that `simulate --json` reports as `wall_s`. Median of 5 runs each."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT / "data/raw/mooncake/conversation_trace.jsonl"
RUNS = 5
SIMULATE = ["simulate", "--trace", str(TRACE), "--model", "Llama-3.1-70B", "--gpu", "h200", "--tp", "4", "--json"]


def _median_wall(args: list[str]) -> tuple[float, str]:
    walls, out = [], ""
    for _ in range(RUNS):
        start = time.perf_counter()
        out = subprocess.run(
            [sys.executable, "-m", "llmcap", *args], cwd=ROOT, check=True, capture_output=True, text=True
        ).stdout
        walls.append(time.perf_counter() - start)
    return statistics.median(walls), out


def main() -> None:
    help_s, _ = _median_wall(["--help"])
    sim_s, out = _median_wall(SIMULATE)
    summary = json.loads(out)
    print(
        f"command line, whole process (median of {RUNS}): `llmcap --help` {help_s:.2f} s (target ≤ 0.5 s); "
        f"`llmcap simulate` Mooncake conversation ({summary['requests']:,} requests) {sim_s:.2f} s (target ≤ 2 s), "
        f"of which simulating {summary['wall_s']:.2f} s"
    )


if __name__ == "__main__":
    main()
