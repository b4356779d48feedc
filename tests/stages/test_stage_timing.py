"""Where a stage's time goes: the stage runner records its phases when the flow asks (LLMCAP_STAGE_TIMES),
and the flow's table splits each stage's wall time into DVC's share and the stage process's phases."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from flows.replan import stage_times, times_table
from stages import timing


def test_the_stage_runner_records_a_finished_stage_and_not_a_failed_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from llmcap.errors import LlmcapError
    from stages import _runner

    out = tmp_path / "stages.jsonl"
    monkeypatch.setenv(timing.STAGE_TIMES_ENV, str(out))
    monkeypatch.setattr(timing, "_spent", {"mlflow": 0.0, "validation": 0.0})
    library = logging.getLogger("llmcap")  # stage_main adds its stage's handler: this test process keeps its own
    monkeypatch.setattr(library, "handlers", list(library.handlers))
    monkeypatch.setattr(library, "level", library.level)
    monkeypatch.setattr(
        _runner, "apply_defaults", lambda: None
    )  # the tools' homes: this process has its own (conftest)

    def work(_: object) -> str:
        timing.add_since("validation", timing.now())
        return "done"

    def broken(_: object) -> str:
        raise LlmcapError("bad input")

    assert _runner.stage_main("toy", None, [], work, argv=[]) == 0
    assert _runner.stage_main("broken", None, [], broken, argv=[]) == 2
    rows = timing.read(out)
    assert set(rows) == {"toy"}  # a failed stage is not timed as if it had run
    assert set(rows["toy"]) == set(timing.PHASES) and rows["toy"]["work"] >= 0
    age = rows["toy"]["startup"]
    assert age is not None and 0 < age < 24 * 3600  # this test process started a while ago, not before boot


def test_record_subtracts_mlflow_and_validation_from_the_body(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "stages.jsonl"
    monkeypatch.setenv(timing.STAGE_TIMES_ENV, str(out))
    monkeypatch.setattr(timing, "_spent", {"mlflow": 0.0, "validation": 0.0})
    clock = iter([10.0, 11.5, 20.0, 22.0, 30.0, 30.5])
    monkeypatch.setattr(timing.time, "perf_counter", lambda: next(clock))
    for phase in ("mlflow", "validation", "mlflow"):
        timing.add_since(phase, timing.now())  # 1.5 s, 2.0 s, 0.5 s
    timing.record("size", 3.0, 10.0)
    timing.record("replay", None, 4.0)  # a later record of another stage: both kept, each stage's last wins
    rows = timing.read(out)
    assert rows["size"] == {"startup": 3.0, "work": 6.0, "mlflow": 2.0, "validation": 2.0}
    assert rows["replay"]["startup"] is None and rows["replay"]["work"] == pytest.approx(0.0)
    assert timing.read(tmp_path / "missing.jsonl") == {}
    monkeypatch.delenv(timing.STAGE_TIMES_ENV)
    timing.record("reconcile", 1.0, 1.0)
    assert "reconcile" not in timing.read(out)


def test_the_flow_table_gives_dvc_the_rest_of_each_stage() -> None:
    phases = {"size": {"startup": 1.0, "work": 50.0, "mlflow": 2.0, "validation": 3.0}}
    got = stage_times({"clean": 0.8, "size": 60.0}, phases)
    assert got["clean"] == {"total": 0.8, "dvc": 0.8}  # up to date: DVC only checked it
    assert got["size"] == {
        "total": 60.0,
        "dvc": pytest.approx(4.0),
        "startup": 1.0,
        "work": 50.0,
        "mlflow": 2.0,
        "validation": 3.0,
    }
    table = times_table(got, 70.0)
    lines = table.splitlines()
    assert lines[0].split()[-6:] == ["total", "DVC", "start", "work", "MLflow", "GX"]
    assert lines[1].split() == ["clean", "0.8", "0.8", "—", "—", "—", "—"]
    assert lines[2].split() == ["size", "60.0", "4.0", "1.0", "50.0", "2.0", "3.0"]
    assert "the flow: 70.0 s, of which 9.2 s outside the stages" in lines[3]
