"""`make plan`'s flow on the shipped data and params, in a sandbox copy of the checkout (ops.sandbox), twice:
fresh (every stage runs; the flow prints each stage's time split into DVC's share, the stage process's start,
its work, MLflow and GX) and up to date (no stage runs). The installs `make plan` does first are not timed."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

from ops.sandbox import commit_all, copy_checkout, sandbox_env

OUT = Path(__file__).resolve().parent.parent / ".work" / "bench" / "plan"


def _flow(dest: Path, env: dict[str, str]) -> tuple[float, str]:
    began = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "flows.replan"], cwd=dest, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - began
    if proc.returncode != 0:
        raise SystemExit(f"flows.replan exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return wall, proc.stdout


def _table(stdout: str) -> str:
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("time per stage"))
    end = next(i for i in range(start + 1, len(lines)) if lines[i].lstrip().startswith("the flow:"))
    return "\n".join(lines[start : end + 1])


def main() -> None:
    shutil.rmtree(OUT, ignore_errors=True)
    copy_checkout(OUT, native=True)
    env = sandbox_env(OUT)
    commit_all(OUT, env, "bench")
    fresh_s, fresh = _flow(OUT, env)
    again_s, again = _flow(OUT, env)
    print(f"make plan's flow, fresh sandbox: {fresh_s:.1f} s (target with installs ≤ 240 s)")
    print(_table(fresh))
    print(f"make plan's flow, up to date: {again_s:.1f} s (target ≤ 15 s)")
    print(_table(again))
    shutil.rmtree(OUT, ignore_errors=True)


if __name__ == "__main__":
    main()
