"""The installed wheels against the checkout, whole process as a user runs them: `simulate` of the Mooncake
conversation trace and `size` of it with the pipeline's SLOs, fp8 (each the median of 3, interleaved), from the
compiled wheel (`make dist`) and the pure-Python one, each in a clean venv, beside the checkout's `llmcap`.
Target: the compiled wheel within 1.5x of the checkout."""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from ops.dist import build_wheel, install

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / ".work" / "bench" / "wheel"
TRACE = ROOT / "data/raw/mooncake/conversation_trace.jsonl"
SIMULATE = ["simulate", "--trace", str(TRACE), "--model", "Llama-3.1-70B", "--gpu", "h200", "--tp", "4", "--json"]
SIZE = [
    "size",
    "--trace",
    str(TRACE),
    "--model",
    "Llama-3.1-70B",
    "--gpu",
    "h100,h200",
    "--weight-quant",
    "fp8",
    "--kv-dtype",
    "fp8",
    "--slo-ttft-p99",
    "2000",
    "--slo-ttft-per-1k-isl",
    "200",
    "--slo-itl-p99",
    "100",
    "--json",
]  # the pipeline's SLOs


def _walls(clis: dict[str, list[str]], args: list[str], runs: int) -> dict[str, tuple[float, str]]:
    """Median wall time and last stdout of each CLI, runs interleaved (a machine's load drifts over minutes)."""
    walls: dict[str, list[float]] = {name: [] for name in clis}
    outs: dict[str, str] = {}
    for _ in range(runs):
        for name, cli in clis.items():
            began = time.perf_counter()
            outs[name] = subprocess.run([*cli, *args], cwd=OUT, check=True, capture_output=True, text=True).stdout
            walls[name].append(time.perf_counter() - began)
    return {name: (statistics.median(w), outs[name]) for name, w in walls.items()}


def _answer(size_json: str) -> tuple:
    s = json.loads(size_json)
    return s["chosen"], s["gpus"], s["usd_per_hour"]


def main() -> None:
    shutil.rmtree(OUT, ignore_errors=True)
    OUT.mkdir(parents=True)
    clis = {"checkout": [sys.executable, "-m", "llmcap"]}
    for name, compiled in (("compiled wheel", True), ("pure wheel", False)):
        venv = install(
            build_wheel(OUT / "dist", compiled), OUT / name.replace(" ", "-"), locked=True
        )  # the checkout's versions
        clis[name] = [str(venv / "llmcap-planner")]
    sims = _walls(clis, SIMULATE, 3)
    sizes = _walls({k: v for k, v in clis.items() if k != "pure wheel"}, SIZE, 3)  # the pure one would take minutes
    base_sim, base_size = sims["checkout"][0], sizes["checkout"][0]
    print("installed wheels (whole process):")
    for name in clis:
        line = f"  {name:<15} simulate Mooncake {sims[name][0]:6.2f} s ({sims[name][0] / base_sim:.2f}x the checkout)"
        if name in sizes:
            line += f"; size {sizes[name][0]:6.1f} s ({sizes[name][0] / base_size:.2f}x), same answer: {_answer(sizes[name][1]) == _answer(sizes['checkout'][1])}"
        print(line)
    print("  target: the compiled wheel within 1.5x of the checkout")
    shutil.rmtree(OUT, ignore_errors=True)


if __name__ == "__main__":
    main()
