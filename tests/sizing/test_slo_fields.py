"""No SLO field is accepted and ignored: for every field of `SloParams`, two values that differ only in that
field give opposite verdicts on the same run. A field added without a case here fails
`test_every_slo_field_has_a_case`.

The verdict is the sizer's: steady-window attainment reaches the target and no run-level target (token-level
ITL, each `distribution` target) is missed (`llmcap.sizing.slo.run_checks`). `ttft_includes_handoff` decides
where the simulator ends TTFT, so its case runs a two-request P/D simulation whose times are exact. A trace's own
per-request deadlines (`deadline_s`) are judged too: E2E within each request's deadline.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from llmcap.cli import app
from llmcap.first_token import first_token_from
from llmcap.perf.model import LinearStepModel
from llmcap.sim import EngineConfig, LinkConfig, PDConfig, SimConfig, simulate
from llmcap.sizing.params import DistributionTarget, SloParams
from llmcap.sizing.slo import attainment, deadlines, misses, run_checks, run_miss, with_deadlines
from tests._size_cli import size_args
from tests.conftest import TRACES
from tests.sim._workloads import table
from tests.sizing.conftest import make_records


def _run() -> pa.Table:
    """100 requests, one a second (arrivals 0..99). Requests 0-1 are cold (TTFT 5 s) and 98-99 drain slowly
    (E2E 9 s); the rest have TTFT 100 + i ms, E2E 1000 + i ms, queue 10 + i/10 ms, per-request ITL median
    10 / P99 20 / worst 30 ms, TPOT 15 ms, 1,000 prompt tokens."""
    rows = []
    for i in range(100):
        cold, draining = i < 2, i >= 98
        rows.append(
            {
                "arrival_s": float(i),
                "ttft_ms": 5000.0 if cold else 100.0 + i,
                "e2e_ms": 9000.0 if draining else 1000.0 + i,
                "queue_ms": 10.0 + i / 10,
                "itl_ms": 10.0,
                "itl_p99_ms": 20.0,
                "itl_max_ms": 30.0,
                "tpot_ms": 15.0,
                "isl": 1000,
            }
        )
    return make_records(rows)


RUN = _run()
# token-level gaps of the whole run: 90% of tokens at 10 ms, 10% at 40 ms → token P50 10 ms, P99 40 ms
GAPS, TOKENS = np.array([0.010, 0.040]), np.array([900, 100], dtype=np.int64)
# the window every case but the window fields uses: arrivals in [2, 97), i.e. requests 2..96 (cold and draining ones out)
WINDOWED = {"warmup_s": 2.0, "drain_s": 2.0}


def meets(slo: SloParams, records: pa.Table = RUN) -> bool:
    return attainment(records, slo) >= slo.attainment_target and not run_miss(run_checks(records, GAPS, TOKENS, slo))


# field: (the other fields both sides share, the field's value that passes, the one that fails), with the arithmetic
CASES: dict[str, tuple[dict[str, Any], Any, Any]] = {
    # TTFT in the window is 102..196 ms
    "ttft_ms": ({"itl_ms": None} | WINDOWED, 200.0, 150.0),
    # a 150 ms TTFT misses 151..196 ms; 150 + 50 × 1,000/1,000 = 200 ms does not
    "ttft_ms_per_1k_isl": ({"ttft_ms": 150.0, "itl_ms": None} | WINDOWED, 50.0, 0.0),
    # per-request P99 gap 20 ms
    "itl_ms": ({"ttft_ms": None} | WINDOWED, 25.0, 15.0),
    # at 15 ms the per-request median (10) passes, the per-request P99 (20) and the token-level P99 (40) do not
    "itl_stat": ({"ttft_ms": None, "itl_ms": 15.0} | WINDOWED, "p50", "token_p99"),
    "tpot_ms": ({"ttft_ms": None, "itl_ms": None} | WINDOWED, 20.0, 10.0),
    # E2E in the window is 1,002..1,096 ms
    "e2e_ms": ({"ttft_ms": None, "itl_ms": None} | WINDOWED, 1100.0, 1050.0),
    # queue in the window 10.2..19.6 ms
    "max_queue_ms": ({"ttft_ms": None, "itl_ms": None} | WINDOWED, 20.0, 15.0),
    # a 195 ms TTFT target: of the window's 95 requests only i = 96 (196 ms) misses → 94/95 = 0.9895
    "attainment_target": ({"ttft_ms": 195.0, "itl_ms": None} | WINDOWED, 0.98, 0.99),
    # TTFT P50 across the window's 95 requests is request 49's, 149 ms
    "distribution": (
        {"ttft_ms": None, "itl_ms": None} | WINDOWED,
        (),
        (DistributionTarget(metric="ttft", percentile=50, target_ms=140),),
    ),
    # the cold requests 0-1 (TTFT 5 s) are 2 of the 97 arrivals in [0, 97): 95/97 = 0.979 < 0.99 unless the first 2 s are left out
    "warmup_s": ({"ttft_ms": 1000.0, "itl_ms": None, "drain_s": 2.0}, 2.0, 0.0),
    # the draining requests 98-99 (E2E 9 s) are 2 of the 98 arrivals in [2, 99] (no drain: the end is closed): 96/98 = 0.980
    "drain_s": ({"e2e_ms": 2000.0, "ttft_ms": None, "itl_ms": None, "warmup_s": 2.0}, 2.0, 0.0),
    # 0.02 of the 99 s span = 1.98 s: arrivals 0-1 out, as with warmup_s 2; at the end, 98-99 out
    "warmup_frac": ({"ttft_ms": 1000.0, "itl_ms": None, "drain_s": 2.0}, 0.02, 0.0),
    "drain_frac": ({"e2e_ms": 2000.0, "ttft_ms": None, "itl_ms": None, "warmup_s": 2.0}, 0.02, 0.0),
}


def test_every_slo_field_has_a_case() -> None:
    # ttft_includes_handoff: a P/D simulation below; availability: judged over the failure scenarios, tests/sizing/test_availability.py
    assert set(CASES) | {"ttft_includes_handoff", "availability"} == set(SloParams.model_fields)


@pytest.mark.parametrize("field", sorted(CASES))
def test_the_field_changes_the_verdict(field: str) -> None:
    shared, passing, failing = CASES[field]
    assert meets(SloParams(**shared, **{field: passing})), f"{field}={passing!r} should pass"
    assert not meets(SloParams(**shared, **{field: failing})), f"{field}={failing!r} should fail"


def test_a_distribution_target_and_a_per_request_target_at_once() -> None:
    """P99 per request and P90 across requests, both TTFT: each can be the one that binds."""
    # the window's TTFT P90: rank 0.9 × 94 = 84.6 between 102 + 84 and 102 + 85 ms → 186.6 ms
    p90 = (DistributionTarget(metric="ttft", percentile=90, target_ms=190),)
    assert meets(SloParams(ttft_ms=200.0, itl_ms=None, distribution=p90, **WINDOWED))
    tighter = (DistributionTarget(metric="ttft", percentile=90, target_ms=185),)
    checks = run_checks(RUN, GAPS, TOKENS, SloParams(ttft_ms=200.0, itl_ms=None, distribution=tighter, **WINDOWED))
    assert run_miss(checks) == "TTFT P90 186.6 ms > 185 ms"
    assert not meets(SloParams(ttft_ms=150.0, itl_ms=None, distribution=p90, **WINDOWED)), (
        "and the per-request target still binds"
    )


def test_ttft_includes_handoff_changes_the_verdict() -> None:
    """Two requests on 1 prefill + 1 decode over a slow link (tests/sim/test_timelines.py's P/D case): TTFT at
    prefill is 2.0 and 4.0 s; after the handoff 6.5 and 10.5 s. A 5 s TTFT target passes only the first way."""
    engine = EngineConfig(
        num_blocks=10, block_size=4, max_num_seqs=8, max_num_batched_tokens=8, kv_bytes_per_token=10.0
    )
    step = LinearStepModel(overhead_s=1.0, per_prefill_token_s=0.125, per_decode_seq_s=0.25)

    def verdict(includes_handoff: bool) -> bool:
        slo = SloParams(ttft_ms=5000.0, itl_ms=None, ttft_includes_handoff=includes_handoff)
        pd = PDConfig(
            prefill_replicas=1,
            decode_replicas=1,
            link=LinkConfig(bandwidth_bytes_s=20.0, latency_s=0.5),
            first_token_from=first_token_from(slo.ttft_includes_handoff),
        )  # as the sizer builds it
        result = simulate(table({"isl": [8, 8], "osl": [2, 2]}), step, SimConfig(engine=engine, pd=pd))
        return meets(slo, result.records)

    assert verdict(False) and not verdict(True)


def test_size_plans_for_a_percentile_target_beside_the_per_request_one(tmp_path, monkeypatch) -> None:
    """`llmcap size --slo-percentile`: a P90 TTFT target beside the per-request P99 one moves the answer; one out of
    reach leaves no plan, and the near miss names it."""
    monkeypatch.delenv("COLUMNS", raising=False)
    trace = tmp_path / "azure_head.csv"
    trace.write_text("\n".join(TRACES["azure_conv"].read_text().splitlines()[:301]) + "\n")
    args = size_args(trace=trace)

    def size(*extra: str) -> tuple[int, dict]:
        r = CliRunner().invoke(app, [*args, *extra])
        return r.exit_code, json.loads(r.stdout)

    (code, p99_only), (code_p90, with_p90) = size(), size("--slo-percentile", "ttft:p90:25")
    assert code == code_p90 == 0
    # this trace's TTFT P99 at the 1-GPU unit's max rate is far under 2 s, while its P90 is over 25 ms: the P90 binds
    assert with_p90["gpus"] > p99_only["gpus"] and with_p90["max_rps_per_unit"] < p99_only["max_rps_per_unit"]
    assert "ttft_p90" in with_p90["slo_definitions"] and "ttft_p90" not in p99_only["slo_definitions"]
    code, none = size("--slo-percentile", "ttft:p50:5")  # 5 ms: below one 1k-token prefill on an idle H100
    assert (
        code == 1
        and none["near_misses"][0]["binding"] == "run"
        and none["near_misses"][0]["reason"].startswith("TTFT P50 ")
    )


@pytest.mark.parametrize("text", ["ttft:90:abc", "ttft:p101:100", "speed:p90:100", "ttft:p90", "ttft:p90:0"])
def test_a_percentile_target_that_is_not_one_is_refused(text: str) -> None:
    r = CliRunner().invoke(
        app,
        [
            "size",
            "--trace",
            "unused.csv",
            "--model",
            "Llama-3.1-8B",
            "--slo-ttft-p99",
            "2000",
            "--slo-percentile",
            text,
        ],
    )
    assert r.exit_code == 2 and "--slo-percentile" in r.stderr


def _trace_with(deadline_s: list[float | None]) -> pa.Table:
    """The run's requests as a trace, listed in reverse request order (the join is by request_id, not position)."""
    ids = list(range(len(deadline_s)))[::-1]
    return pa.table(
        {"request_id": pa.array(ids, pa.int64()), "deadline_s": pa.array([deadline_s[i] for i in ids], pa.float64())}
    )


def test_the_traces_own_deadlines_change_the_verdict() -> None:
    """A request's `deadline_s` from the trace bounds its E2E (1,002..1,096 ms in the window); one without has none."""
    slo = SloParams(ttft_ms=None, itl_ms=None, **WINDOWED)
    loose = with_deadlines(RUN, _trace_with([1.2] * 100))
    assert meets(slo, loose) and loose.column("deadline_s").to_pylist()[:2] == [1.2, 1.2]
    # the odd requests get 1.05 s, the even ones none: the odd ones from 51 on miss (E2E 1,051 ms and up; 99 drains
    # in 9 s) → in the window 23 of 95 (51, 53, ..., 95) miss: 72/95 = 0.758
    tight = with_deadlines(RUN, _trace_with([1.05 if i % 2 else None for i in range(100)]))
    e2e = [1000.0 + i if i < 98 else 9000.0 for i in range(100)]
    assert misses(tight, slo)["deadline_s"].tolist() == [i % 2 == 1 and e2e[i] > 1050 for i in range(100)]
    assert attainment(tight, slo) == pytest.approx(72 / 95) and not meets(slo, tight)
    assert deadlines(_trace_with([None] * 100)) == 0 and with_deadlines(RUN, _trace_with([None] * 100)) is RUN


def test_size_plans_for_the_traces_deadlines(tmp_path, monkeypatch) -> None:
    """The same requests with a deadline each: 600 s changes nothing but the definitions, 50 ms leaves no plan, and the
    near miss says the deadline binds."""
    monkeypatch.delenv("COLUMNS", raising=False)
    head = tmp_path / "azure_head.csv"
    head.write_text("\n".join(TRACES["azure_conv"].read_text().splitlines()[:301]) + "\n")
    clean = tmp_path / "clean.parquet"
    assert CliRunner().invoke(app, ["trace", "clean", str(head), "-o", str(clean)]).exit_code == 0
    canonical = pq.read_table(clean)

    def size(deadline: float) -> tuple[int, dict]:
        path = tmp_path / f"deadline_{deadline:g}.parquet"
        column = canonical.schema.get_field_index("deadline_s")
        pq.write_table(
            canonical.set_column(column, "deadline_s", pa.array(np.full(canonical.num_rows, deadline))), path
        )
        r = CliRunner().invoke(
            app,
            size_args(trace=path),
        )
        return r.exit_code, json.loads(r.stdout)

    (code, loose), (code_tight, tight) = size(600.0), size(0.05)
    assert code == 0 and "300 requests carry one" in loose["slo_definitions"]["deadline"]
    # 50 ms from arrival to the last token: not one request of ~1k-token prompts and hundreds of output tokens makes it
    assert code_tight == 1 and tight["near_misses"][0]["binding"] == "deadline"
