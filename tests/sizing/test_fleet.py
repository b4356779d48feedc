"""A trace of several models: a pool per model, the fleet's total and the single-model view beside it
(`llmcap.sizing.fleet`, `llmcap size --model LABEL=MODEL ...`)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pyarrow as pa
import pytest
from typer.testing import CliRunner

from llmcap.cli import app
from llmcap.commands._fleet import model_classes
from llmcap.errors import LlmcapError
from llmcap.sizing.fleet import ClassPlan, Fleet, split_by_model
from tests._size_cli import size_args
from tests.conftest import TRACES


def _table(models: list[str | None]) -> pa.Table:
    n = len(models)
    return pa.table(
        {
            "request_id": list(range(n)),
            "arrival_s": [float(i) for i in range(n)],
            "model": pa.array(models, pa.string()),
        }
    )


def test_split_by_model_keeps_each_class_in_order_and_renumbers_it() -> None:
    parts = split_by_model(_table(["a", "b", "a", "a"]), ["b", "a"])
    assert list(parts) == ["b", "a"]
    assert parts["a"].column("request_id").to_pylist() == [0, 1, 2] and parts["a"].column("arrival_s").to_pylist() == [
        0.0,
        2.0,
        3.0,
    ]
    assert parts["b"].column("request_id").to_pylist() == [0] and parts["b"].column("arrival_s").to_pylist() == [1.0]


@pytest.mark.parametrize(
    ("models", "labels", "message"),
    [
        (["a", None, "a"], ["a"], "1 requests carry no model label: a pool per model needs every request's `model`"),
        (
            ["a", "b", "c", "c"],
            ["a"],
            "the trace's model labels b (1 requests), c (2 requests) have no --model LABEL=MODEL: give one for each",
        ),
        (["a"], ["a", "z"], "--model z: no request of the trace carries that model label (it has a)"),
    ],
)
def test_every_request_needs_a_class_and_every_class_requests(models, labels, message) -> None:
    with pytest.raises(LlmcapError) as err:
        split_by_model(_table(models), labels)
    assert str(err.value) == message


def test_model_options() -> None:
    assert model_classes(["Llama-3.1-8B"]) == {None: "Llama-3.1-8B"}
    assert model_classes(["chat=Llama-3.1-8B", "code=Llama-3.1-70B"]) == {
        "chat": "Llama-3.1-8B",
        "code": "Llama-3.1-70B",
    }
    with pytest.raises(LlmcapError, match="with several models give LABEL=MODEL for each"):
        model_classes(["Llama-3.1-8B", "code=Llama-3.1-70B"])
    with pytest.raises(LlmcapError, match="the label 'chat' is given twice"):
        model_classes(["chat=Llama-3.1-8B", "chat=Llama-3.1-70B"])


def test_the_fleet_adds_the_classes_and_compares_the_single_view() -> None:
    small = ClassPlan("chat", "Llama-3.1-8B", 200, 2.4, "x (aggregated)", 2, 5.0, "passes")
    big = ClassPlan("code", "Llama-3.1-70B", 100, 1.2, "y (aggregated)", 4, 10.0, "passes")
    single = ClassPlan("(one total)", "Llama-3.1-8B", 300, 3.6, "x (aggregated)", 2, 5.0, "passes")
    fleet = Fleet((small, big), single)
    assert (fleet.gpus, fleet.usd_per_hour, fleet.passes) == (6, 15.0, True)
    assert fleet.lines()[0] == "fleet: 2 models in their own pools: 6 GPUs, $15.00/h"
    assert fleet.lines()[1].startswith(
        "fragmentation: the whole trace as one total of 3.6 req/s for Llama-3.1-8B alone would need 2 GPUs "
        "($5.00/h); a pool per model needs 6 (+4 GPUs)"
    )
    assert fleet.to_dict()["fragmentation_gpus"] == 4
    none = ClassPlan("code", "Llama-3.1-70B", 100, None, None, None, None, "no plan: nothing meets the SLOs")
    broken = Fleet((small, none), single)
    assert (broken.gpus, broken.passes, broken.to_dict()["fragmentation_gpus"]) == (None, False, None)
    assert broken.lines()[0] == "fleet: 2 models in their own pools: no total: a class has no plan"
    failing = Fleet((small, ClassPlan("code", "Llama-3.1-70B", 100, 1.2, "y (aggregated)", 4, 10.0, "fails")), single)
    assert not failing.passes and "fails a scenario: not an answer" in failing.classes[1].line()


ARGS = size_args(models=(), tp="1,2")  # each test names its trace and models


def _write(path: Path, rows: list[dict], labelled: bool) -> Path:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["arrival_s", "isl", "osl", *(["model"] if labelled else [])])
        for r in rows:
            w.writerow([r["arrival_s"], r["isl"], r["osl"], *([r["model"]] if labelled else [])])
    return path


def test_size_plans_a_pool_per_model_as_each_model_alone(tmp_path, monkeypatch) -> None:
    """300 Azure conversation requests, every third one for a 70B model and the rest for an 8B one. Each model's
    pool is what `llmcap size` gives for that model's requests alone; the fleet is their sum; the single-model
    view is `llmcap size` of the whole trace for the most requested model."""
    monkeypatch.delenv("COLUMNS", raising=False)
    with TRACES["azure_conv"].open() as f:
        azure = list(csv.DictReader(f))[:300]
    rows = [
        {
            "arrival_s": f"{i * 0.28:.2f}",
            "isl": r["ContextTokens"],
            "osl": r["GeneratedTokens"],
            "model": "code" if i % 3 == 0 else "chat",
        }
        for i, r in enumerate(azure)
    ]
    mixed = _write(tmp_path / "mixed.csv", rows, labelled=True)

    def size(*args: str) -> tuple[int, dict]:
        r = CliRunner().invoke(app, [*ARGS, *args])
        return r.exit_code, json.loads(r.stdout)

    code, fleet = size(
        "--trace",
        str(mixed),
        "--model",
        "chat=Llama-3.1-8B",
        "--model",
        "code=Llama-3.1-70B",
        "--out",
        str(tmp_path / "out"),
    )
    assert code == 0 and [c["label"] for c in fleet["classes"]] == ["chat", "code"]
    for c, model in zip(fleet["classes"], ("Llama-3.1-8B", "Llama-3.1-70B"), strict=True):
        alone = _write(tmp_path / f"{c['label']}.csv", [r for r in rows if r["model"] == c["label"]], labelled=False)
        code, plan = size("--trace", str(alone), "--model", model)
        assert code == 0 and (c["gpus"], c["usd_per_hour"], c["requests"]) == (
            plan["gpus"],
            plan["usd_per_hour"],
            200 if c["label"] == "chat" else 100,
        )
        assert c["chosen"] == f"{plan['chosen']} ({plan['mode']})"
        assert json.loads((tmp_path / "out" / c["label"] / "summary.json").read_text())["gpus"] == c["gpus"]
    assert fleet["gpus"] == sum(c["gpus"] for c in fleet["classes"])
    code, whole = size("--trace", str(_write(tmp_path / "whole.csv", rows, labelled=False)), "--model", "Llama-3.1-8B")
    assert (
        fleet["single_model_view"]["gpus"] == whole["gpus"]
        and fleet["fragmentation_gpus"] == fleet["gpus"] - whole["gpus"]
    )
    assert fleet["fragmentation_gpus"] > 0  # the 70B model's own pool costs more than pricing its requests as 8B ones
    assert json.loads((tmp_path / "out" / "fleet.json").read_text()) == fleet


def test_one_models_feature_classes_as_pools(tmp_path, monkeypatch) -> None:
    """`--class-by feature`: one model's requests with a feature (every fourth: image) and without ("(none)") each
    sized as a pool, the fleet their sum, the one-pool view the whole trace; a label the command cannot split by, or
    several models, is a usage error."""
    monkeypatch.delenv("COLUMNS", raising=False)
    trace = tmp_path / "t.csv"
    trace.write_text(
        "arrival_s,isl,osl,feature\n"
        + "".join(
            f"{i * 0.25:.2f},{100 + (i * 37) % 900},{20 + (i * 13) % 150},{'image' if i % 4 == 0 else ''}\n"
            for i in range(240)
        )
    )
    r = CliRunner().invoke(app, [*ARGS, "--trace", str(trace), "--model", "Llama-3.1-8B", "--class-by", "feature"])
    assert r.exit_code == 0, r.output
    fleet = json.loads(r.stdout)
    assert fleet["by"] == "feature" and [(c["label"], c["model"], c["requests"]) for c in fleet["classes"]] == [
        ("(none)", "Llama-3.1-8B", 180),
        ("image", "Llama-3.1-8B", 60),
    ]  # most requested first: 3 of every 4 carry no feature
    assert fleet["gpus"] == sum(c["gpus"] for c in fleet["classes"]) and fleet["single_model_view"]["requests"] == 240
    assert fleet["fragmentation_gpus"] == fleet["gpus"] - fleet["single_model_view"]["gpus"]
    lines = Fleet(
        tuple(ClassPlan(**c) for c in fleet["classes"]), ClassPlan(**fleet["single_model_view"]), "feature"
    ).lines()
    assert (
        lines[0].startswith("fleet: 2 feature classes in their own pools: ")
        and "a pool per feature class needs" in lines[1]
    )
    for extra, message in (
        (["--model", "Llama-3.1-8B", "--class-by", "model"], "--class-by 'model': one of tenant, feature"),
        (["--model", "a=Llama-3.1-8B", "--model", "b=Llama-3.1-8B", "--class-by", "feature"], "give one --model"),
        (["--model", "Llama-3.1-8B", "--class-by", "tenant"], "no request of the trace carries a tenant label"),
    ):
        r = CliRunner().invoke(app, [*ARGS, "--trace", str(trace), *extra])
        assert r.exit_code == 2 and message in r.output, r.output
