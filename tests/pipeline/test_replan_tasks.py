"""The flow's per-stage tasks: every DVC stage in dependency order, and retries only for transient errors."""

from __future__ import annotations

import yaml
from dvc.exceptions import ReproductionError
from dvc.lock import LockError
from prefect.states import Failed

from flows.replan import _transient, reproduce_stage, stage_order
from tests.conftest import ROOT


def test_every_stage_runs_after_the_stages_it_reads_from():
    spec = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    order = stage_order(str(ROOT))
    assert sorted(order) == sorted(spec)
    produced = {}
    for name, s in spec.items():
        for out in s["outs"] + s.get("metrics", []) + s.get("plots", []):
            produced[next(iter(out)) if isinstance(out, dict) else out] = name
    for name, s in spec.items():
        for dep in s.get("deps", []):
            if dep in produced:
                assert order.index(produced[dep]) < order.index(name), (dep, name)


def test_only_transient_errors_are_retried():
    assert reproduce_stage.retries == 2 and reproduce_stage.retry_condition_fn is _transient
    assert _transient(reproduce_stage, None, Failed(data=LockError("Unable to acquire lock")))
    assert _transient(reproduce_stage, None, Failed(data=TimeoutError("remote timed out")))
    # a stage whose command fails (bad input, a bug) fails the same way again: no retry
    assert not _transient(reproduce_stage, None, Failed(data=ReproductionError("size")))
    assert not _transient(reproduce_stage, None, Failed(data=ValueError("bad")))
