"""A replica is assembled from parts: an admission policy (`register_admission`, shown an `AdmissionView`) and a
waiting queue by scheduling policy (`create_request_queue`: fcfs or priority, vLLM's `--scheduling-policy`).
A new admission policy is one class and one `register_admission` call: the configuration accepts its name,
the planning notes know what it reserves, and the scheduler asks it."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from llmcap.cli import app
from llmcap.planning import reservation_note
from llmcap.policy_names import never_preempts, reserves_output
from llmcap.sim import EngineConfig, SimConfig, simulate
from llmcap.sim.admission import AdmissionView, register_admission, unregister_admission
from tests.sim._workloads import MODEL, random_config, random_trace, table


class OneAtATime:
    """Never lets a second request join a running one (asked only while another runs)."""

    tracks_progress = False

    def admits(self, view: AdmissionView) -> bool:
        return False

    def admitted(self, lifetime_blocks: int) -> None:
        pass

    def released(self, lifetime_blocks: int) -> None:
        pass

    def steps_before_admissible(self, view: AdmissionView, k: int, decoding: int) -> int:
        return k

    def retracted(self, step: int, decoded: int, max_new: int, running: int) -> None:
        pass


class WholeLifeAgain(OneAtATime):
    """TensorRT-LLM's guaranteed-no-evict written again from the view alone."""

    def __init__(self) -> None:
        self.reserved = 0

    def admits(self, view: AdmissionView) -> bool:
        return self.reserved + view.lifetime_blocks <= view.num_blocks

    def admitted(self, lifetime_blocks: int) -> None:
        self.reserved += lifetime_blocks

    def released(self, lifetime_blocks: int) -> None:
        self.reserved -= lifetime_blocks


@pytest.fixture
def toy_policies():
    register_admission("one-at-a-time", OneAtATime)
    register_admission("whole-life-again", WholeLifeAgain, never_preempts=True, reserves_output=True)
    yield
    unregister_admission("one-at-a-time")
    unregister_admission("whole-life-again")


def test_a_registered_admission_policy_is_configured_by_name_and_asked(toy_policies) -> None:
    trace = table({"isl": [40] * 6, "osl": [20] * 6})  # all at t=0: the built-in policy runs them together
    engine = EngineConfig(num_blocks=200, max_num_seqs=8, enable_prefix_caching=False, admission_policy="one-at-a-time")
    rec = simulate(trace, MODEL, SimConfig(engine=engine)).records.to_pandas()
    assert (rec.status == "ok").all()
    assert (rec.admitted_s.to_numpy()[1:] >= rec.finish_s.to_numpy()[:-1]).all()  # each starts when the one before ends
    together = simulate(trace, MODEL, SimConfig(engine=engine.model_copy(update={"admission_policy": "vllm"}))).records
    assert len(set(together.column("admitted_s").to_pylist())) == 1


def test_a_registered_policys_traits_reach_the_plans_notes(toy_policies) -> None:
    assert never_preempts("whole-life-again") and reserves_output("whole-life-again")
    assert not never_preempts("one-at-a-time") and not reserves_output("one-at-a-time")
    trace = table({"isl": [40] * 4, "osl": [20] * 4, "max_tokens": [20] * 4})
    assert "reserves each request's max_tokens" in reservation_note(trace, "whole-life-again")
    assert "reserves nothing ahead" in reservation_note(trace, "one-at-a-time")


@pytest.mark.parametrize("seed", range(6))
def test_a_policy_rewritten_over_the_view_admits_like_the_built_in_one(toy_policies, seed: int) -> None:
    rng = np.random.default_rng(seed)
    trace = random_trace(rng, 80)
    cfg = random_config(rng, seed).model_copy(update={"pd": None, "replicas": 2})

    def run(policy: str) -> bytes:
        engine = cfg.engine.model_copy(update={"admission_policy": policy})
        c = SimConfig.model_validate(cfg.model_dump() | {"engine": engine.model_dump()})
        return simulate(trace, MODEL, c, rng=np.random.default_rng(seed)).records_parquet()

    assert run("whole-life-again") == run("trtllm-guaranteed-no-evict")


def test_registration_refuses_a_taken_or_built_in_name() -> None:
    with pytest.raises(ValueError, match="already registered"):
        register_admission("vllm", OneAtATime)
    with pytest.raises(ValueError, match="built in"):
        unregister_admission("sglang")
    with pytest.raises(ValueError, match="unknown admission policy 'one-at-a-time'"):
        EngineConfig(num_blocks=10, admission_policy="one-at-a-time")  # not registered outside the fixture


def _with_priority(rows: dict, priority: list[int]) -> pa.Table:
    t = table(rows)
    return t.append_column("priority", pa.array(priority, pa.int64())).replace_schema_metadata(t.schema.metadata)


def test_the_priority_queue_admits_lower_priorities_first_and_fcfs_ignores_them() -> None:
    # one sequence at a time, all three at t=0: the queue's order is the admission order
    trace = _with_priority({"isl": [30, 30, 30], "osl": [5, 5, 5]}, [2, 0, 1])
    engine = EngineConfig(num_blocks=100, max_num_seqs=1, max_num_batched_tokens=64, enable_prefix_caching=False)

    def order(policy: str) -> list[int]:
        rec = simulate(trace, MODEL, SimConfig(engine=engine.model_copy(update={"scheduling_policy": policy}))).records
        admitted = rec.column("admitted_s").to_pylist()
        return sorted(range(3), key=lambda i: admitted[i])

    assert order("priority") == [1, 2, 0]
    assert order("fcfs") == [0, 1, 2]


def test_the_priority_queue_preempts_the_lowest_priority_not_the_newest() -> None:
    # A (priority 5) starts alone; B (priority 0) joins later. Each needs 14 blocks of 16 over its life
    # (16 + 200 - 1 tokens), so 16 blocks hold either alone but not both to the end: FCFS preempts the newest
    # (B), priority the last in its order (A)
    trace = _with_priority({"isl": [16, 16], "osl": [200, 200], "arrival_s": [0.0, 0.05]}, [5, 0])
    engine = EngineConfig(
        num_blocks=16, block_size=16, max_num_seqs=2, max_num_batched_tokens=64, enable_prefix_caching=False
    )

    def preempted(policy: str) -> list[int]:
        rec = simulate(trace, MODEL, SimConfig(engine=engine.model_copy(update={"scheduling_policy": policy}))).records
        assert rec.column("status").to_pylist() == ["ok", "ok"]
        return rec.column("preemptions").to_pylist()

    fcfs, priority = preempted("fcfs"), preempted("priority")
    assert fcfs[0] == 0 and fcfs[1] > 0
    assert priority[0] > 0 and priority[1] == 0


def test_an_unknown_scheduling_policy_is_refused_with_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown scheduling policy 'lifo'.*fcfs, priority"):
        EngineConfig(num_blocks=10, scheduling_policy="lifo")


def test_a_traces_priority_column_is_cleaned_kept_and_ordered_by_from_the_command_line(tmp_path) -> None:
    """`priority` read from a generic file, a fractional one quarantined, and `simulate --scheduling-policy
    priority` serving the kept requests lowest first (one sequence at a time, all at t=0)."""
    src = tmp_path / "t.csv"
    src.write_text("arrival_s,isl,osl,priority\n0,30,5,2\n0,30,5,0\n0,30,5,1\n0,30,5,0.5\n")
    out = tmp_path / "records.parquet"
    args = [
        "simulate",
        "--trace",
        str(src),
        "--model",
        "Llama-3.1-8B",
        "--gpu",
        "h100",
        "--num-blocks",
        "100",
        "--max-num-seqs",
        "1",
        "--max-num-batched-tokens",
        "64",
        "--out",
        str(out),
        "--json",
    ]
    r = CliRunner().invoke(app, [*args, "--scheduling-policy", "priority"])
    assert r.exit_code == 0, r.output
    accounting = json.loads(r.stdout)["input_accounting"]
    assert accounting["rows_kept"] == 3 and accounting["by_reason"] == {"priority_invalid": 1}
    admitted = pq.read_table(out).column("admitted_s").to_pylist()
    assert sorted(range(3), key=lambda i: admitted[i]) == [1, 2, 0]
    r = CliRunner().invoke(app, [*args, "--scheduling-policy", "fcfs"])
    admitted = pq.read_table(out).column("admitted_s").to_pylist()
    assert sorted(range(3), key=lambda i: admitted[i]) == [0, 1, 2]
    bad = CliRunner().invoke(app, [*args, "--scheduling-policy", "lifo"])
    assert bad.exit_code != 0 and "--scheduling-policy must be one of fcfs, priority, got 'lifo'" in bad.output
