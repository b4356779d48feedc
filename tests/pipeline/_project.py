"""A throw-away copy of the repository for end-to-end pipeline tests (ops.sandbox) with light sizing params:
the same code path, fewer simulations."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from ops.sandbox import commit_all, copy_checkout, sandbox_env


def sh(cmd: list[str], cwd: Path, env: dict, timeout: int = 600, ok: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if ok:
        assert proc.returncode == 0, f"{cmd} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc


def make_project(dest: Path, native: bool = False) -> tuple[Path, dict]:
    """A sandbox copy of the checkout (ops.sandbox) with a lighter sizing search, committed in its own git
    repository. `native`: with the compiled simulator core."""
    copy_checkout(dest, native)
    # A lighter sizing search than the shipped default (same code path): these tests run the pipeline several times.
    params = yaml.safe_load((dest / "params.yaml").read_text())
    params["size"].update(
        excerpt_requests=400,
        shortlist=1,
        pd_prefill_shortlist=0,
        pools_split_isl=None,
        final_shortlist=1,
        model_error_range=False,
    )
    params["size"]["search"]["seeds"] = [0]
    params["size"]["count_seeds"] = [1]
    # the replay check against the twin: a few seconds per run (12 requests; the light search picks a slow
    # instance, ~0.01 req/s, whose 12 requests span ~20 simulated minutes: played 100x faster than real time),
    # at the verdict's two ends only (the 1x run between them decides nothing)
    params["replay"].update(excerpt_requests=12, twin_dilation=0.01, rate_scales=[0.8, 1.2])
    params["autoscale"].update(period_s=1800, duration_s=1800, t_ready_s=120, min_residency_s=120, floor_fractions=[1])
    (dest / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    env = sandbox_env(dest)
    commit_all(dest, env, "fresh clone")
    return dest, env
