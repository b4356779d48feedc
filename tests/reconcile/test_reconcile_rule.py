"""The reconciliation rule on synthetic paired records (the twin tests drive it with real runs): a bias
everywhere is one global factor, a bias in one ISL range is a split with a range correction, a stale
profile or drifting engine re-profiles, and every request is accounted for."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from llmcap.errors import LlmcapError
from llmcap.reconcile.params import ReconcileParams
from llmcap.reconcile.run import reconcile
from tests.reconcile._records import pair_of

PARAMS = ReconcileParams(isl_edges=(0, 1024, 8192), bootstrap=300)


def by_isl(rec) -> dict[str, str]:
    return {d.bias.key["isl"]: d.decision for d in rec.decisions}


def test_a_bias_in_every_bucket_is_one_global_correction() -> None:
    rec = reconcile(*pair_of(lambda isl: np.full(isl.size, 1.2)), PARAMS)
    assert by_isl(rec) == {"[0,1024)": "correct", "[1024,8192)": "correct", "[8192,inf)": "correct"}
    assert len(rec.corrections) == 1 and rec.corrections[0].min_context == 0
    assert rec.corrections[0].factor == pytest.approx(1.2, rel=0.02)
    for d in rec.decisions:
        est = d.bias.errors["ttft"][50.0]
        assert est.low < 1 / 1.2 - 1 < est.high  # the interval holds the true error


def test_a_bias_confined_to_long_prompts_splits_that_bucket() -> None:
    slow_long = lambda isl: np.where(isl > 8192, 1.5, 1.0)
    rec = reconcile(*pair_of(slow_long, itl_scale=lambda isl: np.ones(isl.size)), PARAMS)
    assert by_isl(rec) == {"[0,1024)": "within_tolerance", "[1024,8192)": "within_tolerance", "[8192,inf)": "split"}
    assert [(c.min_context, round(c.factor, 1)) for c in rec.corrections] == [(8192, 1.5)]
    split = next(d for d in rec.decisions if d.decision == "split")
    assert split.biased == ("ttft",) and "instead of a global factor" in split.reasoning


def test_no_bias_no_correction() -> None:
    rec = reconcile(*pair_of(lambda isl: np.ones(isl.size)), PARAMS)
    assert set(by_isl(rec).values()) == {"within_tolerance"} and rec.corrections == []


def test_a_stale_profile_or_a_drifting_engine_reprofiles() -> None:
    measured, predicted = pair_of(lambda isl: np.full(isl.size, 1.3))
    rec = reconcile(measured, predicted, PARAMS, stale_fields=("engine_version",))
    assert set(by_isl(rec).values()) == {"reprofile"} and rec.corrections == []
    assert "engine_version" in rec.decisions[0].reasoning
    # the engine slows down 30% half way through the run
    n = measured.num_rows
    step = np.where(np.arange(n) < n // 2, 1.0, 1.3)
    m_ttft = measured.column("ttft_s").to_numpy() * step / 1.3
    m_tpot = measured.column("tpot_s").to_numpy() * step / 1.3
    drifting = measured.set_column(measured.schema.get_field_index("ttft_s"), "ttft_s", pa.array(m_ttft))
    drifting = drifting.set_column(drifting.schema.get_field_index("tpot_s"), "tpot_s", pa.array(m_tpot))
    rec = reconcile(drifting, predicted, PARAMS)
    assert rec.drifts and rec.drifts[0].change == pytest.approx(0.3, abs=0.05)
    assert "reprofile" in by_isl(rec).values() and rec.corrections == []


def test_every_request_is_accounted_for_and_the_result_is_seeded() -> None:
    measured, predicted = pair_of(lambda isl: np.ones(isl.size), n=100)
    status = ["ok"] * 97 + ["unfinished", "rejected", "ok"]
    measured = measured.set_column(measured.schema.get_field_index("status"), "status", pa.array(status))
    rec = reconcile(measured.slice(0, 99), predicted, PARAMS)
    a = rec.accounting
    assert (a.measured, a.predicted, a.paired_ok, a.only_measured, a.only_predicted) == (99, 100, 97, 0, 1)
    assert a.not_ok == {"measured:unfinished": 1, "measured:rejected": 1}
    assert a.paired_ok + sum(a.not_ok.values()) + a.only_predicted == a.predicted
    assert sum(d.bias.requests for d in rec.decisions) == a.paired_ok
    again = reconcile(measured.slice(0, 99), predicted, PARAMS)
    assert again.to_dict() == rec.to_dict()


def test_bad_inputs_fail_with_one_line() -> None:
    measured, predicted = pair_of(lambda isl: np.ones(isl.size), n=50)
    with pytest.raises(LlmcapError, match="measured records: missing column"):
        reconcile(measured.drop_columns(["ttft_s"]), predicted, PARAMS)
    with pytest.raises(LlmcapError, match="appears more than once"):
        reconcile(pa.concat_tables([measured, measured.slice(0, 1)]), predicted, PARAMS)
    with pytest.raises(LlmcapError, match="predicted records only"):
        reconcile(measured.drop_columns(["run"]), predicted, PARAMS)
